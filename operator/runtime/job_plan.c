/* Everything a coordinator needs for a TrainingJob: profile, templates, coverage
 * table, configuration and resume checkpoint (job_plan.h). */
#include "job_plan.h"

#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "job_profile.h"
#include "trainer.h"
#include "util.h"

#define PROFILE_REPEAT 3 /* timed runs per layer for spec.profile auto */
/* losses this close together make one new plan (kills of one event arrive
 * within a few ms of each other) */
#define SETTLE_MS 20

int pl_job_plan_init(pl_job_plan *p, const pl_job *job, int nmax, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->nmax = nmax;
    int rc;
    if (!strcmp(job->profile, "auto") || !strcmp(job->profile, "synthetic")) {
        char *text = !strcmp(job->profile, "synthetic")
                         ? pl_job_profile_synthetic(job, err, errlen)
                         : pl_job_profile_measure(job, PROFILE_REPEAT, err, errlen);
        if (!text) return -1;
        rc = pl_profile_parse(text, &p->prof, err, errlen);
        free(text);
    } else {
        rc = pl_profile_load(job->profile, &p->prof, err, errlen);
    }
    if (rc) return -1;
    p->have_prof = 1;
    const int F = job->fault_tolerance.tolerate;
    if (pl_templates_plan(&p->prof, nmax, F, &p->ts, err, errlen)) return -1;
    p->have_ts = 1;
    if (pl_coverage_compute(&p->ts, nmax, F, job->batch.global, job->batch.micro, &p->cov, err,
                            errlen))
        return -1;
    p->have_cov = 1;
    return 0;
}

void pl_job_plan_free(pl_job_plan *p)
{
    if (p->have_cov) pl_coverage_free(&p->cov);
    if (p->have_ts) pl_template_set_free(&p->ts);
    if (p->have_prof) pl_profile_free(&p->prof);
    memset(p, 0, sizeof *p);
}

pl_coord_config pl_job_coord_config(const pl_job *job, const pl_job_plan *p, int n_start,
                                    int64_t resume_step)
{
    const pl_optimizer_spec *op = &job->optimizer;
    const pl_fault_tolerance_spec *ft = &job->fault_tolerance;
    double hb = ft->heartbeat_seconds * 1000.0;
    if (n_start < p->cov.nodes_lo) n_start = p->cov.nodes_lo;
    return (pl_coord_config){
        .profile = &p->prof, .templates = &p->ts, .coverage = &p->cov, .tolerate = ft->tolerate,
        .global_batch = job->batch.global, .microbatch_size = job->batch.micro,
        .seq_len = job->batch.seq_len, .steps = job->steps, .lr = (float)op->lr,
        .lr_min_ratio = (float)op->min_lr_ratio, .lr_cosine = op->schedule == PL_SCHEDULE_COSINE,
        .lr_warmup = op->warmup_steps, .grad_clip = op->grad_clip,
        .heartbeat_ms = hb < 100 ? 100 : hb > 600000 ? 600000 : (int)hb, .n_start = n_start,
        .job = job->name, .token_ok = 1, .checkpoint_dir = job->checkpoint.dir,
        .checkpoint_every = job->checkpoint.every, .resume_step = resume_step,
        .strategy_checkpoint = ft->strategy == PL_STRATEGY_CHECKPOINT,
        .max_resets = ft->max_resets,
        .wait_for_nodes_ms = (int64_t)(ft->wait_for_nodes_timeout_seconds * 1000.0),
        .settle_ms = SETTLE_MS, .hosts_added_check_every = ft->hosts_added_check_every};
}

int pl_job_resume_step(const pl_job *job, int64_t *step, char *err, size_t errlen)
{
    *step = 0;
    if (!job->checkpoint.dir[0] || job->checkpoint.resume != PL_RESUME_AUTO) return 0;
    char dir[PL_PATH_MAX + 32];
    int found = pl_checkpoint_latest(job->checkpoint.dir, dir, sizeof dir, err, errlen);
    if (found <= 0) return found;
    pl_gpt_config cfg;
    return pl_checkpoint_config(dir, &cfg, step, err, errlen);
}

int pl_job_complete_checkpoint(const pl_job *job, int64_t step, char *err, size_t errlen)
{
    pl_gpt_config cfg;
    if (pl_job_gpt_config(job, &cfg, err, errlen)) return -1;
    char *info = pl_checkpoint_info_json(job, &cfg, step);
    if (!info) return pl_errf(err, errlen, "out of memory");
    int rc = pl_checkpoint_complete(job->checkpoint.dir, step, info, err, errlen);
    free(info);
    return rc;
}
