/* `pliant profile JOB.yaml [--out FILE] [--repeat N] [--threads T]`: measures each
 * layer of the job's model for one microbatch (forward and backward ms, parameter,
 * activation and output bytes) and writes the planner's profile JSON
 * (worker/engine/model_profile.h: the code a worker measures with when the coordinator
 * asks, here on this machine's CPU). --threads: the compute threads, as `pliant run
 * --threads` gives each worker (default: every core), so that a profile measures the
 * layers as the workers will run them. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_args.h"
#include "commands.h"
#include "jobspec.h"
#include "kernels.h"
#include "model_profile.h"

int cmd_profile(int argc, char **argv)
{
    static const struct option opts[] = {{"out", required_argument, 0, 'o'},
                                         {"repeat", required_argument, 0, 'r'},
                                         {"threads", required_argument, 0, 't'},
                                         {0, 0, 0, 0}};
    const char *out_path = NULL;
    long long repeat = 5, threads = 0;
    char err[1024] = "";
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = c == 'r'   ? cli_parse_int("--repeat", optarg, 1, 1000, &repeat, err, sizeof err)
                  : c == 't' ? cli_parse_int("--threads", optarg, 1, 1024, &threads, err, sizeof err)
                             : c != 'o';
        if (c == 'o') out_path = optarg;
        if (bad) {
            if (!err[0]) snprintf(err, sizeof err, "unknown option '%s'", argv[optind - 1]);
            fprintf(stderr, "pliant profile: %s\n", err);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "pliant profile: usage: pliant profile JOB.yaml [--out FILE] [--repeat N] "
                        "[--threads T]\n");
        return 2;
    }
    pl_job job;
    if (pl_job_load(argv[optind], &job, err, sizeof err)) {
        fprintf(stderr, "pliant profile: %s: %s\n", argv[optind], err);
        return 2;
    }
    kn_ctx *k = kn_create("cpu", (int)threads, err, sizeof err);
    char *text = k ? pl_model_profile_measure(&job, k, (int)repeat, err, sizeof err) : NULL;
    if (k) kn_destroy(k);
    pl_job_free(&job);
    if (!text) {
        fprintf(stderr, "pliant profile: %s\n", err);
        return 1;
    }
    FILE *f = out_path ? fopen(out_path, "w") : stdout;
    int rc = f && fprintf(f, "%s\n", text) >= 0 ? 0 : 1;
    if (out_path && f) rc |= fclose(f) != 0;
    if (rc) fprintf(stderr, "pliant profile: cannot write %s\n", out_path ? out_path : "stdout");
    free(text);
    return rc;
}
