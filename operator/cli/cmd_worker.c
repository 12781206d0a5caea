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
 * PLIANT_THREADS (as --threads), PLIANT_BACKEND (as --backend: the kernels; auto
 * = CUDA where this build has it and a device is visible) and PLIANT_COPY_RESERVE (auto,
 * the default, or off: the CPU worker's memory held ready for a loss's copies,
 * worker/engine/copy_reserve.h). Exits with the code of
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

/* The command line: --threads, --backend (over PLIANT_BACKEND, o->backend's default),
 * --insecure and JOB.yaml. 0, or 2 once the error is printed. */
static int parse_flags(int argc, char **argv, pl_agent_options *o, int *insecure)
{
    static const struct option opts[] = {{"threads", required_argument, 0, 't'},
                                         {"backend", required_argument, 0, 'b'},
                                         {"insecure", no_argument, 0, 'i'},
                                         {0, 0, 0, 0}};
    char err[512] = "";
    long long threads = 0;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'b' || c == 'i') {
            if (c == 'b') o->backend = optarg;
            else *insecure = 1;
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
    if (cli_check_backend("--backend (or PLIANT_BACKEND)", o->backend, err, sizeof err)) {
        fprintf(stderr, "pliant worker: %s\n", err);
        return 2;
    }
    o->job_path = argv[optind];
    o->threads = (int)threads;
    return 0;
}

/* PLIANT_TOKEN, or the text of PLIANT_TOKEN_FILE (the Secret's file, as mounted in a
 * Pod) up to its first line end: then *token holds it, for the caller to free. 0, or -1
 * and err. */
static int job_token(pl_agent_options *o, char **token, char *err, size_t errlen)
{
    o->token = env_or("PLIANT_TOKEN", "");
    const char *token_file = env_or("PLIANT_TOKEN_FILE", NULL);
    if (!token_file) return 0;
    if (!(*token = pl_read_file(token_file, err, errlen))) return -1;
    (*token)[strcspn(*token, "\r\n")] = 0;
    o->token = *token;
    return 0;
}

/* PLIANT_PEER_PORT, PLIANT_GRACE_SECONDS, PLIANT_PEER_PROTECTION and PLIANT_COPY_RESERVE. 0,
 * or -1 and err. */
static int peer_options(pl_agent_options *o, char *err, size_t errlen)
{
    long long port;
    if (cli_parse_int("PLIANT_PEER_PORT", env_or("PLIANT_PEER_PORT", "0"), 0, 65535, &port, err,
                      errlen))
        return -1;
    o->peer_port = (int)port;
    double grace;
    if (cli_parse_double("PLIANT_GRACE_SECONDS", env_or("PLIANT_GRACE_SECONDS", "0"), 0, 86400,
                         &grace, err, errlen))
        return -1;
    o->grace_ms = llround(grace * 1000);
    pl_frame_protection prot;
    if (pl_frame_protection_parse(env_or("PLIANT_PEER_PROTECTION", NULL), &prot, err, errlen))
        return -1;
    o->peer_protection = (int)prot;
    const char *reserve = env_or("PLIANT_COPY_RESERVE", "auto");
    if (strcmp(reserve, "auto") && strcmp(reserve, "off"))
        return pl_errf(err, errlen, "PLIANT_COPY_RESERVE: \"%s\" is not auto or off", reserve);
    o->no_copy_reserve = !strcmp(reserve, "off");
    return 0;
}

/* What the environment gives (the header lists it); *token as job_token. 0, or -1 and
 * err. */
static int options_from_env(int insecure, pl_agent_options *o, char **token, char *err,
                            size_t errlen)
{
    /* PLIANT_THREADS: where Pods share cores (the test suite's fake kubelet), OpenMP
     * spin-waits badly with more threads than cores */
    const char *env_threads = env_or("PLIANT_THREADS", NULL);
    long long threads;
    if (!o->threads && env_threads) {
        if (cli_parse_int("PLIANT_THREADS", env_threads, 1, 1024, &threads, err, errlen))
            return -1;
        o->threads = (int)threads;
    }
    o->coordinator = env_or("PLIANT_COORDINATOR", NULL);
    if (job_token(o, token, err, errlen)) return -1;
    o->name = env_or("PLIANT_WORKER_NAME", NULL);
    o->node = env_or("PLIANT_NODE", NULL);
    o->zone = env_or("PLIANT_ZONE", NULL);
    o->host = env_or("PLIANT_HOST", NULL);
    o->advertise = env_or("PLIANT_ADVERTISE", NULL);
    o->checkpoint_dir = env_or("PLIANT_CHECKPOINT_DIR", NULL);
    if (!o->coordinator || !o->name)
        return pl_errf(err, errlen, "PLIANT_COORDINATOR and PLIANT_WORKER_NAME must be set");
    if (coordinator_ca(insecure, o, err, errlen)) return -1;
    return peer_options(o, err, errlen);
}

int cmd_worker(int argc, char **argv)
{
    pl_agent_options o = {.backend = env_or("PLIANT_BACKEND", "auto")};
    int insecure = 0;
    int rc = parse_flags(argc, argv, &o, &insecure);
    if (rc) return rc;
    char err[512] = "";
    char *token = NULL;
    if (options_from_env(insecure, &o, &token, err, sizeof err)) {
        free(token);
        fprintf(stderr, "pliant worker: %s\n", err);
        return 2;
    }
    rc = pl_agent_run(&o);
    free(token);
    return rc;
}
