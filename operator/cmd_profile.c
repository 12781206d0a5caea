/* `pliant profile JOB.yaml [--out FILE] [--repeat N]`: measures each layer of
 * the job's model for one microbatch (forward and backward ms, parameter,
 * activation and output bytes) and writes the planner's profile JSON. On the
 * CPU backend a "GPU" is this machine: the only GPU count is 1. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "cli_args.h"
#include "commands.h"
#include "engine.h"
#include "jobspec.h"
#include "trainer.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median forward and backward ms of layer l alone, over `repeat` runs. */
static int time_layer(kn_ctx *k, const pl_gpt_config *cfg, int l, int B, int T, int repeat,
                      double *fwd, double *bwd, size_t *act_bytes, char *err, size_t errlen)
{
    pl_engine e;
    if (pl_engine_create(&e, k, cfg, l, l + 1, B, T, 1, err, errlen)) return -1;
    pl_engine_init_random(&e, 1);
    size_t BT = (size_t)B * T, BTC = BT * (size_t)cfg->C;
    int32_t *tok = malloc(BT * sizeof *tok);
    float *act = malloc(BTC * sizeof *act);
    double *tf = malloc((size_t)repeat * sizeof *tf), *tb = malloc((size_t)repeat * sizeof *tb);
    if (!tok || !act || !tf || !tb) abort();
    for (size_t i = 0; i < BT; i++) tok[i] = (int32_t)(i * 7919 % (size_t)cfg->V);
    for (size_t i = 0; i < BTC; i++) act[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int r = 0; r <= repeat; r++) { /* run 0 warms up */
        double t0 = now_ms();
        pl_engine_forward(&e, 0, tok, act, tok);
        kn_sync(k);
        double t1 = now_ms();
        pl_engine_backward(&e, 0, act, 1.0f / (float)BT);
        kn_sync(k);
        double t2 = now_ms();
        if (r) {
            tf[r - 1] = t1 - t0;
            tb[r - 1] = t2 - t1;
        }
    }
    qsort(tf, (size_t)repeat, sizeof *tf, cmp_double);
    qsort(tb, (size_t)repeat, sizeof *tb, cmp_double);
    *fwd = tf[repeat / 2];
    *bwd = tb[repeat / 2];
    *act_bytes = e.act_bytes;
    free(tok);
    free(act);
    free(tf);
    free(tb);
    pl_engine_destroy(&e);
    return 0;
}

static cJSON *profile_json(const pl_job *job, int repeat, char *err, size_t errlen)
{
    pl_gpt_config cfg;
    if (pl_job_gpt_config(job, &cfg, err, errlen)) return NULL;
    kn_ctx *k = kn_create("cpu", 0, err, errlen);
    if (!k) return NULL;
    const int B = job->batch.micro, T = job->batch.seq_len;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", job->model.preset);
    cJSON_AddNumberToObject(o, "microbatch_size", B);
    cJSON_AddNumberToObject(o, "gpus_per_node", 1);
    cJSON_AddNumberToObject(o, "gpu_memory_bytes",
                            (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE));
    /* loopback-class figures for processes on one machine */
    cJSON_AddNumberToObject(o, "intra_node_GBps", 10.0);
    cJSON_AddNumberToObject(o, "inter_node_GBps", 1.0);
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    for (int l = 0; l < cfg.L + 2; l++) {
        double fwd, bwd;
        size_t act;
        if (time_layer(k, &cfg, l, B, T, repeat, &fwd, &bwd, &act, err, errlen)) {
            cJSON_Delete(o);
            o = NULL;
            break;
        }
        cJSON *x = cJSON_CreateObject();
        char name[32];
        snprintf(name, sizeof name, l == 0 ? "embedding" : l == cfg.L + 1 ? "head" : "block%d", l - 1);
        cJSON_AddStringToObject(x, "name", name);
        cJSON_AddItemToObject(x, "forward_ms", cJSON_CreateObject());
        cJSON_AddNumberToObject(cJSON_GetObjectItem(x, "forward_ms"), "1", fwd);
        cJSON_AddItemToObject(x, "backward_ms", cJSON_CreateObject());
        cJSON_AddNumberToObject(cJSON_GetObjectItem(x, "backward_ms"), "1", bwd);
        cJSON_AddNumberToObject(x, "param_bytes", 4.0 * (double)pl_gpt_layer_params(&cfg, l));
        cJSON_AddNumberToObject(x, "activation_bytes", (double)act);
        cJSON_AddNumberToObject(x, "output_bytes",
                                l == cfg.L + 1 ? 0 : 4.0 * B * T * (double)cfg.C);
        cJSON_AddItemToArray(layers, x);
    }
    kn_destroy(k);
    return o;
}

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
    cJSON *o = profile_json(&job, (int)repeat, err, sizeof err);
    pl_job_free(&job);
    char *text = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!text) {
        fprintf(stderr, "pliant profile: %s\n", err[0] ? err : "out of memory");
        return 1;
    }
    FILE *f = out_path ? fopen(out_path, "w") : stdout;
    int rc = f && fprintf(f, "%s\n", text) >= 0 ? 0 : 1;
    if (out_path && f) rc |= fclose(f) != 0;
    if (rc) fprintf(stderr, "pliant profile: cannot write %s\n", out_path ? out_path : "stdout");
    free(text);
    return rc;
}
