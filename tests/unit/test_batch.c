/* Independent check of batch distribution (Oobleck §4.2.2): pl_distribute_batch
 * against an enumeration of every distribution nb_j ≥ 1, Σ nb_j = microbatches,
 * and pl_pipeline_capacity against counting. */
#include <stdint.h>
#include <stdlib.h>

#include "batch.h"
#include "check.h"
#include "rng.h"


static int64_t pipe_time(const pl_pipeline_cost *c, int64_t nb)
{
    return c->first_ns + (nb - 1) * c->per_ns;
}

/* Minimum over all compositions of `left` into pipes j..n-1 (each ≥ 1) of the
 * max time, given the max so far. */
static int64_t enumerate(const pl_pipeline_cost *p, int n, int j, int64_t left, int64_t sofar)
{
    if (j == n - 1) {
        int64_t t = pipe_time(&p[j], left);
        return t > sofar ? t : sofar;
    }
    int64_t best = INT64_MAX;
    for (int64_t k = 1; k <= left - (n - 1 - j); k++) {
        int64_t t = pipe_time(&p[j], k);
        int64_t r = enumerate(p, n, j + 1, left - k, t > sofar ? t : sofar);
        if (r < best) best = r;
    }
    return best;
}

static int64_t brute_makespan(const pl_pipeline_cost *p, int n, int64_t mb)
{
    return enumerate(p, n, 0, mb, INT64_MIN);
}

/* Checks the distribution returned by pl_distribute_batch; returns 0 if good. */
static int check_distribution(const pl_pipeline_cost *p, int n, int64_t mb, int64_t want)
{
    int64_t nb[16];
    for (int j = 0; j < 16; j++) nb[j] = -7;
    int64_t got = pl_distribute_batch(p, n, mb, nb);
    int64_t sum = 0, worst = INT64_MIN;
    int bad = got != want;
    for (int j = 0; j < n; j++) {
        if (nb[j] < 1) bad = 1;
        sum += nb[j];
        int64_t t = pipe_time(&p[j], nb[j]);
        if (t > worst) worst = t;
    }
    if (sum != mb || worst != got) bad = 1;
    if (bad) {
        printf("    %d pipelines, %" PRId64 " microbatches: got %" PRId64 ", expected %" PRId64 "\n", n, mb,
               got, want);
        for (int j = 0; j < n; j++)
            printf("      pipe %d: first %" PRId64 " per %" PRId64 " -> nb %" PRId64 "\n", j,
                   p[j].first_ns, p[j].per_ns, nb[j]);
    }
    /* the makespan does not depend on whether nb is requested */
    if (!bad && pl_distribute_batch(p, n, mb, NULL) != got) {
        printf("    nb == NULL gives a different makespan\n");
        bad = 1;
    }
    return bad;
}

static void test_small_exhaustive(void)
{
    rng_state = 31337;
    int failures = 0, cases = 0;
    for (int c = 0; c < 3000 && failures < 5; c++) {
        int n = (int)rng_range(1, 4);
        pl_pipeline_cost p[4];
        int mode = (int)(rng_next() % 3);
        for (int j = 0; j < n; j++) {
            if (mode == 0) { /* tiny values: many ties */
                p[j].first_ns = rng_range(0, 6);
                p[j].per_ns = rng_range(1, 3);
            } else if (mode == 1) { /* template-like: first = ΣW + comm ≥ per = max W */
                p[j].per_ns = rng_range(1, 1000);
                p[j].first_ns = p[j].per_ns + rng_range(0, 4000);
            } else {
                p[j].first_ns = rng_range(0, 100000);
                p[j].per_ns = rng_range(1, 100000);
            }
        }
        for (int64_t mb = n; mb <= 12; mb++) {
            failures += check_distribution(p, n, mb, brute_makespan(p, n, mb));
            cases++;
        }
    }
    printf("    %d cases\n", cases);
    CHECK_EQ_INT(failures, 0);
}

/* Identical pipelines: the split is as even as possible. */
static void test_identical_pipelines(void)
{
    pl_pipeline_cost p[3] = {{100, 10}, {100, 10}, {100, 10}};
    int64_t nb[3];
    CHECK_EQ_INT(pl_distribute_batch(p, 3, 10, nb), 100 + 3 * 10); /* 4,3,3 */
    CHECK_EQ_INT(nb[0] + nb[1] + nb[2], 10);
    for (int j = 0; j < 3; j++) CHECK(nb[j] == 3 || nb[j] == 4);
    CHECK_EQ_INT(pl_distribute_batch(p, 3, 3, nb), 100);
    CHECK(nb[0] == 1 && nb[1] == 1 && nb[2] == 1);
    CHECK_EQ_INT(pl_distribute_batch(p, 1, 7, nb), 160);
    CHECK_EQ_INT(nb[0], 7);
}

/* A fast and a slow pipeline: 2 of them, large counts, brute force over nb_0. */
static void test_two_pipelines_large(void)
{
    rng_state = 5;
    int failures = 0;
    for (int c = 0; c < 40 && failures < 5; c++) {
        pl_pipeline_cost p[2];
        for (int j = 0; j < 2; j++) {
            p[j].per_ns = rng_range(1000000, 100000000000LL); /* up to 100 s */
            p[j].first_ns = p[j].per_ns + rng_range(0, 1000000000000LL);
        }
        int64_t mb = rng_range(2, c < 10 ? 1000000 : 5000);
        int64_t best = INT64_MAX;
        for (int64_t k = 1; k < mb; k++) {
            int64_t a = pipe_time(&p[0], k), b = pipe_time(&p[1], mb - k);
            int64_t t = a > b ? a : b;
            if (t < best) best = t;
        }
        failures += check_distribution(p, 2, mb, best);
    }
    CHECK_EQ_INT(failures, 0);
}

/* Three pipelines, a few hundred microbatches: still enumerable. */
static void test_three_pipelines_medium(void)
{
    rng_state = 8;
    int failures = 0;
    for (int c = 0; c < 30 && failures < 5; c++) {
        pl_pipeline_cost p[3];
        for (int j = 0; j < 3; j++) {
            p[j].per_ns = rng_range(1, 5000);
            p[j].first_ns = rng_range(0, 50000);
        }
        int64_t mb = rng_range(3, 300);
        failures += check_distribution(p, 3, mb, brute_makespan(p, 3, mb));
    }
    CHECK_EQ_INT(failures, 0);
}

static void test_too_few_microbatches(void)
{
    pl_pipeline_cost p[4] = {{10, 1}, {10, 1}, {10, 1}, {10, 1}};
    int64_t nb[4];
    CHECK_EQ_INT(pl_distribute_batch(p, 4, 3, nb), -1);
    CHECK_EQ_INT(pl_distribute_batch(p, 4, 0, nb), -1);
    CHECK_EQ_INT(pl_distribute_batch(p, 2, 1, NULL), -1);
    CHECK_EQ_INT(pl_distribute_batch(p, 4, 4, nb), 10);
}

static void test_capacity(void)
{
    rng_state = 77;
    for (int c = 0; c < 2000; c++) {
        pl_pipeline_cost p;
        p.first_ns = rng_range(0, 200);
        p.per_ns = rng_range(1, 30);
        int64_t t = rng_range(-5, 600);
        int64_t want = 0;
        while (pipe_time(&p, want + 1) <= t) want++;
        int64_t got = pl_pipeline_capacity(&p, t);
        if (got != want)
            printf("    first %" PRId64 " per %" PRId64 " t %" PRId64 ": capacity %" PRId64
                   ", expected %" PRId64 "\n",
                   p.first_ns, p.per_ns, t, got, want);
        CHECK_EQ_INT(got, want);
    }
    pl_pipeline_cost big = {1000000000000LL, 3};
    CHECK_EQ_INT(pl_pipeline_capacity(&big, 999999999999LL), 0);
    CHECK_EQ_INT(pl_pipeline_capacity(&big, 1000000000000LL), 1);
    CHECK_EQ_INT(pl_pipeline_capacity(&big, 1000000000000LL + 3000000000LL), 1000000001);
}

TEST_MAIN_BEGIN
RUN(test_small_exhaustive);
RUN(test_identical_pipelines);
RUN(test_two_pipelines_large);
RUN(test_three_pipelines_medium);
RUN(test_too_few_microbatches);
RUN(test_capacity);
TEST_MAIN_END
