/* Planner profiles of a job's model, measured on a kernel backend or synthetic
 * (model_profile.h). */
#include "model_profile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cJSON.h>

#include "engine.h"
#include "trainer.h"
#include "util.h"

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
    int rc = tok && act && tf && tb ? 0 : pl_errf(err, errlen, "profile: out of memory");
    for (size_t i = 0; rc == 0 && i < BT; i++) tok[i] = (int32_t)(i * 7919 % (size_t)cfg->V);
    for (size_t i = 0; rc == 0 && i < BTC; i++)
        act[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (int r = 0; rc == 0 && r <= repeat; r++) { /* run 0 warms up */
        double t0 = pl_now_ms();
        pl_engine_forward(&e, 0, tok, act, tok);
        kn_sync(k);
        double t1 = pl_now_ms();
        pl_engine_backward_last(&e, 0, act, 1.0f / (float)BT, NULL, NULL);
        kn_sync(k);
        double t2 = pl_now_ms();
        if (r) {
            tf[r - 1] = t1 - t0;
            tb[r - 1] = t2 - t1;
        }
    }
    if (rc == 0) {
        qsort(tf, (size_t)repeat, sizeof *tf, cmp_double);
        qsort(tb, (size_t)repeat, sizeof *tb, cmp_double);
        *fwd = tf[repeat / 2];
        *bwd = tb[repeat / 2];
        *act_bytes = e.act_bytes;
    }
    free(tok);
    free(act);
    free(tf);
    free(tb);
    pl_engine_destroy(&e);
    return rc;
}

/* The profile's header for a device of memory_bytes; layers are appended to its
 * "layers" array. */
static cJSON *profile_object(const pl_job *job, double memory_bytes)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", job->model.preset[0] ? job->model.preset : "custom");
    cJSON_AddNumberToObject(o, "microbatch_size", job->batch.micro);
    cJSON_AddNumberToObject(o, "gpus_per_node", 1);
    cJSON_AddNumberToObject(o, "gpu_memory_bytes", memory_bytes);
    /* loopback-class figures for processes on one machine */
    cJSON_AddNumberToObject(o, "intra_node_GBps", 10.0);
    cJSON_AddNumberToObject(o, "inter_node_GBps", 1.0);
    cJSON_AddArrayToObject(o, "layers");
    return o;
}

static void add_layer(cJSON *o, const pl_gpt_config *cfg, int l, int B, int T, double fwd,
                      double bwd, double act)
{
    char name[32];
    snprintf(name, sizeof name, l == 0 ? "embedding" : l == cfg->L + 1 ? "head" : "block%d",
             l - 1);
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "name", name);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(x, "forward_ms"), "1", fwd);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(x, "backward_ms"), "1", bwd);
    cJSON_AddNumberToObject(x, "param_bytes", 4.0 * (double)pl_gpt_layer_params(cfg, l));
    cJSON_AddNumberToObject(x, "activation_bytes", act);
    cJSON_AddNumberToObject(x, "output_bytes", l == cfg->L + 1 ? 0 : 4.0 * B * T * (double)cfg->C);
    cJSON_AddItemToArray(cJSON_GetObjectItem(o, "layers"), x);
}

static char *finish(cJSON *o, char *err, size_t errlen)
{
    char *text = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!text && !err[0]) pl_errf(err, errlen, "profile: out of memory");
    return text;
}

char *pl_model_profile_measure(const pl_job *job, kn_ctx *k, int repeat, char *err,
                               size_t errlen)
{
    pl_gpt_config cfg;
    err[0] = 0;
    if (pl_job_gpt_config(job, &cfg, err, errlen)) return NULL;
    kn_ctx *own = k ? NULL : kn_create("cpu", 0, err, errlen);
    if (!k && !(k = own)) return NULL;
    const int B = job->batch.micro, T = job->batch.seq_len;
    cJSON *o = profile_object(job, (double)kn_device_memory(k));
    for (int l = 0; o && l < cfg.L + 2; l++) {
        double fwd, bwd;
        size_t act;
        if (time_layer(k, &cfg, l, B, T, repeat, &fwd, &bwd, &act, err, errlen)) {
            cJSON_Delete(o);
            o = NULL;
            break;
        }
        add_layer(o, &cfg, l, B, T, fwd, bwd, (double)act);
    }
    if (own) kn_destroy(own);
    return finish(o, err, errlen);
}

char *pl_model_profile_synthetic(const pl_job *job, char *err, size_t errlen)
{
    pl_gpt_config cfg;
    err[0] = 0;
    if (pl_job_gpt_config(job, &cfg, err, errlen)) return NULL;
    const int B = job->batch.micro, T = job->batch.seq_len;
    const double BT = (double)B * T, C = cfg.C;
    cJSON *o = profile_object(job, (double)kn_device_memory(NULL));
    for (int l = 0; l < cfg.L + 2; l++) {
        double params = (double)pl_gpt_layer_params(&cfg, l);
        double flops = l == 0 ? BT * C : 2.0 * params * BT + (l <= cfg.L ? 4.0 * BT * T * C : 0);
        double fwd = flops / 1e7; /* ms at 10 GFLOP/s */
        if (fwd < 0.001) fwd = 0.001;
        double act = l == 0 ? 4 * BT * C : l == cfg.L + 1 ? 8 * BT * cfg.Vp : 64 * BT * C;
        add_layer(o, &cfg, l, B, T, round(fwd * 1e6) / 1e6, round(2 * fwd * 1e6) / 1e6, act);
    }
    return finish(o, err, errlen);
}
