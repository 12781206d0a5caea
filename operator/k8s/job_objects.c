/* The Secret, Service and worker Pods a TrainingJob owns, built as cJSON objects
 * (job_objects.h); no API calls here. */
#include "job_objects.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "kube_client.h"

void pl_job_secret_name(const cJSON *job, char *buf, size_t len)
{
    snprintf(buf, len, "%s-pliant", pl_kube_field(job, "metadata.name"));
}

void pl_job_service_name(const cJSON *job, char *buf, size_t len)
{
    snprintf(buf, len, "%s-coordinator", pl_kube_field(job, "metadata.name"));
}

void pl_job_pod_name(const cJSON *job, int k, char *buf, size_t len)
{
    snprintf(buf, len, "%s-w%d", pl_kube_field(job, "metadata.name"), k);
}

char *pl_base64(const void *data, size_t n)
{
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    if (out) EVP_EncodeBlock((unsigned char *)out, data, (int)n);
    return out;
}

char *pl_base64_decode(const char *b64)
{
    size_t n = strlen(b64);
    unsigned char *out = malloc(n / 4 * 3 + 4);
    if (!out) return NULL;
    int len = EVP_DecodeBlock(out, (const unsigned char *)b64, (int)n);
    if (len < 0) {
        free(out);
        return NULL;
    }
    for (size_t k = n; k > 0 && b64[k - 1] == '=' && len > 0; k--) len--; /* padding: zeros */
    out[len] = 0;
    return (char *)out;
}

/* metadata: name, namespace, the labels, the job as controlling owner. */
static cJSON *owned_metadata(const pl_job_objects *o, const char *name)
{
    const cJSON *job = o->job;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", name);
    cJSON_AddStringToObject(m, "namespace", pl_kube_field(job, "metadata.namespace"));
    cJSON *labels = cJSON_AddObjectToObject(m, "labels");
    cJSON_AddStringToObject(labels, "app.kubernetes.io/managed-by", "pliant-operator");
    cJSON_AddStringToObject(labels, PL_JOB_LABEL, pl_kube_field(job, "metadata.name"));
    cJSON *ref = cJSON_CreateObject();
    cJSON_AddStringToObject(ref, "apiVersion", "pliant.dev/v1alpha1");
    cJSON_AddStringToObject(ref, "kind", "TrainingJob");
    cJSON_AddStringToObject(ref, "name", pl_kube_field(job, "metadata.name"));
    cJSON_AddStringToObject(ref, "uid", pl_kube_field(job, "metadata.uid"));
    cJSON_AddBoolToObject(ref, "controller", 1);
    cJSON_AddBoolToObject(ref, "blockOwnerDeletion", 1);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(m, "ownerReferences"), ref);
    return m;
}

static void add_b64(cJSON *data, const char *key, const char *text)
{
    char *b = pl_base64(text, strlen(text));
    if (b) cJSON_AddStringToObject(data, key, b);
    free(b);
}

cJSON *pl_job_secret(const pl_job_objects *o, const char *token, const char *cert_pem,
                     const char *key_pem)
{
    char name[300];
    pl_job_secret_name(o->job, name, sizeof name);
    /* the manifest the workers load: what the user wrote, without server fields */
    cJSON *manifest = cJSON_CreateObject();
    cJSON_AddStringToObject(manifest, "apiVersion", "pliant.dev/v1alpha1");
    cJSON_AddStringToObject(manifest, "kind", "TrainingJob");
    cJSON *mm = cJSON_AddObjectToObject(manifest, "metadata");
    cJSON_AddStringToObject(mm, "name", pl_kube_field(o->job, "metadata.name"));
    cJSON_AddStringToObject(mm, "namespace", pl_kube_field(o->job, "metadata.namespace"));
    cJSON_AddItemToObject(manifest, "spec",
                          cJSON_Duplicate(cJSON_GetObjectItem(o->job, "spec"), 1));
    char *text = cJSON_Print(manifest);
    cJSON_Delete(manifest);
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "apiVersion", "v1");
    cJSON_AddStringToObject(s, "kind", "Secret");
    cJSON_AddItemToObject(s, "metadata", owned_metadata(o, name));
    cJSON_AddStringToObject(s, "type", "Opaque");
    cJSON *data = cJSON_AddObjectToObject(s, "data");
    add_b64(data, "token", token);
    add_b64(data, "ca.crt", cert_pem);
    add_b64(data, "tls.key", key_pem);
    if (text) add_b64(data, "job.yaml", text);
    free(text);
    if (cJSON_GetArraySize(data) != 4) {
        cJSON_Delete(s);
        return NULL;
    }
    return s;
}

cJSON *pl_job_service(const pl_job_objects *o, int port)
{
    char name[300];
    pl_job_service_name(o->job, name, sizeof name);
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "apiVersion", "v1");
    cJSON_AddStringToObject(s, "kind", "Service");
    cJSON_AddItemToObject(s, "metadata", owned_metadata(o, name));
    cJSON *spec = cJSON_AddObjectToObject(s, "spec");
    cJSON *sel = cJSON_AddObjectToObject(spec, "selector");
    cJSON_AddStringToObject(sel, "app.kubernetes.io/name", "pliant-operator");
    cJSON_AddStringToObject(sel, PL_LEADER_LABEL, "leader"); /* the replica that leads */
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "name", "control");
    cJSON_AddStringToObject(p, "protocol", "TCP");
    cJSON_AddNumberToObject(p, "port", port);
    cJSON_AddNumberToObject(p, "targetPort", port);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(spec, "ports"), p);
    return s;
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

/* Appends the items of spec.worker's array `key` to arr. */
static void append_items(cJSON *arr, const cJSON *worker, const char *key)
{
    const cJSON *src = cJSON_GetObjectItem(worker, key), *it;
    cJSON_ArrayForEach(it, src) cJSON_AddItemToArray(arr, cJSON_Duplicate(it, 1));
}

/* spec.worker's field `key` copied to dst when present. */
static void copy_field(cJSON *dst, const cJSON *worker, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(worker, key);
    if (v) cJSON_AddItemToObject(dst, key, cJSON_Duplicate(v, 1));
}

cJSON *pl_job_pod(const pl_job_objects *o, int k)
{
    char name[300], secret[300], gpus[16];
    pl_job_pod_name(o->job, k, name, sizeof name);
    pl_job_secret_name(o->job, secret, sizeof secret);
    const char *job = pl_kube_field(o->job, "metadata.name");
    cJSON *worker = o->spec->worker_json ? cJSON_Parse(o->spec->worker_json) : NULL;
    cJSON *pod = cJSON_CreateObject();
    cJSON_AddStringToObject(pod, "apiVersion", "v1");
    cJSON_AddStringToObject(pod, "kind", "Pod");
    cJSON *md = owned_metadata(o, name);
    cJSON_AddStringToObject(cJSON_GetObjectItem(md, "labels"), "app.kubernetes.io/name",
                            PL_WORKER_LABEL);
    cJSON_AddItemToObject(pod, "metadata", md);
    cJSON *spec = cJSON_AddObjectToObject(pod, "spec");
    cJSON_AddStringToObject(spec, "restartPolicy", "Never"); /* a lost worker is replaced */
    const cJSON *grace = cJSON_GetObjectItem(worker, "terminationGracePeriodSeconds");
    cJSON_AddNumberToObject(spec, "terminationGracePeriodSeconds",
                            cJSON_IsNumber(grace) ? grace->valuedouble : 30);
    copy_field(spec, worker, "nodeSelector");
    copy_field(spec, worker, "tolerations");
    copy_field(spec, worker, "affinity");
    copy_field(spec, worker, "priorityClassName");
    /* spread over zones: simultaneous preemptions come from one zone (Bamboo §3) */
    cJSON *tsc = cJSON_CreateObject();
    cJSON_AddNumberToObject(tsc, "maxSkew", 1);
    cJSON_AddStringToObject(tsc, "topologyKey", "topology.kubernetes.io/zone");
    cJSON_AddStringToObject(tsc, "whenUnsatisfiable", "ScheduleAnyway");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(tsc, "labelSelector"),
                                                    "matchLabels"),
                            PL_JOB_LABEL, job);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(spec, "topologySpreadConstraints"), tsc);

    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "name", "worker");
    const cJSON *image = cJSON_GetObjectItem(worker, "image");
    cJSON_AddStringToObject(c, "image", cJSON_IsString(image) ? image->valuestring : o->image);
    copy_field(c, worker, "imagePullPolicy");
    cJSON *cmd = cJSON_AddArrayToObject(c, "command");
    cJSON_AddItemToArray(cmd, cJSON_CreateString(o->command));
    cJSON_AddItemToArray(cmd, cJSON_CreateString("worker"));
    cJSON_AddItemToArray(cmd, cJSON_CreateString(PL_SECRET_MOUNT "/job.yaml"));
    cJSON *env = cJSON_AddArrayToObject(c, "env");
    env_value(env, "PLIANT_COORDINATOR", o->coordinator);
    env_value(env, "PLIANT_TOKEN_FILE", PL_SECRET_MOUNT "/token");
    env_value(env, "PLIANT_CA", PL_SECRET_MOUNT "/ca.crt");
    env_value(env, "PLIANT_HOST", "0.0.0.0");
    env_field(env, "PLIANT_WORKER_NAME", "metadata.name");
    env_field(env, "PLIANT_NODE", "spec.nodeName");
    env_field(env, "PLIANT_ADVERTISE", "status.podIP");
    append_items(env, worker, "env");
    const cJSON *res = cJSON_GetObjectItem(worker, "resources");
    if (res) {
        cJSON_AddItemToObject(c, "resources", cJSON_Duplicate(res, 1));
    } else if (o->spec->nodes.gpus_per_node > 0) {
        snprintf(gpus, sizeof gpus, "%d", o->spec->nodes.gpus_per_node);
        cJSON *lim = cJSON_AddObjectToObject(cJSON_AddObjectToObject(c, "resources"), "limits");
        cJSON_AddStringToObject(lim, "nvidia.com/gpu", gpus);
    }
    cJSON *mounts = cJSON_AddArrayToObject(c, "volumeMounts");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", "pliant");
    cJSON_AddStringToObject(m, "mountPath", PL_SECRET_MOUNT);
    cJSON_AddBoolToObject(m, "readOnly", 1);
    cJSON_AddItemToArray(mounts, m);
    append_items(mounts, worker, "volumeMounts");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(spec, "containers"), c);

    cJSON *vols = cJSON_AddArrayToObject(spec, "volumes");
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "name", "pliant");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(v, "secret"), "secretName", secret);
    cJSON_AddItemToArray(vols, v);
    append_items(vols, worker, "volumes");
    cJSON_Delete(worker);
    return pod;
}
