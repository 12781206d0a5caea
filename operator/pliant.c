/* `pliant`: one command for planning, training and running jobs. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

#define PLIANT_VERSION "0.1.0"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pliant COMMAND [ARGS]\n"
            "\n"
            "commands:\n"
            "  plan      pipeline templates, instantiation and re-instantiation plans\n"
            "  version   print the version\n"
            "\n"
            "Run 'pliant COMMAND --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 1, argv + 1);
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
