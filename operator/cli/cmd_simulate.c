/* `pliant simulate JOB.yaml --trace FILE`: replays a spot trace in simulated time with
 * the real coordinator and planner (operator/runtime/simulator.h) under each strategy
 * asked for (and, with --below-minimum, under each spec.faultTolerance.belowMinimum asked
 * for), then prints the summary, and writes the timeline (JSON lines) and the HTML
 * report when asked. With --sweep (sim_sweep.h) it simulates every choice of F and node
 * count instead, prints the value of each and recommends one. Bad input exits with status
 * 2, a failed simulation with 1. */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"
#include "commands.h"
#include "job_plan.h"
#include "sim_report.h"
#include "sim_sweep.h"
#include "simulator.h"
#include "spot_trace.h"
#include "util.h"

#define DEFAULT_SPOT 0.918     /* Bamboo's p3 prices, $ per node-hour, without spec.cost */
#define DEFAULT_ON_DEMAND 3.06
#define MAX_STRATEGIES 8
#define MAX_BELOW 2            /* wait, degrade */
#define MAX_RUNS (MAX_STRATEGIES * MAX_BELOW)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pliant simulate JOB.yaml --trace FILE\n"
            "                       [--strategy templates|redundant|checkpoint|all]\n"
            "                       [--below-minimum wait|degrade|wait,degrade|all (the job's)]\n"
            "                       [--price spot=0.918,ondemand=3.06] [--scale K]\n"
            "                       [--out timeline.jsonl] [--report report.html]\n"
            "                       [--profile PROFILE.json] [--storage-gbps %.1f]\n"
            "                       [--startup SECONDS (%.0f)] [--notice SECONDS (%.0f)]\n"
            "                       [--cores N (0: a device per node)]\n"
            "                       [--latency-us US (the profile's pipeline_step, else 0)]\n"
            "                       [--install-ms MS (0)]\n"
            "                       [--zones N [--zone-loss P (0)] [--zone-blind]]\n"
            "       pliant simulate JOB.yaml --trace FILE --sweep tolerate=1,2,3 nodes=16,24,32\n"
            "                       [the options above but --out and --report]\n",
            PL_SIM_DEFAULT_STORAGE_GBPS, PL_SIM_DEFAULT_STARTUP_S, PL_SIM_DEFAULT_NOTICE_S);
}

typedef struct {
    const char *job, *trace, *strategy, *price, *out, *report, *profile;
    long long scale, cores, zones;
    double latency_us, install_ms, zone_loss;
    int zone_blind;
    double storage_GBps, startup_s, notice_s, spot, on_demand;
    pl_sweep sweep;
    int sweeping;
    pl_below_minimum below[MAX_BELOW]; /* --below-minimum's, in its order */
    int nbelow;                        /* 0: the job's belowMinimum, rows named as strategies */
} sim_args;

/* "spot=X,ondemand=Y" (either may be left out). */
static int parse_price(const char *s, sim_args *a, char *err, size_t errlen)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) return pl_errf(err, errlen, "--price: expected spot=X,ondemand=Y (got %s)", tok);
        *eq = 0;
        double *dst = !strcmp(tok, "spot") ? &a->spot : !strcmp(tok, "ondemand") ? &a->on_demand : NULL;
        if (!dst) return pl_errf(err, errlen, "--price: unknown price %s (spot, ondemand)", tok);
        if (cli_parse_double("--price", eq + 1, 0, 1e9, dst, err, errlen)) return -1;
    }
    return 0;
}

/* "wait", "degrade", "wait,degrade" (rows in that order) or "all". */
static int parse_below_minimum(const char *s, sim_args *a, char *err, size_t errlen)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", !strcmp(s, "all") ? "wait,degrade" : s);
    a->nbelow = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        pl_below_minimum b;
        if (pl_below_minimum_from_name(tok, &b))
            return pl_errf(err, errlen, "--below-minimum: unknown value %s (wait, degrade, all)",
                           tok);
        for (int i = 0; i < a->nbelow; i++)
            if (a->below[i] == b)
                return pl_errf(err, errlen, "--below-minimum: %s given twice", tok);
        a->below[a->nbelow++] = b;
    }
    if (!a->nbelow)
        return pl_errf(err, errlen, "--below-minimum: expected wait, degrade, wait,degrade or all");
    return 0;
}

static int parse_num_flag(int c, const char *v, sim_args *a, char *err, size_t errlen)
{
    switch (c) {
    case 'k': return cli_parse_int("--scale", v, 1, 100000, &a->scale, err, errlen);
    case 'g': return cli_parse_double("--storage-gbps", v, 1e-6, 1e6, &a->storage_GBps, err, errlen);
    case 'u': return cli_parse_double("--startup", v, 0, 1e7, &a->startup_s, err, errlen);
    case 'n': return cli_parse_double("--notice", v, 0, 1e7, &a->notice_s, err, errlen);
    case 'c': return cli_parse_int("--cores", v, 0, 1 << 20, &a->cores, err, errlen);
    case 'l': return cli_parse_double("--latency-us", v, 0, 1e9, &a->latency_us, err, errlen);
    case 'i': return cli_parse_double("--install-ms", v, 0, 1e9, &a->install_ms, err, errlen);
    case 'z': return cli_parse_int("--zones", v, 1, 1000, &a->zones, err, errlen);
    case 'Z': return cli_parse_double("--zone-loss", v, 0, 1, &a->zone_loss, err, errlen);
    default: return pl_errf(err, errlen, "unknown option");
    }
}

/* The flags whose value is parsed: --sweep, --below-minimum, the numbers. */
static int parse_value_flag(int c, const char *v, sim_args *a, char *err, size_t errlen)
{
    if (c == 'w') {
        a->sweeping = 1;
        return pl_sweep_parse(&a->sweep, v, err, errlen);
    }
    if (c == 'b') return parse_below_minimum(v, a, err, errlen);
    return parse_num_flag(c, v, a, err, errlen);
}

/* The words after the options: the one JOB.yaml and, with --sweep, its further dimensions,
 * which stand as words of their own: nodes=16,24,32 */
static int take_words(int argc, char **argv, sim_args *a, char *err, size_t errlen)
{
    for (; optind < argc; optind++) {
        if (a->sweeping && strchr(argv[optind], '=')) {
            if (pl_sweep_parse(&a->sweep, argv[optind], err, errlen)) return -1;
        } else if (a->job) {
            return pl_errf(err, errlen, "expected one JOB.yaml (got %s too)", argv[optind]);
        } else {
            a->job = argv[optind];
        }
    }
    return 0;
}

/* What is required, the flags that only go together, then --price's value. */
static int check_sim_args(sim_args *a, char *err, size_t errlen)
{
    if (!a->job) return pl_errf(err, errlen, "expected one JOB.yaml");
    if (!a->trace) return pl_errf(err, errlen, "--trace: required");
    if (!a->zones && (a->zone_loss > 0 || a->zone_blind))
        return pl_errf(err, errlen, "--zone-loss, --zone-blind: need --zones");
    if (a->sweeping && (a->out || a->report))
        return pl_errf(err, errlen, "--sweep: prints a table; --out and --report are for one "
                       "simulation");
    if (a->sweeping && a->nbelow > 1)
        return pl_errf(err, errlen, "--below-minimum: one value with --sweep (the belowMinimum "
                       "of every choice)");
    return a->price ? parse_price(a->price, a, err, errlen) : 0;
}

static int parse_args(int argc, char **argv, sim_args *a, char *err, size_t errlen)
{
    static const struct option opts[] = {
        {"trace", required_argument, 0, 't'},   {"strategy", required_argument, 0, 's'},
        {"price", required_argument, 0, 'p'},   {"scale", required_argument, 0, 'k'},
        {"out", required_argument, 0, 'o'},     {"report", required_argument, 0, 'r'},
        {"profile", required_argument, 0, 'P'}, {"storage-gbps", required_argument, 0, 'g'},
        {"startup", required_argument, 0, 'u'}, {"notice", required_argument, 0, 'n'},
        {"cores", required_argument, 0, 'c'},   {"latency-us", required_argument, 0, 'l'},
        {"install-ms", required_argument, 0, 'i'}, {"sweep", required_argument, 0, 'w'},
        {"zones", required_argument, 0, 'z'},   {"zone-loss", required_argument, 0, 'Z'},
        {"zone-blind", no_argument, 0, 'B'},   {"below-minimum", required_argument, 0, 'b'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    *a = (sim_args){.strategy = "all", .scale = 1, .storage_GBps = PL_SIM_DEFAULT_STORAGE_GBPS,
                    .startup_s = PL_SIM_DEFAULT_STARTUP_S, .notice_s = PL_SIM_DEFAULT_NOTICE_S,
                    .latency_us = -1, .spot = -1, .on_demand = -1};
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'h') return 1;
        if (c == 'B') {
            a->zone_blind = 1;
            continue;
        }
        if (c == '?') return pl_errf(err, errlen, "unknown or incomplete option %s", argv[optind - 1]);
        if (c == 't') a->trace = optarg;
        else if (c == 's') a->strategy = optarg;
        else if (c == 'p') a->price = optarg;
        else if (c == 'o') a->out = optarg;
        else if (c == 'r') a->report = optarg;
        else if (c == 'P') a->profile = optarg;
        else if (parse_value_flag(c, optarg, a, err, errlen)) return -1;
    }
    if (take_words(argc, argv, a, err, errlen)) return -1;
    return check_sim_args(a, err, errlen);
}

/* The strategies named by --strategy: their count, or -1 with err. */
static int pick_strategies(const char *name, const pl_sim_strategy **out, char *err, size_t errlen)
{
    if (!strcmp(name, "all")) {
        int n = 0;
        while (n < MAX_STRATEGIES && (out[n] = pl_sim_strategy_at(n))) n++;
        return n;
    }
    if (!(out[0] = pl_sim_strategy_find(name)))
        return pl_errf(err, errlen, "--strategy: unknown strategy %s (templates, redundant, checkpoint, all)",
                       name);
    return 1;
}

static void timeline_line(void *user, const char *json) { fprintf(user, "%s\n", json); }

static double percent(int64_t part, double total)
{
    return total > 0 ? 100.0 * (double)part / total : 0.0;
}

/* A run's lines, named `name`: the figures, the time split, the time below the minimum. */
static void print_summary(const sim_args *a, const char *name, const pl_sim_outcome *r)
{
    double hours = pl_sim_node_hours(r), usd = hours * a->spot, total = (double)r->duration_ns;
    const pl_sim_account *t = &r->acct;
    printf("%s: %.2f samples/s, %.1f samples per $, %lld steps, %.2f node-hours, $%.2f spent "
           "($%.2f on demand), %d reconfigurations (%d from a checkpoint), %.2f GB copied, %s%s%s\n",
           name, pl_sim_samples_per_s(r), usd > 0 ? (double)r->samples / usd : 0.0,
           (long long)r->steps, hours, usd, hours * a->on_demand, r->reconfigs, r->from_checkpoint,
           (double)r->bytes_copied / 1e9, r->end_phase, r->reason[0] ? ": " : "", r->reason);
    printf("  time:");
    for (int k = 0; k < PL_SIM_T_COUNT; k++)
        printf(" %s %.1f %%", pl_sim_time_kind_name(k), percent(t->split_ns[k], total));
    printf("\n  below the minimum: waiting %.1f min (%.1f %%), degraded %.1f min (%.1f %%)\n",
           (double)t->below_wait_ns / 60e9, percent(t->below_wait_ns, total),
           (double)t->degraded_ns / 60e9, percent(t->degraded_ns, total));
}

/* The planners the strategies run on: [0] the templates' (templates, checkpoint), [1]
 * redundant computation's (templates that fit shadows). */
#define NPLANNERS 2

static int planner_of(const pl_sim_strategy *st) { return st->planner == PL_STRATEGY_REDUNDANT; }

typedef struct {
    pl_job job;
    pl_job_plan plan[NPLANNERS];
    pl_trace_event *trace;
    int ntrace, have_job, have_plan[NPLANNERS];
} sim_inputs;

static void inputs_free(sim_inputs *in)
{
    for (int i = 0; i < NPLANNERS; i++)
        if (in->have_plan[i]) pl_job_plan_free(&in->plan[i]);
    if (in->have_job) pl_job_free(&in->job);
    free(in->trace);
}

/* The planner of strategy st for up to nmax nodes, once per planner. */
static int load_plan(sim_inputs *in, const pl_sim_strategy *st, int nmax, char *err, size_t errlen)
{
    const int i = planner_of(st);
    if (in->have_plan[i]) return 0;
    pl_job j = in->job; /* a view with the strategy's planner; owns nothing */
    j.fault_tolerance.strategy = st->planner;
    char why[768];
    if (pl_job_plan_init(&in->plan[i], &j, nmax, why, sizeof why)) {
        pl_job_plan_free(&in->plan[i]);
        return pl_errf(err, errlen, "--strategy %s: %s", st->name, why);
    }
    in->have_plan[i] = 1;
    return 0;
}

/* The nodes the planners plan for: the trace's peak or the job's nodes.max. */
static int plan_nodes(const sim_inputs *in)
{
    int nodes, peak;
    pl_sim_trace_nodes(in->trace, in->ntrace, &nodes, &peak);
    return peak > in->job.nodes.max ? peak : in->job.nodes.max;
}

/* The planners of the strategies. */
static int load_plans(sim_inputs *in, const pl_sim_strategy *const *st, int n, char *err,
                      size_t errlen)
{
    const int nmax = plan_nodes(in);
    for (int i = 0; i < n; i++)
        if (load_plan(in, st[i], nmax, err, errlen)) return -1;
    return 0;
}

/* The job (its profile replaced by --profile) and the trace at its scale. */
static int load_inputs(sim_args *a, sim_inputs *in, char *err, size_t errlen)
{
    if (pl_job_load(a->job, &in->job, err, errlen)) return -1;
    in->have_job = 1;
    if (a->profile) snprintf(in->job.profile, sizeof in->job.profile, "%s", a->profile);
    if (!strcmp(in->job.profile, "auto"))
        return pl_errf(err, errlen, "spec.profile: auto is measured by a worker at run time; "
                       "simulate needs a profile file (spec.profile or --profile)");
    if (a->spot < 0) a->spot = in->job.cost.spot > 0 ? in->job.cost.spot : DEFAULT_SPOT;
    if (a->on_demand < 0)
        a->on_demand = in->job.cost.on_demand > 0 ? in->job.cost.on_demand : DEFAULT_ON_DEMAND;
    pl_trace_event *raw;
    int nraw;
    if (pl_spot_trace_load(a->trace, &raw, &nraw, err, errlen)) return -1;
    int rc = pl_spot_trace_scale(raw, nraw, (int)a->scale, &in->trace, &in->ntrace, err, errlen);
    free(raw);
    if (rc || !a->zones) return rc;
    pl_trace_event *scaled = in->trace;
    rc = pl_spot_trace_zones(scaled, in->ntrace, (int)a->zones, a->zone_loss, &in->trace,
                             &in->ntrace, err, errlen);
    free(scaled);
    if (rc) in->trace = NULL;
    return rc;
}

static int write_report(const sim_args *a, const sim_inputs *in, const pl_sim_outcome *res,
                        const char *const *names, const char *const *timelines, int n)
{
    FILE *f = fopen(a->report, "w");
    pl_sim_report_info info = {.job = &in->job, .spot = a->spot, .on_demand = a->on_demand};
    int rc = f ? pl_sim_report_write(f, &info, res, names, timelines, n) : -1;
    if (f && fclose(f)) rc = -1;
    if (rc) fprintf(stderr, "pliant simulate: cannot write %s\n", a->report);
    return rc;
}

/* One strategy's simulation, run on a thread of its own: its timeline goes to a memory
 * buffer, written out in strategy order once all are done. */
typedef struct {
    pl_job job; /* the inputs' job with the run's belowMinimum: a view, owns nothing */
    pl_sim_config cfg;
    pl_sim_outcome res;
    char *buf;
    size_t len;
    FILE *mem;
    int rc;
    char err[1024];
} sim_job;

static void *run_one(void *arg)
{
    sim_job *j = arg;
    j->rc = pl_sim_run(&j->cfg, &j->res, j->err, sizeof j->err);
    return NULL;
}

/* Strategy st's simulation of the job, with belowMinimum `below` (< 0: the job's). */
static void job_setup(sim_job *j, const sim_args *a, const sim_inputs *in,
                      const pl_sim_strategy *st, int below, int timeline)
{
    memset(j, 0, sizeof *j);
    j->job = in->job;
    if (below >= 0) j->job.fault_tolerance.below_minimum = (pl_below_minimum)below;
    const pl_job_plan *plan = &in->plan[planner_of(st)];
    j->cfg = (pl_sim_config){
        .job = &j->job, .plan = plan, .strategy = st,
        .costs = {.profile = &plan->prof, .templates = &plan->ts,
                  .storage_GBps = a->storage_GBps,
                  .startup_ns = (int64_t)(a->startup_s * 1e9),
                  .notice_ns = (int64_t)(a->notice_s * 1e9), .cores = (int)a->cores,
                  .latency_ns = (int64_t)(a->latency_us * 1e3),
                  .install_ns = (int64_t)(a->install_ms * 1e6),
                  .frc_eager = in->job.fault_tolerance.redundant_forward == PL_FRC_EAGER},
        .trace = in->trace, .ntrace = in->ntrace, .zones = a->zone_blind ? 0 : (int)a->zones};
    if (timeline && (j->mem = open_memstream(&j->buf, &j->len))) {
        j->cfg.timeline = timeline_line;
        j->cfg.user = j->mem;
    }
}

/* The pipeline_step of the job's profile file (workers 0: synthetic, or none measured). */
static int profile_pipeline_step(const pl_job *job, pl_pipeline_step *ps, char *err,
                                 size_t errlen)
{
    *ps = (pl_pipeline_step){0};
    if (!strcmp(job->profile, "synthetic")) return 0;
    pl_profile p;
    if (pl_profile_load(job->profile, &p, err, errlen)) return -1;
    *ps = p.pipeline_step;
    pl_profile_free(&p);
    return 0;
}

/* Without --latency-us, the latency of a message on the machine that measured the profile:
 * the one at which the job, failure-free on its pipeline_step's workers under the strategy
 * measured, steps as the real one did there (0 when the profile has no pipeline_step).
 * Printed: it is a figure of that machine. */
static int latency_from_profile(sim_args *a, sim_inputs *in, char *err, size_t errlen)
{
    if (a->latency_us >= 0) return 0;
    a->latency_us = 0;
    pl_pipeline_step ps;
    if (profile_pipeline_step(&in->job, &ps, err, errlen)) return -1;
    if (!ps.workers) return 0;
    const pl_sim_strategy *st = pl_sim_strategy_find(ps.strategy);
    if (!st)
        return pl_errf(err, errlen, "pipeline_step.strategy: %s is not simulated", ps.strategy);
    const int nmax = plan_nodes(in);
    if (ps.workers > nmax)
        return pl_errf(err, errlen, "pipeline_step.workers: %d, more than the %d nodes the job "
                       "plans for here", ps.workers, nmax);
    sim_job j;
    int64_t ns;
    char why[768];
    if (load_plan(in, st, nmax, err, errlen)) return -1;
    job_setup(&j, a, in, st, -1, 0);
    if (pl_sim_latency_for_step(&j.cfg, ps.workers, ps.ns, &ns, why, sizeof why))
        return pl_errf(err, errlen, "pipeline_step: %s", why);
    a->latency_us = (double)ns / 1e3;
    printf("latency: %.0f us a message, from the profile's pipeline_step (%s, %d workers of %d "
           "threads: %.2f ms a step)\n",
           a->latency_us, ps.strategy, ps.workers, ps.threads, (double)ps.ns / 1e6);
    return 0;
}

/* The simulations of jobs[0..n), two at a time (they share only the read-only job,
 * planner and trace). */
static void run_all(sim_job *jobs, int n)
{
    pthread_t th;
    for (int i = 0; i < n; i += 2) {
        int two = i + 1 < n && pthread_create(&th, NULL, run_one, &jobs[i + 1]) == 0;
        run_one(&jobs[i]);
        if (two) pthread_join(th, NULL);
        else if (i + 1 < n) run_one(&jobs[i + 1]);
    }
}

/* Run i of simulate's: strategy i / nb, under --below-minimum's value i % nb (nb: their
 * count, or 1 for the job's own); named by its strategy, and its belowMinimum when asked. */
static void run_setup(sim_job *j, char *name, size_t len, const sim_args *a,
                      const sim_inputs *in, const pl_sim_strategy *const *st, int i, int timeline)
{
    const int nb = a->nbelow ? a->nbelow : 1;
    const pl_sim_strategy *s = st[i / nb];
    const int below = a->nbelow ? (int)a->below[i % nb] : -1;
    job_setup(j, a, in, s, below, timeline);
    if (below < 0) snprintf(name, len, "%s", s->name);
    else snprintf(name, len, "%s, %s", s->name, pl_below_minimum_name((pl_below_minimum)below));
}

/* Every strategy (under each belowMinimum asked for) over the trace, the summaries and
 * timelines in that order, then the report: 0, or 1 on failure. */
static int simulate(const sim_args *a, const sim_inputs *in, const pl_sim_strategy **st, int n,
                    FILE *out)
{
    sim_job jobs[MAX_RUNS];
    char names[MAX_RUNS][64];
    const int nrun = n * (a->nbelow ? a->nbelow : 1);
    int rc = 0, done = 0;
    for (int i = 0; i < nrun; i++)
        run_setup(&jobs[i], names[i], sizeof names[i], a, in, st, i, out || a->report);
    run_all(jobs, nrun);
    for (int i = 0; i < nrun; i++) {
        if (jobs[i].mem && fclose(jobs[i].mem)) jobs[i].rc = -1;
        if (!rc && jobs[i].rc) {
            fprintf(stderr, "pliant simulate: %s: %s\n", names[i],
                    jobs[i].err[0] ? jobs[i].err : "cannot write the timeline");
            rc = 1;
        }
        if (!rc) {
            if (out && jobs[i].buf) fwrite(jobs[i].buf, 1, jobs[i].len, out);
            print_summary(a, names[i], &jobs[i].res);
            done++;
        }
    }
    pl_sim_outcome res[MAX_RUNS];
    const char *timelines[MAX_RUNS], *run_names[MAX_RUNS];
    for (int i = 0; i < nrun; i++)
        res[i] = jobs[i].res, timelines[i] = jobs[i].buf, run_names[i] = names[i];
    if (rc == 0 && a->report && write_report(a, in, res, run_names, timelines, done)) rc = 1;
    for (int i = 0; i < nrun; i++) {
        if (!jobs[i].rc) pl_sim_outcome_free(&res[i]);
        free(jobs[i].buf);
    }
    return rc;
}

/* One choice of the sweep: the job with F = tolerate, asking for at most `nodes` of the
 * trace's (0: all), every strategy that can plan it; its rows into rows[*nrows]. */
static void sweep_choice(const sim_args *a, const sim_inputs *in, const pl_sim_strategy **st,
                         int n, int tolerate, int nodes, pl_sweep_row *rows, int *nrows)
{
    sim_inputs v = {.job = in->job}; /* a view of the job: owns its trace and plans only */
    v.job.fault_tolerance.tolerate = tolerate;
    sim_job jobs[MAX_STRATEGIES];
    char err[MAX_STRATEGIES][1024], trace_err[256] = "";
    int rc = 0, peak, ignored, run = 0;
    if (nodes > 0) {
        v.job.nodes.max = nodes;
        rc = pl_spot_trace_cap(in->trace, in->ntrace, nodes, &v.trace, &v.ntrace, trace_err,
                               sizeof trace_err);
    } else if ((v.trace = malloc(((size_t)in->ntrace + 1) * sizeof *v.trace))) {
        memcpy(v.trace, in->trace, (size_t)in->ntrace * sizeof *v.trace);
        v.ntrace = in->ntrace;
    } else {
        rc = pl_errf(trace_err, sizeof trace_err, "out of memory");
    }
    if (rc == 0) pl_sim_trace_nodes(v.trace, v.ntrace, &ignored, &peak);
    for (int i = 0; i < n; i++) {
        jobs[i].rc = rc ? -1 : load_plan(&v, st[i], peak > v.job.nodes.max ? peak : v.job.nodes.max,
                                         err[i], sizeof err[i]);
        if (rc) snprintf(err[i], sizeof err[i], "%s", trace_err);
        if (jobs[i].rc == 0)
            job_setup(&jobs[run++], a, &v, st[i], a->nbelow ? (int)a->below[0] : -1, 0);
    }
    run_all(jobs, run);
    for (int i = 0, j = 0; i < n; i++) {
        pl_sweep_row *r = &rows[(*nrows)++];
        *r = (pl_sweep_row){.tolerate = tolerate, .nodes = nodes, .strategy = st[i]->name};
        printf("tolerate %d, nodes %s%d, %s: ", tolerate, nodes ? "" : "all ", nodes, st[i]->name);
        if (!v.have_plan[planner_of(st[i])]) {
            printf("cannot plan: %s\n", err[i]);
            continue;
        }
        sim_job *x = &jobs[j++];
        if (x->rc) {
            printf("cannot run: %s\n", x->err);
            continue;
        }
        const pl_sim_outcome *o = &x->res;
        const double usd = pl_sim_node_hours(o) * a->spot;
        r->samples_per_s = pl_sim_samples_per_s(o);
        r->samples_per_usd = usd > 0 ? (double)o->samples / usd : 0;
        r->ok = strcmp(o->end_phase, "failed") != 0;
        printf("%.2f samples/s, %.1f samples per $, %.2f node-hours, %d reconfigurations "
               "(%d from a checkpoint), %s\n",
               r->samples_per_s, r->samples_per_usd, pl_sim_node_hours(o), o->reconfigs,
               o->from_checkpoint, o->end_phase);
        pl_sim_outcome_free(&x->res);
    }
    inputs_free(&v);
}

/* Every choice of the sweep, then the one recommended: 0, or 1 when none ran. */
static int sweep(const sim_args *a, const sim_inputs *in, const pl_sim_strategy **st, int n)
{
    const pl_sweep *g = &a->sweep;
    const int nf = g->ntolerate ? g->ntolerate : 1, nn = g->nnodes ? g->nnodes : 1;
    pl_sweep_row *rows = calloc((size_t)(nf * nn * n), sizeof *rows);
    if (!rows) {
        fprintf(stderr, "pliant simulate: out of memory\n");
        return 1;
    }
    int nrows = 0;
    for (int f = 0; f < nf; f++)
        for (int k = 0; k < nn; k++)
            sweep_choice(a, in, st, n,
                         g->ntolerate ? g->tolerate[f] : in->job.fault_tolerance.tolerate,
                         g->nnodes ? g->nodes[k] : 0, rows, &nrows);
    const int b = pl_sweep_best(rows, nrows);
    if (b >= 0)
        printf("recommended: tolerate %d, nodes %s%d, %s: %.1f samples per $ (%.2f samples/s), "
               "the most samples per $ of the choices that did not fail\n",
               rows[b].tolerate, rows[b].nodes ? "" : "all ", rows[b].nodes, rows[b].strategy,
               rows[b].samples_per_usd, rows[b].samples_per_s);
    else
        printf("recommended: none (every choice failed)\n");
    free(rows);
    return b >= 0 ? 0 : 1;
}

int cmd_simulate(int argc, char **argv)
{
    sim_args a;
    char err[1024] = "";
    int prc = parse_args(argc, argv, &a, err, sizeof err);
    if (prc) return cli_usage_exit(prc, "simulate", err, usage);
    const pl_sim_strategy *st[MAX_STRATEGIES];
    int n = pick_strategies(a.strategy, st, err, sizeof err);
    sim_inputs in = {0};
    if (n < 0 || load_inputs(&a, &in, err, sizeof err) ||
        (!a.sweeping && load_plans(&in, st, n, err, sizeof err)) ||
        latency_from_profile(&a, &in, err, sizeof err)) {
        fprintf(stderr, "pliant simulate: %s\n", err);
        inputs_free(&in);
        return 2;
    }
    FILE *out = a.out ? fopen(a.out, "w") : NULL;
    int rc = a.out && !out ? 2 : 0;
    if (rc) fprintf(stderr, "pliant simulate: --out: cannot write %s\n", a.out);
    else rc = a.sweeping ? sweep(&a, &in, st, n) : simulate(&a, &in, st, n, out);
    if (out && fclose(out)) rc = 1;
    inputs_free(&in);
    return rc;
}
