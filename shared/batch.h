/* Batch distribution (Oobleck §4.2.2, §5.2): split the global batch's
 * microbatches over heterogeneous pipelines so that the slowest finishes first. */
#ifndef PLIANT_BATCH_H
#define PLIANT_BATCH_H

#include <stdint.h>

/* Pipeline j finishes nb microbatches in first_ns[j] + (nb−1)·per_ns[j]. */
typedef struct {
    int64_t first_ns;
    int64_t per_ns;
} pl_pipeline_cost;

/* Exact minimum over integer nb_j ≥ 1, Σ nb_j = microbatches, of max_j time_j(nb_j).
 * Writes the distribution to nb[npipes] (when not NULL) and returns the
 * makespan, or -1 when microbatches < npipes. */
int64_t pl_distribute_batch(const pl_pipeline_cost *pipes, int npipes, int64_t microbatches,
                            int64_t *nb);

/* Microbatches a pipeline completes within t_ns (0 if t_ns < first_ns). */
int64_t pl_pipeline_capacity(const pl_pipeline_cost *c, int64_t t_ns);

#endif
