/* The informer (kube_watch.h): paged lists, watches resumed from the last
 * resourceVersion, re-lists on 410 Gone, and the store that turns a re-list into events. */
#include "kube_watch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json_num.h"
#include "util.h"

#define QUERY_CAP 8192
#define SLEEP_SLICE_MS 50

/* ---- the store: namespace/name → last object, chained hash table ---- */

typedef struct entry {
    char *key;
    cJSON *obj;
    unsigned seen; /* list generation that last saw it */
    struct entry *next;
} entry;

typedef struct {
    entry **b;
    size_t nb, n;
} store;

static size_t hash(const char *s, size_t nb)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (size_t)(h & (nb - 1));
}

/* The link that points at key's entry, or the NULL link ending its chain. */
static entry **store_slot(store *s, const char *key)
{
    entry **p = &s->b[hash(key, s->nb)];
    while (*p && strcmp((*p)->key, key) != 0) p = &(*p)->next;
    return p;
}

static int store_init(store *s)
{
    s->nb = 256;
    s->n = 0;
    s->b = pl_calloc(s->nb, sizeof *s->b);
    return s->b ? 0 : -1;
}

/* Doubles the buckets; on allocation failure the table just stays denser. */
static void store_grow(store *s)
{
    entry **nb = pl_calloc(s->nb * 2, sizeof *nb);
    if (!nb) return;
    for (size_t i = 0; i < s->nb; i++)
        for (entry *e = s->b[i], *next; e; e = next) {
            next = e->next;
            size_t h = hash(e->key, s->nb * 2);
            e->next = nb[h];
            nb[h] = e;
        }
    free(s->b);
    s->b = nb;
    s->nb *= 2;
}

/* Unlinks and frees the entry *slot points at. */
static void store_remove(store *s, entry **slot)
{
    entry *e = *slot;
    *slot = e->next;
    s->n--;
    cJSON_Delete(e->obj);
    free(e->key);
    free(e);
}

static void store_free(store *s)
{
    for (size_t i = 0; i < s->nb; i++)
        while (s->b[i]) store_remove(s, &s->b[i]);
    free(s->b);
}

/* ---- the watcher ---- */

typedef struct {
    pl_kube_client *c;
    const pl_watch_config *cfg;
    pl_watch_stats *stats;
    store st;
    unsigned gen;          /* list generation */
    char rv[128];          /* last resourceVersion seen */
    char selectors[QUERY_CAP / 2]; /* "&labelSelector=...&fieldSelector=..." */
    uint64_t rng;
    int failures;          /* consecutive, for the back-off */
} watcher;

/* Keeps obj's metadata.resourceVersion, if it has one, as the last seen. */
static int set_rv(watcher *w, const cJSON *obj)
{
    const char *rv = pl_kube_field(obj, "metadata.resourceVersion");
    if (!rv) return 0;
    if (strlen(rv) >= sizeof w->rv) return -1;
    strcpy(w->rv, rv);
    snprintf(w->stats->resource_version, sizeof w->stats->resource_version, "%s", rv);
    return 0;
}

static void emit(watcher *w, pl_watch_event ev, const cJSON *obj, const cJSON *old)
{
    w->cfg->on_event(ev, obj, old, w->cfg->user);
}

/* Applies an object to the store (taking it) and emits what changed: ADDED
 * or MODIFIED for type ADDED/MODIFIED, DELETED for DELETED. −1: not an object
 * with a name, or out of memory. */
static int apply(watcher *w, pl_watch_event type, cJSON *obj)
{
    const char *ns = pl_kube_field(obj, "metadata.namespace");
    const char *name = pl_kube_field(obj, "metadata.name");
    char key[512];
    if (!name || snprintf(key, sizeof key, "%s/%s", ns ? ns : "", name) >= (int)sizeof key) {
        cJSON_Delete(obj);
        return -1;
    }
    entry **slot = store_slot(&w->st, key), *e = *slot;
    if (type == PL_WATCH_DELETED) {
        emit(w, PL_WATCH_DELETED, obj, NULL);
        cJSON_Delete(obj);
        if (e) store_remove(&w->st, slot);
        return 0;
    }
    if (e) {
        const char *old_rv = pl_kube_field(e->obj, "metadata.resourceVersion");
        const char *new_rv = pl_kube_field(obj, "metadata.resourceVersion");
        cJSON *old = e->obj;
        e->seen = w->gen;
        e->obj = obj;
        if (!old_rv || !new_rv || strcmp(old_rv, new_rv) != 0)
            emit(w, PL_WATCH_MODIFIED, obj, old);
        cJSON_Delete(old);
        return 0;
    }
    if (!(e = pl_calloc(1, sizeof *e)) || !(e->key = strdup(key))) {
        free(e);
        cJSON_Delete(obj);
        return -1;
    }
    e->obj = obj;
    e->seen = w->gen;
    *slot = e;
    if (++w->st.n > w->st.nb * 2) store_grow(&w->st);
    emit(w, PL_WATCH_ADDED, obj, NULL);
    return 0;
}

/* After a complete list: what the list did not contain was deleted meanwhile. */
static void sweep(watcher *w)
{
    for (size_t i = 0; i < w->st.nb; i++)
        for (entry **p = &w->st.b[i]; *p;) {
            if ((*p)->seen == w->gen) {
                p = &(*p)->next;
                continue;
            }
            emit(w, PL_WATCH_DELETED, (*p)->obj, NULL);
            store_remove(&w->st, p);
        }
}

/* Appends "&key=escaped(value)" to q (of size cap); −1 when it does not fit. */
static int query_add(char *q, size_t cap, const char *key, const char *value)
{
    if (!value || !*value) return 0;
    char *esc = pl_kube_escape(value);
    size_t len = strlen(q);
    int n = esc ? snprintf(q + len, cap - len, "&%s=%s", key, esc) : -1;
    free(esc);
    return n < 0 || (size_t)n >= cap - len ? -1 : 0;
}

static void fail(watcher *w, const pl_kube_status *st)
{
    w->stats->errors++;
    w->failures++;
    if (w->cfg->on_error) w->cfg->on_error(st, w->cfg->user);
}

/* Fills apiVersion and kind of a list item from the list's (PodList → Pod). */
static int fill_kind(cJSON *item, const char *api_version, const char *list_kind)
{
    if (api_version && !cJSON_HasObjectItem(item, "apiVersion") &&
        !cJSON_AddStringToObject(item, "apiVersion", api_version))
        return -1;
    size_t n = list_kind ? strlen(list_kind) : 0;
    if (n <= 4 || strcmp(list_kind + n - 4, "List") != 0 || cJSON_HasObjectItem(item, "kind"))
        return 0;
    char kind[256];
    snprintf(kind, sizeof kind, "%.*s", (int)(n - 4), list_kind);
    return cJSON_AddStringToObject(item, "kind", kind) ? 0 : -1;
}

/* One page of a list: its items applied; *cont set to its continue token. */
static int list_page(watcher *w, cJSON *list, char *cont, size_t contlen, pl_kube_status *st)
{
    cJSON *items = cJSON_GetObjectItemCaseSensitive(list, "items");
    const char *api_version = pl_kube_field(list, "apiVersion");
    const char *kind = pl_kube_field(list, "kind");
    const char *next = pl_kube_field(list, "metadata.continue");
    if (items && !cJSON_IsArray(items))
        return pl_kube_status_set(st, 200, "InvalidResponse", "list: items is not an array");
    cJSON *item;
    while ((item = cJSON_DetachItemFromArray(items, 0))) {
        if (fill_kind(item, api_version, kind)) {
            cJSON_Delete(item);
            return pl_kube_status_set(st, 0, "InternalError", "list: out of memory");
        }
        if (apply(w, PL_WATCH_ADDED, item))
            return pl_kube_status_set(st, 200, "InvalidResponse", "list: an item without a name");
    }
    if (snprintf(cont, contlen, "%s", next ? next : "") >= (int)contlen || set_rv(w, list))
        return pl_kube_status_set(st, 200, "InvalidResponse",
                                  "list: continue or resourceVersion too long");
    return 0;
}

/* A complete (paged) list into the store, then the sweep and on_synced. */
static int list_all(watcher *w, pl_kube_status *st)
{
    char query[QUERY_CAP], cont[4096] = "";
    w->gen++;
    do {
        snprintf(query, sizeof query, "limit=%d%s",
                 w->cfg->page_size > 0 ? w->cfg->page_size : PL_WATCH_PAGE, w->selectors);
        cJSON *list;
        if (query_add(query, sizeof query, "continue", cont))
            return pl_kube_status_set(st, 0, "Invalid", "list: query too long");
        if (pl_kube_get(w->c, &w->cfg->ref, query, &list, st)) return -1;
        int rc = list_page(w, list, cont, sizeof cont, st);
        cJSON_Delete(list);
        if (rc) return -1;
    } while (cont[0] && !pl_kube_client_stopped(w->c));
    if (pl_kube_client_stopped(w->c)) return -1;
    sweep(w);
    w->stats->lists++;
    if (w->cfg->on_synced) w->cfg->on_synced(w->cfg->user);
    return 0;
}

/* ---- the watch stream ---- */

typedef struct {
    watcher *w;
    int gone;              /* ERROR event with code 410 */
    int events;            /* lines handled */
    pl_kube_status error;  /* why the stream was abandoned */
} stream;

/* The stream is abandoned: it broke the watch protocol. */
static int bad(stream *s, const char *what)
{
    return pl_kube_status_set(&s->error, 200, "InvalidResponse", "watch: %s", what);
}

static int handle_event(stream *s, cJSON *ev)
{
    watcher *w = s->w;
    const char *type = pl_kube_field(ev, "type");
    cJSON *obj = cJSON_GetObjectItemCaseSensitive(ev, "object");
    if (!type || !cJSON_IsObject(obj)) return bad(s, "bad event");
    s->events++;
    if (strcmp(type, "ERROR") == 0) {
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(obj, "code");
        const char *msg = pl_kube_field(obj, "message"), *reason = pl_kube_field(obj, "reason");
        const long http = (long)pl_json_int_or(code, 0, 999, 0);
        s->gone = http == 410;
        return pl_kube_status_set(&s->error, http,
                                  reason ? reason : "", "watch: %s", msg ? msg : "ERROR event");
    }
    if (set_rv(w, obj)) return bad(s, "resourceVersion too long");
    if (strcmp(type, "BOOKMARK") == 0) {
        w->stats->bookmarks++;
        return 0;
    }
    pl_watch_event t;
    if (strcmp(type, "ADDED") == 0) t = PL_WATCH_ADDED;
    else if (strcmp(type, "MODIFIED") == 0) t = PL_WATCH_MODIFIED;
    else if (strcmp(type, "DELETED") == 0) t = PL_WATCH_DELETED;
    else return bad(s, "unknown event type");
    w->stats->events++;
    cJSON_DetachItemViaPointer(ev, obj);
    if (apply(w, t, obj)) return bad(s, "object without a name");
    return 0;
}

static int on_line(char *line, size_t len, void *user)
{
    stream *s = user;
    if (pl_kube_client_stopped(s->w->c)) return -1;
    if (strspn(line, " \t\r") == len) return 0; /* keep-alive blank line */
    cJSON *ev = cJSON_ParseWithLength(line, len);
    if (!ev) return bad(s, "a line is not JSON");
    int rc = handle_event(s, ev);
    cJSON_Delete(ev);
    return rc;
}

static uint64_t next_random(watcher *w)
{
    w->rng ^= w->rng << 13; /* xorshift64 */
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

typedef enum { WATCH_AGAIN, WATCH_RELIST, WATCH_FAILED } watch_end;

/* One watch request from w->rv, until the server ends it or it fails. */
static watch_end watch_once(watcher *w)
{
    int t = w->cfg->timeout_seconds > 0 ? w->cfg->timeout_seconds : PL_WATCH_TIMEOUT_S;
    t += (int)(next_random(w) % (uint64_t)t); /* spread re-watches of many clients */
    char path[QUERY_CAP + 1024], query[QUERY_CAP], why[256];
    snprintf(query, sizeof query, "watch=1&allowWatchBookmarks=true&timeoutSeconds=%d%s", t,
             w->selectors);
    stream s = {.w = w};
    pl_kube_status st;
    if (query_add(query, sizeof query, "resourceVersion", w->rv) ||
        pl_kube_path(&w->cfg->ref, query, path, sizeof path, why, sizeof why)) {
        pl_kube_status_set(&s.error, 0, "Invalid", "watch: query too long");
        fail(w, &s.error);
        return WATCH_FAILED;
    }
    w->stats->watches++;
    int64_t start = pl_now_ms();
    int rc = pl_kube_stream(w->c, path, (t + 30) * 1000L, on_line, &s, &st);
    if (pl_kube_client_stopped(w->c)) return WATCH_AGAIN;
    int quick = pl_now_ms() - start < 1000;
    if (s.gone || (rc && st.http == 410)) {
        w->stats->relists_gone++;
        w->failures += quick;
        return WATCH_RELIST;
    }
    if (rc == 0 && (s.events > 0 || !quick)) {
        w->failures = 0;
        return WATCH_AGAIN;
    }
    /* a stream the server ends at once, empty, is a failure too: no busy loop */
    if (rc == 0) pl_kube_status_set(&s.error, 200, "EmptyWatch", "watch: it ended at once, empty");
    fail(w, s.error.message[0] ? &s.error : &st);
    return WATCH_FAILED;
}

/* Sleeps min·2^(failures−1), at most max, less up to half of it (jitter),
 * in slices so that the stop flag is seen soon. */
static void back_off(watcher *w)
{
    long lo = w->cfg->backoff_min_ms > 0 ? w->cfg->backoff_min_ms : PL_WATCH_BACKOFF_MIN_MS;
    long hi = w->cfg->backoff_max_ms > 0 ? w->cfg->backoff_max_ms : PL_WATCH_BACKOFF_MAX_MS;
    long ms = lo;
    for (int i = 1; i < w->failures && ms < hi; i++) ms *= 2;
    if (ms > hi) ms = hi;
    ms -= (long)(next_random(w) % (uint64_t)(ms / 2 + 1));
    while (ms > 0 && !pl_kube_client_stopped(w->c)) {
        long slice = ms < SLEEP_SLICE_MS ? ms : SLEEP_SLICE_MS;
        struct timespec ts = {0, slice * 1000000L};
        nanosleep(&ts, NULL);
        ms -= slice;
    }
}

static int set_selectors(watcher *w, char *err, size_t errlen)
{
    w->selectors[0] = '\0';
    if (query_add(w->selectors, sizeof w->selectors, "labelSelector", w->cfg->label_selector) ||
        query_add(w->selectors, sizeof w->selectors, "fieldSelector", w->cfg->field_selector))
        return pl_errf(err, errlen, "watch: selectors too long");
    return 0;
}

int pl_watch_run(pl_kube_client *c, const pl_watch_config *cfg, pl_watch_stats *stats,
                 char *err, size_t errlen)
{
    char path[1024];
    pl_watch_stats local;
    if (!cfg->on_event) return pl_errf(err, errlen, "watch: on_event is required");
    if (cfg->ref.name || cfg->ref.subresource)
        return pl_errf(err, errlen, "watch: ref must be a collection (no name or subresource)");
    if (pl_kube_path(&cfg->ref, NULL, path, sizeof path, err, errlen)) return -1;
    memset(stats ? stats : &local, 0, sizeof local);
    watcher w = {.c = c, .cfg = cfg, .stats = stats ? stats : &local};
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    w.rng = ((uint64_t)now.tv_nsec << 20) ^ (uint64_t)(uintptr_t)&w ^ 0x9E3779B97F4A7C15ull;
    if (set_selectors(&w, err, errlen)) return -1;
    if (store_init(&w.st)) return pl_errf(err, errlen, "watch: out of memory");

    int listed = 0;
    while (!pl_kube_client_stopped(c)) {
        if (!listed) {
            pl_kube_status st;
            listed = list_all(&w, &st) == 0;
            if (listed) {
                w.failures = 0;
            } else if (!pl_kube_client_stopped(c)) {
                fail(&w, &st);
                back_off(&w);
            }
            continue;
        }
        watch_end end = watch_once(&w);
        if (end == WATCH_RELIST) listed = 0;
        /* failures also counts 410s right after a list: a relist loop is no busy loop */
        if (end == WATCH_FAILED || (end == WATCH_RELIST && w.failures)) back_off(&w);
    }
    store_free(&w.st);
    return 0;
}
