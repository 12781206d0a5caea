/* The sample order, a pure function of (seed, step), with an O(1) keyed
 * permutation of each epoch's windows (sampler.h). */
#include "sampler.h"

#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FEISTEL_ROUNDS 8

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* One permutation of [0, 2^bits): Feistel rounds over (high a bits, low b
 * bits), a + b = bits. A round maps (L, R) to (R, L ^ F(R)) — the halves swap
 * places and sizes — so it is a bijection even when a ≠ b. */
static uint64_t feistel(const uint64_t *keys, int bits, uint64_t x)
{
    int a = bits / 2, b = bits - a;
    for (int r = 0; r < FEISTEL_ROUNDS; r++) {
        uint64_t mask_a = (a == 0) ? 0 : ((a == 64) ? ~0ull : ((1ull << a) - 1));
        uint64_t mask_b = (b == 64) ? ~0ull : ((1ull << b) - 1);
        uint64_t L = x >> b, R = x & mask_b;
        uint64_t f = mix64(R ^ keys[r]);
        x = (R << a) | ((L ^ f) & mask_a);
        int t = a;
        a = b;
        b = t;
    }
    return x;
}

int64_t pl_sampler_permute(uint64_t seed, uint64_t epoch, int64_t W, int64_t i)
{
    if (W <= 1) return 0;
    int bits = 1;
    while (bits < 63 && (1ll << bits) < W) bits++;
    uint64_t key = mix64(mix64(seed ^ 0x5A17C0DE5EEDF00Dull) + epoch);
    uint64_t keys[FEISTEL_ROUNDS];
    for (int r = 0; r < FEISTEL_ROUNDS; r++) keys[r] = mix64(key + 0x9E3779B97F4A7C15ull * (uint64_t)(r + 1));
    /* Cycle-walking: the cycle through i contains i < W, so this ends; the
     * domain is < 2W, so it takes fewer than two steps on average. */
    uint64_t x = (uint64_t)i;
    do x = feistel(keys, bits, x);
    while (x >= (uint64_t)W);
    return (int64_t)x;
}

int pl_sampler_init(pl_sampler *s, pl_data_order order, uint64_t seed, int64_t ntokens, int T,
                    int G, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (T < 1) return pl_errf(err, errlen, "sequence length %d: must be positive", T);
    if (G < 1) return pl_errf(err, errlen, "global batch %d: must be positive", G);
    if (order != PL_ORDER_SHUFFLED && order != PL_ORDER_SEQUENTIAL)
        return pl_errf(err, errlen, "data order %d: unknown", (int)order);
    if (ntokens < 0) ntokens = 0;
    int64_t W = ntokens > 0 ? (ntokens - 1) / T : 0;
    int64_t K = ntokens > 0 ? (ntokens - 1) / ((int64_t)G * T) : 0;
    if (order == PL_ORDER_SHUFFLED && W < 1)
        return pl_errf(err, errlen,
                       "token stream too short: %" PRId64 " tokens, need at least %" PRId64
                       " for one sequence of %d tokens",
                       ntokens, (int64_t)T + 1, T);
    if (order == PL_ORDER_SEQUENTIAL && K < 1)
        return pl_errf(err, errlen,
                       "token stream too short: %" PRId64 " tokens, need at least %" PRId64
                       " for one batch of %d sequences of %d tokens",
                       ntokens, (int64_t)G * T + 1, G, T);
    s->order = order;
    s->seed = seed;
    s->ntokens = ntokens;
    s->T = T;
    s->G = G;
    s->windows = W;
    s->batches = K;
    return 0;
}

int64_t pl_sampler_window(const pl_sampler *s, int64_t step, int j)
{
    if (s->order == PL_ORDER_SEQUENTIAL) {
        int64_t p = (step % s->batches) * (int64_t)s->G * s->T;
        return p + (int64_t)j * s->T;
    }
    uint64_t g = (uint64_t)step * (uint64_t)s->G + (uint64_t)j;
    uint64_t W = (uint64_t)s->windows;
    int64_t w = pl_sampler_permute(s->seed, g / W, s->windows, (int64_t)(g % W));
    return w * s->T;
}

int64_t pl_sampler_epoch(const pl_sampler *s, int64_t step)
{
    if (s->order == PL_ORDER_SEQUENTIAL) return step / s->batches;
    return (int64_t)((uint64_t)step * (uint64_t)s->G / (uint64_t)s->windows);
}

int pl_sampler_fill(const pl_sampler *s, const pl_tokens *tok, int64_t step, int first, int n,
                    int32_t *inputs, int32_t *targets)
{
    if (first < 0 || n < 0 || first > s->G || n > s->G - first) return -1;
    if (pl_tokens_count(tok) < s->ntokens) return -1;
    int T = s->T;
    for (int i = 0; i < n; i++) {
        int64_t off = pl_sampler_window(s, step, first + i);
        if (pl_tokens_copy(tok, off, T, inputs + (int64_t)i * T) != 0) return -1;
        if (pl_tokens_copy(tok, off + 1, T, targets + (int64_t)i * T) != 0) return -1;
    }
    return 0;
}

uint64_t pl_sampler_digest(const pl_sampler *s, int64_t step, int first, int n)
{
    uint64_t sum = 0;
    for (int i = 0; i < n; i++) {
        int j = first + i;
        uint64_t g = (uint64_t)step * (uint64_t)s->G + (uint64_t)j;
        uint64_t off = (uint64_t)pl_sampler_window(s, step, j);
        sum += mix64(mix64(g + 0xD1B54A32D192ED03ull) ^ off);
    }
    return sum;
}

int pl_sampler_init_eval(pl_sampler *s, int64_t ntokens, int T, int B, char *err, size_t errlen)
{
    return pl_sampler_init(s, PL_ORDER_SEQUENTIAL, 0, ntokens, T, B, err, errlen);
}

int64_t pl_sampler_eval_batches(const pl_sampler *s, int64_t requested)
{
    if (requested <= 0 || requested > s->batches) return s->batches;
    return requested;
}
