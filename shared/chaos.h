/* Fault injection for `pliant run --chaos SPEC` and spot-instance traces.
 *
 * SPEC is a comma-separated list of events:
 *   kill:W@step=S        SIGKILL worker W (numbered from 0 in start order) when step S begins
 *   kill:pQ.J@step=S     (kill or term) the worker at stage J of pipeline Q of the plan then
 *                        running (placement follows registration order, which varies)
 *   kill:W@t=SECONDS     SIGKILL worker W SECONDS after the job started
 *   term:W@step=S        SIGTERM (the preemption notice) when step S begins
 *   term:W@t=SECONDS
 *   add:K@step=S         start K new workers when step S begins
 *   add:K@t=SECONDS
 *   add:K@waiting        (any action) once the job waits for workers (too few to run)
 *   kill:W@checkpoint=S  (any action) once the checkpoint of step S is complete (tests that
 *                        need a checkpoint written in the background to exist first)
 *   trace:FILE[:SPEEDUP] replay a trace of ../shared/traces/ format, time-compressed by SPEEDUP
 *
 * A trace is CSV without header, one event per row, `t_ms,add|remove,nodeN`, rows sorted by time,
 * CRLF or LF line ends; or Bamboo's node counts, `YYYY-MM-DD, HH:MM:SS, COUNT` (spot_trace.h:
 * a rise adds nodes, a drop removes the most recently added live ones). Replaying starts at the trace's first timestamp and maps its nodes to
 * workers: the nodes added at that first timestamp are the job's initial workers in order of
 * appearance, later `add` rows start new workers, and a `remove` kills (SIGKILL) the worker that
 * node maps to. */
#ifndef PL_CHAOS_H
#define PL_CHAOS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { PL_CHAOS_KILL, PL_CHAOS_TERM, PL_CHAOS_ADD } pl_chaos_action;
typedef enum {
    PL_CHAOS_AT_STEP,
    PL_CHAOS_AT_TIME,
    PL_CHAOS_WHEN_WAITING,
    PL_CHAOS_AT_CHECKPOINT
} pl_chaos_when;

typedef struct {
    pl_chaos_action action;
    pl_chaos_when when;
    int64_t step;  /* PL_CHAOS_AT_STEP; PL_CHAOS_AT_CHECKPOINT: the checkpoint's step */
    int64_t t_ms;  /* PL_CHAOS_AT_TIME, after the job started (trace times from its first
                      timestamp, divided by SPEEDUP) */
    int worker;    /* KILL, TERM: worker number in start order; −1: by place (pipe, stage) */
    int pipe, stage; /* KILL, TERM with pQ.J: the stable plan's pipeline Q, stage J */
    int count;     /* ADD: workers to start */
} pl_chaos_event;

typedef struct {
    int n;
    pl_chaos_event *events; /* step events in spec order, then time events sorted by time */
    int initial_workers;    /* a trace's nodes added at its first timestamp (0 when no trace) */
} pl_chaos;

/* Parses SPEC; a trace file is read and turned into time events (worker numbers follow the
 * trace's node order: initial nodes 0..n0−1, each `add` the next number). Errors name the event
 * ("--chaos event 2 (kill:x@step=3): worker must be a number"), or the trace file and line. */
int pl_chaos_parse(const char *spec, pl_chaos *out, char *err, size_t errlen);
void pl_chaos_free(pl_chaos *c);

/* One row of a trace. */
typedef struct {
    int64_t t_ms;
    int add;     /* 1 add, 0 remove */
    int node;    /* N of nodeN */
} pl_trace_event;

/* Reads a trace file; validates format, sorted times, unique adds and removes of live nodes. */
int pl_trace_read(const char *path, pl_trace_event **out, int *n, char *err, size_t errlen);

#endif
