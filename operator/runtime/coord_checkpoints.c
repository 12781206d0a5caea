/* The coordinator's checkpoints (coordinator.c): the slots of those being written, which
 * layers' `saved` came, the worker asked to complete one (checkpoint.json), attempts given
 * up (a write failed, a writer lost) and retried; and the resume point, the newest
 * complete checkpoint the workers report at register. */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A checkpoint slot emptied (its step 0: free). */
static void clear_slot(csaving *slot)
{
    free(slot->covered);
    memset(slot, 0, sizeof *slot);
}

/* A slot for the checkpoint of `step`, in place of the oldest one; NULL: out of memory. */
static csaving *new_saving_slot(pl_coord *c, int64_t step)
{
    csaving *slot = &c->saving[0];
    for (int k = 1; k < SAVING_SLOTS; k++)
        if (c->saving[k].step < slot->step)
            slot = &c->saving[k];
    clear_slot(slot);
    slot->asked = -1;
    if (!(slot->covered = calloc((size_t)c->nlayers, 1)))
        return NULL;
    slot->step = step;
    return slot;
}

/* The slot of the checkpoint of `step`, or NULL. */
csaving *saving_slot(pl_coord *c, int64_t step)
{
    for (int k = 0; k < SAVING_SLOTS; k++)
        if (c->saving[k].step == step)
            return &c->saving[k];
    return NULL;
}

/* A restart from the checkpoint of `step`: the attempts at later checkpoints, failed with
 * their writers or in flight, are void; those steps' checkpoints are written afresh when
 * their commits come again (a failed slot left would ignore the new attempt's `saved`). */
void forget_saving_after(pl_coord *c, int64_t step)
{
    for (int k = 0; k < SAVING_SLOTS; k++)
        if (c->saving[k].step > step)
            clear_slot(&c->saving[k]);
    if (c->ckpt_writing > step)
        c->ckpt_writing = 0;
    c->ckpt_retry = 0;
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].writing > step)
            c->w[i].writing = 0;
}

/* Frees the slots of checkpoints up to `step` (complete, or given up). */
static void drop_saving(pl_coord *c, int64_t step)
{
    for (int k = 0; k < SAVING_SLOTS; k++)
        if (c->saving[k].step && c->saving[k].step <= step)
            clear_slot(&c->saving[k]);
}

/* Worker i (of the current plan) was asked to write its layers of the checkpoint of step. */
void note_writer(pl_coord *c, int i, int64_t step)
{
    cworker *w = &c->w[i];
    w->writing = step;
    node_layers(c, c->cur.p[w->pipe].nnodes, w->pos, &w->write_b, &w->write_e);
}

/* The checkpoint of step `step` to pipeline 0's workers (save), as a commit with save asks;
 * with note_writers, each is known as a writer of it until its `saved` (note_writer). */
void save_to_pipeline0(pl_coord *c, int64_t step, int note_writers)
{
    for (int i = 0; i < c->nw; i++) {
        if (!c->w[i].live || !in_pipes(c, i) || c->w[i].pipe != 0)
            continue;
        pl_msg *m = push_msg(c, i, PL_MSG_SAVE, c->gen);
        if (m)
            m->u.save.step = step;
        if (note_writers)
            note_writer(c, i, step);
    }
}

/* The last checkpoint written again: pipeline 0's workers (every layer once) hold the
 * state after the last step, unchanged since; each writes its layers anew (save) and
 * answers saved. */
void resave(pl_coord *c, csaving *slot)
{
    memset(slot->covered, 0, (size_t)c->nlayers);
    slot->failed = slot->completing = 0;
    slot->asked = -1;
    c->ckpt_writing = slot->step;
    save_to_pipeline0(c, slot->step, 1);
}

/* complete_checkpoint of the slot's step to a worker (none live: a later one is asked). */
void ask_completion(pl_coord *c, csaving *slot)
{
    slot->asked = pick_worker(c);
    if (slot->asked < 0)
        return;
    pl_msg *m = push_msg(c, slot->asked, PL_MSG_COMPLETE_CHECKPOINT, c->gen);
    if (m)
        m->u.complete_checkpoint.step = slot->step;
}

/* A checkpoint attempt failed (a layer or its checkpoint.json not written): it is given up
 * and the next checkpoint retries, at the next commit, or for the last step's, written
 * again at once. PL_COORD_CHECKPOINT_ATTEMPTS in a row fail the job: a job whose
 * checkpoints cannot be written must not end as if it had them. */
static void checkpoint_failed(pl_coord *c, csaving *slot, const char *why)
{
    c->ckpt_fail_step = slot->step;
    snprintf(c->ckpt_fail, sizeof c->ckpt_fail, "%s", why);
    slot->failed = 1;
    slot->completing = 0;
    c->ckpt_failed_total++;
    if (++c->ckpt_failures >= PL_COORD_CHECKPOINT_ATTEMPTS) {
        char reason[700];
        snprintf(reason, sizeof reason, "checkpoints cannot be written: %d attempts in a row "
                 "failed, the last (step %lld): %.400s", c->ckpt_failures,
                 (long long)slot->step, why);
        set_failed(c, reason);
        return;
    }
    if (slot->step < c->cfg.steps)
        c->ckpt_retry = 1;
    else if (c->phase == PL_COORD_SAVING)
        resave(c, slot);
    /* else: the last step's commit is not through yet; SAVING writes it again */
}

/* Worker i, lost, may have been writing its layers of the checkpoint in flight (pipeline 0
 * writes it): without its `saved` that checkpoint can never complete, as the layers are
 * held by other workers now. It is given up at once, so that the next commit writes one
 * (or, for the last step's, a new plan's pipeline 0 writes it again: after_step) rather
 * than the job going on without the checkpoint it was told of, or waiting for it forever.
 * A loss is not the storage's fault: it does not count toward
 * PL_COORD_CHECKPOINT_ATTEMPTS. */
void writer_lost(pl_coord *c, int i)
{
    cworker *w = &c->w[i];
    const int64_t step = w->writing;
    w->writing = 0;
    if (step <= c->ckpt_last || step < c->ckpt_writing)
        return; /* complete, or a newer one is being written */
    csaving *slot = saving_slot(c, step);
    if (!slot && !(slot = new_saving_slot(c, step)))
        return;
    if (slot->completing || slot->failed)
        return;
    const int b = w->write_b, e = w->write_e;
    int saved = 1;
    for (int l = b; l < e; l++)
        saved &= slot->covered[l] != 0;
    if (saved)
        return;
    slot->failed = 1;
    c->ckpt_fail_step = step;
    snprintf(c->ckpt_fail, sizeof c->ckpt_fail,
             "%s was gone before its layers [%d, %d) were saved; %s", w->name, b, e,
             step < c->cfg.steps ? "the next step writes a checkpoint"
                                 : "written again under the next plan");
    c->ckpt_failed_total++;
    if (step < c->cfg.steps)
        c->ckpt_retry = 1;
}

/* Worker i left the job (leaving, then stop) with its part of a checkpoint unreported
 * and is now gone for good (its connection or process ended): that checkpoint is given up
 * as for a loss; the last step's is written again at once by the plan's pipeline 0,
 * which it is no longer in. */
void writer_gone_after_leaving(pl_coord *c, int i)
{
    const int64_t step = c->w[i].writing;
    if (!step || c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED)
        return;
    writer_lost(c, i);
    csaving *slot = saving_slot(c, step);
    if (slot && slot->failed && step >= c->cfg.steps && c->phase == PL_COORD_SAVING)
        resave(c, slot);
}

int pl_coord_saved(pl_coord *c, const char *name, const pl_msg_saved *sv)
{
    c->err[0] = 0;
    if (!sv)
        return fail_err(c, "saved: NULL");
    if (worker_index(c, name) < 0)
        return fail_err(c, "unknown worker \"%s\"", name ? name : "(null)");
    /* any generation: the state after step s is the same in every plan */
    if (c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED || sv->step <= c->ckpt_last ||
        sv->step > c->cfg.steps || sv->layer_end > c->nlayers)
        return PL_COORD_IGNORED;
    csaving *slot = saving_slot(c, sv->step);
    if (!slot && !(slot = new_saving_slot(c, sv->step)))
        return fail_err(c, "out of memory");
    if (slot->completing || slot->failed)
        return PL_COORD_IGNORED;
    if (sv->error[0]) {
        char why[PL_PROTO_TEXT_MAX + 64];
        snprintf(why, sizeof why, "%.400s (layers [%d, %d) on %s)", sv->error, sv->layer_begin,
                 sv->layer_end, name);
        checkpoint_failed(c, slot, why);
        return PL_COORD_OK;
    }
    cworker *w = &c->w[worker_index(c, name)];
    if (w->writing == sv->step)
        w->writing = 0; /* reported */
    memset(slot->covered + sv->layer_begin, 1, (size_t)(sv->layer_end - sv->layer_begin));
    for (int l = 0; l < c->nlayers; l++)
        if (!slot->covered[l])
            return PL_COORD_OK;
    slot->completing = 1; /* every layer is written: one worker writes checkpoint.json */
    ask_completion(c, slot);
    return PL_COORD_OK;
}

int pl_coord_checkpoint_done(pl_coord *c, const char *name, int64_t step, const char *error)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0)
        return PL_COORD_ERR;
    csaving *slot = NULL;
    for (int k = 0; k < SAVING_SLOTS && !slot; k++)
        if (c->saving[k].step == step && c->saving[k].completing)
            slot = &c->saving[k];
    if (!slot || slot->asked != i)
        return PL_COORD_IGNORED; /* asked of another worker since, or complete already */
    if (error && error[0]) {
        char why[PL_PROTO_TEXT_MAX + 64];
        snprintf(why, sizeof why, "%.400s (on %s)", error, name);
        checkpoint_failed(c, slot, why);
        return PL_COORD_OK;
    }
    /* an older checkpoint completing after a newer one failed does not end the run of
     * failures in a row */
    if (step >= c->ckpt_fail_step)
        c->ckpt_failures = 0;
    if (step > c->ckpt_last)
        c->ckpt_last = step;
    drop_saving(c, c->ckpt_last);
    if (c->phase == PL_COORD_SAVING && c->ckpt_last >= c->cfg.steps)
        finish_job(c);
    return PL_COORD_OK;
}

/* "w0: 8, w1: 4, w2: cannot read (why)": what each live worker reported. */
static void resume_reports(const pl_coord *c, char *buf, size_t len)
{
    buf[0] = 0;
    for (int i = 0; i < c->nw; i++) {
        const cworker *w = &c->w[i];
        if (!w->live || !w->has_ckpt)
            continue;
        if (w->ckpt_err[0])
            appendf(buf, len, "%s%s: cannot read (%s)", buf[0] ? ", " : "", w->name, w->ckpt_err);
        else
            appendf(buf, len, "%s%s: %lld", buf[0] ? ", " : "", w->name, (long long)w->ckpt_step);
    }
}

/* The newest checkpoint step a live worker can read (0: none); how many could read the
 * directory, how many could not, and whether those that could disagree. */
int64_t newest_reported(const pl_coord *c, int *nread, int *nerr, int *differ)
{
    int64_t best = 0;
    *nread = *nerr = *differ = 0;
    for (int i = 0; i < c->nw; i++) {
        const cworker *w = &c->w[i];
        if (!w->live || !w->has_ckpt)
            continue;
        if (w->ckpt_err[0]) {
            (*nerr)++;
            continue;
        }
        *differ |= *nread && w->ckpt_step != best;
        if (!(*nread)++ || w->ckpt_step > best)
            best = w->ckpt_step;
    }
    return best;
}

/* The first plan's checkpoint: the newest complete one that a live worker reported at
 * register. 1 when the job ended here (its last step's checkpoint exists: DONE; no worker
 * can read the directory: FAILED), else 0. */
int decide_resume(pl_coord *c)
{
    int nread, nerr, differ;
    const int64_t best = newest_reported(c, &nread, &nerr, &differ);
    char seen[400];
    resume_reports(c, seen, sizeof seen);
    if (!nread && nerr) {
        char why[512];
        snprintf(why, sizeof why, "no worker can read the checkpoint directory: %s", seen);
        set_failed(c, why);
        return 1;
    }
    if (differ || nerr)
        snprintf(c->resume_note, sizeof c->resume_note,
                 "the workers disagree on the newest checkpoint (%s): resuming from step %lld",
                 seen, (long long)best);
    c->resume_step = c->ckpt_last = c->step = best;
    if (best < c->cfg.steps)
        return 0;
    snprintf(c->reason, sizeof c->reason,
             "the checkpoint of step %lld is the last step: nothing to do", (long long)best);
    c->phase = PL_COORD_DONE;
    stop_all(c, "nothing to do", 0);
    return 1;
}
