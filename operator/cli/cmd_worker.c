/* `pliant worker JOB.yaml [--threads N] [--backend auto|cpu|cuda] [--insecure]`: one worker process of
 * `pliant run` or of a TrainingJob's Pod (worker/agent/agent.h). The coordinator and
 * credentials come from the environment: PLIANT_COORDINATOR (HOST:PORT),
 * PLIANT_TOKEN (or PLIANT_TOKEN_FILE), PLIANT_CA (the coordinator's certificate or its CA:
 * required, unless --insecure or PLIANT_INSECURE=1 turns the certificate check off, which
 * is logged as a warning), PLIANT_WORKER_NAME, PLIANT_NODE (the machine; default the host name),
 * PLIANT_HOST (the address peer links listen on, default 127.0.0.1; 0.0.0.0 in a
 * Pod), PLIANT_ADVERTISE (the address peers dial, default PLIANT_HOST: the Pod
 * IP), PLIANT_PEER_PORT (default 0: any free port), PLIANT_PEER_PROTECTION (none,
 * integrity or encrypt: how peer frames are protected, worker/comm/tcp.h; default
 * PL_PROTECT_DEFAULT_MODE), PLIANT_GRACE_SECONDS (seconds, fractions too: from SIGTERM
 * to the kill, told the coordinator with `leaving`; default 0: unknown) and
 * PLIANT_CHECKPOINT_DIR
 * (overrides spec.checkpoint.dir), PLIANT_ZONE (its topology zone, for placement)
 * PLIANT_THREADS (as --threads) and PLIANT_BACKEND (as --backend: the kernels; auto
 * = CUDA where this build has it and a device is visible). Exits with the code of
 * the coordinator's `stop`, 1 on a failure, 2 on bad input. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "cli_args.h"
#include "commands.h"
#include "tcp.h"
#include "util.h"

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && v[0] ? v : dflt;
}

/* The coordinator's certificate: PLIANT_CA, required unless the check is turned off
 * explicitly (--insecure, PLIANT_INSECURE=1), which is logged. −1 and err. */
static int coordinator_ca(int insecure_flag, pl_agent_options *o, char *err, size_t errlen)
{
    const char *env = env_or("PLIANT_INSECURE", "0");
    int insecure = insecure_flag || !strcmp(env, "1") || !strcmp(env, "true");
    if (!insecure && strcmp(env, "0") && strcmp(env, "false"))
        return pl_errf(err, errlen, "PLIANT_INSECURE: \"%s\" is not 1, true, 0 or false", env);
    o->ca_path = env_or("PLIANT_CA", NULL);
    if (o->ca_path) return 0;
    if (!insecure)
        return pl_errf(err, errlen, "PLIANT_CA: not set: the coordinator's certificate (or its "
                                    "CA) is needed to check the control connection; "
                                    "--insecure or PLIANT_INSECURE=1 connects without checking it");
    fprintf(stderr, "pliant worker: warning: %s: the coordinator's certificate is not checked "
                    "(anyone on the path can impersonate it)\n",
            insecure_flag ? "--insecure" : "PLIANT_INSECURE=1");
    o->insecure = 1;
    return 0;
}

int cmd_worker(int argc, char **argv)
{
    static const struct option opts[] = {{"threads", required_argument, 0, 't'},
                                         {"backend", required_argument, 0, 'b'},
                                         {"insecure", no_argument, 0, 'i'},
                                         {0, 0, 0, 0}};
    char err[512] = "";
    long long threads = 0, v;
    const char *backend = env_or("PLIANT_BACKEND", "auto");
    int c, insecure = 0;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'b' || c == 'i') {
            if (c == 'b') backend = optarg;
            else insecure = 1;
            continue;
        }
        if (c != 't' || cli_parse_int("--threads", optarg, 1, 1024, &threads, err, sizeof err)) {
            if (!err[0]) snprintf(err, sizeof err, "unknown option '%s'", argv[optind - 1]);
            fprintf(stderr, "pliant worker: %s\n", err);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "usage: pliant worker JOB.yaml [--threads N] [--backend auto|cpu|cuda] "
                        "[--insecure]\n");
        return 2;
    }
    if (cli_check_backend("--backend (or PLIANT_BACKEND)", backend, err, sizeof err)) {
        fprintf(stderr, "pliant worker: %s\n", err);
        return 2;
    }
    /* PLIANT_THREADS: where Pods share cores (the test suite's fake kubelet), OpenMP
     * spin-waits badly with more threads than cores */
    const char *env_threads = env_or("PLIANT_THREADS", NULL);
    if (!threads && env_threads &&
        cli_parse_int("PLIANT_THREADS", env_threads, 1, 1024, &threads, err, sizeof err)) {
        fprintf(stderr, "pliant worker: %s\n", err);
        return 2;
    }
    pl_agent_options o = {.job_path = argv[optind], .threads = (int)threads, .backend = backend};
    o.coordinator = env_or("PLIANT_COORDINATOR", NULL);
    o.token = env_or("PLIANT_TOKEN", "");
    const char *token_file = env_or("PLIANT_TOKEN_FILE", NULL);
    char *token = NULL; /* the Secret's file, as mounted in a Pod */
    if (token_file) {
        if (!(token = pl_read_file(token_file, err, sizeof err))) goto bad;
        token[strcspn(token, "\r\n")] = 0;
        o.token = token;
    }
    o.name = env_or("PLIANT_WORKER_NAME", NULL);
    o.node = env_or("PLIANT_NODE", NULL);
    o.zone = env_or("PLIANT_ZONE", NULL);
    o.host = env_or("PLIANT_HOST", NULL);
    o.advertise = env_or("PLIANT_ADVERTISE", NULL);
    o.checkpoint_dir = env_or("PLIANT_CHECKPOINT_DIR", NULL);
    if (!o.coordinator || !o.name) {
        fprintf(stderr, "pliant worker: PLIANT_COORDINATOR and PLIANT_WORKER_NAME must be set\n");
        free(token);
        return 2;
    }
    if (coordinator_ca(insecure, &o, err, sizeof err)) goto bad;
    if (cli_parse_int("PLIANT_PEER_PORT", env_or("PLIANT_PEER_PORT", "0"), 0, 65535, &v, err,
                      sizeof err))
        goto bad;
    o.peer_port = (int)v;
    double grace;
    if (cli_parse_double("PLIANT_GRACE_SECONDS", env_or("PLIANT_GRACE_SECONDS", "0"), 0, 86400,
                         &grace, err, sizeof err))
        goto bad;
    o.grace_ms = llround(grace * 1000);
    pl_frame_protection prot;
    if (pl_frame_protection_parse(env_or("PLIANT_PEER_PROTECTION", NULL), &prot, err, sizeof err))
        goto bad;
    o.peer_protection = (int)prot;
    int rc = pl_agent_run(&o);
    free(token);
    return rc;
bad:
    free(token);
    fprintf(stderr, "pliant worker: %s\n", err);
    return 2;
}
