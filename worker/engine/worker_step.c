/* The worker's share of one distributed step: its stage over its microbatches,
 * then the sync groups' gradient all-reduces (worker_step.h). */
#include "worker_step.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int pl_worker_group_tensors(const pl_engine *e, int key, pl_tensor_ref *refs)
{
    int n = 0;
    if (key == PL_SYNC_WTE) {
        if (e->wte_tensor < 0) return 0;
        const pl_engine_tensor *t = &e->tensors[e->wte_tensor];
        refs[n++] = (pl_tensor_ref){e->grads + t->offset, t->spec.numel};
        return n;
    }
    for (int i = 0; i < e->ntensors && n < PL_MAX_LAYER_TENSORS; i++) {
        const pl_engine_tensor *t = &e->tensors[i];
        if (i == e->wte_tensor || t->layer != key) continue;
        refs[n++] = (pl_tensor_ref){e->grads + t->offset, t->spec.numel};
    }
    return n;
}

/* One sync group of this rank. */
typedef struct {
    const pl_sync_group *g;
    int layer;                                 /* the layer whose backward completes it */
    int n;
    pl_tensor_ref refs[PL_MAX_LAYER_TENSORS];  /* the gradients */
    pl_tensor_ref ring[PL_MAX_LAYER_TENSORS];  /* what the ring sums: refs on the CPU
                                                  backend, else host copies */
    int ready;                                 /* under mu */
} sync_job;

/* The step's sync, shared by the compute thread (which marks jobs ready as the last
 * backward finishes their layers) and the comm thread (which reduces them in the rank's
 * order, waiting for each): the overlap of Oobleck §6.1, DDP's gradient buckets. */
typedef struct {
    const pl_worker_step_args *a;
    sync_job *jobs;
    int njobs;
    int host;          /* CPU backend: gradients are host memory, reduced in place */
    int holder;        /* the stage that shadows this one (shadow.h), or −1 */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stage_over;    /* under mu: the stage returned */
    int comm_over;     /* under mu: the comm thread is done */
    int abort;         /* under mu: the stage failed, reduce nothing more */
    int overlapped;    /* under mu */
    int rc;            /* the comm thread's result, read after join */
    char err[512];
} sync_state;

/* Whether job j's comm-thread view (ring) is a host copy of its gradients: off the CPU
 * backend, for the all-reduce and for the shadow's holder. */
static int staged(const sync_state *s, const sync_job *j)
{
    return !s->host && (j->g->nranks > 1 || s->holder >= 0);
}

/* Compute thread, from the engine's backward: the jobs completed by `layer` can go. */
static void layer_done(void *ctx, int layer)
{
    sync_state *s = ctx;
    pl_engine *e = s->a->engine;
    for (int i = 0; i < s->njobs; i++) {
        sync_job *j = &s->jobs[i];
        if (j->layer != layer) continue;
        /* the kernels are the compute thread's: it stages device gradients itself */
        if (staged(s, j))
            for (int t = 0; t < j->n; t++)
                kn_to_host(e->k, j->ring[t].data, j->refs[t].data,
                           j->refs[t].count * sizeof(float));
        pthread_mutex_lock(&s->mu);
        j->ready = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
}

/* Comm thread: one group's ring all-reduce on host memory. */
static int reduce_job(const sync_state *s, const sync_job *j, char *err, size_t errlen)
{
    const pl_worker_step_args *a = s->a;
    const pl_sync_group *g = j->g;
    if (g->nranks == 1) return 0;
    int32_t *group = malloc((size_t)g->nranks * sizeof *group);
    if (!group) return pl_errf(err, errlen, "worker step: out of memory");
    for (int i = 0; i < g->nranks; i++) group[i] = g->ranks[i];
    const int L = a->groups->L;
    const uint32_t tag =
        a->step * (uint32_t)(L + 3) + (uint32_t)pl_sync_key_order(L, g->key);
    char msg[256];
    int rc = 0;
    if (pl_ring_allreduce_many(a->peers, group, g->nranks, j->ring, j->n, tag, a->pack,
                               a->timeout_ms, msg, sizeof msg) != 0) {
        char name[32];
        pl_sync_key_name(g->key, name, sizeof name);
        rc = pl_errf(err, errlen, "worker step: all-reduce of %s: %s", name, msg);
    }
    free(group);
    return rc;
}

/* Comm thread: jobs [*sent, upto), reduced, to the shadow's holder (shadow.h). Only once
 * the stage is over: its last messages are queued then, so these bytes never delay them
 * on the link. */
static int send_shadow(sync_state *s, int upto, int *sent)
{
    for (; *sent < upto && s->rc == 0; (*sent)++) {
        const sync_job *j = &s->jobs[*sent];
        s->rc = pl_shadow_send_group(s->a->link, s->holder, s->a->groups->L, j->g->key, j->ring,
                                     j->n, s->err, sizeof s->err);
    }
    return s->rc;
}

/* The comm thread: no OpenMP, no kernels, the only user of the peers' connections. */
static void *sync_main(void *arg)
{
    sync_state *s = arg;
    int sent = 0;
    for (int i = 0; i < s->njobs && s->rc == 0; i++) {
        const sync_job *j = &s->jobs[i];
        pthread_mutex_lock(&s->mu);
        while (!j->ready && !s->abort) pthread_cond_wait(&s->cv, &s->mu);
        const int stop = s->abort, over = s->stage_over;
        if (!stop && j->g->nranks > 1 && !over) s->overlapped++;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        if (s->a->before_reduce && j->g->nranks > 1) s->a->before_reduce(s->a->hook_ctx, j->g->key);
        s->rc = reduce_job(s, j, s->err, sizeof s->err);
        /* final now: after the stage, it goes while the other groups are reduced */
        if (s->rc == 0 && s->holder >= 0 && over) send_shadow(s, i + 1, &sent);
    }
    if (s->rc == 0 && s->holder >= 0) {
        pthread_mutex_lock(&s->mu);
        while (!s->stage_over) pthread_cond_wait(&s->cv, &s->mu);
        const int stop = s->abort;
        pthread_mutex_unlock(&s->mu);
        if (!stop) send_shadow(s, s->njobs, &sent);
    }
    pthread_mutex_lock(&s->mu);
    s->comm_over = 1;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* pl_frc_fill_while's test: the comm thread still reduces (or sends). */
static int comm_busy(void *ctx)
{
    sync_state *s = ctx;
    pthread_mutex_lock(&s->mu);
    const int busy = !s->comm_over;
    pthread_mutex_unlock(&s->mu);
    return busy;
}

/* The rank's jobs in its run order; host staging (the engine's PL_IO_GRADS buffer) off
 * the CPU backend. */
static int plan_sync(sync_state *s, const pl_sync_rank *me, float **buf, char *err,
                     size_t errlen)
{
    const int self = s->a->xport ? s->a->xport->self : (int)s->a->peers->self;
    const pl_worker_step_args *a = s->a;
    pl_engine *e = a->engine;
    s->njobs = me->ngroups;
    s->jobs = calloc((size_t)me->ngroups, sizeof *s->jobs);
    if (!s->jobs) return pl_errf(err, errlen, "worker step: out of memory");
    size_t nstaged = 0;
    for (int i = 0; i < me->ngroups; i++) {
        sync_job *j = &s->jobs[i];
        j->g = pl_syncgroups_group(a->groups, me->keys[i]);
        if (!j->g)
            return pl_errf(err, errlen, "worker step: unknown sync group key %d", me->keys[i]);
        j->n = pl_worker_group_tensors(e, j->g->key, j->refs);
        if (j->n == 0) {
            char name[32];
            pl_sync_key_name(j->g->key, name, sizeof name);
            return pl_errf(err, errlen, "worker step: rank %d is in group %s but holds none of it",
                           self, name);
        }
        /* wte is complete with the embedding's backward, or the head's without it */
        j->layer = j->g->key != PL_SYNC_WTE ? j->g->key
                   : pl_engine_has_embedding(e) ? 0 : e->cfg.L + 1;
        memcpy(j->ring, j->refs, (size_t)j->n * sizeof *j->refs);
        if (staged(s, j))
            for (int t = 0; t < j->n; t++) nstaged += j->refs[t].count;
    }
    if (nstaged == 0) return 0;
    *buf = pl_engine_io_buffer(e, PL_IO_GRADS, nstaged);
    if (!*buf) return pl_errf(err, errlen, "worker step: out of memory");
    size_t off = 0;
    for (int i = 0; i < s->njobs; i++) {
        sync_job *j = &s->jobs[i];
        if (!staged(s, j)) continue;
        for (int t = 0; t < j->n; t++) {
            j->ring[t].data = *buf + off;
            off += j->refs[t].count;
        }
    }
    return 0;
}

/* Runs the stage with the comm thread beside it; 0, or −1 with err from whichever
 * thread failed (the stage's error first). */
static int stage_and_sync(sync_state *s, const pl_stage_batch *batch, double *loss, char *err,
                          size_t errlen)
{
    const pl_worker_step_args *a = s->a;
    pthread_t th;
    if (pthread_create(&th, NULL, sync_main, s) != 0)
        return pl_errf(err, errlen, "worker step: cannot start the sync thread");
    int rc = pl_stage_step_notify(a->engine, a->schedule, a->link, batch, layer_done, s, loss,
                                  err, errlen);
    pthread_mutex_lock(&s->mu);
    s->stage_over = 1;
    s->abort = rc != 0;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (rc == 0 && batch->frc) pl_frc_fill_while(batch->frc, comm_busy, s); /* a bubble too */
    pthread_join(th, NULL);
    if (rc == 0 && s->rc != 0) rc = pl_errf(err, errlen, "%s", s->err);
    return rc;
}

/* ---- on an ordered transport (xport.h) ----
 *
 * One queue per rank, in issue order: the stage's paired p2p groups G_0 .. G_{n−1},
 * then, during the last backward, the all-reduces of the rank's layers (highest
 * first), then the final send (the last backward's input gradient to stage k − 1),
 * then the wte all-reduce. Why this cannot deadlock, even with heterogeneous
 * pipelines (layer l on stage a of one pipeline and stage b of another):
 *
 *  (1) Which p2p a stage needs before its all-reduces: its groups G_0 .. G_{n−1}.
 *      Downwards they pair only with groups of stage k−1 before ITS last one (in the
 *      cool-down k's G_{n−d} pairs with k−1's G_{n−1−d}: one index lower per stage
 *      down, and activations go up earlier still), so no final send of a stage ≤ k is
 *      needed. Upwards G_{n−1} receives stage k+1's FINAL send, which follows k+1's
 *      all-reduces and needs k+1's own G_{n−1}, i.e. k+2's final send, and so on: the
 *      stages above k (holding only higher layers) must have done their all-reduces,
 *      nothing else. Apart from that, each pipeline's p2p is deadlock-free in paired
 *      mode for any compute times (pl_pipeline_simulate, tests/unit/test_schedule.c):
 *      a block of all-reduces that completes is just a longer last backward.
 *  (2) Induction, layers L+1 down to 0: all-reduce(l) completes. Every member holds l
 *      at some stage k of its pipeline; by (1) it reaches its all-reduces once the
 *      stages above it (holding only layers > l) made their final sends, which they
 *      do once their all-reduces (layers > l: done by the induction) are. Then it
 *      runs its all-reduces of layers > l (done) and is at all-reduce(l), like every
 *      other member: it completes. A rank's all-reduces being a subsequence of the
 *      one global order (L+1 .. 0, then wte) is what lets the induction go layer by
 *      layer.
 *  (3) wte, last everywhere: once every layer's all-reduce and so every final send is
 *      done (stage 0 holds layer 0 and has received its last gradient), every wte
 *      holder has only the wte all-reduce left.
 * Enqueuing wte with the head's layer instead breaks (1): the head stage's final send
 * would wait for wte, which waits for stage 0, which waits for that send
 * (tests/unit/test_xport_step.c shows the deadlock in the simulator). */

/* Enqueues job i's all-reduce (after the compute that wrote it). */
static int xport_reduce(sync_state *s, int i, char *err, size_t errlen)
{
    const pl_worker_step_args *a = s->a;
    const pl_xport *x = a->xport;
    const sync_job *j = &s->jobs[i];
    const pl_sync_group *g = j->g;
    if (g->nranks == 1) return 0;
    if (a->before_reduce) a->before_reduce(a->hook_ctx, g->key);
    int32_t *group = malloc((size_t)g->nranks * sizeof *group);
    if (!group) return pl_errf(err, errlen, "worker step: out of memory");
    for (int r = 0; r < g->nranks; r++) group[r] = g->ranks[r];
    float *bufs[PL_MAX_LAYER_TENSORS];
    size_t counts[PL_MAX_LAYER_TENSORS];
    for (int t = 0; t < j->n; t++) bufs[t] = j->refs[t].data, counts[t] = j->refs[t].count;
    char msg[1024];
    int rc = x->after_compute(x->ctx, msg, sizeof msg) ||
             x->allreduce(x->ctx, group, g->nranks, bufs, counts, j->n, msg, sizeof msg);
    free(group);
    if (rc) {
        char name[32];
        pl_sync_key_name(g->key, name, sizeof name);
        return pl_errf(err, errlen, "worker step: all-reduce of %s: %s", name, msg);
    }
    return 0;
}

/* The stage's callback: enqueue, in the rank's order, the groups `layer` completes
 * (never wte: that one waits for the final send). An error is kept for the end. */
typedef struct {
    sync_state *s;
    int next; /* the next job to enqueue */
} xport_sync;

static void xport_layer_done(void *ctx, int layer)
{
    xport_sync *x = ctx;
    sync_state *s = x->s;
    while (x->next < s->njobs && s->rc == 0 && s->jobs[x->next].g->key != PL_SYNC_WTE &&
           s->jobs[x->next].layer == layer) {
        s->rc = xport_reduce(s, x->next, s->err, sizeof s->err);
        if (s->rc == 0 && s->jobs[x->next].g->nranks > 1) s->overlapped++;
        x->next++;
    }
}

static int xport_stage_and_sync(sync_state *s, const pl_stage_batch *batch, double *loss,
                                char *err, size_t errlen)
{
    const pl_worker_step_args *a = s->a;
    const pl_xport *x = a->xport;
    const pl_schedule *sch = a->schedule;
    int *ranks = NULL;
    const int *stage_ranks = a->stage_ranks;
    if (!stage_ranks && sch->nstages > 1) {
        if (!(ranks = malloc((size_t)sch->nstages * sizeof *ranks)))
            return pl_errf(err, errlen, "worker step: out of memory");
        for (int k = 0; k < sch->nstages; k++) ranks[k] = x->self - sch->stage + k;
        stage_ranks = ranks;
    }
    for (int i = 0; i < s->njobs; i++)
        for (int r = 0; r < s->jobs[i].g->nranks; r++)
            if (s->jobs[i].g->ranks[r] >= x->nranks) {
                free(ranks);
                return pl_errf(err, errlen,
                               "worker step: sync group rank %d outside the world of %d",
                               s->jobs[i].g->ranks[r], x->nranks);
            }
    pl_stage_xlink link = {x, stage_ranks};
    xport_sync xs = {s, 0};
    int rc = pl_stage_step_xport(a->engine, sch, &link, batch, xport_layer_done, &xs, loss,
                                 err, errlen);
    free(ranks);
    if (rc == 0 && s->rc != 0) rc = pl_errf(err, errlen, "%s", s->err);
    /* what the last backward did not enqueue: wte, after the final send */
    for (int i = xs.next; i < s->njobs && rc == 0; i++) rc = xport_reduce(s, i, err, errlen);
    char msg[1024];
    if (rc == 0 && x->wait(x->ctx, a->timeout_ms, msg, sizeof msg))
        rc = pl_errf(err, errlen, "worker step: waiting for the transport: %s", msg);
    return rc;
}

static int by_address(const void *x, const void *y)
{
    const float *a = ((const pl_tensor_ref *)x)->data, *b = ((const pl_tensor_ref *)y)->data;
    return (a > b) - (a < b);
}

/* Σ g² of the groups whose lowest rank is this one, in as few reductions as possible
 * (off the CPU each waits for the device): their tensors are runs of the engine's
 * contiguous gradients, merged in address order. */
static int counted_sumsq(const sync_state *s, int self, double *out, char *err, size_t errlen)
{
    pl_tensor_ref *r = malloc(((size_t)s->njobs * PL_MAX_LAYER_TENSORS + 1) * sizeof *r);
    if (!r) return pl_errf(err, errlen, "worker step: out of memory");
    int n = 0;
    for (int i = 0; i < s->njobs; i++)
        if (s->jobs[i].g->ranks[0] == self)
            for (int t = 0; t < s->jobs[i].n; t++) r[n++] = s->jobs[i].refs[t];
    qsort(r, (size_t)n, sizeof *r, by_address);
    double sum = 0;
    for (int i = 0; i < n;) {
        float *run = r[i].data;
        size_t len = 0;
        for (; i < n && r[i].data == run + len; i++) len += r[i].count;
        sum += kn_sum_squares(s->a->engine->k, run, len);
    }
    free(r);
    *out = sum;
    return 0;
}

/* The successor's gradients into the shadow (shadow.h), group by group in the order
 * its comm thread sent them, the eager FRC (frc, or NULL) filling the waits; the time
 * of the receives themselves into *ms. */
static int rc_receive(const pl_worker_step_args *a, pl_frc *frc, double *ms, char *err,
                      size_t errlen)
{
    const int succ = pl_shadow_successor(a->rc, a->schedule->stage, a->schedule->nstages);
    if (succ < 0) return 0;
    const int L = a->shadow->cfg.L;
    pl_tensor_ref refs[PL_MAX_LAYER_TENSORS];
    for (int order = 0; order <= L + 2; order++) {
        const int key = order == L + 2 ? PL_SYNC_WTE : L + 1 - order;
        const int n = pl_worker_group_tensors(a->shadow, key, refs);
        if (!n) continue;
        if (frc)
            pl_frc_fill_wait(frc, a->link, succ, PL_LINK_SHADOW, pl_shadow_grad_tag(L, key, 0));
        const double t0 = pl_now_ms();
        if (pl_shadow_recv_group(a->shadow, a->link, succ, key, refs, n, err, errlen)) return -1;
        *ms += pl_now_ms() - t0;
    }
    return 0;
}

static int rc_check(const pl_worker_step_args *a, char *err, size_t errlen)
{
    const int succ = pl_shadow_successor(a->rc, a->schedule->stage, a->schedule->nstages);
    if (a->rc != PL_RC_NONE && a->xport)
        return pl_errf(err, errlen, "worker step: redundant layers need the TCP stage link");
    if (succ >= 0 && !a->shadow)
        return pl_errf(err, errlen, "worker step: stage %d shadows stage %d but has no shadow",
                       a->schedule->stage, succ);
    return 0;
}

/* Eager FRC of this step (frc.h) when the stage shadows one and a->frc; else f is
 * zeroed (f->shadow NULL). 0, or −1 with err. */
static int frc_begin(const pl_worker_step_args *a, pl_frc *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    const int succ = pl_shadow_successor(a->rc, a->schedule->stage, a->schedule->nstages);
    if (!a->frc || succ < 0 || !a->shadow) return 0;
    const size_t off = (size_t)a->first_micro * (size_t)a->engine->B * (size_t)a->engine->T;
    return pl_frc_begin(f, a->shadow, a->engine, a->schedule, a->tokens ? a->tokens + off : NULL,
                        a->targets ? a->targets + off : NULL, err, errlen);
}

int pl_worker_step(const pl_worker_step_args *a, pl_worker_step_result *out, char *err,
                   size_t errlen)
{
    pl_engine *e = a->engine;
    const pl_schedule *sch = a->schedule;
    memset(out, 0, sizeof *out);
    if (a->first_micro < 0 || a->first_micro + sch->nmicro > a->global_micro)
        return pl_errf(err, errlen,
                       "worker step: microbatches [%d, %d) outside the step's %d",
                       a->first_micro, a->first_micro + sch->nmicro, a->global_micro);
    if (rc_check(a, err, errlen)) return -1;
    const int self = a->xport ? a->xport->self : (int)a->peers->self;
    const pl_sync_rank *me = pl_syncgroups_rank(a->groups, self);
    if (!me) return pl_errf(err, errlen, "worker step: rank %d runs no stage in the plan", self);

    const size_t BT = (size_t)e->B * (size_t)e->T, off = (size_t)a->first_micro * BT;
    pl_stage_batch batch = {
        pl_engine_has_embedding(e) && a->tokens ? a->tokens + off : NULL,
        pl_engine_has_head(e) && a->targets ? a->targets + off : NULL,
        1.0f / (float)((double)a->global_micro * (double)BT),
        a->before_op,
        a->hook_ctx,
        NULL,
    };
    if (pl_engine_has_embedding(e) && !batch.tokens)
        return pl_errf(err, errlen, "worker step: the stage has the embedding and needs tokens");
    if (pl_engine_has_head(e) && !batch.targets)
        return pl_errf(err, errlen, "worker step: the stage has the head and needs targets");
    pl_frc frc;
    if (frc_begin(a, &frc, err, errlen)) return -1;
    if (frc.shadow) batch.frc = &frc;

    /* on an ordered transport the gradients are reduced where they are */
    sync_state s = {.a = a, .host = a->xport || strcmp(kn_backend(e->k), "cpu") == 0,
                    .holder = a->xport ? -1 : pl_shadow_holder(a->rc, sch->stage, sch->nstages)};
    float *buf = NULL;
    int rc = plan_sync(&s, me, &buf, err, errlen);
    double loss = 0;
    if (rc == 0 && a->xport) {
        pl_engine_zero_grads(e);
        rc = xport_stage_and_sync(&s, &batch, &loss, err, errlen);
    } else if (rc == 0) {
        pl_engine_zero_grads(e);
        pthread_mutex_init(&s.mu, NULL);
        pthread_cond_init(&s.cv, NULL);
        rc = stage_and_sync(&s, &batch, &loss, err, errlen);
        pthread_cond_destroy(&s.cv);
        pthread_mutex_destroy(&s.mu);
    }
    for (int i = 0; i < s.njobs && rc == 0; i++) {
        const sync_job *j = &s.jobs[i];
        if (!s.host && j->g->nranks > 1)
            for (int t = 0; t < j->n; t++)
                kn_to_device(e->k, j->refs[t].data, j->ring[t].data,
                             j->refs[t].count * sizeof(float));
    }
    if (rc == 0) rc = rc_receive(a, batch.frc, &out->shadow_recv_ms, err, errlen);
    if (rc == 0 && batch.frc) pl_frc_finish(batch.frc);
    double sumsq = 0;
    if (rc == 0) rc = counted_sumsq(&s, self, &sumsq, err, errlen);
    free(s.jobs);
    if (rc != 0) return -1;
    out->grad_sumsq = sumsq;
    out->has_loss = pl_engine_has_head(e);
    out->loss_sum = out->has_loss ? loss : 0;
    out->overlapped = s.overlapped;
    out->frc = frc.stats;
    return 0;
}

void pl_worker_apply(pl_engine *e, const pl_adamw *o, float grad_scale, int t)
{
    pl_engine_adamw(e, o, grad_scale, t);
}
