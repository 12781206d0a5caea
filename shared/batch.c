/* Exact batch distribution. Every pipeline must take one microbatch; the rest
 * go to the smallest completion times a_j + k·b_j (k ≥ 1) over all pipelines,
 * which is optimal because each pipeline's completion times increase with k
 * (Oobleck §4.2.2 poses this as an integer program; it has this closed form). */
#include "batch.h"

#include <stdint.h>

int64_t pl_pipeline_capacity(const pl_pipeline_cost *c, int64_t t_ns)
{
    if (t_ns < c->first_ns) return 0;
    if (c->per_ns == 0) return INT64_MAX;
    return (t_ns - c->first_ns) / c->per_ns + 1;
}

/* Extra microbatches (beyond the first) of all pipelines finishing by t, capped at `need`. */
static int64_t extra_by(const pl_pipeline_cost *pipes, int npipes, int64_t t, int64_t need)
{
    int64_t total = 0;
    for (int j = 0; j < npipes && total < need; j++) {
        int64_t cap = pl_pipeline_capacity(&pipes[j], t);
        total += cap > need ? need : (cap > 0 ? cap - 1 : 0);
    }
    return total;
}

int64_t pl_distribute_batch(const pl_pipeline_cost *pipes, int npipes, int64_t microbatches,
                            int64_t *nb)
{
    if (npipes < 1 || microbatches < npipes) return -1;
    int64_t need = microbatches - npipes, lo = 0, hi = 0;
    for (int j = 0; j < npipes; j++) {
        int64_t end = pipes[j].first_ns + need * pipes[j].per_ns;
        if (end > hi) hi = end;
    }
    /* smallest t with `need` extra completions by t */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (extra_by(pipes, npipes, mid, need) >= need)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (!nb) { /* the makespan alone: the last forced first microbatch or the need-th extra one */
        int64_t makespan = need ? lo : 0;
        for (int j = 0; j < npipes; j++)
            if (pipes[j].first_ns > makespan) makespan = pipes[j].first_ns;
        return makespan;
    }
    /* everything strictly before lo, then completions exactly at lo in pipeline order */
    int64_t given = 0, makespan = 0;
    for (int j = 0; j < npipes; j++) {
        int64_t cap = need ? pl_pipeline_capacity(&pipes[j], lo - 1) : 0;
        nb[j] = cap > 1 ? cap : 1; /* < need + 1: lo is the smallest t with enough */
        given += nb[j] - 1;
    }
    for (int j = 0; j < npipes; j++) {
        while (given < need && pipes[j].first_ns + nb[j] * pipes[j].per_ns == lo) {
            nb[j]++;
            given++;
        }
        int64_t end = pipes[j].first_ns + (nb[j] - 1) * pipes[j].per_ns;
        if (end > makespan) makespan = end;
    }
    return makespan;
}
