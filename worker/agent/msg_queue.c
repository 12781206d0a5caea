/* The control thread's messages for the compute thread, decoded once (msg_queue.h). */
#include "msg_queue.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct item {
    int end;  /* the last item: the compute thread ends */
    pl_msg m; /* owned: a pl_msg_dup copy */
    struct item *next;
} item;

struct pl_msg_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    item *head, *tail;
    item *end; /* made with the queue, so that the end can always be queued */
};

pl_msg_queue *pl_msg_queue_new(void)
{
    pl_msg_queue *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    if (!(q->end = calloc(1, sizeof *q->end))) {
        free(q);
        return NULL;
    }
    q->end->end = 1;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    return q;
}

void pl_msg_queue_free(pl_msg_queue *q)
{
    if (!q) return;
    for (item *it = q->head; it;) {
        item *next = it->next;
        pl_msg_free(&it->m);
        free(it);
        it = next;
    }
    free(q->end); /* NULL once queued: then freed above or by pop */
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

static void append(pl_msg_queue *q, item *it)
{
    pthread_mutex_lock(&q->mu);
    if (q->tail) q->tail->next = it;
    else q->head = it;
    q->tail = it;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

int pl_msg_queue_push(pl_msg_queue *q, const pl_msg *m)
{
    item *it = calloc(1, sizeof *it);
    if (!it) return -1;
    if (pl_msg_dup(m, &it->m)) {
        free(it);
        return -1;
    }
    append(q, it);
    return 0;
}

void pl_msg_queue_push_end(pl_msg_queue *q)
{
    item *it = q->end;
    q->end = NULL;
    if (it) append(q, it);
}

int pl_msg_queue_pop(pl_msg_queue *q, pl_msg *out)
{
    pthread_mutex_lock(&q->mu);
    while (!q->head) pthread_cond_wait(&q->cv, &q->mu);
    item *it = q->head;
    q->head = it->next;
    if (!q->head) q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    const int end = it->end;
    *out = it->m; /* the copy's arrays go to the caller */
    free(it);
    return end;
}
