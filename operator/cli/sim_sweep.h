/* `pliant simulate --sweep`: the grid of choices a sweep simulates (fault tolerance F and
 * the node count a job asks for, each strategy) and the choice it recommends: the most
 * samples per dollar of the runs that did not fail, ties by samples/s.
 * Plain values, nothing to free; single-threaded. */
#ifndef PLIANT_SIM_SWEEP_H
#define PLIANT_SIM_SWEEP_H

#include <stddef.h>

#define PL_SWEEP_MAX 16 /* values of one dimension */

typedef struct {
    int tolerate[PL_SWEEP_MAX], ntolerate; /* none: the job's spec.faultTolerance.tolerate */
    int nodes[PL_SWEEP_MAX], nnodes;       /* none: every node of the trace */
} pl_sweep;

/* Adds a dimension, "tolerate=1,2,3" or "nodes=16,24,32": 0, or -1 with err naming --sweep. */
int pl_sweep_parse(pl_sweep *s, const char *dim, char *err, size_t errlen);

typedef struct {
    int tolerate, nodes;      /* nodes 0: the trace's */
    const char *strategy;
    double samples_per_s, samples_per_usd;
    int ok;                   /* planned and not failed */
} pl_sweep_row;

/* The row recommended, or -1 when no row is ok. */
int pl_sweep_best(const pl_sweep_row *rows, int n);

#endif
