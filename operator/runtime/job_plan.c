/* Everything a coordinator needs for a TrainingJob: profile, templates, coverage table
 * and configuration (job_plan.h). */
#include "job_plan.h"

#include <stdlib.h>
#include <string.h>

#include "model_profile.h"
#include "rc_plan.h"
#include "trainer.h"
#include "util.h"

/* losses this close together make one new plan (kills of one event arrive
 * within a few ms of each other) */
#define SETTLE_MS 20

/* Templates and coverage from p->prof. */
static int plan_from_profile(pl_job_plan *p, const pl_job *job, char *err, size_t errlen)
{
    p->have_prof = 1;
    const int F = job->fault_tolerance.tolerate;
    const pl_fault_tolerance_spec *ft = &job->fault_tolerance;
    if (ft->strategy == PL_STRATEGY_REDUNDANT
            ? pl_templates_plan_rc(&p->prof, p->nmax, F, ft->redundant_forward == PL_FRC_EAGER,
                                   &p->ts, err, errlen)
            : pl_templates_plan(&p->prof, p->nmax, F, &p->ts, err, errlen))
        return -1;
    p->have_ts = 1;
    if (pl_coverage_compute(&p->ts, p->nmax, F, job->batch.global, job->batch.micro, &p->cov,
                            err, errlen))
        return -1;
    p->have_cov = 1;
    return 0;
}

int pl_job_plan_init(pl_job_plan *p, const pl_job *job, int nmax, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->nmax = nmax;
    int rc;
    if (!strcmp(job->profile, "auto"))
        return pl_errf(err, errlen, "spec.profile: auto is measured by a worker");
    if (!strcmp(job->profile, "synthetic")) {
        char *text = pl_model_profile_synthetic(job, err, errlen);
        if (!text) return -1;
        rc = pl_profile_parse(text, &p->prof, err, errlen);
        free(text);
    } else {
        rc = pl_profile_load(job->profile, &p->prof, err, errlen);
    }
    return rc ? -1 : plan_from_profile(p, job, err, errlen);
}

int pl_job_plan_from_json(pl_job_plan *p, const pl_job *job, const char *json, int nmax,
                          char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->nmax = nmax;
    pl_gpt_config cfg;
    if (pl_job_gpt_config(job, &cfg, err, errlen) ||
        pl_profile_parse(json, &p->prof, err, errlen))
        return -1;
    const int layers = p->prof.nlayers, micro = p->prof.microbatch_size;
    if (layers != cfg.L + 2 || micro != job->batch.micro) {
        pl_profile_free(&p->prof);
        return pl_errf(err, errlen, "profile: %d layers at microbatch %d, the job's model has %d "
                       "at %d", layers, micro, cfg.L + 2, job->batch.micro);
    }
    return plan_from_profile(p, job, err, errlen);
}

void pl_job_plan_free(pl_job_plan *p)
{
    if (p->have_cov) pl_coverage_free(&p->cov);
    if (p->have_ts) pl_template_set_free(&p->ts);
    if (p->have_prof) pl_profile_free(&p->prof);
    memset(p, 0, sizeof *p);
}

int pl_job_plan_n_start(const pl_job_plan *p, int n_start)
{
    return n_start < p->cov.nodes_lo ? p->cov.nodes_lo : n_start;
}

pl_coord_config pl_job_coord_config(const pl_job *job, const pl_job_plan *p, int n_start)
{
    const pl_optimizer_spec *op = &job->optimizer;
    const pl_fault_tolerance_spec *ft = &job->fault_tolerance;
    double hb = ft->heartbeat_seconds * 1000.0;
    return (pl_coord_config){
        .profile = p ? &p->prof : NULL, .templates = p ? &p->ts : NULL,
        .coverage = p ? &p->cov : NULL, .tolerate = ft->tolerate,
        .global_batch = job->batch.global, .microbatch_size = job->batch.micro,
        .seq_len = job->batch.seq_len, .steps = job->steps, .lr = (float)op->lr,
        .lr_min_ratio = (float)op->min_lr_ratio, .lr_cosine = op->schedule == PL_SCHEDULE_COSINE,
        .lr_warmup = op->warmup_steps, .grad_clip = op->grad_clip,
        .heartbeat_ms = hb < 100 ? 100 : hb > 600000 ? 600000 : (int)hb,
        .step_timeout_ms = (int64_t)(ft->step_timeout_seconds * 1000.0),
        .n_start = p ? pl_job_plan_n_start(p, n_start) : n_start,
        .job = job->name, .token_ok = 1, .checkpoint_dir = job->checkpoint.dir,
        .checkpoint_every = job->checkpoint.every,
        .resume_auto = job->checkpoint.dir[0] && job->checkpoint.resume == PL_RESUME_AUTO,
        .strategy_checkpoint = ft->strategy == PL_STRATEGY_CHECKPOINT,
        .strategy_redundant = ft->strategy == PL_STRATEGY_REDUNDANT,
        .max_resets = ft->max_resets,
        .wait_for_nodes_ms = (int64_t)(ft->wait_for_nodes_timeout_seconds * 1000.0),
        .below_minimum_degrade = ft->below_minimum == PL_BELOW_MIN_DEGRADE,
        .settle_ms = SETTLE_MS, .hosts_added_check_every = ft->hosts_added_check_every,
        /* one heartbeat: both ends of a cut link report it within about that */
        .peer_judge_ms = hb < 100 ? 100 : hb > 600000 ? 600000 : (int)hb,
        .profile_repeat = p ? 0 : PL_JOB_PROFILE_REPEAT,
        .eval_every = job->data.val[0] ? job->eval_every : 0};
}
