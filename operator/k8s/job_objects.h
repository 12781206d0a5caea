/* The Kubernetes objects the operator makes for a TrainingJob: each owned by the job (ownerReferences, controller: true) so
 * that deleting the job deletes them, and labelled app.kubernetes.io/name and
 * pliant.dev/job.
 *
 *   Secret  <job>-pliant       token (the job token), ca.crt and tls.key (the
 *                              coordinator's certificate and key, kept so that a
 *                              new operator leader serves the same identity),
 *                              job.yaml (the manifest the workers load)
 *   Service <job>-coordinator  the coordinator's control port
 *   Pod     <job>-w<k>         one worker: `COMMAND worker /etc/pliant/job.yaml`
 *                              with the Secret at /etc/pliant, spread over zones
 *
 * Builders only: cJSON objects (caller deletes), no API calls. */
#ifndef PLIANT_JOB_OBJECTS_H
#define PLIANT_JOB_OBJECTS_H

#include <cJSON.h>

#include "jobspec.h"

#define PL_WORKER_LABEL "pliant-worker"
#define PL_JOB_LABEL "pliant.dev/job"
#define PL_SECRET_MOUNT "/etc/pliant"
#define PL_LEADER_LABEL "pliant.dev/role" /* "leader" on the leading operator's Pod */

typedef struct {
    const cJSON *job;            /* the TrainingJob (metadata.name, namespace, uid) */
    const pl_job *spec;          /* its parsed spec */
    const char *image;           /* default worker image when spec.worker.image is unset */
    const char *command;         /* the pliant binary in the image */
    const char *coordinator;     /* HOST:PORT the workers dial */
} pl_job_objects;

/* "<job>-pliant", "<job>-coordinator", "<job>-w<k>" into buf. */
void pl_job_secret_name(const cJSON *job, char *buf, size_t len);
void pl_job_service_name(const cJSON *job, char *buf, size_t len);
void pl_job_pod_name(const cJSON *job, int k, char *buf, size_t len);

/* The Secret with the given contents (token and PEM texts). NULL: out of memory. */
cJSON *pl_job_secret(const pl_job_objects *o, const char *token, const char *cert_pem,
                     const char *key_pem);
cJSON *pl_job_service(const pl_job_objects *o, int port);
/* Worker Pod number k; spec.worker's fields (image, imagePullPolicy, resources —
 * nvidia.com/gpu: gpusPerNode by default —, nodeSelector, tolerations, affinity,
 * priorityClassName, env, volumes, volumeMounts, terminationGracePeriodSeconds)
 * go where a Pod has them. */
cJSON *pl_job_pod(const pl_job_objects *o, int k);

/* Base64 of n bytes (heap string), as Secret data wants; NULL: out of memory. */
char *pl_base64(const void *data, size_t n);
/* The text a base64 string encodes (heap, NUL-terminated); NULL: not base64. */
char *pl_base64_decode(const char *b64);

#endif
