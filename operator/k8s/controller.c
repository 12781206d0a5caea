/* The TrainingJob controller (controller.h): the entry points and the loop (informers in,
 * one reconcile at a time, each running job's driver polled in the same loop), and what its
 * files share: the API requests counted, Events, the jobs and their dashboard pages. */
#include "controller_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "job_metrics.h"
#include "oplog.h"

#define LOOP_MS 10             /* the loop's pace: work queue wait, control servers */
#define RESYNC_MS 15000        /* every job is reconciled again this often */
#define CONTROLLER_NAME "pliant.dev/operator"

/* ------------------------------------------------------------ requests, Events */

/* The object (or collection) of request id's resource in the job's namespace; the
 * status subresource's requests take the resource's ref. */
pl_kube_ref job_ref(const cjob *j, pl_kube_req id, const char *name)
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

/* A request API() timed, done: its latency and count (and error, but for 404 and 409) for
 * /metrics, a debug line, and its Retry-After kept for requeue. */
int api_done(pl_controller *c, pl_kube_req id, int rc, const pl_kube_status *st)
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

/* An Event about the job (events.k8s.io/v1), of this controller and instance. */
void job_event(pl_controller *c, cjob *j, const char *type, const char *reason,
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

/* API(c, ...) with the request's id in a variable (of a caller that names the row). */
#define API_ID(c, id, call, st) ((c)->api_t0 = pl_now_ms(), api_done((c), (id), (call), (st)))

/* Creates an object (request id, a create row): 0, 1 when it exists (409: reconcile is
 * idempotent), −1 with *st. */
int create_owned(pl_controller *c, cjob *j, pl_kube_req id, cJSON *obj, pl_kube_status *st)
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
int delete_obj(pl_controller *c, cjob *j, pl_kube_req id, const char *name)
{
    pl_kube_ref r = job_ref(j, id, name);
    pl_kube_status st;
    if (API_ID(c, id, pl_kube_delete(c->api, &r, "Background", &st), &st) && st.http != 404) {
        pl_log(PL_LOG_WARN, "%s: delete %s %s: %s", j->key, r.plural, name, st.message);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ jobs */

static cjob *job_find(pl_controller *c, const char *key)
{
    for (cjob *j = c->jobs; j; j = j->next)
        if (!strcmp(j->key, key)) return j;
    return NULL;
}

cjob *job_get(pl_controller *c, const char *ns, const char *name)
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
void page_path(const cjob *j, char *buf, size_t len)
{
    snprintf(buf, len, "/jobs/%s/%s/", j->ns, j->name);
}

/* A new runtime's page (a previous runtime's is replaced) and its feed. */
void open_page(pl_controller *c, cjob *j)
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

void job_stop(pl_controller *c, cjob *j)
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

void job_free(pl_controller *c, cjob *j)
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
            observe_job(c, j);
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

