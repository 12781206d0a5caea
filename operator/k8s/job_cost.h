/* What a TrainingJob's worker Pods cost (spec.cost): node time from when each Pod ran,
 * priced at the spot rate and at the on-demand rate of the same node.
 *
 * A Pod's node is billed while the Pod is Running, on the operator's clock: the clock
 * starts when the Pod is seen Running and stops when it is seen otherwise (Failed,
 * Succeeded, deleted). pl_pod_clock keeps one Pod's running interval; the job keeps the
 * node time of the intervals that ended (closed_ms) and adds the open ones when asked. */
#ifndef PLIANT_JOB_COST_H
#define PLIANT_JOB_COST_H

#include <stdint.h>

#include "jobspec.h"

/* One Pod's clock: since_ms > 0 while it runs (pl_now_ms() of its start). */
typedef struct {
    int64_t since_ms;
} pl_pod_clock;

/* The Pod is (running != 0) or is not running at now_ms: starts or stops its clock; a
 * stop adds the interval to *closed_ms. */
void pl_pod_clock_set(pl_pod_clock *pc, int running, int64_t now_ms, int64_t *closed_ms);
/* The node time of the interval still open at now_ms (0 when the Pod is not running). */
int64_t pl_pod_clock_open_ms(const pl_pod_clock *pc, int64_t now_ms);

/* The job's cost so far. */
typedef struct {
    double node_hours;
    double dollars;            /* at spec.cost.spot; 0 when unset */
    double on_demand_dollars;  /* at spec.cost.onDemand; 0 when unset */
    double samples_per_dollar; /* samples / dollars; 0 when no dollars yet */
} pl_job_cost;

/* Whether spec.cost names a price (the job reports cost only then). */
int pl_job_cost_enabled(const pl_cost_spec *spec);
/* The cost of node_ms of node time that trained samples samples. */
pl_job_cost pl_job_cost_of(const pl_cost_spec *spec, int64_t node_ms, double samples);

#endif
