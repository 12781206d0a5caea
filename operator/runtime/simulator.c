/* The simulation loop (simulator.h): trace events and the simulated workers' answers in
 * one queue, each handed to the real coordinator at its time, the coordinator's messages
 * delivered to the simulated workers, steady stretches fast-forwarded, time accounted. */
#include "simulator.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_queue.h"
#include "sim_workers.h"
#include "spot_trace.h"
#include "util.h"

#define NS_PER_MS 1000000LL
#define DEFAULT_BINS 200

typedef struct {
    const pl_sim_config *cfg;
    pl_coord *coord;
    pl_sim_queue q;
    pl_sim_workers sw;
    pl_sim_outcome *res;
    pl_coord_config cc;
    int64_t now;
    int nodes_live, nrec_seen;
    int64_t disrupted_ns;             /* the first trace event since the last recovery; -1: none */
    int64_t recovering;               /* the reconfiguration awaiting its first commit; -1: none */
    pl_coord_phase_t phase_seen;
    pl_msg msg;
} sim;

void pl_sim_trace_nodes(const pl_trace_event *tr, int n, int *nodes, int *peak)
{
    int live = 0;
    *nodes = *peak = 0;
    for (int i = 0; i < n; i++) {
        if (tr[i].node + 1 > *nodes) *nodes = tr[i].node + 1;
        live += tr[i].add ? 1 : -1;
        if (live > *peak) *peak = live;
    }
}

/* The coordinator as `pliant run` configures it, with the simulation's exceptions. */
static int start_coord(sim *s, char *err, size_t errlen)
{
    const pl_sim_config *cfg = s->cfg;
    int initial = 0;
    for (int i = 0; i < cfg->ntrace && cfg->trace[i].t_ms == 0; i++) initial += cfg->trace[i].add;
    s->cc = pl_job_coord_config(cfg->job, cfg->plan, initial > 0 ? initial : 1);
    s->cc.steps = 2147483647;
    s->cc.eval_every = 0;
    s->cc.resume_auto = 0;
    s->cc.resume_step = 0;
    s->cc.heartbeat_misses = 1 << 30; /* losses come from the trace */
    s->cc.brief_plans = 1;            /* the simulated workers read only their own place */
    if (!s->cc.checkpoint_dir || !s->cc.checkpoint_dir[0]) s->cc.checkpoint_dir = "(simulated)";
    cfg->strategy->configure(&s->cc);
    return (s->coord = pl_coord_new(&s->cc, err, errlen)) ? 0 : -1;
}

static int push_trace(sim *s)
{
    const pl_sim_config *cfg = s->cfg;
    int64_t notice = cfg->costs.notice_ns, end = 0;
    for (int i = 0; i < cfg->ntrace; i++) {
        const pl_trace_event *t = &cfg->trace[i];
        int64_t at = t->t_ms * NS_PER_MS;
        pl_sim_event e = {.t_ns = at, .node = t->node,
                          .kind = t->add ? PL_SIM_EV_NODE_ADD : PL_SIM_EV_NODE_REMOVE};
        if (pl_sim_queue_push(&s->q, e)) return -1;
        if (!t->add && notice > 0) {
            e.kind = PL_SIM_EV_NOTICE;
            e.t_ns = at > notice ? at - notice : 0;
            if (pl_sim_queue_push(&s->q, e)) return -1;
        }
        if (at > end) end = at;
    }
    s->res->duration_ns = end;
    return pl_sim_queue_push(&s->q, (pl_sim_event){.t_ns = end, .kind = PL_SIM_EV_END, .node = -1});
}

static void timeline(sim *s, cJSON *o)
{
    cJSON_AddNumberToObject(o, "t", (double)s->now / 1e9);
    cJSON_AddStringToObject(o, "strategy", s->cfg->strategy->name);
    cJSON_AddStringToObject(o, "below_minimum",
                            pl_below_minimum_name(s->cfg->job->fault_tolerance.below_minimum));
    cJSON_AddStringToObject(o, "phase", pl_coord_phase_name(pl_coord_phase(s->coord)));
    cJSON_AddNumberToObject(o, "step", (double)pl_coord_step(s->coord));
    cJSON_AddNumberToObject(o, "nodes", s->nodes_live);
    cJSON_AddNumberToObject(o, "workers", pl_coord_live_workers(s->coord));
    char *text = cJSON_PrintUnformatted(o);
    if (text) s->cfg->timeline(s->cfg->user, text);
    free(text);
    cJSON_Delete(o);
}

static void timeline_event(sim *s, const char *what, int node)
{
    if (!s->cfg->timeline) return;
    cJSON *o = cJSON_CreateObject();
    if (!o) return;
    cJSON_AddStringToObject(o, "event", what);
    if (node >= 0) {
        char name[32];
        pl_sim_worker_name(node, name, sizeof name);
        cJSON_AddStringToObject(o, "node", name);
    }
    timeline(s, o);
}

/* Reconfigurations made since the last look: into the result and the timeline. */
static void note_reconfigs(sim *s)
{
    for (; s->nrec_seen < pl_coord_nreconfigs(s->coord); s->nrec_seen++) {
        const pl_coord_reconfig_rec *r = pl_coord_reconfig(s->coord, s->nrec_seen);
        s->res->from_checkpoint += r->from_checkpoint;
        s->recovering = s->nrec_seen;
        if (!s->cfg->timeline) continue;
        cJSON *o = cJSON_CreateObject();
        if (!o) continue;
        cJSON_AddStringToObject(o, "event", "reconfigure");
        cJSON_AddNumberToObject(o, "generation", (double)r->generation);
        cJSON_AddStringToObject(o, "cause", r->cause);
        cJSON_AddNumberToObject(o, "bytes_planned", (double)r->bytes_planned);
        cJSON_AddBoolToObject(o, "from_checkpoint", r->from_checkpoint);
        cJSON_AddStringToObject(o, "pipelines", r->pipelines);
        cJSON_AddNumberToObject(o, "tolerance", r->tolerance);
        cJSON_AddStringToObject(o, "removed", r->removed);
        cJSON_AddStringToObject(o, "added", r->added);
        timeline(s, o);
    }
}

/* The newest reconfiguration's first commit: a "recovered" line with the time from the
 * first trace event that disrupted the job to that commit. */
static void note_recovery(sim *s)
{
    if (s->recovering < 0) return;
    const pl_coord_reconfig_rec *r = pl_coord_reconfig(s->coord, (int)s->recovering);
    if (pl_coord_step(s->coord) <= r->step || pl_coord_phase(s->coord) != PL_COORD_RUNNING) return;
    int64_t since = s->disrupted_ns >= 0 ? s->disrupted_ns : s->now;
    s->recovering = s->disrupted_ns = -1;
    if (!s->cfg->timeline) return;
    cJSON *o = cJSON_CreateObject();
    if (!o) return;
    cJSON_AddStringToObject(o, "event", "recovered");
    cJSON_AddNumberToObject(o, "generation", (double)r->generation);
    cJSON_AddNumberToObject(o, "duration_ms", (double)(s->now - since) / NS_PER_MS);
    cJSON_AddNumberToObject(o, "bytes_copied", (double)r->bytes_copied);
    timeline(s, o);
}

/* Every queued coordinator message to its simulated worker. */
static int drain(sim *s)
{
    char to[PL_PROTO_NAME_MAX + 1];
    int rc = 0;
    while (pl_coord_next(s->coord, to, sizeof to, &s->msg)) {
        if (pl_sim_workers_deliver(&s->sw, to, &s->msg, s->now)) rc = -1;
        pl_msg_free(&s->msg);
    }
    return rc;
}

static void account(sim *s)
{
    pl_sim_account_degraded(&s->res->acct, pl_coord_tolerance(s->coord) < s->cc.tolerate);
    pl_sim_account_after(&s->res->acct, pl_coord_phase(s->coord), pl_coord_step(s->coord),
                         s->nodes_live, s->sw.plan_workers, s->sw.plan_load_ns,
                         s->sw.plan_copy_ns);
}

/* The step in flight and nothing happens before it and more would end: the coordinator
 * commits those at once (quietly: the workers go on), the clock moves to the start of the
 * step in flight at the next event, and again after a step that saved a checkpoint (its
 * `save` messages delivered at the time of its commit). */
static int fast_forward(sim *s)
{
    const pl_sim_flight *f = &s->sw.flight;
    for (;;) {
        int64_t T = f->step_ns, next = pl_sim_queue_next_time(&s->q);
        if (!f->active || T <= 0 || pl_coord_phase(s->coord) != PL_COORD_RUNNING ||
            next == INT64_MAX)
            return 0;
        int64_t k = (next - f->start_ns) / T;
        if (k < 1) return 0;
        account(s);
        int64_t done = pl_coord_skip_steps(s->coord, k, 1, T / NS_PER_MS);
        if (done <= 0) return 0;
        s->now = f->start_ns + done * T;
        pl_sim_account_advance(&s->res->acct, s->now);
        account(s);
        pl_sim_workers_skipped(&s->sw, done, s->now);
        if (drain(s)) return -1;
    }
}

/* The coordinator's timers: a replan after settling, the wait for nodes' limit. */
static int schedule_ticks(sim *s)
{
    pl_coord_phase_t p = pl_coord_phase(s->coord);
    int64_t at = -1;
    if (p == PL_COORD_SETTLING)
        at = s->now + (int64_t)s->cc.settle_ms * NS_PER_MS + NS_PER_MS;
    else if ((p == PL_COORD_WAITING_FOR_NODES || p == PL_COORD_WAITING_FOR_WORKERS) &&
             p != s->phase_seen && s->cc.wait_for_nodes_ms > 0)
        at = s->now + (s->cc.wait_for_nodes_ms + 1) * NS_PER_MS;
    s->phase_seen = p;
    if (at < 0) return 0;
    return pl_sim_queue_push(&s->q, (pl_sim_event){.t_ns = at, .kind = PL_SIM_EV_TICK, .node = -1});
}

static int pump(sim *s)
{
    if (drain(s)) return -1;
    if (pl_sim_workers_schedule(&s->sw, s->now)) return -1;
    if (fast_forward(s)) return -1;
    note_reconfigs(s);
    note_recovery(s);
    return schedule_ticks(s);
}

static void node_event(sim *s, const pl_sim_event *e)
{
    char name[32];
    pl_sim_worker_name(e->node, name, sizeof name);
    pl_sim_worker *w = &s->sw.w[e->node];
    int live = w->state == PL_SIM_W_LIVE || (e->kind == PL_SIM_EV_REGISTER &&
                                              w->state == PL_SIM_W_STARTING);
    if (e->kind != PL_SIM_EV_NODE_ADD && live && s->disrupted_ns < 0 && pl_coord_step(s->coord) > 0)
        s->disrupted_ns = e->t_ns; /* a loss, notice or join the coordinator sees */
    if (e->kind == PL_SIM_EV_NODE_ADD) {
        s->nodes_live++;
        w->state = PL_SIM_W_STARTING;
        /* the nodes of the trace's start too: the job starts with the trace */
        pl_sim_event r = {.t_ns = e->t_ns + s->cfg->costs.startup_ns, .kind = PL_SIM_EV_REGISTER,
                          .node = e->node};
        pl_sim_queue_push(&s->q, r);
        timeline_event(s, "add", e->node);
    } else if (e->kind == PL_SIM_EV_NODE_REMOVE) {
        s->nodes_live--;
        if (w->state == PL_SIM_W_LIVE) pl_coord_worker_lost(s->coord, name, "preempted");
        w->state = PL_SIM_W_GONE;
        timeline_event(s, "remove", e->node);
    } else if (e->kind == PL_SIM_EV_NOTICE) {
        const int64_t grace_ms = s->cfg->costs.notice_ns / NS_PER_MS;
        if (w->state == PL_SIM_W_LIVE) pl_coord_leaving(s->coord, name, PL_LEAVE_SIGTERM, grace_ms);
        timeline_event(s, "notice", e->node);
    } else if (e->kind == PL_SIM_EV_REGISTER && w->state == PL_SIM_W_STARTING) {
        char zone[16] = "";
        if (s->cfg->zones > 0)
            snprintf(zone, sizeof zone, "z%d", pl_spot_trace_zone(e->node, s->cfg->zones));
        pl_coord_worker_info wi = {.name = name, .node = name, .zone = zone};
        w->state = pl_coord_worker_joined(s->coord, &wi, s->now / NS_PER_MS) == PL_COORD_OK
                       ? PL_SIM_W_LIVE : PL_SIM_W_GONE;
    }
}

static void handle(sim *s, const pl_sim_event *e)
{
    switch (e->kind) {
    case PL_SIM_EV_NODE_ADD: case PL_SIM_EV_NODE_REMOVE: case PL_SIM_EV_NOTICE:
    case PL_SIM_EV_REGISTER:
        node_event(s, e);
        break;
    case PL_SIM_EV_TICK:
        pl_coord_tick(s->coord, s->now / NS_PER_MS);
        break;
    default:
        pl_sim_workers_fire(&s->sw, s->coord, e);
    }
}

/* The step in flight ends before the queue's next event (ties by insertion order). */
static int flight_first(sim *s)
{
    const pl_sim_flight *f = &s->sw.flight;
    const pl_sim_event *e = pl_sim_queue_peek(&s->q);
    return f->active && (!e || f->end_ns < e->t_ns || (f->end_ns == e->t_ns && f->seq < e->seq));
}

static void set_time(sim *s, int64_t t)
{
    if (t > s->now) s->now = t;
    pl_sim_account_advance(&s->res->acct, s->now);
    pl_coord_clock(s->coord, s->now / NS_PER_MS); /* its step times and timers */
}

static int loop(sim *s)
{
    pl_sim_event e;
    for (;;) {
        if (flight_first(s)) {
            set_time(s, s->sw.flight.end_ns);
            pl_sim_workers_step_done(&s->sw, s->coord);
        } else {
            if (!pl_sim_queue_pop(&s->q, &e)) break;
            set_time(s, e.t_ns);
            if (e.kind == PL_SIM_EV_END) break;
            handle(s, &e);
        }
        if (pump(s)) return -1;
        account(s);
    }
    return 0;
}

static void finish(sim *s)
{
    pl_sim_outcome *r = s->res;
    pl_sim_account_close(&r->acct, s->sw.plan_load_ns, s->sw.plan_copy_ns);
    r->steps = pl_coord_step(s->coord);
    r->samples = r->steps * s->cfg->job->batch.global;
    r->reconfigs = pl_coord_nreconfigs(s->coord);
    for (int i = 0; i < r->reconfigs; i++) r->bytes_copied += pl_coord_reconfig(s->coord, i)->bytes_copied;
    snprintf(r->end_phase, sizeof r->end_phase, "%s", pl_coord_phase_name(pl_coord_phase(s->coord)));
    snprintf(r->reason, sizeof r->reason, "%s", pl_coord_reason(s->coord));
    r->step_ns = s->sw.flight.active ? s->sw.flight.step_ns : 0;
    timeline_event(s, "end", -1);
}

int pl_sim_run(const pl_sim_config *cfg, pl_sim_outcome *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    res->strategy = cfg->strategy->name;
    sim s = {.cfg = cfg, .res = res, .phase_seen = PL_COORD_WAITING_FOR_WORKERS,
             .disrupted_ns = -1, .recovering = -1};
    pl_sim_queue_init(&s.q);
    int nodes, peak, rc = -1;
    pl_sim_trace_nodes(cfg->trace, cfg->ntrace, &nodes, &peak);
    if (pl_sim_workers_init(&s.sw, nodes, &cfg->costs, cfg->strategy, &s.q) || push_trace(&s) ||
        pl_sim_account_init(&res->acct, res->duration_ns, cfg->nbins > 0 ? cfg->nbins : DEFAULT_BINS,
                            cfg->job->batch.global)) {
        pl_errf(err, errlen, "simulate: out of memory");
    } else if (start_coord(&s, err, errlen) == 0) {
        rc = loop(&s);
        if (rc) pl_errf(err, errlen, "simulate: out of memory");
        else finish(&s);
    }
    pl_coord_free(s.coord);
    pl_sim_workers_free(&s.sw);
    pl_sim_queue_free(&s.q);
    if (rc) pl_sim_outcome_free(res);
    return rc;
}

void pl_sim_outcome_free(pl_sim_outcome *res) { pl_sim_account_free(&res->acct); }

/* The step of cfg's job on n nodes there from the start, with latency_ns a message, once
 * its first plan has stepped for a minute (simulated). */
static int failure_free_step(const pl_sim_config *cfg, int n, int64_t latency_ns,
                             int64_t *step_ns, char *err, size_t errlen)
{
    pl_trace_event *tr = calloc((size_t)n + 1, sizeof *tr);
    if (!tr) return pl_errf(err, errlen, "simulate: out of memory");
    for (int i = 0; i < n; i++) tr[i] = (pl_trace_event){.add = 1, .node = i};
    /* the trace ends at its last event: a node that would start up after it */
    tr[n] = (pl_trace_event){.t_ms = (cfg->costs.startup_ns + cfg->costs.install_ns) / NS_PER_MS
                                     + 60000,
                             .add = 1, .node = n};
    pl_sim_config c = *cfg;
    c.trace = tr;
    c.ntrace = n + 1;
    c.timeline = NULL;
    c.costs.latency_ns = latency_ns;
    pl_sim_outcome o;
    int rc = pl_sim_run(&c, &o, err, errlen);
    free(tr);
    if (rc) return -1;
    *step_ns = o.step_ns;
    if (!o.step_ns)
        rc = pl_errf(err, errlen, "no step on %d nodes without failures (%s: %s)", n, o.end_phase,
                     o.reason);
    pl_sim_outcome_free(&o);
    return rc;
}

int pl_sim_latency_for_step(const pl_sim_config *cfg, int nodes, int64_t step_ns,
                            int64_t *latency_ns, char *err, size_t errlen)
{
    /* the step is linear in the latency (pl_sim_sync_ns): two runs draw the line */
    int64_t at0, at1;
    if (failure_free_step(cfg, nodes, 0, &at0, err, errlen) ||
        failure_free_step(cfg, nodes, NS_PER_MS, &at1, err, errlen))
        return -1;
    if (at1 <= at0)
        return pl_errf(err, errlen, "the simulated step does not grow with the latency");
    *latency_ns = step_ns > at0
                      ? llround((double)(step_ns - at0) * NS_PER_MS / (double)(at1 - at0)) : 0;
    return 0;
}
