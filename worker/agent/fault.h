/* Fault injection for the recovery tests (docs/runtime.md "pliant run today"): with
 * PLIANT_FAULT_<worker> = sync:STEP or copy:GENERATION in its environment, the worker
 * SIGKILLs itself in the middle of an operation, as a preempted node would die: between
 * two all-reduces of step STEP, or after the first tensor it sends in a layer copy of plan
 * GENERATION. badtoken:STEP gives its first sample of step STEP (every attempt at it) a
 * token id outside the vocabulary, as bad data the loader could not see would: the
 * encoder's bound check turns the step's loss and norm to NaN.
 *
 * Threads: pl_fault_parse and pl_fault_set_plan run on the compute thread; the hooks run on
 * the thread of the operation (the step's comm thread, a copy's sender thread) while the
 * compute thread waits for it. The struct is the caller's. */
#ifndef PLIANT_FAULT_H
#define PLIANT_FAULT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    enum { PL_FAULT_NONE, PL_FAULT_SYNC, PL_FAULT_COPY, PL_FAULT_BADTOKEN } kind;
    int64_t at;          /* the step (sync, badtoken) or the plan generation (copy) */
    int64_t gen;         /* the plan being installed or run */
    int groups;          /* all-reduces started in the faulty step */
    const char *worker;  /* for the log line (borrowed) */
} pl_fault;

/* Reads PLIANT_FAULT_<worker>; no variable: no fault. −1 with err when it is malformed. */
int pl_fault_parse(pl_fault *f, const char *worker, char *err, size_t errlen);

/* The plan generation now installed (a copy fault fires in its plan only). */
void pl_fault_set_plan(pl_fault *f, int64_t gen);

/* The worker step's before_reduce hook (ctx = f) for step, or NULL when this step has no
 * fault: it kills the worker before the step's second all-reduce. */
typedef void pl_fault_reduce_hook(void *ctx, int key);
pl_fault_reduce_hook *pl_fault_step_hook(pl_fault *f, int64_t step);

/* The TCP copier's after_send hook (ctx = f): kills the worker in a copy fault's plan. */
void pl_fault_after_copy_send(void *ctx);

/* A badtoken fault at step: the first of the n tokens is made an id no vocabulary of at
 * most 65535 has (65535); 1 when it did. */
int pl_fault_bad_tokens(const pl_fault *f, int64_t step, int32_t *tokens, size_t n);

#endif
