/* One TrainingJob driven to its end, the same for `pliant run` (local worker
 * processes) and the operator (worker Pods): the job (parsed), its plan
 * (job_plan.h; with spec.profile auto, made once a worker measured the model),
 * the coordinator (coordinator.h) behind its control server (coord_session.h)
 * with the job token and a TLS certificate, the time of each disruption and the
 * recovery time of each reconfiguration, samples per second. The driver touches
 * no file of the job: workers complete checkpoints, report the one to resume
 * from and measure the profile. Where the workers run is the front end's
 * business: it tells the driver when one is gone and reads what happened since
 * its last poll with pl_job_driver_next, printing or logging it its own way.
 *
 * Single-threaded: every function runs on the thread of the front end's loop,
 * which calls pl_job_driver_poll often. The driver owns everything it creates
 * (job, plan, coordinator, session, the certificate's directory) and frees it in
 * pl_job_driver_free; pointers it returns live as long as the driver. */
#ifndef PLIANT_JOB_DRIVER_H
#define PLIANT_JOB_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator.h"
#include "jobspec.h"

typedef struct pl_job_driver pl_job_driver;

/* Read by pl_job_driver_new and pl_job_driver_start (strings and arrays need to
 * live until start returns), except admit and user, kept for the driver's life. */
typedef struct {
    /* the job: a manifest's text (the operator), else the file at path (`pliant run`) */
    const char *manifest;
    const char *path;
    int steps;                  /* > 0: replaces spec.steps (pliant run --steps) */
    int gpus_per_node;          /* > 0: replaces spec.nodes.gpusPerNode */
    const char *checkpoint_dir; /* non-NULL: replaces spec.checkpoint.dir */
    const char *profile;        /* non-NULL: replaces spec.profile (pliant run --profile) */
    /* the first plan: n_start workers (raised to the least that can run one), or
     * those there after start_grace_ms when > 0; plans for up to
     * max(n_start, spec.nodes.max) workers */
    int n_start;
    int64_t start_grace_ms;
    /* the control server */
    const char *bind_host;      /* NULL: 127.0.0.1 */
    const char *cert_host;      /* the address workers dial, put in a fresh certificate */
    int port;                   /* > 0: this port; 0: the first free one of */
    int port_base, ports;       /*   port_base .. port_base + ports − 1, any free one when 0 */
    /* while the first free port is chosen (pl_job_driver_start only): nonzero for a port
     * that another owner claims though nothing listens on it yet (another job's Service
     * names it), skipped; NULL: none */
    int (*port_taken)(void *ctx, int port);
    void *port_ctx;
    const char *token;          /* the job token; NULL: a fresh one */
    const char *cert_pem;       /* certificate and key to serve (a new operator leader */
    const char *key_pem;        /*   reuses the Secret's); NULL: a fresh self-signed pair */
    /* NULL to admit a registering worker's name, else why not (NULL: any name) */
    const char *(*admit)(void *user, const char *name);
    void *user;
    /* a running plan to take over (a new operator leader; pl_coord_restore); npipes 0: none */
    const pl_coord_pipe *pipes;
    int npipes;
    int64_t generation, step;
    /* spec.profile auto: the profile a worker measured before (pl_job_driver_profile_json
     * of an earlier driver of the job, e.g. kept by the operator for a new leader): nothing
     * is measured again. NULL: a worker measures it. */
    const char *profile_json;
} pl_job_driver_config;

/* Reads the job (with the overrides); nothing runs yet. NULL and err on failure. */
pl_job_driver *pl_job_driver_new(const pl_job_driver_config *cfg, char *err, size_t errlen);
/* Plans the job (unless a worker is to measure its profile) and starts the coordinator
 * and its control server: 0, or -1 and err on failure. Once per driver. A job whose
 * newest complete checkpoint is of the last step ends at once (the coordinator DONE)
 * once the workers reported it. */
int pl_job_driver_start(pl_job_driver *d, char *err, size_t errlen);
/* Closes the server (the coordinator records the losses) and frees all. NULL is fine. */
void pl_job_driver_free(pl_job_driver *d);

/* Serves the control channel for up to timeout_ms, forwards the coordinator's
 * messages, ticks it, plans the job once its profile is measured and records what
 * happened for pl_job_driver_next. 0, or -1 and err when the server failed. */
int pl_job_driver_poll(pl_job_driver *d, int timeout_ms, char *err, size_t errlen);
/* Worker `name` ended (its process or Pod): the loss of that worker. 1 when the
 * coordinator learned it now, 0 when it knew (its connection closed first). */
int pl_job_driver_worker_gone(pl_job_driver *d, const char *name, const char *cause);
/* A disruption the driver cannot see (a kill just signalled) at at_ms (pl_now_ms):
 * the next reconfiguration's recovery counts from it unless an earlier one is pending. */
void pl_job_driver_disrupted(pl_job_driver *d, int64_t at_ms);
/* The zone of worker `name`'s node (known from its Pod before it registers). */
void pl_job_driver_set_zone(pl_job_driver *d, const char *name, const char *zone);

/* What happened, oldest first: the front end drains it after every poll. */
typedef enum {
    PL_JOB_DRIVER_CHECKPOINT, /* the checkpoint of `step` is complete (a worker wrote its
                                 checkpoint.json), unless error */
    PL_JOB_DRIVER_RECONFIG,   /* reconfiguration `index` (pl_coord_reconfig) was made */
    PL_JOB_DRIVER_RECOVERED,  /* reconfiguration `index` recovered: ms from its failure to
                                 the first step its plan committed (the STEP that follows) */
    PL_JOB_DRIVER_STEP,       /* step record `index` (pl_coord_step_log) was committed */
    PL_JOB_DRIVER_RESUME,     /* the first plan starts from the checkpoint of `step` (0: the
                                 initial state); error: how the workers disagreed, or NULL */
    PL_JOB_DRIVER_PROFILED,   /* the profile a worker measured is planned
                                 (pl_job_driver_profile_json) */
} pl_job_driver_event_kind;

typedef struct {
    pl_job_driver_event_kind kind;
    int index;
    int64_t step;      /* CHECKPOINT, RESUME */
    const char *error; /* CHECKPOINT: why an attempt at it failed (a layer or its
                          checkpoint.json not written), or NULL */
    int64_t ms;        /* RECOVERED */
} pl_job_driver_event;

/* 1 and *ev, or 0 when the front end has seen everything. */
int pl_job_driver_next(pl_job_driver *d, pl_job_driver_event *ev);

const pl_job *pl_job_driver_job(const pl_job_driver *d);
/* The step the job resumed from (0: the initial state); -1 until the workers reported
 * what they see (the first plan). */
int64_t pl_job_driver_resume_step(const pl_job_driver *d);
/* spec.profile auto: the profile's JSON in use (measured by a worker, or given in the
 * configuration); NULL before it is known and for other profiles. */
const char *pl_job_driver_profile_json(const pl_job_driver *d);
/* The newest validation loss (NaN: none yet) and the step it was computed after. */
double pl_job_driver_validation_loss(const pl_job_driver *d, int64_t *step);
/* The rest: after a successful start. */
pl_coord *pl_job_driver_coord(pl_job_driver *d);
int pl_job_driver_port(const pl_job_driver *d);
const char *pl_job_driver_token(const pl_job_driver *d);
const char *pl_job_driver_cert_path(const pl_job_driver *d);
/* PEM texts of the certificate and key in use (heap strings; NULL: unreadable). */
char *pl_job_driver_cert_pem(const pl_job_driver *d);
char *pl_job_driver_key_pem(const pl_job_driver *d);
/* Milliseconds from the failure that caused reconfiguration i to the first step
 * committed after it; -1 while unknown. */
int64_t pl_job_driver_recovery_ms(const pl_job_driver *d, int i);
/* Samples per second over the last committed steps (0 before two). */
double pl_job_driver_samples_per_second(const pl_job_driver *d);
int pl_job_driver_connected(const pl_job_driver *d); /* registered workers connected */
/* Node-hours so far: Σ over workers of their live time (registered, not lost), measured
 * at each poll; what spec.cost's prices apply to. */
double pl_job_driver_node_hours(const pl_job_driver *d);

#endif
