/* The ordered send queue and the receive buffer of a control-channel WebSocket
 * connection (ws_queue.h). */
#include "ws_queue.h"

#include <stdlib.h>
#include <string.h>

pl_ws_frame *pl_ws_frame_new(const char *text, size_t len, int wflags)
{
    pl_ws_frame *f = malloc(sizeof *f + LWS_PRE + len);
    if (!f) return NULL;
    f->next = NULL;
    f->len = len;
    f->wflags = wflags;
    memcpy(f->buf + LWS_PRE, text, len);
    return f;
}

void pl_ws_queue_push(pl_ws_queue *q, pl_ws_frame *f)
{
    q->bytes += f->len;
    if (q->tail) q->tail->next = f;
    else q->head = f;
    q->tail = f;
}

pl_ws_frame *pl_ws_queue_pop(pl_ws_queue *q)
{
    pl_ws_frame *f = q->head;
    if (!f) return NULL;
    q->head = f->next;
    if (!q->head) q->tail = NULL;
    q->bytes -= f->len;
    f->next = NULL;
    return f;
}

/* The oldest frame written: 1, 0 nothing queued, -1 a short write. */
static int queue_write(pl_ws_queue *q, struct lws *wsi)
{
    pl_ws_frame *f = pl_ws_queue_pop(q);
    if (!f) return 0;
    int w = lws_write(wsi, f->buf + LWS_PRE, f->len, (enum lws_write_protocol)f->wflags);
    int short_write = w < (int)f->len;
    free(f);
    return short_write ? -1 : 1;
}

int pl_ws_queue_service(pl_ws_queue *q, struct lws *wsi, int closing)
{
    int w = queue_write(q, wsi);
    if (w > 0 && (q->head || closing))
        lws_callback_on_writable(wsi);
    return w;
}

void pl_ws_queue_clear(pl_ws_queue *q)
{
    pl_ws_frame *f;
    while ((f = pl_ws_queue_pop(q))) free(f);
}

int pl_ws_rx_append(char **buf, size_t *len, size_t *cap, const void *in, size_t n, size_t max)
{
    if (n > max - *len) return 1;
    if (*len + n > *cap) {
        size_t grown = *cap ? *cap : 4096;
        while (grown < *len + n) grown *= 2;
        if (grown > max) grown = max;
        char *nb = realloc(*buf, grown);
        if (!nb) return -1;
        *buf = nb;
        *cap = grown;
    }
    if (n) memcpy(*buf + *len, in, n);
    *len += n;
    return 0;
}
