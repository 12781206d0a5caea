/* Where workers run: one small interface between the controller and either
 * local child processes (`pliant run`) or Kubernetes Pods (the operator), so
 * that everything above it is shared (ARCHITECTURE.md, "The two programs"). */
#ifndef PLIANT_BACKEND_H
#define PLIANT_BACKEND_H

#include <stddef.h>

#define PL_WORKER_NAME_MAX 64

typedef struct {
    char name[PL_WORKER_NAME_MAX]; /* unique among the backend's workers */
    char *const *argv;             /* the worker's command line */
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

typedef struct pl_backend pl_backend;

typedef struct {
    /* Starts a worker. −1 with err (duplicate name, exec failure seen at once). */
    int (*create)(pl_backend *b, const pl_worker_spec *w, char *err, size_t errlen);
    /* Sends a signal: SIGKILL deletes (spot reclaim, chaos), SIGTERM is the
     * preemption notice. −1 with err if no such live worker. */
    int (*signal)(pl_backend *b, const char *name, int sig, char *err, size_t errlen);
    /* Waits up to timeout_ms for a worker to end: 1 and *ev filled, 0 on timeout, −1 on error. */
    int (*watch)(pl_backend *b, pl_worker_event *ev, int timeout_ms);
    /* Live workers. */
    int (*count)(const pl_backend *b);
    /* Kills and reaps every worker, frees the backend. */
    void (*destroy)(pl_backend *b);
} pl_backend_ops;

struct pl_backend {
    const pl_backend_ops *ops;
};

/* Workers as child processes of this process. */
pl_backend *pl_backend_local_new(char *err, size_t errlen);

#endif
