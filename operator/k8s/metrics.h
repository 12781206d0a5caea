/* A tiny Prometheus registry: counters, gauges and histograms, each series
 * named by a family name and a label string, written out in the text
 * exposition format 0.0.4 for /metrics.
 *
 * Labels are given preformatted, `job="a",phase="Running"` (values escaped
 * by the caller: \\, \" and \n), or NULL for none. A family keeps the type and
 * help of its first use; a call with another type, a negative counter
 * increment or an invalid metric name is ignored. Thread-safe. */
#ifndef PLIANT_METRICS_H
#define PLIANT_METRICS_H

typedef struct pl_metrics pl_metrics;

/* NULL when out of memory. */
pl_metrics *pl_metrics_new(void);
void pl_metrics_free(pl_metrics *m);

void pl_metrics_counter_add(pl_metrics *m, const char *name, const char *help,
                            const char *labels, double v);
void pl_metrics_gauge_set(pl_metrics *m, const char *name, const char *help, const char *labels,
                          double v);
/* Buckets (seconds): 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 5 10 30 60 +Inf. */
void pl_metrics_histogram_observe(pl_metrics *m, const char *name, const char *help,
                                  const char *labels, double v);
/* Sets a counter to a total the caller keeps (a collector's counter); a total below
 * the current value is ignored: a counter never goes down. */
void pl_metrics_counter_set(pl_metrics *m, const char *name, const char *help,
                            const char *labels, double total);
/* Drops every series of name (e.g. jobs by phase, before setting them anew). */
void pl_metrics_clear(pl_metrics *m, const char *name);
/* Drops every series, of every family, whose label string is `labels` or begins with
 * `labels` and a comma (a deleted job's series); a family left empty is not written. */
void pl_metrics_drop_series(pl_metrics *m, const char *labels);

/* The text exposition: per family (sorted by name) # HELP, # TYPE and its
 * series sorted by labels; histograms as _bucket{...,le="..."}, _sum and
 * _count. A heap string, NULL when out of memory. */
char *pl_metrics_text(pl_metrics *m);

#endif
