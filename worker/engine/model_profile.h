/* Planner profiles (shared/profile.h's JSON) of a job's model: measured on a kernel
 * backend (a worker measures on its own device when the coordinator asks, spec.profile
 * auto; `pliant profile` on this machine's CPU), or synthetic (spec.profile synthetic:
 * per-layer times from the layer's multiply-adds at 10 GFLOP/s, so plans are
 * reproducible — the tests use it). A "GPU" is one kernel backend: the only GPU count is
 * 1, its memory the device's (the machine's RAM on the CPU backend). Both return
 * malloc'd JSON text (the caller frees it), or NULL with err. Thread-safe: no global
 * state; the measurement runs on the calling thread and uses k alone meanwhile. */
#ifndef PLIANT_MODEL_PROFILE_H
#define PLIANT_MODEL_PROFILE_H

#include <stddef.h>

#include "jobspec.h"
#include "kernels.h"

/* Median of `repeat` timed runs of each layer alone, for one microbatch, on k (NULL: a
 * CPU backend made for the call). */
char *pl_model_profile_measure(const pl_job *job, kn_ctx *k, int repeat, char *err,
                               size_t errlen);
char *pl_model_profile_synthetic(const pl_job *job, char *err, size_t errlen);

#endif
