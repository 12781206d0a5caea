/* Simulated workers (sim_workers.h). */
#include "sim_workers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pl_sim_workers_init(pl_sim_workers *s, int n, const pl_sim_costs *k,
                        const pl_sim_strategy *st, pl_sim_queue *q)
{
    memset(s, 0, sizeof *s);
    s->costs = k;
    s->strategy = st;
    s->queue = q;
    s->n = n;
    s->w = calloc((size_t)(n > 0 ? n : 1), sizeof *s->w);
    s->started = calloc((size_t)(n > 0 ? n : 1), sizeof *s->started);
    s->flight.nodes = calloc((size_t)(n > 0 ? n : 1), sizeof *s->flight.nodes);
    if (!s->w || !s->started || !s->flight.nodes) {
        pl_sim_workers_free(s);
        return -1;
    }
    return 0;
}

void pl_sim_workers_free(pl_sim_workers *s)
{
    free(s->w);
    free(s->started);
    free(s->flight.nodes);
    memset(s, 0, sizeof *s);
}

void pl_sim_worker_name(int node, char *buf, int len)
{
    char digits[16];
    int n = 0;
    unsigned v = node < 0 ? 0u : (unsigned)node;
    do
        digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) && n < (int)sizeof digits);
    if (node < 0 || len < n + 5) {
        snprintf(buf, (size_t)len, "node%d", node);
        return;
    }
    memcpy(buf, "node", 4);
    for (int i = 0; i < n; i++)
        buf[4 + i] = digits[n - 1 - i];
    buf[4 + n] = 0;
}

int pl_sim_worker_node(const pl_sim_workers *s, const char *name)
{
    if (strncmp(name, "node", 4) != 0 || !name[4]) return -1;
    long v = 0;
    for (const char *p = name + 4; *p; p++) {
        if (*p < '0' || *p > '9' || v > s->n) return -1;
        v = 10 * v + (*p - '0');
    }
    return v >= s->n ? -1 : (int)v;
}

static int push(pl_sim_workers *s, pl_sim_ev_kind kind, int node, int64_t t, int64_t gen,
                int64_t step, int64_t bytes)
{
    pl_sim_event e = {.t_ns = t, .kind = kind, .node = node, .gen = gen, .step = step,
                      .bytes = bytes};
    if (kind == PL_SIM_EV_SAVED) {
        e.layer_begin = s->w[node].layer_begin;
        e.layer_end = s->w[node].layer_end;
    }
    return pl_sim_queue_push(s->queue, e);
}

/* The bytes of w's shadow refill under plan p, as the worker decides (docs/redundant.md):
 * the stable plan's shadow is kept when it holds the successor's range after the plan's
 * step − 1, else the successor's state comes over the link. */
static int64_t shadow_refill(const pl_sim_workers *s, pl_sim_worker *w, const pl_msg_plan *p)
{
    if (w->shadow.end && !w->shadow_src.end) w->shadow_src = w->shadow;
    if (p->has_checkpoint) w->shadow_src.end = 0;
    w->shadow.end = 0;
    int b, e;
    if (p->you_pipeline < 0) return 0;
    const pl_msg_pipeline *q = &p->pipelines[p->you_pipeline];
    if (!s->strategy->shadow(p->you_stage, q->nnodes, q->layers, &b, &e)) return 0;
    const pl_sim_shadow *src = &w->shadow_src;
    const int kept = src->end && src->begin == b && src->end == e && src->step == p->step;
    w->shadow = (pl_sim_shadow){b, e, p->step};
    if (!kept) return pl_sim_state_bytes(s->costs, b, e);
    w->shadow_src.end = 0;
    return 0;
}

/* A plan: its place, then copy_done once its checkpoint is read and its layers copied
 * (with its shadow's refill, which copy_done does not count). */
static int on_plan(pl_sim_workers *s, int node, const pl_msg *m, int64_t now)
{
    const pl_msg_plan *p = &m->u.plan;
    pl_sim_worker *w = &s->w[node];
    if (s->plan_gen != p->generation) {
        s->plan_gen = p->generation;
        s->plan_load_ns = s->plan_copy_ns = s->plan_step_ns = 0;
        s->plan_workers = 0;
    }
    w->step_ns = 0;
    w->layer_begin = w->layer_end = 0;
    int64_t load = 0, bytes = 0;
    if (p->you_pipeline >= 0) {
        const pl_msg_pipeline *q = &p->pipelines[p->you_pipeline];
        w->step_ns = s->strategy->pipeline_ns(s->costs, q->nnodes, q->layers, q->microbatches);
        w->layer_begin = p->you_layer_begin;
        w->layer_end = p->you_layer_end;
        w->stage = p->you_stage;
        w->work_ns = pl_sim_work_ns(s->costs, w->layer_begin, w->layer_end, q->microbatches);
        s->plan_workers++;
        if (p->has_checkpoint && p->checkpoint_step > 0)
            load = pl_sim_storage_ns(s->costs, pl_sim_state_bytes(s->costs, w->layer_begin,
                                                                   w->layer_end));
    }
    const int64_t shadow = shadow_refill(s, w, p);
    for (int i = 0; i < p->ncopies; i++) bytes += p->copies[i].bytes;
    int64_t copy = pl_sim_copy_ns(s->costs, bytes + shadow); /* the receiver's link */
    if (load > s->plan_load_ns) s->plan_load_ns = load;
    if (copy > s->plan_copy_ns) s->plan_copy_ns = copy;
    if (w->step_ns > s->plan_step_ns) s->plan_step_ns = w->step_ns;
    return push(s, PL_SIM_EV_COPY_DONE, node, now + s->costs->install_ns + load + copy,
                p->generation, 0, bytes);
}

static int64_t save_ns(const pl_sim_workers *s, int node)
{
    const pl_sim_worker *w = &s->w[node];
    return pl_sim_storage_ns(s->costs, pl_sim_state_bytes(s->costs, w->layer_begin, w->layer_end));
}

int pl_sim_workers_deliver(pl_sim_workers *s, const char *to, const pl_msg *m, int64_t now)
{
    int node = pl_sim_worker_node(s, to);
    if (node < 0 || s->w[node].state != PL_SIM_W_LIVE) return 0;
    pl_sim_worker *w = &s->w[node];
    switch (m->type) {
    case PL_MSG_PLAN:
        return on_plan(s, node, m, now);
    case PL_MSG_START_STEP:
        if (!w->started) s->started[s->nstarted++] = node;
        w->started = 1;
        w->shadow_src.end = 0;
        s->start_gen = m->gen;
        s->start_step = m->u.start_step.step;
        return 0;
    case PL_MSG_COMMIT: /* a shadow that missed an update is never kept */
        if (w->shadow.end)
            w->shadow.step = w->shadow.step == m->u.commit.step ? m->u.commit.step + 1 : -1;
        if (m->u.commit.save &&
            push(s, PL_SIM_EV_SAVED, node, now + save_ns(s, node), m->gen, m->u.commit.step + 1, 0))
            return -1;
        return push(s, PL_SIM_EV_COMMITTED, node, now, m->gen, m->u.commit.step, 0);
    case PL_MSG_SAVE:
        return push(s, PL_SIM_EV_SAVED, node, now + save_ns(s, node), m->gen, m->u.save.step, 0);
    case PL_MSG_COMPLETE_CHECKPOINT:
        return push(s, PL_SIM_EV_CKPT_DONE, node, now, m->gen, m->u.complete_checkpoint.step, 0);
    case PL_MSG_STOP:
        w->state = PL_SIM_W_GONE;
        return 0;
    default: /* welcome, abort (its report goes stale), ... */
        return 0;
    }
}

/* The step in flight from now: its end at the slowest of its workers, or when the shared
 * cores have done every worker's compute, plus the gradient all-reduce over the
 * pipelines (one first stage each) and the step's control messages. */
static void fly(pl_sim_workers *s, int64_t now)
{
    pl_sim_flight *f = &s->flight;
    int64_t slowest = 0, work = 0;
    int pipes = 0;
    for (int i = 0; i < f->n; i++) {
        const pl_sim_worker *w = &s->w[f->nodes[i]];
        if (w->step_ns > slowest) slowest = w->step_ns;
        work += w->work_ns;
        pipes += w->stage == 0;
    }
    if (s->costs->cores > 0 && work / s->costs->cores > slowest) slowest = work / s->costs->cores;
    f->step_ns = slowest > 0 ? slowest + pl_sim_sync_ns(s->costs, pipes) : 0;
    f->start_ns = now;
    f->end_ns = now + f->step_ns;
    f->seq = pl_sim_queue_ticket(s->queue);
    f->active = 1;
}

int pl_sim_workers_schedule(pl_sim_workers *s, int64_t now)
{
    if (!s->nstarted) return 0;
    pl_sim_flight *f = &s->flight;
    int *t = f->nodes;
    f->nodes = s->started;
    s->started = t;
    f->n = s->nstarted;
    f->gen = s->start_gen;
    f->step = s->start_step;
    for (int i = 0; i < f->n; i++) s->w[f->nodes[i]].started = 0;
    s->nstarted = 0;
    fly(s, now);
    return 0;
}

void pl_sim_workers_skipped(pl_sim_workers *s, int64_t done, int64_t now)
{
    s->flight.step += done;
    fly(s, now);
}

void pl_sim_workers_step_done(pl_sim_workers *s, pl_coord *c)
{
    pl_sim_flight *f = &s->flight;
    char name[32];
    f->active = 0;
    for (int i = 0; i < f->n; i++) {
        const pl_sim_worker *w = &s->w[f->nodes[i]];
        if (w->state != PL_SIM_W_LIVE) continue;
        pl_sim_worker_name(f->nodes[i], name, sizeof name);
        pl_msg_report r = {.step = f->step, .ms = (double)w->step_ns / 1e6, .grad_sumsq = 1.0};
        pl_coord_report(c, name, f->gen, &r);
        pl_coord_reduced(c, name, f->gen, f->step);
    }
}

void pl_sim_workers_fire(pl_sim_workers *s, pl_coord *c, const pl_sim_event *e)
{
    if (e->node < 0 || e->node >= s->n || s->w[e->node].state != PL_SIM_W_LIVE) return;
    char name[32];
    pl_sim_worker_name(e->node, name, sizeof name);
    if (e->kind == PL_SIM_EV_COPY_DONE) {
        pl_coord_copy_done(c, name, e->gen, e->bytes);
    } else if (e->kind == PL_SIM_EV_COMMITTED) {
        pl_coord_committed(c, name, e->gen, e->step);
    } else if (e->kind == PL_SIM_EV_SAVED) {
        pl_msg_saved sv = {.step = e->step, .layer_begin = e->layer_begin,
                           .layer_end = e->layer_end,
                           .bytes = pl_sim_state_bytes(s->costs, e->layer_begin, e->layer_end)};
        pl_coord_saved(c, name, &sv);
    } else if (e->kind == PL_SIM_EV_CKPT_DONE) {
        pl_coord_checkpoint_done(c, name, e->step, "");
    }
}
