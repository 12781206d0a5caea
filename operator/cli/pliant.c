/* `pliant`: one command for planning, training and running jobs. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "kernels.h"

#define PLIANT_VERSION "0.1.0"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pliant COMMAND [ARGS]\n"
            "\n"
            "commands:\n"
            "  plan      pipeline templates, instantiation and re-instantiation plans\n"
            "  train     train a TrainingJob's model in this process\n"
            "  tokenize  turn a text file into byte-level token shards\n"
            "  profile   measure a job's layers and write a planner profile\n"
            "  sample    generate text from a checkpoint\n"
            "  export    write a checkpoint as an llm.c model file\n"
            "  run       train a TrainingJob with local worker processes\n"
            "  worker    one worker process of 'pliant run' (started by it)\n"
            "  simulate  replay a spot trace in simulated time: throughput, cost, time split\n"
            "  version   print the version\n"
            "\n"
            "Run 'pliant COMMAND --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    kn_cpu_use_fast_blas(argv); /* OpenBLAS's kernels for this CPU (kernels.h) */
    /* installed as pliant-worker (make cuda builds that name, the worker image's
     * entry point): the worker subcommand itself */
    const char *base = strrchr(argv[0], '/');
    if (!strcmp(base ? base + 1 : argv[0], "pliant-worker")) return cmd_worker(argc, argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } cmds[] = {{"plan", cmd_plan},       {"train", cmd_train},   {"tokenize", cmd_tokenize},
                {"profile", cmd_profile}, {"sample", cmd_sample}, {"export", cmd_export},
                {"run", cmd_run},         {"worker", cmd_worker},
                {"simulate", cmd_simulate}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(cmd, cmds[i].name)) return cmds[i].run(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("pliant %s\n", PLIANT_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "pliant: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
