/* The operator's log: one line per message on stderr, "pliant-operator: LEVEL: text",
 * filtered by the level --log-level (the chart's logLevel) sets. Levels, most severe
 * first: error, warn, info (the default), debug; a message is written when its level
 * is at or above the one set. Every message of operator/k8s goes through here.
 * Thread-safe (the level is atomic; a line is written with one stdio call). */
#ifndef PLIANT_OPLOG_H
#define PLIANT_OPLOG_H

typedef enum { PL_LOG_ERROR, PL_LOG_WARN, PL_LOG_INFO, PL_LOG_DEBUG } pl_log_level;

/* The level named error, warn, info or debug into *out: 0, or −1 for another name. */
int pl_log_parse_level(const char *name, pl_log_level *out);
void pl_log_set_level(pl_log_level level);
pl_log_level pl_log_get_level(void);
/* 1 when a message of this level is written now. */
int pl_log_enabled(pl_log_level level);
void pl_log(pl_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
