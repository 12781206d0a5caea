/* `pliant run JOB.yaml --workers N [--steps N] [--metrics FILE] [--threads T]
 * [--chaos SPEC]`: trains a TrainingJob with N local worker processes
 * (`pliant worker`, same binary) under the coordinator (operator/runtime/coordinator.h)
 * and the control server (WebSocket over TLS, a self-signed certificate, a random job token).
 *
 * Planner profile: spec.profile when it is a path; auto measures every layer
 * here at start (operator/runtime/job_profile.h); synthetic derives it from the
 * model's sizes (reproducible plans). The file is given to every worker so
 * that all plan the same stage layouts.
 *
 * One line per committed step on stdout; --metrics writes JSON lines (step,
 * loss, lr, grad_norm, tokens_per_second, plan_generation, pipelines, workers,
 * samples_digest); after them, for every plan after the first, a line
 * {"event": "reconfigure", cause, removed, added, duration_ms, bytes_copied,
 * from_checkpoint (always false: no checkpoint fallback yet), plan_generation,
 * step, pipelines}, written when the new plan commits its first step
 * (duration_ms: from the first chaos event or worker end noticed since the
 * previous plan, else from when the plan was seen, to that commit; null if it
 * never commits), and a final {"event": "summary", ...}.
 *
 * --chaos (shared/chaos.h): step events fire once the coordinator runs step S,
 * time events once their time since the workers were started has passed;
 * kill/term signal worker number W (start order; ended or unknown ones are
 * ignored with a note), add starts workers named w<nw>, w<nw+1>, ... A trace's
 * initial workers replace --workers. Exit 0 when every step is committed, 1
 * when the job fails, 2 on bad input. */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


#include "backend.h"
#include "chaos.h"
#include "cli_args.h"
#include "commands.h"
#include "coord_session.h"
#include "coordinator.h"
#include "job_plan.h"
#include "jobspec.h"
#include "sampler.h"
#include "tls_selfsigned.h"
#include "tokens.h"
#include "util.h"

#define MAX_WORKERS 256
#define FINISH_GRACE_MS 15000

typedef struct {
    char name[PL_WORKER_NAME_MAX];
    int exited;
} run_worker;

typedef struct {
    pl_coord *coord;
    pl_coord_session *session; /* the control server and the workers' connections */
    run_worker w[MAX_WORKERS];
    int nw;
    /* what a worker is started with */
    pl_backend *be;
    const char *exe, *job_path, *thr, *token, *backend;
    int devices[MAX_WORKERS]; /* --devices: worker i sees GPU devices[i mod ndevices] */
    int ndevices;
    const char *ckpt_dir; /* the job's checkpoint.dir, or --checkpoint-dir */
} run_state;

static void run_usage(FILE *f)
{
    fprintf(f, "usage: pliant run JOB.yaml --workers N [--gpus-per-worker M] [--steps N]\n"
               "                 [--metrics FILE] [--threads T] [--backend auto|cpu|cuda]\n"
               "                 [--devices 0,1,...]\n"
               "                 [--chaos SPEC] [--duration SECONDS] [--checkpoint-dir DIR]\n"
               "  --duration: stop after that long (benchmarks), dropping the step in flight\n"
               "  SPEC: comma-separated kill:W@step=S, term:W@step=S, add:K@step=S\n"
               "        (or @t=SECONDS, or @waiting: when too few workers are left), trace:FILE[:SPEEDUP];\n"
               "        W: worker number in start order\n");
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
    char e[7][PL_PATH_MAX + 64];
    pl_ctl_server *srv = pl_coord_session_server(r->session);
    snprintf(e[0], sizeof e[0], "PLIANT_COORDINATOR=127.0.0.1:%d", pl_ctl_server_port(srv));
    snprintf(e[1], sizeof e[1], "PLIANT_TOKEN=%s", r->token);
    snprintf(e[2], sizeof e[2], "PLIANT_CA=%s", pl_ctl_server_cert_path(srv));
    snprintf(e[3], sizeof e[3], "PLIANT_WORKER_NAME=%s", r->w[i].name);
    snprintf(e[4], sizeof e[4], "PLIANT_NODE=%s", r->w[i].name);
    snprintf(e[5], sizeof e[5], "PLIANT_CHECKPOINT_DIR=%s", r->ckpt_dir);
    snprintf(e[6], sizeof e[6], "CUDA_VISIBLE_DEVICES=%d",
             r->ndevices ? r->devices[i % r->ndevices] : 0);
    char *env[8];
    int ne = 0;
    for (int k = 0; k < 5; k++) env[ne++] = e[k];
    if (r->ckpt_dir[0]) env[ne++] = e[5];
    if (r->ndevices) env[ne++] = e[6];
    env[ne] = NULL;
    char *wargv[] = {(char *)r->exe, "worker",          (char *)r->job_path, "--threads",
                     (char *)r->thr, "--backend", (char *)r->backend, NULL};
    pl_worker_spec spec = {.argv = wargv, .env = env};
    snprintf(spec.name, sizeof spec.name, "%s", r->w[i].name);
    err[0] = 0;
    int crc = r->be->ops->create(r->be, &spec, err, errlen);
    if (crc && !err[0]) snprintf(err, errlen, "cannot start worker %s", r->w[i].name);
    return crc;
}

/* Starts k more workers named w<nw>, w<nw+1>, ... */
static int add_workers(run_state *r, int k, char *err, size_t errlen)
{
    if (k > MAX_WORKERS - r->nw) {
        snprintf(err, errlen, "at most %d workers", MAX_WORKERS);
        return -1;
    }
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

/* Fires one chaos event (kill, term or add): 1 if it acted, 0 if it was ignored. */
static int fire_chaos(run_state *r, const pl_chaos_event *e, const char *when)
{
    char err[512] = "";
    int acted = 0;
    if (e->action == PL_CHAOS_ADD) {
        int first = r->nw;
        if (add_workers(r, e->count, err, sizeof err))
            fprintf(stderr, "pliant run: chaos %s: add %d: %s\n", when, e->count, err);
        else if ((acted = 1))
        {
            if (e->count == 1)
                printf("chaos: %s: started 1 worker (w%d)\n", when, first);
            else
                printf("chaos: %s: started %d workers (w%d..w%d)\n", when, e->count, first,
                       r->nw - 1);
        }
    } else {
        const char *what = e->action == PL_CHAOS_KILL ? "kill" : "term";
        int sig = e->action == PL_CHAOS_KILL ? SIGKILL : SIGTERM;
        if (e->worker < 0 || e->worker >= r->nw || r->w[e->worker].exited) {
            printf("chaos: %s: %s w%d ignored (%s)\n", when, what, e->worker,
                   e->worker < 0 || e->worker >= r->nw ? "no such worker" : "already ended");
        } else if (r->be->ops->signal(r->be, r->w[e->worker].name, sig, err, sizeof err)) {
            printf("chaos: %s: %s w%d ignored (%s)\n", when, what, e->worker, err);
        } else {
            acted = 1;
            printf("chaos: %s: %s w%d (%s)\n", when, what, e->worker,
                   sig == SIGKILL ? "SIGKILL" : "SIGTERM");
        }
    }
    fflush(stdout);
    return acted;
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
    fputs("}\n", f);
    fflush(f);
}

/* Every layer of the checkpoint of `step` is written: its checkpoint.json marks it complete. */
static int complete_checkpoint(const pl_job *job, int64_t step, FILE *metrics, char *err,
                               size_t errlen)
{
    if (pl_job_complete_checkpoint(job, step, err, errlen)) return -1;
    printf("checkpoint: step %lld saved to %s\n", (long long)step, job->checkpoint.dir);
    fflush(stdout);
    if (metrics) {
        fprintf(metrics, "{\"event\": \"checkpoint\", \"step\": %lld, \"dir\": ",
                (long long)step);
        json_string(metrics, job->checkpoint.dir);
        fputs("}\n", metrics);
        fflush(metrics);
    }
    return 0;
}

int cmd_run(int argc, char **argv)
{
    static const struct option opts[] = {{"workers", required_argument, 0, 'w'},
                                         {"metrics", required_argument, 0, 'm'},
                                         {"threads", required_argument, 0, 't'},
                                         {"steps", required_argument, 0, 's'},
                                         {"chaos", required_argument, 0, 'c'},
                                         {"duration", required_argument, 0, 'd'},
                                         {"checkpoint-dir", required_argument, 0, 'k'},
                                         {"gpus-per-worker", required_argument, 0, 'g'},
                                         {"backend", required_argument, 0, 'b'},
                                         {"devices", required_argument, 0, 'D'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    char err[1024] = "";
    long long nworkers = 0, threads = 0, steps_override = 0, duration_s = 0, gpus = 0;
    const char *metrics_path = NULL, *chaos_spec = NULL, *ckpt_override = NULL, *backend = "auto";
    int devices[MAX_WORKERS], ndevices = 0;
    pl_chaos chaos;
    memset(&chaos, 0, sizeof chaos);
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'w':
            if (cli_parse_int("--workers", optarg, 1, MAX_WORKERS, &nworkers, err, sizeof err))
                goto bad;
            break;
        case 't':
            if (cli_parse_int("--threads", optarg, 1, 1024, &threads, err, sizeof err)) goto bad;
            break;
        case 'm': metrics_path = optarg; break;
        case 's':
            if (cli_parse_int("--steps", optarg, 1, 1000000000, &steps_override, err, sizeof err))
                goto bad;
            break;
        case 'c': chaos_spec = optarg; break;
        case 'k': ckpt_override = optarg; break;
        case 'b':
            if (cli_check_backend("--backend", optarg, err, sizeof err)) goto bad;
            backend = optarg;
            break;
        case 'D':
            if (parse_devices(optarg, devices, &ndevices, err, sizeof err)) goto bad;
            break;
        case 'g':
            if (cli_parse_int("--gpus-per-worker", optarg, 1, 1024, &gpus, err, sizeof err))
                goto bad;
            break;
        case 'd':
            if (cli_parse_int("--duration", optarg, 1, 1000000, &duration_s, err, sizeof err))
                goto bad;
            break;
        case 'h': run_usage(stdout); return 0;
        default:
            snprintf(err, sizeof err, "unknown option or missing value: '%s'", argv[optind - 1]);
            goto bad;
        }
    }
    if (optind != argc - 1) {
        snprintf(err, sizeof err, "expects exactly one JOB.yaml");
        goto bad;
    }
    if (chaos_spec && pl_chaos_parse(chaos_spec, &chaos, err, sizeof err)) {
        fprintf(stderr, "pliant run: %s\n", err);
        return 2;
    }
    if (chaos.initial_workers > 0) {
        if (chaos.initial_workers > MAX_WORKERS) {
            snprintf(err, sizeof err, "the trace starts %d workers (at most %d)",
                     chaos.initial_workers, MAX_WORKERS);
            pl_chaos_free(&chaos);
            goto bad;
        }
        if (nworkers > 0 && nworkers != chaos.initial_workers)
            fprintf(stderr, "pliant run: the trace starts %d workers: --workers %lld ignored\n",
                    chaos.initial_workers, nworkers);
        nworkers = chaos.initial_workers;
    }
    if (nworkers <= 0) {
        pl_chaos_free(&chaos);
        snprintf(err, sizeof err, "--workers N is required");
        goto bad;
    }
    const char *job_path = argv[optind];
    pl_job job;
    if (pl_job_load(job_path, &job, err, sizeof err)) {
        pl_chaos_free(&chaos);
        fprintf(stderr, "pliant run: %s: %s\n", job_path, err);
        return 2;
    }
    if (steps_override > 0) job.steps = (int)steps_override;
    if (gpus > 0) job.nodes.gpus_per_node = (int)gpus;
    if (job.nodes.gpus_per_node > 1) {
        /* a local worker is one CPU engine: one device; GPU workers plan with the
         * profile's per-GPU-count timings */
        snprintf(err, sizeof err, "%s %d: local workers run the CPU engine, one device each "
                 "(more than one needs GPU workers)",
                 gpus > 0 ? "--gpus-per-worker" : "spec.nodes.gpusPerNode",
                 job.nodes.gpus_per_node);
        pl_job_free(&job);
        pl_chaos_free(&chaos);
        goto bad;
    }
    if (ckpt_override && pl_pathf(job.checkpoint.dir, sizeof job.checkpoint.dir, err, sizeof err,
                                  "%s", ckpt_override)) {
        pl_job_free(&job);
        pl_chaos_free(&chaos);
        goto bad;
    }
    const int N = (int)nworkers, F = job.fault_tolerance.tolerate;
    if (threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores / N > 0 ? cores / N : 1;
    }

    int rc = 1, have_plan = 0, have_tok = 0;
    pl_job_plan plan;
    pl_tokens tok;
    pl_sampler smp;
    run_state *r = calloc(1, sizeof *r);
    pl_backend *be = NULL;
    FILE *metrics = NULL;
    char *fired = NULL;
    if (!r) {
        snprintf(err, sizeof err, "out of memory");
        goto done;
    }
    if (pl_tokens_open(job.data.train, &tok, err, sizeof err)) goto done;
    have_tok = 1;
    if (pl_sampler_init(&smp, job.data.order, job.data.seed, pl_tokens_count(&tok),
                        job.batch.seq_len, job.batch.global, err, sizeof err))
        goto done;

    /* the planner, for spec.nodes.max when it is larger: workers added later have plans */
    const int Nplan = job.nodes.max > N ? job.nodes.max : N;
    if (pl_job_plan_init(&plan, &job, Nplan, err, sizeof err)) goto done;
    have_plan = 1;

    /* resume: the newest complete checkpoint (spec.checkpoint.resume auto) */
    int64_t resume_step = 0;
    if (pl_job_resume_step(&job, &resume_step, err, sizeof err)) goto done;
    if (resume_step >= job.steps) {
        printf("run: %s: the checkpoint of step %lld in %s is the last step: nothing to do\n",
               job.name, (long long)resume_step, job.checkpoint.dir);
        rc = 0;
        goto done;
    }
    /* the coordinator and the control server */
    pl_coord_config cc = pl_job_coord_config(&job, &plan, N, resume_step);
    if (!(r->coord = pl_coord_new(&cc, err, sizeof err))) goto done;
    char token[65];
    if (pl_random_hex(token, 32)) {
        snprintf(err, sizeof err, "no random bytes for the job token");
        goto done;
    }
    pl_coord_session_config sc = {
        .coord = r->coord, .admit = admit, .user = r,
        .server = {.host = "127.0.0.1", .token = token, .token_len = strlen(token)}};
    if (!(r->session = pl_coord_session_new(&sc, err, sizeof err))) goto done;

    /* the workers */
    for (int i = 0; i < N; i++)
        snprintf(r->w[r->nw++].name, sizeof r->w[0].name, "w%d", i);
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(err, sizeof err, "cannot find this program (/proc/self/exe)");
        goto done;
    }
    exe[n] = 0;
    if (!(be = pl_backend_local_new(err, sizeof err))) goto done;
    char thr[16];
    snprintf(thr, sizeof thr, "%lld", threads);
    r->be = be;
    r->exe = exe;
    r->job_path = job_path;
    r->thr = thr;
    r->backend = backend;
    memcpy(r->devices, devices, sizeof devices);
    r->ndevices = ndevices;
    r->token = token;
    r->ckpt_dir = job.checkpoint.dir;
    for (int i = 0; i < N; i++)
        if (spawn_worker(r, i, err, sizeof err)) goto done;
    if (metrics_path && !(metrics = fopen(metrics_path, "w"))) {
        snprintf(err, sizeof err, "--metrics %s: cannot open for writing", metrics_path);
        goto done;
    }
    printf("run: %s, %d workers (tolerate %d), %d steps, control on 127.0.0.1:%d (CA %s), "
           "planner profile %s\n",
           job.name, N, F, job.steps, pl_ctl_server_port(pl_coord_session_server(r->session)),
           pl_ctl_server_cert_path(pl_coord_session_server(r->session)),
           job.profile);
    if (resume_step > 0)
        printf("run: resuming from the checkpoint of step %lld in %s\n", (long long)resume_step,
               job.checkpoint.dir);
    fflush(stdout);

    /* the loop */
    int printed = 0, reconfigs = 0, finished = 0, reported = 0;
    int64_t ckpt_done = resume_step;
    pl_coord_phase_t last_phase = PL_COORD_WAITING_FOR_WORKERS;
    int error_exits = 0, last_status = 0, same_status = 1; /* workers that exited with an error */
    double last_t = (pl_now_ms() / 1e3);
    const double t0 = last_t;
    int64_t end_ms = 0, disrupted_ms = -1;
    const int64_t start_ms = pl_now_ms();
    int64_t rec_since[512];
    fired = chaos.n ? calloc((size_t)chaos.n, 1) : NULL;
    if (chaos.n && !fired) {
        snprintf(err, sizeof err, "out of memory");
        goto done;
    }
    const double tokens_per_step = (double)job.batch.global * job.batch.seq_len;
    for (;;) {
        /* chaos: step events when their step begins, time events when their time has passed */
        {
            pl_coord_phase_t cph = pl_coord_phase(r->coord);
            int64_t cur = pl_coord_step(r->coord), now = pl_now_ms();
            int begun = cph != PL_COORD_WAITING_FOR_WORKERS; /* step S reached */
            for (int i = 0; i < chaos.n && cph != PL_COORD_DONE && cph != PL_COORD_FAILED; i++) {
                const pl_chaos_event *e = &chaos.events[i];
                if (fired[i]) continue;
                char when[64];
                if (e->when == PL_CHAOS_AT_STEP) {
                    if (!(begun && cur >= e->step)) continue;
                    snprintf(when, sizeof when, "step %lld", (long long)e->step);
                } else if (e->when == PL_CHAOS_WHEN_WAITING) {
                    if (cph != PL_COORD_WAITING_FOR_NODES) continue;
                    snprintf(when, sizeof when, "waiting");
                } else if (e->when == PL_CHAOS_AT_CHECKPOINT) {
                    if (pl_coord_last_checkpoint(r->coord) < e->step) continue;
                    snprintf(when, sizeof when, "checkpoint %lld", (long long)e->step);
                } else {
                    if (now - start_ms < e->t_ms) continue;
                    snprintf(when, sizeof when, "t=%.3fs", (double)e->t_ms / 1000.0);
                }
                fired[i] = 1;
                if (fire_chaos(r, e, when) && disrupted_ms < 0) disrupted_ms = now;
            }
        }
        if (pl_coord_session_poll(r->session, 10) < 0) {
            snprintf(err, sizeof err, "control server failed");
            goto done;
        }
        int64_t closed_ms = pl_coord_session_take_disruption(r->session);
        if (closed_ms >= 0 && disrupted_ms < 0) disrupted_ms = closed_ms;
        pl_worker_event ev;
        while (be->ops->watch(be, &ev, 0) == 1) {
            run_worker *w = find_worker(r, ev.name);
            if (w) w->exited = 1;
            pl_coord_phase_t ph = pl_coord_phase(r->coord);
            if (ph != PL_COORD_DONE && ph != PL_COORD_FAILED) {
                const int64_t seen_ms = pl_now_ms();
                char cause[128];
                if (ev.end == PL_WORKER_EXITED && ev.status != 0) {
                    same_status = !error_exits || ev.status == last_status;
                    last_status = ev.status;
                    error_exits++;
                }
                if (ev.end == PL_WORKER_EXITED)
                    snprintf(cause, sizeof cause, "exited with status %d", ev.status);
                else
                    snprintf(cause, sizeof cause, "killed by signal %d", ev.signal);
                fprintf(stderr, "pliant run: worker %s %s\n", ev.name, cause);
                /* news only if the connection's close did not report it already */
                if (pl_coord_session_lost(r->session, ev.name, cause) && disrupted_ms < 0)
                    disrupted_ms = seen_ms;
                pl_coord_session_take_disruption(r->session); /* counted above */
            }
        }
        if (duration_s > 0 && pl_now_ms() - start_ms >= duration_s * 1000)
            pl_coord_end(r->coord, "--duration reached");
        if (pl_coord_last_checkpoint(r->coord) > ckpt_done) {
            ckpt_done = pl_coord_last_checkpoint(r->coord);
            if (complete_checkpoint(&job, ckpt_done, metrics, err, sizeof err))
                fprintf(stderr, "pliant run: checkpoint of step %lld: %s\n",
                        (long long)ckpt_done, err);
        }
        for (; reconfigs < pl_coord_nreconfigs(r->coord); reconfigs++) {
            const pl_coord_reconfig_rec *x = pl_coord_reconfig(r->coord, reconfigs);
            if (reconfigs < (int)(sizeof rec_since / sizeof rec_since[0]))
                rec_since[reconfigs] = disrupted_ms >= 0 ? disrupted_ms : pl_now_ms();
            disrupted_ms = -1;
            printf("reconfigure: generation %lld at step %lld: %s; pipelines %s\n",
                   (long long)x->generation, (long long)x->step, x->cause, x->pipelines);
            fflush(stdout);
        }
        for (; printed < pl_coord_nsteps(r->coord); printed++) {
            const pl_coord_step_rec *s = pl_coord_step_log(r->coord, printed);
            for (; reported < reconfigs &&
                   pl_coord_reconfig(r->coord, reported)->generation <= s->generation;
                 reported++)
                write_reconfig(metrics, pl_coord_reconfig(r->coord, reported),
                               reported < (int)(sizeof rec_since / sizeof rec_since[0])
                                   ? pl_now_ms() - rec_since[reported]
                                   : -1);
            double t = (pl_now_ms() / 1e3), tps = tokens_per_step / (t - last_t > 1e-9 ? t - last_t : 1e-9);
            last_t = t;
            int live = pl_coord_live_workers(r->coord);
            printf("step %6lld/%d | loss %.6f | lr %.3e | norm %.4f | %8.0f tok/s | gen %lld | "
                   "pipelines %s | workers %d\n",
                   (long long)s->step, job.steps, s->loss, s->lr, s->norm, tps,
                   (long long)s->generation, s->pipelines, live);
            fflush(stdout);
            if (metrics) {
                fprintf(metrics,
                        "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
                        "\"tokens_per_second\": %.1f, \"plan_generation\": %lld, "
                        "\"pipelines\": \"%s\", \"workers\": %d, \"samples_digest\": \"%016llx\"}\n",
                        (long long)s->step, s->loss, s->lr, s->norm, tps,
                        (long long)s->generation, s->pipelines, live,
                        (unsigned long long)pl_sampler_digest(&smp, s->step, 0, job.batch.global));
                fflush(metrics);
            }
        }
        pl_coord_phase_t ph = pl_coord_phase(r->coord);
        if (ph != last_phase && ph == PL_COORD_WAITING_FOR_NODES) {
            printf("waiting: %s\n", pl_coord_reason(r->coord));
            fflush(stdout);
        }
        last_phase = ph;
        if ((ph == PL_COORD_DONE || ph == PL_COORD_FAILED) && !finished) {
            finished = 1;
            end_ms = pl_now_ms();
        }
        if (finished) {
            int left = 0;
            for (int i = 0; i < r->nw; i++) left += !r->w[i].exited;
            if (!left || pl_now_ms() - end_ms > FINISH_GRACE_MS) break;
        } else {
            int left = 0;
            for (int i = 0; i < r->nw; i++) left += !r->w[i].exited;
            if (!left) {
                if (error_exits == r->nw && same_status)
                    snprintf(err, sizeof err, "every worker failed the same way (exit status %d) "
                             "before the job finished: a bug in the job or its data, not a "
                             "preemption; see the workers' messages above", last_status);
                else
                    snprintf(err, sizeof err, "every worker ended before the job finished (%s)",
                             pl_coord_phase_name(ph));
                goto done;
            }
        }
    }
    /* plans that never committed a step: no duration */
    for (; reported < reconfigs; reported++)
        write_reconfig(metrics, pl_coord_reconfig(r->coord, reported), -1);
    {
        const double secs = (pl_now_ms() / 1e3) - t0;
        const int ns = pl_coord_nsteps(r->coord);
        const double final_loss = ns ? pl_coord_step_log(r->coord, ns - 1)->loss : NAN;
        const double tps = secs > 0 ? ns * tokens_per_step / secs : 0;
        printf("summary: %d steps, %d reconfigurations, final loss %.6f, %.1f s, %.0f tok/s\n",
               ns, reconfigs, final_loss, secs, tps);
        if (metrics) {
            fprintf(metrics, "{\"event\": \"summary\", \"steps\": %d, \"reconfigurations\": %d, "
                             "\"final_loss\": ", ns, reconfigs);
            if (isfinite(final_loss)) fprintf(metrics, "%.9g", final_loss);
            else fputs("null", metrics);
            fprintf(metrics, ", \"seconds\": %.3f, \"tokens_per_second\": %.1f}\n", secs, tps);
            fflush(metrics);
        }
    }
    if (pl_coord_phase(r->coord) == PL_COORD_DONE) {
        printf("run: done, %d steps committed, generation %lld\n", pl_coord_nsteps(r->coord),
               (long long)pl_coord_generation(r->coord));
        rc = 0;
    } else {
        snprintf(err, sizeof err, "job failed: %s", pl_coord_reason(r->coord));
    }
done:
    free(fired);
    if (rc && err[0]) fprintf(stderr, "pliant run: %s\n", err);
    if (metrics) fclose(metrics);
    if (be) be->ops->destroy(be);
    if (r) {
        pl_coord_session_free(r->session);
        pl_coord_free(r->coord);
        free(r);
    }
    if (have_plan) pl_job_plan_free(&plan);
    if (have_tok) pl_tokens_close(&tok);
    pl_job_free(&job);
    pl_chaos_free(&chaos);
    return rc;
bad:
    fprintf(stderr, "pliant run: %s\n", err);
    run_usage(stderr);
    return 2;
}
