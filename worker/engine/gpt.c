/* The GPT-2 model as layers: configuration, tensor shapes and names, deterministic
 * initialization, llm.c model files (gpt.h). */
#include "gpt.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define LLMC_MAGIC 20240326
#define LLMC_VERSION_FP32_PADDED 3

int pl_gpt_config_init(pl_gpt_config *c, int L, int C, int NH, int V, int maxT, char *err,
                       size_t errlen)
{
    if (L < 1 || C < 1 || NH < 1 || V < 1 || maxT < 1)
        return pl_errf(err, errlen, "model: layers, channels, heads, vocabulary and max "
                                    "sequence length must be positive");
    /* bounds that keep every size computation far from int overflow */
    if (L > 1024 || C > 65536 || NH > C || V > (1 << 20) || maxT > (1 << 20))
        return pl_errf(err, errlen,
                       "model: L=%d C=%d NH=%d V=%d maxT=%d exceeds the limits (L ≤ 1024, "
                       "C ≤ 65536, NH ≤ C, V ≤ 2^20, maxT ≤ 2^20)",
                       L, C, NH, V, maxT);
    if (C % NH) return pl_errf(err, errlen, "model: channels (%d) must be divisible by heads (%d)", C, NH);
    *c = (pl_gpt_config){.L = L, .C = C, .NH = NH, .V = V, .Vp = (V + 127) / 128 * 128, .maxT = maxT};
    return 0;
}

pl_layer_kind pl_gpt_layer_kind(const pl_gpt_config *c, int layer)
{
    return layer == 0 ? PL_LAYER_EMBEDDING : layer <= c->L ? PL_LAYER_BLOCK : PL_LAYER_HEAD;
}

static pl_tensor_spec matrix(const char *name, int rows, int cols, float std)
{
    return (pl_tensor_spec){name, 2, {rows, cols}, (size_t)rows * (size_t)cols, 1, std, 0};
}

static pl_tensor_spec vector(const char *name, int n, float value)
{
    return (pl_tensor_spec){name, 1, {n, 1}, (size_t)n, 0, 0, value};
}

int pl_gpt_layer_tensors(const pl_gpt_config *c, int layer, pl_tensor_spec *s)
{
    const int C = c->C;
    /* GPT-2: residual projections scaled by 1/sqrt(2L) */
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)c->L);
    switch (pl_gpt_layer_kind(c, layer)) {
    case PL_LAYER_EMBEDDING:
        s[0] = matrix("wte", c->Vp, C, std);
        s[1] = matrix("wpe", c->maxT, C, std);
        return 2;
    case PL_LAYER_BLOCK:
        s[0] = vector("ln1w", C, 1);
        s[1] = vector("ln1b", C, 0);
        s[2] = matrix("qkvw", 3 * C, C, std);
        s[3] = vector("qkvb", 3 * C, 0);
        s[4] = matrix("attprojw", C, C, proj_std);
        s[5] = vector("attprojb", C, 0);
        s[6] = vector("ln2w", C, 1);
        s[7] = vector("ln2b", C, 0);
        s[8] = matrix("fcw", 4 * C, C, std);
        s[9] = vector("fcb", 4 * C, 0);
        s[10] = matrix("fcprojw", C, 4 * C, proj_std);
        s[11] = vector("fcprojb", C, 0);
        return 12;
    case PL_LAYER_HEAD:
        s[0] = vector("lnfw", C, 1);
        s[1] = vector("lnfb", C, 0);
        return 2;
    }
    return 0;
}

size_t pl_gpt_layer_params(const pl_gpt_config *c, int layer)
{
    pl_tensor_spec s[PL_MAX_LAYER_TENSORS];
    size_t n = 0;
    for (int i = 0, k = pl_gpt_layer_tensors(c, layer, s); i < k; i++) n += s[i].numel;
    return n;
}

size_t pl_gpt_total_params(const pl_gpt_config *c)
{
    size_t n = 0;
    for (int l = 0; l < pl_gpt_nlayers(c); l++) n += pl_gpt_layer_params(c, l);
    return n;
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1) from a 64-bit hash. */
static double unit(uint64_t h)
{
    return ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

void pl_gpt_init_tensor(const pl_gpt_config *c, uint64_t seed, int layer, int tensor_index,
                        float *out)
{
    pl_tensor_spec s[PL_MAX_LAYER_TENSORS];
    pl_gpt_layer_tensors(c, layer, s);
    const pl_tensor_spec *t = &s[tensor_index];
    if (t->init_std == 0) {
        for (size_t e = 0; e < t->numel; e++) out[e] = t->init_value;
        return;
    }
    /* counter-based: element e depends only on (seed, layer, tensor, e) */
    uint64_t key = mix64(mix64(seed ^ 0x5052494e474c4941ull) + (uint64_t)layer * 1000003u +
                         (uint64_t)tensor_index);
    size_t valid = t->numel;
    if (layer == 0 && tensor_index == 0) valid = (size_t)c->V * (size_t)c->C; /* padded rows */
    for (size_t e = 0; e < t->numel; e++) {
        if (e >= valid) {
            out[e] = 0;
            continue;
        }
        double u1 = unit(mix64(key + 2 * e)), u2 = unit(mix64(key + 2 * e + 1));
        out[e] = (float)(t->init_std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
}

/* ---- llm.c files ------------------------------------------------------------ */

/* Offset (in floats) of (layer, tensor index) in llm.c's tensor-major order. */
static size_t llmc_offset(const pl_gpt_config *c, int layer, int ti)
{
    const size_t C = (size_t)c->C, L = (size_t)c->L;
    size_t block_sizes[12] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    size_t off = (size_t)c->Vp * C + (size_t)c->maxT * C; /* wte, wpe */
    switch (pl_gpt_layer_kind(c, layer)) {
    case PL_LAYER_EMBEDDING:
        return ti == 0 ? 0 : (size_t)c->Vp * C;
    case PL_LAYER_BLOCK:
        for (int j = 0; j < ti; j++) off += L * block_sizes[j];
        return off + (size_t)(layer - 1) * block_sizes[ti];
    case PL_LAYER_HEAD:
        for (int j = 0; j < 12; j++) off += L * block_sizes[j];
        return off + (size_t)ti * C;
    }
    return 0;
}

const float *pl_llmc_tensor(const pl_llmc_model *m, int layer, int tensor_index)
{
    return m->params + llmc_offset(&m->cfg, layer, tensor_index);
}

int pl_llmc_read(const char *path, pl_llmc_model *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return pl_errf(err, errlen, "%s: %s", path, strerror(errno));
    int32_t h[256];
    int rc = -1;
    if (fread(h, sizeof h, 1, f) != 1) {
        pl_errf(err, errlen, "%s: shorter than the 1024-byte llm.c header", path);
    } else if (h[0] != LLMC_MAGIC) {
        pl_errf(err, errlen, "%s: not an llm.c model file (magic %d, expected %d)", path, h[0],
                LLMC_MAGIC);
    } else if (h[1] != LLMC_VERSION_FP32_PADDED) {
        pl_errf(err, errlen, "%s: llm.c model version %d; only version 3 (fp32) is supported",
                path, h[1]);
    } else if (pl_gpt_config_init(&out->cfg, h[4], h[6], h[5], h[3], h[2], err, errlen) == 0) {
        if (out->cfg.Vp != h[7]) {
            pl_errf(err, errlen, "%s: padded vocabulary %d, expected %d", path, h[7], out->cfg.Vp);
        } else {
            size_t n = pl_gpt_total_params(&out->cfg);
            long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
            size_t want = sizeof h + n * sizeof(float);
            /* check the size before allocating what the header claims */
            if (size < 0 || (size_t)size != want || fseek(f, (long)sizeof h, SEEK_SET)) {
                pl_errf(err, errlen, "%s: %s: %ld bytes, but its header describes %zu "
                        "parameters (%zu bytes)", path,
                        size >= 0 && (size_t)size > want ? "trailing bytes" : "truncated", size, n,
                        want);
                goto out;
            }
            out->params = malloc(n * sizeof(float));
            if (!out->params)
                pl_errf(err, errlen, "%s: out of memory for %zu parameters", path, n);
            else if (fread(out->params, sizeof(float), n, f) != n)
                pl_errf(err, errlen, "%s: truncated (expected %zu parameters)", path, n);
            else if (fgetc(f) != EOF)
                pl_errf(err, errlen, "%s: trailing bytes after %zu parameters", path, n);
            else
                rc = 0;
        }
    }
out:
    fclose(f);
    if (rc) pl_llmc_free(out);
    return rc;
}

void pl_llmc_free(pl_llmc_model *m)
{
    free(m->params);
    m->params = NULL;
}

int pl_llmc_write(const char *path, const pl_gpt_config *c, pl_tensor_getter get, void *ctx,
                  char *err, size_t errlen)
{
    int32_t h[256] = {LLMC_MAGIC, LLMC_VERSION_FP32_PADDED, c->maxT, c->V, c->L, c->NH, c->C, c->Vp};
    pl_tensor_spec s[PL_MAX_LAYER_TENSORS];
    int nb = pl_gpt_layer_tensors(c, 1, s);
    pl_piece *p = pl_calloc((size_t)(1 + 2 + nb * c->L + 2), sizeof *p);
    if (!p) return pl_errf(err, errlen, "%s: out of memory", path);
    int n = 0;
    p[n++] = (pl_piece){h, sizeof h};
    /* tensor-major: embedding tensors, then each block tensor over all layers, then the head */
    for (int ti = 0, k = pl_gpt_layer_tensors(c, 0, s); ti < k; ti++)
        p[n++] = (pl_piece){get(ctx, 0, ti), s[ti].numel * sizeof(float)};
    pl_gpt_layer_tensors(c, 1, s);
    for (int ti = 0; ti < nb; ti++)
        for (int l = 1; l <= c->L; l++) p[n++] = (pl_piece){get(ctx, l, ti), s[ti].numel * sizeof(float)};
    for (int ti = 0, k = pl_gpt_layer_tensors(c, c->L + 1, s); ti < k; ti++)
        p[n++] = (pl_piece){get(ctx, c->L + 1, ti), s[ti].numel * sizeof(float)};
    int rc = pl_write_atomic(path, p, n, err, errlen);
    free(p);
    return rc;
}
