/* A job's runtime (controller.c's reconcile): its driver started with a token, certificate
 * and key from the job's Secret (a new leader, which takes over the plan of the job's status
 * on the same control port) or fresh ones put into a new Secret; and the objects it needs,
 * once per runtime: its Service, EndpointSlice and NetworkPolicy. */
#include "controller_internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_server.h"
#include "job_metrics.h"
#include "job_policy.h"
#include "json_num.h"
#include "oplog.h"
#include "plan_status.h"

#define START_GRACE_MS 20000   /* the first plan: all Pods, or after this long those running */
#define PORT_RANGE 256         /* control ports tried from port_base (the chart's NetworkPolicy) */

/* The manifest the workers and the runtime parse: what the user wrote. */
char *manifest_text(const cJSON *obj)
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

/* The address workers dial: the configured one, or the job's Service (whose
 * EndpointSlice the leader writes), so that a new leader is reached at the same name. */
const char *coordinator_host(const pl_controller *c, const cjob *j, char *buf, size_t len)
{
    if (c->cfg.coordinator_host) return c->cfg.coordinator_host;
    char svc[PL_NAME_LEN];
    pl_job_service_name(j->obj, svc, sizeof svc);
    snprintf(buf, len, "%s.%s.svc", svc, j->ns);
    return buf;
}

pl_job_objects job_objects(const pl_controller *c, const cjob *j, const char *coordinator)
{
    return (pl_job_objects){j->obj, &j->spec, c->cfg.worker_image, c->cfg.worker_command,
                            coordinator, NULL, 0};
}

/* The profile a new leader passes to its driver: status.profile (spec.profile auto). */
static const char *stored_profile(const cjob *j)
{
    const char *text = pl_kube_field(j->obj, "status.profile");
    return text && !strcmp(j->spec.profile, "auto") ? text : NULL;
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
    job_event(c, j, "Warning", "BadStatusPlan", "TakeOver",
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
        if (strcmp(j->cond[COND_CREATED].reason, "PortInUse"))
            job_event(c, j, "Warning", "PortInUse", "TakeOver",
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
    int first = strcmp(j->cond[COND_CREATED].reason, "SecretConflict") != 0;
    set_cond(j, "Created", 0, "SecretConflict", "%s", msg);
    if (first) job_event(c, j, "Warning", "SecretConflict", "Start", "%s", msg);
    pl_log(PL_LOG_WARN, "%s: %s", j->key, msg);
    return -1;
}

/* The job's Secret into *secret, NULL while there is none (a new job); -1 when it cannot
 * be read or this job does not own it. */
static int get_secret(pl_controller *c, cjob *j, cJSON **secret)
{
    char sname[PL_NAME_LEN];
    pl_job_secret_name(j->obj, sname, sizeof sname);
    pl_kube_ref r = job_ref(j, PL_REQ_SECRET_GET, sname);
    pl_kube_status st;
    *secret = NULL;
    if (API(c, SECRET_GET, pl_kube_get(c->api, &r, NULL, secret, &st), &st) && st.http != 404) {
        pl_log(PL_LOG_WARN, "%s: secret: %s", j->key, st.message);
        return -1;
    }
    if (*secret && !pl_job_owns(j->obj, *secret)) {
        cJSON_Delete(*secret);
        *secret = NULL;
        return foreign_secret(c, j, sname);
    }
    return 0;
}

/* The job's driver with the Secret's token, certificate and key, or fresh ones without a
 * Secret; with one (a new leader), on the Service's port, taking over the plan of the
 * job's status. NULL with *wait or err as take_over's. */
static pl_job_driver *new_driver(pl_controller *c, cjob *j, const cJSON *secret, int *wait,
                                 char *err, size_t errlen)
{
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
    pl_job_driver *d = NULL;
    *wait = secret && restore_config(c, j, &rc, &plan);
    rc.profile_json = stored_profile(j);
    j->profile_saved = rc.profile_json != NULL;
    if (!*wait && text) d = take_over(c, j, &rc, wait, err, errlen);
    pl_plan_status_free(&plan);
    free(token);
    free(cert);
    free(key);
    free(text);
    return d;
}

/* A job the coordinator cannot run (a missing data file, no checkpoint to resume):
 * Failed, naming why. */
static void cannot_start(pl_controller *c, cjob *j, const char *err)
{
    pl_log(PL_LOG_WARN, "%s: %s", j->key, err);
    set_phase(j, "Failed", "CannotStart", err);
    job_event(c, j, "Warning", "Failed", "Start", "%s", err);
    pl_rfc3339_now(j->completion_time, sizeof j->completion_time);
    j->end_ms = pl_now_ms();
}

/* The driver started: a new Secret when there was none, then condition Created, the
 * dashboard page, the zones of the Pods known so far, the job's counters. */
static int driver_started(pl_controller *c, cjob *j, int new_secret)
{
    if (new_secret && create_secret(c, j)) {
        job_stop(c, j);
        return -1;
    }
    set_cond(j, "Created", 1, "Created", "coordinator on port %d", pl_job_driver_port(j->rt));
    open_page(c, j);
    for (const cpod *p = j->pods; p; p = p->next)
        if (p->zone[0]) pl_job_driver_set_zone(j->rt, p->name, p->zone);
    /* counters exist from the start (Prometheus practice) */
    pl_job_metrics_steps(c->cfg.metrics, j->ns, j->name, 0, NAN);
    char host[600];
    pl_log(PL_LOG_INFO, "%s: coordinator on %s:%d", j->key,
           coordinator_host(c, j, host, sizeof host), pl_job_driver_port(j->rt));
    return 0;
}

/* The runtime: token and certificate from the Secret when it exists and this job owns
 * it (a new leader), else fresh ones, put into a new Secret. */
int start_runtime(pl_controller *c, cjob *j)
{
    cJSON *secret;
    if (get_secret(c, j, &secret)) return -1;
    char err[1024] = "";
    int wait = 0;
    j->rt = new_driver(c, j, secret, &wait, err, sizeof err);
    int new_secret = secret == NULL;
    cJSON_Delete(secret);
    if (wait) return -1; /* again after the back-off */
    if (!j->rt) {
        cannot_start(c, j, err);
        return 0;
    }
    return driver_started(c, j, new_secret);
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
int ensure_network(pl_controller *c, cjob *j)
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
