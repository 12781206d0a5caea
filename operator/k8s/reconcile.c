/* The reconcile of one job (controller.c), idempotent and level-based: its spec and
 * what its status recorded taken up once, then by the state seen now: deleted, invalid,
 * finished (cleanPodPolicy, TTL), suspended, past activeDeadlineSeconds or backoffLimit,
 * or running: its runtime (job_runtime.c), its worker Pods created, fenced and pruned. */
#include "controller_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job_policy.h"
#include "json_num.h"
#include "oplog.h"

#define MAX_AVOID 64           /* nodes cooling down a Pod is kept off, at most */

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
        job_event(c, j, "Warning", "Failed", "Validate", "%s", err);
    }
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

/* The first Pod whose worker the coordinator lost to missed heartbeats or a missed step
 * deadline while the Pod still runs (a node partitioned or silent, a hung process); NULL:
 * none. */
cpod *silent_pod(cjob *j)
{
    pl_coord *co = pl_job_driver_coord(j->rt);
    for (cpod *p = j->pods; p; p = p->next)
        if (!p->fenced && !p->deleting && !pod_finished(p) && pl_coord_worker_silent(co, p->name))
            return p;
    return NULL;
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
    job_event(c, j, "Warning", "FailedCreate", "CreatePod", "Error creating: %s", st->message);
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
        job_event(c, j, "Warning", "LostWorkerDeleted", "DeletePod",
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

int reconcile(pl_controller *c, cjob *j)
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
