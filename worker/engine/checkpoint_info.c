/* checkpoint.json read back: its text, and the step, model sizes and sequence length
 * it records, every number checked (checkpoint.h). Outside input: a checkpoint
 * directory may come from anywhere. */
#include "checkpoint.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include <cJSON.h>

#include "json_num.h"
#include "util.h"

char *pl_checkpoint_info(const char *step_dir, char *err, size_t errlen)
{
    char path[4200];
    if (pl_pathf(path, sizeof path, err, errlen, "%s/checkpoint.json", step_dir)) return NULL;
    return pl_read_file(path, err, errlen);
}

/* The members of "model" pl_gpt_config_init takes, in its order. */
static const char *const MODEL_KEYS[5] = {"layers", "channels", "heads", "vocab_size",
                                          "max_seq_len"};

static int parse_root(const cJSON *root, pl_checkpoint_meta *out, char *err, size_t errlen)
{
    if (!cJSON_IsObject(root)) return pl_errf(err, errlen, "not a JSON object");
    int64_t v[5];
    if (pl_json_get_int(root, NULL, "step", 0, INT_MAX, &out->step, err, errlen)) return -1;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(m)) return pl_errf(err, errlen, "model: missing or not an object");
    for (int i = 0; i < 5; i++)
        if (pl_json_get_int(m, "model", MODEL_KEYS[i], 1, INT_MAX, &v[i], err, errlen))
            return -1;
    if (pl_gpt_config_init(&out->cfg, (int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], err,
                           errlen))
        return -1;
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    const cJSON *T = cJSON_GetObjectItemCaseSensitive(data, "seq_len");
    out->seq_len = 0;
    if (T && pl_json_i32(T, "data.seq_len", 1, out->cfg.maxT, &out->seq_len, err, errlen))
        return -1;
    return 0;
}

int pl_checkpoint_meta_parse(const char *text, const char *what, pl_checkpoint_meta *out,
                             char *err, size_t errlen)
{
    cJSON *root = cJSON_Parse(text);
    char why[512] = "";
    int rc = root ? parse_root(root, out, why, sizeof why) : pl_errf(why, sizeof why, "not valid JSON");
    cJSON_Delete(root);
    return rc ? pl_errf(err, errlen, "%s: %s", what, why) : 0;
}

int pl_checkpoint_meta_load(const char *step_dir, pl_checkpoint_meta *out, char *err,
                            size_t errlen)
{
    char *text = pl_checkpoint_info(step_dir, err, errlen);
    if (!text) return -1;
    char what[4200];
    snprintf(what, sizeof what, "%s/checkpoint.json", step_dir);
    int rc = pl_checkpoint_meta_parse(text, what, out, err, errlen);
    free(text);
    return rc;
}

int pl_checkpoint_config(const char *step_dir, pl_gpt_config *cfg, int64_t *step, char *err,
                         size_t errlen)
{
    pl_checkpoint_meta meta;
    if (pl_checkpoint_meta_load(step_dir, &meta, err, errlen)) return -1;
    *cfg = meta.cfg;
    if (step) *step = meta.step;
    return 0;
}
