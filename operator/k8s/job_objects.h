/* The Kubernetes objects the operator makes for a TrainingJob: each owned by the job
 * (ownerReferences, controller: true) so that deleting the job deletes them, and
 * labelled app.kubernetes.io/managed-by and pliant.dev/job.
 *
 *   Secret        <job>-pliant       token (the job token), ca.crt and tls.key (the
 *                                    coordinator's certificate and key, kept so that a
 *                                    new operator leader serves the same identity),
 *                                    job.yaml (the manifest the workers load)
 *   Service       <job>-coordinator  the coordinator's control port, without a selector:
 *   EndpointSlice <job>-coordinator  its endpoint, the leading operator Pod's IP and the
 *                                    job's port (a Service selects Pods of its own
 *                                    namespace only; the operator's may be another)
 *   NetworkPolicy <job>-peers        ingress to the job's worker Pods from the job's
 *                                    Pods and the operator only (when enabled)
 *   Pod           <job>-w<k>         one worker: `COMMAND worker /etc/pliant/job.yaml`
 *                                    with the Secret's token, ca.crt and job.yaml at
 *                                    /etc/pliant, spread over zones (job_pod.c)
 *
 * Names and label values stay within 63 characters whatever the job's name (a
 * TrainingJob's may have 253): a name that does not fit, or that a Service could not
 * carry (dots, a leading digit), is cut and followed by "-" and 8 hex digits of a hash
 * of the whole name (pl_kube_short_name). Builders only: cJSON objects (caller
 * deletes), no API calls. */
#ifndef PLIANT_JOB_OBJECTS_H
#define PLIANT_JOB_OBJECTS_H

#include <stddef.h>

#include <cJSON.h>

#include "jobspec.h"

#define PL_WORKER_LABEL "pliant-worker"
#define PL_OPERATOR_LABEL "pliant-operator" /* app.kubernetes.io/name of the operator's Pods */
#define PL_JOB_LABEL "pliant.dev/job"
#define PL_SECRET_MOUNT "/etc/pliant"
#define PL_CONTROL_PORT_NAME "control"
#define PL_SLICE_MANAGER "pliant-operator.pliant.dev" /* endpointslice.kubernetes.io/managed-by */
#define PL_NAME_LEN 64        /* a name or label value of at most 63 characters, and a NUL */
#define PL_POD_INDEX_DIGITS 6 /* room kept for k in <job>-w<k> */
#define PL_WORKER_UID 65532   /* the worker's default user and group (non-root) */

typedef struct {
    const cJSON *job;            /* the TrainingJob (metadata.name, namespace, uid) */
    const pl_job *spec;          /* its parsed spec */
    const char *image;           /* default worker image when spec.worker.image is unset */
    const char *command;         /* the pliant binary in the image */
    const char *coordinator;     /* HOST:PORT the workers dial */
    const char *const *avoid;    /* nodes cooling down: kubernetes.io/hostname values the Pod */
    int navoid;                  /* must not run on (required node affinity NotIn) */
} pl_job_objects;

/* flags of pl_kube_short_name */
#define PL_NAME_DOTS_OK 1      /* a DNS subdomain or a label value may keep its dots */
#define PL_NAME_LETTER_FIRST 2 /* a DNS-1035 label (a Service) starts with a letter */

/* base + suffix as a name of at most 63 − reserve characters (see above). */
void pl_kube_short_name(char *out, size_t len, const char *base, const char *suffix, int reserve,
                        int flags);

/* The job's names into buf (PL_NAME_LEN): "<job>-pliant", "<job>-coordinator" (the
 * Service and its EndpointSlice), "<job>-peers", "<job>-w<k>", the pod names' prefix
 * "<job>-w", and the pliant.dev/job label value. */
void pl_job_secret_name(const cJSON *job, char *buf, size_t len);
void pl_job_service_name(const cJSON *job, char *buf, size_t len);
void pl_job_policy_name(const cJSON *job, char *buf, size_t len);
void pl_job_pod_name(const cJSON *job, int k, char *buf, size_t len);
void pl_job_pod_prefix(const cJSON *job, char *buf, size_t len);
void pl_job_label_value(const cJSON *job, char *buf, size_t len);
/* The job of an owned object: its controller ownerReference's name (the label value
 * may be cut), else the pliant.dev/job label; NULL when neither. */
const char *pl_job_owner_name(const cJSON *obj);
/* 1 when obj's ownerReferences name this TrainingJob: kind TrainingJob with the job's
 * metadata.uid (a job of the same name deleted and created again has another uid);
 * 0 otherwise, and when the job has no uid. */
int pl_job_owns(const cJSON *job, const cJSON *obj);

/* The Secret with the given contents (token and PEM texts). NULL: out of memory. */
cJSON *pl_job_secret(const pl_job_objects *o, const char *token, const char *cert_pem,
                     const char *key_pem);
cJSON *pl_job_service(const pl_job_objects *o, int port);
/* The Service's EndpointSlice: one ready endpoint at ip (IPv4 or IPv6) and port. */
cJSON *pl_job_endpoint_slice(const pl_job_objects *o, const char *ip, int port);
/* Ingress to the job's worker Pods from its own Pods (any port: peer links, layer
 * copies, NCCL's sockets) and from operator Pods of operator_ns. */
cJSON *pl_job_network_policy(const pl_job_objects *o, const char *operator_ns);
/* Worker Pod number k (job_pod.c, which says how spec.worker is merged in). */
cJSON *pl_job_pod(const pl_job_objects *o, int k);

/* metadata: name, namespace, the labels, the job as controlling owner. */
cJSON *pl_job_owned_metadata(const pl_job_objects *o, const char *name);

/* Base64 of n bytes (heap string), as Secret data wants; NULL: out of memory. */
char *pl_base64(const void *data, size_t n);
/* The text a base64 string encodes (heap, NUL-terminated); NULL: not base64. */
char *pl_base64_decode(const char *b64);

#endif
