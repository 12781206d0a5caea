/* The dashboard's server and its jobs' event logs (see dashboard.h). */
#include "dashboard.h"

#include "dashboard_page.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <libwebsockets.h>

#define DASH_FEED "feed"                 /* a job's feed: its path and this */
#define DASH_CHUNK ((size_t)64 << 10)    /* bytes of history per WebSocket fragment */
#define DASH_URI_MAX (PL_DASHBOARD_MAX_PATH + 16)

/* One published event: its sequence number (from 0, never reused) and its text. */
typedef struct {
    uint64_t seq;
    char *text;
    size_t len;
    int step;
} dash_event;

/* A job: its path and its log. Every field but pages is guarded by its server's mu. */
struct pl_dashboard_job {
    pl_dashboard *d;
    char path[PL_DASHBOARD_MAX_PATH + 1];
    dash_event *ev;
    size_t n, cap, max;
    uint64_t next_seq;
    int refs;    /* the front end's (until removed) and one per open feed */
    int removed;
    atomic_int pages, pages_total;
    pl_dashboard_job *next;
};

/* A connection: a page's feed, or an HTTP request for a page. Owned by lws
 * (per-session data), touched on the server's thread only. */
typedef struct {
    pl_dashboard_job *job; /* a feed's job (a reference) */
    int live;          /* the history is sent: events go one per message */
    int hist_started;  /* the history message's first fragment is sent */
    int hist_any;      /* an event of the history is in it (the next needs a comma) */
    uint64_t seq;      /* the next event to send */
    uint64_t hist_end; /* the history is the events before this one */
    size_t http_sent;  /* GET: bytes of the page sent */
    char *index;       /* GET /: the list of jobs' pages (malloc'd), sent in place of a page */
    size_t index_len;
} dash_conn;

struct pl_dashboard {
    pthread_mutex_t mu; /* guards jobs, the jobs' fields, unavailable */
    pl_dashboard_job *jobs;
    char *unavailable;
    struct lws_context *ctx;
    struct lws_protocols protocols[2];
    pthread_t thread;
    int thread_started;
    atomic_int stop;
    char host[128];
    int port;
};

/* ---- the jobs and their logs (any thread, under mu) ---- */

static void job_free(pl_dashboard_job *j)
{
    for (size_t i = 0; i < j->n; i++)
        free(j->ev[i].text);
    free(j->ev);
    free(j);
}

/* Drops a reference; the last one of a removed job frees it. */
static void job_unref(pl_dashboard_job *j)
{
    if (--j->refs == 0)
        job_free(j);
}

/* Drops every other step event of the older half: called when the log is full. */
static void log_thin(pl_dashboard_job *j)
{
    size_t half = j->n / 2, k = 0;
    int odd = 0;
    for (size_t i = 0; i < j->n; i++) {
        dash_event *e = &j->ev[i];
        if (i < half && e->step && (odd ^= 1)) {
            free(e->text);
            continue;
        }
        j->ev[k++] = *e;
    }
    j->n = k;
}

static int log_append(pl_dashboard_job *j, char *text, size_t len, int step)
{
    if (j->n >= j->max)
        log_thin(j);
    if (j->n == j->cap) {
        size_t cap = j->cap ? 2 * j->cap : 256;
        dash_event *ev = realloc(j->ev, cap * sizeof *ev);
        if (!ev)
            return -1;
        j->ev = ev;
        j->cap = cap;
    }
    j->ev[j->n++] = (dash_event){.seq = j->next_seq++, .text = text, .len = len, .step = step};
    return 0;
}

/* The index of the first event with seq ≥ seq (n when none). */
static size_t log_find(const pl_dashboard_job *j, uint64_t seq)
{
    size_t lo = 0, hi = j->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (j->ev[mid].seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The job whose page (feed 0: its path, without the last '/', or with "index.html") or
 * feed (feed 1: its path and DASH_FEED) uri is; NULL. */
static pl_dashboard_job *route(const pl_dashboard *d, const char *uri, int feed)
{
    for (pl_dashboard_job *j = d->jobs; j; j = j->next) {
        size_t p = strlen(j->path) - 1; /* without the last '/' */
        if (strncmp(uri, j->path, p))
            continue;
        const char *rest = uri + p;
        if (feed ? !strcmp(rest, "/" DASH_FEED)
                 : !strcmp(rest, "/") || !strcmp(rest, "/index.html") || (!*rest && p > 0))
            return j;
    }
    return NULL;
}

pl_dashboard_job *pl_dashboard_add(pl_dashboard *d, const char *path, size_t max_events)
{
    size_t len = path ? strlen(path) : 0;
    if (!d || !len || len > PL_DASHBOARD_MAX_PATH || path[0] != '/' || path[len - 1] != '/')
        return NULL;
    pl_dashboard_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->d = d;
    memcpy(j->path, path, len + 1);
    j->max = max_events > 2 ? max_events : 2;
    j->refs = 1;
    pthread_mutex_lock(&d->mu);
    for (pl_dashboard_job *o = d->jobs; o; o = o->next)
        if (!strcmp(o->path, path)) {
            pthread_mutex_unlock(&d->mu);
            free(j);
            return NULL;
        }
    j->next = d->jobs;
    d->jobs = j;
    pthread_mutex_unlock(&d->mu);
    return j;
}

void pl_dashboard_remove(pl_dashboard_job *j)
{
    if (!j)
        return;
    pl_dashboard *d = j->d;
    pthread_mutex_lock(&d->mu);
    for (pl_dashboard_job **p = &d->jobs; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    j->removed = 1;
    job_unref(j);
    pthread_mutex_unlock(&d->mu);
    lws_cancel_service(d->ctx); /* its feeds close when writable */
}

void pl_dashboard_publish(pl_dashboard_job *j, const char *json, int step)
{
    if (!j || !json)
        return;
    size_t len = strlen(json);
    char *text = malloc(len + 1);
    if (!text)
        return; /* the dashboard misses it; the job goes on */
    memcpy(text, json, len + 1);
    pl_dashboard *d = j->d;
    pthread_mutex_lock(&d->mu);
    int rc = log_append(j, text, len, step);
    pthread_mutex_unlock(&d->mu);
    if (rc)
        free(text);
    else
        lws_cancel_service(d->ctx);
}

void pl_dashboard_set_unavailable(pl_dashboard *d, const char *why)
{
    char *copy = why ? strdup(why) : NULL;
    pthread_mutex_lock(&d->mu);
    free(d->unavailable);
    d->unavailable = copy;
    pthread_mutex_unlock(&d->mu);
}

/* ---- what a connection sends (server thread) ---- */

/* A buffer of LWS_PRE + cap bytes for lws_write. */
typedef struct {
    unsigned char *buf;
    size_t len, cap;
} dash_out;

static int out_add(dash_out *o, const char *s, size_t n)
{
    if (o->len + n > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < o->len + n)
            cap *= 2;
        unsigned char *b = realloc(o->buf, LWS_PRE + cap);
        if (!b)
            return -1;
        o->buf = b;
        o->cap = cap;
    }
    memcpy(o->buf + LWS_PRE + o->len, s, n);
    o->len += n;
    return 0;
}

/* The next fragment of the history message into o: 1 when it is the last, 0 when
 * more follow, -1 out of memory. Holds the lock for at most DASH_CHUNK bytes. */
static int history_chunk(pl_dashboard_job *j, dash_conn *c, dash_out *o)
{
    const char *head = "{\"type\": \"history\", \"events\": [";
    int rc = 0;
    if (!c->hist_started)
        rc = out_add(o, head, strlen(head));
    pthread_mutex_lock(&j->d->mu);
    size_t i = log_find(j, c->seq);
    for (; !rc && i < j->n && j->ev[i].seq < c->hist_end && o->len < DASH_CHUNK; i++) {
        if (c->hist_any && out_add(o, ",\n", 2))
            rc = -1;
        else
            rc = out_add(o, j->ev[i].text, j->ev[i].len);
        c->hist_any = 1;
        c->seq = j->ev[i].seq + 1;
    }
    int last = i >= j->n || j->ev[i].seq >= c->hist_end;
    pthread_mutex_unlock(&j->d->mu);
    if (rc)
        return -1;
    if (last && out_add(o, "]}", 2))
        return -1;
    if (last)
        c->seq = c->hist_end;
    return last;
}

/* The next live event into o: 1, or 0 when there is none, -1 out of memory or when
 * the job was removed. */
static int live_event(pl_dashboard_job *j, dash_conn *c, dash_out *o)
{
    pthread_mutex_lock(&j->d->mu);
    size_t i = log_find(j, c->seq);
    int rc = j->removed ? -1 : 0;
    if (!rc && i < j->n) {
        rc = out_add(o, j->ev[i].text, j->ev[i].len) ? -1 : 1;
        c->seq = j->ev[i].seq + 1;
    }
    pthread_mutex_unlock(&j->d->mu);
    return rc;
}

/* 1 when the connection has events it has not sent (or its job was removed). */
static int has_more(pl_dashboard_job *j, const dash_conn *c)
{
    pthread_mutex_lock(&j->d->mu);
    int more = !c->live || c->seq < j->next_seq || j->removed;
    pthread_mutex_unlock(&j->d->mu);
    return more;
}

/* A feed is writable: the next history fragment, or the next event. -1 closes it. */
static int feed_writeable(struct lws *wsi, dash_conn *c)
{
    dash_out o = {0};
    int rc, flags;
    if (!c->live) {
        rc = history_chunk(c->job, c, &o);
        flags = lws_write_ws_flags(LWS_WRITE_TEXT, !c->hist_started, rc == 1);
        c->hist_started = 1;
        if (rc == 1)
            c->live = 1;
    } else {
        rc = live_event(c->job, c, &o);
        flags = LWS_WRITE_TEXT;
    }
    if (rc < 0 || (rc == 0 && c->live && !o.len)) {
        free(o.buf);
        return rc < 0 ? -1 : 0;
    }
    int w = lws_write(wsi, o.buf + LWS_PRE, o.len, (enum lws_write_protocol)flags);
    free(o.buf);
    if (w < (int)o.len)
        return -1;
    if (has_more(c->job, c))
        lws_callback_on_writable(wsi);
    return 0;
}

/* The job whose feed a WebSocket asks for; NULL while unavailable. Under mu. */
static pl_dashboard_job *feed_route(pl_dashboard *d, struct lws *wsi)
{
    char uri[DASH_URI_MAX] = "";
    if (d->unavailable || lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI) < 0)
        return NULL;
    return route(d, uri, 1);
}

/* An upgrade: refused before its answer unless it asks for a job's feed. */
static int feed_filter(pl_dashboard *d, struct lws *wsi)
{
    pthread_mutex_lock(&d->mu);
    int ok = feed_route(d, wsi) != NULL;
    pthread_mutex_unlock(&d->mu);
    return ok ? 0 : -1;
}

/* A WebSocket opened: the feed of the job at its path (its history is what is there
 * now); a job removed since the upgrade was admitted: closed. */
static int feed_established(pl_dashboard *d, struct lws *wsi, dash_conn *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_lock(&d->mu);
    pl_dashboard_job *j = feed_route(d, wsi);
    if (j) {
        j->refs++;
        c->job = j;
        c->seq = j->n ? j->ev[0].seq : j->next_seq;
        c->hist_end = j->next_seq;
    }
    pthread_mutex_unlock(&d->mu);
    if (!j)
        return -1;
    atomic_fetch_add(&j->pages, 1);
    atomic_fetch_add(&j->pages_total, 1);
    lws_callback_on_writable(wsi);
    return 0;
}

static void feed_closed(pl_dashboard *d, dash_conn *c)
{
    if (!c || !c->job)
        return;
    atomic_fetch_sub(&c->job->pages, 1);
    pthread_mutex_lock(&d->mu);
    job_unref(c->job);
    pthread_mutex_unlock(&d->mu);
    c->job = NULL;
}

/* Writes s with HTML's special characters escaped. */
static void put_html(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* GET / on a server with no job at "/" (the operator's): a page listing every job's
 * page, newest first. NULL: out of memory. Under d->mu. */
static char *index_page(const pl_dashboard *d, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        return NULL;
    fputs("<!doctype html>\n<html lang=\"en\"><meta charset=\"utf-8\"><title>Pliant: jobs</title>\n"
          "<style>body{font:15px system-ui,sans-serif;margin:2em}li{margin:.4em 0}</style>\n"
          "<h1>Training jobs</h1>\n<ul>\n", f);
    int n = 0;
    for (const pl_dashboard_job *j = d->jobs; j; j = j->next, n++) {
        fputs("<li><a href=\"", f);
        put_html(f, j->path);
        fputs("\">", f);
        put_html(f, j->path);
        fputs("</a>\n", f);
    }
    fputs(n ? "</ul>\n" : "<li>none yet</ul>\n", f);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* An answer with no page: status and a line for people. */
static int http_refuse(struct lws *wsi, unsigned status, const char *why)
{
    lws_return_http_status(wsi, status, why);
    return lws_http_transaction_completed(wsi) ? -1 : 0;
}

/* GET a job's page (or at "/" with no job there, the list of jobs' pages): its
 * headers; its body follows in http_writeable. 503 while the server is unavailable,
 * else 404 for what is no job's page. */
static int http_request(pl_dashboard *d, struct lws *wsi, dash_conn *c, const char *uri)
{
    free(c->index); /* an earlier request's on a kept-alive connection */
    memset(c, 0, sizeof *c);
    char why[512] = "";
    pthread_mutex_lock(&d->mu);
    int found = route(d, uri, 0) != NULL;
    if (d->unavailable)
        snprintf(why, sizeof why, "%s", d->unavailable);
    else if (!found && !strcmp(uri, "/") && !(c->index = index_page(d, &c->index_len)))
        snprintf(why, sizeof why, "out of memory");
    pthread_mutex_unlock(&d->mu);
    if (why[0])
        return http_refuse(wsi, HTTP_STATUS_SERVICE_UNAVAILABLE, why);
    if (!found && !c->index)
        return http_refuse(wsi, HTTP_STATUS_NOT_FOUND, NULL);
    const size_t len = c->index ? c->index_len : pl_dashboard_page_len;
    unsigned char buf[LWS_PRE + 1024], *start = buf + LWS_PRE, *p = start,
                  *end = buf + sizeof buf - 1;
    const char *nostore = "no-store";
    if (lws_add_http_common_headers(wsi, HTTP_STATUS_OK, "text/html; charset=utf-8",
                                    (lws_filepos_t)len, &p, end) ||
        lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CACHE_CONTROL,
                                     (const unsigned char *)nostore, (int)strlen(nostore), &p,
                                     end) ||
        lws_finalize_write_http_header(wsi, start, &p, end))
        return -1;
    lws_callback_on_writable(wsi);
    return 0;
}

static int http_writeable(struct lws *wsi, dash_conn *c)
{
    const char *body = c->index ? c->index : (const char *)pl_dashboard_page;
    const size_t total = c->index ? c->index_len : pl_dashboard_page_len;
    size_t left = total - c->http_sent, n = left < DASH_CHUNK ? left : DASH_CHUNK;
    unsigned char *buf = malloc(LWS_PRE + n + 1);
    if (!buf)
        return -1;
    memcpy(buf + LWS_PRE, body + c->http_sent, n);
    int last = n == left;
    int w = lws_write(wsi, buf + LWS_PRE, n, last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP);
    free(buf);
    if (w < (int)n)
        return -1;
    c->http_sent += n;
    if (last)
        return lws_http_transaction_completed(wsi) ? -1 : 0;
    lws_callback_on_writable(wsi);
    return 0;
}

static int dash_callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                         size_t len)
{
    struct lws_context *ctx = lws_get_context(wsi);
    pl_dashboard *d = ctx ? lws_context_user(ctx) : NULL;
    dash_conn *c = user;
    switch (reason) {
    case LWS_CALLBACK_HTTP: return http_request(d, wsi, c, in ? (const char *)in : "");
    case LWS_CALLBACK_HTTP_WRITEABLE: return c ? http_writeable(wsi, c) : -1;
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION: return feed_filter(d, wsi);
    case LWS_CALLBACK_ESTABLISHED: return feed_established(d, wsi, c);
    case LWS_CALLBACK_SERVER_WRITEABLE: return c && c->job ? feed_writeable(wsi, c) : 0;
    case LWS_CALLBACK_RECEIVE: return 0; /* read-only: whatever a page sends is ignored */
    case LWS_CALLBACK_CLOSED: feed_closed(d, c); return 0;
    case LWS_CALLBACK_CLOSED_HTTP:
        if (c) {
            free(c->index);
            c->index = NULL;
        }
        return 0;
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        if (d && !atomic_load(&d->stop))
            lws_callback_on_writable_all_protocol(ctx, &d->protocols[0]);
        return 0;
    default: return lws_callback_http_dummy(wsi, reason, user, in, len);
    }
}

/* ---- the server ---- */

static void *serve(void *arg)
{
    pl_dashboard *d = arg;
    while (!atomic_load(&d->stop))
        if (lws_service(d->ctx, 0) < 0)
            break;
    return NULL;
}

/* "HOST:PORT", "[V6]:PORT", ":PORT" into host and port. */
static int parse_addr(const char *flag, const char *addr, char *host, size_t hostlen, int *port,
                      char *err, size_t errlen)
{
    const char *colon = strrchr(addr, ':');
    const char *h = addr, *he = colon;
    if (!colon)
        return pl_errf(err, errlen, "%s %s: expected HOST:PORT", flag, addr);
    if (*h == '[' && he > h && he[-1] == ']') {
        h++;
        he--;
    }
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || p < 0 || p > 65535)
        return pl_errf(err, errlen, "%s %s: bad port", flag, addr);
    size_t n = (size_t)(he - h);
    if (n >= hostlen)
        return pl_errf(err, errlen, "%s %s: host too long", flag, addr);
    if (n == 0)
        snprintf(host, hostlen, "127.0.0.1");
    else
        snprintf(host, hostlen, "%.*s", (int)n, h);
    *port = (int)p;
    return 0;
}

static int create_context(pl_dashboard *d, const char *flag, int port, char *err, size_t errlen)
{
    d->protocols[0].name = PL_DASHBOARD_SUBPROTOCOL;
    d->protocols[0].callback = dash_callback;
    d->protocols[0].per_session_data_size = sizeof(dash_conn);
    d->protocols[0].rx_buffer_size = 4096;
    lws_set_log_level(LLL_ERR, NULL); /* as the control server: lws's notices are noise */
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    if (!strchr(d->host, ':'))
        info.options |= LWS_SERVER_OPTION_DISABLE_IPV6;
    info.port = port;
    info.iface = d->host;
    info.protocols = d->protocols;
    info.user = d;
    info.gid = -1;
    info.uid = -1;
    info.vhost_name = "pliant-dashboard";
    d->ctx = lws_create_context(&info);
    struct lws_vhost *vh = d->ctx ? lws_get_vhost_by_name(d->ctx, "pliant-dashboard") : NULL;
    d->port = vh ? lws_get_vhost_listen_port(vh) : 0;
    if (d->port <= 0)
        return pl_errf(err, errlen, "%s: cannot listen on %s:%d", flag, d->host, port);
    return 0;
}

pl_dashboard *pl_dashboard_start(const char *flag, const char *addr, char *err, size_t errlen)
{
    pl_dashboard *d = calloc(1, sizeof *d);
    if (!d) {
        pl_errf(err, errlen, "%s: out of memory", flag);
        return NULL;
    }
    pthread_mutex_init(&d->mu, NULL);
    int port = 0;
    if (parse_addr(flag, addr, d->host, sizeof d->host, &port, err, errlen) ||
        create_context(d, flag, port, err, errlen))
        goto fail;
    if (pthread_create(&d->thread, NULL, serve, d)) {
        pl_errf(err, errlen, "%s: cannot start the dashboard's thread", flag);
        goto fail;
    }
    d->thread_started = 1;
    return d;
fail:
    pl_dashboard_stop(d);
    return NULL;
}

void pl_dashboard_stop(pl_dashboard *d)
{
    if (!d)
        return;
    atomic_store(&d->stop, 1);
    if (d->thread_started) {
        lws_cancel_service(d->ctx);
        pthread_join(d->thread, NULL);
    }
    if (d->ctx)
        lws_context_destroy(d->ctx); /* the feeds' references go (feed_closed) */
    while (d->jobs) {
        pl_dashboard_job *j = d->jobs;
        d->jobs = j->next;
        job_free(j);
    }
    free(d->unavailable);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

const char *pl_dashboard_host(const pl_dashboard *d) { return d->host; }
int pl_dashboard_port(const pl_dashboard *d) { return d->port; }

int pl_dashboard_pages(const pl_dashboard_job *j, int *total)
{
    pl_dashboard_job *m = (pl_dashboard_job *)j;
    if (total)
        *total = atomic_load(&m->pages_total);
    return atomic_load(&m->pages);
}

/* ---- the page as a file ---- */

/* JSON text inside <script>: "</" written "<\/" (the same string to a JSON parser). */
static int write_script_safe(FILE *f, const char *s)
{
    for (; *s; s++)
        if (fputc(*s, f) == EOF || (*s == '<' && s[1] == '/' && fputc('\\', f) == EOF))
            return -1;
    return 0;
}

/* A JSON array of events, each "</" escaped. */
static int write_events(FILE *f, const char *const *events, int n)
{
    int rc = fputc('[', f) == EOF;
    for (int i = 0; i < n && !rc; i++) {
        rc |= i && fputs(",\n", f) < 0;
        rc |= write_script_safe(f, events[i]);
    }
    return rc | (fputc(']', f) == EOF) ? -1 : 0;
}

/* The history element: the events of one unnamed run as an array, several runs as
 * {"runs": [{"name": ..., "events": [...]}, ...]}. */
static int write_history(FILE *f, const pl_dashboard_run *runs, int n)
{
    int one = n == 1 && !runs[0].name;
    int rc = fputs("<script id=\"pliant-history\" type=\"application/json\">", f) < 0;
    rc |= !one && fputs("{\"runs\": [", f) < 0;
    for (int i = 0; i < n && !rc; i++) {
        if (!one) {
            rc |= i && fputs(",\n", f) < 0;
            rc |= fputs("{\"name\": ", f) < 0 || write_script_safe(f, "\"") ||
                  write_script_safe(f, runs[i].name ? runs[i].name : "") ||
                  fputs("\", \"events\": ", f) < 0;
        }
        rc |= write_events(f, runs[i].events, runs[i].n);
        rc |= !one && fputc('}', f) == EOF;
    }
    rc |= !one && fputs("]}", f) < 0;
    return rc | (fputs("</script>", f) < 0) ? -1 : 0;
}

int pl_dashboard_write_runs(FILE *f, const pl_dashboard_run *runs, int n)
{
    const char *mark = strstr(pl_dashboard_page, PL_DASHBOARD_PAGE_MARK);
    size_t head = mark ? (size_t)(mark - pl_dashboard_page) : pl_dashboard_page_len;
    int rc = fwrite(pl_dashboard_page, 1, head, f) == head ? 0 : -1;
    rc |= write_history(f, runs, n);
    if (mark) {
        size_t rest = pl_dashboard_page_len - head - strlen(PL_DASHBOARD_PAGE_MARK);
        rc |= fwrite(mark + strlen(PL_DASHBOARD_PAGE_MARK), 1, rest, f) != rest;
    }
    return rc ? -1 : 0;
}
