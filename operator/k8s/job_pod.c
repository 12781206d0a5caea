/* A TrainingJob's worker Pod (pl_job_pod, job_objects.h): what the operator needs, with
 * spec.worker's fields merged in. The operator's own parts win: its labels
 * (app.kubernetes.io/name, app.kubernetes.io/managed-by, pliant.dev/job), its
 * environment variables (a user's variable of the same name is dropped), its volumes
 * and mounts (the Secret at /etc/pliant; a user's volume of the same name or mount at
 * that path is dropped), restartPolicy Never, the command and the zone spread. Its
 * defaults give way: the Pod Security "restricted" settings (podSecurityContext and
 * securityContext, key by key), automountServiceAccountToken false, the GPU limit
 * (resources), the emptyDir at /tmp (a user's mount at /tmp replaces it). */
#include "job_objects.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kube_client.h"

#define SECRET_VOLUME "pliant-job"
#define TMP_VOLUME "pliant-tmp"
#define SECRET_MODE 0440 /* owner and group (fsGroup) read: workers run as non-root */

/* The operator's worker environment, which a user's env cannot override. */
static const char *const OWN_ENV[] = {"PLIANT_COORDINATOR", "PLIANT_TOKEN_FILE", "PLIANT_CA",
                                      "PLIANT_HOST", "PLIANT_WORKER_NAME", "PLIANT_NODE",
                                      "PLIANT_ADVERTISE", "PLIANT_GRACE_SECONDS", NULL};
/* The files of the Secret a worker reads (not the coordinator's key). */
static const char *const WORKER_FILES[] = {"token", "ca.crt", "job.yaml", NULL};

static int listed(const char *const *list, const char *s)
{
    for (; s && *list; list++)
        if (!strcmp(*list, s)) return 1;
    return 0;
}

/* spec.worker's field `key` copied to dst (as `as`) when present. */
static void copy_field(cJSON *dst, const cJSON *worker, const char *key, const char *as)
{
    const cJSON *v = cJSON_GetObjectItem(worker, key);
    if (v) cJSON_AddItemToObject(dst, as, cJSON_Duplicate(v, 1));
}

/* Appends the items of spec.worker's array `key` whose field `field` is not one of
 * skip (a NULL-terminated list) to arr. */
static void append_items(cJSON *arr, const cJSON *worker, const char *key, const char *field,
                         const char *const *skip)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(worker, key))
        if (!listed(skip, pl_kube_field(it, field)))
            cJSON_AddItemToArray(arr, cJSON_Duplicate(it, 1));
}

/* dst[key]: the defaults, each top-level field replaced by the user's object's. */
static void merged_object(cJSON *dst, const char *key, cJSON *defaults, const cJSON *user)
{
    const cJSON *f;
    cJSON_ArrayForEach(f, user)
    {
        cJSON_DeleteItemFromObject(defaults, f->string);
        cJSON_AddItemToObject(defaults, f->string, cJSON_Duplicate(f, 1));
    }
    cJSON_AddItemToObject(dst, key, defaults);
}

static void env_value(cJSON *env, const char *name, const char *value)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "value", value);
    cJSON_AddItemToArray(env, e);
}

static void env_field(cJSON *env, const char *name, const char *path)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(e, "valueFrom"),
                                                    "fieldRef"),
                            "fieldPath", path);
    cJSON_AddItemToArray(env, e);
}

/* metadata: the user's labels and annotations, then the operator's labels. */
static cJSON *pod_metadata(const pl_job_objects *o, const cJSON *worker, int k)
{
    char name[PL_NAME_LEN];
    pl_job_pod_name(o->job, k, name, sizeof name);
    cJSON *md = pl_job_owned_metadata(o, name);
    cJSON *own = cJSON_DetachItemFromObject(md, "labels");
    cJSON_AddStringToObject(own, "app.kubernetes.io/name", PL_WORKER_LABEL);
    cJSON *user = cJSON_Duplicate(cJSON_GetObjectItem(worker, "labels"), 1);
    merged_object(md, "labels", user ? user : cJSON_CreateObject(), own);
    cJSON_Delete(own);
    copy_field(md, worker, "annotations", "annotations");
    return md;
}

/* {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": avoid} */
static cJSON *avoid_expression(const pl_job_objects *o)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "key", "kubernetes.io/hostname");
    cJSON_AddStringToObject(e, "operator", "NotIn");
    cJSON *v = cJSON_AddArrayToObject(e, "values");
    for (int i = 0; i < o->navoid; i++) cJSON_AddItemToArray(v, cJSON_CreateString(o->avoid[i]));
    return e;
}

/* The user's affinity, with the nodes cooling down excluded from every required
 * node selector term (terms are ORed: each must exclude them). */
static void add_affinity(cJSON *spec, const pl_job_objects *o, const cJSON *worker)
{
    const cJSON *user = cJSON_GetObjectItem(worker, "affinity");
    if (!o->navoid) {
        if (user) cJSON_AddItemToObject(spec, "affinity", cJSON_Duplicate(user, 1));
        return;
    }
    cJSON *aff = user ? cJSON_Duplicate(user, 1) : cJSON_CreateObject();
    cJSON *na = cJSON_GetObjectItem(aff, "nodeAffinity");
    if (!cJSON_IsObject(na)) na = cJSON_AddObjectToObject(aff, "nodeAffinity");
    const char *rk = "requiredDuringSchedulingIgnoredDuringExecution";
    cJSON *req = cJSON_GetObjectItem(na, rk);
    if (!cJSON_IsObject(req)) req = cJSON_AddObjectToObject(na, rk);
    cJSON *terms = cJSON_GetObjectItem(req, "nodeSelectorTerms");
    if (!cJSON_IsArray(terms)) terms = cJSON_AddArrayToObject(req, "nodeSelectorTerms");
    if (cJSON_GetArraySize(terms) == 0) cJSON_AddItemToArray(terms, cJSON_CreateObject());
    cJSON *term;
    cJSON_ArrayForEach(term, terms)
    {
        cJSON *exprs = cJSON_GetObjectItem(term, "matchExpressions");
        if (!cJSON_IsArray(exprs)) exprs = cJSON_AddArrayToObject(term, "matchExpressions");
        cJSON_AddItemToArray(exprs, avoid_expression(o));
    }
    cJSON_AddItemToObject(spec, "affinity", aff);
}

/* The Pod's terminationGracePeriodSeconds: its worker's `leaving` tells the coordinator. */
static double grace_seconds(const cJSON *worker)
{
    const cJSON *grace = cJSON_GetObjectItem(worker, "terminationGracePeriodSeconds");
    return cJSON_IsNumber(grace) ? grace->valuedouble : 30;
}

/* The Pod-level settings: scheduling, identity, security, the zone spread. */
static void pod_settings(cJSON *spec, const pl_job_objects *o, const cJSON *worker)
{
    char label[PL_NAME_LEN];
    pl_job_label_value(o->job, label, sizeof label);
    cJSON_AddStringToObject(spec, "restartPolicy", "Never"); /* a lost worker is replaced */
    cJSON_AddNumberToObject(spec, "terminationGracePeriodSeconds", grace_seconds(worker));
    const cJSON *automount = cJSON_GetObjectItem(worker, "automountServiceAccountToken");
    cJSON_AddBoolToObject(spec, "automountServiceAccountToken", cJSON_IsTrue(automount));
    static const char *const copied[] = {"nodeSelector", "tolerations", "priorityClassName",
                                         "imagePullSecrets", "serviceAccountName",
                                         "schedulerName", "runtimeClassName", NULL};
    for (int i = 0; copied[i]; i++) copy_field(spec, worker, copied[i], copied[i]);
    add_affinity(spec, o, worker);
    cJSON *psc = cJSON_CreateObject();
    cJSON_AddBoolToObject(psc, "runAsNonRoot", 1);
    cJSON_AddNumberToObject(psc, "runAsUser", PL_WORKER_UID);
    cJSON_AddNumberToObject(psc, "runAsGroup", PL_WORKER_UID);
    cJSON_AddNumberToObject(psc, "fsGroup", PL_WORKER_UID);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(psc, "seccompProfile"), "type", "RuntimeDefault");
    merged_object(spec, "securityContext", psc, cJSON_GetObjectItem(worker, "podSecurityContext"));
    /* spread over zones: simultaneous preemptions come from one zone (Bamboo §3) */
    cJSON *tsc = cJSON_CreateObject();
    cJSON_AddNumberToObject(tsc, "maxSkew", 1);
    cJSON_AddStringToObject(tsc, "topologyKey", "topology.kubernetes.io/zone");
    cJSON_AddStringToObject(tsc, "whenUnsatisfiable", "ScheduleAnyway");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(tsc, "labelSelector"),
                                                    "matchLabels"),
                            PL_JOB_LABEL, label);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(spec, "topologySpreadConstraints"), tsc);
}

/* 1 when the user mounts something at /tmp (which then replaces the emptyDir). */
static int user_tmp(const cJSON *worker)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItem(worker, "volumeMounts"))
    {
        const char *path = pl_kube_field(m, "mountPath");
        if (path && (!strcmp(path, "/tmp") || !strcmp(path, "/tmp/"))) return 1;
    }
    return 0;
}

static void add_mount(cJSON *mounts, const char *volume, const char *path, int ro)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", volume);
    cJSON_AddStringToObject(m, "mountPath", path);
    if (ro) cJSON_AddBoolToObject(m, "readOnly", 1);
    cJSON_AddItemToArray(mounts, m);
}

/* The container's environment, resources, security context and mounts. */
static void container_settings(cJSON *c, const pl_job_objects *o, const cJSON *worker)
{
    cJSON *env = cJSON_AddArrayToObject(c, "env");
    env_value(env, "PLIANT_COORDINATOR", o->coordinator);
    env_value(env, "PLIANT_TOKEN_FILE", PL_SECRET_MOUNT "/token");
    env_value(env, "PLIANT_CA", PL_SECRET_MOUNT "/ca.crt");
    env_value(env, "PLIANT_HOST", "0.0.0.0");
    env_field(env, "PLIANT_WORKER_NAME", "metadata.name");
    env_field(env, "PLIANT_NODE", "spec.nodeName");
    env_field(env, "PLIANT_ADVERTISE", "status.podIP");
    char grace[24];
    snprintf(grace, sizeof grace, "%.0f", fmax(grace_seconds(worker), 0));
    env_value(env, "PLIANT_GRACE_SECONDS", grace);
    append_items(env, worker, "env", "name", OWN_ENV);
    const cJSON *res = cJSON_GetObjectItem(worker, "resources");
    if (res) {
        cJSON_AddItemToObject(c, "resources", cJSON_Duplicate(res, 1));
    } else if (o->spec->nodes.gpus_per_node > 0) {
        char gpus[16];
        snprintf(gpus, sizeof gpus, "%d", o->spec->nodes.gpus_per_node);
        cJSON *lim = cJSON_AddObjectToObject(cJSON_AddObjectToObject(c, "resources"), "limits");
        cJSON_AddStringToObject(lim, "nvidia.com/gpu", gpus);
    }
    cJSON *sc = cJSON_CreateObject();
    cJSON_AddBoolToObject(sc, "allowPrivilegeEscalation", 0);
    cJSON_AddBoolToObject(sc, "readOnlyRootFilesystem", 1);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(cJSON_AddObjectToObject(sc, "capabilities"), "drop"),
                         cJSON_CreateString("ALL"));
    merged_object(c, "securityContext", sc, cJSON_GetObjectItem(worker, "securityContext"));
    cJSON *mounts = cJSON_AddArrayToObject(c, "volumeMounts");
    add_mount(mounts, SECRET_VOLUME, PL_SECRET_MOUNT, 1);
    if (!user_tmp(worker)) add_mount(mounts, TMP_VOLUME, "/tmp", 0);
    static const char *const own_names[] = {SECRET_VOLUME, TMP_VOLUME, NULL};
    static const char *const own_paths[] = {PL_SECRET_MOUNT, PL_SECRET_MOUNT "/", NULL};
    cJSON *user = cJSON_CreateArray();
    append_items(user, worker, "volumeMounts", "name", own_names);
    cJSON *m;
    while ((m = cJSON_DetachItemFromArray(user, 0)))
        if (listed(own_paths, pl_kube_field(m, "mountPath"))) cJSON_Delete(m);
        else cJSON_AddItemToArray(mounts, m);
    cJSON_Delete(user);
}

/* The Secret's worker files only (items), read-only to the worker's group, and /tmp. */
static void add_volumes(cJSON *spec, const pl_job_objects *o, const cJSON *worker)
{
    char secret[PL_NAME_LEN];
    pl_job_secret_name(o->job, secret, sizeof secret);
    cJSON *vols = cJSON_AddArrayToObject(spec, "volumes");
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "name", SECRET_VOLUME);
    cJSON *s = cJSON_AddObjectToObject(v, "secret");
    cJSON_AddStringToObject(s, "secretName", secret);
    cJSON_AddNumberToObject(s, "defaultMode", SECRET_MODE);
    cJSON *items = cJSON_AddArrayToObject(s, "items");
    for (int i = 0; WORKER_FILES[i]; i++) {
        cJSON *it = cJSON_CreateObject();
        cJSON_AddStringToObject(it, "key", WORKER_FILES[i]);
        cJSON_AddStringToObject(it, "path", WORKER_FILES[i]);
        cJSON_AddItemToArray(items, it);
    }
    cJSON_AddItemToArray(vols, v);
    if (!user_tmp(worker)) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "name", TMP_VOLUME);
        cJSON_AddObjectToObject(t, "emptyDir");
        cJSON_AddItemToArray(vols, t);
    }
    static const char *const own[] = {SECRET_VOLUME, TMP_VOLUME, NULL};
    append_items(vols, worker, "volumes", "name", own);
}

cJSON *pl_job_pod(const pl_job_objects *o, int k)
{
    cJSON *worker = o->spec->worker_json ? cJSON_Parse(o->spec->worker_json) : NULL;
    cJSON *pod = cJSON_CreateObject();
    cJSON_AddStringToObject(pod, "apiVersion", "v1");
    cJSON_AddStringToObject(pod, "kind", "Pod");
    cJSON_AddItemToObject(pod, "metadata", pod_metadata(o, worker, k));
    cJSON *spec = cJSON_AddObjectToObject(pod, "spec");
    pod_settings(spec, o, worker);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "name", "worker");
    const cJSON *image = cJSON_GetObjectItem(worker, "image");
    cJSON_AddStringToObject(c, "image", cJSON_IsString(image) ? image->valuestring : o->image);
    copy_field(c, worker, "imagePullPolicy", "imagePullPolicy");
    cJSON *cmd = cJSON_AddArrayToObject(c, "command");
    cJSON_AddItemToArray(cmd, cJSON_CreateString(o->command));
    cJSON_AddItemToArray(cmd, cJSON_CreateString("worker"));
    cJSON_AddItemToArray(cmd, cJSON_CreateString(PL_SECRET_MOUNT "/job.yaml"));
    container_settings(c, o, worker);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(spec, "containers"), c);
    add_volumes(spec, o, worker);
    cJSON_Delete(worker);
    return pod;
}
