/* The coordinator's state machine (operator/runtime/coordinator.h) driven by simulated
 * workers: registration, first plan, steps, commit values, a worker killed mid
 * step (abort, new generation, copies from live holders, the step redone),
 * stale generations, leaving at the step boundary (and sending its layers first, or
 * training on at the minimum), missed heartbeats, too few workers, fatal loss, placement
 * over zones. Every outgoing message must encode (protocol-valid). */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "coordinator.h"
#include "coverage.h"
#include "plan_status.h"
#include "training_schedule.h"
#include "templates.h"

#define L 6
#define GB 16
#define MAXW 16
#define MAXM 256

typedef struct {
    pl_profile p;
    pl_template_set ts;
    pl_coverage cov;
    pl_coord_config cfg;
    pl_coord *c;
    /* the last plan each worker got (index = worker number, names w<i>) */
    int nw;
    int live[MAXW];
    int have_plan[MAXW];
    pl_msg plan[MAXW];
    int64_t gen;
    /* drained messages */
    int nm;
    char to[MAXM][PL_PROTO_NAME_MAX + 1];
    pl_msg m[MAXM];
} sim;

/* 6 layers, one GPU per node, memory such that n0 = 2. */
/* The next sim_init's device memory, per cent of the model's training state (4 × params:
 * 60 % makes pipelines of 2 and more), and its template set's largest pipeline. */
static int sim_memory_pct = 60, sim_nmax = 6;

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
        y->param_bytes = 1000 * (l + 1);
        y->output_bytes = 4096;
        y->fwd_ns[0] = 100000 + 7919 * l;
        y->bwd_ns[0] = 2 * y->fwd_ns[0];
        total += y->param_bytes;
    }
    p->gpu_memory_bytes = 4 * total * sim_memory_pct / 100;
}

static void drain_free(sim *s)
{
    for (int k = 0; k < s->nm; k++)
        pl_msg_free(&s->m[k]);
    s->nm = 0;
}

static int widx(const char *name) { return atoi(name + 1); }

/* Drains the outbox; every message must encode; plans are remembered. */
static int drain(sim *s)
{
    drain_free(s);
    pl_msg m;
    char to[PL_PROTO_NAME_MAX + 1];
    while (pl_coord_next(s->c, to, sizeof to, &m)) {
        char err[256];
        char *js = pl_msg_encode_err(&m, err, sizeof err);
        if (!js) {
            printf("    message %s to %s does not encode: %s\n", pl_msg_type_name(m.type), to, err);
            pl_msg_free(&m);
            return -1;
        }
        free(js);
        if (s->nm == MAXM) {
            pl_msg_free(&m);
            return -1;
        }
        snprintf(s->to[s->nm], sizeof s->to[0], "%s", to);
        if (m.type == PL_MSG_PLAN) {
            int w = widx(to);
            pl_msg_free(&s->plan[w]);
            s->plan[w] = m; /* the copy below shares the arrays: keep only this one */
            s->have_plan[w] = 1;
            s->gen = m.gen;
            pl_msg_init(&s->m[s->nm], PL_MSG_PLAN, m.gen);
            s->m[s->nm].u.plan.generation = m.gen;
            s->m[s->nm].u.plan.step = m.u.plan.step;
        } else {
            s->m[s->nm] = m;
        }
        s->nm++;
    }
    return 0;
}

static int count_type(const sim *s, int type)
{
    int n = 0;
    for (int k = 0; k < s->nm; k++)
        n += s->m[k].type == type;
    return n;
}

static const pl_msg *msg_to(const sim *s, int w, int type)
{
    char name[16];
    snprintf(name, sizeof name, "w%d", w);
    for (int k = 0; k < s->nm; k++)
        if (s->m[k].type == type && strcmp(s->to[k], name) == 0)
            return &s->m[k];
    return NULL;
}

static const char *nm(int w)
{
    static char buf[8][16];
    static int r;
    char *b = buf[r++ % 8];
    snprintf(b, 16, "w%d", w);
    return b;
}

static int in_pipes(const sim *s, int w)
{
    return s->have_plan[w] && s->plan[w].gen == s->gen && s->plan[w].u.plan.you_pipeline >= 0;
}

static int sim_redundant; /* the next sim_init's strategy_redundant */

static int sim_init(sim *s, int64_t steps, int n_start)
{
    char err[256];
    memset(s, 0, sizeof *s);
    make_profile(&s->p);
    if (pl_templates_plan(&s->p, sim_nmax, 1, &s->ts, err, sizeof err) ||
        pl_coverage_compute(&s->ts, sim_nmax, 1, GB, 1, &s->cov, err, sizeof err)) {
        printf("    planner: %s\n", err);
        return -1;
    }
    pl_coord_config *c = &s->cfg;
    c->profile = &s->p;
    c->templates = &s->ts;
    c->coverage = &s->cov;
    c->tolerate = 1;
    c->global_batch = GB;
    c->seq_len = 64;
    c->steps = steps;
    c->lr = 1e-3f;
    c->lr_cosine = 1;
    c->lr_warmup = 1;
    c->lr_min_ratio = 0.1f;
    c->grad_clip = 1.0;
    c->heartbeat_ms = 1000;
    c->n_start = n_start;
    c->job = "test";
    c->strategy_redundant = sim_redundant;
    s->c = pl_coord_new(c, err, sizeof err);
    if (!s->c) {
        printf("    pl_coord_new: %s\n", err);
        return -1;
    }
    return 0;
}

static void sim_free(sim *s)
{
    drain_free(s);
    for (int w = 0; w < MAXW; w++)
        pl_msg_free(&s->plan[w]);
    pl_coord_free(s->c);
    pl_coverage_free(&s->cov);
    pl_template_set_free(&s->ts);
    free(s->p.layers);
}

/* The plans of generation s->gen: every live worker has one; pipelines are the
 * same everywhere, cover the live workers once, microbatches contiguous
 * summing to GB, `you` matches the worker's position. Returns 0 when valid. */
static int plans_valid(const sim *s)
{
    const pl_msg_plan *ref = NULL;
    for (int w = 0; w < s->nw; w++) {
        if (!s->live[w])
            continue;
        if (!s->have_plan[w] || s->plan[w].gen != s->gen) {
            printf("    w%d has no plan of generation %lld\n", w, (long long)s->gen);
            return -1;
        }
        const pl_msg_plan *p = &s->plan[w].u.plan;
        if (!ref)
            ref = p;
        if (p->npipelines != ref->npipelines)
            return -1;
        int64_t first = 0;
        int seen = 0;
        for (int q = 0; q < p->npipelines; q++) {
            const pl_msg_pipeline *pp = &p->pipelines[q];
            if (pp->first_microbatch != first || pp->nnodes != ref->pipelines[q].nnodes)
                return -1;
            first += pp->microbatches;
            for (int j = 0; j < pp->nnodes; j++) {
                int x = widx(pp->nodes[j]);
                if (!s->live[x] || strcmp(pp->nodes[j], ref->pipelines[q].nodes[j]))
                    return -1;
                seen++;
                if (x == w && (p->you_pipeline != q || p->you_stage != j))
                    return -1;
            }
        }
        if (first * p->micro != GB || p->global_batch != GB)
            return -1;
        (void)seen;
        if (p->you_pipeline >= 0) {
            const pl_template *t = pl_template_for(&s->ts, p->pipelines[p->you_pipeline].nnodes);
            if (!t || p->you_layer_begin >= p->you_layer_end)
                return -1;
            if (p->you_stage == 0 && p->you_layer_begin != 0)
                return -1;
            if (p->you_stage == p->pipelines[p->you_pipeline].nnodes - 1 && p->you_layer_end != L)
                return -1;
        }
    }
    return ref ? 0 : -1;
}

static void all_copy_done(sim *s)
{
    for (int w = 0; w < s->nw; w++)
        if (s->live[w])
            pl_coord_copy_done(s->c, nm(w), s->gen, 0);
}

/* Reports (grad_sumsq 0.25 each, loss 2·mb on last stages) and reduced from
 * every pipeline worker except `skip`, for step st. */
static void report_all(sim *s, int64_t st, int skip, int reduced)
{
    for (int w = 0; w < s->nw; w++) {
        if (!s->live[w] || !in_pipes(s, w) || w == skip)
            continue;
        const pl_msg_plan *p = &s->plan[w].u.plan;
        pl_msg_report r = {.step = st, .grad_sumsq = 0.25, .samples_digest = 1};
        if (p->you_layer_end == L) {
            r.has_loss = 1;
            r.loss = 2.0 * (double)p->pipelines[p->you_pipeline].microbatches;
        }
        pl_coord_report(s->c, nm(w), s->gen, &r);
        if (reduced)
            pl_coord_reduced(s->c, nm(w), s->gen, st);
    }
}

static void commit_all(sim *s, int64_t st)
{
    for (int w = 0; w < s->nw; w++)
        if (s->live[w] && in_pipes(s, w))
            pl_coord_committed(s->c, nm(w), s->gen, st);
}

static int npipeworkers(const sim *s)
{
    int n = 0;
    for (int w = 0; w < s->nw; w++)
        n += s->live[w] && in_pipes(s, w);
    return n;
}

static int start_workers(sim *s, int n)
{
    for (int w = 0; w < n; w++) {
        if (pl_coord_worker_registered(s->c, nm(w), NULL, NULL, 0, 0) != PL_COORD_OK)
            return -1;
        s->live[w] = 1;
        s->nw = w + 1;
    }
    return drain(s);
}

/* One full step st, checking start_step, commit values and committed. */
static int run_step(sim *s, int64_t st)
{
    if (pl_coord_phase(s->c) != PL_COORD_RUNNING || pl_coord_step(s->c) != st)
        return -1;
    report_all(s, st, -1, 1);
    if (drain(s) || count_type(s, PL_MSG_COMMIT) != npipeworkers(s))
        return -1;
    int n = npipeworkers(s);
    double norm = sqrt(0.25 * n);
    double scale = norm > 1.0 ? 1.0 / norm : 1.0;
    double lr = pl_lr_at(1e-3f, 1, 1, 0.1f, (int)st, (int)s->cfg.steps);
    for (int k = 0; k < s->nm; k++) {
        const pl_msg_commit *cm = &s->m[k].u.commit;
        if (cm->step != st || fabs(cm->grad_scale - scale) > 1e-12 || cm->lr != lr ||
            s->m[k].gen != s->gen)
            return -1;
    }
    commit_all(s, st);
    return drain(s);
}

static void test_three_steps(void)
{
    sim s;
    CHECK(sim_init(&s, 3, 6) == 0);
    for (int w = 0; w < 5; w++) {
        CHECK_EQ_INT(pl_coord_worker_registered(s.c, nm(w), NULL, NULL, 0, 0), PL_COORD_OK);
        s.live[w] = 1;
        s.nw = w + 1;
    }
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_WELCOME), 5);
    CHECK_EQ_INT(msg_to(&s, 3, PL_MSG_WELCOME)->u.welcome.rank, 3);
    CHECK_EQ_INT(msg_to(&s, 3, PL_MSG_WELCOME)->u.welcome.heartbeat_ms, 1000);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_WAITING_FOR_WORKERS);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w2", NULL, NULL, 0, 0), PL_COORD_ERR);
    CHECK_STR_CONTAINS(pl_coord_error(s.c), "already");
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w5", NULL, NULL, 0, 0), PL_COORD_OK);
    s.live[5] = 1;
    s.nw = 6;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_WELCOME), 1);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 6);
    CHECK_EQ_INT(s.gen, 1);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK(plans_valid(&s) == 0);
    /* the coverage entry for 6 nodes, filled in rank order */
    const pl_instance_plan *e = &s.cov.entries[0];
    CHECK_EQ_INT(e->nodes, 6);
    const pl_msg_plan *p0 = &s.plan[0].u.plan;
    CHECK_EQ_INT(p0->npipelines, e->npipelines);
    for (int q = 0, k = 0; q < e->npipelines; q++)
        for (int j = 0; j < p0->pipelines[q].nnodes; j++, k++)
            CHECK(strcmp(p0->pipelines[q].nodes[j], nm(k)) == 0);
    CHECK_EQ_INT(p0->ncopies, 0);
    CHECK_EQ_INT(p0->nsends, 0);
    CHECK_EQ_INT(p0->step, 0);
    CHECK(p0->npeers >= 1);
    /* unknown worker, stale/ahead generation */
    CHECK_EQ_INT(pl_coord_copy_done(s.c, "nobody", 1, 0), PL_COORD_ERR);
    CHECK_STR_CONTAINS(pl_coord_error(s.c), "unknown worker");
    CHECK_EQ_INT(pl_coord_copy_done(s.c, "w0", 0, 0), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_copy_done(s.c, "w0", 2, 0), PL_COORD_ERR);
    for (int w = 0; w < 5; w++)
        CHECK_EQ_INT(pl_coord_copy_done(s.c, nm(w), 1, 0), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.nm, 0);
    CHECK_EQ_INT(pl_coord_copy_done(s.c, "w5", 1, 0), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_START_STEP), 6);
    CHECK_EQ_INT(s.m[0].u.start_step.step, 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_START_STEP), 6);
    CHECK(run_step(&s, 1) == 0);
    CHECK(run_step(&s, 2) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 6);
    CHECK_EQ_INT(s.m[0].u.stop.exit_code, 0);
    CHECK(strcmp(s.m[0].u.stop.reason, "done") == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_DONE);
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 3);
    CHECK_EQ_INT(pl_coord_nreconfigs(s.c), 0);
    for (int k = 0; k < 3; k++) {
        const pl_coord_step_rec *r = pl_coord_step_log(s.c, k);
        CHECK_EQ_INT(r->step, k);
        CHECK(fabs(r->loss - 2.0) < 1e-12); /* Σ 2·mb / GB */
        CHECK(fabs(r->norm - sqrt(1.5)) < 1e-12);
        CHECK(fabs(r->grad_scale - 1 / sqrt(1.5)) < 1e-12);
        CHECK(r->lr == pl_lr_at(1e-3f, 1, 1, 0.1f, k, 3));
        CHECK_EQ_INT(r->generation, 1);
        CHECK(r->pipelines[0] >= '1' && strchr(r->pipelines, 'x'));
    }
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "late", NULL, NULL, 0, 0), PL_COORD_ERR);
    sim_free(&s);
}

/* Did worker w hold layer l under plan p (of any worker)? */
static int held(const pl_msg_plan *p, int w, int l, const pl_template_set *ts)
{
    for (int q = 0; q < p->npipelines; q++)
        for (int j = 0; j < p->pipelines[q].nnodes; j++) {
            if (widx(p->pipelines[q].nodes[j]) != w)
                continue;
            const pl_template *t = pl_template_for(ts, p->pipelines[q].nnodes);
            for (int k = 0; k < t->nstages; k++)
                if (t->stages[k].node == j && t->stages[k].layer_begin <= l &&
                    l < t->stages[k].layer_end)
                    return 1;
        }
    return 0;
}

static int begin_run(sim *s, int64_t steps, int n)
{
    if (sim_init(s, steps, n) || start_workers(s, n) || plans_valid(s))
        return -1;
    all_copy_done(s);
    return drain(s);
}

/* A new coordinator takes s's job over from status.plan (plan_status.h, written and
 * read back as text) with status.step `step`, and replaces s->c. 0, or -1. */
static int take_over(sim *s, int64_t step)
{
    char err[256] = "";
    cJSON *js = pl_plan_status_json(s->c);
    char *text = js ? cJSON_PrintUnformatted(js) : NULL;
    cJSON *back = text ? cJSON_Parse(text) : NULL;
    pl_plan_status st = {0};
    pl_coord *c2 = pl_coord_new(&s->cfg, err, sizeof err);
    int rc = c2 && back && !pl_plan_status_read(back, &st, err, sizeof err) ? 0 : -1;
    if (!rc && pl_coord_restore(c2, st.generation, step, st.pipes, st.npipes, 500)) {
        snprintf(err, sizeof err, "%s", pl_coord_error(c2));
        rc = -1;
    }
    if (rc)
        printf("    take over: %s\n", err);
    pl_plan_status_free(&st);
    cJSON_Delete(back);
    free(text);
    cJSON_Delete(js);
    if (rc) {
        pl_coord_free(c2);
        return -1;
    }
    pl_coord_free(s->c);
    s->c = c2;
    return pl_coord_phase(c2) == PL_COORD_RESUMING ? 0 : -1;
}

/* The live workers of s (but `skip`) register again and resume, their last step
 * `committed`; 0, or -1. */
static int resume_all(sim *s, int skip, int64_t committed)
{
    for (int w = 0; w < s->nw; w++) {
        if (!s->live[w] || w == skip)
            continue;
        pl_msg_hello_resume h = {committed, 0.5, 1e-3, -1};
        if (pl_coord_worker_registered(s->c, nm(w), NULL, NULL, 0, 10) != PL_COORD_OK ||
            pl_coord_hello_resume(s->c, nm(w), s->gen, &h) == PL_COORD_ERR)
            return -1;
    }
    return drain(s);
}

static void test_kill_mid_step(void)
{
    sim s;
    CHECK(begin_run(&s, 5, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    /* step 1: half the reports, then w1 dies */
    pl_msg old;
    pl_msg_init(&old, PL_MSG_NONE, 0);
    old = s.plan[0]; /* keep generation 1's plan to check copy sources */
    s.have_plan[0] = 0;
    memset(&s.plan[0], 0, sizeof s.plan[0]);
    report_all(&s, 1, 1, 0);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.nm, 0);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w1", "closed connection"), PL_COORD_OK);
    s.live[1] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 5);
    const pl_msg *ab = msg_to(&s, 0, PL_MSG_ABORT);
    CHECK(ab && ab->u.abort_.step == 1 && ab->gen == 1);
    CHECK(msg_to(&s, 1, PL_MSG_ABORT) == NULL);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 5);
    CHECK_EQ_INT(s.gen, 2);
    CHECK_EQ_INT(pl_coord_generation(s.c), 2);
    CHECK(plans_valid(&s) == 0);
    /* copies come from live holders of generation 1; sends mirror them */
    int ncopies = 0, nsends = 0;
    for (int w = 0; w < 6; w++) {
        if (!s.live[w])
            continue;
        const pl_msg_plan *p = &s.plan[w].u.plan;
        CHECK_EQ_INT(p->step, 1);
        for (int k = 0; k < p->ncopies; k++) {
            int src = widx(p->copies[k].source);
            CHECK(s.live[src]);
            CHECK(held(&old.u.plan, src, p->copies[k].layer, &s.ts));
            CHECK(p->copies[k].layer >= p->you_layer_begin && p->copies[k].layer < p->you_layer_end);
            const pl_msg_plan *sp = &s.plan[src].u.plan;
            int found = 0;
            for (int j = 0; j < sp->nsends; j++)
                found |= sp->sends[j].layer == p->copies[k].layer &&
                         strcmp(sp->sends[j].dest, nm(w)) == 0;
            CHECK(found);
            int peer = 0;
            for (int j = 0; j < p->npeers; j++)
                peer |= strcmp(p->peers[j].name, p->copies[k].source) == 0;
            CHECK(peer);
            ncopies++;
        }
        nsends += p->nsends;
    }
    CHECK_EQ_INT(ncopies, nsends);
    pl_msg_free(&old);
    /* stale generation messages are ignored */
    pl_msg_report r = {.step = 1, .grad_sumsq = 0.25};
    CHECK_EQ_INT(pl_coord_report(s.c, "w0", 1, &r), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_reduced(s.c, "w0", 1, 1), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_copy_done(s.c, "w0", 1, 0), PL_COORD_IGNORED);
    /* messages from the dead worker are errors */
    CHECK_EQ_INT(pl_coord_heartbeat(s.c, "w1", 1, 10), PL_COORD_ERR);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w1", "again"), PL_COORD_IGNORED);
    for (int w = 0; w < 6; w++)
        if (s.live[w])
            CHECK_EQ_INT(pl_coord_copy_done(s.c, nm(w), 2, 100), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_START_STEP), npipeworkers(&s));
    CHECK_EQ_INT(s.m[0].u.start_step.step, 1);
    CHECK_EQ_INT(s.m[0].gen, 2);
    CHECK(run_step(&s, 1) == 0);
    CHECK(run_step(&s, 2) == 0);
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 3);
    CHECK_EQ_INT(pl_coord_step_log(s.c, 1)->generation, 2);
    CHECK_EQ_INT(pl_coord_nreconfigs(s.c), 1);
    const pl_coord_reconfig_rec *rc = pl_coord_reconfig(s.c, 0);
    CHECK_EQ_INT(rc->generation, 2);
    CHECK_EQ_INT(rc->step, 1);
    CHECK_STR_CONTAINS(rc->cause, "lost w1 (closed connection)");
    CHECK(strcmp(rc->removed, "w1") == 0);
    CHECK(strcmp(rc->added, "") == 0);
    CHECK_EQ_INT(rc->bytes_copied, 500);
    CHECK(rc->bytes_planned >= 0);
    sim_free(&s);
}

/* Strategy redundant (docs/redundant.md): a lost stage whose predecessor survives fails
 * over without copies: the same pipelines less the lost worker, the predecessor's range
 * [own.begin, lost.end), the same microbatches, the step redone. Then two consecutive
 * losses: no failover, copies from live holders. */
/* A redundant run of 6 workers after step 0: the worker at `stage` of a pipeline of at
 * least 3 stages (its pipeline in *q), or -1 (s freed). */
static int redundant_run_victim(sim *s, int stage, int *q)
{
    sim_redundant = 1;
    const int begun = begin_run(s, 6, 6) == 0 && run_step(s, 0) == 0;
    sim_redundant = 0;
    for (int w = 0; begun && w < 6; w++) {
        const pl_msg_plan *p = &s->plan[w].u.plan;
        if (p->you_pipeline >= 0 && p->you_stage == stage &&
            p->pipelines[p->you_pipeline].nnodes >= 3) {
            *q = p->you_pipeline;
            return w;
        }
    }
    sim_free(s);
    return -1;
}

static void test_redundant_failover(void)
{
    sim s;
    int q;
    const int victim = redundant_run_victim(&s, 1, &q);
    CHECK(victim >= 0);
    const int holder = widx(s.plan[victim].u.plan.pipelines[q].nodes[0]);
    const int n = s.plan[victim].u.plan.pipelines[q].nnodes;
    const int vend = s.plan[victim].u.plan.you_layer_end;
    report_all(&s, 1, 1, 0);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, nm(victim), "closed connection"), PL_COORD_OK);
    s.live[victim] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.gen, 2);
    for (int w = 0; w < 6; w++) {
        if (!s.live[w])
            continue;
        const pl_msg_plan *p = &s.plan[w].u.plan;
        CHECK(p->step == 1 && p->ncopies == 0 && p->nsends == 0 && !p->has_checkpoint);
        CHECK_EQ_INT(p->pipelines[q].nnodes, n - 1);
    }
    const pl_msg_plan *hp = &s.plan[holder].u.plan;
    CHECK(hp->you_pipeline == q && hp->you_stage == 0 && hp->you_layer_begin == 0 &&
          hp->you_layer_end == vend);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    const pl_coord_reconfig_rec *r = pl_coord_reconfig(s.c, 0);
    CHECK(r && r->bytes_planned == 0 && !r->from_checkpoint && strstr(r->cause, "failover"));
    CHECK(run_step(&s, 1) == 0);
    /* the holder and its new successor at once: no shadow covers the holder */
    const int next = widx(hp->pipelines[q].nodes[1]);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, nm(holder), "closed connection"), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, nm(next), "closed connection"), PL_COORD_OK);
    s.live[holder] = s.live[next] = 0;
    CHECK(drain(&s) == 0);
    int ncopies = 0;
    for (int w = 0; w < 6; w++)
        if (s.live[w] && s.plan[w].gen == s.gen)
            ncopies += s.plan[w].u.plan.ncopies;
    CHECK(ncopies > 0 || pl_coord_phase(s.c) == PL_COORD_WAITING_FOR_NODES);
    sim_free(&s);
}

/* Strategy redundant, stage 0 of a pipeline of n ≥ 3 lost: its shadow is on the last
 * stage (Bamboo's ring, §5.1), which becomes the first stage with [0, b1); stage n − 2
 * runs its own range and the last stage's to the end; nothing copied, the same
 * microbatches, the step redone. */
static void test_redundant_failover_of_the_first_stage(void)
{
    sim s;
    int q;
    const int victim = redundant_run_victim(&s, 0, &q);
    CHECK(victim >= 0);
    const pl_msg_pipeline old = s.plan[victim].u.plan.pipelines[q];
    const int n = old.nnodes, last = widx(old.nodes[n - 1]), merged = widx(old.nodes[n - 2]);
    const int b1 = s.plan[victim].u.plan.you_layer_end;
    const pl_msg_plan *mp = &s.plan[merged].u.plan;
    const int mbegin = mp->you_layer_begin, mb = mp->pipelines[q].microbatches;
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, nm(victim), "closed connection"), PL_COORD_OK);
    s.live[victim] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.gen, 2);
    for (int w = 0; w < 6; w++)
        if (s.live[w]) {
            const pl_msg_plan *p = &s.plan[w].u.plan;
            CHECK(p->step == 1 && p->ncopies == 0 && p->nsends == 0 && !p->has_checkpoint);
            CHECK_EQ_INT(p->pipelines[q].nnodes, n - 1);
            CHECK_EQ_INT(p->pipelines[q].microbatches, mb);
        }
    const pl_msg_plan *lp = &s.plan[last].u.plan, *np = &s.plan[merged].u.plan;
    CHECK(lp->you_pipeline == q && lp->you_stage == 0 && lp->you_layer_begin == 0 &&
          lp->you_layer_end == b1);
    CHECK(np->you_pipeline == q && np->you_stage == n - 2 && np->you_layer_begin == mbegin &&
          np->you_layer_end == lp->pipelines[q].layers[n - 1]);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    const pl_coord_reconfig_rec *r = pl_coord_reconfig(s.c, 0);
    CHECK(r && r->bytes_planned == 0 && !r->from_checkpoint && strstr(r->cause, "failover"));
    CHECK(run_step(&s, 1) == 0);
    sim_free(&s);
}

/* What each worker holds under its current plan: engine [lb, le), shadow [sb, se) (its
 * successor's layers on the pipeline's ring; empty on a one-stage pipeline). */
typedef struct {
    int lb[MAXW], le[MAXW], sb[MAXW], se[MAXW];
} holdings;

static void take_holdings(const sim *s, holdings *h)
{
    memset(h, 0, sizeof *h);
    for (int w = 0; w < s->nw; w++) {
        const pl_msg_plan *p = &s->plan[w].u.plan;
        h->lb[w] = h->le[w] = h->sb[w] = h->se[w] = 0;
        if (!s->live[w] || s->plan[w].gen != s->gen || p->you_pipeline < 0) continue;
        h->lb[w] = p->you_layer_begin;
        h->le[w] = p->you_layer_end;
        const pl_msg_pipeline *pp = &p->pipelines[p->you_pipeline];
        if (pp->nnodes < 2) continue;
        const int succ = widx(pp->nodes[(p->you_stage + 1) % pp->nnodes]);
        h->sb[w] = s->plan[succ].u.plan.you_layer_begin;
        h->se[w] = s->plan[succ].u.plan.you_layer_end;
    }
}

/* Every layer of every live worker's new plan is one it held (h) or one copied to it. */
static int layers_sourced(const sim *s, const holdings *h)
{
    for (int w = 0; w < s->nw; w++) {
        const pl_msg_plan *p = &s->plan[w].u.plan;
        if (!s->live[w] || p->you_pipeline < 0) continue;
        for (int l = p->you_layer_begin; l < p->you_layer_end; l++) {
            int ok = (h->lb[w] <= l && l < h->le[w]) || (h->sb[w] <= l && l < h->se[w]);
            for (int k = 0; !ok && k < p->ncopies; k++)
                ok = p->copies[k].layer == l;
            if (!ok) return -1;
        }
    }
    return 0;
}

/* Strategy redundant, stage 0 lost, then a node joins: the layout is restored, and the
 * last stage, which ran [0, b1) since the failover and no longer holds its own layers,
 * gets every layer of its new range from a holder (it held them before the failover
 * only). */
static void test_redundant_join_after_a_first_stage_failover(void)
{
    sim s;
    sim_redundant = 1;
    sim_memory_pct = 30; /* pipelines of 4: the ring's wrap moves the last stage's layers */
    sim_nmax = 9;
    const int begun = begin_run(&s, 6, 8) == 0 && run_step(&s, 0) == 0;
    sim_redundant = 0;
    sim_memory_pct = 60;
    sim_nmax = 6;
    CHECK(begun);
    if (!begun)
        return;
    const pl_msg_plan *p0 = &s.plan[0].u.plan;
    const int q = p0->you_pipeline, n = p0->pipelines[q].nnodes;
    CHECK_EQ_INT(n, 4);
    const int victim = widx(p0->pipelines[q].nodes[0]);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, nm(victim), "closed connection"), PL_COORD_OK);
    s.live[victim] = 0;
    CHECK(drain(&s) == 0);
    CHECK(strstr(pl_coord_reconfig(s.c, 0)->cause, "failover"));
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 1) == 0);
    holdings h;
    take_holdings(&s, &h);
    const int64_t g = s.gen;
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w8", NULL, NULL, 0, 20), PL_COORD_OK);
    s.live[8] = 1;
    s.nw = 9;
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 2) == 0); /* the join takes effect after the step in flight */
    CHECK_EQ_INT(s.gen, g + 1);
    CHECK(layers_sourced(&s, &h) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 3) == 0);
    sim_free(&s);
}

/* The victim of a failover: its pipeline q (of n stages), its layers [vb, ve), and the
 * stage that took them over. */
typedef struct {
    int victim, q, n, vb, ve, holder;
} failed_over;

/* A redundant run whose stage 1 (f's victim) failed over and ran step 1 under the merged
 * plan: 0, or -1. */
static int redundant_failed_over(sim *s, failed_over *f)
{
    if ((f->victim = redundant_run_victim(s, 1, &f->q)) < 0)
        return -1;
    const pl_msg_plan *vp = &s->plan[f->victim].u.plan;
    f->n = vp->pipelines[f->q].nnodes;
    f->vb = vp->you_layer_begin;
    f->ve = vp->you_layer_end;
    f->holder = widx(vp->pipelines[f->q].nodes[0]);
    if (pl_coord_worker_lost(s->c, nm(f->victim), "closed connection") != PL_COORD_OK)
        return -1;
    s->live[f->victim] = 0;
    if (drain(s))
        return -1;
    all_copy_done(s);
    return drain(s) || run_step(s, 1) ? -1 : 0;
}

/* Every copy of the current plan goes to worker `to`, from worker `from`: the copies'
 * count, or -1. */
static int copies_only(const sim *s, int to, int from)
{
    int n = 0;
    for (int w = 0; w < s->nw; w++) {
        const pl_msg_plan *p = &s->plan[w].u.plan;
        if (s->live[w] && (s->plan[w].gen != s->gen || (w != to && p->ncopies)))
            return -1;
        for (int k = 0; s->live[w] && w == to && k < p->ncopies; k++, n++)
            if (widx(p->copies[k].source) != from)
                return -1;
    }
    return n;
}

/* Strategy redundant, the operator leader changes during a failover: the new coordinator
 * takes over the merged plan from status.plan (its bounds and its template's workers)
 * and resumes it as it was, every worker on the layers it holds: nothing copied, no
 * checkpoint. A join then restores the template's layout, the new worker in the lost
 * one's place, its layers from the failover holder (docs/redundant.md). */
static void test_redundant_restore_resumes_a_failover(void)
{
    sim s;
    failed_over f;
    CHECK(redundant_failed_over(&s, &f) == 0);
    int lb[MAXW], le[MAXW];
    for (int w = 0; w < s.nw; w++) {
        lb[w] = s.plan[w].u.plan.you_layer_begin;
        le[w] = s.plan[w].u.plan.you_layer_end;
    }
    const int64_t g = s.gen;
    CHECK(take_over(&s, 2) == 0);
    CHECK(resume_all(&s, -1, 1) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK_EQ_INT(s.gen, g + 1);
    for (int w = 0; w < s.nw; w++)
        if (s.live[w]) {
            const pl_msg_plan *p = &s.plan[w].u.plan;
            CHECK(p->step == 2 && p->ncopies == 0 && p->nsends == 0 && !p->has_checkpoint);
            CHECK(p->you_layer_begin == lb[w] && p->you_layer_end == le[w]);
            CHECK_EQ_INT(p->pipelines[f.q].nnodes, f.n - 1);
        }
    const pl_coord_reconfig_rec *r = pl_coord_reconfig(s.c, 0);
    CHECK(r && r->bytes_planned == 0 && !r->from_checkpoint);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 2) == 0);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w6", NULL, NULL, 0, 20), PL_COORD_OK);
    s.live[6] = 1;
    s.nw = 7;
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 3) == 0);
    const pl_msg_plan *jp = &s.plan[6].u.plan;
    CHECK(jp->you_pipeline == f.q && jp->pipelines[f.q].nnodes == f.n);
    CHECK(jp->you_layer_begin == f.vb && jp->you_layer_end == f.ve);
    CHECK(copies_only(&s, 6, f.holder) >= f.ve - f.vb);
    sim_free(&s);
}

/* Strategy redundant, a worker of the failed-over pipeline does not come back to the new
 * coordinator: a loss of the restored plan, so its shadow holder fails over again from the
 * merged bounds, nothing copied. */
static void test_redundant_restore_without_a_worker_fails_over(void)
{
    sim s;
    failed_over f;
    CHECK(redundant_failed_over(&s, &f) == 0);
    const pl_msg_plan *hp = &s.plan[f.holder].u.plan;
    const int next = widx(hp->pipelines[f.q].nodes[1]), end = s.plan[next].u.plan.you_layer_end;
    CHECK(take_over(&s, 2) == 0);
    CHECK_EQ_INT(pl_coord_tick(s.c, 0), PL_COORD_IGNORED); /* starts the 500 ms wait */
    CHECK(resume_all(&s, next, 1) == 0);
    s.live[next] = 0;
    pl_coord_tick(s.c, 600);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK_EQ_INT(copies_only(&s, -1, -1), 0);
    hp = &s.plan[f.holder].u.plan;
    CHECK(hp->you_pipeline == f.q && hp->you_layer_begin == 0 && hp->you_layer_end == end);
    CHECK(!hp->has_checkpoint && hp->pipelines[f.q].nnodes == f.n - 2);
    const pl_coord_reconfig_rec *r = pl_coord_reconfig(s.c, 0);
    CHECK(r && r->bytes_planned == 0 && strstr(r->cause, "failover"));
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 2) == 0);
    sim_free(&s);
}

/* A lost worker's name registering again: the live coordinator refuses it (the name is
 * the lost worker's); a new coordinator that knows it only from a failover's template
 * takes it as a new worker joining, not as the plan's member: its hello_resume is
 * ignored and it gets the lost place's layers copied from the failover holder. */
static void test_redundant_restore_a_lost_name_joins_anew(void)
{
    sim s;
    failed_over f;
    CHECK(redundant_failed_over(&s, &f) == 0);
    const int victim = f.victim;
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, nm(victim), NULL, NULL, 0, 10), PL_COORD_ERR);
    CHECK_STR_CONTAINS(pl_coord_error(s.c), "use a new name");
    CHECK(take_over(&s, 2) == 0);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, nm(victim), NULL, NULL, 0, 10), PL_COORD_OK);
    pl_msg_hello_resume h = {1, 0.5, 1e-3, -1};
    CHECK_EQ_INT(pl_coord_hello_resume(s.c, nm(victim), s.gen, &h), PL_COORD_IGNORED);
    s.live[victim] = 1;
    CHECK(resume_all(&s, victim, 1) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    const pl_msg_plan *vp = &s.plan[victim].u.plan;
    CHECK(vp->you_pipeline == f.q && vp->you_layer_begin == f.vb && vp->you_layer_end == f.ve);
    CHECK(copies_only(&s, victim, f.holder) >= f.ve - f.vb);
    const pl_coord_reconfig_rec *r = pl_coord_reconfig(s.c, 0);
    CHECK(r && !strcmp(r->added, nm(victim)) && !r->from_checkpoint);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 2) == 0);
    sim_free(&s);
}

/* A coordinator started afresh (no plan taken over) and a worker that holds a plan's
 * state (its hello_resume at generation 5): lost and told to end, not planned for. */
static void test_fresh_coordinator_stops_a_worker_with_state(void)
{
    sim s;
    CHECK(sim_init(&s, 6, 4) == 0 && start_workers(&s, 3) == 0);
    pl_msg_hello_resume h = {7, 0.5, 1e-3, -1};
    CHECK_EQ_INT(pl_coord_hello_resume(s.c, "w1", 5, &h), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    const pl_msg *st = msg_to(&s, 1, PL_MSG_STOP);
    CHECK(st && st->u.stop.exit_code == 1 &&
          strstr(st->u.stop.reason, "plan generation 5, which this coordinator did not take"));
    CHECK_EQ_INT(pl_coord_live_workers(s.c), 2);
    s.live[1] = 0;
    for (int w = 3; w < 5; w++) {
        CHECK_EQ_INT(pl_coord_worker_registered(s.c, nm(w), NULL, NULL, 0, 0), PL_COORD_OK);
        s.live[w] = 1;
    }
    s.nw = 5;
    CHECK(drain(&s) == 0);
    CHECK(!in_pipes(&s, 1) && in_pipes(&s, 0) && in_pipes(&s, 2) && in_pipes(&s, 3) &&
          in_pipes(&s, 4));
    sim_free(&s);
}

static void test_loss_after_commit(void)
{
    sim s;
    CHECK(begin_run(&s, 4, 6) == 0);
    report_all(&s, 0, -1, 1);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_COMMIT), 6);
    /* w2 dies after commit was sent: the step stands */
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w2", "process ended"), PL_COORD_OK);
    s.live[2] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.nm, 0);
    commit_all(&s, 0);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 1);
    CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 5);
    CHECK_EQ_INT(s.gen, 2);
    CHECK(plans_valid(&s) == 0);
    CHECK_EQ_INT(s.plan[0].u.plan.step, 1);
    sim_free(&s);
}

static void test_leaving_at_boundary(void)
{
    sim s;
    CHECK(begin_run(&s, 5, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    report_all(&s, 1, -1, 0);
    CHECK_EQ_INT(pl_coord_leaving(s.c, "w4", PL_LEAVE_SIGTERM, 0), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.nm, 0); /* no abort: the step finishes */
    for (int w = 0; w < 6; w++)
        pl_coord_reduced(s.c, nm(w), 1, 1);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_COMMIT), 6);
    commit_all(&s, 1);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 2);
    const pl_msg *st = msg_to(&s, 4, PL_MSG_STOP);
    CHECK(st && st->u.stop.exit_code == 0);
    CHECK(msg_to(&s, 4, PL_MSG_PLAN) == NULL);
    s.live[4] = 0;
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 5);
    CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 0);
    CHECK(plans_valid(&s) == 0);
    CHECK_EQ_INT(s.plan[0].u.plan.step, 2);
    const pl_coord_reconfig_rec *rc = pl_coord_reconfig(s.c, 0);
    CHECK(rc != NULL);
    CHECK_STR_CONTAINS(rc->cause, "leaving w4 (sigterm)");
    CHECK(strcmp(rc->removed, "w4") == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 2) == 0);
    sim_free(&s);
}

/* w1 and w4, the only holders of layers [2, 4) (rank order: the pipelines w0 w1 w2 and
 * w3 w4 w5), get their notice together: at the boundary they leave the pipelines but send
 * those layers to the survivors first (idle in the plan, with sends), and are stopped only
 * when every copy is done. No checkpoint is read. Lost instead, the same layers are gone. */
static void test_notice_keeps_copy_sources(void)
{
    sim s;
    CHECK(begin_run(&s, 9, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK(s.plan[1].u.plan.you_layer_begin == s.plan[4].u.plan.you_layer_begin &&
          s.plan[1].u.plan.you_layer_end == s.plan[4].u.plan.you_layer_end);
    CHECK_EQ_INT(pl_coord_leaving(s.c, "w1", PL_LEAVE_SIGTERM, 0), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_leaving(s.c, "w4", PL_LEAVE_SIGTERM, 0), PL_COORD_OK);
    CHECK(run_step(&s, 1) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    const pl_coord_reconfig_rec *rec = pl_coord_reconfig(s.c, 0);
    CHECK(rec && !rec->from_checkpoint && rec->bytes_planned > 0);
    CHECK(msg_to(&s, 1, PL_MSG_STOP) == NULL && msg_to(&s, 4, PL_MSG_STOP) == NULL);
    int sends = 0;
    for (int w = 1; w < 5; w += 3) {
        const pl_msg_plan *p = &s.plan[w].u.plan;
        CHECK(s.plan[w].gen == s.gen && p->you_pipeline == -1);
        sends += p->nsends;
    }
    CHECK(sends > 0);
    pl_coord_worker_view v;
    CHECK(pl_coord_worker_view_at(s.c, 1, &v) == 0 && !strcmp(v.name, "w1") && !v.live &&
          v.departing && v.pipeline == -1);
    s.live[1] = s.live[4] = 0; /* out of the plan: copy_done comes from the others */
    CHECK(plans_valid(&s) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(msg_to(&s, 1, PL_MSG_STOP) && msg_to(&s, 4, PL_MSG_STOP));
    CHECK(pl_coord_worker_view_at(s.c, 1, &v) == 0 && !v.departing);
    CHECK_EQ_INT(count_type(&s, PL_MSG_START_STEP), 4);
    sim_free(&s);

    /* their notice runs out before the copies are done: planned again without them */
    CHECK(begin_run(&s, 9, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK_EQ_INT(pl_coord_leaving(s.c, "w1", PL_LEAVE_SIGTERM, 0), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_leaving(s.c, "w4", PL_LEAVE_SIGTERM, 0), PL_COORD_OK);
    CHECK(run_step(&s, 1) == 0);
    const int64_t g = s.gen;
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w1", "preempted"), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w4", "preempted"), PL_COORD_OK);
    s.live[1] = s.live[4] = 0;
    CHECK(drain(&s) == 0);
    CHECK(s.gen > g);
    rec = pl_coord_reconfig(s.c, pl_coord_nreconfigs(s.c) - 1);
    CHECK(rec && rec->from_checkpoint);
    CHECK_STR_CONTAINS(rec->cause, "before its copies were sent");
    sim_free(&s);
}

/* w4 is lost and the survivors copy; then w1, the other holder of w4's layers (rank order:
 * the pipelines w0 w1 w2 and w3 w4 w5), gets a notice: planned again at once, not after the
 * copies and a step, w1 a departing copy source of those layers, no checkpoint read. */
static void test_notice_during_copies(void)
{
    sim s;
    CHECK(begin_run(&s, 9, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w4", "preempted"), PL_COORD_OK);
    s.live[4] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    const int64_t g = s.gen;
    CHECK_EQ_INT(pl_coord_leaving(s.c, "w1", PL_LEAVE_SIGTERM, 2000), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.gen, g + 1);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    const pl_coord_reconfig_rec *rec = pl_coord_reconfig(s.c, pl_coord_nreconfigs(s.c) - 1);
    CHECK(rec && !rec->from_checkpoint && rec->bytes_planned > 0);
    CHECK_STR_CONTAINS(rec->cause, "leaving w1 (sigterm)");
    pl_coord_worker_view v;
    CHECK(pl_coord_worker_view_at(s.c, 1, &v) == 0 && v.departing && v.pipeline == -1);
    CHECK(s.plan[1].gen == s.gen && s.plan[1].u.plan.nsends > 0);
    s.live[1] = 0;
    CHECK(plans_valid(&s) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(msg_to(&s, 1, PL_MSG_STOP) != NULL);
    CHECK_EQ_INT(count_type(&s, PL_MSG_START_STEP), 4);
    sim_free(&s);
}

/* 4 workers, (F + 1)·n0 = 4: a worker under notice trains on (moving it out would stop the
 * job early) until it goes; then the job waits for nodes, as after a loss without notice. */
static void test_notice_held_at_the_minimum(void)
{
    sim s;
    CHECK(begin_run(&s, 9, 4) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK_EQ_INT(pl_coord_leaving(s.c, "w3", PL_LEAVE_SIGTERM, 0), PL_COORD_OK);
    const int64_t g = s.gen;
    CHECK(run_step(&s, 1) == 0);
    CHECK(run_step(&s, 2) == 0);
    CHECK_EQ_INT(s.gen, g);
    CHECK(msg_to(&s, 3, PL_MSG_STOP) == NULL);
    CHECK_EQ_INT(pl_coord_nreconfigs(s.c), 0);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w3", "preempted"), PL_COORD_OK);
    s.live[3] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_WAITING_FOR_NODES);
    sim_free(&s);
}

static void test_join_and_heartbeats(void)
{
    sim s;
    CHECK(begin_run(&s, 6, 5) == 0);
    CHECK(run_step(&s, 0) == 0);
    /* a sixth worker joins mid-step: planned at the boundary */
    report_all(&s, 1, -1, 0);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w5", NULL, "10.0.0.5", 7005, 0), PL_COORD_OK);
    s.live[5] = 1;
    s.nw = 6;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_WELCOME), 1);
    CHECK_EQ_INT(s.m[0].u.welcome.rank, 5);
    for (int w = 0; w < 5; w++)
        pl_coord_reduced(s.c, nm(w), 1, 1);
    CHECK(drain(&s) == 0);
    commit_all(&s, 1);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 6);
    CHECK(plans_valid(&s) == 0);
    CHECK(strcmp(pl_coord_reconfig(s.c, 0)->added, "w5") == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 2) == 0);
    /* heartbeats: everybody but w3 at t=2500; at t=3500 w3 (silent since 0) is lost */
    for (int w = 0; w < 6; w++)
        if (w != 3)
            CHECK_EQ_INT(pl_coord_heartbeat(s.c, nm(w), 3, 2500), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_tick(s.c, 2999), PL_COORD_IGNORED);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.nm, 0);
    CHECK_EQ_INT(pl_coord_worker_silent(s.c, "w3"), 0);
    CHECK_EQ_INT(pl_coord_tick(s.c, 3500), PL_COORD_OK);
    s.live[3] = 0;
    /* hung, maybe: the front end ends it; a worker lost otherwise is not silent */
    CHECK_EQ_INT(pl_coord_worker_silent(s.c, "w3"), 1);
    CHECK_EQ_INT(pl_coord_worker_silent(s.c, "w0"), 0);
    CHECK_EQ_INT(pl_coord_worker_silent(s.c, "zz"), 0);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 5);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 5);
    CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 1); /* to w3, should it still hear */
    CHECK(plans_valid(&s) == 0);
    CHECK_STR_CONTAINS(pl_coord_reconfig(s.c, 1)->cause, "lost w3 (missed heartbeats)");
    /* on_msg: a heartbeat through the dispatcher */
    pl_msg hb;
    pl_msg_init(&hb, PL_MSG_HEARTBEAT, s.gen);
    CHECK_EQ_INT(pl_coord_on_msg(s.c, "w0", &hb, 4000), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_on_msg(s.c, "zz", &hb, 4000), PL_COORD_ERR);
    sim_free(&s);
}

static void test_insufficient_then_join(void)
{
    sim s;
    CHECK(begin_run(&s, 5, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    /* lose workers one at a time (between steps: during the copy phase) */
    int killed = 0;
    for (int w = 5; w >= 0 && pl_coord_phase(s.c) != PL_COORD_WAITING_FOR_NODES; w--) {
        CHECK_EQ_INT(pl_coord_worker_lost(s.c, nm(w), "closed connection"), PL_COORD_OK);
        s.live[w] = 0;
        killed++;
        CHECK(drain(&s) == 0);
        if (pl_coord_phase(s.c) == PL_COORD_COPYING) {
            CHECK(plans_valid(&s) == 0);
            all_copy_done(&s);
            CHECK(drain(&s) == 0);
        }
        CHECK(pl_coord_phase(s.c) != PL_COORD_FAILED);
    }
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_WAITING_FOR_NODES);
    CHECK_EQ_INT(killed, 3); /* 3 live < (F+1)·n0 = 4 */
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "at least (F+1)*n0 = 4");
    /* a new worker makes 4: a plan with copies from the survivors */
    int64_t g = pl_coord_generation(s.c);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w6", NULL, NULL, 0, 0), PL_COORD_OK);
    s.live[6] = 1;
    s.nw = 7;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK_EQ_INT(s.gen, g + 1);
    CHECK(plans_valid(&s) == 0);
    CHECK(s.plan[6].u.plan.ncopies > 0);
    for (int k = 0; k < s.plan[6].u.plan.ncopies; k++)
        CHECK(s.live[widx(s.plan[6].u.plan.copies[k].source)]);
    CHECK_EQ_INT(s.plan[6].u.plan.step, 1);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 1) == 0);
    sim_free(&s);
}

/* Replaces the coordinator by one made from s->cfg (after a test changed it). */
static int sim_reconfigure(sim *s)
{
    char err[256];
    pl_coord_free(s->c);
    s->c = pl_coord_new(&s->cfg, err, sizeof err);
    if (!s->c)
        printf("    pl_coord_new: %s\n", err);
    return s->c ? 0 : -1;
}

/* belowMinimum degrade, then the loss of a layer's last holder: the fallback restarts from
 * the checkpoint (here none: step 0) on the pipelines the 2 workers left can form. */
static void test_below_minimum_degrade_then_fatal(void)
{
    sim s;
    CHECK(sim_init(&s, 9, 6) == 0);
    s.cfg.below_minimum_degrade = 1;
    CHECK(sim_reconfigure(&s) == 0);
    CHECK(start_workers(&s, 6) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 0) == 0);
    for (int w = 5; w >= 3; w--) {
        CHECK_EQ_INT(pl_coord_worker_lost(s.c, nm(w), "closed connection"), PL_COORD_OK);
        s.live[w] = 0;
        CHECK(drain(&s) == 0);
        all_copy_done(&s);
        CHECK(drain(&s) == 0);
    }
    CHECK_EQ_INT(pl_coord_tolerance(s.c), 0);
    CHECK(run_step(&s, 1) == 0);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w2", "closed connection"), PL_COORD_OK);
    s.live[2] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK(plans_valid(&s) == 0);
    const pl_coord_reconfig_rec *x = pl_coord_reconfig(s.c, pl_coord_nreconfigs(s.c) - 1);
    CHECK(x->from_checkpoint && x->step == 0 && x->tolerance == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 0) == 0);
    sim_free(&s);
}

/* belowMinimum degrade: losses that leave 3 < (F+1)·n0 = 4 re-instantiate with tolerance 0
 * (copies from the survivors, no wait), training goes on; a join gives tolerance 1 back. */
static void test_below_minimum_degrade(void)
{
    sim s;
    CHECK(sim_init(&s, 9, 6) == 0);
    s.cfg.below_minimum_degrade = 1;
    CHECK(sim_reconfigure(&s) == 0);
    CHECK(start_workers(&s, 6) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK_EQ_INT(pl_coord_tolerance(s.c), 1);
    for (int w = 5; w >= 3; w--) {
        CHECK_EQ_INT(pl_coord_worker_lost(s.c, nm(w), "closed connection"), PL_COORD_OK);
        s.live[w] = 0;
        CHECK(drain(&s) == 0);
        CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
        CHECK(plans_valid(&s) == 0);
        all_copy_done(&s);
        CHECK(drain(&s) == 0);
    }
    CHECK_EQ_INT(pl_coord_tolerance(s.c), 0); /* 3 workers: one pipeline */
    const int nrec = pl_coord_nreconfigs(s.c);
    CHECK_EQ_INT(pl_coord_reconfig(s.c, nrec - 1)->tolerance, 0);
    CHECK_EQ_INT(pl_coord_reconfig(s.c, nrec - 1)->from_checkpoint, 0);
    CHECK(run_step(&s, 1) == 0);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w6", NULL, NULL, 0, 0), PL_COORD_OK);
    s.live[6] = 1;
    s.nw = 7;
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 2) == 0); /* joined workers are placed at a step boundary */
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK(plans_valid(&s) == 0);
    CHECK_EQ_INT(pl_coord_tolerance(s.c), 1);
    CHECK_EQ_INT(pl_coord_reconfig(s.c, pl_coord_nreconfigs(s.c) - 1)->tolerance, 1);
    CHECK(s.plan[6].u.plan.ncopies > 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 3) == 0);
    sim_free(&s);
}

/* Drains the outbox and answers every complete_checkpoint in it: checkpoint.json
 * written (error NULL) or not. The number asked. */
static int complete_asked(sim *s, const char *error)
{
    if (drain(s))
        return -1;
    int n = 0;
    for (int k = 0; k < s->nm; k++)
        if (s->m[k].type == PL_MSG_COMPLETE_CHECKPOINT) {
            pl_coord_checkpoint_done(s->c, s->to[k], s->m[k].u.complete_checkpoint.step, error);
            n++;
        }
    return n;
}

/* `saved` for step st from the workers of pipeline 0 (every layer once), the
 * stage `skip` excepted (-1: none). */
static void save_layers(sim *s, int64_t st, int skip)
{
    for (int w = 0; w < s->nw; w++) {
        const pl_msg_plan *p = &s->plan[w].u.plan;
        if (!s->live[w] || p->you_pipeline != 0 || p->you_stage == skip)
            continue;
        pl_msg_saved sv = {.step = st, .layer_begin = p->you_layer_begin,
                           .layer_end = p->you_layer_end, .bytes = 1000};
        pl_coord_saved(s->c, nm(w), &sv);
    }
}

/* save_layers, then the worker asked to complete the checkpoint does. */
static void save_all(sim *s, int64_t st, int skip)
{
    save_layers(s, st, skip);
    complete_asked(s, NULL);
}

/* A coordinator with checkpoints in /ckpt every `every` steps (0: the last only);
 * resume_auto: its first plan starts from the workers' reports. */
static int sim_checkpointed(sim *s, int64_t steps, int n_start, int every, int resume_auto)
{
    if (sim_init(s, steps, n_start))
        return -1;
    s->cfg.checkpoint_dir = "/ckpt";
    s->cfg.checkpoint_every = every;
    s->cfg.resume_auto = resume_auto;
    return sim_reconfigure(s);
}

/* Workers w0..w<n-1> registered and the first plan's copies done. */
static int sim_started(sim *s, int n)
{
    if (start_workers(s, n))
        return -1;
    all_copy_done(s);
    return drain(s);
}

/* Every holder of layer 0 goes silent at step 2: no live copy of it, so the
 * job goes back to the newest complete checkpoint (step 1; step 2's is partial). */
static void test_fatal_loss(void)
{
    sim s;
    CHECK(sim_checkpointed(&s, 5, 6, 1, 0) == 0);
    CHECK(sim_started(&s, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    save_all(&s, 1, -1);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 1);
    CHECK(run_step(&s, 1) == 0);
    save_all(&s, 2, 0);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 1);
    const pl_msg_plan *p = &s.plan[0].u.plan;
    int holders[MAXW], nh = 0;
    for (int q = 0; q < p->npipelines; q++)
        holders[nh++] = widx(p->pipelines[q].nodes[0]);
    for (int w = 0; w < 6; w++) {
        int h = 0;
        for (int k = 0; k < nh; k++)
            h |= holders[k] == w;
        if (!h)
            CHECK_EQ_INT(pl_coord_heartbeat(s.c, nm(w), 2, 2000), PL_COORD_OK);
    }
    CHECK_EQ_INT(pl_coord_tick(s.c, 3100), PL_COORD_OK);
    for (int k = 0; k < nh; k++)
        s.live[holders[k]] = 0;
    CHECK(drain(&s) == 0);
    CHECK(count_type(&s, PL_MSG_ABORT) > 0);
    if (pl_coord_phase(s.c) == PL_COORD_WAITING_FOR_NODES) {
        CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w6", NULL, NULL, 0, 3200), PL_COORD_OK);
        s.live[6] = 1;
        s.nw = 7;
        CHECK(drain(&s) == 0);
    }
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK(plans_valid(&s) == 0);
    for (int w = 0; w < s.nw; w++)
        if (s.live[w]) {
            const pl_msg_plan *q = &s.plan[w].u.plan;
            CHECK(q->has_checkpoint && q->checkpoint_step == 1 && q->step == 1);
            CHECK_EQ_INT(q->ncopies + q->nsends, 0);
            CHECK(!strcmp(q->checkpoint_dir, "/ckpt"));
        }
    const pl_coord_reconfig_rec *rec = pl_coord_reconfig(s.c, pl_coord_nreconfigs(s.c) - 1);
    CHECK(rec && rec->from_checkpoint && rec->step == 1);
    CHECK_STR_CONTAINS(rec->cause, "no live holder of layer 0");
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 1) == 0);
    /* the checkpoint of step 2 is written afresh: the attempt its lost writers left
     * (before the restart) does not swallow the new one's */
    save_all(&s, 2, -1);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 2);
    sim_free(&s);
}

/* The last step's checkpoint ends the job; strategy checkpoint restarts from it. */
static void test_checkpoint_strategy_and_end(void)
{
    sim s;
    CHECK(sim_init(&s, 3, 6) == 0);
    s.cfg.checkpoint_dir = "/ckpt";
    s.cfg.checkpoint_every = 2;
    s.cfg.strategy_checkpoint = 1;
    CHECK(sim_reconfigure(&s) == 0);
    CHECK(start_workers(&s, 6) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK(run_step(&s, 1) == 0);
    save_all(&s, 2, -1);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 2);
    /* any loss restarts everyone from step 2's checkpoint, without copies */
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w5", "process ended"), PL_COORD_OK);
    s.live[5] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    for (int w = 0; w < 5; w++)
        CHECK(s.plan[w].u.plan.has_checkpoint && s.plan[w].u.plan.checkpoint_step == 2 &&
              s.plan[w].u.plan.ncopies == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 2) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_SAVING);
    CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 0);
    save_all(&s, 3, -1);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_DONE);
    CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 5);
    sim_free(&s);
}

/* Steps of 10 s (a settle of 20 ms: the zone's notices make one plan). */
static int begin_timed_run(sim *s, int64_t *t)
{
    if (sim_init(s, 9, 6))
        return -1;
    s->cfg.settle_ms = 20;
    s->cfg.heartbeat_ms = 60000; /* the test sends none */
    if (sim_reconfigure(s) || start_workers(s, 6) || plans_valid(s))
        return -1;
    all_copy_done(s);
    if (drain(s))
        return -1;
    *t = 0;
    for (int st = 0; st < PL_COORD_STEP_TIMES_MIN; st++) {
        pl_coord_clock(s->c, *t += 10000);
        if (run_step(s, st))
            return -1;
    }
    return 0;
}

/* w1 and w4 get a notice of 4 s (their layers' copies take well under 2 s over the
 * profile's link). Early in a step (9 s left) the step is aborted at once and planned again
 * with them as copy sources, as at a boundary; late in one (2 s left) the boundary is
 * waited for. */
static void test_notice_shorter_than_step(void)
{
    sim s;
    int64_t t;
    CHECK(begin_timed_run(&s, &t) == 0);
    pl_coord_clock(s.c, t + 1000);
    CHECK_EQ_INT(pl_coord_leaving(s.c, "w1", PL_LEAVE_SIGTERM, 4000), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_leaving(s.c, "w4", PL_LEAVE_SIGTERM, 4000), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 6);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_SETTLING);
    CHECK(pl_coord_tick(s.c, t + 1020) != PL_COORD_ERR); /* the settled plan */
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK_EQ_INT(pl_coord_step(s.c), PL_COORD_STEP_TIMES_MIN); /* the aborted step, again */
    const pl_coord_reconfig_rec *rec = pl_coord_reconfig(s.c, 0);
    CHECK(rec && !rec->from_checkpoint && rec->bytes_planned > 0);
    CHECK(strcmp(rec->removed, "w1,w4") == 0);
    pl_coord_worker_view v;
    CHECK(pl_coord_worker_view_at(s.c, 4, &v) == 0 && v.departing && v.pipeline == -1);
    s.live[1] = s.live[4] = 0;
    CHECK(plans_valid(&s) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(msg_to(&s, 1, PL_MSG_STOP) && msg_to(&s, 4, PL_MSG_STOP));
    sim_free(&s);

    CHECK(begin_timed_run(&s, &t) == 0);
    pl_coord_clock(s.c, t + 8000);
    CHECK_EQ_INT(pl_coord_leaving(s.c, "w1", PL_LEAVE_SIGTERM, 4000), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.nm, 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_RUNNING);
    sim_free(&s);
}

/* hostsAddedCheckEvery 3: a worker joining during step 0 is placed at step 3;
 * settle_ms: two losses 10 ms apart make one plan, made by the tick. */
static void test_join_checks_and_settling(void)
{
    sim s;
    CHECK(sim_init(&s, 9, 5) == 0);
    s.cfg.hosts_added_check_every = 3;
    s.cfg.settle_ms = 20;
    CHECK(sim_reconfigure(&s) == 0);
    CHECK(start_workers(&s, 5) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w5", NULL, NULL, 0, 0), PL_COORD_OK);
    s.live[5] = 1;
    s.nw = 6;
    CHECK(drain(&s) == 0);
    for (int st = 0; st < 3; st++) {
        CHECK_EQ_INT(pl_coord_generation(s.c), 1);
        CHECK(run_step(&s, st) == 0);
    }
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 6);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK_EQ_INT(s.plan[5].u.plan.step, 3);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_tick(s.c, 1000), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w1", "killed"), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_SETTLING);
    CHECK_EQ_INT(pl_coord_tick(s.c, 1010), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w2", "killed"), PL_COORD_OK);
    s.live[1] = s.live[2] = 0;
    CHECK_EQ_INT(pl_coord_tick(s.c, 1025), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_SETTLING);
    CHECK_EQ_INT(pl_coord_tick(s.c, 1031), PL_COORD_IGNORED);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 4);
    const pl_coord_reconfig_rec *rec = pl_coord_reconfig(s.c, pl_coord_nreconfigs(s.c) - 1);
    CHECK(rec && !strcmp(rec->removed, "w1,w2"));
    sim_free(&s);
}

/* A worker cut off from its peers but not from the coordinator: w1 reports w0 first,
 * then w2 reports w1; weighed together for peer_judge_ms, w1 (links to both broken) is
 * the one lost, not w0. Two workers that report each other: nobody the first time (a
 * lone broken link names no culprit), the peer named first when the same link breaks
 * again (too few are left then: the job waits for nodes). */
static void test_peer_reports_are_judged(void)
{
    sim s;
    CHECK(sim_init(&s, 9, 5) == 0);
    s.cfg.peer_judge_ms = 1000;
    CHECK(sim_reconfigure(&s) == 0);
    CHECK(start_workers(&s, 5) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 0) == 0);
    int64_t g = s.gen;
    CHECK_EQ_INT(pl_coord_tick(s.c, 100), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_peer_broken(s.c, "w1", g, "w0"), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_tick(s.c, 600), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_peer_broken(s.c, "w2", g, "w1"), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_peer_broken(s.c, "w2", g, "w9"), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_live_workers(s.c), 5);
    CHECK_EQ_INT(pl_coord_tick(s.c, 1100), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_live_workers(s.c), 4);
    s.live[1] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.gen, g + 1);
    CHECK(plans_valid(&s) == 0);
    CHECK_STR_CONTAINS(pl_coord_reconfig(s.c, pl_coord_nreconfigs(s.c) - 1)->cause,
                       "lost w1 (peer_broken: its links to w0, w2 broke)");
    int stops = 0; /* still connected: told to exit, so that it is replaced */
    for (int k = 0; k < s.nm; k++)
        if (s.m[k].type == PL_MSG_STOP) {
            stops++;
            CHECK(!strcmp(s.to[k], "w1") && s.m[k].u.stop.exit_code == 1);
            CHECK_STR_CONTAINS(s.m[k].u.stop.reason, "removed from the job: peer_broken");
        }
    CHECK_EQ_INT(stops, 1);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    g = s.gen;
    int a = -1, b = -1; /* two workers of the plan's pipelines */
    for (int w = 0; w < 5; w++)
        if (s.live[w] && s.plan[w].u.plan.you_pipeline >= 0) {
            if (a < 0) a = w;
            else if (b < 0) b = w;
        }
    CHECK(a >= 0 && b >= 0);
    CHECK_EQ_INT(pl_coord_tick(s.c, 1500), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_peer_broken(s.c, nm(a), g, nm(b)), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_peer_broken(s.c, nm(b), g, nm(a)), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_tick(s.c, 2499), PL_COORD_IGNORED);
    pl_coord_tick(s.c, 2500);
    CHECK_EQ_INT(pl_coord_live_workers(s.c), 4); /* forgiven once: a new plan, both kept */
    for (int w = 0; w < 5; w++)
        if (s.live[w])
            CHECK_EQ_INT(pl_coord_heartbeat(s.c, nm(w), 1, 2500), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.gen, g + 1);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    g = s.gen;
    CHECK_EQ_INT(pl_coord_peer_broken(s.c, nm(a), g, nm(b)), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_peer_broken(s.c, nm(b), g, nm(a)), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_tick(s.c, 3499), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_tick(s.c, 3500), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_heartbeat(s.c, nm(a), 1, 3500), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_heartbeat(s.c, nm(b), 1, 3500), PL_COORD_ERR); /* lost */
    CHECK_EQ_INT(pl_coord_live_workers(s.c), 3);
    sim_free(&s);
}

/* A new coordinator takes over a running plan: the workers reconnect with
 * hello_resume; the step in flight is committed where the old one committed it;
 * a missing worker is removed by re-instantiation. */
static void test_restore_after_coordinator_loss(void)
{
    sim s;
    CHECK(begin_run(&s, 9, 5) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK(run_step(&s, 1) == 0);
    int64_t g = s.gen;
    /* the new coordinator: status said step 1 (behind: 2 was committed to some) */
    CHECK(take_over(&s, 1) == 0);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.nm, 0);
    CHECK_EQ_INT(pl_coord_tick(s.c, 0), PL_COORD_IGNORED); /* starts the 500 ms wait */
    for (int w = 0; w < 4; w++) { /* w4 never comes back */
        CHECK_EQ_INT(pl_coord_worker_registered(s.c, nm(w), NULL, NULL, 0, 10), PL_COORD_OK);
        pl_msg_hello_resume h = {w < 2 ? 2 : 1, 0.5, 1e-3, w < 2 ? -1 : 2};
        CHECK_EQ_INT(pl_coord_hello_resume(s.c, nm(w), g, &h), PL_COORD_OK);
    }
    s.live[4] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_WELCOME), 4);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_RESUMING);
    CHECK_EQ_INT(pl_coord_tick(s.c, 600), PL_COORD_IGNORED);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_COMMIT), 2);
    for (int k = 0; k < s.nm; k++)
        if (s.m[k].type == PL_MSG_COMMIT)
            CHECK(widx(s.to[k]) >= 2 && s.m[k].u.commit.step == 2 &&
                  s.m[k].u.commit.grad_scale == 0.5 && s.m[k].gen == g);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 4);
    CHECK_EQ_INT(s.gen, g + 1);
    CHECK(plans_valid(&s) == 0);
    CHECK_EQ_INT(s.plan[0].u.plan.step, 3);
    const pl_coord_reconfig_rec *rec = pl_coord_reconfig(s.c, 0);
    CHECK(rec && !strcmp(rec->removed, "w4"));
    CHECK_STR_CONTAINS(rec->cause, "resumed by a new coordinator");
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 3) == 0);
    const char *names[8];
    int64_t mb = 0;
    CHECK(pl_coord_plan_pipeline(s.c, 0, names, 8, &mb) > 0 && mb > 0);
    sim_free(&s);
}

/* Zones a, a, b, ?: a fresh plan alternates zones along each pipeline. */
static void test_zone_placement(void)
{
    sim s;
    CHECK(sim_init(&s, 9, 4) == 0);
    const char *zones[] = {"a", "a", "b"};
    for (int w = 0; w < 4; w++) {
        CHECK_EQ_INT(pl_coord_worker_registered(s.c, nm(w), NULL, NULL, 0, 0), PL_COORD_OK);
        if (w < 3)
            CHECK_EQ_INT(pl_coord_set_zone(s.c, nm(w), zones[w]), PL_COORD_OK);
        s.live[w] = 1;
        s.nw = w + 1;
    }
    CHECK(drain(&s) == 0);
    const pl_msg_plan *p = &s.plan[0].u.plan;
    int checked = 0;
    for (int q = 0; q < p->npipelines; q++)
        for (int j = 1; j < p->pipelines[q].nnodes; j++) {
            int a = widx(p->pipelines[q].nodes[j - 1]), b = widx(p->pipelines[q].nodes[j]);
            if (a < 3 && b < 3) {
                CHECK(strcmp(zones[a], zones[b]) != 0);
                checked++;
            }
        }
    CHECK(checked > 0);
    CHECK_EQ_INT(pl_coord_set_zone(s.c, "nobody", "a"), PL_COORD_ERR);
    sim_free(&s);
}

/* 1 when every layer has a holder outside zone z among the live workers of the current
 * plan (zones[w]: worker w's zone). */
static int survives_zone_loss(const sim *s, const char *const *zones, const char *z)
{
    for (int l = 0; l < L; l++) {
        int held = 0;
        for (int w = 0; w < s->nw && !held; w++) {
            const pl_msg_plan *p = &s->plan[w].u.plan;
            held = s->live[w] && in_pipes(s, w) && strcmp(zones[w], z) &&
                   p->you_layer_begin <= l && l < p->you_layer_end;
        }
        if (!held)
            return 0;
    }
    return 1;
}

/* Zones a, b, c in turn (≥ F + 1 = 2 of them): whichever zone is lost, every layer of the
 * fresh plan keeps a live holder, and losing zone a copies layers instead of restarting
 * from a checkpoint. Rank order alone would put both pipelines' last stage in zone c. */
static void test_zone_loss_leaves_holders(void)
{
    sim s;
    CHECK(sim_init(&s, 9, 6) == 0);
    const char *zones[] = {"a", "b", "c", "a", "b", "c"};
    for (int w = 0; w < 6; w++) {
        pl_coord_worker_info wi = {.name = nm(w), .zone = zones[w]};
        CHECK_EQ_INT(pl_coord_worker_joined(s.c, &wi, 0), PL_COORD_OK);
        s.live[w] = 1;
        s.nw = w + 1;
    }
    CHECK(drain(&s) == 0);
    CHECK(plans_valid(&s) == 0);
    CHECK(survives_zone_loss(&s, zones, "a") && survives_zone_loss(&s, zones, "b") &&
          survives_zone_loss(&s, zones, "c"));
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 0) == 0);
    /* zone a goes */
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w0", "preempted"), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w3", "preempted"), PL_COORD_OK);
    s.live[0] = s.live[3] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK(plans_valid(&s) == 0);
    CHECK(pl_coord_nreconfigs(s.c) > 0);
    for (int k = 0; k < pl_coord_nreconfigs(s.c); k++)
        CHECK(!pl_coord_reconfig(s.c, k)->from_checkpoint);
    sim_free(&s);
}

/* Workers added together are swapped so that neighbours differ in zone where
 * that costs no copy; the plans stay consistent (copies follow positions). */
static void test_added_workers_spread_over_zones(void)
{
    sim s;
    CHECK(begin_run(&s, 9, 4) == 0);
    CHECK(run_step(&s, 0) == 0);
    for (int w = 0; w < 4; w++)
        CHECK_EQ_INT(pl_coord_set_zone(s.c, nm(w), "z"), PL_COORD_OK);
    /* two of the plan die, three join (zones a, a, b) */
    const char *zones[] = {"a", "a", "b"};
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w1", "killed"), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w2", "killed"), PL_COORD_OK);
    s.live[1] = s.live[2] = 0;
    CHECK(drain(&s) == 0);
    for (int w = 4; w < 7; w++) {
        CHECK_EQ_INT(pl_coord_worker_registered(s.c, nm(w), NULL, NULL, 0, 0), PL_COORD_OK);
        CHECK_EQ_INT(pl_coord_set_zone(s.c, nm(w), zones[w - 4]), PL_COORD_OK);
        s.live[w] = 1;
        s.nw = w + 1;
    }
    CHECK(drain(&s) == 0);
    if (pl_coord_phase(s.c) == PL_COORD_COPYING) { /* the joins wait for the boundary */
        all_copy_done(&s);
        CHECK(drain(&s) == 0);
        CHECK(run_step(&s, 1) == 0);
    }
    CHECK(plans_valid(&s) == 0);
    const pl_msg_plan *p = &s.plan[0].u.plan;
    for (int q = 0; q < p->npipelines; q++)
        for (int j = 1; j < p->pipelines[q].nnodes; j++) {
            int a = widx(p->pipelines[q].nodes[j - 1]), b = widx(p->pipelines[q].nodes[j]);
            if (a >= 4 && b >= 4) /* two added neighbours: a and b are there to pair */
                CHECK(strcmp(zones[a - 4], zones[b - 4]) != 0);
        }
    sim_free(&s);
}

/* Registers w0..w(n-1) with GPUs devs[w] ("" none) and NCCL where nccl[w]. */
static int start_gpu_workers(sim *s, int n, const char *const *devs, const int *nccl)
{
    for (int w = 0; w < n; w++) {
        pl_coord_worker_info wi = {.name = nm(w), .device = devs[w], .nccl = nccl[w]};
        if (pl_coord_worker_joined(s->c, &wi, 0) != PL_COORD_OK)
            return -1;
        s->live[w] = 1;
        s->nw = w + 1;
    }
    return drain(s);
}

/* The transport every plan names (-1 when they differ). */
static int plan_transport_of(const sim *s)
{
    int t = -2;
    for (int w = 0; w < s->nw; w++)
        if (s->live[w] && s->have_plan[w] && s->plan[w].gen == s->gen)
            t = t == -2 || t == s->plan[w].u.plan.transport ? s->plan[w].u.plan.transport : -1;
    return t;
}

/* NCCL only where every worker of the plan has a GPU of its own and NCCL; rank 0's
 * nccl_root reaches every worker of the plan as nccl_init, for its generation only. */
static void test_transport_and_nccl_id(void)
{
    static const char *const own[] = {"GPU-a", "GPU-b", "GPU-c", "GPU-d"};
    static const char *const shared[] = {"GPU-a", "GPU-b", "GPU-a", "GPU-d"};
    static const char *const none[] = {"", "", "", ""};
    static const int yes[] = {1, 1, 1, 1}, one_no[] = {1, 1, 0, 1}, no[] = {0, 0, 0, 0};
    struct {
        const char *const *devs;
        const int *nccl;
        int want;
    } cases[] = {{own, yes, PL_TRANSPORT_NCCL}, {shared, yes, PL_TRANSPORT_TCP},
                 {own, one_no, PL_TRANSPORT_TCP}, {none, no, PL_TRANSPORT_TCP}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        sim s;
        CHECK(sim_init(&s, 9, 4) == 0);
        CHECK(start_gpu_workers(&s, 4, cases[k].devs, cases[k].nccl) == 0);
        CHECK(plans_valid(&s) == 0);
        CHECK_EQ_INT(plan_transport_of(&s), cases[k].want);
        sim_free(&s);
    }
    /* strategy redundant: TCP even where NCCL could run (its shadows ride the stage link) */
    sim rc;
    sim_redundant = 1;
    CHECK(sim_init(&rc, 9, 4) == 0);
    sim_redundant = 0;
    CHECK(start_gpu_workers(&rc, 4, own, yes) == 0);
    CHECK(plans_valid(&rc) == 0);
    CHECK_EQ_INT(plan_transport_of(&rc), PL_TRANSPORT_TCP);
    sim_free(&rc);

    /* five, so that four (n0 = 2, F = 1) are left after a loss */
    static const char *const five[] = {"GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e"};
    static const int five_yes[] = {1, 1, 1, 1, 1};
    sim s;
    CHECK(sim_init(&s, 9, 5) == 0);
    CHECK(start_gpu_workers(&s, 5, five, five_yes) == 0);
    const pl_msg_plan *p = &s.plan[0].u.plan;
    const pl_msg_pipeline *last = &p->pipelines[p->npipelines - 1];
    int root = widx(p->pipelines[0].nodes[0]), other = widx(last->nodes[last->nnodes - 1]);
    CHECK(root != other);
    pl_msg m;
    pl_msg_init(&m, PL_MSG_NCCL_ROOT, s.gen);
    memset(m.u.nccl_root.id, 'a', PL_PROTO_NCCL_ID_HEX);
    CHECK_EQ_INT(pl_coord_on_msg(s.c, nm(other), &m, 1), PL_COORD_ERR);
    CHECK(strstr(pl_coord_error(s.c), "rank 0") != NULL);
    CHECK_EQ_INT(pl_coord_on_msg(s.c, nm(root), &m, 1), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_NCCL_INIT), npipeworkers(&s));
    for (int w = 0; w < s.nw; w++)
        if (in_pipes(&s, w)) {
            const pl_msg *init = msg_to(&s, w, PL_MSG_NCCL_INIT);
            CHECK(init && init->gen == s.gen && !strcmp(init->u.nccl_init.id, m.u.nccl_root.id));
        }
    /* an id of a replaced plan goes nowhere */
    int64_t old = s.gen;
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, nm(other), "killed"), PL_COORD_OK);
    s.live[other] = 0;
    CHECK(drain(&s) == 0);
    CHECK(s.gen > old && plan_transport_of(&s) == PL_TRANSPORT_NCCL);
    pl_msg_init(&m, PL_MSG_NCCL_ROOT, old);
    memset(m.u.nccl_root.id, 'b', PL_PROTO_NCCL_ID_HEX);
    CHECK_EQ_INT(pl_coord_on_msg(s.c, nm(root), &m, 2), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_NCCL_INIT), 0);
    sim_free(&s);
}

/* step_failed (an NCCL error with every worker alive): the step is aborted and the same
 * workers get a new generation; a stale or foreign step_failed changes nothing. */
static void test_step_failed_replans(void)
{
    sim s;
    CHECK(begin_run(&s, 9, 4) == 0);
    CHECK(run_step(&s, 0) == 0);
    const int64_t gen = s.gen;
    pl_msg m;
    pl_msg_init(&m, PL_MSG_STEP_FAILED, gen);
    m.u.step_failed.step = 0; /* a step already committed */
    snprintf(m.u.step_failed.reason, sizeof m.u.step_failed.reason, "nccl: timeout");
    CHECK_EQ_INT(pl_coord_on_msg(s.c, "w0", &m, 1), PL_COORD_IGNORED);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.nm, 0);
    m.u.step_failed.step = 1;
    CHECK_EQ_INT(pl_coord_on_msg(s.c, "w0", &m, 2), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), npipeworkers(&s));
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 4);
    CHECK(s.gen == gen + 1 && plans_valid(&s) == 0);
    CHECK_EQ_INT(s.plan[0].u.plan.step, 1);
    const pl_coord_reconfig_rec *rec = pl_coord_reconfig(s.c, pl_coord_nreconfigs(s.c) - 1);
    CHECK(rec && strstr(rec->cause, "step failed on w0 (nccl: timeout)") && !rec->removed[0]);
    sim_free(&s);
}

/* start_grace_ms: 6 wanted, 4 registered: the first plan comes after the grace. */
static void test_start_grace(void)
{
    sim s;
    CHECK(sim_init(&s, 9, 6) == 0);
    s.cfg.start_grace_ms = 1000;
    CHECK(sim_reconfigure(&s) == 0);
    for (int w = 0; w < 4; w++)
        CHECK_EQ_INT(pl_coord_worker_registered(s.c, nm(w), NULL, NULL, 0, 100), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_tick(s.c, 900), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_WAITING_FOR_WORKERS);
    CHECK_EQ_INT(pl_coord_tick(s.c, 1100), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    sim_free(&s);
}

/* maxResets, the wait-for-nodes timeout and the cooldown of a failing node. */
static void test_limits(void)
{
    sim s;
    CHECK(sim_init(&s, 9, 6) == 0);
    s.cfg.max_resets = 1;
    CHECK(sim_reconfigure(&s) == 0);
    CHECK(start_workers(&s, 6) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w5", "process ended"), PL_COORD_OK);
    s.live[5] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w4", "process ended"), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_FAILED);
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "maxResets (1) exceeded: lost w4");
    sim_free(&s);

    CHECK(sim_init(&s, 9, 6) == 0);
    s.cfg.wait_for_nodes_ms = 5000;
    s.cfg.cooldown_ms = 1000;
    CHECK(sim_reconfigure(&s) == 0);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "a", "n1", NULL, 0, 0), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "a", "process ended"), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "b", "n1", NULL, 0, 100), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "b", "process ended"), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "c", "n1", NULL, 0, 600), PL_COORD_ERR);
    CHECK_STR_CONTAINS(pl_coord_error(s.c), "node n1 is kept out for 1 s more after 2 failures");
    const char *cooling[4]; /* what the operator keeps replacement Pods off */
    CHECK_EQ_INT(pl_coord_cooling_nodes(s.c, 600, cooling, 4), 1);
    CHECK(strcmp(cooling[0], "n1") == 0);
    CHECK_EQ_INT(pl_coord_cooling_nodes(s.c, 1200, cooling, 4), 0);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "c", "n1", NULL, 0, 1200), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "d", "n2", NULL, 0, 1200), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_tick(s.c, 4000), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_heartbeat(s.c, "c", 0, 4000), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_heartbeat(s.c, "d", 0, 4000), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_tick(s.c, 5100), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_FAILED);
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "waitForNodesTimeoutSeconds (5) passed: 2 live");
    sim_free(&s);
}

static void test_initial_copy_loss_and_nan(void)
{
    sim s;
    CHECK(sim_init(&s, 5, 6) == 0);
    CHECK(start_workers(&s, 6) == 0);
    CHECK_EQ_INT(s.gen, 1);
    /* w2 dies before the first plan ran: a fresh first plan for 5, no copies */
    pl_coord_copy_done(s.c, "w0", 1, 0);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w2", "process ended"), PL_COORD_OK);
    s.live[2] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 5);
    CHECK_EQ_INT(s.gen, 2);
    CHECK(plans_valid(&s) == 0);
    for (int w = 0; w < 6; w++)
        if (s.live[w]) { /* from the initial state again, whatever the first plan left */
            CHECK_EQ_INT(s.plan[w].u.plan.ncopies, 0);
            CHECK(s.plan[w].u.plan.has_checkpoint && s.plan[w].u.plan.checkpoint_step == 0);
        }
    CHECK_EQ_INT(s.plan[0].u.plan.step, 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    /* a report for another step is ignored; peer_broken twice loses the peer */
    pl_msg_report r = {.step = 7, .grad_sumsq = 0.25};
    CHECK_EQ_INT(pl_coord_report(s.c, "w0", 2, &r), PL_COORD_IGNORED);
    CHECK(run_step(&s, 0) == 0);
    CHECK_EQ_INT(pl_coord_peer_broken(s.c, "w0", 1, "w3"), PL_COORD_IGNORED);
    CHECK_EQ_INT(pl_coord_peer_broken(s.c, "w0", 2, "w3"), PL_COORD_OK);
    CHECK(drain(&s) == 0); /* a lone broken link: both ends kept once, the step redone */
    CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 5);
    CHECK_EQ_INT(s.gen, 3);
    CHECK_EQ_INT(pl_coord_live_workers(s.c), 5);
    CHECK_STR_CONTAINS(pl_coord_reconfig(s.c, 1)->cause, "the link between w3 and w0 broke");
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_peer_broken(s.c, "w0", 3, "w3"), PL_COORD_OK); /* again */
    s.live[3] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 4);
    CHECK_EQ_INT(s.gen, 4);
    CHECK(plans_valid(&s) == 0);
    CHECK_STR_CONTAINS(pl_coord_reconfig(s.c, 2)->cause, "lost w3 (peer_broken: its links to w0 broke)");
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    /* a non-finite norm: never committed (abort at once), redone under new plans, then
     * FAILED with a stop carrying an error; the second attempt's first report is a NaN
     * loss, the same failure seen from the head (whichever worker reports first) */
    for (int attempt = 1; attempt <= PL_COORD_STEP_ATTEMPTS; attempt++) {
        const int64_t g = s.gen;
        pl_msg_report x = {.step = 1, .grad_sumsq = NAN};
        if (attempt == 2)
            x = (pl_msg_report){.step = 1, .has_loss = 1, .loss = NAN, .grad_sumsq = 0.25};
        CHECK_EQ_INT(pl_coord_report(s.c, "w0", g, &x), PL_COORD_OK);
        CHECK(drain(&s) == 0);
        CHECK_EQ_INT(count_type(&s, PL_MSG_COMMIT), 0);
        CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 4);
        CHECK_EQ_INT(pl_coord_nsteps(s.c), 1);
        if (attempt == PL_COORD_STEP_ATTEMPTS)
            break;
        CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 0);
        CHECK(s.gen == g + 1 && plans_valid(&s) == 0 && s.plan[0].u.plan.step == 1);
        all_copy_done(&s);
        CHECK(drain(&s) == 0);
    }
    CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 4);
    CHECK_EQ_INT(msg_to(&s, 0, PL_MSG_STOP)->u.stop.exit_code, 1);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_FAILED);
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "step 1 failed 3 times, every time the same way");
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "non-finite gradient norm (nan)");
    sim_free(&s);
}

/* A checkpoint whose layers are all saved is completed by ONE worker (checkpoint.json):
 * only its checkpoint_done makes it complete; the worker lost first, another is asked; an
 * error leaves it incomplete, said by pl_coord_checkpoint_failed. */
static void test_checkpoint_completed_by_one_worker(void)
{
    sim s;
    CHECK(sim_checkpointed(&s, 5, 6, 1, 0) == 0);
    CHECK(sim_started(&s, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    save_layers(&s, 1, -1); /* every layer of step 1 saved */
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_COMPLETE_CHECKPOINT), 1);
    const pl_msg *cc = msg_to(&s, 0, PL_MSG_COMPLETE_CHECKPOINT);
    CHECK(cc && cc->u.complete_checkpoint.step == 1);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 0);
    CHECK_EQ_INT(pl_coord_checkpoint_done(s.c, "w3", 1, ""), PL_COORD_IGNORED); /* not asked */
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 0);
    /* w0 is lost before answering: w1 is asked */
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w0", "killed"), PL_COORD_OK);
    s.live[0] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_COMPLETE_CHECKPOINT), 1);
    cc = msg_to(&s, 1, PL_MSG_COMPLETE_CHECKPOINT);
    CHECK(cc && cc->u.complete_checkpoint.step == 1);
    CHECK_EQ_INT(pl_coord_checkpoint_done(s.c, "w0", 1, ""), PL_COORD_ERR); /* gone */
    pl_msg done;
    pl_msg_init(&done, PL_MSG_CHECKPOINT_DONE, s.gen);
    done.u.checkpoint_done.step = 1;
    CHECK_EQ_INT(pl_coord_on_msg(s.c, "w1", &done, 10), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 1);
    CHECK_EQ_INT(pl_coord_checkpoint_done(s.c, "w1", 1, ""), PL_COORD_IGNORED); /* once */
    /* the next checkpoint cannot be written */
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 1) == 0);
    save_all(&s, 2, -1); /* answered without an error... */
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 2);
    CHECK(run_step(&s, 2) == 0);
    save_layers(&s, 3, -1);
    CHECK_EQ_INT(complete_asked(&s, "/ckpt/step-00000003: read-only file system"), 1);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 2);
    const char *why = NULL;
    CHECK_EQ_INT(pl_coord_checkpoint_failed(s.c, &why), 3);
    CHECK_STR_CONTAINS(why, "read-only file system (on w1)");
    sim_free(&s);
}

/* The last step's checkpoint: the job waits (SAVING) for its checkpoint_done. */
static void test_last_checkpoint_waits_for_its_completion(void)
{
    sim s;
    CHECK(sim_checkpointed(&s, 2, 6, 0, 0) == 0);
    CHECK(sim_started(&s, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK(run_step(&s, 1) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_SAVING);
    save_layers(&s, 2, -1);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_COMPLETE_CHECKPOINT), 1);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_SAVING);
    /* the asked worker (w0, idle or not) leaves the job by dying: w1 is asked */
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w0", "killed"), PL_COORD_OK);
    s.live[0] = 0;
    /* its layers were saved before: only checkpoint.json is left, written by another */
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_SAVING);
    CHECK_EQ_INT(complete_asked(&s, ""), 1);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_DONE);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 2);
    sim_free(&s);
}

/* The worker of pipeline 0, stage `stage` (-1: none). */
static int pipeline0_stage(const sim *s, int stage)
{
    for (int w = 0; w < s->nw; w++)
        if (s->live[w] && s->have_plan[w] && s->plan[w].u.plan.you_pipeline == 0 &&
            s->plan[w].u.plan.you_stage == stage)
            return w;
    return -1;
}

/* A writer of the last checkpoint lost before its `saved`: the checkpoint cannot complete
 * as it is; the survivors hold the last state, so a new plan's pipeline 0 writes it again
 * (save) and the job ends with it, neither incomplete nor waiting forever. */
static void test_last_checkpoint_writer_lost_is_written_again(void)
{
    sim s;
    CHECK(sim_checkpointed(&s, 2, 6, 0, 0) == 0);
    CHECK(sim_started(&s, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK(run_step(&s, 1) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_SAVING);
    const int lost = pipeline0_stage(&s, 1);
    CHECK(lost >= 0);
    save_layers(&s, 2, 1);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_COMPLETE_CHECKPOINT), 0);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, nm(lost), "killed"), PL_COORD_OK);
    s.live[lost] = 0;
    const char *why = NULL;
    CHECK_EQ_INT(pl_coord_checkpoint_failed(s.c, &why), 2);
    CHECK_STR_CONTAINS(why, "gone before its layers");
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 5);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_SAVING);
    CHECK_EQ_INT(count_type(&s, PL_MSG_START_STEP), 0);
    const int w0 = pipeline0_stage(&s, 0);
    CHECK(w0 >= 0 && msg_to(&s, w0, PL_MSG_SAVE) && msg_to(&s, w0, PL_MSG_SAVE)->u.save.step == 2);
    save_layers(&s, 2, -1);
    CHECK_EQ_INT(complete_asked(&s, NULL), 1);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_DONE);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 2);
    sim_free(&s);
}

/* The same in the middle of the training: the next commit writes a checkpoint. */
static void test_checkpoint_writer_lost_is_retried_at_the_next_commit(void)
{
    sim s;
    CHECK(sim_checkpointed(&s, 6, 6, 2, 0) == 0);
    CHECK(sim_started(&s, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK(run_step(&s, 1) == 0); /* its commit asked for the checkpoint of step 2 */
    const int lost = pipeline0_stage(&s, 1);
    CHECK(lost >= 0);
    save_layers(&s, 2, 1);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, nm(lost), "killed"), PL_COORD_OK);
    s.live[lost] = 0;
    CHECK_EQ_INT(pl_coord_checkpoint_failed(s.c, NULL), 2);
    CHECK(drain(&s) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_step(s.c), 2);
    report_all(&s, 2, -1, 1);
    CHECK(drain(&s) == 0);
    const int w0 = pipeline0_stage(&s, 0);
    CHECK(w0 >= 0 && msg_to(&s, w0, PL_MSG_COMMIT) && msg_to(&s, w0, PL_MSG_COMMIT)->u.commit.save);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 0);
    sim_free(&s);
}

/* Reports (as report_all) where worker `bad` has a non-finite loss (it must hold the head)
 * or share of the norm: returns what pl_coord_report answered it. */
static int report_nonfinite(sim *s, int64_t st, int bad, double loss, double sumsq)
{
    int rc = -100;
    for (int w = 0; w < s->nw; w++) {
        if (!s->live[w] || !in_pipes(s, w))
            continue;
        const pl_msg_plan *p = &s->plan[w].u.plan;
        pl_msg_report r = {.step = st, .grad_sumsq = w == bad ? sumsq : 0.25};
        if (p->you_layer_end == L) {
            r.has_loss = 1;
            r.loss = w == bad ? loss : 2.0 * (double)p->pipelines[p->you_pipeline].microbatches;
        }
        int x = pl_coord_report(s->c, nm(w), s->gen, &r);
        if (w == bad)
            rc = x;
        pl_coord_reduced(s->c, nm(w), s->gen, st);
    }
    return rc;
}

/* A worker whose plan holds the LM head (a last stage). */
static int head_worker(const sim *s)
{
    for (int w = 0; w < s->nw; w++)
        if (s->live[w] && in_pipes(s, w) && s->plan[w].u.plan.you_layer_end == L)
            return w;
    return -1;
}

/* A non-finite loss in a report: the step is aborted on every pipeline worker at once and
 * never committed; an attempt that then goes through commits it with the step's values
 * (no NaN in the log); the failures of one step are counted apart from another's. */
static void test_nonfinite_report_never_committed(void)
{
    sim s;
    CHECK(begin_run(&s, 6, 4) == 0);
    CHECK(run_step(&s, 0) == 0);
    int h = head_worker(&s);
    CHECK(h >= 0);
    int64_t g = s.gen;
    CHECK_EQ_INT(report_nonfinite(&s, 1, h, NAN, 0.25), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_COMMIT), 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 4);
    const pl_msg *ab = msg_to(&s, h, PL_MSG_ABORT);
    CHECK(ab && ab->u.abort_.step == 1 && ab->gen == g);
    CHECK_STR_CONTAINS(ab->u.abort_.reason, "non-finite loss (nan)");
    CHECK(s.gen == g + 1 && plans_valid(&s) == 0 && s.plan[0].u.plan.step == 1);
    const pl_coord_reconfig_rec *rec = pl_coord_reconfig(s.c, pl_coord_nreconfigs(s.c) - 1);
    CHECK(rec && !rec->removed[0]);
    CHECK_STR_CONTAINS(rec->cause, "non-finite loss (nan)");
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 1);
    /* the redone step goes through: committed with finite values */
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 1) == 0);
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 2);
    CHECK(isfinite(pl_coord_step_log(s.c, 1)->loss) && isfinite(pl_coord_step_log(s.c, 1)->norm));
    /* step 2: +inf shares twice, then fine: its attempts are its own */
    h = head_worker(&s);
    for (int k = 0; k < PL_COORD_STEP_ATTEMPTS - 1; k++) {
        CHECK_EQ_INT(report_nonfinite(&s, 2, h, 1.0, INFINITY), PL_COORD_OK);
        CHECK(drain(&s) == 0);
        CHECK_EQ_INT(count_type(&s, PL_MSG_COMMIT), 0);
        CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
        all_copy_done(&s);
        CHECK(drain(&s) == 0);
        h = head_worker(&s);
    }
    CHECK(run_step(&s, 2) == 0);
    CHECK(run_step(&s, 3) == 0);
    /* a stale report of a non-finite step changes nothing */
    pl_msg_report late = {.step = 3, .has_loss = 1, .loss = NAN, .grad_sumsq = NAN};
    CHECK_EQ_INT(pl_coord_report(s.c, "w0", s.gen, &late), PL_COORD_IGNORED);
    CHECK(run_step(&s, 4) == 0);
    CHECK(run_step(&s, 5) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_DONE);
    for (int k = 0; k < pl_coord_nsteps(s.c); k++)
        CHECK(isfinite(pl_coord_step_log(s.c, k)->loss));
    sim_free(&s);
}

/* step_failed with the same reason on every attempt: the job fails after
 * PL_COORD_STEP_ATTEMPTS, saying it is the job's failure, and keeps no node out; with
 * different reasons it says nothing of the kind. */
static void test_step_failing_every_attempt(void)
{
    for (int same = 1; same >= 0; same--) {
        sim s;
        CHECK(begin_run(&s, 9, 4) == 0);
        CHECK(run_step(&s, 0) == 0);
        for (int k = 0; k < PL_COORD_STEP_ATTEMPTS; k++) {
            CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_RUNNING);
            pl_msg m;
            pl_msg_init(&m, PL_MSG_STEP_FAILED, s.gen);
            m.u.step_failed.step = 1;
            snprintf(m.u.step_failed.reason, sizeof m.u.step_failed.reason, "cuda: illegal "
                     "address%s", same || k == 0 ? "" : " (again)");
            CHECK_EQ_INT(pl_coord_on_msg(s.c, nm(k), &m, 10 + k), PL_COORD_OK);
            CHECK(drain(&s) == 0);
            CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 4);
            CHECK_EQ_INT(count_type(&s, PL_MSG_COMMIT), 0);
            if (k + 1 < PL_COORD_STEP_ATTEMPTS) {
                all_copy_done(&s);
                CHECK(drain(&s) == 0);
            }
        }
        CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_FAILED);
        CHECK_STR_CONTAINS(pl_coord_reason(s.c), "step 1 failed 3 times");
        CHECK_STR_CONTAINS(pl_coord_reason(s.c), "cuda: illegal address");
        CHECK(!strstr(pl_coord_reason(s.c), "the same way") == !same);
        CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 4);
        const char *cooling[4];
        CHECK_EQ_INT(pl_coord_cooling_nodes(s.c, 20, cooling, 4), 0);
        CHECK_EQ_INT(pl_coord_live_workers(s.c), 4);
        sim_free(&s);
    }
}

/* Sends fatal from worker w. */
static int fatal_from(sim *s, int w, const char *reason, int64_t now)
{
    pl_msg m;
    pl_msg_init(&m, PL_MSG_FATAL, s->gen);
    snprintf(m.u.fatal.reason, sizeof m.u.fatal.reason, "%s", reason);
    int rc = pl_coord_on_msg(s->c, nm(w), &m, now);
    s->live[w] = 0;
    return rc;
}

#define BAD_DATA "data: /d/train.bin: token 65535 at index 0 (byte offset 1024) is out of " \
                 "range for vocabulary size 256"

/* Every worker reports the same fatal error (bad data at load): the job fails with it at
 * once, as the job's failure, with no node kept out; each got stop {1}. Before all did, a
 * fatal worker is a loss like any other. */
static void test_fatal_same_on_every_worker(void)
{
    sim s;
    CHECK(sim_init(&s, 9, 4) == 0); /* threshold: min(n_start, 2) same failures */
    s.cfg.cooldown_ms = 1000;
    CHECK(sim_reconfigure(&s) == 0);
    /* w0 registers and fails before w1 is there: the job waits */
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w0", "n0", NULL, 0, 0), PL_COORD_OK);
    s.live[0] = 1, s.nw = 1;
    CHECK_EQ_INT(fatal_from(&s, 0, BAD_DATA, 5), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    const pl_msg *st = msg_to(&s, 0, PL_MSG_STOP);
    CHECK(st && st->u.stop.exit_code == 1);
    CHECK_STR_CONTAINS(st->u.stop.reason, "byte offset 1024");
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_WAITING_FOR_WORKERS);
    CHECK_EQ_INT(pl_coord_heartbeat(s.c, "w0", 0, 6), PL_COORD_ERR); /* gone */
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w1", "n1", NULL, 0, 10), PL_COORD_OK);
    s.live[1] = 1, s.nw = 2;
    CHECK_EQ_INT(fatal_from(&s, 1, BAD_DATA, 12), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_FAILED);
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "every worker failed the same way (2 workers)");
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), BAD_DATA);
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "not a node failure");
    CHECK(msg_to(&s, 1, PL_MSG_STOP) && msg_to(&s, 1, PL_MSG_STOP)->u.stop.exit_code == 1);
    const char *cooling[4];
    CHECK_EQ_INT(pl_coord_cooling_nodes(s.c, 20, cooling, 4), 0);
    sim_free(&s);

    /* a running plan of 6: a fatal error on one worker is its loss (a new plan without it);
     * once the rest failed the same way too, the job fails */
    CHECK(begin_run(&s, 9, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    int64_t g = s.gen;
    CHECK_EQ_INT(fatal_from(&s, 5, BAD_DATA, 20), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK(s.gen == g + 1 && plans_valid(&s) == 0);
    CHECK_STR_CONTAINS(pl_coord_reconfig(s.c, pl_coord_nreconfigs(s.c) - 1)->cause,
                       "failed w5 (data: ");
    for (int w = 0; w < 4; w++) {
        CHECK_EQ_INT(fatal_from(&s, w, BAD_DATA, 21 + w), PL_COORD_OK);
        CHECK(pl_coord_phase(s.c) != PL_COORD_FAILED);
    }
    CHECK_EQ_INT(fatal_from(&s, 4, BAD_DATA, 29), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_FAILED);
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "every worker failed the same way (6 workers)");
    CHECK_EQ_INT(pl_coord_cooling_nodes(s.c, 30, cooling, 4), 0);
    sim_free(&s);
}

/* Fatal errors that differ are the nodes': losses, with the node counted toward its
 * cooldown, and the job goes on with the others. */
static void test_fatal_differing_is_a_loss(void)
{
    sim s;
    CHECK(sim_init(&s, 9, 6) == 0);
    s.cfg.cooldown_ms = 1000;
    CHECK(sim_reconfigure(&s) == 0);
    for (int w = 0; w < 6; w++) {
        char node[16];
        snprintf(node, sizeof node, "n%d", w == 4 ? 3 : w);
        CHECK_EQ_INT(pl_coord_worker_registered(s.c, nm(w), node, NULL, 0, 0), PL_COORD_OK);
        s.live[w] = 1, s.nw = w + 1;
    }
    CHECK(drain(&s) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK_EQ_INT(fatal_from(&s, 3, "data: /d/train.bin: Input/output error", 10), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(fatal_from(&s, 4, "plan: out of memory", 11), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK(pl_coord_phase(s.c) != PL_COORD_FAILED);
    const char *cooling[4]; /* n3 failed twice: kept out */
    CHECK_EQ_INT(pl_coord_cooling_nodes(s.c, 20, cooling, 4), 1);
    CHECK(!strcmp(cooling[0], "n3"));
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 1) == 0);
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 2);
    sim_free(&s);
}

/* `saved` with an error: the checkpoint is given up (pl_coord_checkpoint_failed says why)
 * and the next commit writes one again (pipeline 0 asked to save), which completes and
 * clears the count; PL_COORD_CHECKPOINT_ATTEMPTS failures in a row fail the job. */
static void test_checkpoint_write_failure_retried(void)
{
    sim s;
    CHECK(sim_checkpointed(&s, 9, 4, 2, 0) == 0);
    CHECK(sim_started(&s, 4) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK(run_step(&s, 1) == 0); /* its commit asked for the checkpoint of step 2 */
    pl_msg_saved bad = {.step = 2, .layer_begin = 0, .layer_end = 1};
    snprintf(bad.error, sizeof bad.error, "/ckpt/step-00000002: Permission denied");
    CHECK_EQ_INT(pl_coord_saved(s.c, "w0", &bad), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_saved(s.c, "w0", &bad), PL_COORD_IGNORED); /* counted once */
    const char *why = NULL;
    CHECK_EQ_INT(pl_coord_checkpoint_failed(s.c, &why), 2);
    CHECK_STR_CONTAINS(why, "Permission denied (layers [0, 1) on w0)");
    CHECK_EQ_INT(pl_coord_checkpoint_failures(s.c), 1);
    save_layers(&s, 2, -1); /* the rest of step 2's layers: too late, it was given up */
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_COMPLETE_CHECKPOINT), 0);
    /* step 2's commit (a checkpoint of step 3 is not due) asks pipeline 0 to save */
    report_all(&s, 2, -1, 1);
    CHECK(drain(&s) == 0);
    int asked = 0;
    for (int k = 0; k < s.nm; k++)
        if (s.m[k].type == PL_MSG_COMMIT)
            asked += s.m[k].u.commit.save;
    CHECK(asked >= 1);
    commit_all(&s, 2);
    CHECK(drain(&s) == 0);
    save_all(&s, 3, -1);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 3);
    CHECK_EQ_INT(pl_coord_checkpoint_failures(s.c), 1); /* total */
    /* then every checkpoint fails: the job fails at the third in a row */
    for (int64_t st = 3, fails = 0; fails < PL_COORD_CHECKPOINT_ATTEMPTS; st++) {
        CHECK(run_step(&s, st) == 0);
        bad.step = st + 1; /* the checkpoint that commit asked for */
        if (pl_coord_saved(s.c, "w0", &bad) == PL_COORD_OK)
            fails++;
        CHECK(drain(&s) == 0);
        if (fails < PL_COORD_CHECKPOINT_ATTEMPTS)
            CHECK(pl_coord_phase(s.c) != PL_COORD_FAILED);
    }
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_FAILED);
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "checkpoints cannot be written: 3 attempts in a "
                                             "row failed");
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "Permission denied");
    CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 4);
    CHECK_EQ_INT(msg_to(&s, 0, PL_MSG_STOP)->u.stop.exit_code, 1);
    sim_free(&s);
}

/* The last step's checkpoint fails (a layer file, then checkpoint.json): pipeline 0 writes
 * it again (save), and it completes: DONE. Failing every time: FAILED, never DONE. A
 * failure reported before the last commit is through is written again once SAVING. */
static void test_last_checkpoint_written_again(void)
{
    for (int variant = 0; variant < 3; variant++) {
        sim s;
        CHECK(sim_checkpointed(&s, 2, 4, 0, 0) == 0);
        CHECK(sim_started(&s, 4) == 0);
        CHECK(run_step(&s, 0) == 0);
        pl_msg_saved bad = {.step = 2, .layer_begin = 0, .layer_end = 1};
        snprintf(bad.error, sizeof bad.error, "/ckpt/step-00000002: Not a directory");
        if (variant == 2) { /* the error arrives while step 1's commit is collected */
            report_all(&s, 1, -1, 1);
            CHECK(drain(&s) == 0);
            CHECK_EQ_INT(pl_coord_saved(s.c, "w0", &bad), PL_COORD_OK);
            commit_all(&s, 1);
        } else {
            CHECK(run_step(&s, 1) == 0);
            CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_SAVING);
            CHECK_EQ_INT(pl_coord_saved(s.c, "w0", &bad), PL_COORD_OK);
        }
        CHECK(drain(&s) == 0);
        CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_SAVING);
        int p0 = 0;
        for (int w = 0; w < s.nw; w++)
            p0 += s.live[w] && s.plan[w].u.plan.you_pipeline == 0;
        CHECK_EQ_INT(count_type(&s, PL_MSG_SAVE), p0);
        const pl_msg *sv = msg_to(&s, 0, PL_MSG_SAVE);
        CHECK(sv && sv->u.save.step == 2);
        if (variant == 1) { /* every attempt fails: checkpoint.json, then the layers */
            save_layers(&s, 2, -1);
            CHECK_EQ_INT(complete_asked(&s, "/ckpt/step-00000002: No space left on device"), 1);
            CHECK(drain(&s) == 0);
            CHECK_EQ_INT(count_type(&s, PL_MSG_SAVE), p0);
            CHECK_EQ_INT(pl_coord_saved(s.c, "w0", &bad), PL_COORD_OK);
            CHECK(drain(&s) == 0);
            CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_FAILED);
            CHECK_STR_CONTAINS(pl_coord_reason(s.c), "checkpoints cannot be written");
            CHECK_STR_CONTAINS(pl_coord_reason(s.c), "Not a directory");
            CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 0);
        } else {
            save_all(&s, 2, -1);
            CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_DONE);
            CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 2);
        }
        sim_free(&s);
    }
}

/* Registers worker w with what it sees under the checkpoint directory: step (≥ 0), or
 * an error; has 0: says nothing. */
static int join_with_checkpoint(sim *s, int w, int has, int64_t step, const char *error)
{
    pl_coord_worker_info wi = {.name = nm(w), .has_checkpoint = has, .checkpoint_step = step,
                               .checkpoint_error = error};
    int rc = pl_coord_worker_joined(s->c, &wi, 0);
    if (rc == PL_COORD_OK) {
        s->live[w] = 1;
        if (w >= s->nw)
            s->nw = w + 1;
    }
    return rc;
}

/* resume_auto: the first plan loads the newest checkpoint the workers can read. */
static void test_resume_from_the_workers(void)
{
    sim s;
    CHECK(sim_init(&s, 10, 4) == 0);
    s.cfg.resume_step = 99; /* not read */
    s.cfg.checkpoint_dir = "/ckpt";
    s.cfg.resume_auto = 1;
    CHECK(sim_reconfigure(&s) == 0);
    CHECK_EQ_INT(pl_coord_resume_step(s.c), -1);
    for (int w = 0; w < 4; w++)
        CHECK_EQ_INT(join_with_checkpoint(&s, w, 1, 4, ""), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_resume_step(s.c), 4);
    CHECK(!pl_coord_resume_note(s.c)[0]);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 4);
    CHECK(plans_valid(&s) == 0);
    for (int w = 0; w < 4; w++) {
        const pl_msg_plan *p = &s.plan[w].u.plan;
        CHECK(p->has_checkpoint && p->checkpoint_step == 4 && p->step == 4 &&
              !strcmp(p->checkpoint_dir, "/ckpt"));
    }
    sim_free(&s);
    /* they disagree: the newest one a worker can read, and a note */
    CHECK(sim_checkpointed(&s, 10, 4, 0, 1) == 0);
    CHECK_EQ_INT(join_with_checkpoint(&s, 0, 1, 4, ""), PL_COORD_OK);
    CHECK_EQ_INT(join_with_checkpoint(&s, 1, 1, 2, NULL), PL_COORD_OK);
    CHECK_EQ_INT(join_with_checkpoint(&s, 2, 1, 0, "permission denied"), PL_COORD_OK);
    CHECK_EQ_INT(join_with_checkpoint(&s, 3, 0, 0, NULL), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_resume_step(s.c), 4);
    CHECK_STR_CONTAINS(pl_coord_resume_note(s.c), "disagree");
    CHECK_STR_CONTAINS(pl_coord_resume_note(s.c), "w1: 2");
    CHECK_STR_CONTAINS(pl_coord_resume_note(s.c), "w2: cannot read (permission denied)");
    CHECK_STR_CONTAINS(pl_coord_resume_note(s.c), "resuming from step 4");
    CHECK_EQ_INT(s.plan[3].u.plan.checkpoint_step, 4);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 4) == 0);
    sim_free(&s);
    /* no worker can read the directory: FAILED */
    CHECK(sim_checkpointed(&s, 10, 4, 0, 1) == 0);
    for (int w = 0; w < 4; w++)
        CHECK_EQ_INT(join_with_checkpoint(&s, w, 1, 0, "no such volume"), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_FAILED);
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "no worker can read the checkpoint directory");
    CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 4);
    sim_free(&s);
}

/* A new coordinator taking over a running plan learns the newest checkpoint from the
 * workers that come back (what a fatal loss would restart from); nothing restarts. */
static void test_restore_learns_the_checkpoint(void)
{
    sim s;
    CHECK(sim_checkpointed(&s, 9, 4, 2, 1) == 0);
    const char *n0[] = {"w0", "w1"}, *n1[] = {"w2", "w3"};
    const pl_coord_pipe pipes[2] = {{.nnodes = 2, .nodes = n0, .microbatches = 8},
                                    {.nnodes = 2, .nodes = n1, .microbatches = 8}};
    CHECK_EQ_INT(pl_coord_restore(s.c, 3, 5, pipes, 2, 500), PL_COORD_OK);
    for (int w = 0; w < 4; w++) {
        CHECK_EQ_INT(join_with_checkpoint(&s, w, 1, w == 3 ? 2 : 4, ""), PL_COORD_OK);
        pl_msg_hello_resume h = {4, 0.5, 1e-3, -1};
        CHECK_EQ_INT(pl_coord_hello_resume(s.c, nm(w), 3, &h), PL_COORD_OK);
    }
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK_EQ_INT(pl_coord_last_checkpoint(s.c), 4);
    CHECK_EQ_INT(pl_coord_resume_step(s.c), -1); /* the job did not start from it */
    CHECK_EQ_INT(s.plan[0].u.plan.step, 5);
    CHECK(!s.plan[0].u.plan.has_checkpoint);
    sim_free(&s);
}

/* status.plan read back (plan_status.h): what does not read is an error naming the field. */
static void test_plan_status_errors(void)
{
#define PIPE0 "{\"generation\":3,\"pipelines\":[{\"nodes\":[\"w0\",\"w1\"],\"microbatches\":8"
    static const char *const bad[][2] = {
        {"[]", "status.plan: must be an object"},
        {"{\"pipelines\":[]}", "status.plan.generation: missing"},
        {"{\"generation\":3,\"pipelines\":{}}", "status.plan.pipelines: must be an array"},
        {PIPE0 "},7]}", "status.plan.pipelines[1]: must be an object"},
        {"{\"generation\":3,\"pipelines\":[{\"nodes\":[\"\"],\"microbatches\":1}]}",
         "status.plan.pipelines[0].nodes[0]: must be a worker name"},
        {"{\"generation\":3,\"pipelines\":[{\"nodes\":[\"w0\"],\"microbatches\":0}]}",
         "status.plan.pipelines[0].microbatches"},
        {PIPE0 ",\"layers\":[0,3,6]}]}", "status.plan.pipelines[0].templateNodes: missing"},
        {PIPE0 ",\"templateNodes\":[\"w0\"]}]}", "status.plan.pipelines[0].layers: missing"},
        {PIPE0 ",\"layers\":[0,6],\"templateNodes\":[\"w0\"]}]}",
         "status.plan.pipelines[0].layers: must be an array of 3"},
        {PIPE0 ",\"layers\":[0,\"3\",6],\"templateNodes\":[\"w0\"]}]}",
         "status.plan.pipelines[0].layers[1]"},
        {PIPE0 ",\"layers\":[0,3,6],\"templateNodes\":[\"w0\",7]}]}",
         "status.plan.pipelines[0].templateNodes[1]"},
    };
#undef PIPE0
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char err[256] = "";
        cJSON *js = cJSON_Parse(bad[k][0]);
        pl_plan_status st;
        CHECK(js != NULL);
        CHECK_EQ_INT(pl_plan_status_read(js, &st, err, sizeof err), -1);
        CHECK_STR_CONTAINS(err, bad[k][1]);
        CHECK(st.pipes == NULL);
        cJSON_Delete(js);
    }
}

/* A plan to restore that the planner cannot hold is an error naming the field; a
 * failover's bounds and template read as given. */
static void test_restore_rejects_a_bad_plan(void)
{
    const char *a[] = {"w0", "w1"}, *b[] = {"w2", "w3"}, *dup[] = {"w1", "w2"};
    const char *lost[] = {"w0", "w9", "w1"}, *other[] = {"w0", "w2", "w1"};
    const char *without[] = {"w0", "w8", "w9"};
    const int rising[] = {0, 3, L}, flat[] = {0, 4, 4};
    static const struct {
        int redundant;
        const char *want;
    } want[] = {{1, "pipeline 0: layers[2]: 4"},
                {1, "pipeline 0: template_nodes: nodes[1] is there 0 times"},
                {1, "pipeline 0: template_nodes[1]: w2 is listed twice"},
                {0, "pipeline 1: nodes[0]: w1 is listed twice"},
                {0, "restore: microbatches: 15"},
                {0, "pipeline 0: layers: a failover's bounds need strategy redundant"},
                {1, ""}};
    const pl_coord_pipe cases[][2] = {{{2, a, 8, flat, 3, lost}, {2, b, 8, NULL, 0, NULL}},
                                      {{2, a, 8, rising, 3, without}, {2, b, 8, NULL, 0, NULL}},
                                      {{2, a, 8, rising, 3, other}, {2, b, 8, NULL, 0, NULL}},
                                      {{2, a, 8, NULL, 0, NULL}, {2, dup, 8, NULL, 0, NULL}},
                                      {{2, a, 8, NULL, 0, NULL}, {2, b, 7, NULL, 0, NULL}},
                                      {{2, a, 8, rising, 3, lost}, {2, b, 8, NULL, 0, NULL}},
                                      {{2, a, 8, rising, 3, lost}, {2, b, 8, NULL, 0, NULL}}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        sim s;
        sim_redundant = want[k].redundant;
        CHECK(sim_init(&s, 9, 4) == 0);
        sim_redundant = 0;
        const int rc = pl_coord_restore(s.c, 3, 5, cases[k], 2, 500);
        CHECK_EQ_INT(rc, want[k].want[0] ? PL_COORD_ERR : PL_COORD_OK);
        CHECK_STR_CONTAINS(pl_coord_error(s.c), want[k].want);
        int layers[3];
        const char *names[3];
        if (!want[k].want[0])
            CHECK(pl_coord_plan_failover(s.c, 0, layers, names, 3) == 3 && layers[1] == 3 &&
                  !strcmp(names[1], "w9") && pl_coord_plan_failover(s.c, 1, layers, names, 3) == 0);
        sim_free(&s);
    }
}

/* The checkpoint of the last step: nothing to train, the job is done at once. */
static void test_resume_at_the_last_step(void)
{
    sim s;
    CHECK(sim_checkpointed(&s, 6, 4, 0, 1) == 0);
    for (int w = 0; w < 4; w++)
        CHECK_EQ_INT(join_with_checkpoint(&s, w, 1, 6, ""), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_DONE);
    CHECK_EQ_INT(pl_coord_resume_step(s.c), 6);
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "the checkpoint of step 6 is the last step: nothing to do");
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 4);
    CHECK_EQ_INT(msg_to(&s, 2, PL_MSG_STOP)->u.stop.exit_code, 0);
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 0);
    sim_free(&s);
}

/* spec.profile auto: the first registered worker measures; another when it is lost; the
 * profile comes back, the caller's planner made from it starts the job. */
/* A coordinator without a planner: a worker measures the profile (`repeat` runs). */
static int sim_profiling(sim *s, int64_t steps, int repeat)
{
    if (sim_init(s, steps, 5))
        return -1;
    s->cfg.profile = NULL;
    s->cfg.templates = NULL;
    s->cfg.coverage = NULL;
    s->cfg.profile_repeat = repeat;
    s->cfg.n_start = 1;
    return sim_reconfigure(s);
}

static void test_profiling_on_a_worker(void)
{
    sim s;
    CHECK(sim_profiling(&s, 3, 3) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_PROFILING);
    CHECK(!strcmp(pl_coord_phase_name(PL_COORD_PROFILING), "profiling"));
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "waiting for a worker to measure");
    CHECK(start_workers(&s, 5) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PROFILE_REQUEST), 1);
    const pl_msg *pr = msg_to(&s, 0, PL_MSG_PROFILE_REQUEST);
    CHECK(pr && pr->u.profile_request.repeat == 3);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 0);
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "measuring the model on w0");
    /* w0 is lost while it measures: w1 is asked */
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w0", "killed"), PL_COORD_OK);
    s.live[0] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PROFILE_REQUEST), 1);
    CHECK(msg_to(&s, 1, PL_MSG_PROFILE_REQUEST) != NULL);
    CHECK_EQ_INT(pl_coord_profile_done(s.c, "w0", "{}", ""), PL_COORD_ERR);
    CHECK_EQ_INT(pl_coord_profile_done(s.c, "w2", "{}", ""), PL_COORD_IGNORED);
    CHECK(pl_coord_profile_json(s.c) == NULL);
    pl_msg pd;
    pl_msg_init(&pd, PL_MSG_PROFILE_DONE, 0);
    pd.u.profile_done.profile = "{\"measured\": true}";
    CHECK_EQ_INT(pl_coord_on_msg(s.c, "w1", &pd, 5), PL_COORD_OK);
    CHECK(pl_coord_profile_json(s.c) && !strcmp(pl_coord_profile_json(s.c), "{\"measured\": true}"));
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_PROFILING); /* until the planner is there */
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "measured on w1");
    /* a worker joining meanwhile waits for the planner too */
    CHECK_EQ_INT(pl_coord_worker_registered(s.c, "w5", NULL, NULL, 0, 6), PL_COORD_OK);
    s.live[5] = 1;
    s.nw = 6;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PROFILE_REQUEST) + count_type(&s, PL_MSG_PLAN), 0);
    CHECK_EQ_INT(pl_coord_set_planner(s.c, &s.p, &s.ts, &s.cov, 5), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 5);
    CHECK(plans_valid(&s) == 0);
    CHECK_EQ_INT(pl_coord_set_planner(s.c, &s.p, &s.ts, &s.cov, 5), PL_COORD_ERR);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 0) == 0);
    sim_free(&s);
}

/* The measurement fails, or the planner made from it does not fit: FAILED. */
static void test_profiling_failures(void)
{
    sim s;
    CHECK(sim_profiling(&s, 3, 1) == 0);
    CHECK(start_workers(&s, 2) == 0);
    CHECK_EQ_INT(pl_coord_profile_done(s.c, "w0", NULL, "out of device memory"), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_FAILED);
    CHECK_STR_CONTAINS(pl_coord_reason(s.c), "measuring the model on w0 failed: out of device memory");
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 2);
    sim_free(&s);
    CHECK(sim_profiling(&s, 3, 1) == 0);
    s.cfg.global_batch = 8; /* the coverage table plans 16 */
    CHECK(sim_reconfigure(&s) == 0);
    CHECK(start_workers(&s, 1) == 0);
    CHECK_EQ_INT(pl_coord_profile_done(s.c, "w0", "{}", NULL), PL_COORD_OK);
    CHECK_EQ_INT(pl_coord_set_planner(s.c, &s.p, &s.ts, &s.cov, 5), PL_COORD_ERR);
    CHECK_STR_CONTAINS(pl_coord_error(s.c), "global_batch");
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_FAILED);
    sim_free(&s);
}

/* eval_done from every pipeline worker of the plan for step st: the last stages report
 * a loss of 1.5 per batch over (pipeline + 1) batches. Returns the expected mean. */
static double eval_all(sim *s, int64_t st)
{
    double sum = 0;
    int64_t n = 0;
    for (int w = 0; w < s->nw; w++) {
        if (!s->live[w] || !in_pipes(s, w))
            continue;
        const pl_msg_plan *p = &s->plan[w].u.plan;
        pl_msg_eval_done e = {.step = st, .batches = p->you_pipeline + 1};
        if (p->you_layer_end == L) {
            e.has_loss = 1;
            e.loss = 1.5 * (double)e.batches + 0.25 * p->you_pipeline;
            sum += e.loss;
            n += e.batches;
        }
        pl_coord_eval_done(s->c, nm(w), s->gen, &e);
    }
    return sum / (double)n;
}

/* eval_every: after the commit of steps 1 (2 % 2 == 0) and 2 (the last) the pipeline
 * workers evaluate; the coordinator logs the step with Σ losses / Σ batches; a worker lost
 * during the last evaluation: a new plan, then the evaluation again. */
static void test_eval_aggregation(void)
{
    sim s;
    CHECK(sim_init(&s, 3, 6) == 0);
    s.cfg.eval_every = 2;
    CHECK(sim_reconfigure(&s) == 0);
    CHECK(sim_started(&s, 6) == 0);
    CHECK(run_step(&s, 0) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_EVAL), 0);
    CHECK(run_step(&s, 1) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_EVAL), npipeworkers(&s));
    CHECK_EQ_INT(count_type(&s, PL_MSG_START_STEP), 0);
    CHECK_EQ_INT(msg_to(&s, 0, PL_MSG_EVAL)->u.eval.step, 1);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_EVALUATING);
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 1); /* step 1 waits for its loss */
    CHECK_EQ_INT(pl_coord_step(s.c), 2);
    pl_msg_eval_done stale = {.step = 0, .has_loss = 1, .loss = 9, .batches = 1};
    CHECK_EQ_INT(pl_coord_eval_done(s.c, "w0", s.gen, &stale), PL_COORD_IGNORED);
    stale.step = 1;
    CHECK_EQ_INT(pl_coord_eval_done(s.c, "w0", s.gen - 1, &stale), PL_COORD_IGNORED);
    double want = eval_all(&s, 1);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_START_STEP), npipeworkers(&s));
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 2);
    CHECK(isnan(pl_coord_step_log(s.c, 0)->val_loss));
    CHECK(fabs(pl_coord_step_log(s.c, 1)->val_loss - want) < 1e-12);
    CHECK(fabs(pl_coord_step_log(s.c, 1)->loss - 2.0) < 1e-12);
    /* the last step: a pipeline worker dies during its evaluation */
    CHECK(run_step(&s, 2) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_EVALUATING);
    CHECK_EQ_INT(pl_coord_worker_lost(s.c, "w4", "killed"), PL_COORD_OK);
    s.live[4] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_COPYING);
    CHECK(plans_valid(&s) == 0);
    CHECK_EQ_INT(s.plan[0].u.plan.step, 3);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_START_STEP), 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_EVAL), npipeworkers(&s));
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 2);
    want = eval_all(&s, 2);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(pl_coord_phase(s.c), PL_COORD_DONE);
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 3);
    CHECK(fabs(pl_coord_step_log(s.c, 2)->val_loss - want) < 1e-12);
    CHECK_EQ_INT(pl_coord_step_log(s.c, 2)->step, 2);
    sim_free(&s);
}

/* Heartbeats from every live worker at t, through the dispatcher, with the plan generation
 * each one's compute thread installed: s->gen, or old_gen for worker `hung`. */
static void beat_all_gen(sim *s, int64_t t, int hung, int64_t old_gen)
{
    for (int w = 0; w < s->nw; w++) {
        if (!s->live[w])
            continue;
        pl_msg hb;
        pl_msg_init(&hb, PL_MSG_HEARTBEAT, w == hung ? old_gen : s->gen);
        pl_coord_on_msg(s->c, nm(w), &hb, t);
        pl_msg_free(&hb);
    }
}

static void beat_all(sim *s, int64_t t) { beat_all_gen(s, t, -1, 0); }

/* A worker whose compute thread hangs while its heartbeats go on: the automatic step
 * deadline (10 × the median step time, at least 5 heartbeat windows) passes; the step is
 * aborted and planned again with the same workers, and the one whose compute thread never
 * takes that plan (its heartbeats keep the old generation) is lost like any other (stop to
 * it, a new plan), named in the cause. */
static void test_step_deadline_automatic(void)
{
    sim s;
    CHECK(begin_run(&s, 20, 6) == 0);
    CHECK_EQ_INT((int)pl_coord_step_deadline(s.c), -1); /* nothing timed yet */
    for (int st = 0; st < 4; st++) {                     /* steps of 2 s */
        beat_all(&s, 2000 * (st + 1));
        CHECK(run_step(&s, st) == 0);
    }
    CHECK_EQ_INT((int)pl_coord_step_deadline(s.c), 20000);
    /* step 4 starts at 8 s; w1 never reports, its heartbeats go on; the others wait on it */
    report_all(&s, 4, 1, 1);
    for (int64_t t = 10000; t <= 28000; t += 2000) {
        beat_all(&s, t);
        CHECK_EQ_INT(pl_coord_tick(s.c, t), PL_COORD_IGNORED);
    }
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(s.nm, 0);
    const int64_t old = s.gen;
    beat_all(&s, 28001);
    CHECK_EQ_INT(pl_coord_tick(s.c, 28001), PL_COORD_OK);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_ABORT), 6);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 6); /* the same workers */
    CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 0);
    CHECK_STR_CONTAINS(pl_coord_reconfig(s.c, 0)->cause,
                       "step 4 not reported within its deadline of 20.0 s: aborted");
    for (int w = 0; w < 6; w++)
        if (w != 1)
            pl_coord_copy_done(s.c, nm(w), s.gen, 0);
    for (int64_t t = 30000; t <= 48000; t += 2000) {
        beat_all_gen(&s, t, 1, old);
        CHECK_EQ_INT(pl_coord_tick(s.c, t), PL_COORD_IGNORED);
    }
    beat_all_gen(&s, 48002, 1, old);
    CHECK_EQ_INT(pl_coord_tick(s.c, 48002), PL_COORD_OK);
    s.live[1] = 0;
    CHECK_EQ_INT(pl_coord_worker_silent(s.c, "w1"), 1); /* the front end ends it */
    CHECK_EQ_INT(pl_coord_worker_silent(s.c, "w0"), 0);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_STOP), 1);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 5);
    CHECK(plans_valid(&s) == 0);
    CHECK_STR_CONTAINS(pl_coord_reconfig(s.c, 1)->cause,
                       "lost w1 (hung: plan 2 not taken within 20.0 s of the step deadline)");
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK(run_step(&s, 4) == 0); /* redone under the new plan */
    sim_free(&s);
}

/* stepTimeoutSeconds set: that deadline from the first step; a worker that never
 * answers the commit is lost, the commit stands and the next step gets a new plan. */
static void test_step_deadline_fixed(void)
{
    sim s;
    CHECK(sim_init(&s, 5, 6) == 0);
    pl_coord_free(s.c);
    s.cfg.step_timeout_ms = 5000;
    char err[256];
    s.c = pl_coord_new(&s.cfg, err, sizeof err);
    CHECK(s.c != NULL);
    CHECK(start_workers(&s, 6) == 0 && plans_valid(&s) == 0);
    all_copy_done(&s);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT((int)pl_coord_step_deadline(s.c), 5000);
    report_all(&s, 0, -1, 1);
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_COMMIT), npipeworkers(&s));
    for (int w = 0; w < s.nw; w++)
        if (w != 2 && in_pipes(&s, w))
            pl_coord_committed(s.c, nm(w), s.gen, 0);
    beat_all(&s, 2500);
    CHECK_EQ_INT(pl_coord_tick(s.c, 5000), PL_COORD_IGNORED);
    beat_all(&s, 5001);
    CHECK_EQ_INT(pl_coord_tick(s.c, 5001), PL_COORD_OK);
    s.live[2] = 0;
    CHECK(drain(&s) == 0);
    CHECK_EQ_INT(count_type(&s, PL_MSG_PLAN), 5);
    CHECK_EQ_INT((int)pl_coord_step(s.c), 1); /* the commit stands */
    CHECK_EQ_INT(pl_coord_nsteps(s.c), 1);
    CHECK_STR_CONTAINS(pl_coord_reconfig(s.c, 0)->cause,
                       "lost w2 (step 0 not committed within its deadline of 5.0 s)");
    sim_free(&s);
}

/* The bytes of layers w copies in its latest plan. */
static int64_t copied_bytes(const sim *s, int w)
{
    int64_t n = 0;
    for (int k = 0; k < s->plan[w].u.plan.ncopies; k++)
        n += s->plan[w].u.plan.copies[k].bytes;
    return n;
}

/* A run of 6 CPU workers after step 0, then worker x lost (x < 0: none): into got[w], what
 * each worker then copies (x ≥ 0), or its first plan's reserve_bytes. 0, or -1. */
static int reserve_run(int x, int64_t *got)
{
    sim s;
    int rc = begin_run(&s, 5, 6) || run_step(&s, 0) ? -1 : 0;
    if (!rc && x >= 0) {
        rc = pl_coord_worker_lost(s.c, nm(x), "process ended") == PL_COORD_OK ? 0 : -1;
        s.live[x] = 0;
        rc = rc || drain(&s) || s.gen != 2 ? -1 : 0;
    }
    for (int w = 0; !rc && w < 6; w++)
        got[w] = x >= 0 ? (w == x ? 0 : copied_bytes(&s, w)) : s.plan[w].u.plan.reserve_bytes;
    sim_free(&s);
    return rc;
}

/* reserve_bytes: for each worker, the most it copies after the loss of any one worker
 * of its plan (each loss made for real, on a coordinator of its own). */
static void test_reserve_is_the_worst_single_loss(void)
{
    int64_t reserve[6], got[6], worst[6] = {0};
    CHECK(reserve_run(-1, reserve) == 0);
    for (int x = 0; x < 6; x++) {
        CHECK(reserve_run(x, got) == 0);
        for (int w = 0; w < 6; w++)
            worst[w] = got[w] > worst[w] ? got[w] : worst[w];
    }
    int most = 0;
    for (int w = 0; w < 6; w++) {
        CHECK(reserve[w] == worst[w]);
        most = reserve[w] > reserve[most] ? w : most;
    }
    CHECK(reserve[most] > 0);
}

/* No reserve where a loss copies nothing: strategy checkpoint restarts from the
 * checkpoint, strategy redundant fails over. */
static void test_no_reserve_without_copies(void)
{
    sim s;
    CHECK(sim_init(&s, 3, 6) == 0);
    s.cfg.checkpoint_dir = "/ckpt";
    s.cfg.strategy_checkpoint = 1;
    CHECK(sim_reconfigure(&s) == 0);
    CHECK(start_workers(&s, 6) == 0);
    for (int w = 0; w < 6; w++)
        CHECK(s.have_plan[w] && s.plan[w].u.plan.reserve_bytes == 0);
    sim_free(&s);
    sim_redundant = 1;
    CHECK(begin_run(&s, 3, 6) == 0);
    sim_redundant = 0;
    for (int w = 0; w < 6; w++)
        CHECK(s.have_plan[w] && s.plan[w].u.plan.reserve_bytes == 0);
    sim_free(&s);
}

static void test_bad_config(void)
{
    sim s;
    CHECK(sim_init(&s, 3, 6) == 0);
    char err[256];
    pl_coord_config c = s.cfg;
    c.n_start = 3;
    CHECK(pl_coord_new(&c, err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "n_start");
    c = s.cfg;
    c.global_batch = 8;
    CHECK(pl_coord_new(&c, err, sizeof err) == NULL);
    CHECK_STR_CONTAINS(err, "global_batch");
    c = s.cfg;
    c.heartbeat_ms = 5;
    CHECK(pl_coord_new(&c, err, sizeof err) == NULL);
    sim_free(&s);
}

TEST_MAIN_BEGIN
RUN(test_three_steps);
RUN(test_reserve_is_the_worst_single_loss);
RUN(test_no_reserve_without_copies);
RUN(test_kill_mid_step);
RUN(test_redundant_failover);
RUN(test_fresh_coordinator_stops_a_worker_with_state);
RUN(test_redundant_failover_of_the_first_stage);
RUN(test_redundant_join_after_a_first_stage_failover);
RUN(test_redundant_restore_resumes_a_failover);
RUN(test_redundant_restore_without_a_worker_fails_over);
RUN(test_redundant_restore_a_lost_name_joins_anew);
RUN(test_loss_after_commit);
RUN(test_leaving_at_boundary);
RUN(test_join_and_heartbeats);
RUN(test_insufficient_then_join);
RUN(test_below_minimum_degrade);
RUN(test_below_minimum_degrade_then_fatal);
RUN(test_fatal_loss);
RUN(test_checkpoint_strategy_and_end);
RUN(test_limits);
RUN(test_join_checks_and_settling);
RUN(test_restore_after_coordinator_loss);
RUN(test_start_grace);
RUN(test_zone_placement);
RUN(test_added_workers_spread_over_zones);
RUN(test_zone_loss_leaves_holders);
RUN(test_notice_keeps_copy_sources);
RUN(test_notice_during_copies);
RUN(test_notice_shorter_than_step);
RUN(test_notice_held_at_the_minimum);
RUN(test_transport_and_nccl_id);
RUN(test_step_failed_replans);
RUN(test_initial_copy_loss_and_nan);
RUN(test_checkpoint_completed_by_one_worker);
RUN(test_last_checkpoint_waits_for_its_completion);
    RUN(test_last_checkpoint_writer_lost_is_written_again);
    RUN(test_checkpoint_writer_lost_is_retried_at_the_next_commit);
RUN(test_nonfinite_report_never_committed);
RUN(test_step_failing_every_attempt);
RUN(test_fatal_same_on_every_worker);
RUN(test_fatal_differing_is_a_loss);
RUN(test_checkpoint_write_failure_retried);
RUN(test_last_checkpoint_written_again);
RUN(test_resume_from_the_workers);
RUN(test_resume_at_the_last_step);
RUN(test_restore_learns_the_checkpoint);
RUN(test_plan_status_errors);
RUN(test_restore_rejects_a_bad_plan);
RUN(test_profiling_on_a_worker);
RUN(test_profiling_failures);
RUN(test_eval_aggregation);
RUN(test_bad_config);
RUN(test_step_deadline_automatic);
RUN(test_step_deadline_fixed);
RUN(test_peer_reports_are_judged);
TEST_MAIN_END
