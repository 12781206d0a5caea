/* `pliant run JOB.yaml --workers N [--steps N] [--metrics FILE] [--threads T]
 * [--chaos SPEC]`: trains a TrainingJob with N local worker processes
 * (`pliant worker`, same binary; operator/runtime/local_workers.h) under the job
 * driver (operator/runtime/job_driver.h: the coordinator behind its control
 * server, WebSocket over TLS, a self-signed certificate, a random job token).
 * What is here: the arguments, the workers, chaos, and the output.
 *
 * Planner profile: spec.profile when it is a path; auto is measured by the first
 * worker to register, on its own device (worker/engine/model_profile.h), before
 * the first plan ("profiling: ..." lines); synthetic derives it from the model's
 * sizes (reproducible plans). Plans carry every stage's layers: workers plan
 * nothing themselves. The resume point (spec.checkpoint.resume auto) is the
 * newest complete checkpoint the workers report; the checkpoint of the last step
 * means nothing to do.
 *
 * One line per committed step on stdout; --metrics writes JSON lines (step,
 * loss, lr, grad_norm, tokens_per_second, plan_generation, pipelines, workers,
 * samples_digest, and val_loss after the steps the workers evaluated,
 * spec.evalEvery); after them, for every plan after the first, a line
 * {"event": "reconfigure", cause, removed, added, duration_ms, bytes_copied,
 * from_checkpoint (the plan restarts from a checkpoint), plan_generation,
 * step, pipelines}, written when the new plan commits its first step
 * (duration_ms: from the first chaos event or worker end noticed since the
 * previous plan, else from when the plan was seen, to that commit; null if it
 * never commits), a {"event": "plan", plan_generation, step, layers: {worker: [b, e)}}
 * line per plan generation, and a final {"event": "summary", ...}.
 *
 * --dashboard HOST:PORT serves the job's live page and feed (operator/runtime/dashboard.h,
 * dashboard_feed.h; docs/dashboard.md) from a thread of its own; this loop hands the feed
 * the driver's events, chaos and worker ends. --dashboard-linger keeps serving the final
 * page that long after the job; the cost line says what the feed cost this thread.
 *
 * --chaos (shared/chaos.h): step events fire once the coordinator runs step S,
 * time events once their time since the workers were started has passed;
 * kill/term signal worker number W (start order; ended or unknown ones are
 * ignored with a note), or with pQ.J the worker at stage J of pipeline Q of
 * the coordinator's stable plan, add starts workers named w<nw>, w<nw+1>, ...
 * --grace-seconds S: every worker's PLIANT_GRACE_SECONDS, and a term is followed by
 * SIGKILL S seconds later unless the worker ended first (a Pod's grace period). A trace's
 * initial workers replace --workers. Exit 0 when every step is committed, 1
 * when the job fails, 2 on bad input. */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chaos.h"
#include "cli_args.h"
#include "commands.h"
#include "dashboard_feed.h"
#include "job_driver.h"
#include "local_workers.h"
#include "sampler.h"
#include "tokens.h"
#include "util.h"

#define MAX_WORKERS 256
#define FINISH_GRACE_MS 15000
#define POLL_MS 10

/* The command line. */
typedef struct {
    const char *job_path, *metrics_path, *chaos_spec, *ckpt_dir, *backend, *dashboard, *profile;
    long long nworkers, threads, steps, duration_s, gpus, linger_s;
    double grace_s;           /* --grace-seconds: each worker's, from SIGTERM to SIGKILL */
    int devices[MAX_WORKERS]; /* --devices: worker i sees GPU devices[i mod ndevices] */
    int ndevices;
    pl_chaos chaos;
} run_args;

typedef struct {
    char name[PL_WORKER_NAME_MAX];
    int exited;
    int fenced; /* killed after the coordinator gave it up (missed heartbeats) */
    double kill_at_ms; /* a term's grace period ends then: SIGKILL (0: none) */
} run_worker;

typedef struct {
    const run_args *a;
    pl_job_driver *drv;
    const pl_job *job;
    pl_coord *coord;          /* the driver's */
    pl_local_workers *lw;
    run_worker w[MAX_WORKERS];
    int nw;
    char exe[4096], thr[24];  /* what a worker is started with */
    pl_sampler smp;           /* the samples of each step, for their digests */
    FILE *metrics;
    char *fired;              /* per chaos event: fired already */
    pl_dashboard *dash;       /* --dashboard: the server, the job's page at / and its feed */
    pl_dashboard_job *page;
    pl_dash_feed *feed;
    int64_t plan_gen;         /* the plan generation of the last plan metrics line */
    /* the loop */
    int reconfigs, recovered, finished;
    int error_exits, last_status, same_status; /* workers that exited with an error */
    pl_coord_phase_t last_phase;
    char last_profiling[512]; /* the PROFILING reason printed last */
    int degraded;             /* the last plan's tolerance is below the job's */
    double t0, last_t;        /* seconds: the loop's start, the last step line */
    int64_t start_ms, end_ms;
} run_state;

static void run_usage(FILE *f)
{
    fprintf(f, "usage: pliant run JOB.yaml --workers N [--gpus-per-worker M] [--steps N]\n"
               "                 [--metrics FILE] [--threads T] [--backend auto|cpu|cuda]\n"
               "                 [--devices 0,1,...]\n"
               "                 [--chaos SPEC [--grace-seconds S]] [--duration SECONDS]\n"
               "                 [--checkpoint-dir DIR] [--profile PROFILE.json]\n"
               "                 [--dashboard HOST:PORT [--dashboard-linger SECONDS]]\n"
               "  --duration: stop after that long (benchmarks), dropping the step in flight\n"
               "  --profile: the planner profile instead of spec.profile\n"
               "  --dashboard: serve the job's live dashboard at http://HOST:PORT/ (port 0: any);\n"
               "        --dashboard-linger: keep serving it that long after the job ended\n"
               "  SPEC: comma-separated kill:W@step=S, term:W@step=S, add:K@step=S\n"
               "        (or @t=SECONDS, or @waiting: when too few workers are left), trace:FILE[:SPEEDUP];\n"
               "        W: worker number in start order\n"
               "  --grace-seconds: a term:'s SIGKILL follows its SIGTERM after S seconds (a Pod's\n"
               "        grace period; each worker's PLIANT_GRACE_SECONDS); 0, the default: never\n");
}

/* Bad input: the message and the usage, exit status 2. */
static int bad_usage(const char *err)
{
    return cli_usage_exit(-1, "run", err, run_usage);
}

/* --devices 0,1,3: GPU ordinals, worker i gets CUDA_VISIBLE_DEVICES=list[i mod n]
 * (one GPU each, so that NCCL can join them; several workers may share one). */
static int parse_devices(const char *s, int *out, int *n, char *err, size_t errlen)
{
    *n = 0;
    for (const char *p = s;;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1023 || (*end && *end != ','))
            return pl_errf(err, errlen, "--devices: expected GPU numbers like 0,1,2, not '%s'", s);
        if (*n == MAX_WORKERS) return pl_errf(err, errlen, "--devices: at most %d", MAX_WORKERS);
        out[(*n)++] = (int)v;
        if (!*end) return 0;
        p = end + 1;
    }
}

/* One option into a: 0, 1 for --help, -1 and err. */
static int parse_option(int c, run_args *a, char **argv, char *err, size_t errlen)
{
    switch (c) {
    case 'w': return cli_parse_int("--workers", optarg, 1, MAX_WORKERS, &a->nworkers, err, errlen);
    case 't': return cli_parse_int("--threads", optarg, 1, 1024, &a->threads, err, errlen);
    case 's': return cli_parse_int("--steps", optarg, 1, 1000000000, &a->steps, err, errlen);
    case 'g': return cli_parse_int("--gpus-per-worker", optarg, 1, 1024, &a->gpus, err, errlen);
    case 'd': return cli_parse_int("--duration", optarg, 1, 1000000, &a->duration_s, err, errlen);
    case 'G': return cli_parse_double("--grace-seconds", optarg, 0, 86400, &a->grace_s, err, errlen);
    case 'm': a->metrics_path = optarg; return 0;
    case 'c': a->chaos_spec = optarg; return 0;
    case 'k': a->ckpt_dir = optarg; return 0;
    case 'P': a->profile = optarg; return 0;
    case 'A': a->dashboard = optarg; return 0;
    case 'L':
        return cli_parse_int("--dashboard-linger", optarg, 0, 1000000, &a->linger_s, err, errlen);
    case 'b':
        a->backend = optarg;
        return cli_check_backend("--backend", optarg, err, errlen);
    case 'D': return parse_devices(optarg, a->devices, &a->ndevices, err, errlen);
    case 'h': return 1;
    default:
        return pl_errf(err, errlen, "unknown option or missing value: '%s'", argv[optind - 1]);
    }
}

/* The chaos spec, and the worker count a trace starts with. -1 to go on, else the
 * exit status (messages printed). */
static int settle_workers(run_args *a)
{
    char err[1024] = "";
    if (a->chaos_spec && pl_chaos_parse(a->chaos_spec, &a->chaos, err, sizeof err)) {
        fprintf(stderr, "pliant run: %s\n", err);
        return 2;
    }
    if (a->chaos.initial_workers > 0) {
        if (a->chaos.initial_workers > MAX_WORKERS) {
            snprintf(err, sizeof err, "the trace starts %d workers (at most %d)",
                     a->chaos.initial_workers, MAX_WORKERS);
            return bad_usage(err);
        }
        if (a->nworkers > 0 && a->nworkers != a->chaos.initial_workers)
            fprintf(stderr, "pliant run: the trace starts %d workers: --workers %lld ignored\n",
                    a->chaos.initial_workers, a->nworkers);
        a->nworkers = a->chaos.initial_workers;
    }
    return a->nworkers > 0 ? -1 : bad_usage("--workers N is required");
}

/* The command line into a: -1 to go on, else the exit status (messages printed). */
static int parse_args(int argc, char **argv, run_args *a)
{
    static const struct option opts[] = {{"workers", required_argument, 0, 'w'},
                                         {"metrics", required_argument, 0, 'm'},
                                         {"threads", required_argument, 0, 't'},
                                         {"steps", required_argument, 0, 's'},
                                         {"chaos", required_argument, 0, 'c'},
                                         {"duration", required_argument, 0, 'd'},
                                         {"grace-seconds", required_argument, 0, 'G'},
                                         {"checkpoint-dir", required_argument, 0, 'k'},
                                         {"profile", required_argument, 0, 'P'},
                                         {"gpus-per-worker", required_argument, 0, 'g'},
                                         {"backend", required_argument, 0, 'b'},
                                         {"devices", required_argument, 0, 'D'},
                                         {"dashboard", required_argument, 0, 'A'},
                                         {"dashboard-linger", required_argument, 0, 'L'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    char err[1024] = "";
    a->backend = "auto";
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int rc = parse_option(c, a, argv, err, sizeof err);
        if (rc > 0) {
            run_usage(stdout);
            return 0;
        }
        if (rc < 0) return bad_usage(err);
    }
    if (optind != argc - 1) return bad_usage("expects exactly one JOB.yaml");
    a->job_path = argv[optind];
    return settle_workers(a);
}

static run_worker *find_worker(run_state *r, const char *name)
{
    for (int i = 0; i < r->nw; i++)
        if (!strcmp(r->w[i].name, name)) return &r->w[i];
    return NULL;
}

/* Only the workers this run started register. */
static const char *admit(void *user, const char *name)
{
    return find_worker(user, name) ? NULL : "unknown worker name";
}

/* Starts worker r->w[i] (its name set). It listens on a free port of its own and
 * registers it; each local worker is its own node. */
static int spawn_worker(run_state *r, int i, char *err, size_t errlen)
{
    char e[8][PL_PATH_MAX + 64];
    snprintf(e[0], sizeof e[0], "PLIANT_COORDINATOR=127.0.0.1:%d", pl_job_driver_port(r->drv));
    snprintf(e[1], sizeof e[1], "PLIANT_TOKEN=%s", pl_job_driver_token(r->drv));
    snprintf(e[2], sizeof e[2], "PLIANT_CA=%s", pl_job_driver_cert_path(r->drv));
    snprintf(e[3], sizeof e[3], "PLIANT_WORKER_NAME=%s", r->w[i].name);
    snprintf(e[4], sizeof e[4], "PLIANT_NODE=%s", r->w[i].name);
    snprintf(e[5], sizeof e[5], "PLIANT_CHECKPOINT_DIR=%s", r->job->checkpoint.dir);
    snprintf(e[6], sizeof e[6], "CUDA_VISIBLE_DEVICES=%d",
             r->a->ndevices ? r->a->devices[i % r->a->ndevices] : 0);
    snprintf(e[7], sizeof e[7], "PLIANT_GRACE_SECONDS=%.3f", r->a->grace_s);
    char *env[9];
    int ne = 0;
    for (int k = 0; k < 5; k++) env[ne++] = e[k];
    if (r->job->checkpoint.dir[0]) env[ne++] = e[5];
    if (r->a->ndevices) env[ne++] = e[6];
    if (r->a->grace_s > 0) env[ne++] = e[7];
    env[ne] = NULL;
    char *wargv[] = {r->exe,           "worker",  (char *)r->a->job_path,  "--threads",
                     r->thr, "--backend", (char *)r->a->backend, NULL};
    pl_worker_spec spec = {.argv = wargv, .env = env};
    snprintf(spec.name, sizeof spec.name, "%s", r->w[i].name);
    err[0] = 0;
    int crc = pl_local_workers_start(r->lw, &spec, err, errlen);
    if (crc && !err[0]) snprintf(err, errlen, "cannot start worker %s", r->w[i].name);
    return crc;
}

/* Starts k more workers named w<nw>, w<nw+1>, ... */
static int add_workers(run_state *r, int k, char *err, size_t errlen)
{
    if (k > MAX_WORKERS - r->nw) return pl_errf(err, errlen, "at most %d workers", MAX_WORKERS);
    for (int j = 0; j < k; j++) {
        run_worker *w = &r->w[r->nw];
        memset(w, 0, sizeof *w);
        snprintf(w->name, sizeof w->name, "w%d", r->nw);
        r->nw++;
        if (spawn_worker(r, r->nw - 1, err, errlen)) {
            w->exited = 1; /* never started: not waited for */
            return -1;
        }
    }
    return 0;
}

/* The worker running stage j of pipeline q of the stable plan, or -1. */
static int placed_worker(run_state *r, int q, int j)
{
    const char *names[PL_PROTO_MAX_NODES];
    const int n = pl_coord_plan_pipeline(r->coord, q, names, PL_PROTO_MAX_NODES, NULL);
    if (j >= n) return -1;
    const run_worker *w = find_worker(r, names[j]);
    return w ? (int)(w - r->w) : -1;
}

/* A kill or term chaos event: 1 if it signalled its worker, 0 if it was ignored. */
static int signal_chaos(run_state *r, const pl_chaos_event *e, const char *when)
{
    char err[512] = "";
    const char *what = e->action == PL_CHAOS_KILL ? "kill" : "term";
    int sig = e->action == PL_CHAOS_KILL ? SIGKILL : SIGTERM;
    if (e->worker < 0) {
        pl_chaos_event x = *e;
        x.worker = placed_worker(r, e->pipe, e->stage);
        if (x.worker < 0) {
            printf("chaos: %s: %s p%d.%d ignored (no such place)\n", when, what, e->pipe, e->stage);
            return 0;
        }
        return signal_chaos(r, &x, when);
    }
    if (e->worker >= r->nw || r->w[e->worker].exited) {
        printf("chaos: %s: %s w%d ignored (%s)\n", when, what, e->worker,
               e->worker < 0 || e->worker >= r->nw ? "no such worker" : "already ended");
        return 0;
    }
    if (pl_local_workers_signal(r->lw, r->w[e->worker].name, sig, err, sizeof err)) {
        printf("chaos: %s: %s w%d ignored (%s)\n", when, what, e->worker, err);
        return 0;
    }
    printf("chaos: %s: %s w%d (%s)\n", when, what, e->worker,
           sig == SIGKILL ? "SIGKILL" : "SIGTERM");
    if (sig == SIGTERM && r->a->grace_s > 0)
        r->w[e->worker].kill_at_ms = pl_now_ms() + r->a->grace_s * 1000;
    char line[128];
    snprintf(line, sizeof line, "chaos at %s: %s", when, sig == SIGKILL ? "SIGKILL" : "SIGTERM");
    pl_dash_feed_notice(r->feed, r->w[e->worker].name, what, line);
    return 1;
}

/* Fires one chaos event (kill, term or add): 1 if it acted, 0 if it was ignored. */
static int fire_chaos(run_state *r, const pl_chaos_event *e, const char *when)
{
    char err[512] = "";
    int acted = 0;
    if (e->action != PL_CHAOS_ADD) {
        acted = signal_chaos(r, e, when);
    } else if (add_workers(r, e->count, err, sizeof err)) {
        fprintf(stderr, "pliant run: chaos %s: add %d: %s\n", when, e->count, err);
    } else {
        acted = 1;
        char line[128];
        snprintf(line, sizeof line, "chaos at %s: %d worker%s started", when, e->count,
                 e->count == 1 ? "" : "s");
        pl_dash_feed_notice(r->feed, r->w[r->nw - 1].name, "add", line);
        if (e->count == 1)
            printf("chaos: %s: started 1 worker (w%d)\n", when, r->nw - 1);
        else
            printf("chaos: %s: started %d workers (w%d..w%d)\n", when, e->count,
                   r->nw - e->count, r->nw - 1);
    }
    fflush(stdout);
    return acted;
}

/* Whether chaos event e is due, with its description in when. */
static int chaos_due(run_state *r, const pl_chaos_event *e, int64_t now, char *when,
                     size_t len)
{
    pl_coord_phase_t ph = pl_coord_phase(r->coord);
    int begun = ph != PL_COORD_WAITING_FOR_WORKERS && ph != PL_COORD_PROFILING; /* step S */
    switch (e->when) {
    case PL_CHAOS_AT_STEP:
        if (!(begun && pl_coord_step(r->coord) >= e->step)) return 0;
        snprintf(when, len, "step %lld", (long long)e->step);
        return 1;
    case PL_CHAOS_WHEN_WAITING:
        if (ph != PL_COORD_WAITING_FOR_NODES) return 0;
        snprintf(when, len, "waiting");
        return 1;
    case PL_CHAOS_AT_CHECKPOINT:
        if (pl_coord_last_checkpoint(r->coord) < e->step) return 0;
        snprintf(when, len, "checkpoint %lld", (long long)e->step);
        return 1;
    default:
        if (now - r->start_ms < e->t_ms) return 0;
        snprintf(when, len, "t=%.3fs", (double)e->t_ms / 1000.0);
        return 1;
    }
}

/* Chaos: step events when their step begins, time events when their time has passed. */
static void fire_due_chaos(run_state *r)
{
    pl_coord_phase_t ph = pl_coord_phase(r->coord);
    int64_t now = pl_now_ms();
    for (int i = 0; i < r->a->chaos.n && ph != PL_COORD_DONE && ph != PL_COORD_FAILED; i++) {
        char when[64];
        if (r->fired[i] || !chaos_due(r, &r->a->chaos.events[i], now, when, sizeof when))
            continue;
        r->fired[i] = 1;
        if (fire_chaos(r, &r->a->chaos.events[i], when)) pl_job_driver_disrupted(r->drv, now);
    }
}

/* Workers that ended: each the loss of its worker while the job runs. */
static void reap_workers(run_state *r)
{
    pl_worker_event ev;
    while (pl_local_workers_wait(r->lw, &ev, 0) == 1) {
        run_worker *w = find_worker(r, ev.name);
        if (w) w->exited = 1;
        pl_coord_phase_t ph = pl_coord_phase(r->coord);
        if (ph == PL_COORD_DONE || ph == PL_COORD_FAILED) continue;
        char cause[128];
        if (ev.end == PL_WORKER_EXITED && ev.status != 0) {
            r->same_status = !r->error_exits || ev.status == r->last_status;
            r->last_status = ev.status;
            r->error_exits++;
        }
        if (ev.end == PL_WORKER_EXITED)
            snprintf(cause, sizeof cause, "exited with status %d", ev.status);
        else
            snprintf(cause, sizeof cause, "killed by signal %d", ev.signal);
        fprintf(stderr, "pliant run: worker %s %s\n", ev.name, cause);
        pl_dash_feed_notice(r->feed, ev.name, "exit", cause);
        pl_job_driver_worker_gone(r->drv, ev.name, cause);
    }
}

/* Workers the coordinator declared lost for missed heartbeats or a missed step deadline
 * while their process lives (hung: SIGSTOP, a deadlock, a stuck compute thread): killed, so that they free their cores and never wake up
 * holding an old plan's state. Their end is then reaped as any other. */
static void fence_silent_workers(run_state *r)
{
    for (int i = 0; i < r->nw; i++) {
        run_worker *w = &r->w[i];
        if (w->exited || w->fenced || !pl_coord_worker_silent(r->coord, w->name)) continue;
        char err[256];
        w->fenced = 1;
        if (pl_local_workers_signal(r->lw, w->name, SIGKILL, err, sizeof err) == 0)
            fprintf(stderr, "pliant run: worker %s was lost (missed heartbeats or step "
                            "deadline) but still runs (hung): killed\n", w->name);
    }
}

/* Workers whose term's grace period is over: SIGKILL, as the kubelet does to a Pod. */
static void end_grace_periods(run_state *r)
{
    const double now = pl_now_ms();
    for (int i = 0; i < r->nw; i++) {
        run_worker *w = &r->w[i];
        if (w->exited || w->kill_at_ms <= 0 || now < w->kill_at_ms) continue;
        char err[256];
        w->kill_at_ms = 0;
        if (pl_local_workers_signal(r->lw, w->name, SIGKILL, err, sizeof err) == 0)
            printf("chaos: w%d's grace period is over (SIGKILL)\n", i);
    }
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* "a,b" as ["a", "b"] */
static void json_names(FILE *f, const char *list)
{
    fputc('[', f);
    int first = 1;
    for (const char *p = list; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len) {
            char name[PL_WORKER_NAME_MAX];
            snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1),
                     p);
            if (!first) fputs(", ", f);
            json_string(f, name);
            first = 0;
        }
        p = comma ? comma + 1 : NULL;
    }
    fputc(']', f);
}

/* A reconfigure metrics line; duration_ms < 0: null (the plan never committed a step). */
static void write_reconfig(FILE *f, const pl_coord_reconfig_rec *x, int64_t duration_ms)
{
    if (!f) return;
    fputs("{\"event\": \"reconfigure\", \"cause\": ", f);
    json_string(f, x->cause);
    fputs(", \"removed\": ", f);
    json_names(f, x->removed);
    fputs(", \"added\": ", f);
    json_names(f, x->added);
    if (duration_ms >= 0) fprintf(f, ", \"duration_ms\": %lld", (long long)duration_ms);
    else fputs(", \"duration_ms\": null", f);
    fprintf(f, ", \"bytes_copied\": %lld, \"from_checkpoint\": %s, \"plan_generation\": %lld, "
               "\"step\": %lld, \"pipelines\": ",
            (long long)x->bytes_copied, x->from_checkpoint ? "true" : "false",
            (long long)x->generation, (long long)x->step);
    json_string(f, x->pipelines);
    fprintf(f, ", \"tolerance\": %d}\n", x->tolerance);
    fflush(f);
}

/* The checkpoint of `step` is complete (checkpoint.json written), or it failed. */
static void print_checkpoint(run_state *r, int64_t step, const char *error)
{
    if (error) {
        fprintf(stderr, "pliant run: checkpoint of step %lld: %s\n", (long long)step, error);
        return;
    }
    printf("checkpoint: step %lld saved to %s\n", (long long)step, r->job->checkpoint.dir);
    fflush(stdout);
    if (r->metrics) {
        fprintf(r->metrics, "{\"event\": \"checkpoint\", \"step\": %lld, \"dir\": ",
                (long long)step);
        json_string(r->metrics, r->job->checkpoint.dir);
        fputs("}\n", r->metrics);
        fflush(r->metrics);
    }
}

static void print_reconfig(const run_state *r, const pl_coord_reconfig_rec *x)
{
    const int f = r->job->fault_tolerance.tolerate;
    printf("reconfigure: generation %lld at step %lld: %s; pipelines %s\n",
           (long long)x->generation, (long long)x->step, x->cause, x->pipelines);
    if (x->tolerance < f)
        printf("degraded: tolerance %d of %d until workers join (belowMinimum: degrade)\n",
               x->tolerance, f);
    else if (r->degraded)
        printf("tolerance restored: %d\n", f);
    fflush(stdout);
}

static double tokens_per_step(const run_state *r)
{
    return (double)r->job->batch.global * r->job->batch.seq_len;
}

/* A step line, and its metrics line. */
static void print_step(run_state *r, const pl_coord_step_rec *s)
{
    double t = pl_now_ms() / 1e3;
    double tps = tokens_per_step(r) / (t - r->last_t > 1e-9 ? t - r->last_t : 1e-9);
    r->last_t = t;
    int live = pl_coord_live_workers(r->coord);
    printf("step %6lld/%d | loss %.6f | lr %.3e | norm %.4f | %8.0f tok/s | gen %lld | "
           "pipelines %s | workers %d",
           (long long)s->step, r->job->steps, s->loss, s->lr, s->norm, tps,
           (long long)s->generation, s->pipelines, live);
    if (!isnan(s->val_loss)) printf(" | val %.6f", s->val_loss);
    putchar('\n');
    fflush(stdout);
    if (!r->metrics) return;
    fprintf(r->metrics,
            "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
            "\"tokens_per_second\": %.1f, \"plan_generation\": %lld, "
            "\"pipelines\": \"%s\", \"workers\": %d, \"samples_digest\": \"%016llx\"",
            (long long)s->step, s->loss, s->lr, s->norm, tps, (long long)s->generation,
            s->pipelines, live,
            (unsigned long long)pl_sampler_digest(&r->smp, s->step, 0, r->job->batch.global));
    if (!isnan(s->val_loss)) fprintf(r->metrics, ", \"val_loss\": %.9g", s->val_loss);
    fputs("}\n", r->metrics);
    fflush(r->metrics);
}

/* The resume point the workers reported: the checkpoint the job starts from, how they
 * disagreed, or nothing to do. */
static void print_resume(run_state *r, int64_t step, const char *note)
{
    if (note) printf("run: %s\n", note);
    if (step >= r->job->steps)
        printf("run: %s: the checkpoint of step %lld in %s is the last step: nothing to do\n",
               r->job->name, (long long)step, r->job->checkpoint.dir);
    else if (step > 0)
        printf("run: resuming from the checkpoint of step %lld in %s\n", (long long)step,
               r->job->checkpoint.dir);
    fflush(stdout);
}

/* PROFILING: who measures the model, as it changes. */
static void print_profiling(run_state *r)
{
    const char *why = pl_coord_reason(r->coord);
    if (pl_coord_phase(r->coord) != PL_COORD_PROFILING || !strcmp(why, r->last_profiling))
        return;
    snprintf(r->last_profiling, sizeof r->last_profiling, "%s", why);
    printf("profiling: %s\n", why);
    fflush(stdout);
}

/* A plan metrics line for each new plan generation: {"event": "plan", plan_generation,
 * step, "layers": {worker: [begin, end)}} for the workers holding layers in it. */
static void write_plan(run_state *r)
{
    int64_t g = pl_coord_generation(r->coord);
    if (!r->metrics || g == r->plan_gen || g <= 0) return;
    r->plan_gen = g;
    fprintf(r->metrics, "{\"event\": \"plan\", \"plan_generation\": %lld, \"step\": %lld, "
                        "\"layers\": {", (long long)g, (long long)pl_coord_step(r->coord));
    int first = 1;
    for (int i = 0; i < pl_coord_nworkers(r->coord); i++) {
        pl_coord_worker_view v;
        if (pl_coord_worker_view_at(r->coord, i, &v) || v.pipeline < 0) continue;
        fputs(first ? "" : ", ", r->metrics);
        json_string(r->metrics, v.name);
        fprintf(r->metrics, ": [%d, %d]", v.layer_begin, v.layer_end);
        first = 0;
    }
    fputs("}}\n", r->metrics);
    fflush(r->metrics);
}

/* What the driver reports since the last poll, and the wait for workers. */
static void report(run_state *r)
{
    pl_job_driver_event ev;
    print_profiling(r);
    while (pl_job_driver_next(r->drv, &ev)) {
        pl_dash_feed_event(r->feed, &ev);
        switch (ev.kind) {
        case PL_JOB_DRIVER_RESUME: print_resume(r, ev.step, ev.error); break;
        case PL_JOB_DRIVER_PROFILED:
            printf("profiling: done, the measured profile is planned\n");
            fflush(stdout);
            break;
        case PL_JOB_DRIVER_CHECKPOINT: print_checkpoint(r, ev.step, ev.error); break;
        case PL_JOB_DRIVER_RECONFIG:
            r->reconfigs++;
            print_reconfig(r, pl_coord_reconfig(r->coord, ev.index));
            r->degraded = pl_coord_reconfig(r->coord, ev.index)->tolerance <
                          r->job->fault_tolerance.tolerate;
            break;
        case PL_JOB_DRIVER_RECOVERED:
            r->recovered++;
            write_reconfig(r->metrics, pl_coord_reconfig(r->coord, ev.index), ev.ms);
            break;
        case PL_JOB_DRIVER_STEP: print_step(r, pl_coord_step_log(r->coord, ev.index)); break;
        }
    }
    write_plan(r);
    pl_dash_feed_poll(r->feed);
    pl_coord_phase_t ph = pl_coord_phase(r->coord);
    if (ph != r->last_phase && ph == PL_COORD_WAITING_FOR_NODES) {
        printf("waiting: %s\n", pl_coord_reason(r->coord));
        fflush(stdout);
    }
    r->last_phase = ph;
}

/* 1 when the loop is over (the job ended and its workers too, or the grace time
 * passed), -1 and err when every worker ended before the job, else 0. */
static int check_end(run_state *r, char *err, size_t errlen)
{
    pl_coord_phase_t ph = pl_coord_phase(r->coord);
    if ((ph == PL_COORD_DONE || ph == PL_COORD_FAILED) && !r->finished) {
        r->finished = 1;
        r->end_ms = pl_now_ms();
    }
    int left = 0;
    for (int i = 0; i < r->nw; i++) left += !r->w[i].exited;
    if (r->finished) return !left || pl_now_ms() - r->end_ms > FINISH_GRACE_MS;
    if (left) return 0;
    if (r->error_exits == r->nw && r->same_status)
        return pl_errf(err, errlen, "every worker failed the same way (exit status %d) before "
                       "the job finished: a bug in the job or its data, not a preemption; see "
                       "the workers' messages above", r->last_status);
    return pl_errf(err, errlen, "every worker ended before the job finished (%s)",
                   pl_coord_phase_name(ph));
}

/* The loop: chaos, the control channel, ended workers, the output. 0 once the
 * job ended, -1 and err. */
static int run_loop(run_state *r, char *err, size_t errlen)
{
    r->t0 = r->last_t = pl_now_ms() / 1e3;
    r->start_ms = pl_now_ms();
    r->same_status = 1;
    r->last_phase = PL_COORD_WAITING_FOR_WORKERS;
    for (int end = 0; !end;) {
        fire_due_chaos(r);
        if (pl_job_driver_poll(r->drv, POLL_MS, err, errlen)) return -1;
        fence_silent_workers(r);
        end_grace_periods(r);
        reap_workers(r);
        if (r->a->duration_s > 0 && pl_now_ms() - r->start_ms >= r->a->duration_s * 1000)
            pl_coord_end(r->coord, "--duration reached");
        report(r);
        if ((end = check_end(r, err, errlen)) < 0) return -1;
    }
    return 0;
}

/* --dashboard: the server and the job's feed. 0, or -1 and err. */
static int start_dashboard(run_state *r, char *err, size_t errlen)
{
    if (!r->a->dashboard) return 0;
    if (!(r->dash = pl_dashboard_start("--dashboard", r->a->dashboard, err, errlen))) return -1;
    if (!(r->page = pl_dashboard_add(r->dash, "/", PL_DASHBOARD_MAX_EVENTS)) ||
        !(r->feed = pl_dash_feed_new(r->page, r->drv)))
        return pl_errf(err, errlen, "dashboard: out of memory");
    return 0;
}

static void print_dashboard_url(const run_state *r)
{
    if (!r->dash) return;
    const char *h = pl_dashboard_host(r->dash);
    int v6 = strchr(h, ':') != NULL;
    printf("dashboard: http://%s%s%s:%d/\n", v6 ? "[" : "", h, v6 ? "]" : "",
           pl_dashboard_port(r->dash));
    fflush(stdout);
}

/* After the job: what the dashboard cost the coordinator's thread, then its final page
 * served for --dashboard-linger seconds. */
static void finish_dashboard(run_state *r, int steps, double secs)
{
    if (!r->dash) return;
    int64_t calls;
    const double cost_ms = (double)pl_dash_feed_cost_ns(r->feed, &calls) / 1e6;
    int total;
    pl_dashboard_pages(r->page, &total);
    const double per_step = steps ? cost_ms / steps : 0, step_ms = steps ? secs * 1e3 / steps : 0;
    printf("dashboard: %d page%s served; the coordinator's thread spent %.3f ms on it "
           "(%.1f us per step, %.3f %% of a step)\n", total, total == 1 ? "" : "s", cost_ms,
           per_step * 1e3, step_ms > 0 ? 100 * per_step / step_ms : 0.0);
    if (r->a->linger_s > 0) {
        printf("dashboard: serving the final page for %lld s\n", r->a->linger_s);
        fflush(stdout);
        for (int64_t until = pl_now_ms() + r->a->linger_s * 1000; pl_now_ms() < until;)
            usleep(50000);
    }
    fflush(stdout);
}

/* The metrics file's {"event": "summary", ...} line; its cost fields where spec.cost is
 * set (cost not NULL). */
static void write_summary(FILE *m, int ns, int reconfigs, double final_loss, double secs,
                          double tps, const pl_dash_cost *cost)
{
    fprintf(m, "{\"event\": \"summary\", \"steps\": %d, \"reconfigurations\": %d, "
               "\"final_loss\": ", ns, reconfigs);
    if (isfinite(final_loss)) fprintf(m, "%.9g", final_loss);
    else fputs("null", m);
    fprintf(m, ", \"seconds\": %.3f, \"tokens_per_second\": %.1f", secs, tps);
    if (cost)
        fprintf(m, ", \"node_hours\": %.9g, \"usd\": %.9g, \"samples_per_usd\": %.9g, "
                   "\"usd_on_demand\": %.9g, \"samples_per_usd_on_demand\": %.9g",
                cost->node_hours, cost->usd, cost->samples_per_usd, cost->usd_on_demand,
                cost->samples_per_usd_on_demand);
    fputs("}\n", m);
    fflush(m);
}

/* After the loop: plans that never committed a step, the summary; 0 when every
 * step was committed, else 1 and err. */
static int finish(run_state *r, char *err, size_t errlen)
{
    for (; r->recovered < r->reconfigs; r->recovered++) /* no duration */
        write_reconfig(r->metrics, pl_coord_reconfig(r->coord, r->recovered), -1);
    const double secs = (pl_now_ms() / 1e3) - r->t0;
    const int ns = pl_coord_nsteps(r->coord);
    const double final_loss = ns ? pl_coord_step_log(r->coord, ns - 1)->loss : NAN;
    const double tps = secs > 0 ? ns * tokens_per_step(r) / secs : 0;
    const pl_job *job = pl_job_driver_job(r->drv);
    pl_dash_cost cost;
    const int priced = pl_dash_cost_of(pl_job_driver_node_hours(r->drv),
                                       (double)ns * job->batch.global, job->cost.spot,
                                       job->cost.on_demand, &cost);
    printf("summary: %d steps, %d reconfigurations, final loss %.6f, %.1f s, %.0f tok/s", ns,
           r->reconfigs, final_loss, secs, tps);
    if (priced)
        printf(", %.6f node-hours, $%.6f spent, %.1f samples per $ ($%.6f on demand, %.1f "
               "samples per $)", cost.node_hours, cost.usd, cost.samples_per_usd,
               cost.usd_on_demand, cost.samples_per_usd_on_demand);
    printf("\n");
    if (r->metrics) write_summary(r->metrics, ns, r->reconfigs, final_loss, secs, tps,
                                  priced ? &cost : NULL);
    finish_dashboard(r, ns, secs);
    if (pl_coord_phase(r->coord) != PL_COORD_DONE)
        return pl_errf(err, errlen, "job failed: %s", pl_coord_reason(r->coord));
    printf("run: done, %d steps committed, generation %lld\n", ns,
           (long long)pl_coord_generation(r->coord));
    return 0;
}

/* The job with its overrides, checked for local workers, its data order: -1 to go
 * on, else the exit status (messages printed). */
static int open_job(run_state *r)
{
    const run_args *a = r->a;
    char err[1024] = "";
    pl_job_driver_config cfg = {.path = a->job_path, .steps = (int)a->steps,
                                .gpus_per_node = (int)a->gpus, .checkpoint_dir = a->ckpt_dir,
                                .profile = a->profile,
                                .n_start = (int)a->nworkers, .admit = admit, .user = r};
    if (!(r->drv = pl_job_driver_new(&cfg, err, sizeof err))) {
        fprintf(stderr, "pliant run: %s: %s\n", a->job_path, err);
        return 2;
    }
    r->job = pl_job_driver_job(r->drv);
    if (r->job->nodes.gpus_per_node > 1) {
        /* a local worker is one CPU engine: one device; GPU workers plan with the
         * profile's per-GPU-count timings */
        snprintf(err, sizeof err, "%s %d: local workers run the CPU engine, one device each "
                 "(more than one needs GPU workers)",
                 a->gpus > 0 ? "--gpus-per-worker" : "spec.nodes.gpusPerNode",
                 r->job->nodes.gpus_per_node);
        return bad_usage(err);
    }
    pl_tokens tok;
    if (pl_tokens_open_vocab(r->job->data.train, r->job->model.vocab_size, &tok, err,
                             sizeof err)) {
        fprintf(stderr, "pliant run: %s\n", err);
        return 1;
    }
    int src = pl_sampler_init(&r->smp, r->job->data.order, r->job->data.seed,
                              pl_tokens_count(&tok), r->job->batch.seq_len, r->job->batch.global,
                              err, sizeof err);
    pl_tokens_close(&tok);
    if (src) {
        fprintf(stderr, "pliant run: %s\n", err);
        return 1;
    }
    return -1;
}

/* The planner, the coordinator and its server, then the workers and the metrics
 * file. 0, or -1 and err. */
static int start_run(run_state *r, char *err, size_t errlen)
{
    if (pl_job_driver_start(r->drv, err, errlen)) return -1;
    r->coord = pl_job_driver_coord(r->drv);
    if (start_dashboard(r, err, errlen)) return -1;
    const int N = (int)r->a->nworkers;
    const long long threads = r->a->threads > 0 ? r->a->threads : cli_worker_threads(N);
    snprintf(r->thr, sizeof r->thr, "%lld", threads);
    if (cli_self_exe(r->exe, sizeof r->exe, err, errlen)) return -1;
    if (!(r->lw = pl_local_workers_new(err, errlen))) return -1;
    if (r->a->chaos.n && !(r->fired = calloc((size_t)r->a->chaos.n, 1)))
        return pl_errf(err, errlen, "out of memory");
    for (int i = 0; i < N; i++) snprintf(r->w[r->nw++].name, sizeof r->w[0].name, "w%d", i);
    for (int i = 0; i < N; i++)
        if (spawn_worker(r, i, err, errlen)) return -1;
    if (r->a->metrics_path && !(r->metrics = fopen(r->a->metrics_path, "w")))
        return pl_errf(err, errlen, "--metrics %s: cannot open for writing", r->a->metrics_path);
    printf("run: %s, %d workers (tolerate %d), %d steps, control on 127.0.0.1:%d (CA %s), "
           "planner profile %s\n",
           r->job->name, N, r->job->fault_tolerance.tolerate, r->job->steps,
           pl_job_driver_port(r->drv), pl_job_driver_cert_path(r->drv), r->job->profile);
    print_dashboard_url(r);
    fflush(stdout);
    return 0;
}

/* The job from start to end: the exit status (messages printed). */
static int run_job(run_state *r)
{
    char err[1024] = "";
    if (!start_run(r, err, sizeof err) && !run_loop(r, err, sizeof err) &&
        !finish(r, err, sizeof err))
        return 0;
    if (err[0]) fprintf(stderr, "pliant run: %s\n", err);
    return 1;
}

int cmd_run(int argc, char **argv)
{
    run_args a;
    memset(&a, 0, sizeof a);
    int rc = parse_args(argc, argv, &a);
    run_state *r = rc < 0 ? calloc(1, sizeof *r) : NULL;
    if (r) {
        r->a = &a;
        if ((rc = open_job(r)) < 0) rc = run_job(r);
        if (r->metrics) fclose(r->metrics);
        pl_local_workers_free(r->lw); /* kills and reaps the workers left */
        pl_dash_feed_free(r->feed);
        pl_dashboard_stop(r->dash);
        pl_job_driver_free(r->drv);
        free(r->fired);
        free(r);
    } else if (rc < 0) {
        fprintf(stderr, "pliant run: out of memory\n");
        rc = 1;
    }
    pl_chaos_free(&a.chaos);
    return rc;
}
