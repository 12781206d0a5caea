/* Workers as child processes of this process (`pliant run`): started with an
 * environment of their own, signalled, and waited for with a timeout through
 * pidfds. The operator starts its workers as Pods through its reconcile instead
 * (docs/runtime.md "Where workers run"): there is no interface over both.
 *
 * Single-threaded: one caller at a time. The set owns its children: each runs in
 * a process group of its own and is killed with this process
 * (PR_SET_PDEATHSIG); pl_local_workers_free kills and reaps those left. */
#ifndef PLIANT_LOCAL_WORKERS_H
#define PLIANT_LOCAL_WORKERS_H

#include <stddef.h>

#define PL_WORKER_NAME_MAX 64

typedef struct {
    char name[PL_WORKER_NAME_MAX]; /* unique among the live workers of the set */
    char *const *argv;             /* the worker's command line (borrowed during the call) */
    char *const *env;              /* extra "KEY=VALUE" entries (NULL-terminated), or NULL */
    const char *log_path;          /* stdout and stderr appended there; NULL inherits ours */
} pl_worker_spec;

typedef enum {
    PL_WORKER_EXITED, /* ended by itself: status */
    PL_WORKER_KILLED, /* ended by a signal: signal */
} pl_worker_end;

typedef struct {
    char name[PL_WORKER_NAME_MAX];
    pl_worker_end end;
    int status;
    int signal;
} pl_worker_event;

typedef struct pl_local_workers pl_local_workers;

pl_local_workers *pl_local_workers_new(char *err, size_t errlen);
/* Kills and reaps every worker left, frees the set. NULL is fine. */
void pl_local_workers_free(pl_local_workers *lw);

/* Starts a worker. −1 with err (duplicate name, exec failure seen at once). */
int pl_local_workers_start(pl_local_workers *lw, const pl_worker_spec *w, char *err,
                           size_t errlen);
/* Sends a signal to the worker's process group: SIGKILL is a spot reclaim or a
 * chaos kill, SIGTERM the preemption notice. −1 with err if no such live worker. */
int pl_local_workers_signal(pl_local_workers *lw, const char *name, int sig, char *err,
                            size_t errlen);
/* Waits up to timeout_ms for a worker to end: 1 and *ev filled (the worker is
 * reaped and leaves the set), 0 on timeout, −1 on error. */
int pl_local_workers_wait(pl_local_workers *lw, pl_worker_event *ev, int timeout_ms);
/* Live workers. */
int pl_local_workers_count(const pl_local_workers *lw);

#endif
