/* `pliant profile JOB.yaml [--out FILE] [--repeat N] [--threads T] [--gpu-memory BYTES]
 * [--pipeline-workers W [--pipeline-steps N]]`: measures each layer of the job's model
 * for one microbatch (forward and backward ms, parameter, activation and output bytes)
 * and writes the planner's profile JSON (worker/engine/model_profile.h: the code a
 * worker measures with when the coordinator asks, here on this machine's CPU).
 * --threads: the compute threads, as `pliant run --threads` gives each worker (default:
 * what `pliant run` gives each of W workers, else every core), so that a profile
 * measures the layers as the workers will run them. --gpu-memory: the memory the
 * planner plans each node for instead of this device's. --pipeline-workers: then the
 * job's real failure-free step on W local workers (profile_step.h), N steps (default
 * 100), as the profile's "pipeline_step": what `pliant simulate` takes this machine's
 * message latency from (docs/simulate.md). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_args.h"
#include "commands.h"
#include "kernels.h"
#include "model_profile.h"
#include "profile_step.h"
#include "util.h"

typedef struct {
    const char *job_path, *out_path;
    long long repeat, threads, gpu_memory, workers, steps;
} profile_args;

static int parse_option(int c, profile_args *a, char **argv, char *err, size_t errlen)
{
    switch (c) {
    case 'o': a->out_path = optarg; return 0;
    case 'r': return cli_parse_int("--repeat", optarg, 1, 1000, &a->repeat, err, errlen);
    case 't': return cli_parse_int("--threads", optarg, 1, 1024, &a->threads, err, errlen);
    case 'g':
        return cli_parse_int("--gpu-memory", optarg, 1, 9000000000000000LL, &a->gpu_memory, err,
                             errlen);
    case 'w': return cli_parse_int("--pipeline-workers", optarg, 1, 4096, &a->workers, err, errlen);
    case 's': return cli_parse_int("--pipeline-steps", optarg, 2, 1000000, &a->steps, err, errlen);
    default: return pl_errf(err, errlen, "unknown option or missing value: '%s'", argv[optind - 1]);
    }
}

static int parse_args(int argc, char **argv, profile_args *a, char *err, size_t errlen)
{
    static const struct option opts[] = {{"out", required_argument, 0, 'o'},
                                         {"repeat", required_argument, 0, 'r'},
                                         {"threads", required_argument, 0, 't'},
                                         {"gpu-memory", required_argument, 0, 'g'},
                                         {"pipeline-workers", required_argument, 0, 'w'},
                                         {"pipeline-steps", required_argument, 0, 's'},
                                         {0, 0, 0, 0}};
    *a = (profile_args){.repeat = 5, .steps = 100};
    opterr = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
        if (parse_option(c, a, argv, err, errlen)) return -1;
    if (optind != argc - 1)
        return pl_errf(err, errlen, "usage: pliant profile JOB.yaml [--out FILE] [--repeat N] "
                       "[--threads T] [--gpu-memory BYTES] [--pipeline-workers W "
                       "[--pipeline-steps N]]");
    a->job_path = argv[optind];
    if (!a->threads && a->workers) a->threads = cli_worker_threads(a->workers);
    return 0;
}

/* The layers measured, --gpu-memory over the device's: the profile as JSON. */
static cJSON *measure_layers(const profile_args *a, const pl_job *job, char *err, size_t errlen)
{
    kn_ctx *k = kn_create("cpu", (int)a->threads, err, errlen);
    char *text = k ? pl_model_profile_measure(job, k, (int)a->repeat, err, errlen) : NULL;
    if (k) kn_destroy(k);
    if (!text) return NULL;
    cJSON *p = cJSON_Parse(text);
    free(text);
    if (!p) pl_errf(err, errlen, "profile: out of memory");
    if (p && a->gpu_memory)
        cJSON_ReplaceItemInObject(p, "gpu_memory_bytes", cJSON_CreateNumber((double)a->gpu_memory));
    return p;
}

static int write_profile(const char *out_path, const cJSON *p)
{
    char *text = cJSON_Print(p);
    FILE *f = out_path ? fopen(out_path, "w") : stdout;
    int rc = text && f && fprintf(f, "%s\n", text) >= 0 ? 0 : 1;
    if (out_path && f) rc |= fclose(f) != 0;
    if (rc) fprintf(stderr, "pliant profile: cannot write %s\n", out_path ? out_path : "stdout");
    free(text);
    return rc;
}

int cmd_profile(int argc, char **argv)
{
    profile_args a;
    char err[1024] = "";
    if (parse_args(argc, argv, &a, err, sizeof err)) {
        fprintf(stderr, "pliant profile: %s\n", err);
        return 2;
    }
    pl_job job;
    if (pl_job_load(a.job_path, &job, err, sizeof err)) {
        fprintf(stderr, "pliant profile: %s: %s\n", a.job_path, err);
        return 2;
    }
    cJSON *p = measure_layers(&a, &job, err, sizeof err);
    const pl_step_run run = {.job_path = a.job_path, .job = &job, .workers = (int)a.workers,
                             .threads = (int)a.threads, .steps = (int)a.steps};
    if (p && a.workers && pl_profile_pipeline_step(p, &run, err, sizeof err)) {
        cJSON_Delete(p);
        p = NULL;
    }
    pl_job_free(&job);
    if (!p) {
        fprintf(stderr, "pliant profile: %s\n", err);
        return 1;
    }
    int rc = write_profile(a.out_path, p);
    cJSON_Delete(p);
    return rc;
}
