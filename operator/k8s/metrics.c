/* The operator's Prometheus registry and its text exposition for /metrics (metrics.h). */
#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double BUCKETS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                 1,     2.5,  5,     10,   30,  60};
#define NBUCKETS (sizeof BUCKETS / sizeof BUCKETS[0])

typedef enum { COUNTER, GAUGE, HISTOGRAM } kind;
static const char *const KIND_NAMES[] = {"counter", "gauge", "histogram"};

typedef struct series {
    char *labels; /* "" for none */
    double value; /* counter, gauge; histogram: the sum */
    uint64_t count;
    uint64_t buckets[NBUCKETS]; /* observations ≤ BUCKETS[i], cumulative */
    struct series *next;
} series;

typedef struct family {
    char *name, *help;
    kind kind;
    series *series; /* sorted by labels */
    struct family *next;
} family;

struct pl_metrics {
    pthread_mutex_t lock;
    family *families; /* sorted by name */
};

pl_metrics *pl_metrics_new(void)
{
    pl_metrics *m = calloc(1, sizeof *m);
    if (m && pthread_mutex_init(&m->lock, NULL) != 0) {
        free(m);
        return NULL;
    }
    return m;
}

static void free_series(series *s)
{
    while (s) {
        series *next = s->next;
        free(s->labels);
        free(s);
        s = next;
    }
}

void pl_metrics_free(pl_metrics *m)
{
    if (!m) return;
    while (m->families) {
        family *f = m->families;
        m->families = f->next;
        free_series(f->series);
        free(f->name);
        free(f->help);
        free(f);
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static int valid_name(const char *s)
{
    if (!s || !*s || (*s >= '0' && *s <= '9')) return 0;
    for (; *s; s++)
        if (!(*s == '_' || *s == ':' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9')))
            return 0;
    return 1;
}

/* The series (name, labels) of kind k, created when new; NULL when the name
 * is invalid, the family has another kind, or memory ran out (under the lock). */
static series *lookup(pl_metrics *m, const char *name, const char *help, kind k,
                      const char *labels)
{
    if (!valid_name(name)) return NULL;
    if (!labels) labels = "";
    family **fp = &m->families;
    while (*fp && strcmp((*fp)->name, name) < 0) fp = &(*fp)->next;
    if (!*fp || strcmp((*fp)->name, name) != 0) {
        family *f = calloc(1, sizeof *f);
        if (!f || !(f->name = strdup(name)) || !(f->help = strdup(help ? help : ""))) {
            if (f) free(f->name);
            free(f);
            return NULL;
        }
        f->kind = k;
        f->next = *fp;
        *fp = f;
    }
    family *f = *fp;
    if (f->kind != k) return NULL;
    series **sp = &f->series;
    int cmp = 1;
    while (*sp && (cmp = strcmp((*sp)->labels, labels)) < 0) sp = &(*sp)->next;
    if (*sp && cmp == 0) return *sp;
    series *s = calloc(1, sizeof *s);
    if (!s || !(s->labels = strdup(labels))) {
        free(s);
        return NULL;
    }
    s->next = *sp;
    *sp = s;
    return s;
}

void pl_metrics_counter_add(pl_metrics *m, const char *name, const char *help,
                            const char *labels, double v)
{
    if (!(v >= 0)) return; /* counters only go up; NaN too is refused */
    pthread_mutex_lock(&m->lock);
    series *s = lookup(m, name, help, COUNTER, labels);
    if (s) s->value += v;
    pthread_mutex_unlock(&m->lock);
}

void pl_metrics_counter_set(pl_metrics *m, const char *name, const char *help,
                            const char *labels, double total)
{
    if (!(total >= 0)) return;
    pthread_mutex_lock(&m->lock);
    series *s = lookup(m, name, help, COUNTER, labels);
    if (s && total > s->value) s->value = total;
    pthread_mutex_unlock(&m->lock);
}

void pl_metrics_gauge_set(pl_metrics *m, const char *name, const char *help, const char *labels,
                          double v)
{
    pthread_mutex_lock(&m->lock);
    series *s = lookup(m, name, help, GAUGE, labels);
    if (s) s->value = v;
    pthread_mutex_unlock(&m->lock);
}

void pl_metrics_histogram_observe(pl_metrics *m, const char *name, const char *help,
                                  const char *labels, double v)
{
    if (isnan(v)) return;
    pthread_mutex_lock(&m->lock);
    series *s = lookup(m, name, help, HISTOGRAM, labels);
    if (s) {
        s->value += v;
        s->count++;
        for (size_t i = 0; i < NBUCKETS; i++) s->buckets[i] += v <= BUCKETS[i];
    }
    pthread_mutex_unlock(&m->lock);
}

void pl_metrics_clear(pl_metrics *m, const char *name)
{
    pthread_mutex_lock(&m->lock);
    for (family *f = m->families; f; f = f->next) {
        if (strcmp(f->name, name) == 0) {
            free_series(f->series);
            f->series = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&m->lock);
}

void pl_metrics_drop_series(pl_metrics *m, const char *labels)
{
    size_t n = strlen(labels);
    pthread_mutex_lock(&m->lock);
    for (family *f = m->families; f; f = f->next) {
        for (series **sp = &f->series; *sp;) {
            series *s = *sp;
            if (!strncmp(s->labels, labels, n) && (!s->labels[n] || s->labels[n] == ',')) {
                *sp = s->next;
                s->next = NULL;
                free_series(s);
            } else {
                sp = &s->next;
            }
        }
    }
    pthread_mutex_unlock(&m->lock);
}

/* ---- the text format ---- */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} buf;

static void bprintf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void bprintf(buf *b, const char *fmt, ...)
{
    for (;;) {
        if (b->oom) return;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* A value as Prometheus reads it: the shortest %g that round-trips. */
static const char *number(char out[32], double v)
{
    if (isnan(v)) return "NaN";
    if (isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    snprintf(out, 32, "%.15g", v);
    if (strtod(out, NULL) != v) snprintf(out, 32, "%.17g", v);
    return out;
}

/* HELP text escapes backslash and newline. */
static void help_line(buf *b, const family *f)
{
    bprintf(b, "# HELP %s ", f->name);
    for (const char *c = f->help; *c; c++) {
        if (*c == '\\') bprintf(b, "\\\\");
        else if (*c == '\n') bprintf(b, "\\n");
        else bprintf(b, "%c", *c);
    }
    bprintf(b, "\n# TYPE %s %s\n", f->name, KIND_NAMES[f->kind]);
}

/* One sample line: name+suffix{labels[,le="..."]} value. */
static void sample(buf *b, const char *name, const char *suffix, const char *labels,
                   const char *le, double v)
{
    char num[32];
    const char *sep = *labels && le ? "," : "";
    if (!*labels && !le) {
        bprintf(b, "%s%s %s\n", name, suffix, number(num, v));
        return;
    }
    bprintf(b, "%s%s{%s%s", name, suffix, labels, sep);
    if (le) bprintf(b, "le=\"%s\"", le);
    bprintf(b, "} %s\n", number(num, v));
}

char *pl_metrics_text(pl_metrics *m)
{
    buf b = {malloc(4096), 0, 4096, 0};
    if (!b.p) return NULL;
    b.p[0] = 0; /* an empty registry is "" */
    pthread_mutex_lock(&m->lock);
    for (const family *f = m->families; f; f = f->next) {
        if (!f->series) continue;
        help_line(&b, f);
        for (const series *s = f->series; s; s = s->next) {
            if (f->kind != HISTOGRAM) {
                sample(&b, f->name, "", s->labels, NULL, s->value);
                continue;
            }
            char le[32];
            for (size_t i = 0; i < NBUCKETS; i++)
                sample(&b, f->name, "_bucket", s->labels, number(le, BUCKETS[i]),
                       (double)s->buckets[i]);
            sample(&b, f->name, "_bucket", s->labels, "+Inf", (double)s->count);
            sample(&b, f->name, "_sum", s->labels, NULL, s->value);
            sample(&b, f->name, "_count", s->labels, NULL, (double)s->count);
        }
    }
    pthread_mutex_unlock(&m->lock);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
