/* What a coordinator needs for a TrainingJob, the same in `pliant run` and the
 * operator: the planner's profile (spec.profile: synthetic derives it from the
 * model's sizes, a path is read here, auto is measured by a worker on its device
 * when the coordinator asks — or a profile measured before, kept by the front end),
 * the templates and the coverage table for up to nmax nodes (Oobleck §4), and the
 * coordinator's configuration. Single-threaded; a pl_job_plan owns what it holds
 * (pl_job_plan_free). */
#ifndef PLIANT_JOB_PLAN_H
#define PLIANT_JOB_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator.h"
#include "coverage.h"
#include "jobspec.h"
#include "profile.h"
#include "templates.h"

#define PL_JOB_PROFILE_REPEAT 3 /* timed runs per layer when a worker measures (auto) */

typedef struct {
    pl_profile prof;
    pl_template_set ts;
    pl_coverage cov;
    int have_prof, have_ts, have_cov;
    int nmax;
} pl_job_plan;

/* spec.profile synthetic or a path: the planner for up to nmax nodes, 0; -1 and err. Not
 * for auto (a worker measures it: pl_job_plan_from_json). */
int pl_job_plan_init(pl_job_plan *p, const pl_job *job, int nmax, char *err, size_t errlen);
/* The planner from a profile's JSON text measured for this job (spec.profile auto): it must
 * describe the job's model (its layers, embedding and head) at the job's microbatch size. */
int pl_job_plan_from_json(pl_job_plan *p, const pl_job *job, const char *json, int nmax,
                          char *err, size_t errlen);
void pl_job_plan_free(pl_job_plan *p);

/* The workers the first plan waits for: n_start, raised to the least that can run one. */
int pl_job_plan_n_start(const pl_job_plan *p, int n_start);

/* The coordinator's configuration (borrowing job and p, which must outlive the
 * coordinator): n_start workers before the first plan (raised to the least that can run
 * one); p NULL: a worker measures the profile first (profile_repeat, PROFILING). The
 * resume point comes from the workers (resume_auto) when the job has a checkpoint
 * directory and spec.checkpoint.resume auto; evaluation when it has validation data and
 * evalEvery. */
pl_coord_config pl_job_coord_config(const pl_job *job, const pl_job_plan *p, int n_start);

#endif
