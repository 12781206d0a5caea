/* The rate-limited work queue: dedupe, FIFO order, re-adds while processing,
 * delays, back-off, forget, shutdown waking waiters, and many workers never
 * processing one key at once. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "workqueue.h"

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_dedupe_and_order(void)
{
    pl_workqueue *q = pl_workqueue_new();
    CHECK(q);
    char key[PL_WORKQUEUE_KEY_MAX];
    pl_workqueue_add(q, "ns/a");
    pl_workqueue_add(q, "ns/b");
    pl_workqueue_add(q, "ns/a");
    CHECK_EQ_INT(pl_workqueue_len(q), 2);
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 0), 1);
    CHECK(strcmp(key, "ns/a") == 0);
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 0), 1);
    CHECK(strcmp(key, "ns/b") == 0);
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 0), 0);
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 20), 0);
    pl_workqueue_done(q, "ns/a");
    pl_workqueue_done(q, "ns/b");
    pl_workqueue_done(q, "ns/unknown"); /* harmless */
    char longkey[PL_WORKQUEUE_KEY_MAX + 8];
    memset(longkey, 'x', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = 0;
    pl_workqueue_add(q, longkey); /* ignored */
    CHECK_EQ_INT(pl_workqueue_len(q), 0);
    pl_workqueue_free(q);
}

static void test_readd_while_processing(void)
{
    pl_workqueue *q = pl_workqueue_new();
    CHECK(q);
    char key[PL_WORKQUEUE_KEY_MAX];
    pl_workqueue_add(q, "ns/a");
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 0), 1);
    pl_workqueue_add(q, "ns/a");
    pl_workqueue_add(q, "ns/a");
    CHECK_EQ_INT(pl_workqueue_len(q), 0); /* not handed to a second worker */
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 10), 0);
    pl_workqueue_done(q, "ns/a");
    CHECK_EQ_INT(pl_workqueue_len(q), 1); /* queued once again */
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 0), 1);
    pl_workqueue_done(q, "ns/a");
    CHECK_EQ_INT(pl_workqueue_len(q), 0);
    pl_workqueue_free(q);
}

static void test_add_after(void)
{
    pl_workqueue *q = pl_workqueue_new();
    CHECK(q);
    char key[PL_WORKQUEUE_KEY_MAX];
    int64_t t0 = mono_ms();
    pl_workqueue_add_after(q, "ns/a", 60);
    pl_workqueue_add_after(q, "ns/b", 5000);
    pl_workqueue_add_after(q, "ns/b", 30); /* the earlier delay wins */
    CHECK_EQ_INT(pl_workqueue_len(q), 0);
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 5), 0);
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 3000), 1);
    CHECK(strcmp(key, "ns/b") == 0);
    CHECK(mono_ms() - t0 >= 30);
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 3000), 1);
    CHECK(strcmp(key, "ns/a") == 0);
    CHECK(mono_ms() - t0 >= 60);
    CHECK(mono_ms() - t0 < 2500);
    pl_workqueue_done(q, "ns/a");
    pl_workqueue_done(q, "ns/b");
    pl_workqueue_add_after(q, "ns/c", 0); /* at once */
    CHECK_EQ_INT(pl_workqueue_len(q), 1);
    pl_workqueue_free(q);
}

static void test_backoff(void)
{
    CHECK_EQ_INT(pl_workqueue_backoff_ms(0, 0), 5);
    CHECK_EQ_INT(pl_workqueue_backoff_ms(1, 0), 10);
    CHECK_EQ_INT(pl_workqueue_backoff_ms(4, 0), 80);
    CHECK_EQ_INT(pl_workqueue_backoff_ms(4, 0.99), 87);
    CHECK_EQ_INT(pl_workqueue_backoff_ms(13, 0), 40960);
    CHECK_EQ_INT(pl_workqueue_backoff_ms(14, 0), 60000);
    CHECK_EQ_INT(pl_workqueue_backoff_ms(1000, 0.5), 60000);
    CHECK_EQ_INT(pl_workqueue_backoff_ms(-3, 0), 5);

    pl_workqueue *q = pl_workqueue_new();
    CHECK(q);
    char key[PL_WORKQUEUE_KEY_MAX];
    for (int i = 0; i < 4; i++) {
        int64_t t0 = mono_ms();
        pl_workqueue_add_rate_limited(q, "ns/a");
        CHECK_EQ_INT(pl_workqueue_failures(q, "ns/a"), i + 1);
        CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 5000), 1);
        CHECK(mono_ms() - t0 >= pl_workqueue_backoff_ms(i, 0));
        pl_workqueue_done(q, "ns/a");
    }
    /* with six failures behind it, a key waits 320 ms at least */
    for (int i = 0; i < 6; i++) pl_workqueue_add_rate_limited(q, "ns/b");
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 5000), 1);
    pl_workqueue_done(q, "ns/b");
    for (int i = 0; i < 4; i++) pl_workqueue_add_rate_limited(q, "ns/b");
    CHECK_EQ_INT(pl_workqueue_failures(q, "ns/b"), 10);
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 50), 0);
    pl_workqueue_forget(q, "ns/a");
    pl_workqueue_forget(q, "ns/b");
    CHECK_EQ_INT(pl_workqueue_failures(q, "ns/a"), 0);
    CHECK_EQ_INT(pl_workqueue_failures(q, "ns/b"), 0);
    pl_workqueue_add(q, "ns/b"); /* an add is not held back by a pending delay */
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 0), 1);
    pl_workqueue_free(q);
}

static void *wait_for_key(void *arg)
{
    char key[PL_WORKQUEUE_KEY_MAX];
    return (void *)(intptr_t)pl_workqueue_get(arg, key, sizeof key, -1);
}

static void test_shutdown_wakes_waiters(void)
{
    pl_workqueue *q = pl_workqueue_new();
    CHECK(q);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, wait_for_key, q) == 0);
    usleep(50 * 1000);
    int64_t t0 = mono_ms();
    pl_workqueue_shutdown(q);
    void *rc[2];
    for (int i = 0; i < 2; i++) pthread_join(t[i], &rc[i]);
    CHECK(mono_ms() - t0 < 1000);
    CHECK_EQ_INT((intptr_t)rc[0], -1);
    CHECK_EQ_INT((intptr_t)rc[1], -1);
    pl_workqueue_add(q, "ns/a"); /* ignored */
    CHECK_EQ_INT(pl_workqueue_len(q), 0);
    char key[PL_WORKQUEUE_KEY_MAX];
    CHECK_EQ_INT(pl_workqueue_get(q, key, sizeof key, 0), -1);
    pl_workqueue_free(q);
}

/* ---- many workers ---- */

#define NKEYS 8
#define NWORKERS 4
#define NADDS 3000

static struct {
    pl_workqueue *q;
    atomic_int busy[NKEYS];    /* workers processing the key now */
    atomic_int overlaps;       /* times two workers had one key */
    atomic_int processed[NKEYS];
    atomic_int added_last[NKEYS]; /* sequence of the key's last add */
    atomic_int seen_last[NKEYS];  /* latest add sequence a worker started after */
    atomic_int seq;
} W;

static void *worker(void *arg)
{
    char key[PL_WORKQUEUE_KEY_MAX];
    while (pl_workqueue_get(W.q, key, sizeof key, -1) == 1) {
        int k = atoi(key + 3);
        if (atomic_fetch_add(&W.busy[k], 1) != 0) atomic_fetch_add(&W.overlaps, 1);
        atomic_store(&W.seen_last[k], atomic_load(&W.seq));
        atomic_fetch_add(&W.processed[k], 1);
        if (k % 2) usleep(100);
        atomic_fetch_sub(&W.busy[k], 1);
        pl_workqueue_done(W.q, key);
    }
    return NULL;
}

static void test_concurrent_workers(void)
{
    memset(&W, 0, sizeof W);
    W.q = pl_workqueue_new();
    CHECK(W.q);
    pthread_t t[NWORKERS];
    for (int i = 0; i < NWORKERS; i++) CHECK(pthread_create(&t[i], NULL, worker, NULL) == 0);
    char key[16];
    for (int i = 0; i < NADDS; i++) {
        int k = rand() % NKEYS;
        snprintf(key, sizeof key, "ns/%d", k);
        atomic_store(&W.added_last[k], atomic_fetch_add(&W.seq, 1) + 1);
        pl_workqueue_add(W.q, key);
        if (i % 100 == 0) usleep(1000);
    }
    /* every key is processed once more after its last add */
    int64_t t0 = mono_ms();
    int pending = 1;
    while (pending && mono_ms() - t0 < 5000) {
        pending = 0;
        for (int k = 0; k < NKEYS; k++)
            pending |= atomic_load(&W.seen_last[k]) < atomic_load(&W.added_last[k]);
        if (pending) usleep(1000);
    }
    pl_workqueue_shutdown(W.q);
    for (int i = 0; i < NWORKERS; i++) pthread_join(t[i], NULL);
    pl_workqueue_free(W.q);
    CHECK(!pending);
    CHECK_EQ_INT(atomic_load(&W.overlaps), 0);
    int total = 0;
    for (int k = 0; k < NKEYS; k++) total += atomic_load(&W.processed[k]);
    CHECK(total <= NADDS);
}

TEST_MAIN_BEGIN
RUN(test_dedupe_and_order);
RUN(test_readd_while_processing);
RUN(test_add_after);
RUN(test_backoff);
RUN(test_shutdown_wakes_waiters);
RUN(test_concurrent_workers);
TEST_MAIN_END
