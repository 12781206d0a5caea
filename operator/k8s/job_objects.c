/* The names of a TrainingJob's objects and its Secret, Service, EndpointSlice and
 * NetworkPolicy, built as cJSON objects (job_objects.h); the worker Pod is job_pod.c's.
 * No API calls here. */
#include "job_objects.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "kube_client.h"

#define NAME_MAX_ 63

/* FNV-1a, 32 bits: a short stable fingerprint of a whole name. */
static uint32_t fnv1a(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

void pl_kube_short_name(char *out, size_t len, const char *base, const char *suffix, int reserve,
                        int flags)
{
    const char *prefix = (flags & PL_NAME_LETTER_FIRST) && !isalpha((unsigned char)base[0])
                             ? "tj-" : "";
    int changed = prefix[0] || (!(flags & PL_NAME_DOTS_OK) && strchr(base, '.'));
    size_t room = NAME_MAX_ - (size_t)reserve - strlen(suffix) - strlen(prefix);
    if (!changed && strlen(base) <= room) {
        snprintf(out, len, "%s%s", base, suffix);
        return;
    }
    char cut[NAME_MAX_ + 1];
    size_t n = 0;
    for (; base[n] && n + 9 < room && n < sizeof cut - 1; n++)
        cut[n] = base[n] == '.' && !(flags & PL_NAME_DOTS_OK) ? '-' : base[n];
    while (n > 0 && (cut[n - 1] == '-' || cut[n - 1] == '.')) n--;
    cut[n] = 0;
    snprintf(out, len, "%s%s%s%08x%s", prefix, cut, n ? "-" : "", fnv1a(base), suffix);
}

static const char *job_name(const cJSON *job)
{
    const char *n = pl_kube_field(job, "metadata.name");
    return n ? n : "";
}

void pl_job_secret_name(const cJSON *job, char *buf, size_t len)
{
    pl_kube_short_name(buf, len, job_name(job), "-pliant", 0, 0);
}

void pl_job_service_name(const cJSON *job, char *buf, size_t len)
{
    pl_kube_short_name(buf, len, job_name(job), "-coordinator", 0, PL_NAME_LETTER_FIRST);
}

void pl_job_policy_name(const cJSON *job, char *buf, size_t len)
{
    pl_kube_short_name(buf, len, job_name(job), "-peers", 0, 0);
}

void pl_job_pod_prefix(const cJSON *job, char *buf, size_t len)
{
    pl_kube_short_name(buf, len, job_name(job), "-w", PL_POD_INDEX_DIGITS, 0);
}

void pl_job_pod_name(const cJSON *job, int k, char *buf, size_t len)
{
    char prefix[PL_NAME_LEN];
    pl_job_pod_prefix(job, prefix, sizeof prefix);
    snprintf(buf, len, "%s%d", prefix, k);
}

void pl_job_label_value(const cJSON *job, char *buf, size_t len)
{
    pl_kube_short_name(buf, len, job_name(job), "", 0, PL_NAME_DOTS_OK);
}

const char *pl_job_owner_name(const cJSON *obj)
{
    const cJSON *md = cJSON_GetObjectItem(obj, "metadata"), *ref;
    cJSON_ArrayForEach(ref, cJSON_GetObjectItem(md, "ownerReferences"))
    {
        const char *kind = pl_kube_field(ref, "kind"), *name = pl_kube_field(ref, "name");
        if (cJSON_IsTrue(cJSON_GetObjectItem(ref, "controller")) && kind && name &&
            !strcmp(kind, "TrainingJob"))
            return name;
    }
    /* the label key has dots: no dotted path */
    const cJSON *label = cJSON_GetObjectItem(cJSON_GetObjectItem(md, "labels"), PL_JOB_LABEL);
    return cJSON_IsString(label) ? label->valuestring : NULL;
}

int pl_job_owns(const cJSON *job, const cJSON *obj)
{
    const char *uid = pl_kube_field(job, "metadata.uid");
    const cJSON *ref;
    if (!uid || !*uid) return 0;
    cJSON_ArrayForEach(ref, cJSON_GetObjectItem(cJSON_GetObjectItem(obj, "metadata"),
                                                "ownerReferences"))
    {
        const char *kind = pl_kube_field(ref, "kind"), *ruid = pl_kube_field(ref, "uid");
        if (kind && ruid && !strcmp(kind, "TrainingJob") && !strcmp(ruid, uid)) return 1;
    }
    return 0;
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

/* PL_REQ_JOB_FINALIZERS_UPDATE (kube_requests.h): blockOwnerDeletion below needs it. */
cJSON *pl_job_owned_metadata(const pl_job_objects *o, const char *name)
{
    const cJSON *job = o->job;
    char label[PL_NAME_LEN];
    pl_job_label_value(job, label, sizeof label);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "name", name);
    cJSON_AddStringToObject(m, "namespace", pl_kube_field(job, "metadata.namespace"));
    cJSON *labels = cJSON_AddObjectToObject(m, "labels");
    cJSON_AddStringToObject(labels, "app.kubernetes.io/managed-by", "pliant-operator");
    cJSON_AddStringToObject(labels, PL_JOB_LABEL, label);
    cJSON *ref = cJSON_CreateObject();
    cJSON_AddStringToObject(ref, "apiVersion", "pliant.dev/v1alpha1");
    cJSON_AddStringToObject(ref, "kind", "TrainingJob");
    cJSON_AddStringToObject(ref, "name", job_name(job));
    cJSON_AddStringToObject(ref, "uid", pl_kube_field(job, "metadata.uid"));
    cJSON_AddBoolToObject(ref, "controller", 1);
    cJSON_AddBoolToObject(ref, "blockOwnerDeletion", 1);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(m, "ownerReferences"), ref);
    return m;
}

/* A new object of that apiVersion and kind with the job's metadata. */
static cJSON *owned_object(const pl_job_objects *o, const char *api_version, const char *kind,
                           const char *name)
{
    cJSON *obj = cJSON_CreateObject();
    cJSON_AddStringToObject(obj, "apiVersion", api_version);
    cJSON_AddStringToObject(obj, "kind", kind);
    cJSON_AddItemToObject(obj, "metadata", pl_job_owned_metadata(o, name));
    return obj;
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
    char name[PL_NAME_LEN];
    pl_job_secret_name(o->job, name, sizeof name);
    /* the manifest the workers load: what the user wrote, without server fields */
    cJSON *manifest = cJSON_CreateObject();
    cJSON_AddStringToObject(manifest, "apiVersion", "pliant.dev/v1alpha1");
    cJSON_AddStringToObject(manifest, "kind", "TrainingJob");
    cJSON *mm = cJSON_AddObjectToObject(manifest, "metadata");
    cJSON_AddStringToObject(mm, "name", job_name(o->job));
    cJSON_AddStringToObject(mm, "namespace", pl_kube_field(o->job, "metadata.namespace"));
    cJSON_AddItemToObject(manifest, "spec",
                          cJSON_Duplicate(cJSON_GetObjectItem(o->job, "spec"), 1));
    char *text = cJSON_Print(manifest);
    cJSON_Delete(manifest);
    cJSON *s = owned_object(o, "v1", "Secret", name);
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

/* {"name": "control", "protocol": "TCP", "port": port} */
static cJSON *control_port(int port)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "name", PL_CONTROL_PORT_NAME);
    cJSON_AddStringToObject(p, "protocol", "TCP");
    cJSON_AddNumberToObject(p, "port", port);
    return p;
}

cJSON *pl_job_service(const pl_job_objects *o, int port)
{
    char name[PL_NAME_LEN];
    pl_job_service_name(o->job, name, sizeof name);
    cJSON *s = owned_object(o, "v1", "Service", name);
    cJSON *spec = cJSON_AddObjectToObject(s, "spec");
    /* no selector: its EndpointSlice, written by the leader, names the endpoint */
    cJSON *p = control_port(port);
    cJSON_AddNumberToObject(p, "targetPort", port);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(spec, "ports"), p);
    return s;
}

cJSON *pl_job_endpoint_slice(const pl_job_objects *o, const char *ip, int port)
{
    char name[PL_NAME_LEN];
    pl_job_service_name(o->job, name, sizeof name);
    cJSON *s = owned_object(o, "discovery.k8s.io/v1", "EndpointSlice", name);
    cJSON *labels = cJSON_GetObjectItem(cJSON_GetObjectItem(s, "metadata"), "labels");
    cJSON_AddStringToObject(labels, "kubernetes.io/service-name", name);
    cJSON_AddStringToObject(labels, "endpointslice.kubernetes.io/managed-by", PL_SLICE_MANAGER);
    cJSON_AddStringToObject(s, "addressType", strchr(ip, ':') ? "IPv6" : "IPv4");
    cJSON *ep = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(ep, "addresses"), cJSON_CreateString(ip));
    cJSON *cond = cJSON_AddObjectToObject(ep, "conditions");
    cJSON_AddBoolToObject(cond, "ready", 1);
    cJSON_AddBoolToObject(cond, "serving", 1);
    cJSON_AddBoolToObject(cond, "terminating", 0);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(s, "endpoints"), ep);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(s, "ports"), control_port(port));
    return s;
}

/* {"matchLabels": {"app.kubernetes.io/name": app[, "pliant.dev/job": job]}} */
static cJSON *match_labels(const char *app, const char *job)
{
    cJSON *sel = cJSON_CreateObject();
    cJSON *ml = cJSON_AddObjectToObject(sel, "matchLabels");
    cJSON_AddStringToObject(ml, "app.kubernetes.io/name", app);
    if (job) cJSON_AddStringToObject(ml, PL_JOB_LABEL, job);
    return sel;
}

/* An ingress rule from one peer. */
static cJSON *ingress_from(cJSON *peer)
{
    cJSON *rule = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(rule, "from"), peer);
    return rule;
}

cJSON *pl_job_network_policy(const pl_job_objects *o, const char *operator_ns)
{
    char name[PL_NAME_LEN], label[PL_NAME_LEN];
    pl_job_policy_name(o->job, name, sizeof name);
    pl_job_label_value(o->job, label, sizeof label);
    cJSON *np = owned_object(o, "networking.k8s.io/v1", "NetworkPolicy", name);
    cJSON *spec = cJSON_AddObjectToObject(np, "spec");
    cJSON_AddItemToObject(spec, "podSelector", match_labels(PL_WORKER_LABEL, label));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(spec, "policyTypes"), cJSON_CreateString("Ingress"));
    cJSON *ingress = cJSON_AddArrayToObject(spec, "ingress");
    cJSON *peers = cJSON_CreateObject();
    cJSON_AddItemToObject(peers, "podSelector", match_labels(PL_WORKER_LABEL, label));
    cJSON_AddItemToArray(ingress, ingress_from(peers));
    cJSON *op = cJSON_CreateObject();
    cJSON *ns = cJSON_AddObjectToObject(cJSON_AddObjectToObject(op, "namespaceSelector"),
                                        "matchLabels");
    cJSON_AddStringToObject(ns, "kubernetes.io/metadata.name", operator_ns);
    cJSON_AddItemToObject(op, "podSelector", match_labels(PL_OPERATOR_LABEL, NULL));
    cJSON_AddItemToArray(ingress, ingress_from(op));
    return np;
}
