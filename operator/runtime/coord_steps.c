/* The coordinator's step (coordinator.c): start_step, the reports and the reductions,
 * commit, the step boundary and what follows it; the evaluation after a step; an attempt
 * that fails with no loss to blame, redone a bounded number of times; the step's
 * deadline from the steps timed; and the steps a simulation skips. */
#include "coord_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "training_schedule.h"

/* Worker i has a place in the current plan. */
int in_pipes(const pl_coord *c, int i)
{
    return c->has_cur && c->w[i].pipe >= 0;
}

/* abort / start_step / commit to the live workers of the current pipelines. */
void to_pipeline_workers(pl_coord *c, int type, const char *why)
{
    for (int i = 0; i < c->nw; i++) {
        if (!c->w[i].live || !in_pipes(c, i))
            continue;
        if (type == PL_MSG_COMMIT) {
            pl_msg *m = push_msg(c, i, type, c->gen);
            if (m) {
                m->u.commit.step = c->step;
                m->u.commit.grad_scale = c->grad_scale;
                m->u.commit.lr = c->lr;
                /* pipeline 0 holds every layer once: its workers write the checkpoint */
                m->u.commit.save = c->w[i].pipe == 0 && c->commit_save;
                if (m->u.commit.save)
                    note_writer(c, i, c->step + 1);
            }
        } else {
            send_text(c, i, type, c->gen, c->step, why, 0);
        }
    }
}

/* Appends a committed step's record to the log: 0, or -1 when memory ran out. */
static int log_step(pl_coord *c, const pl_coord_step_rec *rec)
{
    if (c->nlog == c->caplog) {
        int cap = c->caplog ? 2 * c->caplog : 16;
        pl_coord_step_rec *x = realloc(c->log, (size_t)cap * sizeof *x);
        if (!x)
            return -1;
        c->log = x;
        c->caplog = cap;
    }
    c->log[c->nlog++] = *rec;
    return 0;
}

/* A committed step whose evaluation will not happen: logged without a validation loss. */
void flush_eval(pl_coord *c)
{
    if (!c->eval_pending)
        return;
    c->eval_pending = 0;
    c->eval_rec.val_loss = NAN;
    log_step(c, &c->eval_rec); /* best effort: the job ends or restarts anyway */
}

static void reset_step_flags(pl_coord *c)
{
    for (int i = 0; i < c->nw; i++)
        c->w[i].reported = c->w[i].reduced = c->w[i].committed = 0;
    c->scan_reduced = c->scan_committed = 0;
    c->sumsq = c->loss_sum = 0;
    c->nloss = 0;
}

static void start_step(pl_coord *c)
{
    reset_step_flags(c);
    c->step_t0 = c->now;
    c->phase = PL_COORD_RUNNING;
    to_pipeline_workers(c, PL_MSG_START_STEP, "");
}

/* The pipeline workers evaluate the state after the step of eval_rec (phase EVALUATING). */
static void start_eval(pl_coord *c)
{
    c->val_sum = 0;
    c->val_batches = 0;
    c->phase = PL_COORD_EVALUATING;
    for (int i = 0; i < c->nw; i++) {
        c->w[i].evaluated = 0;
        if (!c->w[i].live || !in_pipes(c, i))
            continue;
        pl_msg *m = push_msg(c, i, PL_MSG_EVAL, c->gen);
        if (m)
            m->u.eval.step = c->eval_rec.step;
    }
}

/* Leaving workers stay in the plan while moving them out would leave too few workers for
 * one ((F + 1)·n0; n0 with below_minimum_degrade): they train on until they go, as
 * without a notice, rather than stopping the job early. Only while every worker of the
 * plan is live (a lost one needs its new plan now). */
int leaving_held(const pl_coord *c)
{
    int live = 0, leaving = 0;
    for (int i = 0; i < c->nw; i++) {
        if (c->w[i].pipe >= 0 && !c->w[i].live)
            return 0;
        live += c->w[i].live;
        leaving += c->w[i].live && c->w[i].leaving;
    }
    const int need =
        (c->cfg.below_minimum_degrade ? 1 : c->cfg.tolerate + 1) * c->cfg.templates->n0;
    return leaving > 0 && live - leaving < need;
}

/* After a committed step (and its evaluation): the last checkpoint or the end, a new
 * plan at the step boundary, or the next step. */
static void after_step(pl_coord *c)
{
    if (c->step >= c->cfg.steps) {
        if (pl_checkpoint_due(c->cfg.checkpoint_dir, c->cfg.checkpoint_every, c->cfg.steps,
                              c->step) && c->ckpt_last < c->step) {
            csaving *last = saving_slot(c, c->step);
            if (last && last->failed && c->pending) { /* a writer was lost: the new plan's */
                replan(c);                            /* pipeline 0 writes it again */
                return;
            }
            c->phase = PL_COORD_SAVING; /* done when the last checkpoint is complete */
            if (last && last->failed) /* it failed before the step's commit was through */
                resave(c, last);
        } else {
            finish_job(c);
        }
        return;
    }
    int every = c->cfg.hosts_added_check_every > 1 ? c->cfg.hosts_added_check_every : 1;
    if ((c->pending && !leaving_held(c)) || (c->join_pending && c->step % every == 0))
        replan(c);
    else
        start_step(c);
}

/* Every live worker that got the plan has its layers: the plan is the stable one, and the
 * evaluation interrupted, the step or the end follows. */
void check_copy_complete(pl_coord *c)
{
    if (c->phase != PL_COORD_COPYING)
        return;
    for (; c->scan_copy < c->nw; c->scan_copy++) {
        const cworker *w = &c->w[c->scan_copy];
        if (w->live && w->got_plan && !w->copy_done)
            return;
    }
    if (cplan_copy(&c->stable, &c->cur)) {
        set_failed(c, "coordinator: out of memory");
        return;
    }
    c->has_stable = 1;
    c->need_ckpt = 0;
    stop_departed(c, 0);
    if (c->eval_pending) /* a loss interrupted the evaluation of a committed step */
        start_eval(c);
    else if (c->step >= c->cfg.steps) /* a writer of the last checkpoint was lost */
        after_step(c);
    else
        start_step(c);
}

/* A committed step's record in the log, then what follows the step. */
static void record_step(pl_coord *c, const pl_coord_step_rec *rec)
{
    if (log_step(c, rec))
        set_failed(c, "coordinator: out of memory");
    else
        after_step(c);
}

/* Every live pipeline worker committed: the step counts. Its record is logged now, or
 * once its evaluation is in (every eval_every-th step and the last). */
static void step_boundary(pl_coord *c)
{
    pl_coord_step_rec x = {.step = c->step, .norm = c->norm, .grad_scale = c->grad_scale,
                           .lr = c->lr, .val_loss = NAN, .generation = c->gen};
    int64_t mbs = c->cfg.global_batch / c->micro;
    x.loss = c->nloss ? c->loss_sum / (double)mbs : NAN;
    memcpy(x.pipelines, c->cur.desc, sizeof x.pipelines);
    c->step_ms[c->nstep_ms++ % PL_COORD_STEP_TIMES] = c->now - c->step_t0;
    if (c->fail_step == c->step)
        c->fail_step = -1; /* the step went through after all */
    c->step++;
    int every = c->cfg.eval_every;
    if (every > 0 && (c->step % every == 0 || c->step >= c->cfg.steps)) {
        c->eval_rec = x;
        c->eval_pending = 1;
        start_eval(c);
        return;
    }
    record_step(c, &x);
}

/* Every live pipeline worker of the plan evaluated: the validation loss is the mean over
 * the batches of every pipeline, as one process computes it over all of them. */
void check_eval_complete(pl_coord *c)
{
    if (c->phase != PL_COORD_EVALUATING)
        return;
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && in_pipes(c, i) && !c->w[i].evaluated)
            return;
    c->eval_rec.val_loss = c->val_batches ? c->val_sum / (double)c->val_batches : NAN;
    c->eval_pending = 0;
    record_step(c, &c->eval_rec);
}

/* Whether two attempts failed the same way. A NaN or inf from the job's data or model
 * shows as a non-finite loss on the workers with the head and as a non-finite gradient
 * norm on the others: whichever reports first names the attempt, so they are one kind. */
static int same_failure(const char *a, const char *b)
{
    static const char nf[] = "non-finite ";
    return !strcmp(a, b) || (!strncmp(a, nf, sizeof nf - 1) && !strncmp(b, nf, sizeof nf - 1));
}

/* An attempt at the running step failed with no loss to blame: a non-finite loss or
 * gradient norm, a worker's step_failed (who: the worker, NULL for the coordinator's own
 * finding), an evaluation that failed (abort_step 0: the step is committed). Nothing of it
 * is committed; it is redone under a new plan (new links, a new NCCL world), at most
 * PL_COORD_STEP_ATTEMPTS times in all: a failure that keeps coming back, the same way on
 * every attempt, is the job's (its data, its model), not a node's, and ends the job. */
static void step_attempt_failed(pl_coord *c, const char *who, const char *why, int abort_step)
{
    if (c->fail_step != c->step) {
        c->fail_step = c->step;
        c->fail_attempts = 0;
        c->fail_same = 1;
        snprintf(c->fail_reason, sizeof c->fail_reason, "%s", why);
    } else if (!same_failure(c->fail_reason, why)) {
        c->fail_same = 0;
    }
    c->fail_attempts++;
    if (abort_step)
        to_pipeline_workers(c, PL_MSG_ABORT, why);
    if (c->fail_attempts >= PL_COORD_STEP_ATTEMPTS) {
        char reason[700];
        snprintf(reason, sizeof reason, "step %lld failed %d times%s: %.400s",
                 (long long)c->step, c->fail_attempts,
                 c->fail_same ? ", every time the same way (a bug in the job or its data, not a "
                                "node failure)"
                              : "",
                 why);
        set_failed(c, reason);
        return;
    }
    if (who)
        add_cause(c, "step failed on %s (%.200s)", who, why);
    else
        add_cause(c, "step failed (%s%.200s)", "", why);
    replan_soon(c);
}

/* Every live pipeline worker reported and reduced: the gradient norm, the scale and the
 * learning rate, then commit (with save when a checkpoint is due or retried). */
void check_reduced_complete(pl_coord *c)
{
    if (c->phase != PL_COORD_RUNNING)
        return;
    for (; c->scan_reduced < c->nw; c->scan_reduced++) {
        const cworker *w = &c->w[c->scan_reduced];
        if (w->live && in_pipes(c, c->scan_reduced) && (!w->reported || !w->reduced))
            return;
    }
    c->norm = sqrt(c->sumsq);
    if (!isfinite(c->norm)) { /* finite shares whose sum is not */
        step_attempt_failed(c, NULL, "non-finite gradient norm (inf)", 1);
        return;
    }
    double clip = c->cfg.grad_clip;
    c->grad_scale = clip > 0 && c->norm > clip ? clip / c->norm : 1.0;
    c->lr = pl_lr_at(c->cfg.lr, c->cfg.lr_cosine, c->cfg.lr_warmup, c->cfg.lr_min_ratio,
                     (int)c->step, (int)c->cfg.steps);
    c->commit_save = pl_checkpoint_due(c->cfg.checkpoint_dir, c->cfg.checkpoint_every,
                                       c->cfg.steps, c->step + 1) ||
                     (c->ckpt_retry && c->cfg.checkpoint_dir && c->cfg.checkpoint_dir[0]);
    if (c->commit_save) {
        c->ckpt_retry = 0;
        c->ckpt_writing = c->step + 1;
    }
    c->phase = PL_COORD_COMMITTING;
    to_pipeline_workers(c, PL_MSG_COMMIT, "");
}

/* Every live pipeline worker committed: the step boundary. */
void check_committed_complete(pl_coord *c)
{
    if (c->phase != PL_COORD_COMMITTING)
        return;
    for (; c->scan_committed < c->nw; c->scan_committed++) {
        const cworker *w = &c->w[c->scan_committed];
        if (w->live && in_pipes(c, c->scan_committed) && !w->committed)
            return;
    }
    step_boundary(c);
}

/* The live worker for a message of generation gen, or -1 with *rc set. */
int gen_check(pl_coord *c, const char *name, int64_t gen, int *rc)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0) {
        *rc = PL_COORD_ERR;
        return -1;
    }
    if (gen != c->gen) {
        *rc = gen < c->gen ? PL_COORD_IGNORED
                           : fail_err(c, "worker \"%s\": generation %lld is ahead of %lld", name,
                                      (long long)gen, (long long)c->gen);
        return -1;
    }
    return i;
}

/* A step message for the running step from a pipeline worker? */
static int step_check(pl_coord *c, const char *name, int64_t gen, int64_t step,
                      pl_coord_phase_t phase, int *rc)
{
    int i = gen_check(c, name, gen, rc);
    if (i < 0)
        return -1;
    if (c->phase != phase || step != c->step || !in_pipes(c, i)) {
        *rc = PL_COORD_IGNORED;
        return -1;
    }
    return i;
}

int pl_coord_report(pl_coord *c, const char *name, int64_t gen, const pl_msg_report *r)
{
    int rc = PL_COORD_OK;
    if (!r)
        return fail_err(c, "report: NULL");
    int i = step_check(c, name, gen, r->step, PL_COORD_RUNNING, &rc);
    if (i < 0)
        return rc;
    if (c->w[i].reported)
        return PL_COORD_IGNORED;
    c->w[i].reported = 1;
    const int bad_loss = r->has_loss && !isfinite(r->loss);
    if (bad_loss || !isfinite(r->grad_sumsq)) { /* never committed: abort at once */
        char why[96];
        const double v = bad_loss ? r->loss : r->grad_sumsq;
        snprintf(why, sizeof why, "non-finite %s (%s)", bad_loss ? "loss" : "gradient norm",
                 isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        step_attempt_failed(c, name, why, 1);
        return PL_COORD_OK;
    }
    c->sumsq += r->grad_sumsq;
    if (r->has_loss) {
        c->loss_sum += r->loss;
        c->nloss++;
    }
    check_reduced_complete(c);
    return PL_COORD_OK;
}

/* reduced (in RUNNING) and committed (in COMMITTING): a pipeline worker's word that
 * its part of the running step is done, counted once; the last one completes the phase. */
static int step_done(pl_coord *c, const char *name, int64_t gen, int64_t step,
                     pl_coord_phase_t phase)
{
    int rc = PL_COORD_OK;
    int i = step_check(c, name, gen, step, phase, &rc);
    if (i < 0)
        return rc;
    int *done = phase == PL_COORD_RUNNING ? &c->w[i].reduced : &c->w[i].committed;
    if (*done)
        return PL_COORD_IGNORED;
    *done = 1;
    if (phase == PL_COORD_RUNNING)
        check_reduced_complete(c);
    else
        check_committed_complete(c);
    return PL_COORD_OK;
}

int pl_coord_reduced(pl_coord *c, const char *name, int64_t gen, int64_t step)
{
    return step_done(c, name, gen, step, PL_COORD_RUNNING);
}

int pl_coord_committed(pl_coord *c, const char *name, int64_t gen, int64_t step)
{
    return step_done(c, name, gen, step, PL_COORD_COMMITTING);
}

int pl_coord_copy_done(pl_coord *c, const char *name, int64_t gen, int64_t bytes)
{
    int rc = PL_COORD_OK;
    int i = gen_check(c, name, gen, &rc);
    if (i < 0)
        return rc;
    if (c->phase != PL_COORD_COPYING || !c->w[i].got_plan || c->w[i].copy_done)
        return PL_COORD_IGNORED;
    c->w[i].copy_done = 1;
    if (c->nrec > 0 && c->rec[c->nrec - 1].generation == c->gen && bytes > 0)
        c->rec[c->nrec - 1].bytes_copied += bytes;
    check_copy_complete(c);
    return PL_COORD_OK;
}

int pl_coord_eval_done(pl_coord *c, const char *name, int64_t gen, const pl_msg_eval_done *e)
{
    int rc = PL_COORD_OK;
    if (!e)
        return fail_err(c, "eval_done: NULL");
    int i = gen_check(c, name, gen, &rc);
    if (i < 0)
        return rc;
    if (c->phase != PL_COORD_EVALUATING || e->step != c->eval_rec.step || !in_pipes(c, i) ||
        c->w[i].evaluated)
        return PL_COORD_IGNORED;
    c->w[i].evaluated = 1;
    if (e->has_loss) {
        c->val_sum += e->loss;
        c->val_batches += e->batches;
    }
    check_eval_complete(c);
    return PL_COORD_OK;
}

/* A worker's step failed with no loss known here (an NCCL error or deadline, a broken
 * link): nothing else would end that step, so it is aborted and the plan made again in
 * a new generation (new links, a new NCCL world). A loss behind the failure joins the
 * same plan (SETTLING); PL_COORD_STEP_ATTEMPTS and maxResets bound a failure that keeps
 * coming back. */
int step_failed(pl_coord *c, const char *name, int64_t gen, int64_t step,
                       const char *reason)
{
    int rc = PL_COORD_OK;
    if (c->phase == PL_COORD_EVALUATING && c->eval_pending && step == c->eval_rec.step) {
        /* the evaluation of a committed step: a new plan, and the evaluation under it */
        int i = gen_check(c, name, gen, &rc);
        if (i < 0 || !in_pipes(c, i))
            return i < 0 ? rc : PL_COORD_IGNORED;
        char why[PL_PROTO_TEXT_MAX + 32];
        snprintf(why, sizeof why, "evaluation: %s", reason);
        step_attempt_failed(c, name, why, 0);
        return PL_COORD_OK;
    }
    if (step_check(c, name, gen, step, PL_COORD_RUNNING, &rc) < 0)
        return rc;
    step_attempt_failed(c, name, reason, 1);
    return PL_COORD_OK;
}

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The median time of the last committed steps; -1 before PL_COORD_STEP_TIMES_MIN were
 * timed (the first steps warm up). */
int64_t median_step_ms(const pl_coord *c)
{
    if (c->nstep_ms < PL_COORD_STEP_TIMES_MIN)
        return -1;
    int64_t t[PL_COORD_STEP_TIMES];
    const int n = c->nstep_ms < PL_COORD_STEP_TIMES ? c->nstep_ms : PL_COORD_STEP_TIMES;
    memcpy(t, c->step_ms, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_i64);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

int64_t pl_coord_step_deadline(const pl_coord *c)
{
    if (c->cfg.step_timeout_ms)
        return c->cfg.step_timeout_ms > 0 ? c->cfg.step_timeout_ms : -1;
    const int64_t median = median_step_ms(c);
    if (median < 0)
        return -1;
    const int64_t floor_ms =
        (int64_t)PL_COORD_STEP_TIMEOUT_BEATS * c->misses * c->cfg.heartbeat_ms;
    const int64_t k = PL_COORD_STEP_TIMEOUT_FACTOR * median;
    return k > floor_ms ? k : floor_ms;
}

/* The step after the current one may be committed without messages: not evaluated, not
 * the last, no joined worker to place, no checkpoint to retry. */
static int skippable(const pl_coord *c)
{
    int64_t next = c->step + 1;
    int every = c->cfg.eval_every;
    if (next >= c->cfg.steps || (every > 0 && next % every == 0) || c->ckpt_retry)
        return 0;
    int check = c->cfg.hosts_added_check_every > 1 ? c->cfg.hosts_added_check_every : 1;
    return !(c->join_pending && next % check == 0);
}

int64_t pl_coord_skip_steps(pl_coord *c, int64_t n, int quiet, int64_t step_ms)
{
    if (c->phase != PL_COORD_RUNNING || c->pending || n <= 0)
        return 0;
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].reported || c->w[i].reduced)
            return 0;
    int64_t done = 0;
    int saved = 0;
    while (done < n && !saved && skippable(c)) {
        pl_coord_step_rec x = {.step = c->step, .loss = NAN, .norm = NAN, .grad_scale = 1.0,
                               .val_loss = NAN, .generation = c->gen};
        x.lr = pl_lr_at(c->cfg.lr, c->cfg.lr_cosine, c->cfg.lr_warmup, c->cfg.lr_min_ratio,
                        (int)c->step, (int)c->cfg.steps);
        memcpy(x.pipelines, c->cur.desc, sizeof x.pipelines);
        if (log_step(c, &x)) {
            set_failed(c, "coordinator: out of memory");
            return done;
        }
        if (c->fail_step == c->step)
            c->fail_step = -1;
        c->step++;
        done++;
        c->step_ms[c->nstep_ms++ % PL_COORD_STEP_TIMES] = step_ms;
        c->step_t0 += step_ms;
        saved = pl_checkpoint_due(c->cfg.checkpoint_dir, c->cfg.checkpoint_every, c->cfg.steps,
                                  c->step);
        if (saved)
            save_to_pipeline0(c, c->step, 0);
    }
    note_time(c, c->step_t0);
    if (done && quiet)
        reset_step_flags(c);
    else if (done)
        start_step(c);
    return done;
}
