/* Spot traces of both formats, and their scaling (spot_trace.h). */
#include "spot_trace.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct {
    pl_trace_event *ev;
    int n, cap;
} evlist;

static int ev_push(evlist *l, int64_t t_ms, int add, int node)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        pl_trace_event *x = realloc(l->ev, (size_t)cap * sizeof *x);
        if (!x) return -1;
        l->ev = x;
        l->cap = cap;
    }
    l->ev[l->n++] = (pl_trace_event){.t_ms = t_ms, .add = add, .node = node};
    return 0;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const int64_t yoe = y - era * 400;
    const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* One row "YYYY-MM-DD, HH:MM:SS, COUNT": 0 with the time (ms) and count; -1 malformed. */
static int parse_count_row(const char *line, int64_t *t_ms, int *count)
{
    int y, mo, d, h, mi, s, c, used = 0;
    if (sscanf(line, " %4d-%2d-%2d , %2d:%2d:%2d , %d %n", &y, &mo, &d, &h, &mi, &s, &c, &used) != 7)
        return -1;
    if (line[used] && line[used] != '\r' && line[used] != '\n') return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60 || c < 0 || c > 1000000)
        return -1;
    *t_ms = ((days_from_civil(y, mo, d) * 24 + h) * 60 + mi) * 60000LL + s * 1000LL;
    *count = c;
    return 0;
}

/* Applies one sample: new nodes for a rise, removals of the newest live ones for a drop. */
static int apply_count(evlist *l, int **live, int *nlive, int *caplive, int *next_node,
                       int64_t t, int count)
{
    while (*nlive > count) {
        if (ev_push(l, t, 0, (*live)[--*nlive])) return -1;
    }
    while (*nlive < count) {
        if (*nlive == *caplive) {
            int cap = *caplive ? 2 * *caplive : 64;
            int *x = realloc(*live, (size_t)cap * sizeof *x);
            if (!x) return -1;
            *live = x;
            *caplive = cap;
        }
        (*live)[(*nlive)++] = *next_node;
        if (ev_push(l, t, 1, (*next_node)++)) return -1;
    }
    return 0;
}

int pl_spot_trace_parse_counts(const char *text, const char *name, pl_trace_event **out, int *n,
                               char *err, size_t errlen)
{
    evlist l = {0};
    int *live = NULL, nlive = 0, caplive = 0, next_node = 0, lineno = 0, rows = 0, rc = 0;
    int64_t t0 = 0, prev = 0;
    for (const char *p = text; rc == 0 && p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char line[256];
        lineno++;
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
        p = nl ? nl + 1 : NULL;
        if (strspn(line, " \t\r") == strlen(line)) continue; /* blank */
        int64_t t;
        int count;
        if (len >= sizeof line || parse_count_row(line, &t, &count)) {
            rc = pl_errf(err, errlen, "%s:%d: expected `YYYY-MM-DD, HH:MM:SS, COUNT`", name, lineno);
            break;
        }
        if (rows++ == 0) t0 = prev = t;
        if (t < prev) rc = pl_errf(err, errlen, "%s:%d: time goes backwards", name, lineno);
        if (rc == 0 && apply_count(&l, &live, &nlive, &caplive, &next_node, t - t0, count))
            rc = pl_errf(err, errlen, "%s: out of memory", name);
        prev = t;
    }
    free(live);
    if (rc == 0 && l.n == 0) rc = pl_errf(err, errlen, "%s: no nodes in the trace", name);
    if (rc) {
        free(l.ev);
        return -1;
    }
    *out = l.ev;
    *n = l.n;
    return 0;
}

/* The first non-blank line starts with a date: the count format. */
static int is_count_format(const char *text)
{
    const char *p = text + strspn(text, " \t\r\n");
    int y, mo, d;
    return sscanf(p, "%4d-%2d-%2d", &y, &mo, &d) == 3;
}

int pl_spot_trace_load(const char *path, pl_trace_event **out, int *n, char *err, size_t errlen)
{
    char *text = pl_read_file(path, err, errlen);
    if (!text) return -1;
    int counts = is_count_format(text);
    int rc = counts ? pl_spot_trace_parse_counts(text, path, out, n, err, errlen) : 0;
    free(text);
    if (counts || rc) return rc;
    if (pl_trace_read(path, out, n, err, errlen)) return -1;
    for (int i = 1; i < *n; i++) (*out)[i].t_ms -= (*out)[0].t_ms;
    if (*n) (*out)[0].t_ms = 0;
    return 0;
}

/* The highest node number of a trace (0 when empty). */
static int max_node(const pl_trace_event *in, int n)
{
    int m = 0;
    for (int i = 0; i < n; i++)
        if (in[i].node > m) m = in[i].node;
    return m;
}

int pl_spot_trace_scale(const pl_trace_event *in, int n, int k, pl_trace_event **out, int *nout,
                        char *err, size_t errlen)
{
    if (k < 1) return pl_errf(err, errlen, "--scale: must be at least 1 (got %d)", k);
    const int maxnode = max_node(in, n);
    if ((int64_t)n * k > INT32_MAX / 2 || (int64_t)(maxnode + 1) * k > INT32_MAX / 2)
        return pl_errf(err, errlen, "--scale: %d makes the trace too large", k);
    pl_trace_event *o = malloc(((size_t)n * (size_t)k + 1) * sizeof *o);
    if (!o) return pl_errf(err, errlen, "--scale: out of memory");
    for (int i = 0; i < n; i++)
        for (int j = 0; j < k; j++)
            o[(size_t)i * (size_t)k + (size_t)j] =
                (pl_trace_event){.t_ms = in[i].t_ms, .add = in[i].add, .node = in[i].node * k + j};
    *out = o;
    *nout = n * k;
    return 0;
}

/* The market: live nodes of the trace not held, oldest first, taken from the front
 * (entries whose node has since gone are passed over). state per node: 0 not live, 1 in the
 * market, 2 held. */
typedef struct {
    int *node;
    int head, tail;
} market;

static int market_take(market *m, const char *state)
{
    while (m->head < m->tail && state[m->node[m->head]] != 1) m->head++;
    return m->head < m->tail ? m->node[m->head++] : -1;
}

int pl_spot_trace_cap(const pl_trace_event *in, int n, int nodes, pl_trace_event **out, int *nout,
                      char *err, size_t errlen)
{
    if (nodes < 1) return pl_errf(err, errlen, "nodes: must be at least 1 (got %d)", nodes);
    const int maxnode = max_node(in, n);
    char *state = calloc((size_t)maxnode + 1, 1);
    market m = {.node = malloc(((size_t)n + 1) * sizeof(int))};
    pl_trace_event *o = malloc(((size_t)n + 1) * sizeof *o);
    int held = 0, k = 0;
    if (!state || !m.node) {
        free(o);
        o = NULL;
    }
    for (int i = 0; o && i < n; i++) {
        const pl_trace_event *e = &in[i];
        if (e->add && held < nodes) {
            state[e->node] = 2;
            held++;
            o[k++] = *e;
        } else if (e->add) {
            state[e->node] = 1;
            m.node[m.tail++] = e->node;
        } else if (state[e->node] == 2) {
            state[e->node] = 0;
            o[k++] = *e;
            const int t = market_take(&m, state);
            if (t >= 0) { /* its replacement, bought from the market at once */
                state[t] = 2;
                o[k++] = (pl_trace_event){.t_ms = e->t_ms, .add = 1, .node = t};
            } else {
                held--;
            }
        } else {
            state[e->node] = 0;
        }
    }
    free(state);
    free(m.node);
    if (!o) return pl_errf(err, errlen, "nodes: out of memory");
    *out = o;
    *nout = k;
    return 0;
}

int pl_spot_trace_zone(int node, int zones) { return zones > 0 ? node % zones : 0; }

/* A uniform draw in [0, 1) for instant k (splitmix64 of k). */
static double instant_draw(uint64_t k)
{
    uint64_t z = k * 0x9E3779B97F4A7C15ULL + 0x5A17ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

int pl_spot_trace_zones(const pl_trace_event *in, int n, int zones, double loss,
                        pl_trace_event **out, int *nout, char *err, size_t errlen)
{
    if (zones < 1) return pl_errf(err, errlen, "--zones: must be at least 1 (got %d)", zones);
    if (!(loss >= 0 && loss <= 1))
        return pl_errf(err, errlen, "--zone-loss: must be in [0, 1] (got %g)", loss);
    const int maxnode = max_node(in, n);
    char *live = calloc((size_t)maxnode + 1, 1);
    pl_trace_event *o = malloc((2 * (size_t)n + 1) * sizeof *o); /* a node goes once */
    if (!live || !o) {
        free(live);
        free(o);
        return pl_errf(err, errlen, "--zones: out of memory");
    }
    int k = 0;
    uint64_t instant = 0;
    for (int i = 0; i < n; i++) {
        const pl_trace_event *e = &in[i];
        if (e->add) {
            live[e->node] = 1;
            o[k++] = *e;
            continue;
        }
        const int first = i == 0 || in[i - 1].add || in[i - 1].t_ms != e->t_ms;
        if (first && instant_draw(instant++) < loss) { /* the whole zone goes now */
            const int z = pl_spot_trace_zone(e->node, zones);
            for (int m = 0; m <= maxnode; m++)
                if (live[m] && pl_spot_trace_zone(m, zones) == z) {
                    live[m] = 0;
                    o[k++] = (pl_trace_event){.t_ms = e->t_ms, .add = 0, .node = m};
                }
        }
        if (live[e->node]) {
            live[e->node] = 0;
            o[k++] = *e;
        }
    }
    free(live);
    *out = o;
    *nout = k;
    return 0;
}
