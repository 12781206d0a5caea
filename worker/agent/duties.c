/* The duties the coordinator gives a worker besides training (agent_state.h): what it
 * sees under the job's checkpoint directory (register's checkpoint, the resume point),
 * writing a checkpoint's checkpoint.json once every layer is saved, measuring the model on
 * its device (spec.profile auto), and its pipeline's share of the validation batches
 * forward through its stage (spec.evalEvery). */
#include "agent_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_profile.h"
#include "trainer.h"
#include "util.h"

void agent_checkpoint_report(agent *a, pl_msg_register *reg)
{
    const pl_job *job = &a->job;
    reg->has_checkpoint = job->checkpoint.dir[0] && job->checkpoint.resume == PL_RESUME_AUTO;
    reg->checkpoint_step = 0;
    reg->checkpoint_error[0] = 0;
    if (!reg->has_checkpoint) return;
    char err[PL_PROTO_TEXT_MAX + 1] = "";
    if (pl_job_checkpoint_step(job, &reg->checkpoint_step, err, sizeof err)) {
        reg->checkpoint_step = 0;
        snprintf(reg->checkpoint_error, sizeof reg->checkpoint_error, "%s",
                 err[0] ? err : "unreadable");
        agent_log(a, "checkpoint directory: %s", reg->checkpoint_error);
    }
}

void agent_complete_checkpoint(agent *a, const pl_msg *m)
{
    const int64_t step = m->u.complete_checkpoint.step;
    pl_msg r;
    pl_msg_init(&r, PL_MSG_CHECKPOINT_DONE, atomic_load(&a->newest_plan));
    r.u.checkpoint_done.step = step;
    char err[PL_PROTO_TEXT_MAX + 1] = "";
    if (pl_job_complete_checkpoint(&a->job, step, err, sizeof err)) {
        snprintf(r.u.checkpoint_done.error, sizeof r.u.checkpoint_done.error, "%s",
                 err[0] ? err : "checkpoint.json not written");
        agent_post(a, &r);
        return;
    }
    agent_log(a, "checkpoint of step %lld complete (checkpoint.json written)", (long long)step);
    agent_post(a, &r);
    /* retention, once the newer checkpoint is complete; a failure costs only disk space */
    const int removed = pl_job_prune_checkpoints(&a->job, err, sizeof err);
    if (removed < 0)
        agent_log(a, "checkpoint cleanup: %s", err);
    else if (removed > 0)
        agent_log(a, "spec.checkpoint.keep %d: %d older checkpoint%s deleted",
                  a->job.checkpoint.keep, removed, removed == 1 ? "" : "s");
}

void agent_profile(agent *a, const pl_msg *m)
{
    pl_msg r;
    pl_msg_init(&r, PL_MSG_PROFILE_DONE, a->gen);
    char err[PL_PROTO_TEXT_MAX + 1] = "";
    const double t0 = pl_now_ms();
    r.u.profile_done.profile =
        pl_model_profile_measure(&a->job, a->k, m->u.profile_request.repeat, err, sizeof err);
    if (!r.u.profile_done.profile)
        snprintf(r.u.profile_done.error, sizeof r.u.profile_done.error, "%s",
                 err[0] ? err : "profile: no result");
    else
        agent_log(a, "measured the model on %s in %.1f ms", kn_backend(a->k),
                  pl_now_ms() - t0);
    agent_post(a, &r); /* frees the text */
}

/* The tokens and targets of this pipeline's share of the validation batches: batches
 * [lo, hi) of `nbatches`, split in pipeline order. *n: how many. */
static int eval_batches(agent *a, int *n, char *err, size_t errlen)
{
    if (!a->have_val)
        return pl_errf(err, errlen, "eval: no validation data (spec.data.val, spec.evalEvery)");
    pl_sampler vs;
    int64_t total;
    if (pl_job_eval_sampler(&a->job, &a->val, &vs, &total, err, errlen)) return -1;
    const int64_t lo = total * a->pipe / a->npipes, hi = total * (a->pipe + 1) / a->npipes;
    const int B = a->job.batch.micro;
    const size_t bt = (size_t)B * (size_t)a->job.batch.seq_len;
    *n = (int)(hi - lo);
    if ((size_t)*n * bt > a->evalcap) {
        free(a->etok);
        free(a->etgt);
        a->evalcap = (size_t)*n * bt;
        a->etok = malloc(a->evalcap * sizeof *a->etok);
        a->etgt = malloc(a->evalcap * sizeof *a->etgt);
        if (!a->etok || !a->etgt) {
            a->evalcap = 0;
            return pl_errf(err, errlen, "eval: out of memory");
        }
    }
    for (int b = 0; b < *n; b++)
        if (pl_sampler_fill(&vs, &a->val, lo + b, 0, B, a->etok + (size_t)b * bt,
                            a->etgt + (size_t)b * bt))
            return pl_errf(err, errlen, "eval: sampling batch %lld failed", (long long)(lo + b));
    return 0;
}

int agent_eval(agent *a, int64_t step, char *err, size_t errlen)
{
    int n = 0;
    double loss = 0;
    if (eval_batches(a, &n, err, errlen)) return -1;
    int rc; /* a newer plan arriving meanwhile interrupts its links (agent.c) */
    if (a->ncp) { /* the plan's ordered transport: the pipeline's ranks are consecutive */
        int ranks[PL_PROTO_MAX_NODES];
        for (int k = 0; k < a->nstages; k++) ranks[k] = a->rank - a->stage + k;
        const pl_stage_xlink x = {pl_nccl_plan_xport(a->ncp), ranks};
        rc = pl_stage_eval_xport(&a->e, a->stage, &x, a->etok, a->etgt, n, PEER_TIMEOUT_MS,
                                 &loss, err, errlen);
    } else {
        const pl_stage_link link = a->link ? pl_tcp_link_stage(a->link) : (pl_stage_link){0};
        rc = pl_stage_eval(&a->e, a->stage, &link, a->etok, a->etgt, n, &loss, err, errlen);
    }
    if (rc) return -1;
    pl_msg r;
    pl_msg_init(&r, PL_MSG_EVAL_DONE, a->gen);
    r.u.eval_done.step = step;
    r.u.eval_done.has_loss = pl_engine_has_head(&a->e);
    r.u.eval_done.loss = r.u.eval_done.has_loss ? loss : 0;
    r.u.eval_done.batches = n;
    return agent_post(a, &r) ? pl_errf(err, errlen, "cannot send eval_done") : 0;
}
