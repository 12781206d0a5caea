/* A CPU test double of an ordered transport (worker/comm/xport.h) with NCCL's semantics,
 * for ranks that run as threads of one process:
 *
 *  - each rank has a FIFO of enqueued operations; only the HEAD of a queue can
 *    progress, and a p2p group is at the head as a whole (its operations complete in
 *    any order, the group leaves the queue when all have);
 *  - a p2p operation completes when the peer's head group holds its counterpart (the
 *    peer's first unmatched operation from this rank in the other direction): the data
 *    is copied, both are done (a rendezvous); counts must agree;
 *  - an all-reduce completes when every member's head is an all-reduce of the same group
 *    (and counts): the sum, in ascending rank order, is written to every member;
 *  - progress runs synchronously under one mutex, on whichever rank's thread enqueues or
 *    waits; compute is the rank's own thread, so after_compute is a no-op and
 *    before_compute waits for the rank's queue to drain.
 *
 * Stuck states become errors, never hangs: when every rank is waiting (or parked: done
 * with its step) and nothing can progress, the simulation stops with "deadlock:" and each
 * rank's head operation; when nothing at all has happened for idle_ms (a rank died, or
 * computes forever), with "no progress for N ms:" and the same report. Either way every
 * rank's queue is dropped and every call returns −1 with that reason from then on.
 *
 * Fault injection: xsim_fail_at(sim, r, n) makes rank r's n-th enqueue fail (the rank
 * "dies": its queue is dropped, its later calls fail, its peers wait for it in vain). */
#ifndef PLIANT_TEST_XPORT_SIM_H
#define PLIANT_TEST_XPORT_SIM_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "gpt.h"
#include "xport.h"

#define XSIM_MAX_RANKS 8
#define XSIM_QUEUE 512
#define XSIM_GROUP_OPS 8

typedef struct {
    int allreduce;                       /* 0: p2p group */
    int nops;
    pl_xport_op ops[XSIM_GROUP_OPS];
    int done[XSIM_GROUP_OPS];
    int gsize;
    int32_t group[XSIM_MAX_RANKS];
    int nbufs;
    float *bufs[PL_MAX_LAYER_TENSORS];
    size_t counts[PL_MAX_LAYER_TENSORS];
} xsim_op;

typedef struct xsim xsim;

typedef struct {
    xsim *sim;
    int rank;
    int fail_at;  /* the enqueue (1-based) that fails; 0: none */
    int nenq;
} xsim_rank;

struct xsim {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nranks;
    int idle_ms;
    xsim_op q[XSIM_MAX_RANKS][XSIM_QUEUE];
    int head[XSIM_MAX_RANKS], len[XSIM_MAX_RANKS];
    int waiting[XSIM_MAX_RANKS], parked[XSIM_MAX_RANKS], dead[XSIM_MAX_RANKS];
    int failed;
    char why[2048];
    double last_event_ms;   /* last enqueue or completion */
    long completed;         /* operations completed, for reports */
    xsim_rank r[XSIM_MAX_RANKS];
    pl_xport x[XSIM_MAX_RANKS];
};

static double xsim_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int xsim_errf(char *err, size_t errlen, const char *msg)
{
    snprintf(err, errlen, "%s", msg);
    return -1;
}

static xsim_op *xsim_headop(xsim *s, int r)
{
    return s->len[r] ? &s->q[r][s->head[r]] : NULL;
}

static void xsim_pop(xsim *s, int r)
{
    s->head[r] = (s->head[r] + 1) % XSIM_QUEUE;
    s->len[r]--;
    s->completed++;
    s->last_event_ms = xsim_now_ms();
}

static void xsim_describe(const xsim_op *o, char *buf, size_t len)
{
    size_t n = 0;
    if (o->allreduce) {
        n += (size_t)snprintf(buf + n, len - n, "allreduce{");
        for (int i = 0; i < o->gsize && n < len; i++)
            n += (size_t)snprintf(buf + n, len - n, "%s%d", i ? "," : "", (int)o->group[i]);
        if (n < len) snprintf(buf + n, len - n, "} %d bufs", o->nbufs);
        return;
    }
    n += (size_t)snprintf(buf + n, len - n, "p2p{");
    for (int i = 0; i < o->nops && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s%s%d n=%zu", i ? ", " : "",
                              o->done[i] ? "(done) " : "", o->ops[i].send ? "send→" : "recv←",
                              o->ops[i].peer, o->ops[i].count);
    if (n < len) snprintf(buf + n, len - n, "}");
}

/* Drops every queue; every later call fails with why. Under mu. */
static void xsim_stop_locked(xsim *s, const char *kind)
{
    if (s->failed) return;
    size_t n = (size_t)snprintf(s->why, sizeof s->why, "%s:", kind);
    for (int r = 0; r < s->nranks && n < sizeof s->why; r++) {
        char d[256] = "idle";
        const xsim_op *h = xsim_headop(s, r);
        if (s->dead[r]) snprintf(d, sizeof d, "dead");
        else if (h) xsim_describe(h, d, sizeof d);
        n += (size_t)snprintf(s->why + n, sizeof s->why - n, " rank %d: %s (%d queued);", r, d,
                              s->len[r]);
    }
    s->failed = 1;
    for (int r = 0; r < s->nranks; r++) s->len[r] = 0;
    pthread_cond_broadcast(&s->cv);
}

/* Completes what rank r's head can complete now; 1 if anything happened. Under mu. */
static int xsim_try(xsim *s, int r)
{
    xsim_op *o = xsim_headop(s, r);
    if (!o || s->dead[r]) return 0;
    if (o->allreduce) {
        xsim_op *m[XSIM_MAX_RANKS];
        for (int i = 0; i < o->gsize; i++) {
            const int p = o->group[i];
            m[i] = s->dead[p] ? NULL : xsim_headop(s, p);
            if (!m[i] || !m[i]->allreduce || m[i]->gsize != o->gsize ||
                memcmp(m[i]->group, o->group, (size_t)o->gsize * sizeof o->group[0]))
                return 0;
            int same = m[i]->nbufs == o->nbufs;
            for (int b = 0; same && b < o->nbufs; b++) same = m[i]->counts[b] == o->counts[b];
            if (!same) {
                xsim_stop_locked(s, "protocol error (all-reduce counts differ)");
                return 1;
            }
        }
        for (int b = 0; b < o->nbufs; b++)
            for (size_t e = 0; e < o->counts[b]; e++) {
                float sum = m[0]->bufs[b][e];
                for (int i = 1; i < o->gsize; i++) sum += m[i]->bufs[b][e];
                for (int i = 0; i < o->gsize; i++) m[i]->bufs[b][e] = sum;
            }
        for (int i = 0; i < o->gsize; i++) xsim_pop(s, o->group[i]);
        return 1;
    }
    int progressed = 0;
    for (int i = 0; i < o->nops; i++) {
        if (o->done[i]) continue;
        const int p = o->ops[i].peer;
        xsim_op *po = s->dead[p] ? NULL : xsim_headop(s, p);
        if (!po || po->allreduce) continue;
        for (int j = 0; j < po->nops; j++) {
            if (po->done[j] || (po == o && j == i) || po->ops[j].peer != r ||
                po->ops[j].send == o->ops[i].send)
                continue;
            if (po->ops[j].count != o->ops[i].count) {
                xsim_stop_locked(s, "protocol error (p2p counts differ)");
                return 1;
            }
            const pl_xport_op *snd = o->ops[i].send ? &o->ops[i] : &po->ops[j];
            const pl_xport_op *rcv = o->ops[i].send ? &po->ops[j] : &o->ops[i];
            memcpy(rcv->data, snd->data, snd->count * sizeof(float));
            o->done[i] = po->done[j] = 1;
            progressed = 1;
            break;
        }
    }
    /* groups whose every operation is done leave their queues */
    for (int q = 0; q < s->nranks; q++) {
        xsim_op *h = xsim_headop(s, q);
        if (!h || h->allreduce) continue;
        int all = 1;
        for (int i = 0; i < h->nops; i++) all &= h->done[i];
        if (all) xsim_pop(s, q), progressed = 1;
    }
    return progressed;
}

static void xsim_progress_locked(xsim *s)
{
    int any = 0;
    for (int changed = 1; changed && !s->failed;) {
        changed = 0;
        for (int r = 0; r < s->nranks && !s->failed; r++) changed |= xsim_try(s, r);
        any |= changed;
    }
    if (any) pthread_cond_broadcast(&s->cv);
}

/* Under mu: −1 with the reason when rank r cannot issue anything any more. */
static int xsim_check_locked(xsim *s, int r, char *err, size_t errlen)
{
    if (s->failed) return xsim_errf(err, errlen, s->why);
    if (s->dead[r]) return xsim_errf(err, errlen, "xsim: this rank failed earlier");
    return 0;
}

static int xsim_enqueue(xsim_rank *me, const xsim_op *op, char *err, size_t errlen)
{
    xsim *s = me->sim;
    const int r = me->rank;
    pthread_mutex_lock(&s->mu);
    int rc = xsim_check_locked(s, r, err, errlen);
    if (rc == 0 && me->fail_at && ++me->nenq == me->fail_at) {
        s->dead[r] = 1;
        s->len[r] = 0;
        rc = xsim_errf(err, errlen, "xsim: injected failure");
    }
    if (rc == 0 && s->len[r] == XSIM_QUEUE) rc = xsim_errf(err, errlen, "xsim: queue full");
    if (rc == 0) {
        s->q[r][(s->head[r] + s->len[r]) % XSIM_QUEUE] = *op;
        s->len[r]++;
        s->last_event_ms = xsim_now_ms();
        xsim_progress_locked(s);
        if (s->failed) rc = xsim_errf(err, errlen, s->why);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int xsim_p2p(void *ctx, const pl_xport_op *ops, int nops, char *err, size_t errlen)
{
    xsim_rank *me = ctx;
    if (nops > XSIM_GROUP_OPS) return xsim_errf(err, errlen, "xsim: group too large");
    xsim_op o;
    memset(&o, 0, sizeof o);
    o.nops = nops;
    for (int i = 0; i < nops; i++) {
        if (ops[i].peer < 0 || ops[i].peer >= me->sim->nranks)
            return xsim_errf(err, errlen, "xsim: p2p with a rank outside the world");
        o.ops[i] = ops[i];
    }
    return xsim_enqueue(me, &o, err, errlen);
}

static int xsim_allreduce(void *ctx, const int32_t *group, int group_size, float *const *bufs,
                          const size_t *counts, int nbufs, char *err, size_t errlen)
{
    xsim_rank *me = ctx;
    if (group_size > XSIM_MAX_RANKS || nbufs > PL_MAX_LAYER_TENSORS)
        return xsim_errf(err, errlen, "xsim: all-reduce too large");
    int member = 0;
    for (int i = 0; i < group_size; i++) {
        if (i && group[i] <= group[i - 1])
            return xsim_errf(err, errlen, "xsim: all-reduce group not ascending");
        member |= group[i] == me->rank;
    }
    if (!member) return xsim_errf(err, errlen, "xsim: all-reduce of a group without this rank");
    if (group_size == 1) return 0;
    xsim_op o;
    memset(&o, 0, sizeof o);
    o.allreduce = 1;
    o.gsize = group_size;
    memcpy(o.group, group, (size_t)group_size * sizeof *group);
    o.nbufs = nbufs;
    for (int b = 0; b < nbufs; b++) o.bufs[b] = bufs[b], o.counts[b] = counts[b];
    return xsim_enqueue(me, &o, err, errlen);
}

static int xsim_after_compute(void *ctx, char *err, size_t errlen)
{
    xsim_rank *me = ctx;
    pthread_mutex_lock(&me->sim->mu);
    int rc = xsim_check_locked(me->sim, me->rank, err, errlen);
    pthread_mutex_unlock(&me->sim->mu);
    return rc;
}

/* Waits until rank r's queue is empty (see the stuck rules above). */
static int xsim_drain(xsim_rank *me, int timeout_ms, char *err, size_t errlen)
{
    xsim *s = me->sim;
    const int r = me->rank;
    const double t0 = xsim_now_ms();
    pthread_mutex_lock(&s->mu);
    s->waiting[r] = 1;
    int rc = 0;
    for (;;) {
        if ((rc = xsim_check_locked(s, r, err, errlen)) != 0) break;
        xsim_progress_locked(s);
        if ((rc = xsim_check_locked(s, r, err, errlen)) != 0) break;
        if (s->len[r] == 0) break;
        int stuck = 1;
        /* a waiting rank whose queue is empty is about to go on: not stuck */
        for (int q = 0; q < s->nranks; q++)
            stuck &= s->parked[q] || (s->waiting[q] && s->len[q] > 0);
        if (stuck) {
            xsim_stop_locked(s, "deadlock");
            continue;
        }
        const double now = xsim_now_ms();
        if (now - s->last_event_ms > s->idle_ms) {
            char kind[64];
            snprintf(kind, sizeof kind, "no progress for %d ms", s->idle_ms);
            xsim_stop_locked(s, kind);
            continue;
        }
        if (timeout_ms >= 0 && now - t0 > timeout_ms) {
            rc = xsim_errf(err, errlen, "xsim: wait timed out");
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    s->waiting[r] = 0;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int xsim_before_compute(void *ctx, char *err, size_t errlen)
{
    return xsim_drain(ctx, -1, err, errlen);
}

static int xsim_wait(void *ctx, int timeout_ms, char *err, size_t errlen)
{
    return xsim_drain(ctx, timeout_ms, err, errlen);
}

static xsim *xsim_new(int nranks, int idle_ms)
{
    if (nranks > XSIM_MAX_RANKS) abort();
    xsim *s = calloc(1, sizeof *s);
    if (!s) abort();
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->nranks = nranks;
    s->idle_ms = idle_ms;
    s->last_event_ms = xsim_now_ms();
    for (int r = 0; r < nranks; r++) {
        s->r[r] = (xsim_rank){s, r, 0, 0};
        s->x[r] = (pl_xport){.ctx = &s->r[r], .self = r, .nranks = nranks, .p2p = xsim_p2p,
                             .allreduce = xsim_allreduce, .after_compute = xsim_after_compute,
                             .before_compute = xsim_before_compute, .wait = xsim_wait};
    }
    return s;
}

static void xsim_free(xsim *s)
{
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* A rank that is done with its step (parked) counts as waiting for deadlock detection;
 * its idle time does not count against the others. */
static void xsim_park(xsim *s, int r, int parked)
{
    pthread_mutex_lock(&s->mu);
    s->parked[r] = parked;
    if (!parked) s->last_event_ms = xsim_now_ms();
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void xsim_fail_at(xsim *s, int r, int n)
{
    s->r[r].fail_at = n;
    s->r[r].nenq = 0;
}

/* From any thread (the runtime's control thread on `abort`): stop everything. */
static void xsim_abort(xsim *s, const char *reason)
{
    pthread_mutex_lock(&s->mu);
    xsim_stop_locked(s, reason);
    pthread_mutex_unlock(&s->mu);
}

/* An abort from another thread after delay_ms (the runtime's control thread reacting to
 * `abort` or a lost peer): pthread_create(&t, NULL, xsim_abort_later, &ab). */
typedef struct {
    xsim *sim;
    int delay_ms;
} xsim_aborter;

static void *xsim_abort_later(void *arg)
{
    xsim_aborter *a = arg;
    usleep((useconds_t)a->delay_ms * 1000);
    xsim_abort(a->sim, "aborted by the control thread");
    return NULL;
}

#endif
