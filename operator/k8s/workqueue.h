/* A rate-limited work queue, as controller-runtime's: keys ("namespace/name")
 * wait in FIFO order, each at most once; a key being processed is never handed
 * to a second worker, and one added meanwhile is queued again when the first
 * worker calls done. Keys may be delayed (add_after) or backed off per key
 * after failures (add_rate_limited: 5 ms · 2^failures, at most 60 s, up to 10%
 * jitter) until forget resets them.
 *
 * Thread-safe. Times are CLOCK_MONOTONIC; waiting workers sleep on a condition
 * variable until a key is due, their timeout, or shutdown. */
#ifndef PLIANT_WORKQUEUE_H
#define PLIANT_WORKQUEUE_H

#include <stddef.h>
#include <stdint.h>

/* Room for any Kubernetes key (namespace 63 + '/' + name 253) and a NUL;
 * longer keys are ignored by the add functions. */
#define PL_WORKQUEUE_KEY_MAX 320

#define PL_WORKQUEUE_BACKOFF_BASE_MS 5
#define PL_WORKQUEUE_BACKOFF_MAX_MS 60000

typedef struct pl_workqueue pl_workqueue;

/* NULL when out of memory. */
pl_workqueue *pl_workqueue_new(void);
/* Frees q; no thread may be using it any more. */
void pl_workqueue_free(pl_workqueue *q);

/* Queues key unless it is queued already; a key being processed is queued
 * again after done. Ignored after shutdown. */
void pl_workqueue_add(pl_workqueue *q, const char *key);
/* Adds key once delay_ms have passed (at once when ≤ 0); of several pending
 * delays of one key the earliest wins. */
void pl_workqueue_add_after(pl_workqueue *q, const char *key, int64_t delay_ms);
/* Adds key after its back-off, then counts one more failure for it. */
void pl_workqueue_add_rate_limited(pl_workqueue *q, const char *key);
/* Resets key's failures (call it when a reconcile succeeded). */
void pl_workqueue_forget(pl_workqueue *q, const char *key);
/* How many failures key has had since it was last forgotten. */
int pl_workqueue_failures(pl_workqueue *q, const char *key);

/* Waits up to timeout_ms (< 0: no limit) for a key and copies it into key
 * (keylen ≥ PL_WORKQUEUE_KEY_MAX). 1: a key, now processing until done;
 * 0: timeout; −1: the queue was shut down (keys still queued are dropped). */
int pl_workqueue_get(pl_workqueue *q, char *key, size_t keylen, int timeout_ms);
/* Ends the processing of a key returned by get. */
void pl_workqueue_done(pl_workqueue *q, const char *key);

/* Wakes every waiting get (they return −1) and ignores later adds. */
void pl_workqueue_shutdown(pl_workqueue *q);
/* Keys queued now (not those delayed or processing). */
int pl_workqueue_len(pl_workqueue *q);

/* The back-off after `failures` failures: 5 ms · 2^failures plus
 * jitter·10% (jitter in [0, 1)), at most 60 s. */
int64_t pl_workqueue_backoff_ms(int failures, double jitter);

#endif
