/* Per-layer gradient sync groups between heterogeneous pipelines
 * (shared/syncgroups.h). */
#include <stdlib.h>

#include "check.h"
#include "rng.h"
#include "syncgroups.h"

static int ranks_are(const pl_sync_group *g, const int *want, int n)
{
    if (!g || g->nranks != n) return 0;
    for (int i = 0; i < n; i++)
        if (g->ranks[i] != want[i]) return 0;
    return 1;
}

static int keys_are(const pl_sync_rank *r, const int *want, int n)
{
    if (!r || r->ngroups != n) return 0;
    for (int i = 0; i < n; i++)
        if (r->keys[i] != want[i]) return 0;
    return 1;
}

/* Blocking collectives: each rank runs its keys in order; a group's collective
 * completes once every member has reached it. Returns 1 if all finish. */
static int collectives_finish(const pl_syncgroups *g)
{
    int *pos = calloc((size_t)g->nranks, sizeof *pos);
    if (!pos) return 0;
    int progress = 1, done = 0;
    while (progress) {
        progress = 0;
        for (int k = 0; k < g->ngroups; k++) {
            const pl_sync_group *grp = &g->groups[k];
            int all = grp->nranks > 0;
            for (int m = 0; m < grp->nranks && all; m++) {
                const pl_sync_rank *r = pl_syncgroups_rank(g, grp->ranks[m]);
                int i = (int)(r - g->ranks);
                all = pos[i] < r->ngroups && r->keys[pos[i]] == grp->key;
            }
            if (!all) continue;
            for (int m = 0; m < grp->nranks; m++) {
                const pl_sync_rank *r = pl_syncgroups_rank(g, grp->ranks[m]);
                pos[r - g->ranks]++;
            }
            progress = 1;
        }
    }
    done = 1;
    for (int i = 0; i < g->nranks; i++)
        if (pos[i] != g->ranks[i].ngroups) done = 0;
    free(pos);
    return done;
}

/* Oobleck Figure 9: six layers (L = 4), a 3-stage pipeline A B C and a 2-stage
 * pipeline D E; E's three layers are synchronised with B and C. */
static void test_figure9(void)
{
    char err[256];
    pl_sync_stage p3[3] = {{0, 2, 0}, {2, 4, 1}, {4, 6, 2}}; /* A, B, C: ranks 0, 1, 2 */
    pl_sync_stage p2[2] = {{0, 3, 3}, {3, 6, 4}};            /* D, E: ranks 3, 4 */
    pl_sync_pipeline pipes[2] = {{3, p3}, {2, p2}};
    pl_syncgroups g;
    CHECK(pl_syncgroups_compute(pipes, 2, 4, &g, err, sizeof err) == 0);
    CHECK_EQ_INT(g.ngroups, 7);
    CHECK_EQ_INT(g.nranks, 5);
    CHECK(ranks_are(pl_syncgroups_group(&g, 0), (int[]){0, 3}, 2));
    CHECK(ranks_are(pl_syncgroups_group(&g, 1), (int[]){0, 3}, 2));
    CHECK(ranks_are(pl_syncgroups_group(&g, 2), (int[]){1, 3}, 2));
    CHECK(ranks_are(pl_syncgroups_group(&g, 3), (int[]){1, 4}, 2));
    CHECK(ranks_are(pl_syncgroups_group(&g, 4), (int[]){2, 4}, 2));
    CHECK(ranks_are(pl_syncgroups_group(&g, 5), (int[]){2, 4}, 2));
    CHECK(ranks_are(pl_syncgroups_group(&g, PL_SYNC_WTE), (int[]){0, 2, 3, 4}, 4));
    CHECK(pl_syncgroups_group(&g, 6) == NULL);
    CHECK(pl_syncgroups_group(&g, -2) == NULL);
    /* E (rank 4) has three layers to synchronise, with C, C and B. */
    CHECK(keys_are(pl_syncgroups_rank(&g, 4), (int[]){5, 4, 3, PL_SYNC_WTE}, 4));
    CHECK(keys_are(pl_syncgroups_rank(&g, 0), (int[]){1, 0, PL_SYNC_WTE}, 3));
    CHECK(keys_are(pl_syncgroups_rank(&g, 1), (int[]){3, 2}, 2));
    CHECK(keys_are(pl_syncgroups_rank(&g, 2), (int[]){5, 4, PL_SYNC_WTE}, 3));
    CHECK(keys_are(pl_syncgroups_rank(&g, 3), (int[]){2, 1, 0, PL_SYNC_WTE}, 4));
    CHECK(pl_syncgroups_rank(&g, 5) == NULL);
    CHECK(pl_syncgroups_rank(&g, -1) == NULL);
    int largest = 0;
    CHECK_EQ_INT(pl_syncgroups_stats(&g, &largest), 5); /* {0,3} {1,3} {1,4} {2,4} {0,2,3,4} */
    CHECK_EQ_INT(largest, 4);
    CHECK_EQ_INT(g.groups[0].set, g.groups[1].set);
    CHECK_EQ_INT(g.groups[4].set, g.groups[5].set);
    CHECK(g.groups[2].set != g.groups[3].set);
    CHECK(collectives_finish(&g));
    /* The checker itself: D running its layers lowest first would deadlock
     * with A (layer 0 waits for A, which waits in layer 1 for D). */
    pl_sync_rank *d = (pl_sync_rank *)pl_syncgroups_rank(&g, 3);
    d->keys[0] = 0;
    d->keys[2] = 2;
    CHECK(!collectives_finish(&g));
    d->keys[0] = 2;
    d->keys[2] = 0;
    char name[32];
    pl_sync_key_name(PL_SYNC_WTE, name, sizeof name);
    CHECK(strcmp(name, "wte") == 0);
    pl_sync_key_name(3, name, sizeof name);
    CHECK(strcmp(name, "layer.3") == 0);
    CHECK_EQ_INT(pl_sync_key_order(4, 5), 0);
    CHECK_EQ_INT(pl_sync_key_order(4, 0), 5);
    CHECK_EQ_INT(pl_sync_key_order(4, PL_SYNC_WTE), 6);
    CHECK_EQ_INT(pl_sync_key_order(4, 6), -1);
    pl_syncgroups_free(&g);
}

/* One pipeline of one stage: every group is that rank alone; it holds one wte. */
static void test_single_stage(void)
{
    char err[256];
    pl_sync_stage st = {0, 14, 7};
    pl_sync_pipeline pipe = {1, &st};
    pl_syncgroups g;
    CHECK(pl_syncgroups_compute(&pipe, 1, 12, &g, err, sizeof err) == 0);
    for (int l = 0; l < 14; l++) CHECK(ranks_are(pl_syncgroups_group(&g, l), (int[]){7}, 1));
    CHECK(ranks_are(pl_syncgroups_group(&g, PL_SYNC_WTE), (int[]){7}, 1));
    const pl_sync_rank *r = pl_syncgroups_rank(&g, 7);
    CHECK(r && r->ngroups == 15);
    CHECK_EQ_INT(r->keys[0], 13);
    CHECK_EQ_INT(r->keys[13], 0);
    CHECK_EQ_INT(r->keys[14], PL_SYNC_WTE);
    int largest;
    CHECK_EQ_INT(pl_syncgroups_stats(&g, &largest), 1);
    CHECK_EQ_INT(largest, 1);
    pl_syncgroups_free(&g);
}

static int contains(const int *a, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (a[i] == x) return 1;
    return 0;
}

/* Random heterogeneous plans from random contiguous cuts, checked against a
 * brute-force reading of the definition. */
static void test_random_plans(void)
{
    char err[256];
    rng_state = 0x5eed5eedull;
    for (int it = 0; it < 500; it++) {
        int L = (int)rng_range(0, 40), nl = L + 2;
        int np = (int)rng_range(1, 6);
        pl_sync_stage stages[6][10];
        pl_sync_pipeline pipes[6];
        int used[60], nused = 0;
        for (int p = 0; p < np; p++) {
            int S = (int)rng_range(1, nl < 10 ? nl : 10);
            /* S − 1 distinct cut points in 1 .. nl−1 */
            int cut[11], nc = 0;
            while (nc < S - 1) {
                int c = (int)rng_range(1, nl - 1);
                if (!contains(cut, nc, c)) cut[nc++] = c;
            }
            for (int a = 0; a < nc; a++) /* insertion sort */
                for (int b = a; b > 0 && cut[b - 1] > cut[b]; b--) {
                    int t = cut[b];
                    cut[b] = cut[b - 1];
                    cut[b - 1] = t;
                }
            for (int s = 0; s < S; s++) {
                int r;
                do r = (int)rng_range(0, 200); while (contains(used, nused, r));
                used[nused++] = r;
                stages[p][s] = (pl_sync_stage){s ? cut[s - 1] : 0, s < S - 1 ? cut[s] : nl, r};
            }
            pipes[p] = (pl_sync_pipeline){S, stages[p]};
        }
        pl_syncgroups g;
        int rc = pl_syncgroups_compute(pipes, np, L, &g, err, sizeof err);
        if (rc) printf("    %s\n", err);
        CHECK(rc == 0);
        CHECK_EQ_INT(g.L, L);
        CHECK_EQ_INT(g.ngroups, nl + 1);
        CHECK_EQ_INT(g.nranks, nused);
        /* Each layer's group: exactly the ranks whose stage covers it, ascending. */
        int largest = 0;
        for (int l = 0; l <= nl; l++) {
            int key = l < nl ? l : PL_SYNC_WTE;
            const pl_sync_group *grp = pl_syncgroups_group(&g, key);
            CHECK(grp && grp->key == key);
            int want[60], nw = 0;
            for (int r = 0; r <= 200; r++) {
                int in = 0;
                for (int p = 0; p < np; p++)
                    for (int s = 0; s < pipes[p].nstages; s++) {
                        const pl_sync_stage *st = &stages[p][s];
                        if (st->rank != r) continue;
                        if (key == PL_SYNC_WTE)
                            in = st->layer_begin == 0 || st->layer_end == nl;
                        else
                            in = st->layer_begin <= l && l < st->layer_end;
                    }
                if (in) want[nw++] = r;
            }
            CHECK(ranks_are(grp, want, nw));
            if (key != PL_SYNC_WTE) CHECK_EQ_INT(grp->nranks, np);
            if (nw > largest) largest = nw;
        }
        /* wte = layer 0's holders ∪ the head's. */
        const pl_sync_group *w = pl_syncgroups_group(&g, PL_SYNC_WTE);
        const pl_sync_group *e = pl_syncgroups_group(&g, 0), *h = pl_syncgroups_group(&g, L + 1);
        for (int i = 0; i < w->nranks; i++)
            CHECK(contains(e->ranks, e->nranks, w->ranks[i]) ||
                  contains(h->ranks, h->nranks, w->ranks[i]));
        for (int i = 0; i < e->nranks; i++) CHECK(contains(w->ranks, w->nranks, e->ranks[i]));
        for (int i = 0; i < h->nranks; i++) CHECK(contains(w->ranks, w->nranks, h->ranks[i]));
        /* Sets: equal ids exactly for equal members; count and largest. */
        int nsets = 0;
        for (int a = 0; a < g.ngroups; a++) {
            int first = 1;
            for (int b = 0; b < g.ngroups; b++) {
                const pl_sync_group *x = &g.groups[a], *y = &g.groups[b];
                int same = x->nranks == y->nranks &&
                           !memcmp(x->ranks, y->ranks, (size_t)x->nranks * sizeof(int));
                CHECK_EQ_INT(x->set == y->set, same);
                if (same && b < a) first = 0;
            }
            nsets += first;
        }
        int lg = -1;
        CHECK_EQ_INT(pl_syncgroups_stats(&g, &lg), nsets);
        CHECK_EQ_INT(lg, largest);
        /* Per rank: ascending ranks; keys = its layers from the highest down,
         * then wte iff it holds the embedding or the head; membership agrees. */
        for (int i = 0; i < g.nranks; i++) {
            const pl_sync_rank *r = &g.ranks[i];
            if (i) CHECK(g.ranks[i - 1].rank < r->rank);
            CHECK(pl_syncgroups_rank(&g, r->rank) == r);
            const pl_sync_stage *st = NULL;
            for (int p = 0; p < np; p++)
                for (int s = 0; s < pipes[p].nstages; s++)
                    if (stages[p][s].rank == r->rank) st = &stages[p][s];
            CHECK(st);
            int want[60], nw = 0;
            for (int l = st->layer_end - 1; l >= st->layer_begin; l--) want[nw++] = l;
            if (st->layer_begin == 0 || st->layer_end == nl) want[nw++] = PL_SYNC_WTE;
            CHECK(keys_are(r, want, nw));
            for (int j = 1; j < r->ngroups; j++)
                CHECK(pl_sync_key_order(L, r->keys[j - 1]) < pl_sync_key_order(L, r->keys[j]));
            for (int l = 0; l <= nl; l++) {
                int key = l < nl ? l : PL_SYNC_WTE;
                const pl_sync_group *grp = pl_syncgroups_group(&g, key);
                CHECK_EQ_INT(contains(grp->ranks, grp->nranks, r->rank),
                             contains(r->keys, r->ngroups, key));
            }
        }
        CHECK(collectives_finish(&g));
        pl_syncgroups_free(&g);
    }
}

static void expect_error(const pl_sync_pipeline *pipes, int np, int L, const char *needle)
{
    char err[256] = "";
    pl_syncgroups g;
    int rc = pl_syncgroups_compute(pipes, np, L, &g, err, sizeof err);
    if (rc != -1) {
        printf("    accepted, expected an error containing \"%s\"\n", needle);
        pl_syncgroups_free(&g);
        check_failed_ = 1;
        return;
    }
    if (!strstr(err, needle)) {
        printf("    \"%s\" does not contain \"%s\"\n", err, needle);
        check_failed_ = 1;
    }
}

static void test_validation(void)
{
    pl_sync_stage ok[2] = {{0, 3, 0}, {3, 6, 1}};
    pl_sync_stage gap[2] = {{0, 2, 0}, {3, 6, 1}};
    pl_sync_stage overlap[2] = {{0, 4, 0}, {3, 6, 1}};
    pl_sync_stage late[2] = {{1, 3, 0}, {3, 6, 1}};
    pl_sync_stage shortp[2] = {{0, 3, 0}, {3, 5, 1}};
    pl_sync_stage beyond[2] = {{0, 3, 0}, {3, 7, 1}};
    pl_sync_stage empty[3] = {{0, 3, 0}, {3, 3, 1}, {3, 6, 2}};
    pl_sync_stage negrank[2] = {{0, 3, 0}, {3, 6, -4}};
    pl_sync_stage dup[2] = {{0, 1, 9}, {1, 6, 0}};
    pl_sync_stage dupin[2] = {{0, 1, 5}, {1, 6, 5}};
    pl_sync_stage swapped[2] = {{3, 6, 0}, {0, 3, 1}};

    pl_sync_pipeline p[2] = {{2, ok}, {2, gap}};
    expect_error(p, 2, 4, "pipelines[1].stages[1]: starts at layer 3, layers [2, 3) are in no stage");
    p[1] = (pl_sync_pipeline){2, overlap};
    expect_error(p, 2, 4, "pipelines[1].stages[1]: layers [3, 4) are also in stages[0]");
    p[1] = (pl_sync_pipeline){2, late};
    expect_error(p, 2, 4, "pipelines[1].stages[0]: starts at layer 1, layers [0, 1) are in no stage");
    p[1] = (pl_sync_pipeline){2, shortp};
    expect_error(p, 2, 4, "pipelines[1]: ends at layer 5, layers [5, 6) are in no stage");
    p[1] = (pl_sync_pipeline){2, beyond};
    expect_error(p, 2, 4, "pipelines[1].stages[1]: layers [3, 7) outside the model's [0, 6)");
    p[1] = (pl_sync_pipeline){3, empty};
    expect_error(p, 2, 4, "pipelines[1].stages[1]: empty layer range [3, 3)");
    p[1] = (pl_sync_pipeline){2, negrank};
    expect_error(p, 2, 4, "pipelines[1].stages[1]: rank -4, must be >= 0");
    p[1] = (pl_sync_pipeline){2, dup};
    expect_error(p, 2, 4, "pipelines[1].stages[1]: rank 0 already runs pipelines[0].stages[0]");
    p[1] = (pl_sync_pipeline){2, dupin};
    expect_error(p, 2, 4, "pipelines[1].stages[1]: rank 5 already runs pipelines[1].stages[0]");
    p[1] = (pl_sync_pipeline){2, swapped};
    expect_error(p, 2, 4, "pipelines[1].stages[0]: starts at layer 3");
    p[1] = (pl_sync_pipeline){0, ok};
    expect_error(p, 2, 4, "pipelines[1]: no stages");
    expect_error(p, 0, 4, "pipelines: none given");
    expect_error(p, 1, -1, "L: -1");
    /* ok alone with a different L: the layers do not add up */
    expect_error(p, 1, 5, "pipelines[0]: ends at layer 6, layers [6, 7) are in no stage");
}

TEST_MAIN_BEGIN
RUN(test_figure9);
RUN(test_single_stage);
RUN(test_random_plans);
RUN(test_validation);
TEST_MAIN_END
