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

/* Takes one option getopt_long returned: 0, 1 for --help, or -1 with err. */
static int train_option(int c, char **argv, pl_train_options *o, char *err, size_t errlen)
{
    long long v;
    switch (c) {
    case 's':
        if (cli_parse_int("--steps", optarg, 1, 1000000000, &v, err, errlen)) return -1;
        o->steps = (int)v;
        return 0;
    case 't':
        if (cli_parse_int("--threads", optarg, 1, 1024, &v, err, errlen)) return -1;
        o->threads = (int)v;
        return 0;
    case 'm': o->metrics_path = optarg; return 0;
    case 'b':
        if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda")) {
            snprintf(err, errlen, "--backend: must be cpu or cuda, not '%s'", optarg);
            return -1;
        }
        o->backend = optarg;
        return 0;
    case 'h': return 1;
    default:
        snprintf(err, errlen, "unknown option or missing value: '%s'", argv[optind - 1]);
        return -1;
    }
}

/* The options into *o and the one JOB.yaml at argv[optind]: 0, 1 for --help, or -1 with
 * err. */
static int parse_args(int argc, char **argv, pl_train_options *o, char *err, size_t errlen)
{
    static const struct option opts[] = {{"steps", required_argument, 0, 's'},
                                         {"metrics", required_argument, 0, 'm'},
                                         {"threads", required_argument, 0, 't'},
                                         {"backend", required_argument, 0, 'b'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int rc = train_option(c, argv, o, err, errlen);
        if (rc) return rc;
    }
    if (optind != argc - 1) {
        snprintf(err, errlen, "expects exactly one JOB.yaml");
        return -1;
    }
    return 0;
}

int cmd_train(int argc, char **argv)
{
    char err[1024] = "";
    pl_train_options o = {.out = stdout};
    int rc = parse_args(argc, argv, &o, err, sizeof err);
    if (rc) return cli_usage_exit(rc, "train", err, train_usage);
    pl_job job;
    if (pl_job_load(argv[optind], &job, err, sizeof err)) {
        fprintf(stderr, "pliant train: %s: %s\n", argv[optind], err);
        return 2;
    }
    rc = pl_train(&job, &o, err, sizeof err);
    pl_job_free(&job);
    if (rc) {
        fprintf(stderr, "pliant train: %s\n", err);
        return 1;
    }
    return 0;
}
