/* One TrainingJob's training inside the operator: the coordinator
 * (coordinator.h) behind its own control server (control_server.h, TLS with
 * the job's certificate, the job token), what `pliant run` does with local
 * processes, with Pods instead. Single-threaded: the controller's loop calls
 * pl_job_runtime_poll often and reads the coordinator's logs for status and
 * Events. Workers are named after their Pods. */
#ifndef PLIANT_JOB_RUNTIME_H
#define PLIANT_JOB_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator.h"
#include "jobspec.h"

typedef struct pl_job_runtime pl_job_runtime;

typedef struct {
    const char *manifest;     /* the TrainingJob as JSON or YAML text (parsed again here) */
    const char *bind_host;    /* control server address (NULL: 0.0.0.0) */
    const char *cert_host;    /* the address workers dial, put in a generated certificate */
    const char *token;        /* the job token; NULL: a fresh one */
    const char *cert_pem;     /* certificate and key to serve (a new leader reuses the */
    const char *key_pem;      /*   Secret's); NULL: a fresh self-signed pair */
    int n_start;              /* workers before the first plan (fewer after START_GRACE_MS) */
    int port;                 /* control port; 0: the first free one from port_base up, */
    int port_base;            /*   or any free one when port_base is 0 too */
    /* a new leader takes over a running plan (pl_coord_restore); npipes 0: none */
    const pl_msg_pipeline *pipes;
    int npipes;
    int64_t generation, step;
} pl_job_runtime_config;

pl_job_runtime *pl_job_runtime_new(const pl_job_runtime_config *cfg, char *err, size_t errlen);
void pl_job_runtime_free(pl_job_runtime *rt);

/* Serves the control channel for up to timeout_ms, forwards the coordinator's
 * messages, ticks it (heartbeats, settling), completes checkpoints. 0, or -1
 * when the server failed. */
int pl_job_runtime_poll(pl_job_runtime *rt, int timeout_ms);

/* The Pod of worker `name` is gone or failed (the coordinator may already know
 * from its connection): the loss of that node. */
void pl_job_runtime_worker_gone(pl_job_runtime *rt, const char *name, const char *cause);

/* The zone of worker `name`'s node (known from its Pod before it registers). */
void pl_job_runtime_set_zone(pl_job_runtime *rt, const char *name, const char *zone);

pl_coord *pl_job_runtime_coord(pl_job_runtime *rt);
int pl_job_runtime_port(const pl_job_runtime *rt);
const char *pl_job_runtime_token(const pl_job_runtime *rt);
/* PEM texts of the certificate and key in use (heap strings; NULL: unreadable). */
char *pl_job_runtime_cert_pem(const pl_job_runtime *rt);
char *pl_job_runtime_key_pem(const pl_job_runtime *rt);
/* Milliseconds from the failure that caused reconfiguration i to the first step
 * committed after it; -1 while unknown. */
int64_t pl_job_runtime_recovery_ms(const pl_job_runtime *rt, int i);
/* Samples per second over the last committed steps (0 before two). */
double pl_job_runtime_samples_per_second(const pl_job_runtime *rt);
int pl_job_runtime_connected(const pl_job_runtime *rt); /* registered workers connected */

#endif
