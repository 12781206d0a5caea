/* A planner profile's "pipeline_step" (shared/profile.h): a short failure-free
 * `pliant run` of the job on this machine, timed (`pliant profile --pipeline-workers`). */
#ifndef PLIANT_PROFILE_STEP_H
#define PLIANT_PROFILE_STEP_H

#include <cJSON.h>
#include <stddef.h>

#include "jobspec.h"

typedef struct {
    const char *job_path; /* the job file, as `pliant run` reads it */
    const pl_job *job;    /* that job loaded: its strategy and tokens a step */
    int workers, threads, steps;
} pl_step_run;

/* Runs `pliant run JOB --workers W --threads T --steps N` planned from `profile` (a
 * temporary copy; checkpoints in a temporary directory; its output on stderr) and adds
 * to profile "pipeline_step": the strategy, W, T, the steps timed and their mean ms (a
 * plan's first step, with its start-up, is not timed). 0, or -1 with err. */
int pl_profile_pipeline_step(cJSON *profile, const pl_step_run *r, char *err, size_t errlen);

#endif
