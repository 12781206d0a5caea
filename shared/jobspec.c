/* TrainingJob manifests (../shared/TRAININGJOB.md): YAML or JSON text → pl_job,
 * every default filled, every field validated. The YAML tree (with types and
 * line numbers) comes from yaml_tree.c; this file only knows the schema. */
#include "jobspec.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "util.h"
#include "yaml_tree.h"

#define FIELD_MAX 256 /* longest field path we print */

typedef struct {
    char *err;
    size_t errlen;
    const char *base_dir;
} pctx;

/* ------------------------------------------------------------------------ */
/* Presets                                                                   */

typedef struct {
    const char *name;
    int layers, channels, heads, vocab_size, max_seq_len;
} preset_row;

static const preset_row PRESETS[] = {
    {"gpt2-tiny", 4, 128, 4, 256, 256},
    {"gpt2-d6", 6, 384, 6, 50257, 1024},
    {"gpt2-124m", 12, 768, 12, 50257, 1024},
    {"gpt2-350m", 24, 1024, 16, 50257, 1024},
    {"gpt2-774m", 36, 1280, 20, 50257, 1024},
    {"gpt2-1558m", 48, 1600, 25, 50257, 1024},
};
#define N_PRESETS (sizeof PRESETS / sizeof PRESETS[0])

int pl_model_preset(const char *name, pl_model_spec *m)
{
    if (!name || !m) return -1;
    for (size_t i = 0; i < N_PRESETS; i++) {
        const preset_row *p = &PRESETS[i];
        if (strcmp(name, p->name) != 0) continue;
        snprintf(m->preset, sizeof m->preset, "%s", p->name);
        m->layers = p->layers;
        m->channels = p->channels;
        m->heads = p->heads;
        m->vocab_size = p->vocab_size;
        m->max_seq_len = p->max_seq_len;
        return 0;
    }
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Generic field access                                                      */

static void join(char *out, const char *parent, const char *key)
{
    if (parent && *parent)
        snprintf(out, FIELD_MAX, "%s.%s", parent, key);
    else
        snprintf(out, FIELD_MAX, "%s", key);
}

/* The value of key, or NULL when absent or null (null means "use the default"). */
static const pl_ynode *field(const pl_ynode *map, const char *key)
{
    const pl_ynode *v = pl_yaml_get(map, key);
    return v && v->type != PL_Y_NULL ? v : NULL;
}

/* Short description of what a node holds, for "(got ...)". */
static void describe(const pl_ynode *v, char *out, size_t cap)
{
    if (v->type == PL_Y_SEQ || v->type == PL_Y_MAP || v->type == PL_Y_NULL)
        snprintf(out, cap, "%s", pl_yaml_type_name(v->type));
    else if (v->type == PL_Y_STR)
        snprintf(out, cap, "\"%.60s\"", v->str);
    else
        snprintf(out, cap, "%.60s", v->str);
}

static int type_error(pctx *c, const char *path, const char *want, const pl_ynode *v)
{
    char got[80];
    describe(v, got, sizeof got);
    return pl_errf(c->err, c->errlen, "%s: must be %s (got %s)", path, want, got);
}

static int required(pctx *c, const char *parent, const char *key)
{
    char path[FIELD_MAX];
    join(path, parent, key);
    return pl_errf(c->err, c->errlen, "%s: required", path);
}

/* Rejects keys of map that are not in known (NULL-terminated). */
static int check_fields(pctx *c, const pl_ynode *map, const char *path, const char *const *known)
{
    for (size_t i = 0; i < map->n; i++) {
        const char *const *k = known;
        while (*k && strcmp(*k, map->keys[i]) != 0) k++;
        if (!*k) {
            char p[FIELD_MAX];
            join(p, path, map->keys[i]);
            return pl_errf(c->err, c->errlen, "%s: unknown field", p);
        }
    }
    return 0;
}

/* A mapping field: *out is NULL when absent. */
static int get_map(pctx *c, const pl_ynode *map, const char *parent, const char *key, int req,
                   const pl_ynode **out)
{
    const pl_ynode *v = field(map, key);
    *out = NULL;
    if (!v) return req ? required(c, parent, key) : 0;
    char path[FIELD_MAX];
    join(path, parent, key);
    if (v->type != PL_Y_MAP) return type_error(c, path, "a mapping", v);
    *out = v;
    return 0;
}

/* An integer field in [lo, hi]; *out unchanged when absent. */
static int get_int(pctx *c, const pl_ynode *map, const char *parent, const char *key, int req,
                   long long lo, long long hi, int *out)
{
    const pl_ynode *v = field(map, key);
    if (!v) return req ? required(c, parent, key) : 0;
    char path[FIELD_MAX];
    join(path, parent, key);
    int neg;
    uint64_t mag;
    if (v->type != PL_Y_INT) return type_error(c, path, "an integer", v);
    long long x;
    if (pl_yaml_int(v, &neg, &mag) != 0 || mag > (uint64_t)LLONG_MAX)
        x = neg || v->str[0] == '-' ? LLONG_MIN : LLONG_MAX;
    else
        x = neg ? -(long long)mag : (long long)mag;
    if (x < lo) return pl_errf(c->err, c->errlen, "%s: must be at least %lld (got %.60s)", path, lo, v->str);
    if (x > hi) return pl_errf(c->err, c->errlen, "%s: must be at most %lld (got %.60s)", path, hi, v->str);
    *out = (int)x;
    return 0;
}

/* A non-negative 64-bit integer (seeds, seconds). */
static int get_u64(pctx *c, const pl_ynode *map, const char *parent, const char *key, uint64_t hi,
                   uint64_t *out)
{
    const pl_ynode *v = field(map, key);
    if (!v) return 0;
    char path[FIELD_MAX];
    join(path, parent, key);
    int neg;
    uint64_t mag;
    if (v->type != PL_Y_INT) return type_error(c, path, "an integer", v);
    if (pl_yaml_int(v, &neg, &mag) != 0 || mag > hi)
        return pl_errf(c->err, c->errlen, "%s: must be at most %llu (got %.60s)", path,
                       (unsigned long long)hi, v->str);
    if (neg) return pl_errf(c->err, c->errlen, "%s: must be a non-negative integer (got %.60s)", path, v->str);
    *out = mag;
    return 0;
}

/* A finite number (integer or float); *out unchanged when absent. */
static int get_num(pctx *c, const pl_ynode *map, const char *parent, const char *key, double *out,
                   char *path)
{
    join(path, parent, key);
    const pl_ynode *v = field(map, key);
    if (!v) return 0;
    double x;
    if (pl_yaml_number(v, &x) != 0) return type_error(c, path, "a number", v);
    if (!isfinite(x)) return pl_errf(c->err, c->errlen, "%s: must be a finite number (got %.60s)", path, v->str);
    *out = x;
    return 0;
}

/* A string field (at most cap-1 bytes); buf unchanged when absent. */
static int get_str(pctx *c, const pl_ynode *map, const char *parent, const char *key, int req, char *buf,
                   size_t cap)
{
    const pl_ynode *v = field(map, key);
    if (!v) return req ? required(c, parent, key) : 0;
    char path[FIELD_MAX];
    join(path, parent, key);
    if (v->type != PL_Y_STR) return type_error(c, path, "a string", v);
    if (strlen(v->str) != v->len)
        return pl_errf(c->err, c->errlen, "%s: must not contain NUL characters", path);
    if (v->len >= cap) return pl_errf(c->err, c->errlen, "%s: too long (at most %zu bytes)", path, cap - 1);
    memcpy(buf, v->str, v->len + 1);
    return 0;
}

/* One of names (NULL-terminated); *out is the index; unchanged when absent. */
static int get_enum(pctx *c, const pl_ynode *map, const char *parent, const char *key,
                    const char *const *names, int *out)
{
    const pl_ynode *v = field(map, key);
    if (!v) return 0;
    char path[FIELD_MAX];
    join(path, parent, key);
    for (int i = 0; names[i]; i++) {
        if (v->type == PL_Y_STR && strcmp(v->str, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    char list[200] = "";
    for (int i = 0; names[i]; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? (names[i + 1] ? ", " : " or ") : "", names[i]);
    }
    return type_error(c, path, list, v);
}

/* Resolves a relative path against the manifest's directory. */
static int resolve_path(pctx *c, const char *path, const char *in, char *out, size_t cap)
{
    const char *base = c->base_dir;
    int n;
    if (!in[0] || in[0] == '/' || !base || !base[0] || strcmp(base, ".") == 0) {
        n = snprintf(out, cap, "%s", in);
    } else {
        size_t bl = strlen(base);
        n = snprintf(out, cap, "%s%s%s", base, base[bl - 1] == '/' ? "" : "/", in);
    }
    if (n < 0 || (size_t)n >= cap)
        return pl_errf(c->err, c->errlen, "%s: path too long (at most %zu bytes)", path, cap - 1);
    return 0;
}

/* A path field, resolved; buf unchanged when absent. */
static int get_path(pctx *c, const pl_ynode *map, const char *parent, const char *key, int req, char *buf,
                    size_t cap)
{
    char raw[PL_PATH_MAX] = "";
    if (!field(map, key)) return req ? required(c, parent, key) : 0;
    if (get_str(c, map, parent, key, req, raw, sizeof raw)) return -1;
    char path[FIELD_MAX];
    join(path, parent, key);
    return resolve_path(c, path, raw, buf, cap);
}

/* ------------------------------------------------------------------------ */
/* Schema                                                                    */

static void set_defaults(pl_job *job)
{
    memset(job, 0, sizeof *job);
    pl_model_preset("gpt2-tiny", &job->model);
    job->model.init = PL_INIT_RANDOM;
    job->model.seed = 1337;
    job->data.order = PL_ORDER_SHUFFLED;
    job->data.seed = 42;
    job->optimizer = (pl_optimizer_spec){
        .lr = 3.0e-4,
        .schedule = PL_SCHEDULE_COSINE,
        .warmup_steps = 10,
        .min_lr_ratio = 0.1,
        .beta1 = 0.9,
        .beta2 = 0.95,
        .eps = 1.0e-8,
        .weight_decay = 0.1,
        .grad_clip = 1.0,
    };
    job->eval_every = 50;
    job->eval_batches = 8;
    job->checkpoint.every = 100;
    job->checkpoint.resume = PL_RESUME_AUTO;
    job->checkpoint.keep = 0;
    job->fault_tolerance = (pl_fault_tolerance_spec){
        .strategy = PL_STRATEGY_TEMPLATES,
        .redundant_forward = PL_FRC_LAZY,
        .tolerate = 1,
        .max_resets = 100,
        .hosts_added_check_every = 1,
        .heartbeat_seconds = 3,
        .wait_for_nodes_timeout_seconds = 600,
    };
    job->nodes.min = 1;
    job->nodes.max = 0;
    job->nodes.gpus_per_node = 1;
    snprintf(job->profile, sizeof job->profile, "auto");
}

/* A DNS-1123 label ([a-z0-9]([-a-z0-9]*[a-z0-9])?) of at most max characters; with dots,
 * a DNS-1123 subdomain (such labels joined by dots: a Kubernetes object name). */
static int dns_name(const char *s, size_t max, int dots)
{
    size_t n = strlen(s);
    if (n == 0 || n > max) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        int alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
        int edge = i == 0 || i == n - 1 || s[i - 1] == '.' || s[i + 1] == '.';
        if (!alnum && !((ch == '-' || (dots && ch == '.')) && !edge)) return 0;
    }
    return 1;
}

static int parse_metadata(pctx *c, const pl_ynode *root, pl_job *job)
{
    const pl_ynode *md;
    if (get_map(c, root, "", "metadata", 1, &md)) return -1;
    /* Other ObjectMeta fields (labels, annotations, uid, ...) are the API server's business. */
    if (get_str(c, md, "metadata", "name", 1, job->name, sizeof job->name)) return -1;
    if (!dns_name(job->name, 253, 1))
        return pl_errf(c->err, c->errlen,
                       "metadata.name: must be lowercase letters, digits, '-' and '.', starting and "
                       "ending with a letter or digit, at most 253 characters (got \"%.70s\")",
                       job->name);
    if (get_str(c, md, "metadata", "namespace", 0, job->namespace_, sizeof job->namespace_)) return -1;
    if (job->namespace_[0] && !dns_name(job->namespace_, 63, 0))
        return pl_errf(c->err, c->errlen,
                       "metadata.namespace: must be lowercase letters, digits and '-', starting and "
                       "ending with a letter or digit, at most 63 characters (got \"%.70s\")",
                       job->namespace_);
    return 0;
}

/* The presets' names for the error message: "a, b or c". */
static void preset_names(char *list, size_t size)
{
    list[0] = 0;
    for (size_t i = 0; i < N_PRESETS; i++) {
        size_t l = strlen(list);
        snprintf(list + l, size - l, "%s%s", i ? (i + 1 < N_PRESETS ? ", " : " or ") : "",
                 PRESETS[i].name);
    }
}

/* spec.model.preset fills in every size first, so that the fields after it override
 * only what they name. */
static int parse_preset(pctx *c, const pl_ynode *map, pl_model_spec *m)
{
    const pl_ynode *pv = field(map, "preset");
    if (pv && (pv->type != PL_Y_STR || pl_model_preset(pv->str, m) != 0)) {
        char list[200];
        preset_names(list, sizeof list);
        return type_error(c, "spec.model.preset", list, pv);
    }
    return 0;
}

static int parse_model_sizes(pctx *c, const pl_ynode *map, const char *P, pl_model_spec *m)
{
    if (get_int(c, map, P, "layers", 0, 1, 1024, &m->layers) ||
        get_int(c, map, P, "channels", 0, 1, 65536, &m->channels) ||
        get_int(c, map, P, "heads", 0, 1, 65536, &m->heads) ||
        get_int(c, map, P, "vocabSize", 0, 1, 65536, &m->vocab_size) ||
        get_int(c, map, P, "maxSeqLen", 0, 1, 1 << 20, &m->max_seq_len))
        return -1;
    /* each head takes an equal share of the channels */
    if (m->channels % m->heads != 0)
        return pl_errf(c->err, c->errlen, "spec.model.heads: must divide spec.model.channels (%d)",
                       m->channels);
    return 0;
}

/* spec.model.init: random, llmc:PATH or checkpoint:DIR; the path is resolved like the
 * job's other paths. Absent or empty keeps the default. */
static int parse_init(pctx *c, const pl_ynode *map, const char *P, pl_model_spec *m)
{
    char init[PL_PATH_MAX] = "";
    if (get_str(c, map, P, "init", 0, init, sizeof init)) return -1;
    if (!init[0]) return 0;
    const char *rest = NULL;
    if (strcmp(init, "random") == 0) {
        m->init = PL_INIT_RANDOM;
    } else if (strncmp(init, "llmc:", 5) == 0) {
        m->init = PL_INIT_LLMC;
        rest = init + 5;
    } else if (strncmp(init, "checkpoint:", 11) == 0) {
        m->init = PL_INIT_CHECKPOINT;
        rest = init + 11;
    } else {
        return pl_errf(c->err, c->errlen,
                       "spec.model.init: must be random, llmc:PATH or checkpoint:DIR (got \"%.60s\")",
                       init);
    }
    if (rest && !rest[0])
        return pl_errf(c->err, c->errlen, "spec.model.init: %s needs a path after ':'",
                       m->init == PL_INIT_LLMC ? "llmc" : "checkpoint");
    if (rest && resolve_path(c, "spec.model.init", rest, m->init_path, sizeof m->init_path)) return -1;
    return 0;
}

/* spec.model, optional: a preset, sizes over it, the initial weights and the seed. */
static int parse_model(pctx *c, const pl_ynode *spec, pl_model_spec *m)
{
    static const char *const known[] = {"preset", "layers", "channels", "heads", "vocabSize",
                                        "maxSeqLen", "init", "seed", NULL};
    const char *P = "spec.model";
    const pl_ynode *map;
    if (get_map(c, spec, "spec", "model", 0, &map)) return -1;
    if (!map) return 0;
    if (check_fields(c, map, P, known)) return -1;
    if (parse_preset(c, map, m) || parse_model_sizes(c, map, P, m) || parse_init(c, map, P, m))
        return -1;
    return get_u64(c, map, P, "seed", UINT64_MAX, &m->seed);
}

static int parse_data(pctx *c, const pl_ynode *spec, pl_data_spec *d)
{
    static const char *const known[] = {"train", "val", "order", "seed", NULL};
    static const char *const orders[] = {"shuffled", "sequential", NULL};
    const char *P = "spec.data";
    const pl_ynode *map;
    if (get_map(c, spec, "spec", "data", 1, &map)) return -1;
    if (check_fields(c, map, P, known)) return -1;
    if (get_path(c, map, P, "train", 1, d->train, sizeof d->train)) return -1;
    if (!d->train[0]) return pl_errf(c->err, c->errlen, "spec.data.train: must not be empty");
    int order = (int)d->order;
    if (get_path(c, map, P, "val", 0, d->val, sizeof d->val) ||
        get_enum(c, map, P, "order", orders, &order) ||
        get_u64(c, map, P, "seed", UINT64_MAX, &d->seed))
        return -1;
    d->order = (pl_data_order)order;
    return 0;
}

static int parse_batch(pctx *c, const pl_ynode *spec, pl_batch_spec *b)
{
    static const char *const known[] = {"global", "micro", "seqLen", NULL};
    const char *P = "spec.batch";
    const pl_ynode *map;
    if (get_map(c, spec, "spec", "batch", 1, &map)) return -1;
    if (check_fields(c, map, P, known)) return -1;
    return get_int(c, map, P, "global", 1, 1, INT_MAX, &b->global) ||
                   get_int(c, map, P, "micro", 1, 1, INT_MAX, &b->micro) ||
                   get_int(c, map, P, "seqLen", 1, 1, INT_MAX, &b->seq_len)
               ? -1
               : 0;
}

static int parse_optimizer(pctx *c, const pl_ynode *spec, pl_optimizer_spec *o)
{
    static const char *const known[] = {"lr", "schedule", "warmupSteps", "minLrRatio", "beta1",
                                        "beta2", "eps", "weightDecay", "gradClip", NULL};
    static const char *const schedules[] = {"cosine", "constant", NULL};
    const char *P = "spec.optimizer";
    const pl_ynode *map;
    char path[FIELD_MAX];
    if (get_map(c, spec, "spec", "optimizer", 0, &map)) return -1;
    if (!map) return 0;
    if (check_fields(c, map, P, known)) return -1;

    if (get_num(c, map, P, "lr", &o->lr, path)) return -1;
    if (!(o->lr > 0)) return pl_errf(c->err, c->errlen, "%s: must be greater than 0 (got %g)", path, o->lr);
    int sched = (int)o->schedule;
    if (get_enum(c, map, P, "schedule", schedules, &sched)) return -1;
    o->schedule = (pl_lr_schedule)sched;
    if (get_int(c, map, P, "warmupSteps", 0, 0, INT_MAX, &o->warmup_steps)) return -1;
    if (get_num(c, map, P, "minLrRatio", &o->min_lr_ratio, path)) return -1;
    if (o->min_lr_ratio < 0 || o->min_lr_ratio > 1)
        return pl_errf(c->err, c->errlen, "%s: must be between 0 and 1 (got %g)", path, o->min_lr_ratio);
    if (get_num(c, map, P, "beta1", &o->beta1, path)) return -1;
    if (o->beta1 < 0 || o->beta1 >= 1)
        return pl_errf(c->err, c->errlen, "%s: must be at least 0 and less than 1 (got %g)", path, o->beta1);
    if (get_num(c, map, P, "beta2", &o->beta2, path)) return -1;
    if (o->beta2 < 0 || o->beta2 >= 1)
        return pl_errf(c->err, c->errlen, "%s: must be at least 0 and less than 1 (got %g)", path, o->beta2);
    if (get_num(c, map, P, "eps", &o->eps, path)) return -1;
    if (!(o->eps > 0)) return pl_errf(c->err, c->errlen, "%s: must be greater than 0 (got %g)", path, o->eps);
    if (get_num(c, map, P, "weightDecay", &o->weight_decay, path)) return -1;
    if (o->weight_decay < 0)
        return pl_errf(c->err, c->errlen, "%s: must be at least 0 (got %g)", path, o->weight_decay);
    if (get_num(c, map, P, "gradClip", &o->grad_clip, path)) return -1;
    if (o->grad_clip < 0)
        return pl_errf(c->err, c->errlen, "%s: must be at least 0 (got %g)", path, o->grad_clip);
    return 0;
}

static int parse_checkpoint(pctx *c, const pl_ynode *spec, pl_checkpoint_spec *k)
{
    static const char *const known[] = {"dir", "every", "resume", "keep", NULL};
    static const char *const resumes[] = {"auto", "never", NULL};
    const char *P = "spec.checkpoint";
    const pl_ynode *map;
    if (get_map(c, spec, "spec", "checkpoint", 0, &map)) return -1;
    if (!map) return 0;
    if (check_fields(c, map, P, known)) return -1;
    int resume = (int)k->resume;
    if (get_path(c, map, P, "dir", 0, k->dir, sizeof k->dir) ||
        get_int(c, map, P, "every", 0, 0, INT_MAX, &k->every) ||
        get_int(c, map, P, "keep", 0, 0, INT_MAX, &k->keep) ||
        get_enum(c, map, P, "resume", resumes, &resume))
        return -1;
    k->resume = (pl_resume)resume;
    return 0;
}

/* spec.faultTolerance.strategy's words, in pl_ft_strategy's order */
static const char *const STRATEGIES[] = {"templates", "checkpoint", "redundant", NULL};

/* spec.faultTolerance.belowMinimum's words, in pl_below_minimum's order */
static const char *const BELOW_MINIMUM[] = {"wait", "degrade", NULL};

/* The index of name in a NULL-ended list of words, or -1. */
static int word_index(const char *const *words, const char *name)
{
    for (int i = 0; name && words[i]; i++)
        if (!strcmp(name, words[i])) return i;
    return -1;
}

const char *pl_ft_strategy_name(pl_ft_strategy s) { return STRATEGIES[s]; }

int pl_ft_strategy_from_name(const char *name, pl_ft_strategy *out)
{
    int i = word_index(STRATEGIES, name);
    if (i < 0) return -1;
    *out = (pl_ft_strategy)i;
    return 0;
}

const char *pl_below_minimum_name(pl_below_minimum b) { return BELOW_MINIMUM[b]; }

int pl_below_minimum_from_name(const char *name, pl_below_minimum *out)
{
    int i = word_index(BELOW_MINIMUM, name);
    if (i < 0) return -1;
    *out = (pl_below_minimum)i;
    return 0;
}

static int parse_fault_tolerance(pctx *c, const pl_ynode *spec, pl_fault_tolerance_spec *f)
{
    static const char *const known[] = {"strategy", "redundantForward", "tolerate", "maxResets",
                                        "hostsAddedCheckEvery", "heartbeatSeconds", "stepTimeoutSeconds",
                                        "waitForNodesTimeoutSeconds", "belowMinimum", NULL};
    static const char *const frc_modes[] = {"eager", "lazy", NULL};
    const char *P = "spec.faultTolerance";
    const pl_ynode *map;
    char path[FIELD_MAX];
    if (get_map(c, spec, "spec", "faultTolerance", 0, &map)) return -1;
    if (!map) return 0;
    if (check_fields(c, map, P, known)) return -1;
    int strategy = (int)f->strategy, frc = (int)f->redundant_forward;
    int bm = (int)f->below_minimum;
    if (get_enum(c, map, P, "strategy", STRATEGIES, &strategy) ||
        get_enum(c, map, P, "belowMinimum", BELOW_MINIMUM, &bm) ||
        get_enum(c, map, P, "redundantForward", frc_modes, &frc) ||
        get_int(c, map, P, "tolerate", 0, 0, INT_MAX, &f->tolerate) ||
        get_int(c, map, P, "maxResets", 0, 0, INT_MAX, &f->max_resets) ||
        get_int(c, map, P, "hostsAddedCheckEvery", 0, 1, INT_MAX, &f->hosts_added_check_every))
        return -1;
    f->strategy = (pl_ft_strategy)strategy;
    f->redundant_forward = (pl_frc_mode)frc;
    f->below_minimum = (pl_below_minimum)bm;
    if (field(map, "redundantForward") && f->strategy != PL_STRATEGY_REDUNDANT)
        return pl_errf(c->err, c->errlen, "%s.redundantForward: only with strategy redundant", P);
    if (get_num(c, map, P, "heartbeatSeconds", &f->heartbeat_seconds, path)) return -1;
    if (!(f->heartbeat_seconds > 0))
        return pl_errf(c->err, c->errlen, "%s: must be greater than 0 (got %g)", path, f->heartbeat_seconds);
    if (get_num(c, map, P, "stepTimeoutSeconds", &f->step_timeout_seconds, path)) return -1;
    if (!(f->step_timeout_seconds >= 0) || f->step_timeout_seconds > 1e9)
        return pl_errf(c->err, c->errlen, "%s: must be in 0..1e9 (0: automatic; got %g)", path,
                       f->step_timeout_seconds);
    if (get_num(c, map, P, "waitForNodesTimeoutSeconds", &f->wait_for_nodes_timeout_seconds, path)) return -1;
    if (f->wait_for_nodes_timeout_seconds < 0)
        return pl_errf(c->err, c->errlen, "%s: must be at least 0 (got %g)", path,
                       f->wait_for_nodes_timeout_seconds);
    return 0;
}

static int parse_nodes(pctx *c, const pl_ynode *spec, pl_nodes_spec *n)
{
    static const char *const known[] = {"min", "max", "gpusPerNode", NULL};
    const char *P = "spec.nodes";
    const pl_ynode *map;
    if (get_map(c, spec, "spec", "nodes", 0, &map)) return -1;
    if (!map) return 0;
    if (check_fields(c, map, P, known)) return -1;
    if (get_int(c, map, P, "min", 0, 1, INT_MAX, &n->min) ||
        get_int(c, map, P, "max", 0, 0, INT_MAX, &n->max) ||
        get_int(c, map, P, "gpusPerNode", 0, 1, INT_MAX, &n->gpus_per_node))
        return -1;
    if (n->max != 0 && n->max < n->min)
        return pl_errf(c->err, c->errlen, "spec.nodes.max: must be 0 (unset) or at least spec.nodes.min (%d)",
                       n->min);
    return 0;
}

static int parse_cost(pctx *c, const pl_ynode *spec, pl_cost_spec *k)
{
    static const char *const known[] = {"spot", "onDemand", NULL};
    const char *P = "spec.cost";
    const pl_ynode *map;
    char path[FIELD_MAX];
    if (get_map(c, spec, "spec", "cost", 0, &map)) return -1;
    if (!map) return 0;
    if (check_fields(c, map, P, known)) return -1;
    if (get_num(c, map, P, "spot", &k->spot, path)) return -1;
    if (k->spot < 0) return pl_errf(c->err, c->errlen, "%s: must be at least 0 (got %g)", path, k->spot);
    if (get_num(c, map, P, "onDemand", &k->on_demand, path)) return -1;
    if (k->on_demand < 0)
        return pl_errf(c->err, c->errlen, "%s: must be at least 0 (got %g)", path, k->on_demand);
    return 0;
}

/* Checks that a present field has the given type. */
static int want_type(pctx *c, const pl_ynode *map, const char *parent, const char *key, pl_ytype t)
{
    const pl_ynode *v = field(map, key);
    if (!v || v->type == t) return 0;
    char path[FIELD_MAX];
    join(path, parent, key);
    return type_error(c, path, t == PL_Y_INT ? "an integer" : pl_yaml_type_name(t), v);
}

/* spec.worker or spec.runPolicy as compact JSON; *out NULL when absent. */
static int subtree_json(pctx *c, const pl_ynode *map, const char *path, char **out)
{
    cJSON *j = pl_yaml_to_cjson(map, path, c->err, c->errlen);
    if (!j) return -1;
    *out = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!*out) return pl_errf(c->err, c->errlen, "%s: out of memory", path);
    return 0;
}

/* A mapping of strings (labels, annotations, nodeSelector; null values pass as absent),
 * each at most maxlen bytes (0: any length). */
static int string_map(pctx *c, const pl_ynode *map, const char *parent, const char *key, size_t maxlen)
{
    const pl_ynode *m;
    if (get_map(c, map, parent, key, 0, &m)) return -1;
    if (!m) return 0;
    char path[FIELD_MAX];
    join(path, parent, key);
    for (size_t i = 0; i < m->n; i++) {
        const pl_ynode *v = field(m, m->keys[i]);
        if (v && v->type != PL_Y_STR)
            return pl_errf(c->err, c->errlen, "%s.%.100s: must be a string", path, m->keys[i]);
        if (v && maxlen && v->len > maxlen)
            return pl_errf(c->err, c->errlen, "%s.%.100s: must be at most %zu characters", path,
                           m->keys[i], maxlen);
    }
    return 0;
}

/* A sequence of mappings, each with the string fields `req` (NULL-terminated). */
static int map_list(pctx *c, const pl_ynode *map, const char *parent, const char *key,
                    const char *const *req)
{
    const pl_ynode *v = field(map, key);
    char path[FIELD_MAX];
    join(path, parent, key);
    if (!v) return 0;
    if (v->type != PL_Y_SEQ) return type_error(c, path, pl_yaml_type_name(PL_Y_SEQ), v);
    for (size_t i = 0; i < v->n; i++) {
        char item[FIELD_MAX], buf[PL_PATH_MAX];
        snprintf(item, sizeof item, "%.200s[%zu]", path, i);
        if (v->kids[i]->type != PL_Y_MAP)
            return type_error(c, item, pl_yaml_type_name(PL_Y_MAP), v->kids[i]);
        for (const char *const *r = req; *r; r++)
            if (get_str(c, v->kids[i], item, *r, 1, buf, sizeof buf)) return -1;
    }
    return 0;
}

static int parse_worker(pctx *c, const pl_ynode *spec, pl_job *job)
{
    static const char *const known[] = {"image", "imagePullPolicy", "resources", "nodeSelector",
                                        "tolerations", "affinity", "priorityClassName", "env",
                                        "volumes", "volumeMounts",
                                        "terminationGracePeriodSeconds", "labels", "annotations",
                                        "imagePullSecrets", "serviceAccountName",
                                        "automountServiceAccountToken", "schedulerName",
                                        "runtimeClassName", "podSecurityContext", "securityContext",
                                        NULL};
    static const char *const named[] = {"name", NULL}, *const mount[] = {"name", "mountPath", NULL};
    static const char *const none[] = {NULL};
    const char *P = "spec.worker";
    const pl_ynode *map;
    if (get_map(c, spec, "spec", "worker", 0, &map)) return -1;
    if (!map) return 0;
    if (check_fields(c, map, P, known)) return -1;
    uint64_t grace = 0;
    if (want_type(c, map, P, "image", PL_Y_STR) || want_type(c, map, P, "imagePullPolicy", PL_Y_STR) ||
        want_type(c, map, P, "resources", PL_Y_MAP) || string_map(c, map, P, "nodeSelector", 0) ||
        map_list(c, map, P, "tolerations", none) || want_type(c, map, P, "affinity", PL_Y_MAP) ||
        want_type(c, map, P, "priorityClassName", PL_Y_STR) || map_list(c, map, P, "env", named) ||
        map_list(c, map, P, "volumes", named) || map_list(c, map, P, "volumeMounts", mount) ||
        get_u64(c, map, P, "terminationGracePeriodSeconds", INT64_MAX, &grace) ||
        string_map(c, map, P, "labels", 63) || string_map(c, map, P, "annotations", 0) ||
        map_list(c, map, P, "imagePullSecrets", named) ||
        want_type(c, map, P, "serviceAccountName", PL_Y_STR) ||
        want_type(c, map, P, "automountServiceAccountToken", PL_Y_BOOL) ||
        want_type(c, map, P, "schedulerName", PL_Y_STR) || want_type(c, map, P, "runtimeClassName", PL_Y_STR) ||
        want_type(c, map, P, "podSecurityContext", PL_Y_MAP) ||
        want_type(c, map, P, "securityContext", PL_Y_MAP))
        return -1;
    return subtree_json(c, map, P, &job->worker_json);
}

static int parse_run_policy(pctx *c, const pl_ynode *spec, pl_job *job)
{
    static const char *const known[] = {"suspend", "activeDeadlineSeconds", "ttlSecondsAfterFinished",
                                        "cleanPodPolicy", "backoffLimit", NULL};
    static const char *const policies[] = {"All", "Running", "None", NULL};
    const char *P = "spec.runPolicy";
    const pl_ynode *map;
    if (get_map(c, spec, "spec", "runPolicy", 0, &map)) return -1;
    if (!map) return 0;
    if (check_fields(c, map, P, known)) return -1;
    uint64_t secs = 0;
    int policy = 0, limit = 0;
    if (want_type(c, map, P, "suspend", PL_Y_BOOL) ||
        get_u64(c, map, P, "activeDeadlineSeconds", INT64_MAX, &secs) ||
        get_u64(c, map, P, "ttlSecondsAfterFinished", INT64_MAX, &secs) ||
        get_enum(c, map, P, "cleanPodPolicy", policies, &policy) ||
        get_int(c, map, P, "backoffLimit", 0, 0, INT_MAX, &limit))
        return -1;
    return subtree_json(c, map, P, &job->run_policy_json);
}

static int parse_spec(pctx *c, const pl_ynode *root, pl_job *job)
{
    static const char *const known[] = {"model", "data", "batch", "optimizer", "steps", "evalEvery",
                                        "evalBatches", "checkpoint", "faultTolerance", "nodes",
                                        "profile", "worker", "runPolicy", "cost", NULL};
    const pl_ynode *spec;
    if (get_map(c, root, "", "spec", 1, &spec)) return -1;
    if (check_fields(c, spec, "spec", known)) return -1;
    if (parse_model(c, spec, &job->model) || parse_data(c, spec, &job->data) ||
        parse_batch(c, spec, &job->batch) || parse_optimizer(c, spec, &job->optimizer) ||
        get_int(c, spec, "spec", "steps", 1, 1, INT_MAX, &job->steps) ||
        get_int(c, spec, "spec", "evalEvery", 0, 0, INT_MAX, &job->eval_every) ||
        get_int(c, spec, "spec", "evalBatches", 0, 1, INT_MAX, &job->eval_batches) ||
        parse_checkpoint(c, spec, &job->checkpoint) ||
        parse_fault_tolerance(c, spec, &job->fault_tolerance) || parse_nodes(c, spec, &job->nodes) ||
        parse_cost(c, spec, &job->cost))
        return -1;

    char profile[PL_PATH_MAX] = "";
    if (get_str(c, spec, "spec", "profile", 0, profile, sizeof profile)) return -1;
    if (!strcmp(profile, "synthetic")) snprintf(job->profile, sizeof job->profile, "synthetic");
    if (profile[0] && strcmp(profile, "auto") != 0 && strcmp(profile, "synthetic") != 0 &&
        resolve_path(c, "spec.profile", profile, job->profile, sizeof job->profile))
        return -1;
    if (field(spec, "profile") && !profile[0])
        return pl_errf(c->err, c->errlen, "spec.profile: must be auto, synthetic or a path to a profile JSON");

    if (parse_worker(c, spec, job) || parse_run_policy(c, spec, job)) return -1;

    /* Relations between fields. */
    const pl_batch_spec *b = &job->batch;
    if (b->seq_len > job->model.max_seq_len)
        return pl_errf(c->err, c->errlen, "spec.batch.seqLen: must be at most spec.model.maxSeqLen (%d)",
                       job->model.max_seq_len);
    if (b->global % b->micro != 0)
        return pl_errf(c->err, c->errlen, "spec.batch.micro: must divide spec.batch.global (%d)", b->global);
    if (job->fault_tolerance.strategy == PL_STRATEGY_CHECKPOINT && !job->checkpoint.dir[0])
        return pl_errf(c->err, c->errlen,
                       "spec.checkpoint.dir: required when spec.faultTolerance.strategy is checkpoint");
    return 0;
}

static int parse_root(pctx *c, const pl_ynode *root, pl_job *job)
{
    static const char *const known[] = {"apiVersion", "kind", "metadata", "spec", "status", NULL};
    if (root->type != PL_Y_MAP) {
        char got[80];
        describe(root, got, sizeof got);
        return pl_errf(c->err, c->errlen, "manifest: must be a mapping with apiVersion, kind, metadata "
                                          "and spec (got %s)", got);
    }
    if (check_fields(c, root, "", known)) return -1;
    const pl_ynode *v = field(root, "apiVersion");
    if (!v) return pl_errf(c->err, c->errlen, "apiVersion: required (pliant.dev/v1alpha1)");
    if (v->type != PL_Y_STR || strcmp(v->str, "pliant.dev/v1alpha1") != 0)
        return type_error(c, "apiVersion", "pliant.dev/v1alpha1", v);
    v = field(root, "kind");
    if (!v) return pl_errf(c->err, c->errlen, "kind: required (TrainingJob)");
    if (v->type != PL_Y_STR || strcmp(v->str, "TrainingJob") != 0) return type_error(c, "kind", "TrainingJob", v);
    if (parse_metadata(c, root, job)) return -1;
    return parse_spec(c, root, job);
}

/* ------------------------------------------------------------------------ */
/* API                                                                       */

int pl_job_parse(const char *text, const char *base_dir, pl_job *job, char *err, size_t errlen)
{
    if (err && errlen) err[0] = '\0';
    if (!job) return pl_errf(err, errlen, "pl_job_parse: no job");
    set_defaults(job);
    if (!text) return pl_errf(err, errlen, "manifest: no text");
    pl_ynode *root = pl_yaml_load(text, strlen(text), err, errlen);
    if (!root) return -1;
    pctx c = {.err = err, .errlen = errlen, .base_dir = base_dir};
    int rc = parse_root(&c, root, job);
    pl_yaml_free(root);
    if (rc) pl_job_free(job);
    return rc;
}

int pl_job_load(const char *path, pl_job *job, char *err, size_t errlen)
{
    if (job) set_defaults(job);
    if (!path) return pl_errf(err, errlen, "pl_job_load: no path");
    if (strlen(path) >= PL_PATH_MAX) return pl_errf(err, errlen, "%.60s...: path too long", path);
    char *text = pl_read_file(path, err, errlen);
    if (!text) return -1;
    char dir[PL_PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int rc = pl_job_parse(text, dir, job, err, errlen);
    free(text);
    return rc;
}

void pl_job_free(pl_job *job)
{
    if (!job) return;
    free(job->worker_json);
    free(job->run_policy_json);
    job->worker_json = NULL;
    job->run_policy_json = NULL;
}
