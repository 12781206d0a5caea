/* The controller's rate-limited work queue of object keys, as controller-runtime's
 * (workqueue.h). */
#include "workqueue.h"

#include "oplog.h"
#include "util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NO_DUE (-1)

/* One key the queue knows: queued, processing, delayed or with failures. A
 * controller has tens to hundreds of keys, so a list is enough. */
typedef struct item {
    char *key;
    int queued;     /* in the FIFO */
    int processing; /* handed out by get, done not yet called */
    int dirty;      /* added while processing: queue again at done */
    int failures;
    int64_t due_ms; /* pending add_after, or NO_DUE */
    struct item *next;
} item;

struct pl_workqueue {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* on CLOCK_MONOTONIC */
    item *items;
    item **fifo; /* ring buffer of queued items */
    size_t head, count, cap;
    int shutdown;
    struct drand48_data rng;
};

pl_workqueue *pl_workqueue_new(void)
{
    pl_workqueue *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    pthread_condattr_t attr;
    int ok = pthread_condattr_init(&attr) == 0;
    ok = ok && pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 &&
         pthread_cond_init(&q->cond, &attr) == 0;
    pthread_condattr_destroy(&attr);
    if (!ok || pthread_mutex_init(&q->lock, NULL) != 0) {
        if (ok) pthread_cond_destroy(&q->cond);
        free(q);
        return NULL;
    }
    srand48_r((long)pl_now_ms() ^ (long)(uintptr_t)q, &q->rng);
    return q;
}

void pl_workqueue_free(pl_workqueue *q)
{
    if (!q) return;
    while (q->items) {
        item *next = q->items->next;
        free(q->items->key);
        free(q->items);
        q->items = next;
    }
    free(q->fifo);
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->lock);
    free(q);
}

/* ---- items (under the lock) ---- */

static item *find(pl_workqueue *q, const char *key)
{
    item *it = q->items;
    while (it && strcmp(it->key, key) != 0) it = it->next;
    return it;
}

static item *find_or_new(pl_workqueue *q, const char *key)
{
    item *it = find(q, key);
    if (it) return it;
    if (strlen(key) >= PL_WORKQUEUE_KEY_MAX) {
        pl_log(PL_LOG_ERROR, "workqueue: key too long, ignored: %.64s...", key);
        return NULL;
    }
    it = calloc(1, sizeof *it);
    if (!it || !(it->key = strdup(key))) {
        free(it);
        pl_log(PL_LOG_ERROR, "workqueue: out of memory, %s dropped", key);
        return NULL;
    }
    it->due_ms = NO_DUE;
    it->next = q->items;
    q->items = it;
    return it;
}

/* Forgets an item that nothing refers to any more. */
static void drop_if_idle(pl_workqueue *q, item *it)
{
    if (it->queued || it->processing || it->due_ms != NO_DUE || it->failures) return;
    item **p = &q->items;
    while (*p != it) p = &(*p)->next;
    *p = it->next;
    free(it->key);
    free(it);
}

static void enqueue(pl_workqueue *q, item *it)
{
    if (it->queued) return;
    if (it->processing) {
        it->dirty = 1;
        return;
    }
    if (q->count == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 16;
        item **f = malloc(cap * sizeof *f);
        if (!f) {
            pl_log(PL_LOG_ERROR, "workqueue: out of memory, %s dropped", it->key);
            drop_if_idle(q, it);
            return;
        }
        for (size_t i = 0; i < q->count; i++) f[i] = q->fifo[(q->head + i) % q->cap];
        free(q->fifo);
        q->fifo = f;
        q->cap = cap;
        q->head = 0;
    }
    q->fifo[(q->head + q->count++) % q->cap] = it;
    it->queued = 1;
    pthread_cond_signal(&q->cond);
}

/* Queues the items whose delay is over; the earliest delay still pending. */
static int64_t promote_due(pl_workqueue *q, int64_t now)
{
    int64_t next = INT64_MAX;
    for (item *it = q->items; it; it = it->next) {
        if (it->due_ms == NO_DUE) continue;
        if (it->due_ms <= now) {
            it->due_ms = NO_DUE;
            enqueue(q, it);
        } else if (it->due_ms < next) {
            next = it->due_ms;
        }
    }
    return next;
}

/* ---- the API ---- */

void pl_workqueue_add(pl_workqueue *q, const char *key)
{
    pthread_mutex_lock(&q->lock);
    item *it = q->shutdown ? NULL : find_or_new(q, key);
    if (it) enqueue(q, it);
    pthread_mutex_unlock(&q->lock);
}

static void add_after_locked(pl_workqueue *q, item *it, int64_t delay_ms)
{
    if (delay_ms <= 0) {
        enqueue(q, it);
        return;
    }
    int64_t due = pl_now_ms() + delay_ms;
    if (it->due_ms == NO_DUE || due < it->due_ms) it->due_ms = due;
    pthread_cond_broadcast(&q->cond); /* waiters may need an earlier wake-up */
}

void pl_workqueue_add_after(pl_workqueue *q, const char *key, int64_t delay_ms)
{
    pthread_mutex_lock(&q->lock);
    item *it = q->shutdown ? NULL : find_or_new(q, key);
    if (it) add_after_locked(q, it, delay_ms);
    pthread_mutex_unlock(&q->lock);
}

int64_t pl_workqueue_backoff_ms(int failures, double jitter)
{
    int shift = failures < 0 ? 0 : failures > 24 ? 24 : failures; /* 5 ms · 2^24 > 60 s */
    double ms = (double)PL_WORKQUEUE_BACKOFF_BASE_MS * (double)(1ll << shift);
    ms *= 1.0 + 0.1 * jitter;
    return ms > PL_WORKQUEUE_BACKOFF_MAX_MS ? PL_WORKQUEUE_BACKOFF_MAX_MS : (int64_t)ms;
}

void pl_workqueue_add_rate_limited(pl_workqueue *q, const char *key)
{
    pthread_mutex_lock(&q->lock);
    item *it = q->shutdown ? NULL : find_or_new(q, key);
    if (it) {
        double jitter;
        drand48_r(&q->rng, &jitter);
        int64_t delay = pl_workqueue_backoff_ms(it->failures, jitter);
        if (it->failures < 1000000) it->failures++;
        add_after_locked(q, it, delay);
    }
    pthread_mutex_unlock(&q->lock);
}

void pl_workqueue_forget(pl_workqueue *q, const char *key)
{
    pthread_mutex_lock(&q->lock);
    item *it = find(q, key);
    if (it) {
        it->failures = 0;
        drop_if_idle(q, it);
    }
    pthread_mutex_unlock(&q->lock);
}

int pl_workqueue_failures(pl_workqueue *q, const char *key)
{
    pthread_mutex_lock(&q->lock);
    item *it = find(q, key);
    int n = it ? it->failures : 0;
    pthread_mutex_unlock(&q->lock);
    return n;
}

static struct timespec to_timespec(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    return ts;
}

int pl_workqueue_get(pl_workqueue *q, char *key, size_t keylen, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : pl_now_ms() + timeout_ms;
    int rc;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        if (q->shutdown) {
            rc = -1;
            break;
        }
        int64_t now = pl_now_ms();
        int64_t next_due = promote_due(q, now);
        if (q->count) {
            item *it = q->fifo[q->head];
            q->head = (q->head + 1) % q->cap;
            q->count--;
            it->queued = 0;
            it->processing = 1;
            snprintf(key, keylen, "%s", it->key);
            rc = 1;
            break;
        }
        if (now >= deadline) {
            rc = 0;
            break;
        }
        int64_t wake = next_due < deadline ? next_due : deadline;
        if (wake == INT64_MAX) {
            pthread_cond_wait(&q->cond, &q->lock);
        } else {
            struct timespec ts = to_timespec(wake);
            pthread_cond_timedwait(&q->cond, &q->lock, &ts);
        }
    }
    pthread_mutex_unlock(&q->lock);
    return rc;
}

void pl_workqueue_done(pl_workqueue *q, const char *key)
{
    pthread_mutex_lock(&q->lock);
    item *it = find(q, key);
    if (it && it->processing) {
        it->processing = 0;
        if (it->dirty && !q->shutdown) {
            it->dirty = 0;
            enqueue(q, it);
        } else {
            it->dirty = 0;
            drop_if_idle(q, it);
        }
    }
    pthread_mutex_unlock(&q->lock);
}

void pl_workqueue_shutdown(pl_workqueue *q)
{
    pthread_mutex_lock(&q->lock);
    q->shutdown = 1;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
}

int pl_workqueue_len(pl_workqueue *q)
{
    pthread_mutex_lock(&q->lock);
    int n = (int)q->count;
    pthread_mutex_unlock(&q->lock);
    return n;
}
