/* Layer-range forward/backward of GPT-2, following llm.c's train_gpt2.c. */
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Activations a block keeps for its backward. The _lp are the matmul inputs'
 * low-precision copies (kn_lowp_bytes; NULL where the backend keeps none), made
 * once in the forward and read again by the backward's dweight products, and
 * qkv's, which its matmul writes in place of qkv for the attention. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu, *res3;
    void *ln1_lp, *qkv_lp, *atty_lp, *ln2_lp, *fch_gelu_lp;
} block_acts;

struct pl_slot {
    void *mem;
    int32_t *tokens, *targets; /* kept for the embedding / head backward */
    float *input;              /* stage input [B,T,C] (the encoder output with the embedding) */
    block_acts *blocks;        /* one per block in the range */
    float *lnf, *lnf_mean, *lnf_rstd, *losses;
    void *lnf_lp;
    /* [B·T, Vp]: the logits after forward in the backend's format
     * (kn_lm_head_forward; the softmax probabilities with keep_probs), dlogits
     * during backward */
    float *probs;
    float *ce_stats; /* [B·T, 2]: per row (max, Σ e^(logit − max)), for backward */
};

/* Backward scratch, shared by all slots; dfch_lp, dqkv_lp, dres_lp, dln_lp and datty_lp
 * are dfch's, dqkv's, dres's, dln's and datty's low-precision copies (NULL where the backend
 * keeps none), after the rest. dres_lp must hold the copy of dres's current value wherever
 * a matmul reads it: the layernorm backwards that write dres write it too; dres from
 * elsewhere is converted. dln_lp is the blocks' dln (the matmul backwards write only it,
 * the layernorm backwards read it); the head's dln stays fp32. datty_lp is datty (the
 * attention projection's backward writes only it, the attention backward reads it). */
typedef struct {
    float *dres, *dln, *datty, *dqkv, *dfch;
    void *dfch_lp, *dqkv_lp, *dres_lp, *dln_lp, *datty_lp;
    float *discard; /* the blocks' unread fp32 outputs (layout_slot); NULL: none */
} scratch;

static size_t first_block(const pl_engine *e)
{
    return e->begin > 1 ? (size_t)e->begin : 1;
}

static int nblocks(const pl_engine *e)
{
    int lo = e->begin > 1 ? e->begin : 1, hi = e->end < e->cfg.L + 1 ? e->end : e->cfg.L + 1;
    return hi > lo ? hi - lo : 0;
}

/* Bump allocation inside one slot buffer; with base NULL it only counts. */
static float *carve(char *base, size_t *off, size_t nfloats)
{
    float *p = base ? (float *)(base + *off) : NULL;
    *off += (nfloats * sizeof(float) + 63) / 64 * 64;
    return p;
}

/* A low-precision copy of n values (kn_lowp_bytes), or NULL where the backend keeps none. */
static void *carve_lowp(const pl_engine *e, char *base, size_t *off, size_t n)
{
    size_t bytes = kn_lowp_bytes(e->k, n);
    if (!bytes) return NULL;
    return carve(base, off, (bytes + sizeof(float) - 1) / sizeof(float));
}

static scratch scratch_of(const pl_engine *e);

/* Where the backend keeps low-precision copies, the fp32 outputs it may leave unwritten
 * beside them (kernels.h: the layernorms', qkv's, the attention's and the GELU's) are
 * never read: they all point at the scratch's discard buffer (NULL while only measuring)
 * instead of a slot's room (at GPT-2 124M, B 16, T 1024 in CUDA's bf16 mode: 6.0 GB over
 * 12 layers). */
static float *carve_unread(char *base, size_t *off, size_t nfloats, int lowp, float *discard)
{
    return lowp ? discard : carve(base, off, nfloats);
}

static size_t layout_slot(const pl_engine *e, pl_slot *s, char *base)
{
    const size_t B = (size_t)e->B, T = (size_t)e->T, C = (size_t)e->cfg.C, BT = B * T;
    const int lowp = kn_lowp_bytes(e->k, 1) != 0;
    float *discard = lowp && base ? scratch_of(e).discard : NULL;
    size_t off = 0;
    s->tokens = (int32_t *)carve(base, &off, BT);
    s->targets = (int32_t *)carve(base, &off, BT);
    s->input = carve(base, &off, BT * C);
    for (int b = 0; b < nblocks(e); b++) {
        block_acts a;
        a.ln1 = carve_unread(base, &off, BT * C, lowp, discard);
        a.ln1_mean = carve(base, &off, BT);
        a.ln1_rstd = carve(base, &off, BT);
        a.qkv = carve_unread(base, &off, BT * 3 * C, lowp, discard);
        a.atty = carve_unread(base, &off, BT * C, lowp, discard);
        a.att = carve(base, &off,
                      kn_attention_state_floats(e->k, e->B, e->T, e->cfg.C, e->cfg.NH, lowp));
        a.res2 = carve(base, &off, BT * C);
        a.ln2 = carve_unread(base, &off, BT * C, lowp, discard);
        a.ln2_mean = carve(base, &off, BT);
        a.ln2_rstd = carve(base, &off, BT);
        /* the pre-activation in the backend's format: bf16 where it keeps copies */
        a.fch = lowp ? carve_lowp(e, base, &off, BT * 4 * C) : carve(base, &off, BT * 4 * C);
        a.fch_gelu = carve_unread(base, &off, BT * 4 * C, lowp, discard);
        a.res3 = carve(base, &off, BT * C);
        a.ln1_lp = carve_lowp(e, base, &off, BT * C);
        a.qkv_lp = carve_lowp(e, base, &off, BT * 3 * C);
        a.atty_lp = carve_lowp(e, base, &off, BT * C);
        a.ln2_lp = carve_lowp(e, base, &off, BT * C);
        a.fch_gelu_lp = carve_lowp(e, base, &off, BT * 4 * C);
        if (base) s->blocks[b] = a;
    }
    if (pl_engine_has_head(e)) {
        s->lnf = carve(base, &off, BT * C);
        s->lnf_mean = carve(base, &off, BT);
        s->lnf_rstd = carve(base, &off, BT);
        s->lnf_lp = carve_lowp(e, base, &off, BT * C);
        s->probs = carve(base, &off, BT * (size_t)e->cfg.Vp);
        s->losses = carve(base, &off, BT);
        s->ce_stats = carve(base, &off, 2 * BT);
    }
    return off;
}

/* The scratch's tensors in base (e->bw); with base NULL it only counts. Returns the bytes. */
static size_t layout_scratch(const pl_engine *e, scratch *s, char *base)
{
    const size_t BTC = (size_t)e->B * (size_t)e->T * (size_t)e->cfg.C;
    size_t off = 0;
    s->dres = carve(base, &off, BTC);
    s->dln = carve(base, &off, BTC);
    s->datty = carve(base, &off, BTC);
    s->dqkv = carve(base, &off, 3 * BTC);
    s->dfch = carve(base, &off, 4 * BTC);
    s->dfch_lp = carve_lowp(e, base, &off, 4 * BTC);
    s->dqkv_lp = carve_lowp(e, base, &off, 3 * BTC);
    s->dres_lp = carve_lowp(e, base, &off, BTC);
    s->dln_lp = carve_lowp(e, base, &off, BTC);
    s->datty_lp = carve_lowp(e, base, &off, BTC);
    s->discard = kn_lowp_bytes(e->k, 1) && nblocks(e) ? carve(base, &off, 4 * BTC) : NULL;
    return off;
}

static size_t scratch_bytes(const pl_engine *e)
{
    scratch s;
    return layout_scratch(e, &s, NULL);
}

static scratch scratch_of(const pl_engine *e)
{
    scratch s;
    layout_scratch(e, &s, (char *)e->bw);
    return s;
}

size_t pl_engine_align_layer(size_t floats)
{
    return (floats + PL_ENGINE_LAYER_ALIGN - 1) / PL_ENGINE_LAYER_ALIGN * PL_ENGINE_LAYER_ALIGN;
}

/* A layer's first tensor (and the head's copy of wte) starts a block of its own. */
static int add_tensor(pl_engine *e, int layer, int index, const pl_tensor_spec *spec)
{
    if (index == 0) e->nparams = pl_engine_align_layer(e->nparams);
    pl_engine_tensor *t = &e->tensors[e->ntensors++];
    snprintf(t->name, sizeof t->name, "layer.%d.%s", layer, spec->name);
    t->layer = layer;
    t->index = index;
    t->offset = e->nparams;
    t->spec = *spec;
    e->nparams += spec->numel;
    return 0;
}

int pl_engine_create(pl_engine *e, kn_ctx *k, const pl_gpt_config *cfg, int begin, int end,
                     int B, int T, int nslots, char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    if (begin < 0 || end > cfg->L + 2 || begin >= end)
        return pl_errf(err, errlen, "engine: layer range [%d, %d) is not within [0, %d)", begin,
                       end, cfg->L + 2);
    if (B < 1 || T < 1 || T > cfg->maxT || nslots < 1)
        return pl_errf(err, errlen, "engine: microbatch %d×%d (max sequence %d), %d slots", B, T,
                       cfg->maxT, nslots);
    e->cfg = *cfg;
    e->begin = begin;
    e->end = end;
    e->B = B;
    e->T = T;
    e->nslots = nslots;
    e->k = k;
    e->wte_tensor = -1;
    e->tensors = pl_calloc((size_t)(end - begin) * PL_MAX_LAYER_TENSORS + 1, sizeof *e->tensors);
    e->slots = pl_calloc((size_t)nslots, sizeof *e->slots);
    if (!e->tensors || !e->slots) goto oom;
    pl_tensor_spec s[PL_MAX_LAYER_TENSORS];
    if (pl_engine_has_head(e) && !pl_engine_has_embedding(e)) { /* the head's copy of wte */
        pl_gpt_layer_tensors(cfg, 0, s);
        e->wte_tensor = e->ntensors;
        add_tensor(e, 0, 0, &s[0]);
    }
    for (int l = begin; l < end; l++) {
        int n = pl_gpt_layer_tensors(cfg, l, s);
        for (int i = 0; i < n; i++) {
            if (l == 0 && i == 0) e->wte_tensor = e->ntensors;
            add_tensor(e, l, i, &s[i]);
        }
    }
    e->nparams = pl_engine_align_layer(e->nparams);
    size_t bytes = e->nparams * sizeof(float);
    e->params = kn_alloc(k, bytes);
    e->grads = kn_alloc(k, bytes);
    e->m = kn_alloc(k, bytes);
    e->v = kn_alloc(k, bytes);
    e->bw = kn_alloc(k, scratch_bytes(e));
    if (!e->params || !e->grads || !e->m || !e->v || !e->bw) goto oom;
    if (pl_engine_has_embedding(e) && pl_engine_has_head(e) &&
        !(e->head_dwte = kn_alloc(k, e->tensors[e->wte_tensor].spec.numel * sizeof(float))))
        goto oom;
    for (int i = 0; i < nslots; i++) {
        pl_slot *sl = &e->slots[i];
        size_t sz = layout_slot(e, sl, NULL);
        sl->blocks = pl_calloc((size_t)(nblocks(e) ? nblocks(e) : 1), sizeof *sl->blocks);
        sl->mem = kn_alloc(k, sz);
        if (!sl->blocks || !sl->mem) goto oom;
        layout_slot(e, sl, sl->mem);
        e->act_bytes += sz;
    }
    e->act_bytes += scratch_bytes(e);
    return 0;
oom:
    pl_engine_destroy(e);
    return pl_errf(err, errlen, "engine: out of memory for layers [%d, %d) of %d×%d tokens",
                   begin, end, B, T);
}

/* The memory a step works in, one region per block: the scratch, the head's wte
 * gradient (one-stage engines), the activation slots. At most 2 + nslots. */
typedef struct {
    void *p;
    size_t bytes;
} work_region;

static int work_regions(const pl_engine *e, work_region *r)
{
    int n = 0;
    r[n++] = (work_region){e->bw, scratch_bytes(e)};
    if (e->head_dwte)
        r[n++] = (work_region){e->head_dwte,
                               e->tensors[e->wte_tensor].spec.numel * sizeof(float)};
    pl_slot sizing = {0}; /* layout_slot without a base only measures (into its argument) */
    const size_t slot_bytes = layout_slot(e, &sizing, NULL);
    for (int i = 0; i < e->nslots; i++) r[n++] = (work_region){e->slots[i].mem, slot_bytes};
    return n;
}

void pl_engine_populate_work(pl_engine *e)
{
    kn_populate(e->k, e->grads, e->nparams * sizeof(float));
    work_region *r = pl_calloc((size_t)e->nslots + 2, sizeof *r);
    if (!r) return; /* the first step faults its pages in instead */
    const int n = work_regions(e, r);
    for (int i = 0; i < n; i++) kn_populate(e->k, r[i].p, r[i].bytes);
    free(r);
}

/* Walks dst's and src's work regions side by side, mapping page runs of src over dst;
 * where src runs out, `more` maps what it can over the rest. */
static size_t share_regions(pl_engine *dst, const work_region *d, int nd, const work_region *s,
                            int ns, pl_work_source more, void *ctx)
{
    size_t mapped = 0, doff = 0, soff = 0;
    int di = 0;
    for (int si = 0; di < nd && si < ns;) {
        const size_t left = d[di].bytes - doff < s[si].bytes - soff ? d[di].bytes - doff
                                                                    : s[si].bytes - soff;
        const size_t n = left / KN_SHARE_ALIGN * KN_SHARE_ALIGN;
        if (n && !kn_share(dst->k, d[di].p, doff, s[si].p, soff, n)) mapped += n;
        doff += n, soff += n;
        if (d[di].bytes - doff < KN_SHARE_ALIGN) di++, doff = 0;
        if (s[si].bytes - soff < KN_SHARE_ALIGN) si++, soff = 0;
    }
    for (; more && di < nd; di++, doff = 0) { /* a small heap region takes none */
        const size_t n = (d[di].bytes - doff) / KN_SHARE_ALIGN * KN_SHARE_ALIGN;
        if (n) mapped += more(ctx, d[di].p, doff, n);
    }
    return mapped;
}

size_t pl_engine_share_work(pl_engine *dst, const pl_engine *src, pl_work_source more,
                            void *ctx)
{
    work_region *d = pl_calloc((size_t)dst->nslots + 2, sizeof *d);
    work_region *s = pl_calloc(src ? (size_t)src->nslots + 2 : 1, sizeof *s);
    size_t mapped = 0;
    if (d && s)
        mapped = share_regions(dst, d, work_regions(dst, d), s, src ? work_regions(src, s) : 0,
                               more, ctx);
    free(d);
    free(s);
    return mapped;
}

/* The weights' low-precision mirror (kn_lowp_mirror: CUDA's bf16 mode converts them
 * once a microbatch instead of at each matmul, forward and backward). Refreshed at the
 * start of every forward, dropped at the step's last backward and wherever the engine
 * itself writes params. Complete because parameters change only between steps (AdamW,
 * loads, checkpoint restores, layer copies, shadow refreshes; engine.h's `stop`): a
 * forward's matmuls read the mirror it just made; a backward's read the one the last
 * forward of the same step made, of the same weights; a backward with no forward of its
 * own step on this engine (a slot swapped in, frc.h) finds none (dropped by the previous
 * step's last backward and by this step's pl_engine_zero_grads) and converts. No backend
 * copies: a no-op. Memory fails: no mirror, the matmuls convert. */
static void mirror_refresh(pl_engine *e)
{
    const size_t bytes = kn_lowp_bytes(e->k, e->nparams);
    if (!bytes) return;
    if (!e->params_lp) e->params_lp = kn_alloc(e->k, bytes);
    kn_lowp_mirror(e->k, e->params_lp, e->params, e->params_lp ? e->nparams : 0);
}

static void mirror_drop(pl_engine *e)
{
    if (e->params_lp) kn_lowp_mirror(e->k, NULL, e->params, 0);
}

void pl_engine_destroy(pl_engine *e)
{
    if (!e->k) return;
    mirror_drop(e);
    kn_free(e->k, e->params_lp);
    for (int i = 0; e->slots && i < e->nslots; i++) {
        kn_free(e->k, e->slots[i].mem);
        free(e->slots[i].blocks);
    }
    kn_free(e->k, e->params);
    kn_free(e->k, e->grads);
    kn_free(e->k, e->m);
    kn_free(e->k, e->v);
    kn_free(e->k, e->bw);
    kn_free(e->k, e->head_dwte);
    for (int i = 0; i < PL_IO_COUNT; i++) {
        if (i == PL_IO_DEV_GRAD) kn_free(e->k, e->io[i]);
        else kn_host_free(e->k, e->io[i]);
    }
    free(e->slots);
    free(e->tensors);
    memset(e, 0, sizeof *e);
}

float *pl_engine_io_buffer(pl_engine *e, pl_engine_io which, size_t nfloats)
{
    if (nfloats <= e->io_floats[which] && e->io[which]) return e->io[which];
    const int dev = which == PL_IO_DEV_GRAD;
    if (dev) kn_free(e->k, e->io[which]);
    else kn_host_free(e->k, e->io[which]);
    e->io_floats[which] = 0;
    e->io[which] = dev ? kn_alloc(e->k, nfloats * sizeof(float))
                       : kn_host_alloc(e->k, nfloats * sizeof(float));
    if (e->io[which]) e->io_floats[which] = nfloats;
    return e->io[which];
}

const pl_engine_tensor *pl_engine_find(const pl_engine *e, int layer, int index)
{
    for (int i = 0; i < e->ntensors; i++)
        if (e->tensors[i].layer == layer && e->tensors[i].index == index) return &e->tensors[i];
    return NULL;
}

/* Parameter / gradient pointers of (layer, index); the range must hold it. */
static float *P(const pl_engine *e, int layer, int index)
{
    return e->params + pl_engine_find(e, layer, index)->offset;
}
static float *G(const pl_engine *e, int layer, int index)
{
    return e->grads + pl_engine_find(e, layer, index)->offset;
}

void pl_engine_init_random(pl_engine *e, uint64_t seed)
{
    mirror_drop(e);
    for (int i = 0; i < e->ntensors; i++) {
        const pl_engine_tensor *t = &e->tensors[i];
        float *host = malloc(t->spec.numel * sizeof(float));
        if (!host) abort();
        pl_gpt_init_tensor(&e->cfg, seed, t->layer, t->index, host);
        kn_to_device(e->k, e->params + t->offset, host, t->spec.numel * sizeof(float));
        free(host);
    }
}

int pl_engine_load_llmc(pl_engine *e, const pl_llmc_model *m, char *err, size_t errlen)
{
    const pl_gpt_config *a = &e->cfg, *b = &m->cfg;
    if (a->L != b->L || a->C != b->C || a->NH != b->NH || a->V != b->V || a->maxT != b->maxT)
        return pl_errf(err, errlen,
                       "spec.model.init: the llm.c model is L=%d C=%d NH=%d V=%d maxT=%d but the "
                       "job's model is L=%d C=%d NH=%d V=%d maxT=%d",
                       b->L, b->C, b->NH, b->V, b->maxT, a->L, a->C, a->NH, a->V, a->maxT);
    mirror_drop(e);
    for (int i = 0; i < e->ntensors; i++) {
        const pl_engine_tensor *t = &e->tensors[i];
        kn_to_device(e->k, e->params + t->offset, pl_llmc_tensor(m, t->layer, t->index),
                     t->spec.numel * sizeof(float));
    }
    return 0;
}

/* The input of block l (1-based model layer) in slot s. */
static const float *block_input(const pl_engine *e, const pl_slot *s, int l)
{
    int b = l - (int)first_block(e);
    return b == 0 ? s->input : s->blocks[b - 1].res3;
}

static void block_forward(pl_engine *e, pl_slot *s, int l)
{
    kn_ctx *k = e->k;
    const int B = e->B, T = e->T, C = e->cfg.C, BT = B * T;
    block_acts *a = &s->blocks[l - (int)first_block(e)];
    const float *x = block_input(e, s, l);
    kn_layernorm_forward(k, a->ln1, a->ln1_lp, a->ln1_mean, a->ln1_rstd, x, P(e, l, 0),
                         P(e, l, 1), B, T, C);
    kn_matmul_forward(k, a->qkv, a->qkv_lp, a->ln1, a->ln1_lp, P(e, l, 2), P(e, l, 3), BT, C,
                      3 * C);
    kn_attention_forward(k, a->atty, a->atty_lp, a->att, a->qkv, a->qkv_lp, B, T, C, e->cfg.NH);
    kn_matmul_residual_forward(k, a->res2, x, a->atty, a->atty_lp, P(e, l, 4), P(e, l, 5), BT,
                               C, C);
    kn_layernorm_forward(k, a->ln2, a->ln2_lp, a->ln2_mean, a->ln2_rstd, a->res2, P(e, l, 6),
                         P(e, l, 7), B, T, C);
    kn_matmul_gelu_forward(k, a->fch_gelu, a->fch_gelu_lp, a->fch, a->ln2, a->ln2_lp, P(e, l, 8),
                           P(e, l, 9), BT, C, 4 * C);
    kn_matmul_residual_forward(k, a->res3, a->res2, a->fch_gelu, a->fch_gelu_lp, P(e, l, 10),
                               P(e, l, 11), BT, 4 * C, C);
}

/* Output of the last block (or the input when the range has no block). */
static const float *last_output(const pl_engine *e, const pl_slot *s)
{
    int n = nblocks(e);
    return n ? s->blocks[n - 1].res3 : s->input;
}

/* The forward's input: the embedding of tokens, or `in`, host memory (dev = 0) or
 * backend memory (dev = 1; the slot's input itself: nothing to copy). */
static void input_forward(pl_engine *e, pl_slot *s, const int32_t *tokens, const float *in,
                          int dev)
{
    kn_ctx *k = e->k;
    const int B = e->B, T = e->T, C = e->cfg.C, BT = B * T;
    if (pl_engine_has_embedding(e)) {
        kn_to_device(k, s->tokens, tokens, (size_t)BT * sizeof(int32_t));
        kn_encoder_forward(k, s->input, s->tokens, P(e, 0, 0), P(e, 0, 1), B, T, C,
                           e->cfg.V);
    } else if (!dev) {
        kn_to_device(k, s->input, in, (size_t)BT * C * sizeof(float));
    } else if (in != s->input) {
        kn_copy(k, s->input, in, (size_t)BT * C * sizeof(float));
    }
}

/* The head's forward; returns the mean loss. */
static float head_forward(pl_engine *e, pl_slot *s, const int32_t *targets)
{
    kn_ctx *k = e->k;
    const int B = e->B, T = e->T, C = e->cfg.C, BT = B * T;
    const int H = e->cfg.L + 1;
    const float *wte = e->params + e->tensors[e->wte_tensor].offset;
    kn_to_device(k, s->targets, targets, (size_t)BT * sizeof(int32_t));
    kn_layernorm_forward(k, s->lnf, s->lnf_lp, s->lnf_mean, s->lnf_rstd, last_output(e, s),
                         P(e, H, 0), P(e, H, 1), B, T, C);
    if (e->keep_probs) {
        kn_matmul_forward(k, s->probs, NULL, s->lnf, s->lnf_lp, wte, NULL, BT, C, e->cfg.Vp);
        kn_softmax_crossentropy_forward(k, s->losses, s->probs, s->probs, s->targets, BT,
                                        e->cfg.V, e->cfg.Vp);
    } else { /* the logits stay (bf16 on CUDA); backward turns them into dlogits in one pass */
        kn_lm_head_forward(k, s->losses, s->ce_stats, s->probs, s->lnf, s->lnf_lp, wte,
                           s->targets, BT, C, e->cfg.V, e->cfg.Vp);
    }
    return (float)(kn_sum(k, s->losses, (size_t)BT) / BT);
}

static float forward(pl_engine *e, int slot, const int32_t *tokens, const float *in, int dev,
                     const int32_t *targets)
{
    pl_slot *s = &e->slots[slot];
    if (pl_engine_stopped(e)) return 0;
    mirror_refresh(e);
    input_forward(e, s, tokens, in, dev);
    int lo = (int)first_block(e);
    for (int b = 0; b < nblocks(e) && !pl_engine_stopped(e); b++) block_forward(e, s, lo + b);
    return pl_engine_has_head(e) && !pl_engine_stopped(e) ? head_forward(e, s, targets) : 0;
}

int pl_engine_forward_parts(const pl_engine *e)
{
    return 1 + (int)nblocks(e) + pl_engine_has_head(e);
}

float pl_engine_forward_part(pl_engine *e, int slot, int part, const int32_t *tokens,
                             const float *in, const int32_t *targets)
{
    pl_slot *s = &e->slots[slot];
    if (part == 0) {
        mirror_refresh(e);
        input_forward(e, s, tokens, in, 0);
    }
    else if (part <= (int)nblocks(e)) block_forward(e, s, (int)first_block(e) + part - 1);
    else return head_forward(e, s, targets);
    return 0;
}

float pl_engine_forward(pl_engine *e, int slot, const int32_t *tokens, const float *in,
                        const int32_t *targets)
{
    return forward(e, slot, tokens, in, 0, targets);
}

float pl_engine_forward_dev(pl_engine *e, int slot, const int32_t *tokens, const float *in,
                            const int32_t *targets)
{
    return forward(e, slot, tokens, in, 1, targets);
}

float *pl_engine_input_buffer(pl_engine *e, int slot)
{
    return e->slots[slot].input;
}

size_t pl_engine_slot_bytes(const pl_engine *e)
{
    pl_slot probe = {0};
    return layout_slot(e, &probe, NULL);
}

void pl_engine_slot_to_host(const pl_engine *e, int slot, void *host)
{
    kn_to_host(e->k, host, e->slots[slot].mem, pl_engine_slot_bytes(e));
}

void pl_engine_slot_from_host(pl_engine *e, int slot, const void *host)
{
    kn_to_device(e->k, e->slots[slot].mem, host, pl_engine_slot_bytes(e));
}

const float *pl_engine_output(const pl_engine *e, int slot)
{
    return last_output(e, &e->slots[slot]);
}

void pl_engine_keep_probs(pl_engine *e, int on)
{
    e->keep_probs = on != 0;
}

const float *pl_engine_probs(const pl_engine *e, int slot)
{
    return e->slots[slot].probs;
}

static void block_backward(pl_engine *e, pl_slot *s, int l, const scratch *w)
{
    kn_ctx *k = e->k;
    const int B = e->B, T = e->T, C = e->cfg.C, BT = B * T;
    block_acts *a = &s->blocks[l - (int)first_block(e)];
    const float *x = block_input(e, s, l);
    /* w->dres holds d(res3) on entry and d(block input) on exit, w->dres_lp its copy */
    kn_matmul_backward_gelu(k, w->dfch, w->dfch_lp, G(e, l, 10), G(e, l, 11), w->dres,
                            w->dres_lp, a->fch_gelu, a->fch_gelu_lp, P(e, l, 10), a->fch, BT,
                            4 * C, C);
    /* _set: the scratch input gradients are overwritten, no zeroing pass; dln through
     * dln_lp alone where the backend keeps copies */
    kn_matmul_backward_set(k, w->dln, w->dln_lp, G(e, l, 8), G(e, l, 9), w->dfch, w->dfch_lp,
                           a->ln2, a->ln2_lp, P(e, l, 8), BT, C, 4 * C);
    kn_layernorm_backward(k, w->dres, w->dres_lp, G(e, l, 6), G(e, l, 7), w->dln, w->dln_lp,
                          a->res2, P(e, l, 6), a->ln2_mean, a->ln2_rstd, B, T, C);
    /* datty through datty_lp alone, and atty through atty_lp (the forward wrote only
     * it), where the backend keeps copies */
    kn_matmul_backward_set(k, w->datty, w->datty_lp, G(e, l, 4), G(e, l, 5), w->dres,
                           w->dres_lp, a->atty, a->atty_lp, P(e, l, 4), BT, C, C);
    kn_attention_backward(k, w->dqkv, w->dqkv_lp, w->datty, w->datty_lp, a->qkv, a->qkv_lp,
                          a->att, a->atty, a->atty_lp, B, T, C, e->cfg.NH);
    kn_matmul_backward_set(k, w->dln, w->dln_lp, G(e, l, 2), G(e, l, 3), w->dqkv, w->dqkv_lp,
                           a->ln1, a->ln1_lp, P(e, l, 2), BT, C, 3 * C);
    kn_layernorm_backward(k, w->dres, w->dres_lp, G(e, l, 0), G(e, l, 1), w->dln, w->dln_lp, x,
                          P(e, l, 0), a->ln1_mean, a->ln1_rstd, B, T, C);
}

/* dres = the gradient the next stage sent, dout: host memory (dev = 0) or backend memory
 * (dev = 1); and its copy for the blocks' matmuls, which no layernorm backward writes here. */
static void dres_from_next_stage(pl_engine *e, const scratch *w, const float *dout, int dev)
{
    const size_t BTC = (size_t)e->B * (size_t)e->T * (size_t)e->cfg.C;
    if (!dev) kn_to_device(e->k, w->dres, dout, BTC * sizeof(float));
    else kn_copy(e->k, w->dres, dout, BTC * sizeof(float));
    if (w->dres_lp && nblocks(e)) kn_to_lowp(e->k, w->dres_lp, w->dres, BTC);
}

/* The head's share of wte's gradient: wte's own gradient, or kept apart until the
 * step's last backward when the range also holds the embedding (engine.h). */
static float *head_dwte(const pl_engine *e)
{
    return e->head_dwte ? e->head_dwte : e->grads + e->tensors[e->wte_tensor].offset;
}

/* dout is host memory (dev = 0) or backend memory (dev = 1); last: the step's last
 * backward, which adds the head's share of wte's gradient before layer 0 is done. */
static void backward(pl_engine *e, int slot, const float *dout, int dev, float dloss_scale,
                     int last, pl_layer_done_fn done, void *ctx)
{
    kn_ctx *k = e->k;
    pl_slot *s = &e->slots[slot];
    const int B = e->B, T = e->T, C = e->cfg.C, BT = B * T;
    const size_t BTC = (size_t)BT * C;
    scratch w = scratch_of(e);
    if (pl_engine_stopped(e)) return;
    if (pl_engine_has_head(e)) {
        const int H = e->cfg.L + 1;
        float *wte = e->params + e->tensors[e->wte_tensor].offset;
        if (e->keep_probs) {
            kn_crossentropy_softmax_backward(k, s->probs, s->probs, s->targets, dloss_scale, BT,
                                             e->cfg.V, e->cfg.Vp);
            kn_matmul_backward_set(k, w.dln, NULL, head_dwte(e), NULL, s->probs, NULL,
                                   s->lnf, s->lnf_lp, wte, BT, C, e->cfg.Vp);
        } else { /* the logits become the dlogits (bf16 on CUDA) */
            kn_lm_head_backward(k, w.dln, head_dwte(e), s->probs, s->ce_stats, s->targets,
                                dloss_scale, s->lnf, s->lnf_lp, wte, BT, C, e->cfg.V,
                                e->cfg.Vp);
        }
        e->head_pending = e->head_dwte != NULL;
        kn_zero(k, w.dres, BTC * sizeof(float));
        kn_layernorm_backward(k, w.dres, w.dres_lp, G(e, H, 0), G(e, H, 1), w.dln, NULL,
                              last_output(e, s), P(e, H, 0), s->lnf_mean, s->lnf_rstd, B, T, C);
        if (done) done(ctx, H);
    } else {
        dres_from_next_stage(e, &w, dout, dev);
    }
    int lo = (int)first_block(e);
    for (int b = nblocks(e) - 1; b >= 0 && !pl_engine_stopped(e); b--) {
        block_backward(e, s, lo + b, &w);
        if (done) done(ctx, lo + b);
    }
    if (pl_engine_has_embedding(e) && !pl_engine_stopped(e)) {
        kn_encoder_backward(k, G(e, 0, 0), G(e, 0, 1), w.dres, s->tokens, B, T, C, e->cfg.V);
        if (last && e->head_pending) {
            const pl_engine_tensor *t = &e->tensors[e->wte_tensor];
            kn_accumulate(k, e->grads + t->offset, e->head_dwte, t->spec.numel);
            e->head_pending = 0;
        }
        if (done) done(ctx, 0);
    }
}

void pl_engine_backward(pl_engine *e, int slot, const float *dout, float dloss_scale)
{
    backward(e, slot, dout, 0, dloss_scale, 0, NULL, NULL);
}

void pl_engine_backward_last(pl_engine *e, int slot, const float *dout, float dloss_scale,
                             pl_layer_done_fn done, void *ctx)
{
    backward(e, slot, dout, 0, dloss_scale, 1, done, ctx);
    mirror_drop(e);
}

void pl_engine_backward_dev(pl_engine *e, int slot, const float *dout, float dloss_scale)
{
    backward(e, slot, dout, 1, dloss_scale, 0, NULL, NULL);
}

void pl_engine_backward_last_dev(pl_engine *e, int slot, const float *dout, float dloss_scale,
                                 pl_layer_done_fn done, void *ctx)
{
    backward(e, slot, dout, 1, dloss_scale, 1, done, ctx);
    mirror_drop(e);
}

const float *pl_engine_input_grad(const pl_engine *e)
{
    return scratch_of(e).dres;
}

void pl_engine_zero_grads(pl_engine *e)
{
    mirror_drop(e);
    kn_zero(e->k, e->grads, e->nparams * sizeof(float));
    if (e->head_dwte)
        kn_zero(e->k, e->head_dwte, e->tensors[e->wte_tensor].spec.numel * sizeof(float));
    e->head_pending = 0;
}

/* Gradients read before the step's last backward would miss the head's share of wte. */
static void require_complete(const pl_engine *e, const char *what)
{
    if (!e->head_pending) return;
    fprintf(stderr, "pl_engine: %s before the step's last backward (pl_engine_backward_last)\n",
            what);
    abort();
}

/* One reduction over the contiguous gradients (off the CPU each one waits for the
 * device): a head-only range's wte copy, left out, is its first tensor. */
double pl_engine_grad_sumsq(pl_engine *e)
{
    require_complete(e, "pl_engine_grad_sumsq");
    size_t start = 0;
    if (e->wte_tensor >= 0 && !pl_engine_has_embedding(e))
        start = e->tensors[0].offset + e->tensors[0].spec.numel;
    return kn_sum_squares(e->k, e->grads + start, e->nparams - start);
}

void pl_engine_adamw(pl_engine *e, const pl_adamw *o, float grad_scale, int t)
{
    require_complete(e, "pl_engine_adamw");
    mirror_drop(e);
    /* every tensor, KN_ADAMW_SPANS at a time: one launch each on CUDA */
    kn_adamw_span sp[KN_ADAMW_SPANS];
    int n = 0;
    for (int i = 0; i < e->ntensors; i++) {
        const pl_engine_tensor *x = &e->tensors[i];
        sp[n++] = (kn_adamw_span){x->offset, x->spec.numel, x->spec.decay != 0};
        if (n == KN_ADAMW_SPANS || i == e->ntensors - 1) {
            kn_adamw_update_spans(e->k, e->params, e->grads, e->m, e->v, sp, n, o->lr, o->beta1,
                                  o->beta2, o->eps, o->weight_decay, grad_scale, t);
            n = 0;
        }
    }
}
