/* Fault injection: the --chaos SPEC and spot-instance traces parsed into timed kill,
 * term and add events (chaos.h). */
#include "chaos.h"
#include "spot_trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define MAX_TRACE_NODE 1000000

static int parse_i64(const char *s, const char *end, int64_t lo, int64_t hi, int64_t *out)
{
    if (s == end) return -1;
    int64_t v = 0;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    if (v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Seconds with an optional fraction ("2", "0.5") to milliseconds. */
static int parse_seconds_ms(const char *s, const char *end, int64_t *ms)
{
    char buf[32];
    if (end - s <= 0 || end - s >= (long)sizeof buf) return -1;
    memcpy(buf, s, (size_t)(end - s));
    buf[end - s] = '\0';
    char *stop;
    errno = 0;
    double v = strtod(buf, &stop);
    if (errno || *stop || stop == buf || !(v >= 0) || v > 1e9) return -1;
    *ms = (int64_t)(v * 1000.0 + 0.5);
    return 0;
}

static int push(pl_chaos *c, const pl_chaos_event *e)
{
    pl_chaos_event *grown = realloc(c->events, (size_t)(c->n + 1) * sizeof *grown);
    if (!grown) return -1;
    c->events = grown;
    c->events[c->n++] = *e;
    return 0;
}

/* pl_trace_read's state: the rows read so far and what they say of each node. */
typedef struct {
    const char *path;
    int line;                    /* of the row being read, from 1 */
    unsigned char *alive, *seen; /* by node number: alive now, ever added */
    pl_trace_event *ev;
    int n, cap;
    char *err;
    size_t errlen;
} trace_reader;

/* The length of the line at p without its line end; *next receives the next line. */
static size_t trace_line(char *p, char **next)
{
    char *nl = strchr(p, '\n');
    *next = nl ? nl + 1 : p + strlen(p);
    size_t len = (size_t)(*next - p);
    while (len && (p[len - 1] == '\n' || p[len - 1] == '\r')) len--;
    return len;
}

/* "t_ms,add|remove,nodeN" (row, len characters; its second comma is overwritten) → ev. */
static int parse_trace_row(const trace_reader *r, char *row, size_t len, pl_trace_event *ev)
{
    char *c1 = strchr(row, ','), *c2 = c1 ? strchr(c1 + 1, ',') : NULL;
    int64_t node;
    if (!c2 || parse_i64(row, c1, 0, INT64_MAX / 2, &ev->t_ms) || strncmp(c2 + 1, "node", 4) ||
        parse_i64(c2 + 5, row + len, 0, MAX_TRACE_NODE, &node))
        return pl_errf(r->err, r->errlen, "%s:%d: expected t_ms,add|remove,nodeN (got \"%s\")",
                       r->path, r->line, row);
    *c2 = '\0';
    ev->node = (int)node;
    if (!strcmp(c1 + 1, "add"))
        ev->add = 1;
    else if (!strcmp(c1 + 1, "remove"))
        ev->add = 0;
    else
        return pl_errf(r->err, r->errlen, "%s:%d: event \"%s\" is neither add nor remove", r->path,
                       r->line, c1 + 1);
    return 0;
}

/* Times never go back, a node is added once and only a live node is removed. */
static int check_trace_event(const trace_reader *r, const pl_trace_event *ev)
{
    if (r->n && ev->t_ms < r->ev[r->n - 1].t_ms)
        return pl_errf(r->err, r->errlen, "%s:%d: time %lld goes backwards", r->path, r->line,
                       (long long)ev->t_ms);
    if (ev->add && r->seen[ev->node])
        return pl_errf(r->err, r->errlen, "%s:%d: node%d added twice", r->path, r->line, ev->node);
    if (!ev->add && !r->alive[ev->node])
        return pl_errf(r->err, r->errlen, "%s:%d: node%d removed but not alive", r->path, r->line,
                       ev->node);
    return 0;
}

static int append_trace_event(trace_reader *r, const pl_trace_event *ev)
{
    r->seen[ev->node] |= (unsigned char)ev->add;
    r->alive[ev->node] = (unsigned char)ev->add;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 256;
        pl_trace_event *grown = realloc(r->ev, (size_t)r->cap * sizeof *grown);
        if (!grown) return pl_errf(r->err, r->errlen, "%s: out of memory", r->path);
        r->ev = grown;
    }
    r->ev[r->n++] = *ev;
    return 0;
}

/* One non-empty line (p, len characters without its line end). */
static int read_trace_row(trace_reader *r, const char *p, size_t len)
{
    char row[128];
    if (len >= sizeof row)
        return pl_errf(r->err, r->errlen, "%s:%d: line too long", r->path, r->line);
    memcpy(row, p, len);
    row[len] = '\0';
    pl_trace_event ev;
    if (parse_trace_row(r, row, len, &ev) || check_trace_event(r, &ev)) return -1;
    return append_trace_event(r, &ev);
}

int pl_trace_read(const char *path, pl_trace_event **out, int *n, char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    char *text = pl_read_file(path, err, errlen);
    if (!text) return -1;
    trace_reader r = {.path = path,
                      .alive = calloc(MAX_TRACE_NODE + 1, 1),
                      .seen = calloc(MAX_TRACE_NODE + 1, 1),
                      .err = err,
                      .errlen = errlen};
    int rc = 0;
    if (!r.alive || !r.seen) rc = pl_errf(err, errlen, "%s: out of memory", path);
    for (char *p = text, *next; rc == 0 && *p; p = next) {
        size_t len = trace_line(p, &next);
        r.line++;
        if (len) rc = read_trace_row(&r, p, len);
    }
    free(r.alive);
    free(r.seen);
    free(text);
    if (rc) {
        free(r.ev);
        return rc;
    }
    *out = r.ev;
    *n = r.n;
    return 0;
}

/* FILE[:SPEEDUP] → path (pathsize bytes) and *speedup, 1 without one; a suffix that is not
 * a speedup belongs to the file name. */
static int parse_trace_arg(const char *arg, size_t len, char *path, size_t pathsize,
                           double *speedup, char *err, size_t errlen)
{
    const char *colon = memrchr(arg, ':', len);
    size_t plen = len;
    *speedup = 1;
    if (colon) {
        char num[32];
        size_t nl = len - (size_t)(colon + 1 - arg);
        char *stop;
        if (nl > 0 && nl < sizeof num) {
            memcpy(num, colon + 1, nl);
            num[nl] = '\0';
            double v = strtod(num, &stop);
            if (!*stop && v > 0 && v <= 1e9) {
                *speedup = v;
                plen = (size_t)(colon - arg);
            }
        }
    }
    if (plen == 0 || plen >= pathsize) return pl_errf(err, errlen, "trace: bad file name");
    memcpy(path, arg, plen);
    path[plen] = '\0';
    return 0;
}

/* The n rows of trace `path` as time events from its first timestamp, divided by speedup;
 * worker numbers follow the order the nodes are added in. */
static int add_trace_events(pl_chaos *c, const pl_trace_event *tr, int n, double speedup,
                            const char *path, char *err, size_t errlen)
{
    int *worker_of = malloc((MAX_TRACE_NODE + 1) * sizeof *worker_of);
    int next_worker = 0, rc = worker_of ? 0 : pl_errf(err, errlen, "trace: out of memory");
    int64_t t0 = n ? tr[0].t_ms : 0; /* the replay starts at the trace's first event */
    for (int i = 0; rc == 0 && i < n; i++) {
        if (tr[i].node < 0 || tr[i].node > MAX_TRACE_NODE) {
            rc = pl_errf(err, errlen, "trace %s: more than %d nodes", path, MAX_TRACE_NODE);
            break;
        }
        pl_chaos_event e = {.when = PL_CHAOS_AT_TIME,
                            .t_ms = (int64_t)((double)(tr[i].t_ms - t0) / speedup)};
        if (tr[i].add) {
            worker_of[tr[i].node] = next_worker++;
            if (tr[i].t_ms == t0) { /* there at the start: one of the job's initial workers */
                c->initial_workers++;
                continue;
            }
            e.action = PL_CHAOS_ADD;
            e.count = 1;
        } else {
            e.action = PL_CHAOS_KILL;
            e.worker = worker_of[tr[i].node];
        }
        if (push(c, &e)) rc = pl_errf(err, errlen, "trace: out of memory");
    }
    free(worker_of);
    return rc;
}

/* trace:FILE[:SPEEDUP] → time events; worker numbers follow the trace's node order. */
static int add_trace(pl_chaos *c, const char *arg, size_t len, char *err, size_t errlen)
{
    char path[4096];
    double speedup;
    if (parse_trace_arg(arg, len, path, sizeof path, &speedup, err, errlen)) return -1;
    pl_trace_event *tr;
    int n;
    if (pl_spot_trace_load(path, &tr, &n, err, errlen)) return -1;
    int rc = add_trace_events(c, tr, n, speedup, path, err, errlen);
    free(tr);
    return rc;
}

/* One "action:N@step=S" or "action:N@t=SECONDS" event. */
/* pQ.J of kill:pQ.J (p..at): the event by place instead of by number. 0, or -1. */
static int parse_place(const char *p, const char *at, pl_chaos_event *e)
{
    const char *dot = memchr(p, '.', (size_t)(at - p));
    int64_t q, j;
    if (!dot || parse_i64(p, dot, 0, 1000, &q) || parse_i64(dot + 1, at, 0, 1000, &j)) return -1;
    e->worker = -1;
    e->pipe = (int)q;
    e->stage = (int)j;
    return 0;
}

static int add_event(pl_chaos *c, const char *s, size_t len, char *err, size_t errlen)
{
    const char *end = s + len, *colon = memchr(s, ':', len), *at = memchr(s, '@', len);
    if (!colon) return pl_errf(err, errlen, "expected ACTION:ARG");
    size_t alen = (size_t)(colon - s);
    if (alen == 5 && !memcmp(s, "trace", 5)) return add_trace(c, colon + 1, (size_t)(end - colon - 1), err, errlen);
    pl_chaos_event e = {0};
    if (alen == 4 && !memcmp(s, "kill", 4))
        e.action = PL_CHAOS_KILL;
    else if (alen == 4 && !memcmp(s, "term", 4))
        e.action = PL_CHAOS_TERM;
    else if (alen == 3 && !memcmp(s, "add", 3))
        e.action = PL_CHAOS_ADD;
    else
        return pl_errf(err, errlen, "unknown action (expected kill, term, add or trace)");
    if (!at || at < colon)
        return pl_errf(err, errlen, "expected @step=S, @t=SECONDS, @waiting or @checkpoint=S");
    int64_t v = 0;
    if (e.action != PL_CHAOS_ADD && colon[1] == 'p') {
        if (parse_place(colon + 2, at, &e))
            return pl_errf(err, errlen, "worker must be a number or pQ.J (pipeline Q, stage J)");
    } else if (parse_i64(colon + 1, at, e.action == PL_CHAOS_ADD ? 1 : 0, 100000, &v)) {
        return pl_errf(err, errlen, "%s must be a number",
                       e.action == PL_CHAOS_ADD ? "the count of workers to add" : "worker");
    } else if (e.action == PL_CHAOS_ADD) {
        e.count = (int)v;
    } else {
        e.worker = (int)v;
    }
    if ((size_t)(end - at) >= 6 && !memcmp(at, "@step=", 6)) {
        e.when = PL_CHAOS_AT_STEP;
        if (parse_i64(at + 6, end, 0, INT64_MAX / 2, &e.step))
            return pl_errf(err, errlen, "step must be a non-negative integer");
    } else if ((size_t)(end - at) >= 3 && !memcmp(at, "@t=", 3)) {
        e.when = PL_CHAOS_AT_TIME;
        if (parse_seconds_ms(at + 3, end, &e.t_ms))
            return pl_errf(err, errlen, "t must be a non-negative number of seconds");
    } else if ((size_t)(end - at) == 8 && !memcmp(at, "@waiting", 8)) {
        e.when = PL_CHAOS_WHEN_WAITING;
    } else if ((size_t)(end - at) >= 12 && !memcmp(at, "@checkpoint=", 12)) {
        e.when = PL_CHAOS_AT_CHECKPOINT;
        if (parse_i64(at + 12, end, 1, INT64_MAX / 2, &e.step))
            return pl_errf(err, errlen, "checkpoint must be a step ≥ 1");
    } else {
        return pl_errf(err, errlen, "expected @step=S, @t=SECONDS, @waiting or @checkpoint=S");
    }
    return push(c, &e) ? pl_errf(err, errlen, "out of memory") : 0;
}

static int cmp_event(const void *a, const void *b)
{
    const pl_chaos_event *x = a, *y = b;
    if (x->when != y->when) return (x->when > y->when) - (x->when < y->when);
    int64_t kx = x->when == PL_CHAOS_AT_TIME ? x->t_ms : 0, ky = y->when == PL_CHAOS_AT_TIME ? y->t_ms : 0;
    return (kx > ky) - (kx < ky);
}

int pl_chaos_parse(const char *spec, pl_chaos *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int index = 0;
    for (const char *p = spec; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char msg[512];
        index++;
        if (len == 0 || add_event(out, p, len, msg, sizeof msg)) {
            pl_errf(err, errlen, "--chaos event %d (%.*s): %s", index, (int)(len > 80 ? 80 : len), p,
                    len ? msg : "empty");
            pl_chaos_free(out);
            return -1;
        }
        p = comma ? comma + 1 : NULL;
    }
    /* stable: step events keep their order, time events sort by time */
    for (int i = 1; i < out->n; i++)
        for (int j = i; j > 0 && cmp_event(&out->events[j - 1], &out->events[j]) > 0; j--) {
            pl_chaos_event t = out->events[j];
            out->events[j] = out->events[j - 1];
            out->events[j - 1] = t;
        }
    return 0;
}

void pl_chaos_free(pl_chaos *c)
{
    free(c->events);
    memset(c, 0, sizeof *c);
}
