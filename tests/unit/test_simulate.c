/* `pliant simulate`'s engine (operator/runtime/simulator.c) on small traces: a loss
 * survived with layer copies under templates; a fatal loss falling back to the checkpoint
 * after waiting for nodes; belowMinimum's wait against degrade, each one's time below the
 * minimum; the checkpoint strategy redoing lost steps; the redundant
 * strategy failing over without copies, restoring on a join and falling back to
 * re-instantiation on two consecutive losses, its step overhead and its shadows refilled
 * only where a worker cannot keep its own; the same inputs
 * giving the same result; a zone's loss against placement by zone and by rank, and with
 * notice (one longer than a step, and one shorter); the node-count trace format; --scale; a job asking for fewer nodes than the
 * trace has (--sweep nodes=). */
#include <stdlib.h>

#include "check.h"
#include "job_plan.h"
#include "rc_plan.h"
#include "sim_workers.h"
#include "simulator.h"
#include "spot_trace.h"

#define L 6

/* 6 layers, one GPU per node, memory such that n0 = 2 (as test_coordinator's). */
static void make_profile(pl_profile *p)
{
    memset(p, 0, sizeof *p);
    strcpy(p->model, "synthetic");
    p->microbatch_size = 1;
    p->gpus_per_node = 1;
    p->intra_node_GBps = 100;
    p->inter_node_GBps = 10;
    p->nkeys = 1;
    p->keys[0] = 1;
    p->nlayers = L;
    p->layers = calloc(L, sizeof *p->layers);
    int64_t total = 0;
    for (int l = 0; l < L; l++) {
        pl_layer_profile *y = &p->layers[l];
        snprintf(y->name, sizeof y->name, "layer%d", l);
        y->param_bytes = 1000000000LL * (l + 1);
        y->output_bytes = 4096;
        y->fwd_ns[0] = 100000000 + 7919 * l; /* 0.1 s a microbatch */
        y->bwd_ns[0] = 2 * y->fwd_ns[0];
        total += y->param_bytes;
    }
    p->gpu_memory_bytes = 4 * total * 6 / 10;
}

static const char *job_yaml(const char *strategy, int tolerate)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "apiVersion: pliant.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: sim}\n"
             "spec:\n  model: {preset: gpt2-d6}\n  data: {train: /x_*.bin}\n"
             "  batch: {global: 16, micro: 1, seqLen: 64}\n  steps: 1000\n"
             "  checkpoint: {dir: /ckpt, every: 20}\n"
             "  faultTolerance: {strategy: %s, tolerate: %d, maxResets: 0}\n", strategy, tolerate);
    return buf;
}

typedef struct {
    pl_job job;
    pl_job_plan plan;
} fixture;

static int setup(fixture *f, const char *strategy, int tolerate, int nmax)
{
    char err[512];
    memset(f, 0, sizeof *f);
    if (pl_job_parse(job_yaml(strategy, tolerate), NULL, &f->job, err, sizeof err)) {
        printf("    %s\n", err);
        return -1;
    }
    make_profile(&f->plan.prof);
    f->plan.have_prof = 1;
    f->plan.nmax = nmax;
    if (!strcmp(strategy, "redundant")
            ? pl_templates_plan_rc(&f->plan.prof, nmax, tolerate, 0, &f->plan.ts, err, sizeof err)
            : pl_templates_plan(&f->plan.prof, nmax, tolerate, &f->plan.ts, err, sizeof err)) {
        printf("    %s\n", err);
        return -1;
    }
    f->plan.have_ts = 1;
    if (pl_coverage_compute(&f->plan.ts, nmax, tolerate, 16, 1, &f->plan.cov, err, sizeof err))
        return -1;
    f->plan.have_cov = 1;
    return 0;
}

static void teardown(fixture *f)
{
    pl_job_plan_free(&f->plan);
    pl_job_free(&f->job);
}

/* The timeline's reconfigure lines, one after the other (for the redundant strategy's
 * failovers). */
static char reconfigs[8192];

static void keep_reconfigs(void *user, const char *json)
{
    if (strstr(json, "\"event\":\"reconfigure\"") &&
        strlen(reconfigs) + strlen(json) + 2 < sizeof reconfigs) {
        strcat(reconfigs, json);
        strcat(reconfigs, "\n");
    }
}

static int run_zones(fixture *f, const char *strategy, const pl_trace_event *tr, int n,
                     int64_t notice_s, int zones, pl_sim_outcome *out)
{
    reconfigs[0] = 0;
    pl_sim_config cfg = {
        .timeline = keep_reconfigs,
        .job = &f->job, .plan = &f->plan, .strategy = pl_sim_strategy_find(strategy),
        .costs = {.profile = &f->plan.prof, .templates = &f->plan.ts, .storage_GBps = 1.0,
                  .startup_ns = 10000000000LL, .notice_ns = notice_s * 1000000000LL},
        .trace = tr, .ntrace = n, .nbins = 10, .zones = zones};
    char err[512];
    int rc = pl_sim_run(&cfg, out, err, sizeof err);
    if (rc) printf("    %s\n", err);
    return rc;
}

static int run(fixture *f, const char *strategy, const pl_trace_event *tr, int n, int64_t notice_s,
               pl_sim_outcome *out)
{
    return run_zones(f, strategy, tr, n, notice_s, 0, out);
}

#define ADD(t, n) {(t) * 1000LL, 1, (n)}
#define REMOVE(t, n) {(t) * 1000LL, 0, (n)}

static void loss_with_copies(void)
{
    fixture f;
    CHECK(setup(&f, "templates", 1, 6) == 0);
    const pl_trace_event tr[] = {ADD(0, 0), ADD(0, 1), ADD(0, 2), ADD(0, 3), ADD(0, 4), ADD(0, 5),
                                 REMOVE(100, 4), ADD(400, 6)};
    pl_sim_outcome r;
    CHECK(run(&f, "templates", tr, 8, 0, &r) == 0);
    CHECK_EQ_INT(r.from_checkpoint, 0);
    CHECK(r.reconfigs >= 1);
    CHECK(r.bytes_copied > 0);
    CHECK(r.acct.split_ns[PL_SIM_T_COPY] > 0);
    CHECK(r.acct.split_ns[PL_SIM_T_REDO] > 0); /* the step the loss aborted */
    CHECK(r.acct.split_ns[PL_SIM_T_COMPUTE] > 300 * 1000000000LL);
    CHECK(!strcmp(r.end_phase, "running") || !strcmp(r.end_phase, "committing"));
    int64_t total = 0;
    for (int k = 0; k < PL_SIM_T_COUNT; k++) total += r.acct.split_ns[k];
    CHECK_EQ_INT(total, r.duration_ns);
    /* the same inputs, the same result */
    pl_sim_outcome again;
    CHECK(run(&f, "templates", tr, 8, 0, &again) == 0);
    CHECK_EQ_INT(again.steps, r.steps);
    CHECK_EQ_INT(again.bytes_copied, r.bytes_copied);
    pl_sim_outcome_free(&again);
    pl_sim_outcome_free(&r);
    teardown(&f);
}

static void fatal_loss_falls_back_to_checkpoint(void)
{
    fixture f;
    CHECK(setup(&f, "templates", 0, 4) == 0);
    /* 3 of 4 nodes at once (after the checkpoint of step 20 is complete): some layer has no
     * holder left and 1 node is too few; 3 more register 10 s later */
    const pl_trace_event tr[] = {ADD(0, 0), ADD(0, 1), ADD(0, 2), ADD(0, 3), REMOVE(400, 0),
                                 REMOVE(400, 1), REMOVE(400, 2), ADD(400, 4), ADD(400, 5),
                                 ADD(400, 6), ADD(800, 7)};
    pl_sim_outcome r;
    CHECK(run(&f, "templates", tr, 11, 0, &r) == 0);
    CHECK(r.from_checkpoint >= 1);
    CHECK(r.acct.split_ns[PL_SIM_T_WAIT] >= 10 * 1000000000LL - 1000000000LL); /* start-up */
    CHECK(r.acct.split_ns[PL_SIM_T_CKPT] > 0);  /* the load */
    CHECK(r.acct.split_ns[PL_SIM_T_REDO] > 0);  /* steps since the checkpoint */
    pl_sim_outcome_free(&r);
    teardown(&f);
}

/* 3 of 6 nodes lost leave fewer than (F + 1)·n0 = 4: waiting, the job idles until the
 * joins register (10 s after their add); degraded, it trains on a plan of F = 0 meanwhile. */
static void below_minimum_wait_or_degrade(void)
{
    fixture f;
    CHECK(setup(&f, "templates", 1, 6) == 0);
    const pl_trace_event tr[] = {ADD(0, 0), ADD(0, 1), ADD(0, 2), ADD(0, 3), ADD(0, 4), ADD(0, 5),
                                 REMOVE(100, 1), REMOVE(100, 3), REMOVE(100, 5), ADD(300, 6),
                                 ADD(300, 7), ADD(300, 8), ADD(600, 9)};
    pl_sim_outcome w, d;
    CHECK(run(&f, "templates", tr, 13, 0, &w) == 0);
    f.job.fault_tolerance.below_minimum = PL_BELOW_MIN_DEGRADE;
    CHECK(run(&f, "templates", tr, 13, 0, &d) == 0);
    const int64_t s = 1000000000LL;
    CHECK(w.acct.below_wait_ns > 200 * s && w.acct.below_wait_ns < 215 * s);
    CHECK_EQ_INT(w.acct.degraded_ns, 0);
    CHECK_EQ_INT(d.acct.below_wait_ns, 0);
    /* until the plan back at F is in place: its copies to the joined nodes */
    CHECK(d.acct.degraded_ns > 200 * s && d.acct.degraded_ns < 230 * s);
    CHECK(d.steps > w.steps);
    pl_sim_outcome_free(&w);
    pl_sim_outcome_free(&d);
    teardown(&f);
}

static void checkpoint_strategy_redoes_work(void)
{
    fixture f;
    CHECK(setup(&f, "checkpoint", 1, 6) == 0);
    const pl_trace_event tr[] = {ADD(0, 0), ADD(0, 1), ADD(0, 2), ADD(0, 3), ADD(0, 4), ADD(0, 5),
                                 REMOVE(100, 4), REMOVE(250, 1), ADD(400, 6)};
    pl_sim_outcome ck, tp;
    CHECK(run(&f, "checkpoint", tr, 9, 0, &ck) == 0);
    CHECK(run(&f, "templates", tr, 9, 0, &tp) == 0);
    CHECK(ck.from_checkpoint >= 2);
    CHECK_EQ_INT(ck.bytes_copied, 0);
    CHECK(ck.acct.split_ns[PL_SIM_T_REDO] > tp.acct.split_ns[PL_SIM_T_REDO]);
    CHECK(ck.steps < tp.steps);
    pl_sim_outcome_free(&ck);
    pl_sim_outcome_free(&tp);
    teardown(&f);
}

/* The n-th (from 0) reconfigure line of the last run, or NULL. */
static const char *reconfig_line(int n)
{
    const char *p = reconfigs;
    for (int i = 0; i < n && p; i++) {
        p = strchr(p, '\n');
        if (p) p++;
    }
    return p && *p ? p : NULL;
}

static void redundant_fails_over_without_copies(void)
{
    fixture f;
    CHECK(setup(&f, "redundant", 1, 10) == 0);
    const pl_trace_event tr[] = {ADD(0, 0), ADD(0, 1), ADD(0, 2), ADD(0, 3), ADD(0, 4), ADD(0, 5),
                                 ADD(0, 6), ADD(0, 7), ADD(0, 8), ADD(0, 9), REMOVE(100, 2),
                                 ADD(200, 10), REMOVE(300, 6), REMOVE(300, 7), ADD(400, 11)};
    pl_sim_outcome r;
    CHECK(run(&f, "redundant", tr, 15, 0, &r) == 0);
    /* pipelines 1x6 + 1x4 (nodes 0–5, 6–9); node 2's holder is node 1: no copy */
    CHECK_EQ_INT(r.reconfigs, 3);
    CHECK_EQ_INT(r.from_checkpoint, 0);
    CHECK(strstr(reconfig_line(0), "failover: node1 runs layers [1, 3) without a copy") != NULL);
    CHECK(strstr(reconfig_line(0), "\"bytes_planned\":0,") != NULL);
    /* the join restores the layout: node 10 receives layer 2 (3 × 3 GB) from node 1 */
    CHECK(strstr(reconfig_line(1), "\"bytes_planned\":9000000000,") != NULL);
    CHECK(strstr(reconfig_line(1), "\"pipelines\":\"1x6+1x4\"") != NULL);
    /* stages 0 and 1 of the second pipeline at once: no holder, re-instantiation with copies */
    CHECK(strstr(reconfig_line(2), "failover") == NULL);
    CHECK(strstr(reconfig_line(2), "\"bytes_planned\":0,") == NULL);
    CHECK(r.bytes_copied > 9000000000LL);
    pl_sim_outcome_free(&r);
    teardown(&f);
}

/* A step with redundant computation costs more than without (the shadow's gradient; eager:
 * the FRC the bubbles do not hide too); a merged layout (a failover's) is costed as it is. */
static void redundant_step_overhead(void)
{
    fixture f;
    CHECK(setup(&f, "redundant", 1, 10) == 0);
    const pl_template *t = pl_template_for(&f.plan.ts, 4);
    CHECK(t != NULL && t->nstages == 4);
    int b[5];
    for (int j = 0; j < 4; j++) b[j] = t->stages[j].layer_begin;
    b[4] = L;
    pl_sim_costs k = {.profile = &f.plan.prof, .templates = &f.plan.ts};
    const int64_t plain = pl_sim_pipeline_ns(&k, 4, b, 8, 0), lazy = pl_sim_pipeline_ns(&k, 4, b, 8, 1);
    k.frc_eager = 1;
    const int64_t eager = pl_sim_pipeline_ns(&k, 4, b, 8, 1);
    CHECK_EQ_INT(plain, pl_template_time(t, 8));
    CHECK(lazy > plain && eager >= lazy);
    const int merged[4] = {b[0], b[2], b[3], L}; /* stage 1 taken over by stage 0 */
    CHECK(pl_sim_pipeline_ns(&k, 3, merged, 8, 0) > plain);
    teardown(&f);
}

/* What a simulated worker's plan g at step `step` (stage 0 of a 2-node pipeline split at
 * `cut`) costs it in copies: its copy_done's time from 0 (no install time). */
static int64_t plan_copy_ns(pl_sim_workers *s, pl_sim_queue *q, int64_t g, int64_t step, int cut)
{
    pl_proto_name nodes[2] = {"node0", "node1"};
    int layers[3] = {0, cut, L};
    pl_msg_pipeline pipe = {.nnodes = 2, .nodes = nodes, .template_nodes = 2, .layers = layers,
                            .microbatches = 1};
    pl_msg m = {.type = PL_MSG_PLAN, .gen = g};
    m.u.plan = (pl_msg_plan){.generation = g, .step = step, .npipelines = 1, .pipelines = &pipe,
                             .you_layer_end = cut};
    pl_sim_event e = {0};
    if (pl_sim_workers_deliver(s, "node0", &m, 0) || !pl_sim_queue_pop(q, &e)) return -1;
    return e.kind == PL_SIM_EV_COPY_DONE ? e.t_ns : -1;
}

/* A message of type to node0 (start_step, commit of `step`), its answer dropped. */
static void deliver(pl_sim_workers *s, pl_sim_queue *q, int type, int64_t g, int64_t step)
{
    pl_msg m = {.type = type, .gen = g};
    if (type == PL_MSG_COMMIT) m.u.commit.step = step;
    else m.u.start_step.step = step;
    pl_sim_event e;
    CHECK(pl_sim_workers_deliver(s, "node0", &m, 0) == 0);
    while (pl_sim_queue_pop(q, &e)) {}
}

/* Under redundant a worker refills its shadow only where it cannot keep it, as the worker
 * does: a first plan, a changed successor range, a shadow that missed a commit. */
static void redundant_refills_only_changed_shadows(void)
{
    fixture f;
    CHECK(setup(&f, "redundant", 1, 10) == 0);
    pl_sim_costs k = {.profile = &f.plan.prof, .templates = &f.plan.ts};
    pl_sim_queue q;
    pl_sim_queue_init(&q);
    pl_sim_workers s;
    CHECK(pl_sim_workers_init(&s, 2, &k, pl_sim_strategy_find("redundant"), &q) == 0);
    s.w[0].state = PL_SIM_W_LIVE;
    CHECK_EQ_INT(plan_copy_ns(&s, &q, 1, 0, 2), pl_sim_copy_ns(&k, pl_sim_state_bytes(&k, 2, L)));
    deliver(&s, &q, PL_MSG_START_STEP, 1, 0);
    deliver(&s, &q, PL_MSG_COMMIT, 1, 0);
    CHECK_EQ_INT(plan_copy_ns(&s, &q, 2, 1, 2), 0);  /* same range, same step: kept */
    deliver(&s, &q, PL_MSG_START_STEP, 2, 1);        /* aborted: nothing changed */
    CHECK_EQ_INT(plan_copy_ns(&s, &q, 3, 1, 2), 0);
    deliver(&s, &q, PL_MSG_START_STEP, 3, 1);        /* committed without this worker */
    CHECK(plan_copy_ns(&s, &q, 4, 2, 2) > 0);
    deliver(&s, &q, PL_MSG_START_STEP, 4, 2);
    deliver(&s, &q, PL_MSG_COMMIT, 4, 2);
    CHECK_EQ_INT(plan_copy_ns(&s, &q, 5, 3, 3), pl_sim_copy_ns(&k, pl_sim_state_bytes(&k, 3, L)));
    pl_sim_workers_free(&s);
    pl_sim_queue_free(&q);
    teardown(&f);
}

static void notice_moves_out_without_loss(void)
{
    fixture f;
    CHECK(setup(&f, "templates", 1, 6) == 0);
    const pl_trace_event tr[] = {ADD(0, 0), ADD(0, 1), ADD(0, 2), ADD(0, 3), ADD(0, 4), ADD(0, 5),
                                 REMOVE(100, 4), ADD(400, 6)};
    pl_sim_outcome r;
    CHECK(run(&f, "templates", tr, 8, 30, &r) == 0);
    CHECK(r.reconfigs >= 1);
    CHECK_EQ_INT(r.acct.split_ns[PL_SIM_T_REDO], 0); /* left at a step boundary */
    pl_sim_outcome_free(&r);
    teardown(&f);
}

/* Six nodes in zones 0, 1, 2, 0, 1, 2; node 0's preemption takes its zone (nodes 0 and 3)
 * at once. Placed by rank (zones not told), both pipelines run the same layers on nodes of
 * the same zones: the loss without notice is fatal and the job restarts from its
 * checkpoint; with notice the leaving nodes are copy sources. Placed by zone, every layer
 * keeps a holder and the loss costs copies only. */
static void zone_loss_and_placement(void)
{
    fixture f;
    CHECK(setup(&f, "templates", 1, 6) == 0);
    const pl_trace_event tr[] = {ADD(0, 0), ADD(0, 1), ADD(0, 2), ADD(0, 3), ADD(0, 4), ADD(0, 5),
                                 REMOVE(100, 0), ADD(400, 6), ADD(400, 7)};
    pl_trace_event *z;
    int nz;
    char err[256];
    CHECK(pl_spot_trace_zones(tr, 9, 3, 1.0, &z, &nz, err, sizeof err) == 0);
    CHECK_EQ_INT(nz, 10); /* node 3 goes with node 0 */
    CHECK(z[6].t_ms == 100000 && !z[6].add && z[6].node == 0 && z[7].node == 3 && !z[7].add);
    pl_sim_outcome blind, placed;
    CHECK(run_zones(&f, "templates", z, nz, 0, 0, &blind) == 0);
    CHECK(run_zones(&f, "templates", z, nz, 0, 3, &placed) == 0);
    CHECK(blind.from_checkpoint >= 1);
    CHECK_EQ_INT(placed.from_checkpoint, 0);
    CHECK(placed.acct.split_ns[PL_SIM_T_REDO] < blind.acct.split_ns[PL_SIM_T_REDO]);
    CHECK(placed.steps > blind.steps);
    /* the zone preempted with notice: placed by rank still, its nodes send the layers no
     * survivor holds during their grace period, and no checkpoint is needed */
    pl_sim_outcome noticed;
    CHECK(run_zones(&f, "templates", z, nz, 30, 0, &noticed) == 0);
    CHECK_EQ_INT(noticed.from_checkpoint, 0);
    CHECK(noticed.reconfigs >= 1 && noticed.bytes_copied > 0);
    CHECK_EQ_INT(noticed.acct.split_ns[PL_SIM_T_REDO], 0);
    pl_sim_outcome_free(&noticed);
    /* a notice shorter than a step (3 s against about 6 s) but long enough for the copies:
     * the step in flight is aborted at the notice, not lost at its end with the zone's
     * layers, so no checkpoint is needed either; only that step's part is redone */
    pl_sim_outcome brief;
    CHECK(run_zones(&f, "templates", z, nz, 3, 0, &brief) == 0);
    CHECK_EQ_INT(brief.from_checkpoint, 0);
    CHECK(brief.bytes_copied > 0);
    CHECK(brief.acct.split_ns[PL_SIM_T_REDO] > 0 &&
          brief.acct.split_ns[PL_SIM_T_REDO] < 6000000000LL);
    CHECK(brief.steps > blind.steps);
    pl_sim_outcome_free(&brief);
    /* no zone loss drawn: the trace as it was */
    pl_trace_event *same;
    int nsame;
    CHECK(pl_spot_trace_zones(tr, 9, 3, 0.0, &same, &nsame, err, sizeof err) == 0);
    CHECK(nsame == 9 && !memcmp(same, tr, sizeof tr));
    CHECK(pl_spot_trace_zones(tr, 9, 0, 0.5, &same, &nsame, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "--zones");
    free(same);
    free(z);
    pl_sim_outcome_free(&blind);
    pl_sim_outcome_free(&placed);
    teardown(&f);
}

static void count_format(void)
{
    const char *text = "2021-12-11, 11:11:30, 3\r\n2021-12-11, 11:13:10, 3\r\n"
                       "2021-12-11, 11:14:50, 1\n2021-12-11, 11:15:50, 2\n";
    pl_trace_event *ev;
    int n;
    char err[256];
    CHECK(pl_spot_trace_parse_counts(text, "t.csv", &ev, &n, err, sizeof err) == 0);
    CHECK_EQ_INT(n, 6);
    CHECK(ev[0].add && ev[0].node == 0 && ev[0].t_ms == 0);
    CHECK(ev[2].add && ev[2].node == 2);
    /* a drop of 2 at 200 s: the newest nodes (2, then 1) */
    CHECK(!ev[3].add && ev[3].node == 2 && ev[3].t_ms == 200000);
    CHECK(!ev[4].add && ev[4].node == 1);
    CHECK(ev[5].add && ev[5].node == 3 && ev[5].t_ms == 260000);
    free(ev);
    /* midnight rolls over by the calendar */
    CHECK(pl_spot_trace_parse_counts("2021-12-31, 23:59:00, 1\n2022-01-01, 00:01:00, 2\n", "t",
                                     &ev, &n, err, sizeof err) == 0);
    CHECK(n == 2 && ev[1].t_ms == 120000);
    free(ev);
    CHECK(pl_spot_trace_parse_counts("2021-12-11, 11:11:30, 3\n11:12, 4\n", "t.csv", &ev, &n, err,
                                     sizeof err) == -1);
    CHECK(strstr(err, "t.csv:2") != NULL);
}

static void scale(void)
{
    const pl_trace_event tr[] = {ADD(0, 0), ADD(0, 1), REMOVE(60, 1)};
    pl_trace_event *out;
    int n;
    char err[256];
    CHECK(pl_spot_trace_scale(tr, 3, 4, &out, &n, err, sizeof err) == 0);
    CHECK_EQ_INT(n, 12);
    CHECK(out[4].add && out[4].node == 4 && out[7].node == 7);
    CHECK(!out[11].add && out[11].node == 7 && out[11].t_ms == 60000);
    int nodes, peak;
    pl_sim_trace_nodes(out, n, &nodes, &peak);
    CHECK(nodes == 8 && peak == 8);
    free(out);
    CHECK(pl_spot_trace_scale(tr, 3, 0, &out, &n, err, sizeof err) == -1);
}

/* A job asking for 4 of the trace's nodes: a preempted one is replaced from the market at
 * once, the oldest first; nodes the trace adds while 4 are held stay in the market. */
static void cap(void)
{
    const pl_trace_event tr[] = {ADD(0, 0), ADD(0, 1), ADD(0, 2), ADD(0, 3), ADD(0, 4), ADD(0, 5),
                                 REMOVE(600, 2), REMOVE(700, 5), REMOVE(900, 4), ADD(960, 6),
                                 ADD(1000, 7), REMOVE(3600, 0), REMOVE(3700, 1)};
    pl_trace_event *out;
    int n;
    char err[256];
    CHECK(pl_spot_trace_cap(tr, 13, 4, &out, &n, err, sizeof err) == 0);
    /* node 4 replaces node 2; node 5 leaves the market; node 4 goes with none to replace it;
     * node 6 is taken (3 held), node 7 waits in the market until node 0 goes */
    const pl_trace_event want[] = {ADD(0, 0), ADD(0, 1), ADD(0, 2), ADD(0, 3), REMOVE(600, 2),
                                   ADD(600, 4), REMOVE(900, 4), ADD(960, 6), REMOVE(3600, 0),
                                   ADD(3600, 7), REMOVE(3700, 1)};
    CHECK_EQ_INT(n, 11);
    for (int i = 0; i < n && i < 11; i++)
        CHECK(out[i].t_ms == want[i].t_ms && out[i].add == want[i].add &&
              out[i].node == want[i].node);
    free(out);
    CHECK(pl_spot_trace_cap(tr, 13, 0, &out, &n, err, sizeof err) == -1);
}

/* The local-machine terms: a ring all-reduce over r pipelines is 2 (r − 1) messages, plus the
 * step's four control messages; one pipeline has no all-reduce. */
static void sync_latency(void)
{
    pl_sim_costs k = {.latency_ns = 1000};
    CHECK(pl_sim_sync_ns(&k, 1) == 4000);
    CHECK(pl_sim_sync_ns(&k, 8) == (14 + 4) * 1000);
    k.latency_ns = 0;
    CHECK(pl_sim_sync_ns(&k, 8) == 0);
}

TEST_MAIN_BEGIN
    RUN(loss_with_copies);
    RUN(fatal_loss_falls_back_to_checkpoint);
    RUN(below_minimum_wait_or_degrade);
    RUN(checkpoint_strategy_redoes_work);
    RUN(redundant_fails_over_without_copies);
    RUN(redundant_step_overhead);
    RUN(redundant_refills_only_changed_shadows);
    RUN(notice_moves_out_without_loss);
    RUN(zone_loss_and_placement);
    RUN(count_format);
    RUN(scale);
    RUN(cap);
    RUN(sync_latency);
TEST_MAIN_END
