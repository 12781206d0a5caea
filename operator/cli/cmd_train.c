/* `pliant train JOB.yaml [--steps N] [--metrics FILE] [--threads N]`: the
 * whole model in this process. Bad input exits 2, a failed run 1. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli_args.h"
#include "commands.h"
#include "jobspec.h"
#include "trainer.h"

static void train_usage(FILE *f)
{
    fprintf(f, "usage: pliant train JOB.yaml [--steps N] [--metrics FILE] [--threads N]\n"
               "                   [--backend cpu|cuda]   (cuda: the pliant-cuda build of make cuda)\n");
}

int cmd_train(int argc, char **argv)
{
    static const struct option opts[] = {{"steps", required_argument, 0, 's'},
                                         {"metrics", required_argument, 0, 'm'},
                                         {"threads", required_argument, 0, 't'},
                                         {"backend", required_argument, 0, 'b'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    char err[1024] = "";
    pl_train_options o = {.out = stdout};
    long long v;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            if (cli_parse_int("--steps", optarg, 1, 1000000000, &v, err, sizeof err)) goto bad;
            o.steps = (int)v;
            break;
        case 't':
            if (cli_parse_int("--threads", optarg, 1, 1024, &v, err, sizeof err)) goto bad;
            o.threads = (int)v;
            break;
        case 'm': o.metrics_path = optarg; break;
        case 'b':
            if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) {
                snprintf(err, sizeof err, "--backend: must be cpu or cuda, not '%s'", optarg);
                goto bad;
            }
            o.backend = optarg;
            break;
        case 'h': train_usage(stdout); return 0;
        default:
            snprintf(err, sizeof err, "unknown option or missing value: '%s'", argv[optind - 1]);
            goto bad;
        }
    }
    if (optind != argc - 1) {
        snprintf(err, sizeof err, "expects exactly one JOB.yaml");
        goto bad;
    }
    pl_job job;
    if (pl_job_load(argv[optind], &job, err, sizeof err)) {
        fprintf(stderr, "pliant train: %s: %s\n", argv[optind], err);
        return 2;
    }
    int rc = pl_train(&job, &o, err, sizeof err);
    pl_job_free(&job);
    if (rc) {
        fprintf(stderr, "pliant train: %s\n", err);
        return 1;
    }
    return 0;
bad:
    fprintf(stderr, "pliant train: %s\n", err);
    train_usage(stderr);
    return 2;
}
