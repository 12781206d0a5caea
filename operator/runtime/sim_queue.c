/* A binary min-heap on (time, insertion order) (sim_queue.h). */
#include "sim_queue.h"

#include <stdlib.h>
#include <string.h>

void pl_sim_queue_init(pl_sim_queue *q) { memset(q, 0, sizeof *q); }

void pl_sim_queue_free(pl_sim_queue *q)
{
    free(q->ev);
    memset(q, 0, sizeof *q);
}

static int before(const pl_sim_event *a, const pl_sim_event *b)
{
    return a->t_ns < b->t_ns || (a->t_ns == b->t_ns && a->seq < b->seq);
}

static void swap(pl_sim_event *a, pl_sim_event *b)
{
    pl_sim_event t = *a;
    *a = *b;
    *b = t;
}

int pl_sim_queue_push(pl_sim_queue *q, pl_sim_event e)
{
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 1024;
        pl_sim_event *x = realloc(q->ev, (size_t)cap * sizeof *x);
        if (!x) return -1;
        q->ev = x;
        q->cap = cap;
    }
    e.seq = q->next_seq++;
    int i = q->n++;
    q->ev[i] = e;
    while (i > 0 && before(&q->ev[i], &q->ev[(i - 1) / 2])) {
        swap(&q->ev[i], &q->ev[(i - 1) / 2]);
        i = (i - 1) / 2;
    }
    return 0;
}

int pl_sim_queue_pop(pl_sim_queue *q, pl_sim_event *e)
{
    if (q->n == 0) return 0;
    *e = q->ev[0];
    q->ev[0] = q->ev[--q->n];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < q->n && before(&q->ev[l], &q->ev[m])) m = l;
        if (r < q->n && before(&q->ev[r], &q->ev[m])) m = r;
        if (m == i) break;
        swap(&q->ev[i], &q->ev[m]);
        i = m;
    }
    return 1;
}

int64_t pl_sim_queue_next_time(const pl_sim_queue *q) { return q->n ? q->ev[0].t_ns : INT64_MAX; }

const pl_sim_event *pl_sim_queue_peek(const pl_sim_queue *q) { return q->n ? &q->ev[0] : NULL; }

uint64_t pl_sim_queue_ticket(pl_sim_queue *q) { return q->next_seq++; }
