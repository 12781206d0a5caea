/* Fault injection, a test hook of the recovery tests and of the fault matrix
 * (docs/faults.md). PLIANT_FAULT_<worker>, else PLIANT_FAULT (every worker), holds up to
 * PL_FAULT_MAX faults separated by ';', each PHASE:AT[:ACTION][@RANK[,RANK...]]: the worker
 * does ACTION to itself at an exact point of PHASE, as a node failing there would:
 *
 *   forward:STEP     before the forward of its pipeline's last microbatch of step STEP
 *                    (earlier microbatches are in flight at the neighbouring stages)
 *   backward:STEP    before the backward of that microbatch (no all-reduce started yet)
 *   sync:STEP        between two layer all-reduces of step STEP (before the second)
 *   copy:GENERATION  after the first tensor it sends in a layer copy of plan GENERATION
 *   shadow:GENERATION  after the first state buffer (its weights) it sends to its shadow's
 *                    holder in plan GENERATION's refill (strategy redundant)
 *   commit:STEP      on the commit of step STEP, before applying it (others may have)
 *   checkpoint:STEP  once its layers of the checkpoint of step STEP are written, before
 *                    it tells the coordinator (`saved`)
 *
 * ACTION: kill (the default: SIGKILL), stop (SIGSTOP: the process hangs, heartbeats
 * stop), term (SIGTERM: the preemption notice; the worker goes on) or cut (its control
 * connection is closed; the worker goes on and connects again) or stall (the thread of the
 * operation blocks for good, the control thread and its heartbeats go on: a compute thread
 * stuck in a kernel or a deadlock; only the step deadline finds it). @RANK: only where the
 * worker has one of these ranks in the first plan (copy, shadow: in plan GENERATION). Workers
 * register, and so get their places, in no fixed order: a rank names a place, pipelines
 * flattened in stage order; and a step redone under a new plan, where another worker has
 * that rank, does not fire it again. Each fault fires once per worker.
 * badtoken:STEP (no action) gives its first sample of step STEP (every attempt at it) a
 * token id outside the vocabulary, as bad data the loader could not see would: the
 * encoder's bound check turns the step's loss and norm to NaN.
 *
 * Threads: pl_fault_parse, pl_fault_set_plan and pl_fault_begin_step run on the compute
 * thread; the hooks on the thread of the operation (the compute thread, the step's comm
 * thread, a copy's sender thread, the checkpoint writer) while the compute thread waits
 * for it or goes on; pl_fault_take_cut on the control thread. The struct is the caller's. */
#ifndef PLIANT_FAULT_H
#define PLIANT_FAULT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    PL_FAULT_NONE,
    PL_FAULT_FORWARD,
    PL_FAULT_BACKWARD,
    PL_FAULT_SYNC,
    PL_FAULT_COPY,
    PL_FAULT_SHADOW,
    PL_FAULT_COMMIT,
    PL_FAULT_CHECKPOINT,
    PL_FAULT_BADTOKEN
} pl_fault_phase;

typedef enum {
    PL_FAULT_KILL,
    PL_FAULT_STOP,
    PL_FAULT_TERM,
    PL_FAULT_CUT,
    PL_FAULT_STALL
} pl_fault_action;

#define PL_FAULT_MAX 4

typedef struct {
    pl_fault_phase kind;
    pl_fault_action action;
    int64_t at;          /* the step, or the plan generation (copy, shadow) */
    uint64_t ranks;      /* bit r: fires at plan rank r; 0: at any */
    atomic_int fired;    /* once */
} pl_fault_spec;

typedef struct {
    int n;
    pl_fault_spec f[PL_FAULT_MAX];
    int64_t gen;         /* the plan being installed or run */
    int rank;            /* this worker's rank in it; −1: idle */
    int64_t step;        /* the step running (forward, backward) */
    int last_mb;         /* its pipeline's last microbatch, in the stage's numbering */
    int groups;          /* all-reduces started in the step */
    atomic_int cut;      /* a cut asked for, not yet done by the control thread */
    const char *worker;  /* for the log line (borrowed) */
} pl_fault;

/* Reads PLIANT_FAULT_<worker> or PLIANT_FAULT; neither: no fault. −1 with err (naming the
 * variable) when it is malformed. */
int pl_fault_parse(pl_fault *f, const char *worker, char *err, size_t errlen);

/* The plan generation now installed (a copy fault fires in its plan only) and this
 * worker's rank in it (−1: idle). */
void pl_fault_set_plan(pl_fault *f, int64_t gen, int rank);

/* Step `step` starts with nmb microbatches in this worker's pipeline. */
void pl_fault_begin_step(pl_fault *f, int64_t step, int nmb);

/* The stage's before_op hook (ctx = f; stage.h): forward and backward faults. */
void pl_fault_before_op(void *ctx, int backward, int mb);

/* The worker step's before_reduce hook (ctx = f) for step, or NULL when this step has no
 * fault: it fires before the step's second all-reduce. */
typedef void pl_fault_reduce_hook(void *ctx, int key);
pl_fault_reduce_hook *pl_fault_step_hook(pl_fault *f, int64_t step);

/* The TCP copier's after_send hook (ctx = f): fires in a copy fault's plan. */
void pl_fault_after_copy_send(void *ctx);

/* This worker sent its weights to its shadow's holder: fires in a shadow fault's plan. */
void pl_fault_after_shadow_send(pl_fault *f);

/* The commit of step arrived (before it is applied). */
void pl_fault_on_commit(pl_fault *f, int64_t step);

/* This worker's layers of the checkpoint of step are written (before `saved`). */
void pl_fault_on_saved(pl_fault *f, int64_t step);

/* 1 once when a cut fault fired: the control thread closes its connection. */
int pl_fault_take_cut(pl_fault *f);

/* A badtoken fault at step: the first of the n tokens is made an id no vocabulary of at
 * most 65535 has (65535); 1 when it did. */
int pl_fault_bad_tokens(const pl_fault *f, int64_t step, int32_t *tokens, size_t n);

#endif
