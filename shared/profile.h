/* Planner profile: measured per-layer costs of one microbatch (ARCHITECTURE.md,
 * issue "pliant plan"). Times are held as integer nanoseconds so that every sum
 * in the cost model is exact and plans are reproducible byte for byte. */
#ifndef PLIANT_PROFILE_H
#define PLIANT_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#define PL_MAX_GPU_KEYS 16

typedef struct {
    char name[64];
    int64_t fwd_ns[PL_MAX_GPU_KEYS]; /* indexed like pl_profile.keys */
    int64_t bwd_ns[PL_MAX_GPU_KEYS];
    int64_t param_bytes;
    int64_t activation_bytes;
    int64_t output_bytes;
} pl_layer_profile;

/* A real failure-free step of the job on the machine that measured the profile
 * (`pliant profile --pipeline-workers`): `workers` local workers of `threads` compute
 * threads each, under the job's strategy, took ns per step (the mean of `steps` steps, a
 * plan's first not among them). What the planner's layer times leave out of a step there
 * (messages, scheduling) is taken from it (docs/simulate.md). workers 0: not measured. */
typedef struct {
    int workers, threads;
    char strategy[16];        /* spec.faultTolerance.strategy's word */
    int steps;                /* the steps the mean is over */
    int64_t ns;
} pl_pipeline_step;

typedef struct {
    char model[64];
    int microbatch_size;
    int gpus_per_node;        /* M */
    int64_t gpu_memory_bytes;
    double intra_node_GBps;
    double inter_node_GBps;
    int nkeys;                /* GPU counts d that may run one stage, ascending; keys[0] == 1 */
    int keys[PL_MAX_GPU_KEYS];
    int nlayers;              /* L */
    pl_layer_profile *layers;
    pl_pipeline_step pipeline_step; /* optional "pipeline_step" */
} pl_profile;

/* Parses and validates a profile JSON document. On error returns -1 and writes
 * a message naming the field path (e.g. "layers[2].forward_ms: ...") to err. */
int pl_profile_parse(const char *json, pl_profile *out, char *err, size_t errlen);
int pl_profile_load(const char *path, pl_profile *out, char *err, size_t errlen);
void pl_profile_free(pl_profile *p);

/* Index of GPU count d in p->keys, or -1. */
int pl_profile_key_index(const pl_profile *p, int d);

/* Time in ns to send `bytes` at `GBps` (GB = 1e9 bytes), rounded to the nearest ns. */
int64_t pl_transfer_ns(int64_t bytes, double GBps);

/* The training state of layers [b, e): parameters and AdamW's m and v, what a copy moves. */
int64_t pl_profile_state_bytes(const pl_profile *p, int b, int e);

#endif
