/* What a coordinator needs for a TrainingJob, the same in `pliant run` and the
 * operator: the planner's profile (spec.profile: auto measures the model here,
 * synthetic derives it from its sizes, else a file), the templates and the
 * coverage table for up to nmax nodes (Oobleck §4), the coordinator's
 * configuration, and the job's checkpoints (resume step, checkpoint.json). */
#ifndef PLIANT_JOB_PLAN_H
#define PLIANT_JOB_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator.h"
#include "coverage.h"
#include "jobspec.h"
#include "profile.h"
#include "templates.h"

typedef struct {
    pl_profile prof;
    pl_template_set ts;
    pl_coverage cov;
    int have_prof, have_ts, have_cov;
    int nmax;
} pl_job_plan;

int pl_job_plan_init(pl_job_plan *p, const pl_job *job, int nmax, char *err, size_t errlen);
void pl_job_plan_free(pl_job_plan *p);

/* The coordinator's configuration (borrowing job and p, which must outlive the
 * coordinator): n_start workers before the first plan (raised to the least that
 * can run one), resume_step > 0 to start from that checkpoint. */
pl_coord_config pl_job_coord_config(const pl_job *job, const pl_job_plan *p, int n_start,
                                    int64_t resume_step);

/* The step of the newest complete checkpoint to resume from: 0 when there is none
 * or spec.checkpoint.resume is never. */
int pl_job_resume_step(const pl_job *job, int64_t *step, char *err, size_t errlen);

/* Every layer of the checkpoint of `step` is written: its checkpoint.json marks it
 * complete. */
int pl_job_complete_checkpoint(const pl_job *job, int64_t step, char *err, size_t errlen);

#endif
