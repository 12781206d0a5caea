/* `pliant profile JOB.yaml [--out FILE] [--repeat N]`: measures each layer of
 * the job's model for one microbatch (forward and backward ms, parameter,
 * activation and output bytes) and writes the planner's profile JSON
 * (worker/engine/model_profile.h: the code a worker measures with when the coordinator
 * asks, here on this machine's CPU). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli_args.h"
#include "commands.h"
#include "jobspec.h"
#include "model_profile.h"

int cmd_profile(int argc, char **argv)
{
    static const struct option opts[] = {{"out", required_argument, 0, 'o'},
                                         {"repeat", required_argument, 0, 'r'},
                                         {0, 0, 0, 0}};
    const char *out_path = NULL;
    long long repeat = 5;
    char err[1024] = "";
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'o') {
            out_path = optarg;
        } else if (c != 'r' || cli_parse_int("--repeat", optarg, 1, 1000, &repeat, err, sizeof err)) {
            if (!err[0]) snprintf(err, sizeof err, "unknown option '%s'", argv[optind - 1]);
            fprintf(stderr, "pliant profile: %s\n", err);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "pliant profile: usage: pliant profile JOB.yaml [--out FILE] [--repeat N]\n");
        return 2;
    }
    pl_job job;
    if (pl_job_load(argv[optind], &job, err, sizeof err)) {
        fprintf(stderr, "pliant profile: %s: %s\n", argv[optind], err);
        return 2;
    }
    char *text = pl_model_profile_measure(&job, NULL, (int)repeat, err, sizeof err);
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
