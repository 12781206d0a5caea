/* The populating helper of a receiver (worker/engine/populate_ahead.h) over a CPU block:
 * it makes the receiver's ranges present (mapped: /proc/self/pagemap) ahead of the
 * receiver, what the receiver writes beside it is kept, a receiver that stops early stops
 * the helper, and a helper never started stops at once. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "populate_ahead.h"

enum { NR = 24 };

typedef struct {
    unsigned char *p;
    size_t at[NR + 1]; /* range i: [at[i], at[i + 1]) */
} ranges;

static void range_of(void *ctx, int i, void **p, size_t *bytes)
{
    const ranges *r = ctx;
    *p = r->p + r->at[i];
    *bytes = r->at[i + 1] - r->at[i];
}

/* A CPU context, a 24 MiB block and ranges of uneven sizes (21 MB in all), most not on
 * page boundaries, over it. */
typedef struct {
    kn_ctx *k;
    ranges r;
} fixture;

static int fixture_open(fixture *f)
{
    char err[128];
    *f = (fixture){.k = kn_create("cpu", 1, err, sizeof err)};
    if (!f->k || !(f->r.p = kn_alloc(f->k, (size_t)24 << 20))) return -1;
    for (int i = 0; i < NR; i++) f->r.at[i + 1] = f->r.at[i] + ((size_t)(i % 5) + 1) * 300001;
    return 0;
}

static void fixture_close(fixture *f)
{
    kn_free(f->k, f->r.p);
    kn_destroy(f->k);
}

static long absent_pages(const void *p, size_t bytes)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t)p / pg, hi = ((uintptr_t)p + bytes + pg - 1) / pg;
    const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    long absent = fd < 0 ? -1 : 0;
    for (uintptr_t v = lo; v < hi && absent >= 0; v++) {
        uint64_t e = 0;
        if (pread(fd, &e, sizeof e, (off_t)(v * sizeof e)) != (ssize_t)sizeof e)
            absent = -1;
        else
            absent += !(e >> 63);
    }
    if (fd >= 0) close(fd);
    return absent;
}

/* Writes range i's id into each range the helper's way (reach, then write), checks them
 * after the helper stopped: also present, where the backend populates. */
static void write_ranges(pl_ahead *a, kn_ctx *k, ranges *r)
{
    for (int i = 0; i < NR; i++) {
        pl_ahead_reach(a, i);
        memset(r->p + r->at[i], i + 1, r->at[i + 1] - r->at[i]);
    }
    pl_ahead_stop(a);
    if (kn_populate(k, r->p, 1) == 0) CHECK_EQ_INT(absent_pages(r->p, r->at[NR]), 0);
    for (int i = 0; i < NR; i++)
        for (size_t x = r->at[i]; x < r->at[i + 1]; x++) CHECK_EQ_INT(r->p[x], i + 1);
}

/* Waits up to 10 s for the helper to make every range present, where the backend can. */
static void test_helper_populates_ahead(void)
{
    fixture f;
    CHECK(fixture_open(&f) == 0);
    const int can = kn_populate(f.k, f.r.p, 1) == 0;
    pl_ahead a;
    pl_ahead_start(&a, f.k, NR, range_of, &f.r);
    long absent = -1;
    for (int t = 0; can && t < 1000 && absent; t++) {
        absent = absent_pages(f.r.p, f.r.at[NR]);
        usleep(10000);
    }
    if (can) CHECK_EQ_INT(absent, 0);
    write_ranges(&a, f.k, &f.r);
    fixture_close(&f);
}

static void test_writes_beside_the_helper_are_kept(void)
{
    fixture f;
    CHECK(fixture_open(&f) == 0);
    pl_ahead a;
    pl_ahead_start(&a, f.k, NR, range_of, &f.r);
    write_ranges(&a, f.k, &f.r);
    fixture_close(&f);
}

static void test_receiver_stopping_early_stops_the_helper(void)
{
    fixture f;
    CHECK(fixture_open(&f) == 0);
    pl_ahead a, never = {0};
    pl_ahead_start(&a, f.k, NR, range_of, &f.r);
    pl_ahead_reach(&a, 0);
    f.r.p[0] = 7;
    pl_ahead_stop(&a);
    CHECK(!a.running);
    CHECK_EQ_INT(atomic_load(&a.reached), NR + 1);
    pl_ahead_stop(&never);
    CHECK_EQ_INT(f.r.p[0], 7);
    fixture_close(&f);
}

TEST_MAIN_BEGIN
RUN(test_helper_populates_ahead);
RUN(test_writes_beside_the_helper_are_kept);
RUN(test_receiver_stopping_early_stops_the_helper);
TEST_MAIN_END
