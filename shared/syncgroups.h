/* Per-layer gradient all-reduce groups between heterogeneous pipelines
 * (Oobleck §6.1): pipelines cut the model into different stages, so gradients
 * are synchronised layer by layer, each layer among the ranks whose stage holds
 * it. Pure and deterministic.
 *
 * Keys. A group is identified by a stable key: a layer index 0 .. L+1 (every
 * parameter tensor of that layer EXCEPT wte: for layer 0 that is wpe, for the
 * head L+1 lnfw and lnfb), or PL_SYNC_WTE for the tied wte, held by the
 * embedding's and by the head's holders alike (a head-only stage keeps its own
 * copy, see worker/engine/engine.h). The wte group is the union of layer 0's
 * and layer L+1's holders; a rank holding both has one wte and appears once.
 *
 * Reduction. Use SUM (then the loss scale of the whole step): the wte group
 * holds up to two ranks per pipeline, so dividing by the group size is wrong,
 * and pipelines may run different numbers of microbatches.
 *
 * Order. Every rank runs its groups as a subsequence of ONE global order,
 *   layer L+1, L, ..., 1, 0, then wte,
 * which is the order a stage finishes its layers' backward (highest first), so
 * each layer's sync can start while lower layers still run backward. One
 * global order keeps blocking collectives deadlock-free (the earliest pending
 * group in that order is reached by all its members). wte comes last, not
 * with the head: its gradient is complete only when the embedding holders
 * (stage 0, the last to finish backward) are done, so putting it first would
 * hold every head holder's queue, and through shared groups everybody's,
 * until the end of backward. Groups of one rank are listed too (their
 * all-reduce is a no-op). Members of a group are in ascending rank order, so
 * every member agrees on it. */
#ifndef PLIANT_SYNCGROUPS_H
#define PLIANT_SYNCGROUPS_H

#include <stddef.h>

#define PL_SYNC_WTE (-1)

typedef struct {
    int layer_begin, layer_end; /* layers [begin, end) of 0 .. L+1 */
    int rank;                   /* worker id running the stage, ≥ 0 */
} pl_sync_stage;

typedef struct {
    int nstages;
    const pl_sync_stage *stages; /* in pipeline order: contiguous, covering 0 .. L+1 */
} pl_sync_pipeline;

typedef struct {
    int key;        /* layer, or PL_SYNC_WTE */
    int nranks;
    int *ranks;     /* ascending */
    int set;        /* index of its member set among the distinct ones
                       (one communicator per set), numbered by first use
                       in groups[] order */
} pl_sync_group;

typedef struct {
    int rank;
    int ngroups;
    int *keys;      /* the groups it belongs to, in run order (see above) */
} pl_sync_rank;

typedef struct {
    int L;          /* transformer blocks: layers are 0 .. L+1 */
    int ngroups;    /* L + 3: groups[l] is layer l's, groups[L+2] the wte's */
    pl_sync_group *groups;
    int nranks;
    pl_sync_rank *ranks; /* ascending rank */
    int nsets;      /* distinct member sets */
    int largest;    /* most ranks in one group */
} pl_syncgroups;

/* Computes the groups for pipelines[0 .. npipelines) of a model with L blocks.
 * Validates: at least one pipeline, each with stages in order that cover
 * layers 0 .. L+1 exactly once, contiguously (no gap, no overlap, none empty or
 * outside the model); ranks non-negative and unique over all pipelines.
 * Returns 0, or −1 with a message naming the pipeline and stage
 * ("pipelines[1].stages[2]: ..."). */
int pl_syncgroups_compute(const pl_sync_pipeline *pipelines, int npipelines, int L,
                          pl_syncgroups *out, char *err, size_t errlen);
void pl_syncgroups_free(pl_syncgroups *g);

/* The group of a key (layer 0 .. L+1 or PL_SYNC_WTE), or NULL. */
const pl_sync_group *pl_syncgroups_group(const pl_syncgroups *g, int key);
/* A rank's groups, or NULL if it runs no stage. */
const pl_sync_rank *pl_syncgroups_rank(const pl_syncgroups *g, int rank);

/* Number of distinct member sets among all groups (communicators needed) and
 * the size of the largest group; returns the former. */
int pl_syncgroups_stats(const pl_syncgroups *g, int *largest);

/* Position of a key in the global run order (0 for layer L+1, ..., L+1 for
 * layer 0, L+2 for wte), or −1 for an invalid key. */
int pl_sync_key_order(int L, int key);

/* The key's stable name: "wte" or "layer.<i>". Returns snprintf's result. */
int pl_sync_key_name(int key, char *buf, size_t len);

#endif
