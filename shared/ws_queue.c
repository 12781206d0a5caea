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

int pl_ws_queue_write(pl_ws_queue *q, struct lws *wsi)
{
    pl_ws_frame *f = pl_ws_queue_pop(q);
    if (!f) return 0;
    int w = lws_write(wsi, f->buf + LWS_PRE, f->len, (enum lws_write_protocol)f->wflags);
    int short_write = w < (int)f->len;
    free(f);
    return short_write ? -1 : 1;
}

void pl_ws_queue_clear(pl_ws_queue *q)
{
    pl_ws_frame *f;
    while ((f = pl_ws_queue_pop(q))) free(f);
}
