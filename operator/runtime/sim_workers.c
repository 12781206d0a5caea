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
    if (!s->w || !s->started) {
        pl_sim_workers_free(s);
        return -1;
    }
    return 0;
}

void pl_sim_workers_free(pl_sim_workers *s)
{
    free(s->w);
    free(s->started);
    memset(s, 0, sizeof *s);
}

void pl_sim_worker_name(int node, char *buf, int len) { snprintf(buf, (size_t)len, "node%d", node); }

int pl_sim_worker_node(const pl_sim_workers *s, const char *name)
{
    if (strncmp(name, "node", 4) != 0) return -1;
    char *end;
    long v = strtol(name + 4, &end, 10);
    return *end || v < 0 || v >= s->n ? -1 : (int)v;
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

/* A plan: its place, then copy_done once its checkpoint is read and its layers copied. */
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
        w->step_ns = s->strategy->pipeline_ns(s->costs, q->nnodes, q->microbatches);
        w->layer_begin = p->you_layer_begin;
        w->layer_end = p->you_layer_end;
        s->plan_workers++;
        if (p->has_checkpoint && p->checkpoint_step > 0)
            load = pl_sim_storage_ns(s->costs, pl_sim_state_bytes(s->costs, w->layer_begin,
                                                                   w->layer_end));
    }
    for (int i = 0; i < p->ncopies; i++) bytes += p->copies[i].bytes;
    int64_t copy = pl_sim_copy_ns(s->costs, bytes);
    if (load > s->plan_load_ns) s->plan_load_ns = load;
    if (copy > s->plan_copy_ns) s->plan_copy_ns = copy;
    if (w->step_ns > s->plan_step_ns) s->plan_step_ns = w->step_ns;
    return push(s, PL_SIM_EV_COPY_DONE, node, now + load + copy, p->generation, 0, bytes);
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
        w->gen = m->gen;
        w->step = m->u.start_step.step;
        return 0;
    case PL_MSG_COMMIT:
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

int pl_sim_workers_schedule(pl_sim_workers *s, int64_t now)
{
    int rc = 0;
    for (int i = 0; i < s->nstarted; i++) {
        pl_sim_worker *w = &s->w[s->started[i]];
        w->started = 0;
        if (w->state == PL_SIM_W_LIVE &&
            push(s, PL_SIM_EV_REPORT, s->started[i], now + w->step_ns, w->gen, w->step, 0))
            rc = -1;
    }
    s->nstarted = 0;
    return rc;
}

static void report(pl_coord *c, const char *name, const pl_sim_event *e, int64_t step_ns)
{
    pl_msg_report r = {.step = e->step, .ms = (double)step_ns / 1e6, .grad_sumsq = 1.0};
    pl_coord_report(c, name, e->gen, &r);
    pl_coord_reduced(c, name, e->gen, e->step);
}

void pl_sim_workers_fire(pl_sim_workers *s, pl_coord *c, const pl_sim_event *e)
{
    if (e->node < 0 || e->node >= s->n || s->w[e->node].state != PL_SIM_W_LIVE) return;
    char name[32];
    pl_sim_worker_name(e->node, name, sizeof name);
    if (e->kind == PL_SIM_EV_COPY_DONE) {
        pl_coord_copy_done(c, name, e->gen, e->bytes);
    } else if (e->kind == PL_SIM_EV_REPORT) {
        report(c, name, e, s->w[e->node].step_ns);
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
