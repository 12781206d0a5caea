/* Planner profile parsing and validation. */
#include "profile.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobspec.h"
#include "json_num.h"
#include "util.h"

int pl_profile_key_index(const pl_profile *p, int d)
{
    for (int i = 0; i < p->nkeys; i++)
        if (p->keys[i] == d) return i;
    return -1;
}

int64_t pl_transfer_ns(int64_t bytes, double GBps)
{
    /* bytes / (GBps·1e9) seconds = bytes / GBps nanoseconds */
    return llround((double)bytes / GBps);
}

int64_t pl_profile_state_bytes(const pl_profile *p, int b, int e)
{
    int64_t bytes = 0;
    for (int l = b < 0 ? 0 : b; l < e && l < p->nlayers; l++)
        bytes += 3 * p->layers[l].param_bytes;
    return bytes;
}

/* A JSON number that must be a whole number of bytes below 9e15. */
static int get_bytes(const cJSON *obj, const char *key, const char *path, int64_t *out,
                     char *err, size_t errlen)
{
    return pl_json_get_int(obj, path, key, 0, 9000000000000000LL, out, err, errlen);
}

/* obj's field key, a positive number; errors name prefix.key (key without a prefix). */
static int get_positive(const cJSON *obj, const char *prefix, const char *key, double *out,
                        char *err, size_t errlen)
{
    char field[64];
    snprintf(field, sizeof field, "%s%s%s", prefix ? prefix : "", prefix ? "." : "", key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return pl_errf(err, errlen, "%s: missing", field);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return pl_errf(err, errlen, "%s: must be a number", field);
    if (v->valuedouble <= 0)
        return pl_errf(err, errlen, "%s: must be positive (got %g)", field, v->valuedouble);
    *out = v->valuedouble;
    return 0;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The GPU-count keys of the first layer's forward_ms define the profile's keys. */
static int parse_keys(pl_profile *p, const cJSON *fwd, char *err, size_t errlen)
{
    const cJSON *it;
    p->nkeys = 0;
    cJSON_ArrayForEach(it, fwd)
    {
        char *end;
        errno = 0;
        long d = strtol(it->string, &end, 10);
        if (errno || *end || end == it->string || d < 1)
            return pl_errf(err, errlen,
                           "layers[0].forward_ms: key \"%s\" is not a positive GPU count",
                           it->string);
        if (d > p->gpus_per_node)
            return pl_errf(err, errlen,
                           "layers[0].forward_ms: key \"%s\" exceeds gpus_per_node (%d)",
                           it->string, p->gpus_per_node);
        if (p->nkeys == PL_MAX_GPU_KEYS)
            return pl_errf(err, errlen, "layers[0].forward_ms: more than %d keys",
                           PL_MAX_GPU_KEYS);
        for (int i = 0; i < p->nkeys; i++)
            if (p->keys[i] == (int)d)
                return pl_errf(err, errlen, "layers[0].forward_ms: key \"%s\" repeated",
                               it->string);
        p->keys[p->nkeys++] = (int)d;
    }
    if (p->nkeys == 0 || pl_profile_key_index(p, 1) < 0)
        return pl_errf(err, errlen, "layers[0].forward_ms: must have the key \"1\"");
    qsort(p->keys, (size_t)p->nkeys, sizeof p->keys[0], cmp_int);
    return 0;
}

/* forward_ms / backward_ms of one layer: exactly the profile's keys. */
static int parse_times(const pl_profile *p, const cJSON *layer, const char *key,
                       const char *path, int64_t *out, char *err, size_t errlen)
{
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(layer, key);
    if (!cJSON_IsObject(obj))
        return pl_errf(err, errlen, "%s.%s: %s", path, key,
                       obj ? "must be an object keyed by GPU count" : "missing");
    if (cJSON_GetArraySize(obj) != p->nkeys)
        return pl_errf(err, errlen, "%s.%s: must have the same %d GPU-count keys as layers[0]",
                       path, key, p->nkeys);
    for (int k = 0; k < p->nkeys; k++) {
        char name[16];
        snprintf(name, sizeof name, "%d", p->keys[k]);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
        if (!v)
            return pl_errf(err, errlen, "%s.%s: missing key \"%s\"", path, key, name);
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
            return pl_errf(err, errlen, "%s.%s.\"%s\": must be a number", path, key, name);
        if (v->valuedouble < 0)
            return pl_errf(err, errlen, "%s.%s.\"%s\": must not be negative (got %g)", path, key,
                           name, v->valuedouble);
        /* the bound keeps every cost-model product inside int64 nanoseconds */
        if (v->valuedouble > 1e4)
            return pl_errf(err, errlen, "%s.%s.\"%s\": above 10000 ms per layer (got %g)", path,
                           key, name, v->valuedouble);
        out[k] = llround(v->valuedouble * 1e6);
    }
    return 0;
}

static int parse_layer(pl_profile *p, int i, const cJSON *layer, char *err, size_t errlen)
{
    char path[32];
    snprintf(path, sizeof path, "layers[%d]", i);
    if (!cJSON_IsObject(layer)) return pl_errf(err, errlen, "%s: must be an object", path);
    pl_layer_profile *l = &p->layers[i];
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(layer, "name");
    if (name && !cJSON_IsString(name))
        return pl_errf(err, errlen, "%s.name: must be a string", path);
    snprintf(l->name, sizeof l->name, "%s", name ? name->valuestring : "");
    if (parse_times(p, layer, "forward_ms", path, l->fwd_ns, err, errlen) ||
        parse_times(p, layer, "backward_ms", path, l->bwd_ns, err, errlen) ||
        get_bytes(layer, "param_bytes", path, &l->param_bytes, err, errlen) ||
        get_bytes(layer, "activation_bytes", path, &l->activation_bytes, err, errlen) ||
        get_bytes(layer, "output_bytes", path, &l->output_bytes, err, errlen))
        return -1;
    return 0;
}

/* The optional "pipeline_step": {"strategy", "workers", "threads", "steps", "ms"}. */
static int parse_pipeline_step(const cJSON *root, pl_pipeline_step *ps, char *err, size_t errlen)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "pipeline_step");
    if (!o) return 0;
    if (!cJSON_IsObject(o)) return pl_errf(err, errlen, "pipeline_step: must be an object");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "strategy");
    pl_ft_strategy ignored;
    if (!cJSON_IsString(st) || pl_ft_strategy_from_name(st->valuestring, &ignored))
        return pl_errf(err, errlen,
                       "pipeline_step.strategy: must be templates, checkpoint or redundant");
    int64_t w, t, n;
    double ms;
    if (pl_json_get_int(o, "pipeline_step", "workers", 1, 4096, &w, err, errlen) ||
        pl_json_get_int(o, "pipeline_step", "threads", 1, 1024, &t, err, errlen) ||
        pl_json_get_int(o, "pipeline_step", "steps", 1, 1000000, &n, err, errlen) ||
        get_positive(o, "pipeline_step", "ms", &ms, err, errlen))
        return -1;
    /* the bound keeps the step inside int64 nanoseconds with room to spare */
    if (ms > 1e7) return pl_errf(err, errlen, "pipeline_step.ms: above 1e7 ms (got %g)", ms);
    *ps = (pl_pipeline_step){.workers = (int)w, .threads = (int)t, .steps = (int)n,
                             .ns = llround(ms * 1e6)};
    snprintf(ps->strategy, sizeof ps->strategy, "%s", st->valuestring);
    return 0;
}

static int parse_root(const cJSON *root, pl_profile *p, char *err, size_t errlen)
{
    if (!cJSON_IsObject(root)) return pl_errf(err, errlen, "profile: must be a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsString(model)) return pl_errf(err, errlen, "model: must be a string");
    snprintf(p->model, sizeof p->model, "%s", model ? model->valuestring : "");

    int64_t mb, m;
    if (pl_json_get_int(root, NULL, "microbatch_size", 1, 1000000, &mb, err, errlen) ||
        pl_json_get_int(root, NULL, "gpus_per_node", 1, 1024, &m, err, errlen) ||
        pl_json_get_int(root, NULL, "gpu_memory_bytes", 1, 9000000000000000LL,
                        &p->gpu_memory_bytes, err, errlen) ||
        get_positive(root, NULL, "intra_node_GBps", &p->intra_node_GBps, err, errlen) ||
        get_positive(root, NULL, "inter_node_GBps", &p->inter_node_GBps, err, errlen) ||
        parse_pipeline_step(root, &p->pipeline_step, err, errlen))
        return -1;
    p->microbatch_size = (int)mb;
    p->gpus_per_node = (int)m;

    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    if (!layers) return pl_errf(err, errlen, "layers: missing");
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) == 0)
        return pl_errf(err, errlen, "layers: must be a non-empty array");
    p->nlayers = cJSON_GetArraySize(layers);
    if (p->nlayers > 4096) return pl_errf(err, errlen, "layers: more than 4096 layers");

    const cJSON *fwd0 = cJSON_GetObjectItemCaseSensitive(layers->child, "forward_ms");
    if (!cJSON_IsObject(fwd0))
        return pl_errf(err, errlen, "layers[0].forward_ms: %s",
                       fwd0 ? "must be an object keyed by GPU count" : "missing");
    if (parse_keys(p, fwd0, err, errlen)) return -1;

    p->layers = calloc((size_t)p->nlayers, sizeof *p->layers);
    if (!p->layers) return pl_errf(err, errlen, "profile: out of memory");
    int i = 0;
    const cJSON *layer;
    cJSON_ArrayForEach(layer, layers)
    {
        if (parse_layer(p, i++, layer, err, errlen)) return -1;
    }
    return 0;
}

int pl_profile_parse(const char *json, pl_profile *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return pl_errf(err, errlen, "profile: invalid JSON near \"%.20s\"", at ? at : "");
    }
    int rc = parse_root(root, out, err, errlen);
    cJSON_Delete(root);
    if (rc) pl_profile_free(out);
    return rc;
}

int pl_profile_load(const char *path, pl_profile *out, char *err, size_t errlen)
{
    char *text = pl_read_file(path, err, errlen);
    if (!text) return -1;
    int rc = pl_profile_parse(text, out, err, errlen);
    free(text);
    return rc;
}

void pl_profile_free(pl_profile *p)
{
    free(p->layers);
    p->layers = NULL;
    p->nlayers = 0;
}
