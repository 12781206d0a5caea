/* 1F1B pipeline schedules and the simulator that checks them: every stage's ops
 * run against its neighbours' over buffered or rendezvous links. */
#include "schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int pl_schedule_1f1b(int nstages, int stage, int nmicro, pl_schedule *out, char *err,
                     size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (nstages < 1) return pl_errf(err, errlen, "stages: %d, must be at least 1", nstages);
    if (stage < 0 || stage >= nstages)
        return pl_errf(err, errlen, "stage: %d, must be in [0, %d)", stage, nstages);
    if (nmicro < 1) return pl_errf(err, errlen, "microbatches: %d, must be at least 1", nmicro);
    if (nmicro > (1 << 28))
        return pl_errf(err, errlen, "microbatches: %d, too many", nmicro);

    int warm = nstages - stage - 1;
    if (warm > nmicro) warm = nmicro;
    int nslots = nstages - stage;
    if (nslots > nmicro) nslots = nmicro;

    pl_sched_op *ops = pl_calloc((size_t)nmicro * 2, sizeof *ops);
    if (!ops) return pl_errf(err, errlen, "out of memory");
    int n = 0;
    int prev = stage > 0 ? stage - 1 : -1;
    int next = stage < nstages - 1 ? stage + 1 : -1;
#define PUSH_F(i) ops[n++] = (pl_sched_op){PL_SCHED_FORWARD, (i), (i) % nslots, prev, next}
#define PUSH_B(i) ops[n++] = (pl_sched_op){PL_SCHED_BACKWARD, (i), (i) % nslots, next, prev}
    for (int i = 0; i < warm; i++) PUSH_F(i);
    for (int j = 0; j < nmicro - warm; j++) {
        PUSH_F(warm + j);
        PUSH_B(j);
    }
    for (int j = nmicro - warm; j < nmicro; j++) PUSH_B(j);
#undef PUSH_F
#undef PUSH_B

    out->nstages = nstages;
    out->stage = stage;
    out->nmicro = nmicro;
    out->nwarmup = warm;
    out->nslots = nslots;
    out->nops = n;
    out->ops = ops;
    return 0;
}

void pl_schedule_free(pl_schedule *s)
{
    if (!s) return;
    free(s->ops);
    memset(s, 0, sizeof *s);
}

/* ---- simulator ---------------------------------------------------------- */

enum { COMM_SEND = 0, COMM_RECV = 1 };

typedef struct {
    int dir;        /* COMM_SEND / COMM_RECV */
    int peer;
    int chan;       /* directed link index */
    int kind;       /* PL_SCHED_FORWARD: activation, PL_SCHED_BACKWARD: gradient */
    int mb;
    int done;
    int64_t time;   /* when it completed */
} sim_comm;

typedef struct {
    int ncomm;
    sim_comm comm[2];
    int op;         /* index into the stage's ops to compute after the comms, or −1 */
} sim_phase;

typedef struct {
    pl_schedule sch;
    sim_phase *phases;
    int nphases;
    int cur;        /* current phase */
    int64_t post;   /* time the current phase was reached */
    int *slot_mb;   /* microbatch in each slot, −1 free */
    int inflight;
} sim_stage;

typedef struct {
    int count, head;
    int *mb;
    int64_t *time;
} sim_queue;

/* Directed links: activation k → k+1 is link k, gradient k+1 → k is link S−1+k. */
static int link_of(int S, int from, int to)
{
    return to == from + 1 ? from : S - 1 + to;
}

static sim_comm make_comm(int S, int self, const pl_sched_op *op, int dir)
{
    sim_comm c = {0};
    c.dir = dir;
    c.peer = dir == COMM_SEND ? op->send_to : op->recv_from;
    c.chan = dir == COMM_SEND ? link_of(S, self, c.peer) : link_of(S, c.peer, self);
    /* A forward receives and sends activations, a backward gradients. */
    c.kind = op->kind;
    c.mb = op->mb;
    return c;
}

static void add_phase(sim_stage *st, int op, const sim_comm *c, int nc)
{
    sim_phase *p = &st->phases[st->nphases++];
    memset(p, 0, sizeof *p);
    p->op = op;
    p->ncomm = nc;
    for (int i = 0; i < nc; i++) p->comm[i] = c[i];
}

static void build_phases(sim_stage *st, int S, pl_sim_mode mode)
{
    const pl_schedule *s = &st->sch;
    for (int t = 0; t <= s->nops; t++) {
        sim_comm c[2];
        int nc = 0;
        if (t > 0 && s->ops[t - 1].send_to >= 0)
            c[nc++] = make_comm(S, s->stage, &s->ops[t - 1], COMM_SEND);
        if (t < s->nops && s->ops[t].recv_from >= 0)
            c[nc++] = make_comm(S, s->stage, &s->ops[t], COMM_RECV);
        int op = t < s->nops ? t : -1;
        if (mode == PL_SIM_PAIRED) {
            add_phase(st, op, c, nc);
        } else {
            for (int i = 0; i < nc; i++) add_phase(st, -1, &c[i], 1);
            if (op >= 0) add_phase(st, op, NULL, 0);
        }
    }
}

static const char *kind_name(int kind)
{
    return kind == PL_SCHED_FORWARD ? "activation" : "gradient";
}

void pl_sim_result_free(pl_sim_result *r)
{
    if (!r) return;
    free(r->fwd_start);
    free(r->bwd_start);
    free(r->max_inflight);
    memset(r, 0, sizeof *r);
}

static void free_stages(sim_stage *st, int S, sim_queue *q, int nq)
{
    if (st)
        for (int k = 0; k < S; k++) {
            pl_schedule_free(&st[k].sch);
            free(st[k].phases);
            free(st[k].slot_mb);
        }
    free(st);
    if (q)
        for (int i = 0; i < nq; i++) {
            free(q[i].mb);
            free(q[i].time);
        }
    free(q);
}

static int check_sim_args(int nstages, int nmicro, const int64_t *fwd_time,
                          const int64_t *bwd_time, pl_sim_mode mode, char *err, size_t errlen)
{
    if (mode != PL_SIM_BUFFERED && mode != PL_SIM_PAIRED && mode != PL_SIM_SEQUENTIAL)
        return pl_errf(err, errlen, "mode: %d, unknown", (int)mode);
    if (nstages < 1 || nstages > 4096)
        return pl_errf(err, errlen, "stages: %d, must be in [1, 4096]", nstages);
    if (nmicro < 1 || nmicro > (1 << 20))
        return pl_errf(err, errlen, "microbatches: %d, must be in [1, %d]", nmicro, 1 << 20);
    for (int k = 0; k < nstages; k++) {
        if (fwd_time && fwd_time[k] < 0)
            return pl_errf(err, errlen, "fwd_time[%d]: negative", k);
        if (bwd_time && bwd_time[k] < 0)
            return pl_errf(err, errlen, "bwd_time[%d]: negative", k);
    }
    return 0;
}

/* One simulation: the stages, the links' queues (buffered mode) and the result. */
typedef struct {
    int S, Nb, nq;
    pl_sim_mode mode;
    const int64_t *fwd_time, *bwd_time;
    sim_stage *st;
    sim_queue *q;
    pl_sim_result *out;
    char *err;
    size_t errlen;
} sim;

/* Allocates the result, the queues and each stage's schedule and phases. */
static int sim_alloc(sim *s)
{
    int S = s->S, Nb = s->Nb, nq = s->nq;
    pl_sim_result *out = s->out;
    s->st = pl_calloc((size_t)S, sizeof *s->st);
    s->q = nq ? pl_calloc((size_t)nq, sizeof *s->q) : NULL;
    out->fwd_start = pl_calloc((size_t)S * Nb, sizeof *out->fwd_start);
    out->bwd_start = pl_calloc((size_t)S * Nb, sizeof *out->bwd_start);
    out->max_inflight = pl_calloc((size_t)S, sizeof *out->max_inflight);
    if (!s->st || (nq && !s->q) || !out->fwd_start || !out->bwd_start || !out->max_inflight)
        return pl_errf(s->err, s->errlen, "out of memory");
    out->nstages = S;
    out->nmicro = Nb;
    for (int i = 0; i < S * Nb; i++) out->fwd_start[i] = out->bwd_start[i] = -1;
    for (int i = 0; i < nq; i++) {
        s->q[i].mb = pl_calloc((size_t)Nb, sizeof *s->q[i].mb);
        s->q[i].time = pl_calloc((size_t)Nb, sizeof *s->q[i].time);
        if (!s->q[i].mb || !s->q[i].time) return pl_errf(s->err, s->errlen, "out of memory");
    }
    for (int k = 0; k < S; k++) {
        sim_stage *st = &s->st[k];
        if (pl_schedule_1f1b(S, k, Nb, &st->sch, s->err, s->errlen)) return -1;
        /* nops + 1 points, each at most 2 comms + 1 compute */
        st->phases = pl_calloc((size_t)(st->sch.nops + 1) * 3, sizeof *st->phases);
        st->slot_mb = pl_calloc((size_t)st->sch.nslots, sizeof *st->slot_mb);
        if (!st->phases || !st->slot_mb) return pl_errf(s->err, s->errlen, "out of memory");
        for (int i = 0; i < st->sch.nslots; i++) st->slot_mb[i] = -1;
        build_phases(st, S, s->mode);
    }
    return 0;
}

/* Buffered links: a send completes at once; a receive takes the link's next
 * message once there is one, and it must be the microbatch expected. */
static int buffered_comm(sim *s, int k, sim_comm *cm)
{
    const sim_stage *me = &s->st[k];
    sim_queue *lq = &s->q[cm->chan];
    if (cm->dir == COMM_SEND) {
        lq->mb[lq->count] = cm->mb;
        lq->time[lq->count++] = me->post;
        cm->done = 1;
        cm->time = me->post;
    } else if (lq->head < lq->count) {
        int got = lq->mb[lq->head];
        int64_t at = lq->time[lq->head++];
        if (got != cm->mb)
            return pl_errf(s->err, s->errlen, "stage %d expected %s %d from stage %d, got %d", k,
                           kind_name(cm->kind), cm->mb, cm->peer, got);
        cm->done = 1;
        cm->time = at > me->post ? at : me->post;
    }
    return 0;
}

/* Rendezvous: the comm completes with the opposite one in the peer's current phase. */
static int rendezvous_comm(sim *s, int k, sim_comm *cm, int *progress)
{
    const sim_stage *me = &s->st[k], *pe = &s->st[cm->peer];
    if (pe->cur >= pe->nphases) return 0;
    sim_phase *pp = &pe->phases[pe->cur];
    for (int d = 0; d < pp->ncomm; d++) {
        sim_comm *pc = &pp->comm[d];
        if (pc->done || pc->chan != cm->chan || pc->dir == cm->dir) continue;
        if (pc->mb != cm->mb || pc->kind != cm->kind)
            return pl_errf(s->err, s->errlen, "link %d -> %d: %s %d sent, %s %d expected",
                           cm->dir == COMM_SEND ? k : cm->peer,
                           cm->dir == COMM_SEND ? cm->peer : k,
                           kind_name(cm->dir == COMM_SEND ? cm->kind : pc->kind),
                           cm->dir == COMM_SEND ? cm->mb : pc->mb,
                           kind_name(cm->dir == COMM_SEND ? pc->kind : cm->kind),
                           cm->dir == COMM_SEND ? pc->mb : cm->mb);
        int64_t at = me->post > pe->post ? me->post : pe->post;
        cm->done = pc->done = 1;
        cm->time = pc->time = at;
        *progress = 1;
        return 0;
    }
    return 0;
}

/* 1 when every comm of the phase is done; *t is then when the last one was (or post). */
static int phase_ready(const sim_phase *ph, int64_t post, int64_t *t)
{
    *t = post;
    for (int c = 0; c < ph->ncomm; c++) {
        if (!ph->comm[c].done) return 0;
        if (ph->comm[c].time > *t) *t = ph->comm[c].time;
    }
    return 1;
}

/* Computes op on stage k from *t, checking its activation slot; *t becomes its end. */
static int run_op(sim *s, int k, const pl_sched_op *op, int64_t *t)
{
    sim_stage *me = &s->st[k];
    pl_sim_result *out = s->out;
    int idx = k * s->Nb + op->mb;
    if (op->kind == PL_SCHED_FORWARD) {
        if (me->slot_mb[op->slot] != -1)
            return pl_errf(s->err, s->errlen,
                           "stage %d: forward %d overwrites slot %d of microbatch %d", k, op->mb,
                           op->slot, me->slot_mb[op->slot]);
        me->slot_mb[op->slot] = op->mb;
        if (++me->inflight > out->max_inflight[k]) out->max_inflight[k] = me->inflight;
        out->fwd_start[idx] = *t;
        *t += s->fwd_time ? s->fwd_time[k] : 1;
    } else {
        if (me->slot_mb[op->slot] != op->mb)
            return pl_errf(s->err, s->errlen,
                           "stage %d: backward %d finds slot %d holding microbatch %d", k,
                           op->mb, op->slot, me->slot_mb[op->slot]);
        me->slot_mb[op->slot] = -1;
        me->inflight--;
        out->bwd_start[idx] = *t;
        *t += s->bwd_time ? s->bwd_time[k] : 2;
    }
    return 0;
}

/* Moves stage k through every phase whose comms can complete now. */
static int advance_stage(sim *s, int k, int *progress)
{
    sim_stage *me = &s->st[k];
    while (me->cur < me->nphases) {
        sim_phase *ph = &me->phases[me->cur];
        for (int c = 0; c < ph->ncomm; c++) {
            sim_comm *cm = &ph->comm[c];
            if (cm->done) continue;
            if (s->mode == PL_SIM_BUFFERED ? buffered_comm(s, k, cm)
                                           : rendezvous_comm(s, k, cm, progress))
                return -1;
        }
        int64_t t;
        if (!phase_ready(ph, me->post, &t)) break;
        if (ph->op >= 0 && run_op(s, k, &me->sch.ops[ph->op], &t)) return -1;
        me->post = t;
        me->cur++;
        *progress = 1;
    }
    return 0;
}

/* The makespan, or a deadlock and the comms each stuck stage waits on. */
static void report(const sim *s)
{
    pl_sim_result *out = s->out;
    out->makespan = 0;
    size_t used = 0;
    for (int k = 0; k < s->S; k++) {
        const sim_stage *st = &s->st[k];
        if (st->post > out->makespan) out->makespan = st->post;
        if (st->cur >= st->nphases) continue;
        out->deadlock = 1;
        const sim_phase *ph = &st->phases[st->cur];
        for (int c = 0; c < ph->ncomm && used + 1 < sizeof out->stuck; c++) {
            const sim_comm *cm = &ph->comm[c];
            if (cm->done) continue;
            int w = snprintf(out->stuck + used, sizeof out->stuck - used,
                             "%sstage %d %s %s %d %s %d", used ? "; " : "", k,
                             cm->dir == COMM_SEND ? "sending" : "receiving", kind_name(cm->kind),
                             cm->mb, cm->dir == COMM_SEND ? "to" : "from", cm->peer);
            if (w < 0) break;
            used += (size_t)w;
            if (used >= sizeof out->stuck) used = sizeof out->stuck - 1;
        }
    }
    if (out->deadlock) out->makespan = 0;
}

int pl_pipeline_simulate(int nstages, int nmicro, const int64_t *fwd_time,
                         const int64_t *bwd_time, pl_sim_mode mode, pl_sim_result *out,
                         char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (check_sim_args(nstages, nmicro, fwd_time, bwd_time, mode, err, errlen)) return -1;
    sim s = {.S = nstages, .Nb = nmicro, .nq = 2 * (nstages - 1), .mode = mode,
             .fwd_time = fwd_time, .bwd_time = bwd_time, .out = out, .err = err,
             .errlen = errlen};
    int rc = sim_alloc(&s);
    for (int progress = 1; rc == 0 && progress;) {
        progress = 0;
        for (int k = 0; rc == 0 && k < s.S; k++) rc = advance_stage(&s, k, &progress);
    }
    if (rc == 0) report(&s);
    free_stages(s.st, s.S, s.q, s.nq);
    if (rc) pl_sim_result_free(out);
    return rc;
}
