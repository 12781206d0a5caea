/* Layer copies over TCP (layer_copy.h): a source serves each destination from a thread of
 * its own; a destination accepts its sources on the mesh and receives from each on a
 * thread of its own. A stop (pl_layer_copy_stop_now, or the copy's own failure) shuts
 * every stream down, so that no thread waits out its idle timeout. */
#include "layer_copy.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "populate_ahead.h"
#include "util.h"

/* A tensor asked for, or part of one (pl_layer_copy_part_span): the frame carries these. */
typedef struct {
    int32_t layer, index, part, parts;
} tensor_ref;

#define ARRAYS 3 /* params, AdamW m, AdamW v */

#define STREAMS PL_LAYER_COPY_STREAMS
#define STOP_POLL_MS 50 /* how soon a stop ends the wait for sources */

/* Layer copies move host memory: off the CPU backend each tensor passes through a
 * page-locked staging buffer, grown to the largest tensor. */
typedef struct {
    kn_ctx *k;
    int on;
    float *buf;
    size_t cap; /* floats */
} host_stage;

static host_stage stage_for(kn_ctx *k)
{
    return (host_stage){.k = k, .on = strcmp(kn_backend(k), "cpu") != 0};
}

static float *stage_room(host_stage *st, size_t n)
{
    if (n <= st->cap) return st->buf;
    kn_host_free(st->k, st->buf);
    st->cap = 0;
    if (!(st->buf = kn_host_alloc(st->k, n * sizeof(float)))) return NULL;
    st->cap = n;
    return st->buf;
}

static void stage_free(host_stage *st)
{
    kn_host_free(st->k, st->buf);
    st->buf = NULL;
    st->cap = 0;
}

/* ---- one plan's copies, and stopping them ---- */

typedef struct copy_sender copy_sender;
typedef struct copy_receiver copy_receiver;

typedef struct {
    const pl_layer_copy_tcp *t;
    const pl_layer_copy_job *job;
    pl_layer_copy_stop *stop;
    copy_sender *snd;
    int nsend, maxsend; /* started; room (every entry zeroed first) */
    copy_receiver *rcv;
    int nrecv, maxrecv;
    tensor_ref *wants; /* the receivers' lists, one after another */
    double first_ms;   /* pl_now_ms when the first source was accepted (0: none) */
    int failed;        /* under the stop's lock: this side failed, its streams end */
} tcp_copies;

struct pl_layer_copy_stop {
    pthread_mutex_t mu;
    int stopped;       /* pl_layer_copy_stop_now came */
    char why[256];
    tcp_copies *tc;    /* the copy whose streams it shuts down; NULL: none (yet) */
};

struct copy_sender {
    tcp_copies *tc;
    const pl_engine *src;
    const pl_msg_peer *dest;
    pl_conn *c; /* under the stop's lock: keep_conn, drop_conn */
    int rc;
    char err[512];
    pthread_t th;
};

struct copy_receiver {
    const char *source;
    pl_conn *c; /* under the stop's lock: keep_conn, drop_conn */
    pl_engine *dst;
    tensor_ref *want;
    int nwant;
    int64_t bytes;
    int present;    /* dst's received pages are present (the reserve): no populating helper */
    double done_ms; /* pl_now_ms when the last tensor arrived */
    int rc, started;
    char err[512];
    pthread_t th;
};

static void stop_init(pl_layer_copy_stop *st)
{
    memset(st, 0, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
}

pl_layer_copy_stop *pl_layer_copy_stop_new(void)
{
    pl_layer_copy_stop *st = malloc(sizeof *st);
    if (st) stop_init(st);
    return st;
}

void pl_layer_copy_stop_free(pl_layer_copy_stop *st)
{
    if (!st) return;
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* Under the stop's lock: every stream open now fails at once (shutdown(2) wakes its
 * thread, and the peer sees the connection end). */
static void shut_streams(const tcp_copies *tc)
{
    for (int k = 0; tc->snd && k < tc->maxsend; k++) pl_conn_shutdown(tc->snd[k].c);
    for (int k = 0; tc->rcv && k < tc->maxrecv; k++) pl_conn_shutdown(tc->rcv[k].c);
}

void pl_layer_copy_stop_now(pl_layer_copy_stop *st, const char *why)
{
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    if (!st->stopped) snprintf(st->why, sizeof st->why, "%s", why);
    st->stopped = 1;
    if (st->tc) shut_streams(st->tc);
    pthread_mutex_unlock(&st->mu);
}

/* The streams of tc may be shut down from now on (all its entries are made); a stop that
 * came before takes effect now. */
static void stop_attach(tcp_copies *tc)
{
    pthread_mutex_lock(&tc->stop->mu);
    tc->stop->tc = tc;
    if (tc->stop->stopped) shut_streams(tc);
    pthread_mutex_unlock(&tc->stop->mu);
}

/* The copy failed on this side: its other streams end now rather than at their timeout. */
static void stop_streams(tcp_copies *tc)
{
    pthread_mutex_lock(&tc->stop->mu);
    tc->failed = 1;
    shut_streams(tc);
    pthread_mutex_unlock(&tc->stop->mu);
}

/* A stream's connection, where a stop finds it; one opened after the stop fails at once. */
static void keep_conn(tcp_copies *tc, pl_conn **slot, pl_conn *c)
{
    pthread_mutex_lock(&tc->stop->mu);
    *slot = c;
    if (tc->stop->stopped || tc->failed) pl_conn_shutdown(c);
    pthread_mutex_unlock(&tc->stop->mu);
}

static void drop_conn(tcp_copies *tc, pl_conn **slot)
{
    pthread_mutex_lock(&tc->stop->mu);
    pl_conn *c = *slot;
    *slot = NULL;
    pthread_mutex_unlock(&tc->stop->mu);
    pl_conn_close(c);
}

/* ---- the source's side: one thread per destination ---- */

/* Streams params, m and v of the n tensors asked for. */
static int send_tensors(copy_sender *s, pl_conn *c, const tensor_ref *r, size_t n,
                        host_stage *stage)
{
    for (size_t k = 0; k < n; k++) {
        const pl_engine_tensor *t = pl_engine_find(s->src, r[k].layer, r[k].index);
        if (!t)
            return pl_errf(s->err, sizeof s->err, "%s asks for tensor (%d, %d), not held here",
                           s->dest->name, r[k].layer, r[k].index);
        if (r[k].parts < 1 || r[k].parts > PL_PROTO_MAX_PARTS || r[k].part < 0 ||
            r[k].part >= r[k].parts)
            return pl_errf(s->err, sizeof s->err, "%s asks for part %d of %d of tensor (%d, %d)",
                           s->dest->name, r[k].part, r[k].parts, r[k].layer, r[k].index);
        size_t off, cnt;
        pl_layer_copy_part_span(t->spec.numel, r[k].part, r[k].parts, &off, &cnt);
        const float *arr[ARRAYS] = {s->src->params, s->src->m, s->src->v};
        for (int j = 0; j < ARRAYS; j++) {
            const float *x = arr[j] + t->offset + off;
            if (stage->on) {
                float *h = stage_room(stage, cnt);
                if (!h)
                    return pl_errf(s->err, sizeof s->err, "out of memory staging a layer for %s",
                                   s->dest->name);
                kn_to_host(stage->k, h, x, cnt * sizeof(float));
                x = h;
            }
            if (pl_conn_send_floats(c, (uint32_t)(ARRAYS * k + (size_t)j), x, cnt,
                                    PL_LAYER_COPY_TIMEOUT_MS, s->err, sizeof s->err))
                return -1;
        }
        if (s->tc->t->after_send) s->tc->t->after_send(s->tc->t->hook_ctx);
    }
    return 0;
}

/* One frame of the expected type from the destination (its request or acknowledgement). */
static int recv_control(copy_sender *s, pl_conn *c, uint16_t type, void **data, size_t *len)
{
    pl_frame_hdr h;
    if (pl_conn_recv_frame_alloc(c, &h, data, PL_LAYER_COPY_TIMEOUT_MS, s->err, sizeof s->err))
        return -1;
    *len = (size_t)h.len;
    if (h.type != type || (type == PL_LAYER_COPY_FRAME_REQ && h.len % sizeof(tensor_ref)))
        return pl_errf(s->err, sizeof s->err, "%s from %s: frame type %u of %llu bytes",
                       type == PL_LAYER_COPY_FRAME_REQ ? "bad copy request"
                                                       : "no copy acknowledgement",
                       s->dest->name, h.type, (unsigned long long)h.len);
    return 0;
}

/* The destination's connection, kept where a stop finds it. */
static int dial_dest(copy_sender *s)
{
    pl_conn *c = NULL;
    if (pl_mesh_dial(s->tc->t->mesh, s->dest->host, s->dest->port, PL_CONN_LAYER_COPY, -1,
                     PL_LAYER_COPY_TIMEOUT_MS, &c, s->err, sizeof s->err))
        return -1;
    keep_conn(s->tc, &s->c, c);
    return 0;
}

static void *sender_main(void *arg)
{
    copy_sender *s = arg;
    void *req = NULL, *ack = NULL;
    size_t len = 0;
    host_stage stage = stage_for(s->src->k);
    s->rc = dial_dest(s) || recv_control(s, s->c, PL_LAYER_COPY_FRAME_REQ, &req, &len) ||
            send_tensors(s, s->c, req, len / sizeof(tensor_ref), &stage) ||
            recv_control(s, s->c, PL_LAYER_COPY_FRAME_ACK, &ack, &len);
    free(req);
    free(ack);
    stage_free(&stage);
    drop_conn(s->tc, &s->c);
    return NULL;
}

/* ---- the destination's side: one thread per source ---- */

/* Where array j of the k-th tensor asked for goes in dst: its first float and count. */
static float *want_span(const copy_receiver *r, int k, int j, size_t *cnt)
{
    const tensor_ref *w = &r->want[k];
    const pl_engine_tensor *t = pl_engine_find(r->dst, w->layer, w->index);
    size_t off;
    pl_layer_copy_part_span(t->spec.numel, w->part, w->parts, &off, cnt);
    float *arr[ARRAYS] = {r->dst->params, r->dst->m, r->dst->v};
    return arr[j] + t->offset + off;
}

/* pl_ahead_range: range i is array i % ARRAYS of the (i / ARRAYS)-th tensor asked for, the
 * order the source streams them. */
static void want_range(void *ctx, int i, void **p, size_t *bytes)
{
    size_t cnt;
    *p = want_span(ctx, i / ARRAYS, i % ARRAYS, &cnt);
    *bytes = cnt * sizeof(float);
}

/* On the CPU backend each range is present before it is received into (the reserve's
 * pages, else a helper populating the new engine's fresh pages ahead of the stream, so
 * that the receive's copy does not stop to fault each page in); off it, each passes
 * through the stage. */
static int recv_tensors(copy_receiver *r, host_stage *stage, pl_ahead *ahead)
{
    for (int k = 0; k < r->nwant; k++) {
        size_t cnt = 0;
        for (int j = 0; j < ARRAYS; j++) {
            float *dst = want_span(r, k, j, &cnt);
            float *x = stage->on ? stage_room(stage, cnt) : dst;
            if (!x)
                return pl_errf(r->err, sizeof r->err, "out of memory staging a layer from %s",
                               r->source);
            if (!stage->on && !r->present) pl_ahead_reach(ahead, ARRAYS * k + j);
            if (pl_conn_recv_floats(r->c, (uint32_t)(ARRAYS * k + j), x, cnt,
                                    PL_LAYER_COPY_TIMEOUT_MS, r->err, sizeof r->err))
                return -1;
            if (stage->on) kn_to_device(stage->k, dst, x, cnt * sizeof(float));
        }
        r->bytes += ARRAYS * (int64_t)cnt * (int64_t)sizeof(float);
    }
    r->done_ms = pl_now_ms();
    return 0;
}

static void *receiver_main(void *arg)
{
    copy_receiver *r = arg;
    host_stage stage = stage_for(r->dst->k);
    pl_ahead ahead = {0};
    if (!stage.on && !r->present)
        pl_ahead_start(&ahead, r->dst->k, ARRAYS * r->nwant, want_range, r);
    r->rc = pl_conn_send_frame(r->c, PL_LAYER_COPY_FRAME_REQ, 0, 0, r->want,
                               (size_t)r->nwant * sizeof(tensor_ref), PL_LAYER_COPY_TIMEOUT_MS,
                               r->err, sizeof r->err) ||
            recv_tensors(r, &stage, &ahead) ||
            pl_conn_send_frame(r->c, PL_LAYER_COPY_FRAME_ACK, 0, 0, NULL, 0,
                               PL_LAYER_COPY_TIMEOUT_MS, r->err, sizeof r->err);
    pl_ahead_stop(&ahead);
    stage_free(&stage);
    return NULL;
}

/* ---- one plan's copies ---- */

/* A copy of this plan over TCP: not one over the ordered transport. */
static int over_tcp(const pl_layer_copy_job *job, const char *source, const char *dest)
{
    return !pl_layer_copy_over_xport(job->plan, source, dest);
}

/* One sender thread per destination of the plan's sends. */
static int start_senders(tcp_copies *tc, char *err, size_t errlen)
{
    const pl_msg_plan *p = tc->job->plan;
    for (int i = 0; i < p->nsends; i++) {
        const char *dest = p->sends[i].dest;
        int seen = !over_tcp(tc->job, tc->job->self, dest);
        for (int j = 0; j < tc->nsend && !seen; j++) seen = !strcmp(tc->snd[j].dest->name, dest);
        for (int k = 0; k < STREAMS && !seen; k++) {
            copy_sender *s = &tc->snd[tc->nsend];
            *s = (copy_sender){.tc = tc, .src = tc->job->src, .dest = pl_msg_plan_peer(p, dest)};
            if (!s->dest || s->dest->port <= 0)
                return pl_errf(err, errlen, "no address for copy destination %s", dest);
            if (pthread_create(&s->th, NULL, sender_main, s))
                return pl_errf(err, errlen, "cannot start a copy thread");
            tc->nsend++;
        }
    }
    return 0;
}

/* Bytes of the tensor (or part) w of dst, each of its ARRAYS. */
static size_t want_bytes(const pl_engine *dst, const tensor_ref *w)
{
    size_t off, cnt;
    pl_layer_copy_part_span(pl_engine_find(dst, w->layer, w->index)->spec.numel, w->part,
                            w->parts, &off, &cnt);
    return cnt * sizeof(float);
}

/* Appends to w[*n] the tensors of dst whose layers the plan copies from source, in dst's
 * order: each one, or each of its parts. */
static void wants_from(const pl_layer_copy_job *job, const char *source, tensor_ref *w, int *n)
{
    for (int j = 0; j < job->dst->ntensors; j++) {
        const int layer = pl_layer_copy_layer_of(job->dst, j);
        for (int x = 0; x < job->plan->ncopies; x++) {
            const pl_msg_copy *cp = &job->plan->copies[x];
            if (cp->layer == layer && !strcmp(cp->source, source))
                w[(*n)++] = (tensor_ref){job->dst->tensors[j].layer, job->dst->tensors[j].index,
                                         cp->parts > 1 ? cp->part : 0, cp->parts > 1 ? cp->parts : 1};
        }
    }
}

/* Halves w[at] where it alone is over `half` bytes and its parts can double: part p of
 * n is parts 2p and 2p + 1 of 2n (pl_layer_copy_part_span rounds down at both ends). */
static void split_large(const pl_engine *dst, tensor_ref *w, int at, int *n, size_t half)
{
    if (w[at].parts * 2 > PL_PROTO_MAX_PARTS || want_bytes(dst, &w[at]) <= half) return;
    memmove(&w[at + 1], &w[at], (size_t)(*n - at) * sizeof *w);
    w[at].part *= 2, w[at].parts *= 2;
    w[at + 1].part = w[at].part + 1, w[at + 1].parts = w[at].parts;
    (*n)++;
}

/* STREAMS receivers per source, with the tensors of dst that come from it: its list in
 * STREAMS runs of about equal bytes (a run may be empty). */
static void plan_receivers(tcp_copies *tc)
{
    const pl_layer_copy_job *job = tc->job;
    int nwant = 0;
    for (int i = 0; i < job->plan->ncopies; i++) {
        const char *source = job->plan->copies[i].source;
        int seen = !over_tcp(job, source, job->self);
        for (int k = 0; k < tc->nrecv && !seen; k++) seen = !strcmp(tc->rcv[k].source, source);
        if (seen) continue;
        tensor_ref *w = tc->wants + nwant;
        int n = 0;
        wants_from(job, source, w, &n);
        size_t total = 0;
        for (int x = 0; x < n; x++) total += want_bytes(job->dst, &w[x]);
        for (int x = 0; x < n; x++) split_large(job->dst, w, x, &n, total / STREAMS);
        size_t sent = 0;
        for (int k = 0, x = 0; k < STREAMS; k++) {
            copy_receiver *r = &tc->rcv[tc->nrecv++];
            *r = (copy_receiver){.source = source, .dst = job->dst, .want = w + x};
            /* run k ends where the bytes so far pass (k + 1) / STREAMS of the total */
            while (x < n && (k == STREAMS - 1 || sent < total / STREAMS * (size_t)(k + 1)))
                sent += want_bytes(job->dst, &w[x++]);
            r->nwant = (int)(w + x - r->want);
        }
        nwant += n;
    }
}

/* Whether a stop came, or this side failed: its waits end. */
static int stopping(tcp_copies *tc)
{
    pthread_mutex_lock(&tc->stop->mu);
    const int yes = tc->stop->stopped || tc->failed;
    pthread_mutex_unlock(&tc->stop->mu);
    return yes;
}

/* One copy connection by the deadline, in slices so that a stop ends the wait (a source
 * may have opened some of its streams and stalled). */
static int accept_copy(tcp_copies *tc, double deadline, pl_conn **c, char *err, size_t errlen)
{
    const unsigned later = PL_MESH_PURPOSE(PL_CONN_RING) | PL_MESH_PURPOSE(PL_CONN_STAGE_LINK);
    for (;;) {
        const double now = pl_now_ms();
        const double until = deadline < now + STOP_POLL_MS ? deadline : now + STOP_POLL_MS;
        const int rc = pl_mesh_accept(tc->t->mesh, PL_MESH_PURPOSE(PL_CONN_LAYER_COPY), later,
                                      until, c, err, errlen);
        if (rc != PL_COMM_ETIMEOUT || pl_now_ms() >= deadline) return rc;
        if (stopping(tc)) return pl_errf(err, errlen, "stopped waiting for copy sources");
    }
}

/* Accepts every source's connections and starts their receivers; the ring and stage link
 * connections that come meanwhile wait in the mesh's stash. */
static int accept_sources(tcp_copies *tc, char *err, size_t errlen)
{
    const double deadline = pl_now_ms() + PL_LAYER_COPY_TIMEOUT_MS;
    for (int got = 0; got < tc->nrecv;) {
        pl_conn *c = NULL;
        if (accept_copy(tc, deadline, &c, err, errlen)) return -1;
        copy_receiver *r = NULL;
        for (int k = 0; k < tc->nrecv && !r; k++)
            if (!tc->rcv[k].c && !strcmp(tc->rcv[k].source, pl_conn_peer_name(c))) r = &tc->rcv[k];
        if (!r) { /* not a source of this worker, or one twice */
            pl_conn_close(c);
            continue;
        }
        keep_conn(tc, &r->c, c);
        if (!tc->first_ms) tc->first_ms = pl_now_ms();
        if (pthread_create(&r->th, NULL, receiver_main, r))
            return pl_errf(err, errlen, "cannot start a copy thread");
        r->started = 1;
        got++;
    }
    return 0;
}

/* Waits for every thread; the first failure is the copy's (rc 0 so far). */
static int join_all(tcp_copies *tc, int rc, pl_layer_copy_result *res, char *err, size_t errlen)
{
    for (int k = 0; k < tc->nrecv; k++) {
        copy_receiver *r = &tc->rcv[k];
        if (r->started) {
            pthread_join(r->th, NULL);
            if (r->rc && rc == 0) {
                rc = pl_errf(err, errlen, "copy from %s: %s", r->source, r->err);
                snprintf(res->failed_peer, sizeof res->failed_peer, "%s", r->source);
            }
            res->bytes_in += r->bytes;
            if (r->done_ms > tc->first_ms && r->done_ms - tc->first_ms > res->net_ms)
                res->net_ms = r->done_ms - tc->first_ms;
        }
        drop_conn(tc, &r->c);
    }
    for (int k = 0; k < tc->nsend; k++) {
        copy_sender *s = &tc->snd[k];
        pthread_join(s->th, NULL);
        if (s->rc && rc == 0) {
            rc = pl_errf(err, errlen, "copy to %s: %s", s->dest->name, s->err);
            snprintf(res->failed_peer, sizeof res->failed_peer, "%s", s->dest->name);
        }
    }
    return rc;
}

/* After join_all: a stop from outside is the copy's error, whatever its streams reported
 * (no peer failed); the stop no longer reaches tc. */
static int detach_stop(tcp_copies *tc, int rc, pl_layer_copy_result *res, char *err,
                       size_t errlen)
{
    pl_layer_copy_stop *st = tc->stop;
    pthread_mutex_lock(&st->mu);
    st->tc = NULL;
    if (st->stopped) {
        rc = pl_errf(err, errlen, "layer copies stopped: %s", st->why);
        res->failed_peer[0] = 0;
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Makes dst (job->make_dst) while the senders run, then plans its receivers. */
static int make_dst(tcp_copies *tc, pl_layer_copy_result *res, char *err, size_t errlen)
{
    const pl_layer_copy_job *job = tc->job;
    const double t0 = pl_now_ms();
    if (job->dst && job->make_dst && job->make_dst(job->dst_ctx, err, errlen)) return -1;
    res->make_ms = pl_now_ms() - t0;
    if (!job->dst) return 0;
    /* each tensor once per part (pl_layer_copy_check_parts: no part twice), a part at
     * most halved (split_large: only to PL_PROTO_MAX_PARTS) */
    if (!(tc->wants = calloc((size_t)job->dst->ntensors * PL_PROTO_MAX_PARTS + 1,
                             sizeof *tc->wants)))
        return pl_errf(err, errlen, "out of memory");
    plan_receivers(tc);
    const size_t used = job->reserve ? pl_reserve_used(job->reserve) : 0;
    const int present = pl_layer_copy_take_reserve(job) == 0;
    res->reserved = job->reserve ? (int64_t)(pl_reserve_used(job->reserve) - used) : 0;
    for (int i = 0; i < tc->nrecv; i++) tc->rcv[i].present = present;
    return 0;
}

/* Fills what no copy brings (job->fill_dst) while the receivers run. */
static int fill_dst(const pl_layer_copy_job *job, pl_layer_copy_result *res, char *err,
                    size_t errlen)
{
    const double t0 = pl_now_ms();
    if (job->dst && job->fill_dst && job->fill_dst(job->dst_ctx, err, errlen)) return -1;
    res->fill_ms = pl_now_ms() - t0;
    return 0;
}

static int copy_tcp(const pl_layer_copier *self, const pl_layer_copy_job *job,
                    pl_layer_copy_result *res, char *err, size_t errlen)
{
    const pl_msg_plan *p = job->plan;
    if (p->nsends > 0 && !job->src)
        return pl_errf(err, errlen, "plan asks for %d layer sends but this worker holds none",
                       p->nsends);
    if (!job->dst && p->ncopies > 0)
        return pl_errf(err, errlen, "plan gives an idle worker %d layers to receive", p->ncopies);
    if (pl_layer_copy_check_parts(p, err, errlen)) return -1;
    const pl_layer_copy_tcp *t = self->ctx;
    pl_layer_copy_stop own; /* the copy's own failure shuts its streams without one */
    stop_init(&own);
    tcp_copies tc = {.t = t, .job = job, .stop = t->stop ? t->stop : &own,
                     .maxsend = STREAMS * p->nsends, .maxrecv = STREAMS * p->ncopies};
    tc.snd = calloc((size_t)tc.maxsend + 1, sizeof *tc.snd);
    tc.rcv = calloc((size_t)tc.maxrecv + 1, sizeof *tc.rcv);
    int rc = -1;
    if (!tc.snd || !tc.rcv) {
        pl_errf(err, errlen, "out of memory");
    } else if (start_senders(&tc, err, errlen) == 0 && make_dst(&tc, res, err, errlen) == 0) {
        stop_attach(&tc);
        rc = accept_sources(&tc, err, errlen);
        if (rc == 0) rc = fill_dst(job, res, err, errlen);
    }
    if (rc) stop_streams(&tc);
    rc = detach_stop(&tc, join_all(&tc, rc, res, err, errlen), res, err, errlen);
    pthread_mutex_destroy(&own.mu);
    free(tc.snd);
    free(tc.rcv);
    free(tc.wants);
    return rc;
}

pl_layer_copier pl_layer_copier_tcp(pl_layer_copy_tcp *t)
{
    return (pl_layer_copier){.copy = copy_tcp, .ctx = t};
}
