/* The pipeline step of a profile: `pliant run` of the job, failure-free, timed from its
 * metrics lines (profile_step.h). */
#include "profile_step.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"
#include "local_workers.h"
#include "util.h"

typedef struct {
    char dir[4096], profile[4200], metrics[4200], ckpt[4200];
} run_files;

/* A fresh temporary directory and the run's files in it. */
static int make_files(run_files *f, char *err, size_t errlen)
{
    const char *tmp = getenv("TMPDIR");
    if (pl_pathf(f->dir, sizeof f->dir, err, errlen, "%s/pliant-profile-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp"))
        return -1;
    if (!mkdtemp(f->dir)) return pl_errf(err, errlen, "cannot make a directory in %s", f->dir);
    snprintf(f->profile, sizeof f->profile, "%s/profile.json", f->dir);
    snprintf(f->metrics, sizeof f->metrics, "%s/metrics.jsonl", f->dir);
    snprintf(f->ckpt, sizeof f->ckpt, "%s/checkpoints", f->dir);
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void remove_files(const run_files *f)
{
    nftw(f->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Runs argv as a child, its output on stderr (stdout may be the profile), to its end:
 * 0 when it exited with 0. */
static int run_child(char *const *argv, char *err, size_t errlen)
{
    pl_local_workers *lw = pl_local_workers_new(err, errlen);
    pl_worker_spec spec = {.name = "run", .argv = argv, .log_path = "/dev/stderr"};
    if (!lw || pl_local_workers_start(lw, &spec, err, errlen)) {
        pl_local_workers_free(lw);
        return -1;
    }
    pl_worker_event ev;
    int got;
    while ((got = pl_local_workers_wait(lw, &ev, 1000)) == 0) {}
    pl_local_workers_free(lw);
    if (got < 0) return pl_errf(err, errlen, "pliant run: cannot wait for it");
    if (ev.end == PL_WORKER_KILLED) return pl_errf(err, errlen, "pliant run: signal %d", ev.signal);
    return ev.status ? pl_errf(err, errlen, "pliant run: exit status %d", ev.status) : 0;
}

/* `pliant run` of r's job on files f. */
static int run_job(const pl_step_run *r, const run_files *f, char *err, size_t errlen)
{
    char exe[4096], workers[16], threads[16], steps[16];
    if (cli_self_exe(exe, sizeof exe, err, errlen)) return -1;
    snprintf(workers, sizeof workers, "%d", r->workers);
    snprintf(threads, sizeof threads, "%d", r->threads);
    snprintf(steps, sizeof steps, "%d", r->steps);
    char *argv[] = {exe, "run", (char *)r->job_path, "--workers", workers, "--threads", threads,
                    "--steps", steps, "--profile", (char *)f->profile, "--checkpoint-dir",
                    (char *)f->ckpt, "--metrics", (char *)f->metrics, NULL};
    return run_child(argv, err, errlen);
}

/* The mean ms of the metrics' steps that follow a step of their plan, and their count. */
static int mean_step_ms(const char *metrics, double tokens, double *ms, int *n, char *err,
                        size_t errlen)
{
    char *text = pl_read_file(metrics, err, errlen);
    if (!text) return -1;
    double sum = 0;
    long long gen = -1;
    *n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "plan_generation");
        const cJSON *tps = cJSON_GetObjectItemCaseSensitive(o, "tokens_per_second");
        if (cJSON_IsNumber(g) && cJSON_IsNumber(tps) && tps->valuedouble > 0) {
            if ((long long)g->valuedouble == gen) {
                sum += tokens / tps->valuedouble * 1e3;
                ++*n;
            }
            gen = (long long)g->valuedouble;
        }
        cJSON_Delete(o);
    }
    free(text);
    if (!*n) return pl_errf(err, errlen, "pliant run: no step after a plan's first in %s", metrics);
    *ms = sum / *n;
    return 0;
}

static void add_pipeline_step(cJSON *profile, const pl_step_run *r, int steps, double ms)
{
    cJSON *o = cJSON_AddObjectToObject(profile, "pipeline_step");
    cJSON_AddStringToObject(o, "strategy", pl_ft_strategy_name(r->job->fault_tolerance.strategy));
    cJSON_AddNumberToObject(o, "workers", r->workers);
    cJSON_AddNumberToObject(o, "threads", r->threads);
    cJSON_AddNumberToObject(o, "steps", steps);
    cJSON_AddNumberToObject(o, "ms", ms);
}

int pl_profile_pipeline_step(cJSON *profile, const pl_step_run *r, char *err, size_t errlen)
{
    run_files f;
    if (make_files(&f, err, errlen)) return -1;
    char *text = cJSON_Print(profile);
    const pl_piece piece = {text, text ? strlen(text) : 0};
    const double tokens = (double)r->job->batch.global * r->job->batch.seq_len;
    double ms = 0;
    int n = 0, rc = text ? 0 : pl_errf(err, errlen, "profile: out of memory");
    if (!rc && (pl_write_atomic(f.profile, &piece, 1, err, errlen) || run_job(r, &f, err, errlen) ||
                mean_step_ms(f.metrics, tokens, &ms, &n, err, errlen)))
        rc = -1;
    if (!rc) add_pipeline_step(profile, r, n, ms);
    free(text);
    remove_files(&f);
    return rc;
}
