/* An informer for one resource, in the manner of client-go's reflector: list
 * (paged), then watch from the list's resourceVersion with bookmarks, keep the
 * last resourceVersion seen (objects and BOOKMARKs), watch again from it when
 * a watch ends, and list again on 410 Gone (an ERROR event or the HTTP
 * status). The event stream — one JSON object a line, in chunks that split
 * lines anywhere — is parsed as it arrives.
 *
 * A store (namespace/name → last object) turns a re-list into the events that
 * were missed: ADDED for new objects, MODIFIED for changed ones (a different
 * resourceVersion; unchanged ones are not repeated), DELETED for the ones gone.
 *
 * Failed requests are retried after an exponential back-off with jitter
 * (never a busy loop); the client's stop flag (pl_kube_client_set_stop) ends
 * pl_watch_run within about a second. Runs on the calling thread, which owns
 * the client for that time; callbacks run on it too. */
#ifndef PLIANT_KUBE_WATCH_H
#define PLIANT_KUBE_WATCH_H

#include <stddef.h>

#include <cJSON.h>

#include "kube_client.h"

#define PL_WATCH_TIMEOUT_S 300   /* server-side limit of one watch request, before jitter */
#define PL_WATCH_PAGE 500        /* objects per list page */
#define PL_WATCH_BACKOFF_MIN_MS 200
#define PL_WATCH_BACKOFF_MAX_MS 30000

typedef enum {
    PL_WATCH_ADDED,
    PL_WATCH_MODIFIED,
    PL_WATCH_DELETED,
} pl_watch_event;

typedef struct {
    int lists;       /* complete lists (the first one and every re-list) */
    int relists_gone; /* of which caused by 410 Gone */
    int watches;     /* watch requests sent */
    int events;      /* ADDED/MODIFIED/DELETED lines received from watches */
    int bookmarks;
    int errors;      /* failures, each followed by a back-off */
    char resource_version[128]; /* the last one seen */
} pl_watch_stats;

typedef struct {
    pl_kube_ref ref;            /* the collection: name and subresource unset */
    const char *label_selector; /* or NULL */
    const char *field_selector; /* or NULL */
    int timeout_seconds;        /* 0: PL_WATCH_TIMEOUT_S; each request gets [t, 2t) */
    int page_size;              /* 0: PL_WATCH_PAGE */
    int backoff_min_ms;         /* 0: PL_WATCH_BACKOFF_MIN_MS */
    int backoff_max_ms;         /* 0: PL_WATCH_BACKOFF_MAX_MS */
    /* obj (and old, the previous object, for MODIFIED) live during the call
     * only: duplicate what is kept. Objects from lists get the list's
     * apiVersion and kind (PodList → Pod) when they lack them. */
    void (*on_event)(pl_watch_event ev, const cJSON *obj, const cJSON *old, void *user);
    void (*on_synced)(void *user);                            /* after each complete list */
    void (*on_error)(const pl_kube_status *st, void *user);   /* before each back-off */
    void *user;
} pl_watch_config;

/* Lists and watches until the client's stop flag is set; returns 0 then.
 * −1 with err only for a configuration that can never work (bad ref, no
 * on_event). stats (may be NULL) is updated as it goes. */
int pl_watch_run(pl_kube_client *c, const pl_watch_config *cfg, pl_watch_stats *stats,
                 char *err, size_t errlen);

#endif
