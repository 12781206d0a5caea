/* The TrainingJob controller of `pliant-operator`, in
 * controller-runtime's manner: two informers (TrainingJobs; worker Pods by
 * label) on their own threads feed one loop that owns everything else — a
 * work queue keyed by job with back-off on errors, an idempotent reconcile
 * (Secret, Service and its EndpointSlice, NetworkPolicy, worker Pods, clean-up,
 * suspend, deadlines, back-off and backoffLimit, TTL), and for each running job
 * its coordinator (job_driver.h) served in the same loop. Status goes through
 * the /status subresource (merge patch), Events through events.k8s.io/v1; with a
 * dashboard each job's page at /jobs/NAMESPACE/NAME/ (status.dashboard), kept once its
 * coordinator ended (the newest CTL_DASH_ENDED_KEPT such pages). A
 * deleted or failed Pod is the loss of that node; Pods stopped by a disruption
 * (condition DisruptionTarget, node gone) count as preempted, not failed.
 * Every API request it makes is a row of kube_requests.h. */
#ifndef PLIANT_CONTROLLER_H
#define PLIANT_CONTROLLER_H

#include <stdatomic.h>
#include <stddef.h>

#include "dashboard.h"
#include "kube_config.h"
#include "metrics.h"

#define CTL_DASH_ENDED_KEPT 16    /* final dashboard pages of ended jobs kept, at most */
#define CTL_DASH_EVENTS 20000     /* a job's dashboard log (dashboard.h: steps thinned past it) */

typedef struct {
    pl_kube_config *kc;
    const char *namespace_;        /* NULL: every namespace */
    const char *coordinator_host;  /* the address workers dial; NULL: the job's Service name */
    const char *bind_host;         /* where the control servers listen; NULL: 0.0.0.0 */
    int port_base;                 /* jobs' control ports from here up; 0: any free one */
    const char *worker_image;      /* when spec.worker.image is unset */
    const char *worker_command;    /* the pliant binary in the worker image */
    const char *identity;          /* this operator instance (Events' reportingInstance) */
    const char *advertise_ip;      /* this replica's IP, the jobs' EndpointSlices' endpoint;
                                    * NULL: no EndpointSlice is written */
    int network_policy;            /* 1: a NetworkPolicy per job (pl_job_network_policy) */
    const char *operator_namespace;/* where the operator's Pods run (that policy's peer) */
    pl_metrics *metrics;           /* may be NULL */
    pl_dashboard *dashboard;       /* the jobs' pages are added to it; NULL: none. Borrowed:
                                    * it outlives the controller */
} pl_controller_config;

typedef struct pl_controller pl_controller;

pl_controller *pl_controller_new(const pl_controller_config *cfg, char *err, size_t errlen);
/* Runs until *stop is set: starts the informers, reconciles, serves the jobs'
 * coordinators. 0 on a clean stop, -1 with err when it cannot start. */
int pl_controller_run(pl_controller *c, const atomic_int *stop, char *err, size_t errlen);
/* 1 once both informers have listed (readiness). Thread-safe. */
int pl_controller_synced(const pl_controller *c);
void pl_controller_free(pl_controller *c);

#endif
