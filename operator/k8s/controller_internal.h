/* The controller's own header: private to the controller's files (controller.c,
 * informers.c, reconcile.c, job_runtime.c, job_observe.c, job_status.c), never included
 * elsewhere; controller.h is the public contract. It holds the controller's state (struct
 * pl_controller, its jobs, their Pods) and the functions those files share. The rules of
 * controller.h hold for all of them: the informers run on their own threads and touch
 * nothing but their client, their synced flag and the inbox (under mu); everything else
 * (the jobs, the nodes, the work queue, the loop's client, the drivers) is the loop's
 * thread's alone, so none of these functions locks. The controller owns its jobs, their
 * Pods and drivers and the inbox's objects; cfg's strings, metrics and dashboard are
 * borrowed (they outlive it). */
#ifndef PLIANT_CONTROLLER_INTERNAL_H
#define PLIANT_CONTROLLER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "controller.h"
#include "dashboard_feed.h"
#include "job_cost.h"
#include "job_driver.h"
#include "job_objects.h"
#include "jobspec.h"
#include "kube_client.h"
#include "kube_requests.h"
#include "kube_watch.h"
#include "util.h"
#include "workqueue.h"

#define STATUS_EVERY_MS 1000   /* status writes while training, at most */
#define FLUSH_MS 3000          /* a finished job's server lives on to deliver `stop` */
#define NCOND 9                /* the conditions a job shows (COND_TYPES, job_status.c) */
#define COND_CREATED 0         /* cond[] of condition Created */
#define COND_DEGRADED (NCOND - 1) /* and of Degraded */

typedef struct cpod {
    char name[256];
    char phase[32];
    char zone[64];  /* its node's topology.kubernetes.io/zone; "" unknown */
    int deleting, gone_reported, counted;
    int fenced;     /* deleted because the coordinator lost its worker while it still ran */
    pl_pod_clock clock; /* its node billed while it runs (spec.cost) */
    struct cpod *next;
} cpod;

typedef struct {
    char status[8]; /* "True" / "False" / "" (never set) */
    char reason[64], message[512], since[40];
} ccond;

typedef struct cjob {
    char key[512], ns[256], name[256];
    cJSON *obj;                 /* the latest TrainingJob seen; NULL once deleted */
    pl_job spec;
    int have_spec, invalid;
    pl_job_driver *rt;          /* the job's driver (its coordinator), while it runs */
    pl_dashboard_job *page;     /* its dashboard page: the last runtime's, kept after it */
    pl_dash_feed *feed;         /* the runtime's events to the page, while it runs */
    int64_t page_ended_ms;      /* when the page's runtime ended; 0: it runs */
    int64_t done_ms;            /* when the runtime finished (flushing `stop`); 0: running */
    int service_ok, slice_ok, policy_ok; /* the runtime's Service, EndpointSlice, NetworkPolicy */
    cpod *pods;
    int next_k;
    char phase[32];
    ccond cond[NCOND];
    int status_dirty;
    int64_t status_ms;
    /* what the Events already covered */
    int64_t ckpt_seen, checkpoints;
    int reconfigs_before;       /* of runtimes that ended (a new leader, a restart) */
    int preempted, failed_pods;
    int64_t failed_ms;          /* pl_now_ms() of the last failure counted */
    int owed, streak;           /* failed Pods not replaced yet (back-off); failures in a row */
    int64_t start_ms, end_ms;   /* startTime and completionTime on pl_now_ms()'s clock */
    char start_time[40], completion_time[40], last_ckpt_time[40], last_reconfig_time[40];
    int profile_saved;          /* status.profile holds the profile a worker measured */
    int restart_workers;        /* a new plan without takeover: workers' state is not its */
    int64_t node_ms;            /* node time of worker Pods' running intervals that ended */
    double samples;             /* committed samples (step × batch.global), the latest known */
    struct cjob *next;
} cjob;

typedef struct cnode {
    char name[256], zone[64], hostname[256]; /* hostname: its kubernetes.io/hostname */
    struct cnode *next;
} cnode;

typedef struct inbox_item {
    int is_pod;
    pl_watch_event ev;
    cJSON *obj;
    struct inbox_item *next;
} inbox_item;

typedef struct {
    pl_controller *c;
    int is_pod;
    pl_kube_client *client;
    pthread_t th;
    int started;
    atomic_int synced;
} informer;

struct pl_controller {
    pl_controller_config cfg;
    pl_kube_client *api;        /* the loop's client */
    pl_workqueue *q;
    informer inf[2];
    atomic_int stop;            /* informers' stop flag */
    pthread_mutex_t mu;         /* the inbox */
    inbox_item *head, *tail;
    cjob *jobs;
    cnode *nodes;               /* zones of the nodes seen */
    int64_t api_t0;             /* when the request being counted began */
    long retry_after_ms;        /* the longest Retry-After of the reconcile's failed requests */
};

/* API(c, ID, call, &st): the call, which makes request ID of kube_requests.h, timed (the
 * comma operator orders the clock first), counted for /metrics and logged at debug. */
#define API(c, id, call, st) \
    ((c)->api_t0 = pl_now_ms(), api_done((c), PL_REQ_##id, (call), (st)))

/* controller.c: requests, Events, the jobs and their dashboard pages */
pl_kube_ref job_ref(const cjob *j, pl_kube_req id, const char *name);
int api_done(pl_controller *c, pl_kube_req id, int rc, const pl_kube_status *st);
void job_event(pl_controller *c, cjob *j, const char *type, const char *reason,
               const char *action, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
int create_owned(pl_controller *c, cjob *j, pl_kube_req id, cJSON *obj, pl_kube_status *st);
int delete_obj(pl_controller *c, cjob *j, pl_kube_req id, const char *name);
cjob *job_get(pl_controller *c, const char *ns, const char *name);
void page_path(const cjob *j, char *buf, size_t len);
void open_page(pl_controller *c, cjob *j);
void job_stop(pl_controller *c, cjob *j);
void job_free(pl_controller *c, cjob *j);

/* informers.c: the watches' events into the jobs' caches */
void *informer_main(void *arg);
void drain_inbox(pl_controller *c);
const cnode *node_info(pl_controller *c, const char *node);

/* reconcile.c */
int reconcile(pl_controller *c, cjob *j);
cpod *silent_pod(cjob *j);

/* job_runtime.c: a job's runtime started, and the objects it needs */
char *manifest_text(const cJSON *obj);
const char *coordinator_host(const pl_controller *c, const cjob *j, char *buf, size_t len);
pl_job_objects job_objects(const pl_controller *c, const cjob *j, const char *coordinator);
int start_runtime(pl_controller *c, cjob *j);
int ensure_network(pl_controller *c, cjob *j);

/* job_observe.c: what a runtime reports */
void observe_job(pl_controller *c, cjob *j);

/* job_status.c: conditions, phase, the status subresource and the job's /metrics */
void set_cond(cjob *j, const char *type, int on, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void set_phase(cjob *j, const char *phase, const char *reason, const char *msg);
void fail_job(pl_controller *c, cjob *j, const char *reason, const char *msg);
int write_status(pl_controller *c, cjob *j);

#endif
