/* A small Kubernetes REST client on libcurl and cJSON (no generated code):
 * requests on paths built from group/version/namespace/plural/name/subresource,
 * Status errors parsed, optimistic-concurrency retry on 409, status written
 * through the /status subresource, Events (events.k8s.io/v1).
 *
 * Threads: a client owns one curl handle, reused so that its connection stays
 * open (keep-alive) — one thread at a time per client. Give each thread, and
 * each watch (kube_watch.h), its own client; clients may share one
 * pl_kube_config, which must outlive them. curl_global_init runs once, on the
 * first pl_kube_client_new. */
#ifndef PLIANT_KUBE_CLIENT_H
#define PLIANT_KUBE_CLIENT_H

#include <stdatomic.h>
#include <stddef.h>

#include <cJSON.h>

#include "kube_config.h"

#define PL_KUBE_TIMEOUT_MS 30000         /* default limit of one request */
#define PL_KUBE_CONNECT_TIMEOUT_MS 10000
#define PL_KUBE_MAX_BODY (256u << 20)     /* a larger response is an error */

/* Retry-After on a 429 or 503 (the API server's priority and fairness, or a proxy):
 * a wait up to PL_KUBE_RETRY_INLINE_MS is slept in the request (the stop flag still
 * ends it) and the request sent again, at most PL_KUBE_RETRY_INLINE_TRIES times; a
 * longer one, capped at PL_KUBE_RETRY_AFTER_MAX_MS, is left to the caller in
 * pl_kube_status.retry_after_ms (the operator requeues the job after it). */
#define PL_KUBE_RETRY_INLINE_MS 2000
#define PL_KUBE_RETRY_INLINE_TRIES 3
#define PL_KUBE_RETRY_AFTER_MAX_MS 60000

/* One resource or collection: /api/v1/... for the core group (group NULL or
 * ""), /apis/GROUP/VERSION/... otherwise. */
typedef struct {
    const char *group;
    const char *version;     /* "v1" */
    const char *namespace_;  /* NULL or "": cluster-scoped, or every namespace */
    const char *plural;      /* "pods", "trainingjobs" */
    const char *name;        /* NULL: the collection */
    const char *subresource; /* "status", or NULL */
} pl_kube_ref;

/* Why a request failed: the Kubernetes Status in the body when there is one
 * (reason NotFound, Conflict, AlreadyExists, Expired, ...; "" when the body
 * is no Status). Failures of our own side have http 0 and reason Transport,
 * Timeout, Stopped (the stop flag), Invalid (a bad ref), Unauthorized (no
 * token could be read) or InternalError (out of memory); InvalidResponse (a
 * 2xx body that is not JSON) and Aborted (on_line refused) keep the status. */
typedef struct {
    long http;
    char reason[64];
    char message[512];  /* Status.message, the body's start, or what went wrong, with the path */
    long retry_after_ms; /* a 429 or 503's Retry-After (≤ PL_KUBE_RETRY_AFTER_MAX_MS); 0: none */
} pl_kube_status;

/* Fills st; returns −1 so that callers can `return pl_kube_status_set(...)`. */
int pl_kube_status_set(pl_kube_status *st, long http, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The string at a dotted path ("metadata.name") of obj, or NULL. */
const char *pl_kube_field(const cJSON *obj, const char *path);

typedef struct pl_kube_client pl_kube_client;

typedef enum {
    PL_KUBE_MERGE_PATCH, /* application/merge-patch+json (RFC 7386) */
    PL_KUBE_JSON_PATCH,  /* application/json-patch+json (RFC 6902) */
} pl_kube_patch_type;

/* A client for cfg (borrowed). NULL and err on failure. */
pl_kube_client *pl_kube_client_new(pl_kube_config *cfg, char *err, size_t errlen);
void pl_kube_client_free(pl_kube_client *c);

/* Limit of each later request in ms (default PL_KUBE_TIMEOUT_MS; 0: none). */
void pl_kube_client_set_timeout(pl_kube_client *c, long timeout_ms);
/* A flag that, once nonzero, aborts the request in flight within about a
 * second (libcurl's progress callback) and makes watches return: shutdown. */
void pl_kube_client_set_stop(pl_kube_client *c, const atomic_int *stop);
int pl_kube_client_stopped(const pl_kube_client *c);

/* The URL path of r with an optional query ("labelSelector=a%3Db"), each
 * segment checked (no '/', no "..", not empty). −1 and err naming the field. */
int pl_kube_path(const pl_kube_ref *r, const char *query, char *out, size_t outlen, char *err,
                 size_t errlen);

/* Percent-encodes s for a query value. Heap string, NULL when out of memory. */
char *pl_kube_escape(const char *s);

/* One request: method on path (from pl_kube_path), body (NULL: none) sent as
 * content_type. 0 on 2xx with the parsed response in *out (when out is not
 * NULL; NULL for an empty body); −1 with *st filled otherwise. */
int pl_kube_request(pl_kube_client *c, const char *method, const char *path,
                    const char *content_type, const cJSON *body, cJSON **out, pl_kube_status *st);

/* Streams a GET's 2xx body line by line as it arrives, whatever the chunks
 * (watches: one JSON event a line): on_line gets each line without its '\n',
 * NUL-terminated and writable, and returns 0 to go on, −1 to abort. A
 * non-2xx body is parsed into *st instead. 0 when the server ended the
 * stream (an unterminated last line is dropped), −1 with *st otherwise
 * (reason "Aborted" when on_line aborted). */
int pl_kube_stream(pl_kube_client *c, const char *path, long timeout_ms,
                   int (*on_line)(char *line, size_t len, void *user), void *user,
                   pl_kube_status *st);

/* CRUD on a ref. query for get may be NULL. */
int pl_kube_get(pl_kube_client *c, const pl_kube_ref *r, const char *query, cJSON **out,
                pl_kube_status *st);
int pl_kube_create(pl_kube_client *c, const pl_kube_ref *r, const cJSON *obj, cJSON **out,
                   pl_kube_status *st);
int pl_kube_replace(pl_kube_client *c, const pl_kube_ref *r, const cJSON *obj, cJSON **out,
                    pl_kube_status *st);
int pl_kube_patch(pl_kube_client *c, const pl_kube_ref *r, pl_kube_patch_type type,
                  const cJSON *patch, cJSON **out, pl_kube_status *st);
/* propagation: "Background", "Foreground", "Orphan" or NULL (the default). */
int pl_kube_delete(pl_kube_client *c, const pl_kube_ref *r, const char *propagation,
                   pl_kube_status *st);

/* Writes status through the /status subresource with a merge patch
 * {"status": status}; no resourceVersion, so it cannot conflict. */
int pl_kube_patch_status(pl_kube_client *c, const pl_kube_ref *r, const cJSON *status,
                         cJSON **out, pl_kube_status *st);

/* Changes obj in place. 0: write it, 1: nothing to change, −1: give up (err). */
typedef int (*pl_kube_mutate_fn)(cJSON *obj, void *user, char *err, size_t errlen);

/* Optimistic concurrency: GET r, mutate, PUT (with the resourceVersion read);
 * on 409 Conflict GET again and reapply mutate, up to attempts times. 0 when
 * written or when mutate found nothing to change (*out: the object then), −1
 * with *st (a mutate error has http 0 and reason "Mutate"). */
int pl_kube_update_retry(pl_kube_client *c, const pl_kube_ref *r, int attempts,
                         pl_kube_mutate_fn mutate, void *user, cJSON **out, pl_kube_status *st);

/* 1 when a request that failed this way may succeed if sent again later:
 * no response, 429, 500, 502, 503, 504. */
int pl_kube_retriable(const pl_kube_status *st);

/* An events.k8s.io/v1 Event about regarding (an object with apiVersion, kind
 * and metadata name/namespace/uid), created in its namespace. */
typedef struct {
    const cJSON *regarding;
    const char *type;       /* "Normal" or "Warning" */
    const char *reason;     /* "Reconfigured", "NodeLost", ... (CamelCase) */
    const char *action;     /* what was done: "Reconfigure", "CreatePod", ... */
    const char *note;       /* human-readable; cut to 1024 bytes */
    const char *controller; /* reportingController, e.g. "pliant.dev/operator" */
    const char *instance;   /* reportingInstance, e.g. the operator Pod's name */
} pl_kube_event;

int pl_kube_event_create(pl_kube_client *c, const pl_kube_event *ev, pl_kube_status *st);

#endif
