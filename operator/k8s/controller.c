/* The TrainingJob controller (controller.h): informers in, one reconcile loop, each running
 * job's driver polled in the same loop, status and Events out. */
#include "controller.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_server.h"
#include "dashboard_feed.h"
#include "job_cost.h"
#include "job_driver.h"
#include "job_metrics.h"
#include "job_objects.h"
#include "job_policy.h"
#include "json_num.h"
#include "jobspec.h"
#include "kube_client.h"
#include "kube_requests.h"
#include "kube_watch.h"
#include "oplog.h"
#include "plan_status.h"
#include "util.h"
#include "workqueue.h"

#define LOOP_MS 10             /* the loop's pace: work queue wait, control servers */
#define STATUS_EVERY_MS 1000   /* status writes while training, at most */
#define FLUSH_MS 3000          /* a finished job's server lives on to deliver `stop` */
#define RESYNC_MS 15000        /* every job is reconciled again this often */
#define API_ATTEMPTS 5         /* optimistic-concurrency retries */
#define START_GRACE_MS 20000   /* the first plan: all Pods, or after this long those running */
#define PORT_RANGE 256         /* control ports tried from port_base (the chart's NetworkPolicy) */
#define MAX_AVOID 64           /* nodes cooling down a Pod is kept off, at most */
#define CONTROLLER_NAME "pliant.dev/operator"

static const char *const COND_TYPES[] = {"Created",   "Running",   "Reconfiguring", "WaitingForNodes",
                                         "Suspended", "Succeeded", "Failed",        "PodsCreated",
                                         "Degraded"};
#define NCOND (int)(sizeof COND_TYPES / sizeof COND_TYPES[0])

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

/* ------------------------------------------------------------ small helpers */

/* The object (or collection) of request id's resource in the job's namespace; the
 * status subresource's requests take the resource's ref. */
static pl_kube_ref job_ref(const cjob *j, pl_kube_req id, const char *name)
{
    static char plurals[PL_REQ_COUNT][64];
    const pl_kube_req_row *row = &pl_kube_req_rows[id];
    snprintf(plurals[id], sizeof plurals[id], "%.*s", (int)strcspn(row->resource, "/"),
             row->resource);
    int tj = !strcmp(row->group, "pliant.dev");
    pl_kube_ref r = {row->group[0] ? row->group : NULL, tj ? "v1alpha1" : "v1", j->ns,
                     plurals[id], name, NULL};
    return r;
}

/* API(c, ID, call, &st): the call, which makes request ID of kube_requests.h, timed (the
 * comma operator orders the clock first), counted for /metrics and logged at debug. */
#define API(c, id, call, st) \
    ((c)->api_t0 = pl_now_ms(), api_done((c), PL_REQ_##id, (call), (st)))

static int api_done(pl_controller *c, pl_kube_req id, int rc, const pl_kube_status *st)
{
    const pl_kube_req_row *row = &pl_kube_req_rows[id];
    double s = (double)(pl_now_ms() - c->api_t0) / 1000.0;
    if (c->cfg.metrics) {
        char lab[160];
        snprintf(lab, sizeof lab, "verb=\"%s\",resource=\"%s\"", row->verb, row->resource);
        pl_metrics_histogram_observe(c->cfg.metrics, "pliant_kube_request_seconds",
                                     "Kubernetes API request latency", lab, s);
        pl_metrics_counter_add(c->cfg.metrics, "pliant_kube_requests_total",
                               "Kubernetes API requests", lab, 1);
        if (rc && st->http != 404 && st->http != 409)
            pl_metrics_counter_add(c->cfg.metrics, "pliant_kube_request_errors_total",
                                   "Kubernetes API requests that failed", lab, 1);
    }
    pl_log(PL_LOG_DEBUG, "%s %s: %s (%.3f s)", row->verb, row->resource,
           rc ? st->message : "ok", s);
    if (rc && st->retry_after_ms > c->retry_after_ms) c->retry_after_ms = st->retry_after_ms;
    return rc;
}

static void event(pl_controller *c, cjob *j, const char *type, const char *reason,
                  const char *action, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void event(pl_controller *c, cjob *j, const char *type, const char *reason,
                  const char *action, const char *fmt, ...)
{
    if (!j->obj) return;
    char note[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note, sizeof note, fmt, ap);
    va_end(ap);
    pl_kube_event ev = {j->obj, type, reason, action, note, CONTROLLER_NAME, c->cfg.identity};
    pl_kube_status st;
    if (API(c, EVENT_CREATE, pl_kube_event_create(c->api, &ev, &st), &st))
        pl_log(PL_LOG_WARN, "%s: event %s: %s", j->key, reason, st.message);
}

/* ------------------------------------------------------------------ jobs */

static cjob *job_find(pl_controller *c, const char *key)
{
    for (cjob *j = c->jobs; j; j = j->next)
        if (!strcmp(j->key, key)) return j;
    return NULL;
}

static cjob *job_get(pl_controller *c, const char *ns, const char *name)
{
    char key[512];
    snprintf(key, sizeof key, "%s/%s", ns, name);
    cjob *j = job_find(c, key);
    if (j || !(j = calloc(1, sizeof *j))) return j;
    snprintf(j->key, sizeof j->key, "%s", key);
    snprintf(j->ns, sizeof j->ns, "%s", ns);
    snprintf(j->name, sizeof j->name, "%s", name);
    j->next = c->jobs;
    c->jobs = j;
    return j;
}

/* ------------------------------------------------------------- dashboard */

/* The job's dashboard page: /jobs/NAMESPACE/NAME/ on the leader's dashboard port. */
static void page_path(const cjob *j, char *buf, size_t len)
{
    snprintf(buf, len, "/jobs/%s/%s/", j->ns, j->name);
}

/* A new runtime's page (a previous runtime's is replaced) and its feed. */
static void open_page(pl_controller *c, cjob *j)
{
    if (!c->cfg.dashboard) return;
    char path[PL_DASHBOARD_MAX_PATH + 1];
    page_path(j, path, sizeof path);
    pl_dashboard_remove(j->page);
    j->page = pl_dashboard_add(c->cfg.dashboard, path, CTL_DASH_EVENTS);
    j->feed = j->page ? pl_dash_feed_new(j->page, j->rt) : NULL;
    j->page_ended_ms = 0;
    if (!j->feed) pl_log(PL_LOG_WARN, "%s: no dashboard page: out of memory", j->key);
}

/* The runtime ends: its feed goes, its page stays (the job's final page) but for the
 * oldest beyond CTL_DASH_ENDED_KEPT, which go, so that ended jobs bound the memory. */
static void close_feed(pl_controller *c, cjob *j)
{
    if (!j->feed) return;
    pl_dash_feed_free(j->feed);
    j->feed = NULL;
    j->page_ended_ms = pl_now_ms();
    for (;;) {
        int ended = 0;
        cjob *oldest = NULL;
        for (cjob *o = c->jobs; o; o = o->next) {
            if (!o->page || o->feed) continue;
            ended++;
            if (!oldest || o->page_ended_ms < oldest->page_ended_ms) oldest = o;
        }
        if (ended <= CTL_DASH_ENDED_KEPT) return;
        pl_dashboard_remove(oldest->page);
        oldest->page = NULL;
    }
}

/* ------------------------------------------------------- a job stops, is freed */

static void job_stop(pl_controller *c, cjob *j)
{
    if (!j->rt) return;
    close_feed(c, j);
    pl_coord *co = pl_job_driver_coord(j->rt);
    j->reconfigs_before += pl_coord_nreconfigs(co);
    pl_job_driver_free(j->rt);
    j->rt = NULL;
    j->done_ms = 0;
    j->service_ok = j->slice_ok = j->policy_ok = 0;
}

static void job_free(pl_controller *c, cjob *j)
{
    job_stop(c, j);
    pl_dashboard_remove(j->page);
    pl_job_metrics_forget(c->cfg.metrics, j->ns, j->name);
    for (cjob **p = &c->jobs; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    while (j->pods) {
        cpod *p = j->pods;
        j->pods = p->next;
        free(p);
    }
    cJSON_Delete(j->obj);
    if (j->have_spec) pl_job_free(&j->spec);
    free(j);
}

/* Sets a condition; the status is written when it changed. */
static void set_cond(cjob *j, const char *type, int on, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void set_cond(cjob *j, const char *type, int on, const char *reason, const char *fmt, ...)
{
    for (int i = 0; i < NCOND; i++) {
        if (strcmp(COND_TYPES[i], type)) continue;
        ccond *k = &j->cond[i];
        const char *st = on ? "True" : "False";
        char message[sizeof k->message];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(message, sizeof message, fmt, ap);
        va_end(ap);
        if (!strcmp(k->status, st) && !strcmp(k->reason, reason) && !strcmp(k->message, message))
            return;
        if (strcmp(k->status, st)) pl_rfc3339_now(k->since, sizeof k->since);
        snprintf(k->status, sizeof k->status, "%s", st);
        snprintf(k->reason, sizeof k->reason, "%s", reason);
        snprintf(k->message, sizeof k->message, "%s", message);
        j->status_dirty = 1;
    }
}

/* The phase shown, with the conditions that go with it. */
static void set_phase(cjob *j, const char *phase, const char *reason, const char *msg)
{
    if (!strcmp(j->phase, phase)) return;
    snprintf(j->phase, sizeof j->phase, "%s", phase);
    static const char *const exclusive[] = {"Running", "Reconfiguring", "WaitingForNodes",
                                            "Suspended"};
    for (size_t i = 0; i < sizeof exclusive / sizeof exclusive[0]; i++)
        if (strcmp(exclusive[i], phase) && j->cond[0].status[0])
            set_cond(j, exclusive[i], 0, reason, "%s", msg);
    if (strcmp(phase, "Pending")) set_cond(j, phase, 1, reason, "%s", msg);
    j->status_dirty = 1;
}

/* The job ends now: phase Failed with reason, a Warning Event, its coordinator told. */
static void fail_job(pl_controller *c, cjob *j, const char *reason, const char *msg)
{
    if (j->rt) {
        pl_coord_end(pl_job_driver_coord(j->rt), msg);
        j->done_ms = pl_now_ms();
    }
    set_phase(j, "Failed", reason, msg);
    event(c, j, "Warning", reason, "Fail", "%s", msg);
    pl_rfc3339_now(j->completion_time, sizeof j->completion_time);
    j->end_ms = pl_now_ms();
}

/* ------------------------------------------------------------------ status */

/* What the workers' duties add to the status: the newest validation loss
 * (status.lastValidation), and once the profile a worker measured (status.profile: a new
 * leader plans from it instead of measuring again; merge patches keep it). */
static void add_duties_status(cJSON *s, const cjob *j)
{
    int64_t vstep;
    double vloss = pl_job_driver_validation_loss(j->rt, &vstep);
    if (isfinite(vloss)) {
        cJSON *v = cJSON_AddObjectToObject(s, "lastValidation");
        cJSON_AddNumberToObject(v, "step", (double)vstep);
        cJSON_AddNumberToObject(v, "loss", vloss);
    }
    const char *profile = pl_job_driver_profile_json(j->rt);
    if (profile && !j->profile_saved) cJSON_AddStringToObject(s, "profile", profile);
}

/* The profile a new leader passes to its driver: status.profile (spec.profile auto). */
static const char *stored_profile(const cjob *j)
{
    const char *text = pl_kube_field(j->obj, "status.profile");
    return text && !strcmp(j->spec.profile, "auto") ? text : NULL;
}

/* What the job's nodes cost so far: the ended intervals and those still open. */
static pl_job_cost job_cost(const cjob *j)
{
    int64_t now = pl_now_ms(), ms = j->node_ms;
    for (const cpod *p = j->pods; p; p = p->next) ms += pl_pod_clock_open_ms(&p->clock, now);
    return pl_job_cost_of(&j->spec.cost, ms, j->samples);
}

/* status.cost (spec.cost set). */
static void add_cost_status(cJSON *s, const cjob *j)
{
    if (!j->have_spec || !pl_job_cost_enabled(&j->spec.cost)) return;
    pl_job_cost k = job_cost(j);
    cJSON *o = cJSON_AddObjectToObject(s, "cost");
    cJSON_AddNumberToObject(o, "nodeHours", round(k.node_hours * 1e6) / 1e6);
    cJSON_AddNumberToObject(o, "dollars", round(k.dollars * 1e6) / 1e6);
    cJSON_AddNumberToObject(o, "onDemandDollars", round(k.on_demand_dollars * 1e6) / 1e6);
    cJSON_AddNumberToObject(o, "samples", j->samples);
    cJSON_AddNumberToObject(o, "samplesPerDollar", round(k.samples_per_dollar));
}

static cJSON *status_json(pl_controller *c, cjob *j)
{
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "phase", j->phase[0] ? j->phase : "Pending");
    const cJSON *gen = cJSON_GetObjectItem(cJSON_GetObjectItem(j->obj, "metadata"), "generation");
    long long generation = pl_json_int_or(gen, 0, PL_JSON_INT_MAX, 0);
    cJSON_AddNumberToObject(s, "observedGeneration", (double)generation);
    cJSON *conds = cJSON_AddArrayToObject(s, "conditions");
    for (int i = 0; i < NCOND; i++) {
        const ccond *k = &j->cond[i];
        if (!k->status[0]) continue;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", COND_TYPES[i]);
        cJSON_AddStringToObject(x, "status", k->status);
        cJSON_AddStringToObject(x, "reason", k->reason);
        cJSON_AddStringToObject(x, "message", k->message);
        cJSON_AddStringToObject(x, "lastTransitionTime", k->since);
        cJSON_AddNumberToObject(x, "observedGeneration", (double)generation);
        cJSON_AddItemToArray(conds, x);
    }
    int desired = j->have_spec ? (j->spec.nodes.max > 0 ? j->spec.nodes.max : j->spec.nodes.min)
                               : 0;
    int running = 0;
    for (const cpod *p = j->pods; p; p = p->next)
        running += !p->deleting && !strcmp(p->phase, "Running");
    int training = 0;
    cJSON *nodes = cJSON_AddObjectToObject(s, "nodes");
    if (j->rt) {
        pl_coord *co = pl_job_driver_coord(j->rt);
        int64_t step = pl_coord_step(co), steps = j->spec.steps;
        training = pl_coord_live_workers(co);
        double sps = pl_job_driver_samples_per_second(j->rt);
        cJSON_AddNumberToObject(s, "step", (double)step);
        cJSON_AddNumberToObject(s, "progressPercentage", floor(100.0 * (double)step / (double)steps));
        if (sps > 0)
            cJSON_AddNumberToObject(s, "estimatedRemainingSeconds",
                                    round((double)(steps - step) * j->spec.batch.global / sps));
        int ns = pl_coord_nsteps(co);
        if (ns > 0) {
            const pl_coord_step_rec *r = pl_coord_step_log(co, ns - 1);
            if (isfinite(r->loss)) cJSON_AddNumberToObject(s, "loss", r->loss);
            cJSON_AddStringToObject(s, "pipelines", r->pipelines);
        }
        cJSON_AddNumberToObject(s, "samplesPerSecond", round(sps * 10) / 10);
        cJSON_AddNumberToObject(s, "planGeneration", (double)pl_coord_generation(co));
        cJSON_AddNumberToObject(s, "coordinatorPort", pl_job_driver_port(j->rt));
        cJSON_AddItemToObject(s, "plan", pl_plan_status_json(co)); /* a new leader's */
        int nr = pl_coord_nreconfigs(co);
        cJSON_AddNumberToObject(s, "reconfigurations", j->reconfigs_before + nr);
        if (nr > 0) {
            const pl_coord_reconfig_rec *x = pl_coord_reconfig(co, nr - 1);
            cJSON *lr = cJSON_AddObjectToObject(s, "lastReconfiguration");
            cJSON_AddStringToObject(lr, "time", j->last_reconfig_time);
            cJSON_AddStringToObject(lr, "cause", x->cause);
            int64_t ms = pl_job_driver_recovery_ms(j->rt, nr - 1);
            if (ms >= 0) cJSON_AddNumberToObject(lr, "durationSeconds", (double)ms / 1000.0);
            cJSON_AddNumberToObject(lr, "bytesCopied", (double)x->bytes_copied);
            cJSON_AddBoolToObject(lr, "fromCheckpoint", x->from_checkpoint);
        }
        add_duties_status(s, j);
        if (pl_coord_last_checkpoint(co) > 0) {
            cJSON *lc = cJSON_AddObjectToObject(s, "lastCheckpoint");
            cJSON_AddNumberToObject(lc, "step", (double)pl_coord_last_checkpoint(co));
            cJSON_AddStringToObject(lc, "time", j->last_ckpt_time);
            cJSON_AddStringToObject(lc, "dir", j->spec.checkpoint.dir);
        }
    }
    char ready[32];
    snprintf(ready, sizeof ready, "%d/%d", training, desired);
    cJSON_AddNumberToObject(nodes, "desired", desired);
    cJSON_AddNumberToObject(nodes, "running", running);
    cJSON_AddNumberToObject(nodes, "training", training);
    cJSON_AddStringToObject(nodes, "ready", ready);
    cJSON_AddNumberToObject(nodes, "preempted", j->preempted);
    cJSON_AddNumberToObject(nodes, "failed", j->failed_pods);
    if (j->start_time[0]) cJSON_AddStringToObject(s, "startTime", j->start_time);
    else cJSON_AddNullToObject(s, "startTime"); /* reset by a suspension */
    if (j->completion_time[0]) cJSON_AddStringToObject(s, "completionTime", j->completion_time);
    add_cost_status(s, j);
    char path[PL_DASHBOARD_MAX_PATH + 1];
    page_path(j, path, sizeof path);
    if (j->page) cJSON_AddStringToObject(s, "dashboard", path);
    else cJSON_AddNullToObject(s, "dashboard"); /* not served by this leader */
    (void)c;
    return s;
}

static void update_phase_gauges(pl_controller *c)
{
    if (!c->cfg.metrics) return;
    static const char *const phases[] = {"Pending", "Profiling", "Running", "Reconfiguring",
                                         "WaitingForNodes", "Suspended", "Succeeded", "Failed"};
    for (size_t i = 0; i < sizeof phases / sizeof phases[0]; i++) {
        int n = 0;
        for (const cjob *j = c->jobs; j; j = j->next)
            n += j->obj && !strcmp(j->phase[0] ? j->phase : "Pending", phases[i]);
        char lab[64];
        snprintf(lab, sizeof lab, "phase=\"%s\"", phases[i]);
        pl_metrics_gauge_set(c->cfg.metrics, "pliant_jobs", "TrainingJobs by phase", lab, n);
    }
}

/* The job's series of /metrics, as its status shows it (a NaN loss: its series absent). */
static void update_job_metrics(pl_controller *c, cjob *j)
{
    if (!c->cfg.metrics) return;
    pl_job_sample s = {.workers_desired = j->have_spec ? (j->spec.nodes.max > 0 ? j->spec.nodes.max
                                                                                : j->spec.nodes.min)
                                                       : 0,
                       .preemptions = j->preempted, .failed_pods = j->failed_pods,
                       .reconfigurations = j->reconfigs_before, .checkpoints = j->checkpoints,
                       .loss = NAN, .validation_loss = NAN};
    if (j->rt) {
        pl_coord *co = pl_job_driver_coord(j->rt);
        s.workers_ready = pl_coord_live_workers(co);
        s.reconfigurations += pl_coord_nreconfigs(co);
        s.checkpoint_step = pl_coord_last_checkpoint(co);
        int ns = pl_coord_nsteps(co);
        if (ns > 0) s.loss = pl_coord_step_log(co, ns - 1)->loss;
        int64_t vstep;
        s.validation_loss = pl_job_driver_validation_loss(j->rt, &vstep);
    }
    if (j->have_spec && pl_job_cost_enabled(&j->spec.cost)) {
        pl_job_cost k = job_cost(j);
        s.has_cost = 1;
        s.node_hours = k.node_hours;
        s.dollars = k.dollars;
        s.on_demand_dollars = k.on_demand_dollars;
        s.samples_per_dollar = k.samples_per_dollar;
    }
    pl_job_metrics_set(c->cfg.metrics, j->ns, j->name, &s);
}

/* Also refreshes the jobs-by-phase gauges and the job's series (a phase changes only
 * with a status write; before it, so that /metrics agrees once the status shows). */
static int write_status(pl_controller *c, cjob *j)
{
    /* not before the first reconcile took the status up (first_look): a new leader
     * would write its empty view (phase Pending) over the job's */
    if (!j->obj || !(j->have_spec || j->invalid)) return 0;
    if (j->rt && j->have_spec) /* the samples spec.cost prices */
        j->samples = (double)pl_coord_step(pl_job_driver_coord(j->rt)) * j->spec.batch.global;
    update_phase_gauges(c);
    update_job_metrics(c, j);
    cJSON *s = status_json(c, j);
    pl_kube_ref r = job_ref(j, PL_REQ_JOB_STATUS_PATCH, j->name);
    pl_kube_status st;
    int rc = API(c, JOB_STATUS_PATCH, pl_kube_patch_status(c->api, &r, s, NULL, &st), &st);
    if (!rc && cJSON_GetObjectItem(s, "profile")) j->profile_saved = 1;
    cJSON_Delete(s);
    if (rc) {
        if (st.http != 404) pl_log(PL_LOG_WARN, "%s: status: %s", j->key, st.message);
        return -1;
    }
    j->status_dirty = 0;
    j->status_ms = pl_now_ms();
    return 0;
}

/* ------------------------------------------------- what a runtime reports */

static const char *phase_of(pl_coord *co)
{
    switch (pl_coord_phase(co)) {
    case PL_COORD_WAITING_FOR_WORKERS: return "Pending";
    case PL_COORD_PROFILING: return "Profiling";
    case PL_COORD_WAITING_FOR_NODES: return "WaitingForNodes";
    case PL_COORD_COPYING:
    case PL_COORD_SETTLING: return pl_coord_generation(co) > 1 ? "Reconfiguring" : "Running";
    case PL_COORD_DONE: return "Succeeded";
    case PL_COORD_FAILED: return "Failed";
    default: return "Running";
    }
}

/* Each name of a comma-separated list as an Event of that reason. */
static void name_events(pl_controller *c, cjob *j, const char *list, const char *reason,
                        const char *what)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *n = strtok_r(buf, ",", &save); n; n = strtok_r(NULL, ",", &save))
        event(c, j, strcmp(reason, "NodeLost") ? "Normal" : "Warning", reason, what,
              "worker %s %s", n, strcmp(reason, "NodeLost") ? "joined" : "left the job");
}

/* faultTolerance.belowMinimum degrade: a plan with less than the job's tolerance sets the
 * condition Degraded (a Warning Event), one with all of it clears it (a Normal Event). */
static void observe_tolerance(pl_controller *c, cjob *j, const pl_coord_reconfig_rec *x)
{
    const int f = j->spec.fault_tolerance.tolerate, was = !strcmp(j->cond[NCOND - 1].status, "True");
    if (x->tolerance < f) {
        set_cond(j, "Degraded", 1, "BelowMinimum", "tolerance %d of %d until workers join",
                 x->tolerance, f);
        event(c, j, "Warning", "Degraded", "Reconfigure",
              "too few workers for tolerance %d: training on with tolerance %d", f, x->tolerance);
    } else if (was) {
        set_cond(j, "Degraded", 0, "ToleranceRestored", "tolerance %d", f);
        event(c, j, "Normal", "ToleranceRestored", "Reconfigure", "tolerance %d restored", f);
    }
}

/* A new plan: Events for the workers it removed and added and for itself. */
static void observe_reconfig(pl_controller *c, cjob *j, const pl_coord_reconfig_rec *x)
{
    pl_rfc3339_now(j->last_reconfig_time, sizeof j->last_reconfig_time);
    name_events(c, j, x->removed, "NodeLost", "RemoveNode");
    name_events(c, j, x->added, "NodeAdded", "AddNode");
    event(c, j, "Normal", "Reconfigured", "Reconfigure",
          "generation %lld at step %lld: %s; pipelines %s%s", (long long)x->generation,
          (long long)x->step, x->cause, x->pipelines,
          x->from_checkpoint ? " (from the checkpoint)" : "");
    observe_tolerance(c, j, x);
    j->status_dirty = 1;
}

/* What the workers' duties brought: a checkpoint a worker could not complete, the resume
 * point they reported, the profile one measured (saved in the status). */
static void observe_duty_event(cjob *j, const pl_job_driver_event *ev)
{
    if (ev->kind == PL_JOB_DRIVER_CHECKPOINT && ev->error)
        pl_log(PL_LOG_WARN, "%s: checkpoint of step %lld: %s", j->key, (long long)ev->step,
               ev->error);
    if (ev->kind == PL_JOB_DRIVER_RESUME && (ev->step > 0 || ev->error))
        pl_log(ev->error ? PL_LOG_WARN : PL_LOG_INFO, "%s: starting from the checkpoint of step %lld%s%s",
               j->key, (long long)ev->step, ev->error ? ": " : "", ev->error ? ev->error : "");
    if (ev->kind == PL_JOB_DRIVER_PROFILED) {
        pl_log(PL_LOG_INFO, "%s: the profile measured by a worker is planned", j->key);
        j->status_dirty = 1;
    }
}

/* Events and metrics from what the driver reports since the last look. */
static void observe_driver(pl_controller *c, cjob *j)
{
    pl_metrics *m = c->cfg.metrics;
    int steps = 0;
    pl_job_driver_event ev;
    while (pl_job_driver_next(j->rt, &ev)) {
        pl_dash_feed_event(j->feed, &ev);
        switch (ev.kind) {
        case PL_JOB_DRIVER_STEP: steps++; break;
        case PL_JOB_DRIVER_RECONFIG:
            observe_reconfig(c, j, pl_coord_reconfig(pl_job_driver_coord(j->rt), ev.index));
            break;
        case PL_JOB_DRIVER_RECOVERED:
            if (m)
                pl_metrics_histogram_observe(m, "pliant_recovery_seconds",
                                             "Failure to the next committed step", NULL,
                                             ev.ms / 1000.0);
            j->status_dirty = 1;
            break;
        case PL_JOB_DRIVER_CHECKPOINT:
        case PL_JOB_DRIVER_RESUME:
        case PL_JOB_DRIVER_PROFILED: observe_duty_event(j, &ev); break;
        }
    }
    if (steps > 0) {
        pl_job_metrics_steps(m, j->ns, j->name, steps, pl_job_driver_samples_per_second(j->rt));
        if (pl_now_ms() - j->status_ms >= STATUS_EVERY_MS) j->status_dirty = 1;
    }
}

static int pod_finished(const cpod *p);

/* The first Pod whose worker the coordinator lost to missed heartbeats or a missed step
 * deadline while the Pod still runs (a node partitioned or silent, a hung process); NULL:
 * none. */
static cpod *silent_pod(cjob *j)
{
    pl_coord *co = pl_job_driver_coord(j->rt);
    for (cpod *p = j->pods; p; p = p->next)
        if (!p->fenced && !p->deleting && !pod_finished(p) && pl_coord_worker_silent(co, p->name))
            return p;
    return NULL;
}

/* Events, status, metrics from the driver and the coordinator since the last look. */
static void observe(pl_controller *c, cjob *j)
{
    pl_coord *co = pl_job_driver_coord(j->rt);
    observe_driver(c, j);
    pl_dash_feed_poll(j->feed);
    if (pl_coord_last_checkpoint(co) > j->ckpt_seen) {
        j->ckpt_seen = pl_coord_last_checkpoint(co);
        j->checkpoints++;
        pl_rfc3339_now(j->last_ckpt_time, sizeof j->last_ckpt_time);
        event(c, j, "Normal", "CheckpointSaved", "Checkpoint", "step %lld saved to %s",
              (long long)j->ckpt_seen, j->spec.checkpoint.dir);
        j->status_dirty = 1;
    }
    if (silent_pod(j))
        pl_workqueue_add(c->q, j->key); /* reconcile deletes it (fence_lost) */
    const char *phase = phase_of(co);
    if (strcmp(phase, j->phase)) {
        if (!strcmp(phase, "Running") &&
            (!j->phase[0] || !strcmp(j->phase, "Pending") || !strcmp(j->phase, "Profiling")))
            event(c, j, "Normal", "Started", "Train", "training on %d workers",
                  pl_coord_live_workers(co));
        if (!strcmp(phase, "Succeeded") || !strcmp(phase, "Failed")) {
            pl_rfc3339_now(j->completion_time, sizeof j->completion_time);
            j->end_ms = j->done_ms = pl_now_ms();
            event(c, j, !strcmp(phase, "Failed") ? "Warning" : "Normal", phase, "Finish", "%s",
                  pl_coord_reason(co)[0] ? pl_coord_reason(co) : "every step committed");
            pl_workqueue_add_after(c->q, j->key, FLUSH_MS + 100);
        }
        set_phase(j, phase, phase, pl_coord_reason(co)[0] ? pl_coord_reason(co) : phase);
    }
}

/* ------------------------------------------------------------- informers */

static void push(pl_controller *c, int is_pod, pl_watch_event ev, const cJSON *obj)
{
    inbox_item *it = calloc(1, sizeof *it);
    if (!it || !(it->obj = cJSON_Duplicate(obj, 1))) {
        free(it);
        return; /* the periodic resync catches up */
    }
    it->is_pod = is_pod;
    it->ev = ev;
    pthread_mutex_lock(&c->mu);
    if (c->tail) c->tail->next = it;
    else c->head = it;
    c->tail = it;
    pthread_mutex_unlock(&c->mu);
}

static void on_event(pl_watch_event ev, const cJSON *obj, const cJSON *old, void *user)
{
    informer *inf = user;
    (void)old;
    push(inf->c, inf->is_pod, ev, obj);
}

static void on_synced(void *user)
{
    informer *inf = user;
    atomic_store(&inf->synced, 1);
}

static void on_error(const pl_kube_status *st, void *user)
{
    informer *inf = user;
    pl_log(PL_LOG_WARN, "%s watch: %s (retrying)", inf->is_pod ? "Pod" : "TrainingJob",
           st->message);
}

static void *informer_main(void *arg)
{
    informer *inf = arg;
    pl_controller *c = inf->c;
    pl_watch_config wc = {.on_event = on_event, .on_synced = on_synced, .on_error = on_error,
                          .user = inf};
    char err[512];
    int rc;
    if (inf->is_pod) {
        wc.ref = (pl_kube_ref){NULL, "v1", c->cfg.namespace_, "pods", NULL, NULL};
        wc.label_selector = "app.kubernetes.io/name=" PL_WORKER_LABEL;
        rc = PL_REQ(POD_WATCH, pl_watch_run(inf->client, &wc, NULL, err, sizeof err));
    } else {
        wc.ref = (pl_kube_ref){"pliant.dev", "v1alpha1", c->cfg.namespace_, "trainingjobs", NULL,
                               NULL};
        rc = PL_REQ(JOB_WATCH, pl_watch_run(inf->client, &wc, NULL, err, sizeof err));
    }
    if (rc) pl_log(PL_LOG_ERROR, "watch: %s", err);
    return NULL;
}

/* A node's topology.kubernetes.io/zone and kubernetes.io/hostname, looked up once;
 * NULL when it cannot be read. */
static const cnode *node_info(pl_controller *c, const char *node)
{
    for (cnode *n = c->nodes; n; n = n->next)
        if (!strcmp(n->name, node)) return n;
    pl_kube_ref r = {NULL, "v1", NULL, "nodes", node, NULL};
    pl_kube_status st;
    cJSON *obj = NULL;
    if (API(c, NODE_GET, pl_kube_get(c->api, &r, NULL, &obj, &st), &st)) return NULL;
    cnode *n = calloc(1, sizeof *n);
    const cJSON *labels = cJSON_GetObjectItem(cJSON_GetObjectItem(obj, "metadata"), "labels");
    const cJSON *z = cJSON_GetObjectItem(labels, "topology.kubernetes.io/zone");
    const cJSON *h = cJSON_GetObjectItem(labels, "kubernetes.io/hostname");
    if (n) {
        snprintf(n->name, sizeof n->name, "%s", node);
        snprintf(n->zone, sizeof n->zone, "%s", cJSON_IsString(z) ? z->valuestring : "");
        snprintf(n->hostname, sizeof n->hostname, "%s", cJSON_IsString(h) ? h->valuestring : node);
        n->next = c->nodes;
        c->nodes = n;
    }
    cJSON_Delete(obj);
    return n;
}

/* Whether the Pod was stopped by a disruption (condition DisruptionTarget). */
static int disrupted(const cJSON *pod)
{
    const cJSON *cond;
    cJSON_ArrayForEach(cond, cJSON_GetObjectItem(cJSON_GetObjectItem(pod, "status"), "conditions"))
    {
        const char *t = pl_kube_field(cond, "type"), *s = pl_kube_field(cond, "status");
        if (t && s && !strcmp(t, "DisruptionTarget") && !strcmp(s, "True")) return 1;
    }
    return 0;
}

/* A Pod ended or was disrupted: counted once, as preempted (a spot reclaim, an eviction,
 * a lost node, a deletion) or failed (on its own: it counts toward backoffLimit and its
 * replacement waits for the back-off). */
static void count_pod(cjob *j, cpod *p, pl_watch_event ev, int disruption)
{
    int ended = ev == PL_WATCH_DELETED || !strcmp(p->phase, "Failed") ||
                !strcmp(p->phase, "Succeeded");
    if (p->counted || !(disruption || (ended && strcmp(p->phase, "Succeeded")))) return;
    p->counted = 1;
    if (disruption || p->deleting || ev == PL_WATCH_DELETED) {
        j->preempted++;
    } else {
        int64_t now = pl_now_ms();
        j->failed_pods++;
        j->owed++;
        j->streak = pl_failure_streak(j->streak, j->failed_ms ? now - j->failed_ms : -1);
        j->failed_ms = now;
    }
    j->status_dirty = 1;
}

/* The Pod changed: its job's cache, the coordinator (a node lost), a reconcile. */
static void pod_event(pl_controller *c, pl_watch_event ev, const cJSON *pod)
{
    const char *job = pl_job_owner_name(pod);
    const char *ns = pl_kube_field(pod, "metadata.namespace");
    const char *name = pl_kube_field(pod, "metadata.name");
    if (!job || !ns || !name) return;
    cjob *j = job_get(c, ns, job);
    if (!j) return;
    cpod *p = j->pods, **pp = &j->pods;
    for (; p && strcmp(p->name, name); pp = &p->next, p = p->next) {}
    if (!p) {
        if (ev == PL_WATCH_DELETED || !(p = calloc(1, sizeof *p))) return;
        snprintf(p->name, sizeof p->name, "%s", name);
        p->next = j->pods;
        j->pods = p;
    }
    const char *node = pl_kube_field(pod, "spec.nodeName");
    const cnode *info = node && !p->zone[0] && ev != PL_WATCH_DELETED ? node_info(c, node) : NULL;
    if (info) {
        snprintf(p->zone, sizeof p->zone, "%s", info->zone);
        if (j->rt && p->zone[0]) pl_job_driver_set_zone(j->rt, name, p->zone);
    }
    const char *phase = pl_kube_field(pod, "status.phase");
    if (strcmp(p->phase, phase ? phase : "Pending")) j->status_dirty = 1; /* nodes.running */
    snprintf(p->phase, sizeof p->phase, "%s", phase ? phase : "Pending");
    p->deleting = pl_kube_field(pod, "metadata.deletionTimestamp") != NULL;
    count_pod(j, p, ev, disrupted(pod));
    pl_pod_clock_set(&p->clock, ev != PL_WATCH_DELETED && !strcmp(p->phase, "Running"),
                     pl_now_ms(), &j->node_ms);
    /* a deleting Pod's worker got SIGTERM and leaves at a step boundary; the Pod's
     * end is a loss if it has not left by then */
    int ended = ev == PL_WATCH_DELETED || !strcmp(p->phase, "Failed") ||
                !strcmp(p->phase, "Succeeded");
    if (ended && !p->gone_reported && j->rt) {
        p->gone_reported = 1;
        char cause[96];
        snprintf(cause, sizeof cause, "pod %s", ev == PL_WATCH_DELETED ? "deleted" : p->phase);
        pl_job_driver_worker_gone(j->rt, name, cause);
        pl_dash_feed_notice(j->feed, name, "exit", cause);
    }
    if (ev == PL_WATCH_DELETED) {
        *pp = p->next;
        free(p);
    }
    pl_workqueue_add(c->q, j->key);
}

static void drain_inbox(pl_controller *c)
{
    pthread_mutex_lock(&c->mu);
    inbox_item *it = c->head;
    c->head = c->tail = NULL;
    pthread_mutex_unlock(&c->mu);
    while (it) {
        inbox_item *next = it->next;
        if (it->is_pod) {
            pod_event(c, it->ev, it->obj);
        } else {
            const char *ns = pl_kube_field(it->obj, "metadata.namespace");
            const char *name = pl_kube_field(it->obj, "metadata.name");
            cjob *j = ns && name ? job_get(c, ns, name) : NULL;
            if (j) {
                cJSON_Delete(j->obj);
                j->obj = it->ev == PL_WATCH_DELETED ? NULL : it->obj;
                if (j->obj) it->obj = NULL;
                pl_workqueue_add(c->q, j->key);
            }
        }
        cJSON_Delete(it->obj);
        free(it);
        it = next;
    }
}

/* -------------------------------------------------------------- reconcile */

/* The manifest the workers and the runtime parse: what the user wrote. */
static char *manifest_text(const cJSON *obj)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "apiVersion", "pliant.dev/v1alpha1");
    cJSON_AddStringToObject(m, "kind", "TrainingJob");
    cJSON *md = cJSON_AddObjectToObject(m, "metadata");
    cJSON_AddStringToObject(md, "name", pl_kube_field(obj, "metadata.name"));
    cJSON_AddStringToObject(md, "namespace", pl_kube_field(obj, "metadata.namespace"));
    const cJSON *spec = cJSON_GetObjectItem(obj, "spec");
    cJSON_AddItemToObject(m, "spec", spec ? cJSON_Duplicate(spec, 1) : cJSON_CreateObject());
    char *text = cJSON_Print(m);
    cJSON_Delete(m);
    return text;
}

/* A base64 field of the Secret as a heap string, or NULL. */
static char *secret_field(const cJSON *secret, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(secret, "data"), key);
    return cJSON_IsString(v) ? pl_base64_decode(v->valuestring) : NULL;
}

/* API(c, ...) with the request's id in a variable (of a caller that names the row). */
#define API_ID(c, id, call, st) ((c)->api_t0 = pl_now_ms(), api_done((c), (id), (call), (st)))

/* Creates an object (request id, a create row): 0, 1 when it exists (409: reconcile is
 * idempotent), −1 with *st. */
static int create_owned(pl_controller *c, cjob *j, pl_kube_req id, cJSON *obj, pl_kube_status *st)
{
    if (!obj) return pl_kube_status_set(st, 0, "InternalError", "out of memory");
    pl_kube_ref r = job_ref(j, id, NULL);
    int rc = API_ID(c, id, pl_kube_create(c->api, &r, obj, NULL, st), st);
    cJSON_Delete(obj);
    if (rc && st->http != 409) {
        pl_log(PL_LOG_WARN, "%s: create %s: %s", j->key, r.plural, st->message);
        return -1;
    }
    return rc ? 1 : 0;
}

/* Deletes an object (request id, a delete row); one already gone is fine. */
static int delete_obj(pl_controller *c, cjob *j, pl_kube_req id, const char *name)
{
    pl_kube_ref r = job_ref(j, id, name);
    pl_kube_status st;
    if (API_ID(c, id, pl_kube_delete(c->api, &r, "Background", &st), &st) && st.http != 404) {
        pl_log(PL_LOG_WARN, "%s: delete %s %s: %s", j->key, r.plural, name, st.message);
        return -1;
    }
    return 0;
}

/* The address workers dial: the configured one, or the job's Service (whose
 * EndpointSlice the leader writes), so that a new leader is reached at the same name. */
static const char *coordinator_host(const pl_controller *c, const cjob *j, char *buf, size_t len)
{
    if (c->cfg.coordinator_host) return c->cfg.coordinator_host;
    char svc[PL_NAME_LEN];
    pl_job_service_name(j->obj, svc, sizeof svc);
    snprintf(buf, len, "%s.%s.svc", svc, j->ns);
    return buf;
}

static pl_job_objects job_objects(const pl_controller *c, const cjob *j, const char *coordinator)
{
    return (pl_job_objects){j->obj, &j->spec, c->cfg.worker_image, c->cfg.worker_command,
                            coordinator, NULL, 0};
}

/* status.cost of the last leader: the node time and samples it counted. */
static void restore_cost(cjob *j)
{
    const cJSON *cost = cJSON_GetObjectItem(cJSON_GetObjectItem(j->obj, "status"), "cost");
    const cJSON *h = cJSON_GetObjectItem(cost, "nodeHours");
    const cJSON *n = cJSON_GetObjectItem(cost, "samples");
    if (cJSON_IsNumber(h) && h->valuedouble > 0) j->node_ms += (int64_t)(h->valuedouble * 3.6e6);
    if (cJSON_IsNumber(n) && n->valuedouble > 0) j->samples = n->valuedouble;
}

/* The first reconcile of a job by this process: its spec parsed, and what its status
 * recorded (phase, Pods failed and preempted, start and completion times) taken up, so
 * that a new leader goes on where the last one stopped. */
static void first_look(pl_controller *c, cjob *j)
{
    char *text = manifest_text(j->obj), err[1024] = "";
    if (text && pl_job_parse(text, NULL, &j->spec, err, sizeof err) == 0) j->have_spec = 1;
    else j->invalid = 1;
    free(text);
    const char *prior = pl_kube_field(j->obj, "status.phase");
    if (prior) snprintf(j->phase, sizeof j->phase, "%s", prior);
    const cJSON *nodes = cJSON_GetObjectItem(cJSON_GetObjectItem(j->obj, "status"), "nodes");
    const cJSON *failed = cJSON_GetObjectItem(nodes, "failed");
    const cJSON *preempted = cJSON_GetObjectItem(nodes, "preempted");
    j->failed_pods = (int)pl_json_int_or(failed, 0, INT_MAX, j->failed_pods);
    j->preempted = (int)pl_json_int_or(preempted, 0, INT_MAX, j->preempted);
    j->owed = j->streak = 0; /* Pods listed before: replaced by the last leader, or now */
    restore_cost(j);
    const char *t0 = pl_kube_field(j->obj, "status.startTime");
    const char *t1 = pl_kube_field(j->obj, "status.completionTime");
    if (t0 && (j->start_ms = pl_rfc3339_to_now_ms(t0, pl_now_ms())) != PL_NO_TIME)
        snprintf(j->start_time, sizeof j->start_time, "%s", t0);
    if (t1 && (j->end_ms = pl_rfc3339_to_now_ms(t1, pl_now_ms())) != PL_NO_TIME)
        snprintf(j->completion_time, sizeof j->completion_time, "%s", t1);
    if (j->invalid) {
        set_phase(j, "Failed", "InvalidSpec", err);
        event(c, j, "Warning", "Failed", "Validate", "%s", err);
    }
}

/* The control port the job's Service names (0 when it has none: 404), or -1 when the
 * API server did not answer (the caller retries: a new port would strand the workers). */
static int service_port(pl_controller *c, cjob *j)
{
    char svc[PL_NAME_LEN];
    pl_job_service_name(j->obj, svc, sizeof svc);
    pl_kube_ref r = job_ref(j, PL_REQ_SERVICE_GET, svc);
    pl_kube_status st;
    cJSON *service = NULL;
    if (API(c, SERVICE_GET, pl_kube_get(c->api, &r, NULL, &service, &st), &st)) {
        if (st.http == 404) return 0;
        pl_log(PL_LOG_WARN, "%s: service %s: %s", j->key, svc, st.message);
        return -1;
    }
    const cJSON *port = cJSON_GetObjectItem(
        cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(service, "spec"), "ports"), 0),
        "port");
    int n = (int)pl_json_int_or(port, 0, 65535, 0);
    cJSON_Delete(service);
    return n;
}

/* The plan of a training job's status cannot be taken over: a new plan, on new workers
 * (those running hold the state of a plan the new coordinator does not know, and would
 * take its first plan for an old one), from the newest checkpoint. */
static void bad_status_plan(pl_controller *c, cjob *j, const char *why)
{
    pl_log(PL_LOG_WARN, "%s: %s; restarting the workers from the newest checkpoint", j->key, why);
    event(c, j, "Warning", "BadStatusPlan", "TakeOver",
          "%s; restarting the workers from the newest checkpoint", why);
    j->restart_workers = 1;
}

/* A new leader (the Secret exists): the same control port (the Service's, which
 * the workers reconnect to), and, when the job was training, the plan of its
 * status to take over (into plan; a plan that does not read is named, and the job
 * starts a new plan on the same port). -1 when the port is not known yet. */
static int restore_config(pl_controller *c, cjob *j, pl_job_driver_config *rc,
                          pl_plan_status *plan)
{
    if ((rc->port = service_port(c, j)) < 0) return -1;
    const char *phase = pl_kube_field(j->obj, "status.phase");
    const cJSON *status = cJSON_GetObjectItem(j->obj, "status");
    const cJSON *sp = cJSON_GetObjectItem(status, "plan");
    const cJSON *step = cJSON_GetObjectItem(status, "step");
    if (!phase || !strcmp(phase, "Pending") || !strcmp(phase, "Succeeded") ||
        !strcmp(phase, "Failed") || !strcmp(phase, "Suspended"))
        return 0;
    char err[512] = "status.plan: missing";
    if (!sp || pl_plan_status_read(sp, plan, err, sizeof err)) {
        bad_status_plan(c, j, err);
        return 0;
    }
    rc->pipes = plan->pipes;
    rc->npipes = plan->npipes;
    rc->generation = plan->generation;
    rc->step = pl_json_int_or(step, 0, PL_JSON_INT_MAX, 0);
    const cJSON *nr = cJSON_GetObjectItem(status, "reconfigurations");
    j->reconfigs_before = (int)pl_json_int_or(nr, 0, INT_MAX, j->reconfigs_before);
    snprintf(j->phase, sizeof j->phase, "%s", phase); /* no new Started event */
    return 0;
}

/* The control port a job claims: its runtime's, else (not started by this process yet)
 * the one its status recorded, unless it ended. */
static int claimed_port(const cjob *j)
{
    if (j->rt) return pl_job_driver_port(j->rt);
    const char *phase = pl_kube_field(j->obj, "status.phase");
    if (phase && (!strcmp(phase, "Succeeded") || !strcmp(phase, "Failed"))) return 0;
    const cJSON *port = cJSON_GetObjectItem(cJSON_GetObjectItem(j->obj, "status"),
                                            "coordinatorPort");
    return (int)pl_json_int_or(port, 0, 65535, 0);
}

typedef struct {
    const pl_controller *c;
    const cjob *self;
} port_scan;

/* pl_job_driver_config.port_taken: a new job never takes the port of another job that a
 * new leader has not taken over yet (that job's workers dial it). */
static int port_taken(void *ctx, int port)
{
    const port_scan *ps = ctx;
    for (const cjob *o = ps->c->jobs; o; o = o->next)
        if (o != ps->self && claimed_port(o) == port) return 1;
    return 0;
}

/* A job's driver, started: NULL and err when the job cannot run. */
static pl_job_driver *start_driver(const pl_job_driver_config *cfg, char *err, size_t errlen)
{
    pl_job_driver *d = pl_job_driver_new(cfg, err, errlen);
    if (d && pl_job_driver_start(d, err, errlen)) {
        pl_job_driver_free(d);
        d = NULL;
    }
    return d;
}

/* The job's driver on rc's port: the plan rc takes over, or else (the coordinator
 * refuses it) a new plan on the same port, which new workers dial. *wait when the port
 * is still held by the process that led before: the caller tries again later, as a new
 * port would strand the workers. */
static pl_job_driver *take_over(pl_controller *c, cjob *j, pl_job_driver_config *rc,
                                int *wait, char *err, size_t errlen)
{
    pl_job_driver *d = start_driver(rc, err, errlen);
    if (!d && rc->port > 0 && pl_ctl_port_in_use(rc->bind_host, rc->port)) {
        pl_log(PL_LOG_WARN, "%s: port %d is still in use; taking over later", j->key, rc->port);
        if (strcmp(j->cond[0].reason, "PortInUse"))
            event(c, j, "Warning", "PortInUse", "TakeOver",
                  "control port %d is still in use; taking the job over once it is free",
                  rc->port);
        set_cond(j, "Created", 0, "PortInUse", "control port %d is still in use", rc->port);
        *wait = 1;
        return NULL;
    }
    if (!d && rc->npipes) {
        bad_status_plan(c, j, err);
        rc->npipes = 0;
        d = start_driver(rc, err, errlen);
    } else if (d && rc->npipes) {
        pl_log(PL_LOG_INFO, "%s: taking over generation %lld at step %lld on port %d", j->key,
               (long long)rc->generation, (long long)rc->step, rc->port);
    }
    return d;
}

/* A new Secret with the runtime's token, certificate and key. */
static int create_secret(pl_controller *c, cjob *j)
{
    pl_job_objects o = job_objects(c, j, "");
    char *pem = pl_job_driver_cert_pem(j->rt), *kpem = pl_job_driver_key_pem(j->rt);
    pl_kube_status st;
    int rc = pem && kpem ? create_owned(c, j, PL_REQ_SECRET_CREATE,
                                        pl_job_secret(&o, pl_job_driver_token(j->rt), pem, kpem),
                                        &st)
                         : -1;
    free(pem);
    free(kpem);
    return rc < 0 ? -1 : 0;
}

/* A Secret of the job's name that this job does not own (another object's, or left by
 * an earlier job of the same name that the garbage collector has not deleted yet): its
 * token and key are not taken. The Created condition says so (an Event when it first
 * does); the caller retries with back-off, so the job goes on once the Secret is gone. */
static int foreign_secret(pl_controller *c, cjob *j, const char *name)
{
    const char *uid = pl_kube_field(j->obj, "metadata.uid");
    char msg[400];
    snprintf(msg, sizeof msg,
             "Secret %s exists and its ownerReferences do not name this TrainingJob (uid %s): "
             "its token and key are not reused; delete the Secret or rename the job",
             name, uid ? uid : "none");
    int first = strcmp(j->cond[0].reason, "SecretConflict") != 0; /* COND_TYPES[0]: Created */
    set_cond(j, "Created", 0, "SecretConflict", "%s", msg);
    if (first) event(c, j, "Warning", "SecretConflict", "Start", "%s", msg);
    pl_log(PL_LOG_WARN, "%s: %s", j->key, msg);
    return -1;
}

/* The runtime: token and certificate from the Secret when it exists and this job owns
 * it (a new leader), else fresh ones, put into a new Secret. */
static int start_runtime(pl_controller *c, cjob *j)
{
    char sname[PL_NAME_LEN];
    pl_job_secret_name(j->obj, sname, sizeof sname);
    pl_kube_ref r = job_ref(j, PL_REQ_SECRET_GET, sname);
    pl_kube_status st;
    cJSON *secret = NULL;
    if (API(c, SECRET_GET, pl_kube_get(c->api, &r, NULL, &secret, &st), &st) && st.http != 404) {
        pl_log(PL_LOG_WARN, "%s: secret: %s", j->key, st.message);
        return -1;
    }
    if (secret && !pl_job_owns(j->obj, secret)) {
        cJSON_Delete(secret);
        return foreign_secret(c, j, sname);
    }
    char host[600];
    char *token = secret_field(secret, "token"), *cert = secret_field(secret, "ca.crt"),
         *key = secret_field(secret, "tls.key"), *text = manifest_text(j->obj);
    pl_job_driver_config rc = {.manifest = text,
                               .bind_host = c->cfg.bind_host ? c->cfg.bind_host : "0.0.0.0",
                               .cert_host = coordinator_host(c, j, host, sizeof host),
                               .token = token,
                               .cert_pem = cert, .key_pem = key,
                               .n_start = j->spec.nodes.max > 0 ? j->spec.nodes.max
                                                                : j->spec.nodes.min,
                               .start_grace_ms = START_GRACE_MS,
                               .port_base = c->cfg.port_base, .ports = PORT_RANGE};
    port_scan ps = {c, j};
    rc.port_taken = port_taken;
    rc.port_ctx = &ps;
    pl_plan_status plan = {0}; /* the plan a new leader takes over */
    char err[1024] = "";
    int wait = secret && restore_config(c, j, &rc, &plan);
    rc.profile_json = stored_profile(j);
    j->profile_saved = rc.profile_json != NULL;
    if (!wait && text) j->rt = take_over(c, j, &rc, &wait, err, sizeof err);
    pl_plan_status_free(&plan);
    free(token);
    free(cert);
    free(key);
    free(text);
    cJSON_Delete(secret);
    if (wait) return -1; /* again after the back-off */
    if (!j->rt) {
        /* a job the coordinator cannot run (a missing data file, no checkpoint to
         * resume): Failed, naming why */
        pl_log(PL_LOG_WARN, "%s: %s", j->key, err);
        set_phase(j, "Failed", "CannotStart", err);
        event(c, j, "Warning", "Failed", "Start", "%s", err);
        pl_rfc3339_now(j->completion_time, sizeof j->completion_time);
        j->end_ms = pl_now_ms();
        return 0;
    }
    if (!secret && create_secret(c, j)) {
        job_stop(c, j);
        return -1;
    }
    set_cond(j, "Created", 1, "Created", "coordinator on port %d", pl_job_driver_port(j->rt));
    open_page(c, j);
    for (const cpod *p = j->pods; p; p = p->next)
        if (p->zone[0]) pl_job_driver_set_zone(j->rt, p->name, p->zone);
    /* counters exist from the start (Prometheus practice) */
    pl_job_metrics_steps(c->cfg.metrics, j->ns, j->name, 0, NAN);
    pl_log(PL_LOG_INFO, "%s: coordinator on %s:%d", j->key, rc.cert_host,
           pl_job_driver_port(j->rt));
    return 0;
}

/* The Service's EndpointSlice names this replica (the leader): created, or patched to
 * this replica's address and the job's port (a new leader takes over). */
static int ensure_slice(pl_controller *c, cjob *j)
{
    if (j->slice_ok || !c->cfg.advertise_ip) return 0;
    pl_job_objects o = job_objects(c, j, "");
    cJSON *slice = pl_job_endpoint_slice(&o, c->cfg.advertise_ip, pl_job_driver_port(j->rt));
    pl_kube_status st;
    int rc = create_owned(c, j, PL_REQ_SLICE_CREATE, cJSON_Duplicate(slice, 1), &st);
    if (rc == 1) {
        cJSON *patch = cJSON_CreateObject();
        cJSON_AddItemToObject(patch, "endpoints", cJSON_DetachItemFromObject(slice, "endpoints"));
        cJSON_AddItemToObject(patch, "ports", cJSON_DetachItemFromObject(slice, "ports"));
        pl_kube_ref r = job_ref(j, PL_REQ_SLICE_PATCH, pl_kube_field(slice, "metadata.name"));
        rc = API(c, SLICE_PATCH, pl_kube_patch(c->api, &r, PL_KUBE_MERGE_PATCH, patch, NULL, &st),
                 &st);
        if (rc) pl_log(PL_LOG_WARN, "%s: endpoint slice: %s", j->key, st.message);
        cJSON_Delete(patch);
    }
    cJSON_Delete(slice);
    if (rc) return -1;
    j->slice_ok = 1;
    return 0;
}

/* The job's Service, EndpointSlice and (when enabled) NetworkPolicy, once per runtime:
 * not a request on every reconcile. */
static int ensure_network(pl_controller *c, cjob *j)
{
    pl_job_objects o = job_objects(c, j, "");
    pl_kube_status st;
    if (!j->service_ok) {
        if (create_owned(c, j, PL_REQ_SERVICE_CREATE,
                         pl_job_service(&o, pl_job_driver_port(j->rt)), &st) < 0)
            return -1;
        j->service_ok = 1;
    }
    if (ensure_slice(c, j)) return -1;
    if (c->cfg.network_policy && !j->policy_ok) {
        if (create_owned(c, j, PL_REQ_POLICY_CREATE,
                         pl_job_network_policy(&o, c->cfg.operator_namespace), &st) < 0)
            return -1;
        j->policy_ok = 1;
    }
    return 0;
}

/* k of a Pod named <job>-w<k>; −1 for another name. */
static int pod_index(const char *prefix, const char *name)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) || !name[n] || strspn(name + n, "0123456789") != strlen(name + n))
        return -1;
    return atoi(name + n);
}

static int pod_finished(const cpod *p)
{
    return !strcmp(p->phase, "Failed") || !strcmp(p->phase, "Succeeded");
}

/* The host names of the nodes the coordinator refuses now (cooling down). */
static int avoid_nodes(pl_controller *c, cjob *j, const char **out)
{
    const char *names[MAX_AVOID];
    int n = pl_coord_cooling_nodes(pl_job_driver_coord(j->rt), (int64_t)pl_now_ms(), names,
                                   MAX_AVOID);
    for (int i = 0; i < n; i++) {
        const cnode *info = node_info(c, names[i]);
        out[i] = info ? info->hostname : names[i];
    }
    return n;
}

/* How many worker Pods may exist now: all desired, but while failed ones wait for
 * their back-off, not their replacements (the key comes back when it ends). */
static int pods_allowed(pl_controller *c, cjob *j, int desired)
{
    if (!j->owed) return desired;
    int64_t wait = j->failed_ms + pl_replacement_backoff_ms(j->streak) - (int64_t)pl_now_ms();
    if (wait <= 0) {
        j->owed = 0;
        return desired;
    }
    pl_workqueue_add_after(c->q, j->key, wait);
    return desired - j->owed;
}

/* A Pod the API server refused (quota, an admission webhook, Pod Security): a Warning
 * Event and condition PodsCreated=False with its message, as controllers do; the
 * caller retries with back-off. */
static void failed_create(pl_controller *c, cjob *j, const pl_kube_status *st)
{
    set_cond(j, "PodsCreated", 0, "FailedCreate", "%s", st->message);
    event(c, j, "Warning", "FailedCreate", "CreatePod", "Error creating: %s", st->message);
}

/* Worker Pods up to the desired count, named <job>-w<k>, k never reused, kept off the
 * nodes cooling down. */
static int ensure_pods(pl_controller *c, cjob *j)
{
    int desired = j->spec.nodes.max > 0 ? j->spec.nodes.max : j->spec.nodes.min, live = 0;
    char prefix[PL_NAME_LEN];
    pl_job_pod_prefix(j->obj, prefix, sizeof prefix);
    for (const cpod *p = j->pods; p; p = p->next) {
        live += !p->deleting && !pod_finished(p);
        int k = pod_index(prefix, p->name);
        if (k >= j->next_k) j->next_k = k + 1;
    }
    int allowed = pods_allowed(c, j, desired);
    if (live >= desired) set_cond(j, "PodsCreated", 1, "Created", "every worker Pod was created");
    if (live >= allowed) return 0;
    char coord[700], host[600];
    snprintf(coord, sizeof coord, "%s:%d", coordinator_host(c, j, host, sizeof host),
             pl_job_driver_port(j->rt));
    const char *avoid[MAX_AVOID];
    pl_job_objects o = job_objects(c, j, coord);
    o.avoid = avoid;
    o.navoid = avoid_nodes(c, j, avoid);
    for (; live < allowed; live++) {
        int rc, k;
        pl_kube_status st;
        do rc = create_owned(c, j, PL_REQ_POD_CREATE, pl_job_pod(&o, k = j->next_k++), &st);
        while (rc == 1); /* the name exists: the next one */
        if (rc) {
            failed_create(c, j, &st);
            return -1;
        }
        /* counted at once: the watch reports it later (controller-runtime's expectations) */
        cpod *p = calloc(1, sizeof *p);
        if (!p) return -1;
        pl_job_pod_name(j->obj, k, p->name, sizeof p->name);
        snprintf(p->phase, sizeof p->phase, "Pending");
        pl_log(PL_LOG_INFO, "%s: created pod %s%s", j->key, p->name,
               o.navoid ? " (kept off nodes cooling down)" : "");
        p->next = j->pods;
        j->pods = p;
    }
    if (live >= desired)
        set_cond(j, "PodsCreated", 1, "Created", "every worker Pod was created");
    return 0;
}

/* Deletes the Pods of the workers the coordinator took out while they still ran (missed
 * heartbeats, a missed step deadline): such a Pod would go on holding its node and counting
 * as a worker, and its process could wake with an old plan. Its node cools down in the
 * coordinator, so the replacement goes elsewhere (avoid_nodes); a deletion counts as a
 * preemption, not toward backoffLimit. */
static int fence_lost(pl_controller *c, cjob *j)
{
    int rc = 0;
    for (cpod *p; (p = silent_pod(j));) {
        p->fenced = 1;
        if (delete_obj(c, j, PL_REQ_POD_DELETE, p->name)) {
            rc = -1;
            p->fenced = 0; /* again at the next reconcile */
            break;
        }
        p->deleting = 1; /* replaced at once (ensure_pods); the watch confirms it */
        pl_log(PL_LOG_INFO, "%s: deleted pod %s: its worker was lost while it still ran", j->key,
               p->name);
        event(c, j, "Warning", "LostWorkerDeleted", "DeletePod",
              "pod %s: its worker was lost (missed heartbeats or step deadline) while the Pod "
              "still ran; deleted, a replacement takes its place", p->name);
    }
    return rc;
}

/* Finished worker Pods beyond the newest few, once the failed ones were replaced (the
 * last few stay for their logs). */
static int prune_finished(pl_controller *c, cjob *j)
{
    if (j->owed) return 0;
    char prefix[PL_NAME_LEN];
    pl_job_pod_prefix(j->obj, prefix, sizeof prefix);
    int n = 0, ks[256], del[256], rc = 0;
    for (const cpod *p = j->pods; p && n < 256; p = p->next)
        if (!p->deleting && pod_finished(p) && pod_index(prefix, p->name) >= 0)
            ks[n++] = pod_index(prefix, p->name);
    int m = pl_finished_to_delete(ks, n, del);
    for (int i = 0; i < m; i++) {
        char name[PL_NAME_LEN];
        pl_job_pod_name(j->obj, del[i], name, sizeof name);
        rc |= delete_obj(c, j, PL_REQ_POD_DELETE, name);
    }
    return rc;
}

/* A finished or suspended job's Pods, by runPolicy.cleanPodPolicy. */
static int clean_pods(pl_controller *c, cjob *j, const char *policy)
{
    int rc = 0;
    for (const cpod *p = j->pods; p; p = p->next) {
        int running = !strcmp(p->phase, "Running") || !strcmp(p->phase, "Pending");
        if (!p->deleting && (!strcmp(policy, "All") || (!strcmp(policy, "Running") && running)))
            rc |= delete_obj(c, j, PL_REQ_POD_DELETE, p->name);
    }
    return rc;
}

static int finished(const cjob *j)
{
    return !strcmp(j->phase, "Succeeded") || !strcmp(j->phase, "Failed");
}

/* A finished job: its Pods cleaned by cleanPodPolicy, deleted after
 * ttlSecondsAfterFinished. */
static int reconcile_finished(pl_controller *c, cjob *j)
{
    const char *policy = pl_run_policy_str(j->obj, "cleanPodPolicy", "Running");
    int64_t ttl = pl_run_policy_int(j->obj, "ttlSecondsAfterFinished");
    if (ttl >= 0 && j->completion_time[0]) {
        int64_t left = j->end_ms + ttl * 1000 - (int64_t)pl_now_ms();
        if (left <= 0) return delete_obj(c, j, PL_REQ_JOB_DELETE, j->name);
        pl_workqueue_add_after(c->q, j->key, left);
    }
    if (clean_pods(c, j, policy)) return -1;
    return j->status_dirty ? write_status(c, j) : 0;
}

/* activeDeadlineSeconds (from status.startTime, Pending included) or backoffLimit
 * passed: the job fails. 1 when it did. */
static int past_limits(pl_controller *c, cjob *j)
{
    int64_t deadline = pl_run_policy_int(j->obj, "activeDeadlineSeconds");
    int64_t limit = pl_run_policy_int(j->obj, "backoffLimit");
    char msg[200];
    if (deadline >= 0 && j->start_time[0]) {
        int64_t left = j->start_ms + deadline * 1000 - (int64_t)pl_now_ms();
        if (left <= 0) {
            snprintf(msg, sizeof msg, "spec.runPolicy.activeDeadlineSeconds (%lld) passed",
                     (long long)deadline);
            fail_job(c, j, "DeadlineExceeded", msg);
            return 1;
        }
        pl_workqueue_add_after(c->q, j->key, left);
    }
    if (pl_backoff_limit_exceeded(j->failed_pods, limit)) {
        snprintf(msg, sizeof msg, "%d worker Pods failed, more than spec.runPolicy.backoffLimit (%lld)",
                 j->failed_pods, (long long)limit);
        fail_job(c, j, "BackoffLimitExceeded", msg);
        return 1;
    }
    return 0;
}

static int reconcile(pl_controller *c, cjob *j)
{
    if (!j->obj || pl_kube_field(j->obj, "metadata.deletionTimestamp")) {
        job_stop(c, j); /* the owned objects go with the job (garbage collection) */
        if (!j->obj) job_free(c, j);
        return 0;
    }
    if (!j->have_spec && !j->invalid) first_look(c, j);
    if (j->invalid) return j->status_dirty ? write_status(c, j) : 0;
    if (j->rt && j->done_ms && pl_now_ms() - j->done_ms >= FLUSH_MS) job_stop(c, j);
    if (finished(j)) return j->rt ? 0 : reconcile_finished(c, j); /* or flushing `stop` */
    if (pl_run_policy_int(j->obj, "suspend") == 1) {
        job_stop(c, j);
        set_phase(j, "Suspended", "Suspended", "spec.runPolicy.suspend is true");
        j->start_time[0] = 0; /* the deadline counts again from the resumption (Job's) */
        if (clean_pods(c, j, "All")) return -1;
        return write_status(c, j);
    }
    if (!j->start_time[0]) { /* the job starts when first reconciled */
        pl_rfc3339_now(j->start_time, sizeof j->start_time);
        j->start_ms = pl_now_ms();
        j->status_dirty = 1;
    }
    if (past_limits(c, j)) {
        pl_workqueue_add_after(c->q, j->key, FLUSH_MS + 100);
        return write_status(c, j);
    }
    if (!j->rt && start_runtime(c, j)) {
        if (j->status_dirty) write_status(c, j); /* a SecretConflict condition shows at once */
        return -1;
    }
    if (!j->rt) return write_status(c, j); /* it cannot start: Failed */
    if (j->restart_workers) { /* bad_status_plan */
        if (clean_pods(c, j, "All")) return -1;
        j->restart_workers = 0;
    }
    if (ensure_network(c, j) || fence_lost(c, j) || ensure_pods(c, j) || prune_finished(c, j)) {
        if (j->status_dirty) write_status(c, j); /* a FailedCreate condition shows at once */
        return -1;
    }
    return j->status_dirty ? write_status(c, j) : 0;
}

/* ------------------------------------------------------------------ the loop */

/* After a reconcile: a failed one again after the API server's Retry-After when it
 * sent one (bounded by the client), else after the rate limiter's back-off. */
static void requeue(pl_controller *c, const char *key, int failed)
{
    if (!failed) pl_workqueue_forget(c->q, key);
    else if (c->retry_after_ms > 0) pl_workqueue_add_after(c->q, key, c->retry_after_ms);
    else pl_workqueue_add_rate_limited(c->q, key);
}

pl_controller *pl_controller_new(const pl_controller_config *cfg, char *err, size_t errlen)
{
    pl_controller *c = calloc(1, sizeof *c);
    if (!c) {
        pl_errf(err, errlen, "out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    if (!c->cfg.worker_command) c->cfg.worker_command = "/usr/local/bin/pliant";
    if (!c->cfg.worker_image) c->cfg.worker_image = "pliant-worker:latest";
    if (!c->cfg.identity) c->cfg.identity = "pliant-operator";
    pthread_mutex_init(&c->mu, NULL);
    if (!(c->q = pl_workqueue_new()) || !(c->api = pl_kube_client_new(cfg->kc, err, errlen))) {
        if (!err[0]) pl_errf(err, errlen, "out of memory");
        pl_controller_free(c);
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        c->inf[i].c = c;
        c->inf[i].is_pod = i;
        if (!(c->inf[i].client = pl_kube_client_new(cfg->kc, err, errlen))) {
            pl_controller_free(c);
            return NULL;
        }
        pl_kube_client_set_stop(c->inf[i].client, &c->stop);
    }
    pl_kube_client_set_stop(c->api, &c->stop);
    return c;
}

int pl_controller_synced(const pl_controller *c)
{
    return atomic_load(&c->inf[0].synced) && atomic_load(&c->inf[1].synced);
}

int pl_controller_run(pl_controller *c, const atomic_int *stop, char *err, size_t errlen)
{
    for (int i = 0; i < 2; i++) {
        if (pthread_create(&c->inf[i].th, NULL, informer_main, &c->inf[i]))
            return pl_errf(err, errlen, "cannot start an informer thread");
        c->inf[i].started = 1;
    }
    int64_t resync = pl_now_ms();
    while (!atomic_load(stop)) {
        /* reconcile from complete caches only (a Pod not listed yet would be created
         * again): synced is read before draining, as the lists' events come first */
        int synced = pl_controller_synced(c);
        drain_inbox(c);
        if (!synced) {
            struct timespec ts = {0, LOOP_MS * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        /* the loop waits on the control servers while jobs run (a step is several
         * message round trips), on the work queue otherwise */
        int nrt = 0;
        for (cjob *j = c->jobs; j; j = j->next) nrt += j->rt != NULL;
        for (cjob *j = c->jobs; j; j = j->next) {
            if (!j->rt) continue;
            int wait = pl_workqueue_len(c->q) ? 0 : LOOP_MS / nrt;
            char why[256];
            if (pl_job_driver_poll(j->rt, wait, why, sizeof why))
                pl_log(PL_LOG_WARN, "%s: %s", j->key, why);
            observe(c, j);
        }
        char key[512];
        if (pl_workqueue_get(c->q, key, sizeof key, nrt ? 0 : LOOP_MS) == 1) {
            cjob *j = job_find(c, key);
            c->retry_after_ms = 0;
            int rc = j ? reconcile(c, j) : 0;
            pl_workqueue_done(c->q, key);
            requeue(c, key, rc);
        }
        for (cjob *j = c->jobs; j; j = j->next)
            if (j->status_dirty && pl_now_ms() - j->status_ms >= STATUS_EVERY_MS / 4)
                write_status(c, j);
        if (pl_now_ms() - resync >= RESYNC_MS) {
            resync = pl_now_ms();
            for (cjob *j = c->jobs; j; j = j->next) pl_workqueue_add(c->q, j->key);
        }

    }
    return 0;
}

void pl_controller_free(pl_controller *c)
{
    if (!c) return;
    atomic_store(&c->stop, 1);
    for (int i = 0; i < 2; i++)
        if (c->inf[i].started) pthread_join(c->inf[i].th, NULL);
    while (c->jobs) job_free(c, c->jobs);
    while (c->head) {
        inbox_item *it = c->head;
        c->head = it->next;
        cJSON_Delete(it->obj);
        free(it);
    }
    for (int i = 0; i < 2; i++) pl_kube_client_free(c->inf[i].client);
    pl_kube_client_free(c->api);
    pl_workqueue_free(c->q);
    while (c->nodes) {
        cnode *n = c->nodes;
        c->nodes = n->next;
        free(n);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}
