/* The sample order: a pure function of (seed, step). The global batch of step
 * s is a fixed list of G sequences, each a window of T+1 consecutive tokens
 * (inputs = the first T, targets = the same shifted by one). A microbatch is a
 * contiguous slice [first, first+n) of that list, so whatever the pipelines
 * and microbatch sizes, every step sees the same samples.
 *
 * Shuffled: the stream has W = (ntokens − 1) / T windows, window w being
 * tokens [w·T, w·T + T + 1). Sample g = s·G + j lies in epoch e = g / W at
 * position g % W and is window perm(seed, e, g % W), perm a keyed permutation
 * of [0, W) evaluated in O(1) (see pl_sampler_permute). Each epoch uses every
 * window exactly once, whatever the step and microbatch partitioning.
 *
 * Sequential: llm.c's DataLoader with shuffling off, over the concatenated
 * stream. K = (ntokens − 1) / (G·T) full batches fit; batch s is tokens
 * [p, p + G·T + 1) with p = (s mod K)·G·T (llm.c goes back to 0 when
 * position + G·T + 1 > ntokens), and sequence j starts at p + j·T. */
#ifndef PLIANT_SAMPLER_H
#define PLIANT_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "jobspec.h" /* pl_data_order: PL_ORDER_SHUFFLED | PL_ORDER_SEQUENTIAL */
#include "tokens.h"

typedef struct {
    pl_data_order order;
    uint64_t seed;
    int64_t ntokens;
    int T;           /* tokens per sequence */
    int G;           /* sequences per step (global batch) */
    int64_t windows; /* shuffled: W = (ntokens − 1) / T */
    int64_t batches; /* sequential: K = (ntokens − 1) / (G·T) */
} pl_sampler;

/* Fails (−1, err) when T < 1, G < 1, or the stream is too short: shuffled
 * needs one window (ntokens ≥ T + 1), sequential one batch (ntokens ≥ G·T + 1). */
int pl_sampler_init(pl_sampler *s, pl_data_order order, uint64_t seed, int64_t ntokens, int T,
                    int G, char *err, size_t errlen);

/* Stream offset of the first token of sequence j (0 ≤ j < G) of step (≥ 0);
 * the sequence's T+1 tokens are [offset, offset + T]. */
int64_t pl_sampler_window(const pl_sampler *s, int64_t step, int j);

/* Epoch of the first sample of step: shuffled ⌊step·G / W⌋, sequential ⌊step / K⌋. */
int64_t pl_sampler_epoch(const pl_sampler *s, int64_t step);

/* Fills sequences first..first+n−1 of step: inputs and targets are n·T int32
 * each, sequence i of the slice at [i·T, (i+1)·T). tok must be the stream the
 * sampler was initialised for (at least s->ntokens tokens). Returns 0, or −1
 * if the slice is outside [0, G) or tok is too short. */
int pl_sampler_fill(const pl_sampler *s, const pl_tokens *tok, int64_t step, int first, int n,
                    int32_t *inputs, int32_t *targets);

/* A stable 64-bit digest of the window offsets of sequences first..first+n−1
 * of step (metrics: samples_digest). It is a sum mod 2^64 of one hash per
 * sequence, each hash depending on the sample's global index s·G + j and its
 * window offset, so the digests of the microbatches of a step add up
 * (pl_sampler_digest_combine) to the digest of the whole step; n = 0 gives 0. */
uint64_t pl_sampler_digest(const pl_sampler *s, int64_t step, int first, int n);
static inline uint64_t pl_sampler_digest_combine(uint64_t a, uint64_t b) { return a + b; }

/* The keyed permutation of [0, W) used for epoch `epoch`: a balanced-as-possible
 * Feistel network (8 rounds, splitmix64 round function) on the smallest power
 * of two ≥ W, with cycle-walking back into [0, W). 0 ≤ i < W. */
int64_t pl_sampler_permute(uint64_t seed, uint64_t epoch, int64_t W, int64_t i);

/* Evaluation: batch k of an evaluation is sequential batch k over the val
 * stream from its start, B sequences of T tokens (the same batches every
 * time). pl_sampler_init_eval is pl_sampler_init(SEQUENTIAL, seed 0). */
int pl_sampler_init_eval(pl_sampler *s, int64_t ntokens, int T, int B, char *err, size_t errlen);

/* Number of evaluation batches to run for a request: the distinct batches of
 * the val stream (K) if requested ≤ 0, else min(requested, K). */
int64_t pl_sampler_eval_batches(const pl_sampler *s, int64_t requested);

#endif
