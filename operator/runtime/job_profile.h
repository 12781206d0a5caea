/* Planner profiles (shared/profile.h's JSON) of a job's model: measured on
 * this machine (`pliant profile`; spec.profile auto in `pliant run`), or
 * synthetic (spec.profile synthetic: per-layer times from the layer's
 * multiply-adds at 10 GFLOP/s, so plans are reproducible — the tests use it).
 * On the CPU backend a "GPU" is this machine: the only GPU count is 1, its
 * memory the machine's RAM. Both return malloc'd JSON text, or NULL with err. */
#ifndef PLIANT_JOB_PROFILE_H
#define PLIANT_JOB_PROFILE_H

#include <stddef.h>

#include "jobspec.h"

/* Median of `repeat` timed runs of each layer alone, for one microbatch. */
char *pl_job_profile_measure(const pl_job *job, int repeat, char *err, size_t errlen);
char *pl_job_profile_synthetic(const pl_job *job, char *err, size_t errlen);

#endif
