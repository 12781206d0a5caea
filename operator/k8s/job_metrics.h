/* The per-TrainingJob series of /metrics (metrics.h). They carry the labels
 * trainingjob_namespace and trainingjob — not namespace and job, which Prometheus
 * gives the scrape target itself — and go when the job is deleted
 * (pl_job_metrics_forget).
 *
 *   pliant_workers_desired          gauge    worker Pods requested
 *   pliant_workers_ready            gauge    workers training in the current plan
 *   pliant_preemptions_total        counter  worker Pods lost to disruptions
 *   pliant_failed_pods_total        counter  worker Pods that failed on their own
 *   pliant_reconfigurations_total   counter  plan changes
 *   pliant_checkpoints_total        counter  checkpoints completed
 *   pliant_checkpoint_last_step     gauge    step of the newest complete checkpoint
 *   pliant_loss                     gauge    training loss of the last committed step
 *   pliant_validation_loss          gauge    loss on spec.data.val of the last evaluation
 *   pliant_steps_total              counter  committed steps (pl_job_metrics_steps)
 *   pliant_samples_per_second       gauge    training throughput (pl_job_metrics_steps)
 *   pliant_job_node_hours           gauge    node-hours of the job's running worker Pods  } only with
 *   pliant_job_dollars              gauge    those node-hours at spec.cost.spot           } spec.cost
 *   pliant_job_on_demand_dollars    gauge    the same at spec.cost.onDemand              } (has_cost)
 *   pliant_job_samples_per_dollar   gauge    committed samples per spot dollar           }
 *
 * A gauge whose value is unknown (NaN: no step yet, no evaluation yet) is not written. */
#ifndef PLIANT_JOB_METRICS_H
#define PLIANT_JOB_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "metrics.h"

/* What one job looks like now; the counters are the job's totals. */
typedef struct {
    int workers_desired, workers_ready;
    int64_t preemptions, failed_pods, reconfigurations, checkpoints, checkpoint_step;
    double loss, validation_loss; /* NaN: unknown */
    int has_cost;                 /* spec.cost set: the cost series below are written */
    double node_hours, dollars, on_demand_dollars, samples_per_dollar;
} pl_job_sample;

/* `trainingjob_namespace="NS",trainingjob="NAME"` (values escaped) into buf. */
void pl_job_metrics_labels(char *buf, size_t len, const char *ns, const char *name);
/* Sets the job's series to the sample. m may be NULL (no metrics). */
void pl_job_metrics_set(pl_metrics *m, const char *ns, const char *name, const pl_job_sample *s);
/* Adds committed steps and sets the throughput. */
void pl_job_metrics_steps(pl_metrics *m, const char *ns, const char *name, int steps,
                          double samples_per_second);
/* Removes every series of the job (it was deleted). */
void pl_job_metrics_forget(pl_metrics *m, const char *ns, const char *name);

#endif
