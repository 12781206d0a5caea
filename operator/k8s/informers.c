/* The controller's informers (controller.c): the TrainingJob and worker Pod watches, each
 * on its own thread, put their events into the inbox; the loop drains it into the jobs'
 * caches (a Pod's phase and zone, its end counted as preempted or failed, a lost worker
 * told to the coordinator) and queues the jobs to reconcile. */
#include "controller_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job_policy.h"
#include "oplog.h"

/* An informer's event, on its thread: a copy of the object, into the inbox. */
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

/* An informer's thread: lists and watches TrainingJobs or worker Pods until the stop flag. */
void *informer_main(void *arg)
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
const cnode *node_info(pl_controller *c, const char *node)
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

/* The loop takes the inbox: each event into the jobs' caches (a TrainingJob's latest
 * object, a Pod's state), its job queued. */
void drain_inbox(pl_controller *c)
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
