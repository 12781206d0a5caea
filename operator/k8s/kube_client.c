/* The Kubernetes REST client on libcurl and cJSON (kube_client.h): paths, requests,
 * Status errors, 409 retries, status updates and Events. */
#include "kube_client.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "util.h"

#define USER_AGENT "pliant-operator"
#define EVENT_NOTE_MAX 1024

struct pl_kube_client {
    CURL *curl;
    pl_kube_config *cfg;
    long timeout_ms;
    const atomic_int *stop;
    char curl_err[CURL_ERROR_SIZE];
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

/* curl_global_init is not thread-safe in every libcurl: run it exactly once. */
static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int pl_kube_status_set(pl_kube_status *st, long http, const char *reason, const char *fmt, ...)
{
    st->http = http;
    st->retry_after_ms = 0;
    snprintf(st->reason, sizeof st->reason, "%s", reason);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->message, sizeof st->message, fmt, ap);
    va_end(ap);
    return -1;
}

pl_kube_client *pl_kube_client_new(pl_kube_config *cfg, char *err, size_t errlen)
{
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK) {
        pl_errf(err, errlen, "curl_global_init: %s", curl_easy_strerror(global_rc));
        return NULL;
    }
    pl_kube_client *c = pl_calloc(1, sizeof *c);
    if (!c || !(c->curl = curl_easy_init())) {
        free(c);
        pl_errf(err, errlen, "cannot create a curl handle");
        return NULL;
    }
    c->cfg = cfg;
    c->timeout_ms = PL_KUBE_TIMEOUT_MS;
    return c;
}

void pl_kube_client_free(pl_kube_client *c)
{
    if (!c) return;
    curl_easy_cleanup(c->curl);
    free(c);
}

void pl_kube_client_set_timeout(pl_kube_client *c, long timeout_ms)
{
    c->timeout_ms = timeout_ms;
}

void pl_kube_client_set_stop(pl_kube_client *c, const atomic_int *stop)
{
    c->stop = stop;
}

int pl_kube_client_stopped(const pl_kube_client *c)
{
    return c->stop && atomic_load(c->stop);
}

const char *pl_kube_field(const cJSON *obj, const char *path)
{
    char key[128];
    for (const char *p = path; obj && *p;) {
        size_t n = strcspn(p, ".");
        if (n >= sizeof key) return NULL;
        memcpy(key, p, n);
        key[n] = '\0';
        obj = cJSON_GetObjectItemCaseSensitive(obj, key);
        p += n + (p[n] == '.');
    }
    return cJSON_IsString(obj) ? obj->valuestring : NULL;
}

/* ---- paths ---- */

static int check_segment(const char *field, const char *s, int required, char *err,
                         size_t errlen)
{
    if (!s || !*s)
        return required ? pl_errf(err, errlen, "%s: missing", field) : 0;
    if (strcmp(s, ".") == 0 || strcmp(s, "..") == 0 || strpbrk(s, "/?#% \t\r\n"))
        return pl_errf(err, errlen, "%s: \"%s\" is not a valid path segment", field, s);
    return 0;
}

int pl_kube_path(const pl_kube_ref *r, const char *query, char *out, size_t outlen, char *err,
                 size_t errlen)
{
    if (check_segment("group", r->group, 0, err, errlen) ||
        check_segment("version", r->version, 1, err, errlen) ||
        check_segment("namespace", r->namespace_, 0, err, errlen) ||
        check_segment("plural", r->plural, 1, err, errlen) ||
        check_segment("name", r->name, 0, err, errlen) ||
        check_segment("subresource", r->subresource, 0, err, errlen))
        return -1;
    int has_group = r->group && *r->group, has_ns = r->namespace_ && *r->namespace_;
    int has_name = r->name && *r->name, has_sub = r->subresource && *r->subresource;
    if (has_sub && !has_name) return pl_errf(err, errlen, "subresource: needs a name");
    return pl_pathf(out, outlen, err, errlen, "/%s%s/%s%s%s/%s%s%s%s%s%s%s",
                    has_group ? "apis/" : "api", has_group ? r->group : "", r->version,
                    has_ns ? "/namespaces/" : "",
                    has_ns ? r->namespace_ : "", r->plural, has_name ? "/" : "",
                    has_name ? r->name : "", has_sub ? "/" : "", has_sub ? r->subresource : "",
                    query && *query ? "?" : "", query && *query ? query : "");
}

char *pl_kube_escape(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    char *out = malloc(strlen(s) * 3 + 1), *o = out;
    if (!out) return NULL;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("-._~", *p)) {
            *o++ = (char)*p;
        } else {
            *o++ = '%';
            *o++ = hex[*p >> 4];
            *o++ = hex[*p & 15];
        }
    }
    *o = '\0';
    return out;
}

/* ---- one request ---- */

/* Where a response goes: a bounded buffer, from which a 2xx stream's
 * complete lines are handed to on_line as they arrive. */
typedef struct {
    CURL *curl;
    char *data;
    size_t len, cap;
    int too_big;
    int (*on_line)(char *line, size_t len, void *user);
    void *user;
    int aborted; /* on_line asked to stop */
} sink;

static size_t on_write(char *p, size_t size, size_t n, void *user)
{
    sink *s = user;
    size_t len = size * n, old = s->len;
    if (s->len + len + 1 > PL_KUBE_MAX_BODY) {
        s->too_big = 1;
        return 0;
    }
    if (s->len + len + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + len + 1) cap *= 2;
        char *grown = realloc(s->data, cap);
        if (!grown) return 0;
        s->data = grown;
        s->cap = cap;
    }
    memcpy(s->data + s->len, p, len);
    s->len += len;
    s->data[s->len] = '\0';
    long http = 0;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &http);
    if (!s->on_line || http / 100 != 2) return len;
    /* only the new bytes are searched: a long line in many chunks stays linear */
    char *start = s->data, *nl;
    for (char *from = s->data + old; (nl = memchr(from, '\n', s->len - (size_t)(from - s->data)));
         from = start = nl + 1) {
        *nl = '\0';
        if (s->on_line(start, (size_t)(nl - start), s->user)) {
            s->aborted = 1;
            return 0;
        }
    }
    s->len -= (size_t)(start - s->data);
    memmove(s->data, start, s->len + 1);
    return len;
}

static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    return pl_kube_client_stopped(user);
}

/* The Kubernetes Status in a failed response's body, or the body's start. */
static void parse_failure(long http, const char *body, size_t len, pl_kube_status *st)
{
    cJSON *j = body ? cJSON_ParseWithLength(body, len) : NULL;
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind");
    if (cJSON_IsString(kind) && strcmp(kind->valuestring, "Status") == 0) {
        const cJSON *reason = cJSON_GetObjectItemCaseSensitive(j, "reason");
        const cJSON *message = cJSON_GetObjectItemCaseSensitive(j, "message");
        pl_kube_status_set(st, http, cJSON_IsString(reason) ? reason->valuestring : "", "%s",
                           cJSON_IsString(message) ? message->valuestring : "");
    } else if (len) {
        pl_kube_status_set(st, http, "", "HTTP %ld: %.200s", http, body);
    } else {
        pl_kube_status_set(st, http, "", "HTTP %ld", http);
    }
    cJSON_Delete(j);
}

/* Sets an option unless an earlier one failed (rc and h in scope). */
#define SET(opt, val) (rc = rc != CURLE_OK ? rc : curl_easy_setopt(h, opt, val))

static CURLcode set_tls(CURL *h, const pl_kube_config *k)
{
    CURLcode rc = CURLE_OK;
    struct curl_blob ca = {k->ca.data, k->ca.len, CURL_BLOB_NOCOPY};
    struct curl_blob cert = {k->cert.data, k->cert.len, CURL_BLOB_NOCOPY};
    struct curl_blob key = {k->key.data, k->key.len, CURL_BLOB_NOCOPY};
    if (k->insecure) {
        SET(CURLOPT_SSL_VERIFYPEER, 0L);
        SET(CURLOPT_SSL_VERIFYHOST, 0L);
    }
    if (k->ca_file) SET(CURLOPT_CAINFO, k->ca_file);
    if (k->ca.data) SET(CURLOPT_CAINFO_BLOB, &ca);
    if (k->cert_file) SET(CURLOPT_SSLCERT, k->cert_file);
    if (k->cert.data) SET(CURLOPT_SSLCERT_BLOB, &cert);
    if (k->key_file) SET(CURLOPT_SSLKEY, k->key_file);
    if (k->key.data) SET(CURLOPT_SSLKEY_BLOB, &key);
    if (k->cert_file || k->cert.data) SET(CURLOPT_SSLCERTTYPE, "PEM");
    return rc;
}

/* Accept, Content-Type and the bearer token (read now: it may have rotated).
 * NULL with st set on failure. */
static struct curl_slist *headers(pl_kube_client *c, const char *content_type,
                                  pl_kube_status *st)
{
    char why[512], ctype[128], *token;
    if (pl_kube_config_token(c->cfg, &token, why, sizeof why)) {
        pl_kube_status_set(st, 0, "Unauthorized", "bearer token: %s", why);
        return NULL;
    }
    char *auth = token ? malloc(strlen(token) + 32) : NULL;
    if (auth) sprintf(auth, "Authorization: Bearer %s", token);
    snprintf(ctype, sizeof ctype, "Content-Type: %s", content_type ? content_type : "");
    /* "Expect:" turns off curl's 100-continue round trip on large bodies */
    const char *lines[] = {"Accept: application/json", "Expect:", auth,
                           content_type ? ctype : NULL};
    struct curl_slist *list = NULL, *next;
    int ok = !token || auth;
    for (size_t i = 0; ok && i < sizeof lines / sizeof lines[0]; i++)
        if (lines[i] && (ok = (next = curl_slist_append(list, lines[i])) != NULL)) list = next;
    if (auth) memset(auth, 0, strlen(auth)); /* no secrets left in freed memory */
    if (token) memset(token, 0, strlen(token));
    free(auth);
    free(token);
    if (ok) return list;
    curl_slist_free_all(list);
    pl_kube_status_set(st, 0, "InternalError", "out of memory");
    return NULL;
}

/* Every option, set again after curl_easy_reset (which keeps the open
 * connection), so that nothing of the previous request carries over. */
static CURLcode set_options(pl_kube_client *c, const char *method, const char *url,
                            struct curl_slist *hdrs, const char *body, long timeout_ms, sink *s)
{
    CURL *h = c->curl;
    curl_easy_reset(h);
    CURLcode rc = set_tls(h, c->cfg);
    SET(CURLOPT_URL, url);
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_HTTPHEADER, hdrs);
    SET(CURLOPT_USERAGENT, USER_AGENT);
    SET(CURLOPT_ACCEPT_ENCODING, ""); /* gzip for large lists */
    SET(CURLOPT_ERRORBUFFER, c->curl_err);
    SET(CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for DNS timeouts */
    SET(CURLOPT_CONNECTTIMEOUT_MS, (long)PL_KUBE_CONNECT_TIMEOUT_MS);
    SET(CURLOPT_TIMEOUT_MS, timeout_ms);
    SET(CURLOPT_TCP_KEEPALIVE, 1L);
    SET(CURLOPT_WRITEFUNCTION, on_write);
    SET(CURLOPT_WRITEDATA, s);
    SET(CURLOPT_NOPROGRESS, 0L);
    SET(CURLOPT_XFERINFOFUNCTION, on_progress);
    SET(CURLOPT_XFERINFODATA, c);
    if (strcmp(method, "GET") != 0) SET(CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        SET(CURLOPT_POSTFIELDS, body);
        SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    }
    return rc;
}

/* A 429 or 503 response's Retry-After (seconds or an HTTP date) in ms, capped at
 * PL_KUBE_RETRY_AFTER_MAX_MS; 0 when there is none (or other statuses). */
static long retry_after_ms(CURL *h, long http)
{
    curl_off_t s = 0;
    if ((http != 429 && http != 503) || curl_easy_getinfo(h, CURLINFO_RETRY_AFTER, &s) != CURLE_OK ||
        s <= 0)
        return 0;
    return s >= PL_KUBE_RETRY_AFTER_MAX_MS / 1000 ? PL_KUBE_RETRY_AFTER_MAX_MS : (long)s * 1000;
}

/* After failure number `tries` (from 0): 1 when the server asked for a short wait
 * (Retry-After ≤ PL_KUBE_RETRY_INLINE_MS) and tries are left, having waited it out;
 * 0 otherwise, or when the stop flag rose meanwhile. */
static int wait_retry_after(const pl_kube_client *c, const pl_kube_status *st, int tries)
{
    if (st->retry_after_ms <= 0 || st->retry_after_ms > PL_KUBE_RETRY_INLINE_MS ||
        tries >= PL_KUBE_RETRY_INLINE_TRIES)
        return 0;
    for (long left = st->retry_after_ms; left > 0 && !pl_kube_client_stopped(c); left -= 50) {
        struct timespec ts = {0, (left < 50 ? left : 50) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return !pl_kube_client_stopped(c);
}

static int perform(pl_kube_client *c, const char *method, const char *path,
                   const char *content_type, const char *body, long timeout_ms, sink *s,
                   pl_kube_status *st)
{
    memset(st, 0, sizeof *st);
    struct curl_slist *hdrs = headers(c, content_type, st);
    if (!hdrs) return -1;
    size_t ulen = strlen(c->cfg->server) + strlen(path) + 1;
    char *url = malloc(ulen);
    if (!url) {
        curl_slist_free_all(hdrs);
        return pl_kube_status_set(st, 0, "InternalError", "out of memory");
    }
    snprintf(url, ulen, "%s%s", c->cfg->server, path);
    c->curl_err[0] = '\0';
    s->curl = c->curl;
    CURLcode opt = set_options(c, method, url, hdrs, body, timeout_ms, s);
    CURLcode rc = opt == CURLE_OK ? curl_easy_perform(c->curl) : opt;
    curl_slist_free_all(hdrs);
    free(url);

    long http = 0;
    curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &http);
    if (rc == CURLE_OK && http / 100 == 2) return 0;
    if (rc == CURLE_OK) {
        parse_failure(http, s->data, s->len, st);
        st->retry_after_ms = retry_after_ms(c->curl, http);
        return -1;
    }
    if (opt != CURLE_OK)
        return pl_kube_status_set(st, 0, "InternalError", "curl options: %s",
                                  curl_easy_strerror(opt));
    if (s->aborted)
        return pl_kube_status_set(st, http, "Aborted", "%s %s: stream aborted", method, path);
    if (s->too_big)
        return pl_kube_status_set(st, http, "InternalError", "%s %s: response over %u bytes",
                                  method, path, PL_KUBE_MAX_BODY);
    if (rc == CURLE_ABORTED_BY_CALLBACK)
        return pl_kube_status_set(st, 0, "Stopped", "%s %s: stopped", method, path);
    return pl_kube_status_set(st, 0, rc == CURLE_OPERATION_TIMEDOUT ? "Timeout" : "Transport",
                              "%s %s: %s", method, path,
                              c->curl_err[0] ? c->curl_err : curl_easy_strerror(rc));
}

int pl_kube_stream(pl_kube_client *c, const char *path, long timeout_ms,
                   int (*on_line)(char *line, size_t len, void *user), void *user,
                   pl_kube_status *st)
{
    sink s = {.on_line = on_line, .user = user};
    int rc = perform(c, "GET", path, NULL, NULL, timeout_ms, &s, st);
    free(s.data);
    return rc;
}

int pl_kube_request(pl_kube_client *c, const char *method, const char *path,
                    const char *content_type, const cJSON *body, cJSON **out, pl_kube_status *st)
{
    if (out) *out = NULL;
    char *text = body ? cJSON_PrintUnformatted(body) : NULL;
    if (body && !text) return pl_kube_status_set(st, 0, "InternalError", "out of memory");
    sink s = {0};
    int rc;
    for (int tries = 0;; tries++) {
        rc = perform(c, method, path, content_type, text, c->timeout_ms, &s, st);
        if (rc == 0 || !wait_retry_after(c, st, tries)) break;
        free(s.data);
        s = (sink){0};
    }
    free(text);
    if (rc == 0 && out && s.len) {
        *out = cJSON_ParseWithLength(s.data, s.len);
        if (!*out)
            rc = pl_kube_status_set(st, 200, "InvalidResponse",
                                    "%s %s: response is not JSON: %.80s", method, path, s.data);
    }
    free(s.data);
    return rc;
}

/* pl_kube_request on a ref: the path is built (and checked) first. */
static int ref_request(pl_kube_client *c, const char *method, const pl_kube_ref *r,
                       const char *query, const char *content_type, const cJSON *body,
                       cJSON **out, pl_kube_status *st)
{
    char path[1024], why[256];
    if (out) *out = NULL;
    if (pl_kube_path(r, query, path, sizeof path, why, sizeof why))
        return pl_kube_status_set(st, 0, "Invalid", "%s", why);
    return pl_kube_request(c, method, path, content_type, body, out, st);
}

int pl_kube_get(pl_kube_client *c, const pl_kube_ref *r, const char *query, cJSON **out,
                pl_kube_status *st)
{
    return ref_request(c, "GET", r, query, NULL, NULL, out, st);
}

int pl_kube_create(pl_kube_client *c, const pl_kube_ref *r, const cJSON *obj, cJSON **out,
                   pl_kube_status *st)
{
    return ref_request(c, "POST", r, NULL, "application/json", obj, out, st);
}

int pl_kube_replace(pl_kube_client *c, const pl_kube_ref *r, const cJSON *obj, cJSON **out,
                    pl_kube_status *st)
{
    return ref_request(c, "PUT", r, NULL, "application/json", obj, out, st);
}

int pl_kube_patch(pl_kube_client *c, const pl_kube_ref *r, pl_kube_patch_type type,
                  const cJSON *patch, cJSON **out, pl_kube_status *st)
{
    const char *ctype = type == PL_KUBE_JSON_PATCH ? "application/json-patch+json"
                                                   : "application/merge-patch+json";
    return ref_request(c, "PATCH", r, NULL, ctype, patch, out, st);
}

int pl_kube_delete(pl_kube_client *c, const pl_kube_ref *r, const char *propagation,
                   pl_kube_status *st)
{
    cJSON *opts = NULL;
    if (propagation) {
        opts = cJSON_CreateObject();
        if (!opts || !cJSON_AddStringToObject(opts, "apiVersion", "v1") ||
            !cJSON_AddStringToObject(opts, "kind", "DeleteOptions") ||
            !cJSON_AddStringToObject(opts, "propagationPolicy", propagation)) {
            cJSON_Delete(opts);
            return pl_kube_status_set(st, 0, "InternalError", "out of memory");
        }
    }
    int rc = ref_request(c, "DELETE", r, NULL, opts ? "application/json" : NULL, opts, NULL, st);
    cJSON_Delete(opts);
    return rc;
}

int pl_kube_patch_status(pl_kube_client *c, const pl_kube_ref *r, const cJSON *status,
                         cJSON **out, pl_kube_status *st)
{
    pl_kube_ref sub = *r;
    sub.subresource = "status";
    cJSON *patch = cJSON_CreateObject();
    cJSON *copy = cJSON_Duplicate(status, 1);
    if (!patch || !copy || !cJSON_AddItemToObject(patch, "status", copy)) {
        cJSON_Delete(patch);
        cJSON_Delete(copy);
        return pl_kube_status_set(st, 0, "InternalError", "out of memory");
    }
    int rc = pl_kube_patch(c, &sub, PL_KUBE_MERGE_PATCH, patch, out, st);
    cJSON_Delete(patch);
    return rc;
}

int pl_kube_update_retry(pl_kube_client *c, const pl_kube_ref *r, int attempts,
                         pl_kube_mutate_fn mutate, void *user, cJSON **out, pl_kube_status *st)
{
    if (out) *out = NULL;
    for (int i = 0; i < (attempts > 0 ? attempts : 1); i++) {
        cJSON *obj;
        if (pl_kube_get(c, r, NULL, &obj, st)) return -1;
        char why[256] = "";
        int m = mutate(obj, user, why, sizeof why);
        if (m != 0) {
            if (m > 0 && out) *out = obj;
            else cJSON_Delete(obj);
            return m > 0 ? 0 : pl_kube_status_set(st, 0, "Mutate", "%s", why);
        }
        int rc = pl_kube_replace(c, r, obj, out, st);
        cJSON_Delete(obj);
        if (rc == 0 || st->http != 409) return rc;
    }
    return -1; /* st holds the last Conflict */
}

int pl_kube_retriable(const pl_kube_status *st)
{
    switch (st->http) {
    case 0: return strcmp(st->reason, "Stopped") != 0 && strcmp(st->reason, "Invalid") != 0 &&
                   strcmp(st->reason, "Mutate") != 0;
    case 429: case 500: case 502: case 503: case 504: return 1;
    default: return 0;
    }
}

/* ---- events ---- */

/* Adds k: v when v is given; clears *ok on allocation failure. */
static void add_str(cJSON *o, const char *k, const char *v, int *ok)
{
    if (v && *ok && !cJSON_AddStringToObject(o, k, v)) *ok = 0;
}

/* MicroTime: RFC 3339 with microseconds, UTC. */
static void micro_time(char *out, size_t outlen)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, outlen, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, outlen - n, ".%06ldZ", ts.tv_nsec / 1000);
}

static cJSON *event_json(const pl_kube_event *ev, const char *ns, char *note, int *ok)
{
    char when[64], host[128] = "pliant-operator", gen[300];
    micro_time(when, sizeof when);
    if (!ev->instance && gethostname(host, sizeof host) == 0) host[sizeof host - 1] = '\0';
    const cJSON *reg = ev->regarding;
    snprintf(gen, sizeof gen, "%.250s.", pl_kube_field(reg, "metadata.name"));
    cJSON *e = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(e, "metadata");
    cJSON *about = cJSON_AddObjectToObject(e, "regarding");
    *ok = e && meta && about;
    add_str(e, "apiVersion", "events.k8s.io/v1", ok);
    add_str(e, "kind", "Event", ok);
    add_str(meta, "generateName", gen, ok);
    add_str(meta, "namespace", ns, ok);
    add_str(e, "eventTime", when, ok);
    add_str(e, "reportingController", ev->controller ? ev->controller : "pliant.dev/operator", ok);
    add_str(e, "reportingInstance", ev->instance ? ev->instance : host, ok);
    add_str(e, "action", ev->action, ok);
    add_str(e, "reason", ev->reason, ok);
    add_str(e, "type", ev->type ? ev->type : "Normal", ok);
    add_str(e, "note", note, ok);
    add_str(about, "apiVersion", pl_kube_field(reg, "apiVersion"), ok);
    add_str(about, "kind", pl_kube_field(reg, "kind"), ok);
    add_str(about, "name", pl_kube_field(reg, "metadata.name"), ok);
    add_str(about, "namespace", pl_kube_field(reg, "metadata.namespace"), ok);
    add_str(about, "uid", pl_kube_field(reg, "metadata.uid"), ok);
    return e;
}

int pl_kube_event_create(pl_kube_client *c, const pl_kube_event *ev, pl_kube_status *st)
{
    if (!pl_kube_field(ev->regarding, "metadata.name") || !ev->reason || !ev->action)
        return pl_kube_status_set(st, 0, "Invalid",
                          "event: regarding.metadata.name, reason and action are required");
    /* cluster-scoped objects (Nodes) get their Events in "default", as kubelet's do */
    const char *ns = pl_kube_field(ev->regarding, "metadata.namespace");
    if (!ns || !*ns) ns = "default";
    char note[EVENT_NOTE_MAX + 1];
    size_t n = (size_t)snprintf(note, sizeof note, "%s", ev->note ? ev->note : "");
    if (n > EVENT_NOTE_MAX) { /* cut on a UTF-8 character boundary */
        for (n = EVENT_NOTE_MAX; n && ((unsigned char)ev->note[n] & 0xC0) == 0x80; n--) {}
        note[n] = '\0';
    }
    int ok;
    cJSON *e = event_json(ev, ns, ev->note ? note : NULL, &ok);
    pl_kube_ref r = {.group = "events.k8s.io", .version = "v1", .namespace_ = ns,
                     .plural = "events"};
    int rc = ok ? pl_kube_create(c, &r, e, NULL, st)
                : pl_kube_status_set(st, 0, "InternalError", "out of memory");
    cJSON_Delete(e);
    return rc;
}
