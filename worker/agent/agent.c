#include "agent.h"

#include <stdarg.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "allreduce.h"
#include "checkpoint.h"
#include "checkpoint_writer.h"
#include "control_client.h"
#include "engine.h"
#include "jobspec.h"
#include "layer_copy.h"
#include "nccl_plan.h"
#include "protocol.h"
#include "sampler.h"
#include "schedule.h"
#include "stage_link.h"
#include "syncgroups.h"
#include "tcp.h"
#include "tokens.h"
#include "trainer.h"
#include "util.h"
#include "worker_step.h"

#define LINK_RANK_OFFSET 4096
#define PEER_TIMEOUT_MS 60000
/* Layer copies (docs/runtime.md "Recovery"): a source dials each destination with
 * this handshake rank; the destination asks for tensors (COPY_REQ: pairs of int32
 * layer, index), the source streams params, m and v of each, the destination
 * answers COPY_ACK. */
#define COPY_RANK 8192
#define COPY_TIMEOUT_MS 180000
#define COPY_FRAME_REQ (PL_FRAME_USER + 64)
#define COPY_FRAME_ACK (PL_FRAME_USER + 65)
#define MAX_STASH 64

typedef struct qitem {
    char *text; /* NULL: quit */
    struct qitem *next;
} qitem;

typedef struct {
    const pl_agent_options *o;
    pl_job job;
    int have_job;
    pl_gpt_config cfg;
    pl_tokens train;
    int have_train;
    pl_sampler smp;
    pl_ctl_client *cli;   /* replaced on reconnection under cli_mu (posts come from any thread) */
    pthread_mutex_t cli_mu;
    pl_ctl_client_config cc;
    atomic_int disconnected; /* the control connection closed: reconnect (a new coordinator) */
    double lost_since;       /* control thread: when the connection was lost; -1: connected */
    int reconnects;
    pl_checkpoint_writer *ckw;  /* checkpoints of this worker's layers, in the background */
    /* fault injection (tests): PLIANT_FAULT_<name> = sync:STEP or copy:GEN */
    enum { FAULT_NONE, FAULT_SYNC, FAULT_COPY } fault;
    pl_proto_name broken; /* the peer whose link or copy failed the plan being installed */
    int64_t fault_at;
    int fault_groups;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    qitem *head, *tail;
    atomic_int done;      /* the control loop ends */
    atomic_int exit_code;
    atomic_llong newest_plan; /* the newest plan generation received (control thread) */

    /* compute thread state */
    kn_ctx *k;
    pl_engine e;
    int have_engine;
    pl_engine src;   /* the engine of the last plan before this one: copy source until */
    int have_src;    /* the next start_step (the coordinator's stable plan) */
    pl_conn *stash[MAX_STASH]; /* peer connections accepted during the copy phase */
    int nstash;
    pl_schedule sched;
    int have_sched;
    pl_listener *lst;
    int nranks;
    pl_conn **conns;
    pl_tcp_link *link;
    pl_nccl_plan *ncp;    /* under mu: the NCCL world of a plan whose transport is nccl */
    char nccl_id[PL_PROTO_NCCL_ID_HEX + 1]; /* under mu: the id of nccl_init for nccl_gen */
    int64_t nccl_gen;
    pl_syncgroups g;
    int have_groups;
    int64_t gen;
    /* under mu: the step running (its links may be interrupted from the control
     * thread) and the newest step the coordinator aborted */
    int stepping;
    int64_t aborted_gen, aborted_step;
    /* under mu: what hello_resume tells a new coordinator */
    int64_t last_committed, reduced_step;
    double last_scale, last_lr;
    int rank, pipe, stage, nstages;
    int first_mb, nmb, global_micro;
    int32_t *tok, *tgt;
    size_t tokcap;
} agent;

static void logf_(agent *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(agent *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "worker %s: ", a->o->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void push(agent *a, char *text)
{
    qitem *q = calloc(1, sizeof *q);
    if (!q) abort();
    q->text = text;
    pthread_mutex_lock(&a->mu);
    if (a->tail)
        a->tail->next = q;
    else
        a->head = q;
    a->tail = q;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static qitem *pop(agent *a)
{
    pthread_mutex_lock(&a->mu);
    while (!a->head) pthread_cond_wait(&a->cv, &a->mu);
    qitem *q = a->head;
    a->head = q->next;
    if (!a->head) a->tail = NULL;
    pthread_mutex_unlock(&a->mu);
    return q;
}

static void fail(agent *a, const char *what, const char *err)
{
    logf_(a, "%s: %s", what, err);
    atomic_store(&a->exit_code, 1);
    atomic_store(&a->done, 1);
}

static void teardown_links(agent *a)
{
    pthread_mutex_lock(&a->mu);
    pl_tcp_link *link = a->link;
    pl_nccl_plan *ncp = a->ncp;
    a->link = NULL;
    a->ncp = NULL;
    pthread_mutex_unlock(&a->mu);
    pl_tcp_link_destroy(link);
    pl_nccl_plan_close(ncp);
    if (a->conns) {
        for (int r = 0; r < a->nranks; r++)
            if (a->conns[r]) pl_conn_close(a->conns[r]);
        free(a->conns);
        a->conns = NULL;
    }
    if (a->have_groups) {
        pl_syncgroups_free(&a->g);
        a->have_groups = 0;
    }
    if (a->have_sched) {
        pl_schedule_free(&a->sched);
        a->have_sched = 0;
    }
}

/* A peer's address from the plan's peers (what it registered); -1 if absent. */
static int peer_port(const pl_msg_plan *p, const char *name, char *host, size_t hostlen)
{
    for (int i = 0; i < p->npeers; i++)
        if (!strcmp(p->peers[i].name, name)) {
            snprintf(host, hostlen, "%s", p->peers[i].host);
            return p->peers[i].port;
        }
    return -1;
}

static int post(agent *a, pl_msg *m)
{
    pthread_mutex_lock(&a->cli_mu);
    int rc = a->cli ? pl_ctl_client_post(a->cli, m) : -1; /* lost while disconnected */
    pthread_mutex_unlock(&a->cli_mu);
    pl_msg_free(m);
    return rc;
}

/* ---- layer copies ---- */

typedef struct {
    int32_t layer, index;
} tref;

static void stash_clear(agent *a)
{
    for (int i = 0; i < a->nstash; i++) pl_conn_close(a->stash[i]);
    a->nstash = 0;
}

/* A newer plan is waiting: the one being installed can be given up. */
static int superseded(agent *a)
{
    return atomic_load(&a->newest_plan) > a->gen || atomic_load(&a->done);
}

#define SUPERSEDED_MSG "superseded by a newer plan"

/* Accepts one authenticated peer connection before the deadline; handshakes that fail
 * (a stale generation, a stranger) are logged and skipped. Gives up when a newer plan
 * arrives. */
static int accept_conn(agent *a, const pl_comm_ident *id, double deadline, pl_conn **out,
                       char *err, size_t errlen)
{
    for (;;) {
        if (superseded(a)) return pl_errf(err, errlen, SUPERSEDED_MSG);
        int left = (int)(deadline - pl_now_ms());
        if (left <= 0) return pl_errf(err, errlen, "timed out waiting for peers");
        if (left > 250) left = 250;
        char e2[512] = "";
        int rc = pl_listener_accept(a->lst, id, left, out, e2, sizeof e2);
        if (rc == 0) {
            /* a dialer that gave up waiting for this handshake (dial_peer's slices) has
             * closed its end already: drop the connection, it dials again */
            struct pollfd pf = {.fd = pl_conn_fd(*out), .events = POLLIN | POLLRDHUP};
            if (poll(&pf, 1, 0) == 1 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
                pl_conn_close(*out);
                *out = NULL;
                continue;
            }
            return 0;
        }
        if (rc == PL_COMM_ESYS || rc == PL_COMM_EINVAL) return pl_errf(err, errlen, "%s", e2);
        if (rc != PL_COMM_ETIMEOUT) logf_(a, "refused a peer connection: %s", e2);
    }
}

/* Dials a peer until timeout_ms has passed, in slices: a peer that is not ready (busy,
 * at an older plan generation, a handshake that closed) is tried again; a newer plan
 * ends the wait. */
static int dial_peer(agent *a, const char *host, int port, const pl_comm_ident *id,
                     int32_t expect_rank, int timeout_ms, pl_conn **out, char *err, size_t errlen)
{
    double deadline = pl_now_ms() + timeout_ms;
    for (;;) {
        if (superseded(a)) return pl_errf(err, errlen, SUPERSEDED_MSG);
        int left = (int)(deadline - pl_now_ms());
        if (left <= 0) return -1; /* err says why */
        int rc = pl_conn_connect(host, port, id, expect_rank, left < 500 ? left : 500, out,
                                 err, errlen);
        if (rc == 0) {
            if (errlen) err[0] = 0; /* forget the failed tries */
            return 0;
        }
        if (rc != PL_COMM_ETIMEOUT && rc != PL_COMM_ECLOSED && rc != PL_COMM_ESTALE) return -1;
        if (rc != PL_COMM_ETIMEOUT) usleep(20000);
    }
}

typedef struct {
    agent *a;
    const pl_engine *src;
    char host[PL_PROTO_HOST_MAX + 1];
    int port;
    pl_comm_ident id;
    const char *dest;
    int64_t bytes;
    int rc;
    char err[512];
    pthread_t th;
} copy_sender;

/* The recovery tests' faults: this worker SIGKILLs itself in the middle of an
 * operation (between two all-reduces of a step, or after the first tensor of a
 * layer copy), as a preempted node would die. */
static void fault_die(agent *a, const char *where)
{
    logf_(a, "PLIANT_FAULT: SIGKILL during %s", where);
    raise(SIGKILL);
}

static void fault_before_reduce(void *ctx, int key)
{
    agent *a = ctx;
    (void)key;
    if (++a->fault_groups == 2) fault_die(a, "the gradient all-reduce");
}

static int parse_fault(agent *a, char *err, size_t errlen)
{
    char var[PL_PROTO_NAME_MAX + 16];
    snprintf(var, sizeof var, "PLIANT_FAULT_%s", a->o->name);
    const char *v = getenv(var);
    if (!v) return 0;
    char *end = NULL;
    if (!strncmp(v, "sync:", 5)) a->fault = FAULT_SYNC;
    else if (!strncmp(v, "copy:", 5)) a->fault = FAULT_COPY;
    if (a->fault != FAULT_NONE) a->fault_at = strtoll(v + 5, &end, 10);
    if (a->fault == FAULT_NONE || !end || end == v + 5 || *end || a->fault_at < 0)
        return pl_errf(err, errlen, "%s: expected sync:STEP or copy:GENERATION, got '%s'", var, v);
    return 0;
}

/* Layer copies move host memory: off the CPU backend each tensor passes through a
 * page-locked staging buffer, grown to the largest tensor. */
typedef struct {
    int on;
    float *buf;
    size_t cap; /* floats */
} host_stage;

static int host_staged(kn_ctx *k)
{
    return strcmp(kn_backend(k), "cpu") != 0;
}

static float *stage_room(kn_ctx *k, host_stage *st, size_t n)
{
    if (n <= st->cap) return st->buf;
    kn_host_free(k, st->buf);
    st->cap = 0;
    if (!(st->buf = kn_host_alloc(k, n * sizeof(float)))) return NULL;
    st->cap = n;
    return st->buf;
}

/* x (n floats of backend memory) copied to the staging buffer; NULL when out of memory. */
static const float *stage_out(kn_ctx *k, host_stage *st, const float *x, size_t n)
{
    float *h = stage_room(k, st, n);
    if (h) kn_to_host(k, h, x, n * sizeof(float));
    return h;
}

static void *sender_main(void *arg)
{
    copy_sender *s = arg;
    pl_conn *c = NULL;
    void *req = NULL;
    host_stage stage = {.on = host_staged(s->src->k)};
    s->rc = -1;
    if (dial_peer(s->a, s->host, s->port, &s->id, -1, COPY_TIMEOUT_MS, &c, s->err,
                  sizeof s->err))
        return NULL;
    pl_frame_hdr h;
    if (pl_conn_recv_frame_alloc(c, &h, &req, COPY_TIMEOUT_MS, s->err, sizeof s->err))
        goto out;
    if (h.type != COPY_FRAME_REQ || h.len % sizeof(tref)) {
        pl_errf(s->err, sizeof s->err, "bad copy request from %s", s->dest);
        goto out;
    }
    size_t n = (size_t)(h.len / sizeof(tref));
    const tref *r = req;
    for (size_t k = 0; k < n; k++) {
        const pl_engine_tensor *t = pl_engine_find(s->src, r[k].layer, r[k].index);
        if (!t) {
            pl_errf(s->err, sizeof s->err, "%s asks for tensor (%d, %d), not held here",
                    s->dest, r[k].layer, r[k].index);
            goto out;
        }
        const float *arr[3] = {s->src->params, s->src->m, s->src->v};
        for (int j = 0; j < 3; j++) {
            const float *x = arr[j] + t->offset;
            if (stage.on && !(x = stage_out(s->src->k, &stage, x, t->spec.numel))) {
                pl_errf(s->err, sizeof s->err, "out of memory staging a layer for %s", s->dest);
                goto out;
            }
            if (pl_conn_send_floats(c, (uint32_t)(3 * k + (size_t)j), x, t->spec.numel,
                                    PEER_TIMEOUT_MS, s->err, sizeof s->err))
                goto out;
        }
        s->bytes += 3 * (int64_t)t->spec.numel * (int64_t)sizeof(float);
        if (s->a->fault == FAULT_COPY && s->a->gen == s->a->fault_at)
            fault_die(s->a, "a layer copy");
    }
    free(req);
    req = NULL;
    if (pl_conn_recv_frame_alloc(c, &h, &req, COPY_TIMEOUT_MS, s->err, sizeof s->err)) goto out;
    if (h.type != COPY_FRAME_ACK) {
        pl_errf(s->err, sizeof s->err, "no copy acknowledgement from %s", s->dest);
        goto out;
    }
    s->rc = 0;
out:
    free(req);
    kn_host_free(s->src->k, stage.buf);
    pl_conn_close(c);
    return NULL;
}

typedef struct {
    const char *source;
    pl_conn *c;
    pl_engine *ne;
    tref *want;
    int nwant;
    int64_t bytes;
    int rc, started;
    char err[512];
    pthread_t th;
} copy_receiver;

static void *receiver_main(void *arg)
{
    copy_receiver *r = arg;
    r->rc = -1;
    if (pl_conn_send_frame(r->c, COPY_FRAME_REQ, 0, 0, r->want,
                           (size_t)r->nwant * sizeof(tref), PEER_TIMEOUT_MS, r->err,
                           sizeof r->err))
        return NULL;
    host_stage stage = {.on = host_staged(r->ne->k)};
    for (int k = 0; k < r->nwant; k++) {
        const pl_engine_tensor *t = pl_engine_find(r->ne, r->want[k].layer, r->want[k].index);
        float *arr[3] = {r->ne->params, r->ne->m, r->ne->v};
        for (int j = 0; j < 3; j++) {
            float *dst = arr[j] + t->offset;
            float *x = stage.on ? stage_room(r->ne->k, &stage, t->spec.numel) : dst;
            if (!x) {
                pl_errf(r->err, sizeof r->err, "out of memory staging a layer from %s", r->source);
                goto out;
            }
            if (pl_conn_recv_floats(r->c, (uint32_t)(3 * k + j), x, t->spec.numel,
                                    PEER_TIMEOUT_MS, r->err, sizeof r->err))
                goto out;
            if (stage.on) kn_to_device(r->ne->k, dst, x, t->spec.numel * sizeof(float));
        }
        r->bytes += 3 * (int64_t)t->spec.numel * (int64_t)sizeof(float);
    }
    if (pl_conn_send_frame(r->c, COPY_FRAME_ACK, 0, 0, NULL, 0, PEER_TIMEOUT_MS, r->err,
                           sizeof r->err))
        goto out;
    r->rc = 0;
out:
    kn_host_free(r->ne->k, stage.buf);
    return NULL;
}

/* The copy source of a layer in the plan, or NULL. */
static const char *copy_source(const pl_msg_plan *p, int layer)
{
    for (int i = 0; i < p->ncopies; i++)
        if (p->copies[i].layer == layer) return p->copies[i].source;
    return NULL;
}

/* A copy that goes over the plan's NCCL world rather than TCP (layer_copy.h). */
static int xport_copy(const pl_msg_plan *p, const char *source, const char *dest)
{
    return pl_layer_copy_xport_possible(p) && pl_layer_copy_xport_pair(p, source, dest);
}

/* Installs the engine of the plan: for a pipeline worker layers [b, e) with nslots (in_pipe),
 * serving the plan's sends from the previous engine, copying what it holds (a layer not in
 * the plan's copies) and receiving the plan's copies (params, AdamW m and v of every tensor;
 * a head-only range's wte comes with the head). *bytes_in: bytes received. */
static int change_engine(agent *a, const pl_msg_plan *p, const pl_comm_ident *id, int in_pipe,
                         int b, int e, int nslots, int64_t *bytes_in, char *err, size_t errlen)
{
    *bytes_in = 0;
    /* the engine of the last plan becomes the source; one of a plan that never started
     * a step is dropped (the source stays the one of the plan before) */
    if (a->have_engine) {
        if (!a->have_src) {
            a->src = a->e;
            a->have_src = 1;
        } else {
            pl_engine_destroy(&a->e);
        }
        a->have_engine = 0;
        memset(&a->e, 0, sizeof a->e);
    }
    /* unchanged: keep the engine */
    if (in_pipe && p->nsends == 0 && p->ncopies == 0 && a->have_src && a->src.begin == b &&
        a->src.end == e && a->src.nslots == nslots) {
        a->e = a->src;
        a->have_engine = 1;
        a->have_src = 0;
        memset(&a->src, 0, sizeof a->src);
        return 0;
    }
    if (p->nsends > 0 && !a->have_src)
        return pl_errf(err, errlen, "plan asks for %d layer sends but this worker holds none",
                       p->nsends);
    int rc = -1, nsend = 0, nrecv = 0, have_ne = 0;
    pl_engine ne;
    memset(&ne, 0, sizeof ne);
    copy_sender *snd = calloc((size_t)(p->nsends + 1), sizeof *snd);
    copy_receiver *rcv = calloc((size_t)(p->ncopies + 1), sizeof *rcv);
    char *filled = NULL;
    tref *wants = NULL;
    if (!snd || !rcv) {
        pl_errf(err, errlen, "out of memory");
        goto out;
    }
    /* senders: one thread per destination (copies between ranks of an NCCL plan go over
     * NCCL later, install_plan) */
    for (int i = 0; i < p->nsends; i++) {
        if (xport_copy(p, a->o->name, p->sends[i].dest)) continue;
        int seen = 0;
        for (int j = 0; j < nsend && !seen; j++) seen = !strcmp(snd[j].dest, p->sends[i].dest);
        if (seen) continue;
        copy_sender *s = &snd[nsend];
        s->a = a;
        s->src = &a->src;
        s->dest = p->sends[i].dest;
        s->id = *id;
        s->id.rank = COPY_RANK;
        s->port = peer_port(p, s->dest, s->host, sizeof s->host);
        if (s->port <= 0) {
            pl_errf(err, errlen, "no address for copy destination %s", s->dest);
            goto out;
        }
        if (pthread_create(&s->th, NULL, sender_main, s)) {
            pl_errf(err, errlen, "cannot start a copy thread");
            goto out;
        }
        nsend++;
    }
    if (in_pipe) {
        if (pl_engine_create(&ne, a->k, &a->cfg, b, e, a->job.batch.micro,
                             a->job.batch.seq_len, nslots, err, errlen))
            goto out;
        have_ne = 1;
        filled = calloc((size_t)ne.ntensors + 1, 1);
        wants = calloc((size_t)ne.ntensors + 1, sizeof *wants);
        if (!filled || !wants) {
            pl_errf(err, errlen, "out of memory");
            goto out;
        }
        int L1 = a->cfg.L + 1, nwant = 0;
        for (int j = 0; j < ne.ntensors; j++) {
            const pl_engine_tensor *t = &ne.tensors[j];
            int layer = j == ne.wte_tensor && !pl_engine_has_embedding(&ne) ? L1 : t->layer;
            const char *from = copy_source(p, layer);
            if (from) continue;
            const pl_engine_tensor *st = a->have_src ? pl_engine_find(&a->src, t->layer, t->index)
                                                     : NULL;
            if (!st) continue;
            size_t nb = t->spec.numel * sizeof(float);
            kn_copy(a->k, ne.params + t->offset, a->src.params + st->offset, nb);
            kn_copy(a->k, ne.m + t->offset, a->src.m + st->offset, nb);
            kn_copy(a->k, ne.v + t->offset, a->src.v + st->offset, nb);
            filled[j] = 1;
        }
        /* receivers: one per distinct source, asking for its tensors */
        for (int i = 0; i < p->ncopies; i++) {
            int seen = 0;
            for (int k = 0; k < nrecv && !seen; k++)
                seen = !strcmp(rcv[k].source, p->copies[i].source);
            if (seen) continue;
            if (xport_copy(p, p->copies[i].source, a->o->name)) { /* arrives over NCCL */
                for (int j = 0; j < ne.ntensors; j++) {
                    int layer = j == ne.wte_tensor && !pl_engine_has_embedding(&ne)
                                    ? L1 : ne.tensors[j].layer;
                    const char *from = copy_source(p, layer);
                    if (from && !strcmp(from, p->copies[i].source)) filled[j] = 1;
                }
                continue;
            }
            copy_receiver *r = &rcv[nrecv++];
            r->source = p->copies[i].source;
            r->ne = &ne;
            r->want = wants + nwant;
            for (int j = 0; j < ne.ntensors; j++) {
                const pl_engine_tensor *t = &ne.tensors[j];
                int layer = j == ne.wte_tensor && !pl_engine_has_embedding(&ne) ? L1 : t->layer;
                const char *from = copy_source(p, layer);
                if (filled[j] || !from || strcmp(from, r->source)) continue;
                wants[nwant++] = (tref){t->layer, t->index};
                filled[j] = 1;
            }
            r->nwant = (int)(wants + nwant - r->want);
        }
        int missing = 0;
        for (int j = 0; j < ne.ntensors; j++) missing += !filled[j];
        if (missing && !(missing == ne.ntensors && !a->have_src && p->ncopies == 0)) {
            pl_errf(err, errlen, "layers [%d, %d): %d tensors have neither a local copy nor a "
                    "source", b, e, missing);
            goto out;
        }
        if (missing && pl_engine_init_from_job(&ne, &a->job, err, errlen)) goto out;
    } else if (p->ncopies > 0) {
        pl_errf(err, errlen, "plan gives an idle worker %d layers to receive", p->ncopies);
        goto out;
    }
    /* accept the sources' connections; stage and all-reduce peers that come early wait in
     * the stash for install_plan */
    double deadline = pl_now_ms() + COPY_TIMEOUT_MS;
    for (int got = 0; got < nrecv;) {
        pl_conn *c = NULL;
        if (accept_conn(a, id, deadline, &c, err, errlen)) goto out;
        int pr = pl_conn_peer_rank(c);
        copy_receiver *r = NULL;
        for (int k = 0; k < nrecv && pr == COPY_RANK; k++)
            if (!rcv[k].c && !strcmp(rcv[k].source, pl_conn_peer_name(c))) r = &rcv[k];
        if (r) {
            r->c = c;
            if (pthread_create(&r->th, NULL, receiver_main, r)) {
                pl_errf(err, errlen, "cannot start a copy thread");
                goto out;
            }
            r->started = 1;
            got++;
        } else if (pr >= 0 && pr < COPY_RANK && a->nstash < MAX_STASH) {
            a->stash[a->nstash++] = c;
        } else {
            pl_conn_close(c);
        }
    }
    rc = 0;
out:
    for (int k = 0; k < nrecv; k++) {
        if (rcv[k].started) {
            pthread_join(rcv[k].th, NULL);
            if (rcv[k].rc && rc == 0) {
                rc = pl_errf(err, errlen, "copy from %s: %s", rcv[k].source, rcv[k].err);
                snprintf(a->broken, sizeof a->broken, "%s", rcv[k].source);
            }
            *bytes_in += rcv[k].bytes;
        }
        if (rcv[k].c) pl_conn_close(rcv[k].c);
    }
    for (int k = 0; k < nsend; k++) {
        pthread_join(snd[k].th, NULL);
        if (snd[k].rc && rc == 0) {
            rc = pl_errf(err, errlen, "copy to %s: %s", snd[k].dest, snd[k].err);
            snprintf(a->broken, sizeof a->broken, "%s", snd[k].dest);
        }
    }
    if (rc == 0 && have_ne) {
        a->e = ne;
        a->have_engine = 1;
    } else if (have_ne) {
        pl_engine_destroy(&ne);
    }
    free(snd);
    free(rcv);
    free(filled);
    free(wants);
    return rc;
}

/* A plan that restarts from a checkpoint: the engine (initialised from the job
 * by change_engine, which is the state of step 0) loads the checkpoint's layers. */
static int load_checkpoint(agent *a, const pl_msg_plan *p, char *err, size_t errlen)
{
    if (!p->has_checkpoint || p->checkpoint_step == 0) return 0;
    char dir[PL_PROTO_PATH_MAX + 32];
    if (pl_pathf(dir, sizeof dir, err, errlen, "%s/step-%08lld", p->checkpoint_dir,
                 (long long)p->checkpoint_step))
        return -1;
    double t0 = pl_now_ms();
    if (pl_checkpoint_load(&a->e, dir, 1, err, errlen)) return -1;
    logf_(a, "generation %lld: layers [%d, %d) loaded from %s in %.1f ms", (long long)a->gen,
          a->e.begin, a->e.end, dir, pl_now_ms() - t0);
    return 0;
}

/* The writer thread finished this worker's part of a checkpoint. */
static void on_saved(void *user, int64_t step, int begin, int end, int rc, int64_t bytes,
                     const char *err)
{
    agent *a = user;
    if (rc) { /* the checkpoint stays incomplete; training goes on */
        logf_(a, "checkpoint of step %lld: %s", (long long)step, err);
        return;
    }
    pl_msg m;
    pl_msg_init(&m, PL_MSG_SAVED, atomic_load(&a->newest_plan));
    m.u.saved.step = step;
    m.u.saved.layer_begin = begin;
    m.u.saved.layer_end = end;
    m.u.saved.bytes = bytes;
    post(a, &m);
}

/* The layer count of a plan (decoding checked that every pipeline has it). */
static int mp_last(const pl_msg_plan *p)
{
    return p->pipelines[0].layers[p->pipelines[0].nnodes];
}

/* A plan on NCCL (docs/nccl.md): rank 0 makes the world's id and sends it (nccl_root);
 * every rank waits for the coordinator's nccl_init of this generation and joins. Then the
 * layer copies between ranks go over it (those from idle sources came over TCP in
 * change_engine), and the steps run on it. */
/* pl_nccl_plan_open's cancel test: polled by the compute thread while NCCL waits for
 * other ranks (the only thread that reads a->gen). */
static int nccl_cancelled(void *ctx) { return superseded((agent *)ctx); }

static int join_nccl(agent *a, int n, char *err, size_t errlen)
{
    char why[256];
    if (!pl_nccl_plan_supported(a->k, why, sizeof why))
        return pl_errf(err, errlen, "the plan's transport is nccl but %s", why);
    if (a->rank == 0) {
        pl_msg m;
        pl_msg_init(&m, PL_MSG_NCCL_ROOT, a->gen);
        if (pl_nccl_plan_make_id(m.u.nccl_root.id, sizeof m.u.nccl_root.id, err, errlen))
            return -1;
        if (post(a, &m)) return pl_errf(err, errlen, "cannot send nccl_root");
    }
    char id[PL_PROTO_NCCL_ID_HEX + 1] = "";
    /* ranks come after their TCP copies from idle sources: as long as those may take */
    const double deadline = pl_now_ms() + COPY_TIMEOUT_MS;
    pthread_mutex_lock(&a->mu);
    while (a->nccl_gen != a->gen && !superseded(a) && pl_now_ms() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&a->cv, &a->mu, &ts);
    }
    if (a->nccl_gen == a->gen) memcpy(id, a->nccl_id, sizeof id);
    pthread_mutex_unlock(&a->mu);
    if (!id[0])
        return pl_errf(err, errlen, "%s", superseded(a) ? SUPERSEDED_MSG
                                                        : "no nccl_init from the coordinator");
    pl_nccl_plan *ncp;
    const double t0 = pl_now_ms();
    /* cancelled by a newer plan (or the exit): the create waits for every rank, and
     * one that died after rank 0's nccl_root never comes */
    if (pl_nccl_plan_open(a->k, id, n, a->rank, &a->g, COPY_TIMEOUT_MS, nccl_cancelled, a, &ncp,
                          err, errlen)) {
        if (superseded(a)) pl_errf(err, errlen, "%s", SUPERSEDED_MSG);
        return -1;
    }
    logf_(a, "generation %lld: joined the NCCL world as rank %d of %d in %.1f ms",
          (long long)a->gen, a->rank, n, pl_now_ms() - t0);
    pthread_mutex_lock(&a->mu);
    a->ncp = ncp;
    /* A newer plan (or the exit) that came while a->ncp was still NULL found nothing
     * to abort: newest_plan / done are set before the control thread takes mu. */
    if (superseded(a)) pl_nccl_plan_abort(ncp, SUPERSEDED_MSG);
    pthread_mutex_unlock(&a->mu);
    return 0;
}

static int install_plan(agent *a, const pl_msg *m, int64_t *bytes_in, char *err, size_t errlen)
{
    const pl_msg_plan *p = &m->u.plan;
    a->broken[0] = 0;
    teardown_links(a);
    stash_clear(a);
    pthread_mutex_lock(&a->mu);
    a->gen = m->gen;
    pthread_mutex_unlock(&a->mu);
    pl_ctl_client_set_gen(a->cli, a->gen);
    a->pipe = p->you_pipeline;
    *bytes_in = 0;
    if (p->has_checkpoint) { /* a restart: the checkpoint replaces whatever is held */
        if (a->have_engine) pl_engine_destroy(&a->e);
        if (a->have_src) pl_engine_destroy(&a->src);
        a->have_engine = a->have_src = 0;
    }
    if (p->you_pipeline < 0) { /* idle: serve the sends only */
        pl_comm_ident iid = {.token = a->o->token, .token_len = strlen(a->o->token),
                             .rank = COPY_RANK, .name = a->o->name,
                             .generation = (uint64_t)a->gen};
        return change_engine(a, p, &iid, 0, 0, 0, 0, bytes_in, err, errlen);
    }
    if (p->micro != a->job.batch.micro || p->seq_len != a->job.batch.seq_len ||
        p->global_batch != a->job.batch.global)
        return pl_errf(err, errlen, "plan batch %lld×%d (micro %d) differs from the job's",
                       (long long)p->global_batch, p->seq_len, p->micro);
    /* flatten: plan ranks, stage layouts */
    int n = 0;
    for (int q = 0; q < p->npipelines; q++) n += p->pipelines[q].nnodes;
    pl_sync_pipeline *pipes = calloc((size_t)p->npipelines, sizeof *pipes);
    pl_sync_stage *stages = calloc((size_t)n, sizeof *stages);
    const char **names = calloc((size_t)n, sizeof *names);
    int rc = -1;
    if (!pipes || !stages || !names) {
        pl_errf(err, errlen, "out of memory");
        goto out;
    }
    a->rank = -1;
    for (int q = 0, r = 0; q < p->npipelines; q++) {
        const pl_msg_pipeline *mp = &p->pipelines[q];
        pipes[q].nstages = mp->nnodes;
        pipes[q].stages = &stages[r];
        for (int j = 0; j < mp->nnodes; j++, r++) {
            names[r] = mp->nodes[j];
            stages[r].rank = r;
            stages[r].layer_begin = mp->layers[j];
            stages[r].layer_end = mp->layers[j + 1];
            if (!strcmp(mp->nodes[j], a->o->name)) {
                a->rank = r;
                a->stage = j;
                a->nstages = mp->nnodes;
                a->first_mb = (int)mp->first_microbatch;
                a->nmb = (int)mp->microbatches;
            }
        }
    }
    if (a->rank < 0) {
        pl_errf(err, errlen, "plan has a place for this worker but does not name it");
        goto out;
    }
    if (mp_last(p) != a->cfg.L + 2) {
        pl_errf(err, errlen, "plan covers %d layers, the model has %d", mp_last(p), a->cfg.L + 2);
        goto out;
    }
    if (pl_syncgroups_compute(pipes, p->npipelines, a->cfg.L, &a->g, err, errlen)) goto out;
    a->have_groups = 1;
    if (pl_schedule_1f1b(a->nstages, a->stage, a->nmb, &a->sched, err, errlen)) goto out;
    a->have_sched = 1;
    pl_comm_ident id = {.token = a->o->token, .token_len = strlen(a->o->token),
                        .rank = a->rank, .name = a->o->name, .generation = (uint64_t)a->gen};
    double tc = pl_now_ms();
    int ob = a->have_src ? a->src.begin : a->have_engine ? a->e.begin : 0;
    int oe = a->have_src ? a->src.end : a->have_engine ? a->e.end : 0;
    if (change_engine(a, p, &id, 1, p->you_layer_begin, p->you_layer_end, a->sched.nslots,
                      bytes_in, err, errlen) ||
        load_checkpoint(a, p, err, errlen))
        goto out;
    if (p->ncopies || p->nsends)
        logf_(a, "generation %lld: layers [%d, %d) -> [%d, %d), received %d layers (%lld bytes), "
              "sent %d, in %.1f ms", (long long)a->gen, ob, oe, p->you_layer_begin,
              p->you_layer_end, p->ncopies, (long long)*bytes_in, p->nsends, pl_now_ms() - tc);
    a->global_micro = (int)(p->global_batch / p->micro);
    size_t need = (size_t)p->global_batch * (size_t)p->seq_len;
    if (need > a->tokcap) {
        free(a->tok);
        free(a->tgt);
        a->tok = calloc(need, sizeof *a->tok);
        a->tgt = calloc(need, sizeof *a->tgt);
        a->tokcap = need;
        if (!a->tok || !a->tgt) {
            a->tokcap = 0;
            pl_errf(err, errlen, "out of memory");
            goto out;
        }
    }
    a->nranks = n;
    if (p->transport == PL_TRANSPORT_NCCL) {
        int64_t got = 0;
        rc = join_nccl(a, n, err, errlen);
        if (rc == 0 && pl_layer_copy_xport_possible(p))
            rc = pl_layer_copy_xport(pl_nccl_plan_xport(a->ncp), p, &a->cfg,
                                     a->have_src ? &a->src : NULL, &a->e, &got, err, errlen);
        *bytes_in += got;
        goto out;
    }
    /* which ranks share a sync group with this one */
    a->conns = calloc((size_t)n, sizeof *a->conns);
    char *need_rank = calloc((size_t)n, 1);
    if (!a->conns || !need_rank) {
        free(need_rank);
        pl_errf(err, errlen, "out of memory");
        goto out;
    }
    /* a ring all-reduce talks to the rank's two neighbours in each group's order only:
     * O(n) connections, not a full mesh (what a reconfiguration must set up again) */
    const pl_sync_rank *sr = pl_syncgroups_rank(&a->g, a->rank);
    for (int i = 0; sr && i < sr->ngroups; i++) {
        const pl_sync_group *grp = pl_syncgroups_group(&a->g, sr->keys[i]);
        for (int j = 0; grp && j < grp->nranks; j++)
            if (grp->ranks[j] == a->rank) {
                need_rank[grp->ranks[(j + 1) % grp->nranks]] = 1;
                need_rank[grp->ranks[(j + grp->nranks - 1) % grp->nranks]] = 1;
            }
    }
    need_rank[a->rank] = 0;
    pl_conn *prev = NULL, *next = NULL;
    int expect = 0;
    char host[PL_PROTO_HOST_MAX + 1];
    /* dial the lower ranks, then accept the higher ones */
    for (int r = 0; r < n && rc; r++) {
        int want_link = a->stage > 0 && r == a->rank - 1;
        if (r > a->rank) {
            expect += need_rank[r] + (a->stage + 1 < a->nstages && r == a->rank + 1);
            continue;
        }
        if (!need_rank[r] && !want_link) continue;
        int port = peer_port(p, names[r], host, sizeof host);
        if (port <= 0) {
            pl_errf(err, errlen, "no address for peer %s", names[r]);
            break;
        }
        snprintf(a->broken, sizeof a->broken, "%s", names[r]); /* kept if the dial fails */
        if (need_rank[r] &&
            dial_peer(a, host, port, &id, r, PEER_TIMEOUT_MS, &a->conns[r], err, errlen))
            break;
        if (want_link) {
            pl_comm_ident lid = id;
            lid.rank = a->rank + LINK_RANK_OFFSET;
            if (dial_peer(a, host, port, &lid, r, PEER_TIMEOUT_MS, &prev, err, errlen)) break;
        }
        a->broken[0] = 0;
    }
    int ok = !err[0];
    double t0 = pl_now_ms();
    while (ok && expect > 0) {
        pl_conn *c = NULL;
        if (a->nstash > 0) {
            c = a->stash[--a->nstash];
        } else if (accept_conn(a, &id, t0 + PEER_TIMEOUT_MS, &c, err, errlen)) {
            ok = 0;
            break;
        }
        int pr = pl_conn_peer_rank(c);
        if (pr == a->rank + 1 + LINK_RANK_OFFSET && a->stage + 1 < a->nstages && !next) {
            next = c;
            expect--;
        } else if (pr >= 0 && pr < n && pr > a->rank && need_rank[pr] && !a->conns[pr]) {
            a->conns[pr] = c;
            expect--;
        } else {
            pl_conn_close(c); /* a stranger */
        }
    }
    free(need_rank);
    if (!ok) {
        if (prev) pl_conn_close(prev);
        if (next) pl_conn_close(next);
        goto out;
    }
    int fp, fn;
    pl_tcp_link_pending_limits(&a->sched, &fp, &fn);
    pl_tcp_link_config lc = {.stage = a->stage, .prev = prev, .next = next,
                             .timeout_ms = PEER_TIMEOUT_MS, .max_pending_prev = fp > 0 ? fp : 1,
                             .max_pending_next = fn > 0 ? fn : 1};
    pl_tcp_link *link;
    if (pl_tcp_link_create(&lc, &link, err, errlen)) goto out;
    pthread_mutex_lock(&a->mu);
    a->link = link;
    pthread_mutex_unlock(&a->mu);
    rc = 0;
out:
    free(pipes);
    free(stages);
    free(names);
    return rc;
}

/* Control thread, on `abort`: a step blocked on a dead peer's links fails now
 * instead of at its timeout; one not started yet is skipped. */
static void abort_step(agent *a, int64_t gen, int64_t step)
{
    pthread_mutex_lock(&a->mu);
    a->aborted_gen = gen;
    a->aborted_step = step;
    if (a->reduced_step == step) a->reduced_step = -1;
    if (a->stepping && gen == a->gen) {
        if (a->link) pl_tcp_link_abort(a->link, "step aborted by the coordinator");
        pl_nccl_plan_abort(a->ncp, "step aborted by the coordinator");
        for (int r = 0; a->conns && r < a->nranks; r++) pl_conn_shutdown(a->conns[r]);
    }
    pthread_mutex_unlock(&a->mu);
}

/* Marks the step running; 0 when the coordinator aborted it already. */
static int step_begin(agent *a, int64_t s)
{
    pthread_mutex_lock(&a->mu);
    int go = !(a->aborted_gen == a->gen && a->aborted_step == s);
    a->stepping = go;
    pthread_mutex_unlock(&a->mu);
    return go;
}

static void step_end(agent *a)
{
    pthread_mutex_lock(&a->mu);
    a->stepping = 0;
    pthread_mutex_unlock(&a->mu);
}

static int run_step(agent *a, int64_t s, char *err, size_t errlen)
{
    const int B = a->job.batch.micro, T = a->job.batch.seq_len;
    double t0 = pl_now_ms();
    size_t off = (size_t)a->first_mb * (size_t)B * (size_t)T;
    if (pl_sampler_fill(&a->smp, &a->train, s, a->first_mb * B, a->nmb * B, a->tok + off,
                        a->tgt + off))
        return pl_errf(err, errlen, "sampling step %lld failed", (long long)s);
    pl_stage_link link = {0};
    if (a->link) link = pl_tcp_link_stage(a->link);
    pl_peer_table peers = {a->rank, a->nranks, a->conns};
    pl_worker_step_args args = {.engine = &a->e, .schedule = &a->sched, .link = &link,
                                .tokens = a->tok, .targets = a->tgt, .first_micro = a->first_mb,
                                .global_micro = a->global_micro, .groups = &a->g,
                                .peers = &peers, .step = (uint32_t)s,
                                .timeout_ms = PEER_TIMEOUT_MS,
                                .xport = a->ncp ? pl_nccl_plan_xport(a->ncp) : NULL};
    if (a->fault == FAULT_SYNC && s == a->fault_at) {
        args.before_reduce = fault_before_reduce;
        args.hook_ctx = a;
    }
    pl_worker_step_result res;
    if (pl_worker_step(&args, &res, err, errlen)) return -1;
    pl_msg m;
    pl_msg_init(&m, PL_MSG_REPORT, a->gen);
    m.u.report.step = s;
    m.u.report.has_loss = res.has_loss;
    m.u.report.loss = res.loss_sum;
    m.u.report.tokens = (int64_t)a->nmb * B * T;
    m.u.report.ms = pl_now_ms() - t0;
    m.u.report.grad_sumsq = res.grad_sumsq;
    m.u.report.samples_digest =
        a->stage == 0 ? pl_sampler_digest(&a->smp, s, a->first_mb * B, a->nmb * B) : 0;
    if (post(a, &m)) return pl_errf(err, errlen, "cannot send report");
    pthread_mutex_lock(&a->mu);
    a->reduced_step = s;
    pthread_mutex_unlock(&a->mu);
    pl_msg_init(&m, PL_MSG_REDUCED, a->gen);
    m.u.reduced.step = s;
    post(a, &m); /* lost while disconnected: hello_resume tells a new coordinator */
    return 0;
}

static void handle(agent *a, const pl_msg *m)
{
    char err[1024] = "";
    pl_msg r;
    switch (m->type) {
    case PL_MSG_PLAN:
        if (m->gen <= a->gen) return;
    {
        int64_t bytes = 0;
        if (install_plan(a, m, &bytes, err, sizeof err)) {
            int peer_fault = a->broken[0] != 0;
            if (superseded(a) || peer_fault) {
                /* the next plan replaces it (the copy source is kept); a failed peer is
                 * reported, so that the coordinator makes that plan */
                logf_(a, "plan generation %lld given up: %s", (long long)m->gen, err);
                teardown_links(a);
                stash_clear(a);
                if (peer_fault && !superseded(a)) {
                    pl_msg_init(&r, PL_MSG_PEER_BROKEN, a->gen);
                    snprintf(r.u.peer_broken.peer, sizeof r.u.peer_broken.peer, "%s", a->broken);
                    snprintf(r.u.peer_broken.reason, sizeof r.u.peer_broken.reason, "%.200s",
                             err);
                    post(a, &r);
                }
                return;
            }
            fail(a, "plan", err);
            return;
        }
        pl_msg_init(&r, PL_MSG_COPY_DONE, a->gen);
        r.u.copy_done.bytes = bytes;
        post(a, &r);
        return;
    }
    case PL_MSG_START_STEP:
        if (m->gen != a->gen || a->pipe < 0) return;
        if (a->have_src) { /* the plan is stable now: the old layers are no longer needed */
            pl_engine_destroy(&a->src);
            a->have_src = 0;
        }
        pl_ctl_client_set_step(a->cli, m->u.start_step.step);
        if (!step_begin(a, m->u.start_step.step)) return; /* aborted before it began */
        /* A failed step (a peer died or its link broke) is not fatal here: the
         * coordinator learns of a loss (process end, closed connection) and answers
         * abort + a new plan, which rebuilds the links; a failure it cannot see (an NCCL
         * error or deadline with every worker alive) is told to it in step_failed. */
        int failed = run_step(a, m->u.start_step.step, err, sizeof err);
        step_end(a);
        if (failed) {
            /* On NCCL a failed step leaves operations queued (a peer that never comes):
             * abort the world now (xport.h) rather than at the next plan, so that its
             * kernels stop holding the GPU and the kernels' stream meanwhile. A failed
             * world never recovers: the next plan makes a new one. */
            pthread_mutex_lock(&a->mu);
            pl_nccl_plan_abort(a->ncp, "step failed");
            const int aborted = a->aborted_gen == a->gen &&
                                a->aborted_step == m->u.start_step.step;
            pthread_mutex_unlock(&a->mu);
            logf_(a, "step %lld failed: %s (waiting for the coordinator)",
                  (long long)m->u.start_step.step, err);
            if (!aborted && !superseded(a)) {
                pl_msg_init(&r, PL_MSG_STEP_FAILED, a->gen);
                r.u.step_failed.step = m->u.start_step.step;
                snprintf(r.u.step_failed.reason, sizeof r.u.step_failed.reason, "%.900s", err);
                post(a, &r);
            }
        }
        return;
    case PL_MSG_COMMIT: {
        if (m->gen != a->gen || a->pipe < 0) return;
        const pl_optimizer_spec *o = &a->job.optimizer;
        pl_adamw w = {(float)m->u.commit.lr, (float)o->beta1, (float)o->beta2, (float)o->eps,
                      (float)o->weight_decay};
        pl_worker_apply(&a->e, &w, (float)m->u.commit.grad_scale, (int)m->u.commit.step + 1);
        pthread_mutex_lock(&a->mu);
        a->last_committed = m->u.commit.step;
        a->last_scale = m->u.commit.grad_scale;
        a->last_lr = m->u.commit.lr;
        a->reduced_step = -1;
        pthread_mutex_unlock(&a->mu);
        if (m->u.commit.save && a->job.checkpoint.dir[0] &&
            pl_checkpoint_writer_start(a->ckw, &a->e, a->job.checkpoint.dir, m->u.commit.step + 1,
                                 err, sizeof err))
            logf_(a, "checkpoint of step %lld: %s", (long long)m->u.commit.step + 1, err);
        pl_msg_init(&r, PL_MSG_COMMITTED, a->gen);
        r.u.committed.step = m->u.commit.step;
        post(a, &r);
        return;
    }
    default: return; /* abort: the next step zeroes the gradients */
    }
}

static void *compute_main(void *arg)
{
    agent *a = arg;
    for (;;) {
        qitem *q = pop(a);
        char *text = q->text;
        free(q);
        if (!text) break;
        pl_msg m;
        char err[256];
        if (!atomic_load(&a->done) && !pl_msg_decode(text, strlen(text), &m, err, sizeof err)) {
            handle(a, &m);
            pl_msg_free(&m);
        }
        free(text);
    }
    return NULL;
}

/* After a reconnection, a worker with state tells the (new) coordinator where it
 * stands (docs/protocol.md "A restarted coordinator"). */
static void hello_resume(agent *a)
{
    pl_msg m;
    pthread_mutex_lock(&a->mu);
    int64_t gen = a->gen;
    pl_msg_init(&m, PL_MSG_HELLO_RESUME, gen);
    m.u.hello_resume.committed_step = a->last_committed;
    m.u.hello_resume.grad_scale = a->last_committed >= 0 ? a->last_scale : 0;
    m.u.hello_resume.lr = a->last_committed >= 0 ? a->last_lr : 0;
    m.u.hello_resume.reduced_step =
        a->reduced_step == a->last_committed + 1 ? a->reduced_step : -1;
    pthread_mutex_unlock(&a->mu);
    if (gen > 0 && pl_ctl_client_send(a->cli, &m) == 0)
        logf_(a, "reconnected: resuming at generation %lld, step %lld committed",
              (long long)gen, (long long)m.u.hello_resume.committed_step);
    pl_msg_free(&m);
}

static void on_message(pl_ctl_client *c, const pl_msg *m, void *user)
{
    agent *a = user;
    (void)c;
    switch (m->type) {
    case PL_MSG_WELCOME:
        hello_resume(a);
        return;
    case PL_MSG_CHALLENGE: return;
    case PL_MSG_REFUSE:
        logf_(a, "refused: %s", m->u.refuse.reason);
        atomic_store(&a->exit_code, 1);
        atomic_store(&a->done, 1);
        return;
    case PL_MSG_STOP:
        if (m->u.stop.exit_code) logf_(a, "stopped: %s", m->u.stop.reason);
        atomic_store(&a->exit_code, m->u.stop.exit_code);
        atomic_store(&a->done, 1);
        return;
    case PL_MSG_NCCL_INIT: /* for the compute thread waiting in join_nccl */
        pthread_mutex_lock(&a->mu);
        memcpy(a->nccl_id, m->u.nccl_init.id, sizeof a->nccl_id);
        a->nccl_gen = m->gen;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        return;
    default: {
        if (m->type == PL_MSG_ABORT) abort_step(a, m->gen, m->u.abort_.step);
        if (m->type == PL_MSG_PLAN && m->gen > atomic_load(&a->newest_plan)) {
            atomic_store(&a->newest_plan, m->gen);
            /* a copy or step blocked in the old plan's NCCL world gives up now, so that
             * the compute thread gets to the new plan (TCP links time out or break) */
            pthread_mutex_lock(&a->mu);
            pl_nccl_plan_abort(a->ncp, "superseded by a newer plan");
            pthread_mutex_unlock(&a->mu);
        }
        char *text = pl_msg_encode(m);
        if (text) push(a, text);
        return;
    }
    }
}

static void on_close(pl_ctl_client *c, const char *reason, void *user)
{
    agent *a = user;
    (void)c;
    if (!atomic_load(&a->done) && pl_ctl_client_get_state(c) != PL_CTL_REFUSED) {
        logf_(a, "control connection closed: %s (reconnecting)", reason ? reason : "");
        atomic_store(&a->disconnected, 1);
    }
}

/* The kernel backend of o->backend: "cpu", "cuda", or "auto"/NULL = CUDA where this
 * build has it and a device is visible, else the CPU. */
static int open_backend(agent *a, char *err, size_t errlen)
{
    const char *want = a->o->backend && strcmp(a->o->backend, "auto") ? a->o->backend : NULL;
    char why[256] = "";
    if (want) a->k = kn_create(want, a->o->threads, why, sizeof why);
    else if (!(a->k = kn_create("cuda", a->o->threads, why, sizeof why)))
        a->k = kn_create("cpu", a->o->threads, why, sizeof why);
    if (!a->k) return pl_errf(err, errlen, "kernel backend %s: %s", want ? want : "auto", why);
    if (strcmp(kn_backend(a->k), "cpu"))
        logf_(a, "kernels: %s, %s matmuls", kn_backend(a->k), kn_precision(a->k));
    return 0;
}

static int setup(agent *a, char *err, size_t errlen)
{
    const pl_agent_options *o = a->o;
    if (pl_job_load(o->job_path, &a->job, err, errlen)) return -1;
    a->have_job = 1;
    if (o->checkpoint_dir &&
        pl_pathf(a->job.checkpoint.dir, sizeof a->job.checkpoint.dir, err, errlen, "%s",
                 o->checkpoint_dir))
        return -1;
    if (pl_job_gpt_config(&a->job, &a->cfg, err, errlen)) return -1;
    if (pl_tokens_open(a->job.data.train, &a->train, err, errlen)) return -1;
    a->have_train = 1;
    if (pl_sampler_init(&a->smp, a->job.data.order, a->job.data.seed,
                        pl_tokens_count(&a->train), a->job.batch.seq_len, a->job.batch.global,
                        err, errlen))
        return -1;
    if (pl_listener_open(o->host ? o->host : "127.0.0.1", o->peer_port, &a->lst, err, errlen))
        return -1;
    if (!(a->ckw = pl_checkpoint_writer_new(on_saved, a))) return pl_errf(err, errlen, "out of memory");
    if (parse_fault(a, err, errlen)) return -1;
    return open_backend(a, err, errlen);
}

/* SIGTERM is the preemption notice (Kubernetes sends it when a spot node is
 * reclaimed): the control loop tells the coordinator, which moves the worker
 * out at the next step boundary and then stops it, so no step is lost. */
static volatile sig_atomic_t got_sigterm;

static void on_sigterm(int sig)
{
    (void)sig;
    got_sigterm = 1;
}

/* Sends `leaving` once after SIGTERM. */
static void announce_leaving(agent *a, int *sent)
{
    if (!got_sigterm || *sent || !a->cli || pl_ctl_client_get_state(a->cli) != PL_CTL_WELCOMED)
        return;
    pl_msg m;
    pl_msg_init(&m, PL_MSG_LEAVING, atomic_load(&a->newest_plan));
    m.u.leaving.reason = PL_LEAVE_SIGTERM;
    if (pl_ctl_client_send(a->cli, &m) == 0) {
        logf_(a, "SIGTERM: told the coordinator this worker is leaving");
        *sent = 1;
    }
    pl_msg_free(&m);
}

/* The control connection is gone (a new operator leader, a network blip): keep
 * every bit of state and connect again with back-off, for at most
 * PL_PROTO_RECONNECT_WINDOW_MS; the next welcome sends hello_resume. -1: give up. */
static int reconnect(agent *a)
{
    double now = pl_now_ms();
    if (a->lost_since < 0) a->lost_since = now;
    if (now - a->lost_since > PL_PROTO_RECONNECT_WINDOW_MS) {
        logf_(a, "no coordinator for %d s: giving up", PL_PROTO_RECONNECT_WINDOW_MS / 1000);
        return -1;
    }
    pthread_mutex_lock(&a->cli_mu);
    pl_ctl_client_destroy(a->cli);
    a->cli = NULL;
    pthread_mutex_unlock(&a->cli_mu);
    /* back-off: 100 ms, doubling up to 2 s, cut short by stop */
    int wait = 100 << (a->reconnects < 4 ? a->reconnects : 4);
    a->reconnects++;
    for (int t = 0; t < wait && !atomic_load(&a->done); t += 20) usleep(20 * 1000);
    char err[512];
    pl_ctl_client *c = pl_ctl_client_create(&a->cc, err, sizeof err);
    if (!c) {
        logf_(a, "reconnecting: %s", err);
        return 0; /* try again */
    }
    pthread_mutex_lock(&a->cli_mu);
    a->cli = c;
    pthread_mutex_unlock(&a->cli_mu);
    atomic_store(&a->disconnected, 0);
    return 0;
}

int pl_agent_run(const pl_agent_options *o)
{
    agent *a = calloc(1, sizeof *a);
    if (!a) return 1;
    a->o = o;
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->cli_mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    a->lost_since = -1;
    char err[1024] = "";
    int started = 0;
    pthread_t th;
    atomic_store(&a->exit_code, 1);
    if (setup(a, err, sizeof err)) {
        logf_(a, "%s", err);
        goto done;
    }
    char host[PL_PROTO_HOST_MAX + 1];
    const char *colon = strrchr(o->coordinator, ':');
    if (!colon || (size_t)(colon - o->coordinator) >= sizeof host) {
        logf_(a, "bad coordinator address '%s' (HOST:PORT)", o->coordinator);
        goto done;
    }
    memcpy(host, o->coordinator, (size_t)(colon - o->coordinator));
    host[colon - o->coordinator] = 0;
    a->last_committed = a->reduced_step = -1;
    pl_ctl_client_config cc = {.host = NULL, .port = atoi(colon + 1), .ca_path = o->ca_path,
                               .insecure = !o->ca_path, .token = o->token,
                               .token_len = strlen(o->token), .on_message = on_message,
                               .on_close = on_close, .user = a};
    snprintf(cc.reg.job, sizeof cc.reg.job, "%s", a->job.name);
    snprintf(cc.reg.name, sizeof cc.reg.name, "%s", o->name);
    char hn[PL_PROTO_NAME_MAX + 1] = "localhost";
    gethostname(hn, sizeof hn - 1);
    for (char *p = hn; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '-' || *p == '_'))
            *p = '-';
    snprintf(cc.reg.node, sizeof cc.reg.node, "%s", o->node ? o->node : hn[0] ? hn : "localhost");
    snprintf(cc.reg.host, sizeof cc.reg.host, "%s",
             o->advertise ? o->advertise : o->host ? o->host : "127.0.0.1");
    cc.reg.port = pl_listener_port(a->lst);
    snprintf(cc.reg.zone, sizeof cc.reg.zone, "%s", o->zone ? o->zone : "");
    cc.reg.gpus = strcmp(kn_backend(a->k), "cpu") ? 1 : 0; /* one device per worker */
    snprintf(cc.reg.device, sizeof cc.reg.device, "%s", kn_device_id(a->k));
    /* PLIANT_NCCL=0 keeps a GPU worker on TCP (host-staged), e.g. to compare */
    const char *use_nccl = getenv("PLIANT_NCCL");
    char why[256];
    cc.reg.nccl = pl_nccl_plan_supported(a->k, why, sizeof why) &&
                  !(use_nccl && !strcmp(use_nccl, "0"));
    cc.reg.pid = getpid();
    a->cc = cc;
    a->cc.host = host;
    if (!(a->cli = pl_ctl_client_create(&a->cc, err, sizeof err))) {
        logf_(a, "%s", err);
        goto done;
    }
    atomic_store(&a->exit_code, 0);
    if (pthread_create(&th, NULL, compute_main, a)) {
        logf_(a, "cannot start the compute thread");
        atomic_store(&a->exit_code, 1);
        goto done;
    }
    started = 1;
    struct sigaction sa = {.sa_handler = on_sigterm};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    int leaving_sent = 0;
    while (!atomic_load(&a->done)) {
        announce_leaving(a, &leaving_sent);
        if (atomic_load(&a->disconnected)) {
            if (reconnect(a)) {
                atomic_store(&a->exit_code, 1);
                break;
            }
            continue;
        }
        if (pl_ctl_client_service(a->cli, 50) < 0 && !atomic_load(&a->done) &&
            pl_ctl_client_get_state(a->cli) != PL_CTL_REFUSED)
            atomic_store(&a->disconnected, 1);
        if (pl_ctl_client_get_state(a->cli) == PL_CTL_WELCOMED) {
            a->lost_since = -1;
            a->reconnects = 0;
        }
    }
    /* let queued messages (committed) go out */
    for (int i = 0; a->cli && i < 4 && pl_ctl_client_get_state(a->cli) == PL_CTL_WELCOMED; i++)
        pl_ctl_client_service(a->cli, 10);
done:;
    int code = atomic_load(&a->exit_code);
    if (started) {
        if (code) { /* a step may be blocked on a stage neighbour: wake it */
            pthread_mutex_lock(&a->mu);
            if (a->link) pl_tcp_link_abort(a->link, "worker exiting");
            pl_nccl_plan_abort(a->ncp, "worker exiting");
            pthread_mutex_unlock(&a->mu);
        }
        push(a, NULL);
        pthread_join(th, NULL);
    }
    pl_checkpoint_writer_free(a->ckw); /* a write in flight ends first */
    pl_ctl_client_destroy(a->cli);
    for (qitem *q = a->head; q;) {
        qitem *nx = q->next;
        free(q->text);
        free(q);
        q = nx;
    }
    teardown_links(a);
    stash_clear(a);
    if (a->have_engine) pl_engine_destroy(&a->e);
    if (a->have_src) pl_engine_destroy(&a->src);
    if (a->k) kn_destroy(a->k);
    if (a->lst) pl_listener_close(a->lst);
    free(a->tok);
    free(a->tgt);
    if (a->have_train) pl_tokens_close(&a->train);
    if (a->have_job) pl_job_free(&a->job);
    pthread_mutex_destroy(&a->mu);
    pthread_mutex_destroy(&a->cli_mu);
    pthread_cond_destroy(&a->cv);
    free(a);
    return code;
}
