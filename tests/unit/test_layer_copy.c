/* Layer copies of a reconfiguration over an ORDERED transport (worker/engine/layer_copy.h)
 * against the simulator of tests/unit/xport_sim.h: one thread per plan rank, CPU engines,
 * rendezvous p2p, deadlock detection. Previous engines hold values keyed by (worker, layer,
 * tensor, array, element), so every holder's params, m and v differ and a destination must
 * end with exactly its source's bits (everything else of the new engine untouched, bytes_in
 * exact). Plans are written as the coordinator would: pipelines shared by all, each worker
 * its own copies and sends. The simulator holds at most XSIM_GROUP_OPS operations per
 * group, which bounds the plans here (three operations per segment).
 *  (a) 2×3 pipelines → 1×3 + 1×2 after losing a head: the head-only survivor receives a
 *      block and the head with the tied wte; a whole-model destination gets wte with layer 0
 *      only;
 *  (b) a rank receiving from two sources while others send and receive;
 *  (c) two ranks swapping layers, and a cycle of three: no deadlock (one group per rank);
 *  (d) a source idle in the new plan: its copy is left to TCP, the others move; the
 *      possible / pair answers are the same from every worker's plan;
 *  (e) random reconfigurations (losses, idle sources, any cuts);
 *  (f) failures: a source lacking the layer fails at once, before enqueuing, and the rank
 *      waiting for it fails by the simulator's deadline (or deadlock detection), not a hang;
 *      a rank dying mid-copy, an abort from the control thread; every precondition's
 *      message, with nothing enqueued. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "rng.h"
#include "layer_copy.h"
#include "util.h"
#include "xport_sim.h"

enum { B = 2, T = 5, MAXW = 8, MAXC = 16, MAXP = 3, MAXS = 6 };
static const float SENTINEL = -12345.0f;

static const pl_gpt_config *config(void)
{
    static pl_gpt_config c;
    char err[128];
    pl_gpt_config_init(&c, 3, 16, 2, 37, 8, err, sizeof err);
    return &c;
}

/* ---- scenarios ---- */

typedef struct {
    const char *name;
    int ob, oe; /* the previous engine's layers; ob < 0: none */
} old_worker;

typedef struct {
    int n;
    const char *nodes[MAXS];
    int layers[MAXS + 1];
} new_pipe;

typedef struct {
    int layer;
    const char *source, *dest;
} copy_spec;

typedef struct {
    int nw;
    old_worker w[MAXW];
    int np;
    new_pipe p[MAXP];
    int nc;
    copy_spec c[MAXC];
} scenario;

/* ---- a world: workers with engines and plans ---- */

typedef struct world world;

typedef struct {
    world *w;
    const char *name;
    int id, rank;           /* rank −1: idle */
    kn_ctx *k;
    pl_engine src, dst;
    int has_src, has_dst;
    pl_msg_plan plan;
    pl_msg_copy copies[MAXC];
    pl_msg_send sends[MAXC];
    const pl_xport *x;      /* NULL: this worker's own rank's */
    int no_park;            /* a failed rank that vanishes: its peers must find out */
    int absent;             /* never runs (its process hangs before the copy) */
    int64_t bytes;
    int rc;
    char err[2048];
} worker;

struct world {
    const scenario *s;
    int nranks;
    xsim *sim;
    pl_msg_pipeline pipes[MAXP];
    pl_proto_name names[MAXP][MAXS];
    int layers[MAXP][MAXS + 1];
    worker wk[MAXW];
};

/* A value for (worker, layer, tensor, array, element): distinct everywhere. */
static float value(int id, int layer, int index, int arr, size_t i)
{
    uint64_t z = ((uint64_t)id << 56) ^ ((uint64_t)layer << 48) ^ ((uint64_t)index << 40) ^
                 ((uint64_t)arr << 36) ^ (uint64_t)i;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) / (float)(1u << 24) - 0.5f;
}

static float *array_of(const pl_engine *e, int arr)
{
    return arr == 0 ? e->params : arr == 1 ? e->m : e->v;
}

static void fill_keyed(pl_engine *e, int id)
{
    for (int t = 0; t < e->ntensors; t++) {
        const pl_engine_tensor *x = &e->tensors[t];
        for (int a = 0; a < 3; a++)
            for (size_t i = 0; i < x->spec.numel; i++)
                array_of(e, a)[x->offset + i] = value(id, x->layer, x->index, a, i);
    }
}

static worker *by_name(world *w, const char *name)
{
    for (int i = 0; i < w->s->nw; i++)
        if (!strcmp(w->wk[i].name, name)) return &w->wk[i];
    return NULL;
}

static int world_init(world *w, const scenario *s, int transport, int idle_ms, char *err,
                      size_t errlen)
{
    const pl_gpt_config *c = config();
    memset(w, 0, sizeof *w);
    w->s = s;
    for (int i = 0; i < s->nw; i++) {
        worker *k = &w->wk[i];
        k->w = w, k->name = s->w[i].name, k->id = i + 1, k->rank = -1;
        if (!(k->k = kn_create("cpu", 1, err, errlen))) return -1;
        if (s->w[i].ob >= 0) {
            if (pl_engine_create(&k->src, k->k, c, s->w[i].ob, s->w[i].oe, B, T, 1, err, errlen))
                return -1;
            k->has_src = 1;
            fill_keyed(&k->src, k->id);
        }
        k->plan.you_pipeline = -1;
        k->plan.npipelines = s->np;
        k->plan.pipelines = w->pipes;
        k->plan.transport = transport;
        k->plan.copies = k->copies;
        k->plan.sends = k->sends;
    }
    for (int q = 0; q < s->np; q++) {
        pl_msg_pipeline *mp = &w->pipes[q];
        mp->nnodes = mp->template_nodes = s->p[q].n;
        mp->nodes = w->names[q];
        mp->layers = w->layers[q];
        mp->microbatches = 1;
        for (int j = 0; j <= s->p[q].n; j++) w->layers[q][j] = s->p[q].layers[j];
        for (int j = 0; j < s->p[q].n; j++, w->nranks++) {
            snprintf(w->names[q][j], sizeof w->names[q][j], "%s", s->p[q].nodes[j]);
            worker *k = by_name(w, s->p[q].nodes[j]);
            if (!k) return pl_errf(err, errlen, "no worker %s", s->p[q].nodes[j]);
            k->rank = w->nranks;
            k->plan.you_pipeline = q, k->plan.you_stage = j;
            k->plan.you_layer_begin = s->p[q].layers[j];
            k->plan.you_layer_end = s->p[q].layers[j + 1];
            if (pl_engine_create(&k->dst, k->k, c, k->plan.you_layer_begin,
                                 k->plan.you_layer_end, B, T, 1, err, errlen))
                return -1;
            k->has_dst = 1;
            for (size_t i = 0; i < k->dst.nparams; i++)
                k->dst.params[i] = k->dst.m[i] = k->dst.v[i] = SENTINEL;
        }
    }
    for (int i = 0; i < s->nc; i++) { /* each worker sees its own copies and sends */
        worker *src = by_name(w, s->c[i].source), *dst = by_name(w, s->c[i].dest);
        if (src) {
            pl_msg_send *x = &src->sends[src->plan.nsends++];
            x->layer = s->c[i].layer;
            snprintf(x->dest, sizeof x->dest, "%s", s->c[i].dest);
        }
        if (dst) {
            pl_msg_copy *x = &dst->copies[dst->plan.ncopies++];
            x->layer = s->c[i].layer;
            snprintf(x->source, sizeof x->source, "%s", s->c[i].source);
        }
    }
    w->sim = xsim_new(w->nranks, idle_ms);
    return 0;
}

static void world_free(world *w)
{
    for (int i = 0; i < w->s->nw; i++) {
        worker *k = &w->wk[i];
        if (k->has_src) pl_engine_destroy(&k->src);
        if (k->has_dst) pl_engine_destroy(&k->dst);
        if (k->k) kn_destroy(k->k);
    }
    if (w->sim) xsim_free(w->sim);
}

static void *worker_main(void *arg)
{
    worker *k = arg;
    world *w = k->w;
    const pl_xport *x = k->x ? k->x : &w->sim->x[k->rank];
    k->rc = pl_layer_copy_xport(x, &k->plan, config(), k->has_src ? &k->src : NULL, &k->dst,
                                &k->bytes, k->err, sizeof k->err);
    if (!(k->rc && k->no_park)) xsim_park(w->sim, k->rank, 1);
    return NULL;
}

/* Every rank in a thread of its own; idle workers on this thread (they have no rank). */
static void world_run(world *w)
{
    pthread_t th[MAXW];
    for (int i = 0; i < w->s->nw; i++)
        if (w->wk[i].rank >= 0 && !w->wk[i].absent)
            pthread_create(&th[i], NULL, worker_main, &w->wk[i]);
    for (int i = 0; i < w->s->nw; i++) {
        worker *k = &w->wk[i];
        if (k->rank >= 0) continue;
        k->rc = pl_layer_copy_xport(NULL, &k->plan, config(), k->has_src ? &k->src : NULL, NULL,
                                    &k->bytes, k->err, sizeof k->err);
    }
    for (int i = 0; i < w->s->nw; i++)
        if (w->wk[i].rank >= 0 && !w->wk[i].absent) pthread_join(th[i], NULL);
}

/* The source of tensor (layer, index) of dst's range in the scenario: a worker moving it over
 * the transport, or NULL (held locally or over TCP: not this module's). */
static worker *source_of(world *w, const worker *d, int layer, int index)
{
    const int L = config()->L;
    /* a head-only range's wte comes with the head */
    const int key = layer == 0 && index == 0 && d->dst.begin > 0 ? L + 1 : layer;
    for (int i = 0; i < w->s->nc; i++) {
        const copy_spec *c = &w->s->c[i];
        if (c->layer != key || strcmp(c->dest, d->name)) continue;
        worker *s = by_name(w, c->source);
        return s && s->rank >= 0 ? s : NULL;
    }
    return NULL;
}

/* Every rank succeeded; each copied tensor equals its source's bit for bit (params, m, v),
 * everything else of the new engine is untouched, bytes_in counts what came. */
static int check_copied(world *w, const char *label)
{
    int ok = 1;
    for (int i = 0; i < w->s->nw; i++) {
        worker *d = &w->wk[i];
        if (d->rc) {
            printf("    %s: %s: %s\n", label, d->name, d->err);
            ok = 0;
            continue;
        }
        if (!d->has_dst) {
            if (d->bytes) ok = 0, printf("    %s: idle %s received %lld bytes\n", label, d->name,
                                         (long long)d->bytes);
            continue;
        }
        int64_t want = 0;
        for (int t = 0; t < d->dst.ntensors; t++) {
            const pl_engine_tensor *x = &d->dst.tensors[t];
            const worker *s = source_of(w, d, x->layer, x->index);
            const pl_engine_tensor *y = s ? pl_engine_find(&s->src, x->layer, x->index) : NULL;
            if (s && !y) {
                printf("    %s: scenario error: %s lacks (%d, %d)\n", label, s->name, x->layer,
                       x->index);
                return 0;
            }
            for (int a = 0; a < 3; a++) {
                const float *got = array_of(&d->dst, a) + x->offset;
                int same = 1;
                if (y) {
                    same = !memcmp(got, array_of(&s->src, a) + y->offset,
                                   x->spec.numel * sizeof(float));
                } else {
                    for (size_t e = 0; e < x->spec.numel; e++) same &= got[e] == SENTINEL;
                }
                if (!same) {
                    printf("    %s: %s tensor %s array %d: %s\n", label, d->name, x->name, a,
                           y ? "differs from its source's" : "written though not copied here");
                    ok = 0;
                }
            }
            if (y) want += 3 * (int64_t)x->spec.numel * (int64_t)sizeof(float);
        }
        if (d->bytes != want) {
            printf("    %s: %s bytes_in %lld, expected %lld\n", label, d->name,
                   (long long)d->bytes, (long long)want);
            ok = 0;
        }
    }
    return ok;
}

static int run_ok(const scenario *s, const char *label)
{
    world *w = calloc(1, sizeof *w);
    char err[256];
    int ok = w && world_init(w, s, PL_TRANSPORT_NCCL, 5000, err, sizeof err) == 0;
    if (!ok) printf("    %s: setup: %s\n", label, w ? err : "out of memory");
    if (ok) {
        world_run(w);
        ok = check_copied(w, label);
    }
    if (w) world_free(w);
    free(w);
    return ok;
}

/* ---- (a) – (e) ---- */

/* 2×3 → 1×3 + 1×2: b2, the head of pipeline 1, is lost; b1 grows to [2, 5), head-only, and
 * receives the block and the head, with the tied wte, from a2. */
static const scenario LOSS = {
    5,
    {{"a0", 0, 2}, {"a1", 2, 3}, {"a2", 3, 5}, {"b0", 0, 2}, {"b1", 2, 3}},
    2,
    {{3, {"a0", "a1", "a2"}, {0, 2, 3, 5}}, {2, {"b0", "b1"}, {0, 2, 5}}},
    2,
    {{3, "a2", "b1"}, {4, "a2", "b1"}},
};

static void test_loss_head_only_destination_gets_wte(void)
{
    CHECK(run_ok(&LOSS, "2x3 -> 1x3 + 1x2"));
}

/* w0 takes layer 1 from w1 and layer 2 from w3; w1 sends to w0 and receives from w4; w4
 * receives from w3 and sends to w1; w3 sends to two ranks. */
static const scenario TWO_SOURCES = {
    5,
    {{"w0", 0, 1}, {"w1", 1, 3}, {"w2", 3, 5}, {"w3", 0, 3}, {"w4", 3, 5}},
    2,
    {{3, {"w0", "w1", "w2"}, {0, 3, 4, 5}}, {2, {"w3", "w4"}, {0, 2, 5}}},
    4,
    {{1, "w1", "w0"}, {2, "w3", "w0"}, {3, "w4", "w1"}, {2, "w3", "w4"}},
};

/* A whole-model destination: layer 0 brings the wte (from h0), the head does not (h1 sends
 * blocks and head as one segment, no wte). */
static const scenario WHOLE = {
    3,
    {{"h0", 0, 2}, {"h1", 2, 5}, {"h2", 1, 2}},
    2,
    {{1, {"h2"}, {0, 5}}, {2, {"h0", "h1"}, {0, 2, 5}}},
    4,
    {{0, "h0", "h2"}, {2, "h1", "h2"}, {3, "h1", "h2"}, {4, "h1", "h2"}},
};

static void test_two_sources_and_mixed_roles(void)
{
    CHECK(run_ok(&TWO_SOURCES, "two sources"));
    CHECK(run_ok(&WHOLE, "whole model"));
}

/* z1 and z2 swap places: each sends to and receives from the other. */
static const scenario SWAP = {
    4,
    {{"z0", 0, 1}, {"z1", 1, 2}, {"z2", 2, 3}, {"z3", 3, 5}},
    1,
    {{4, {"z0", "z2", "z1", "z3"}, {0, 1, 2, 3, 5}}},
    2,
    {{1, "z1", "z2"}, {2, "z2", "z1"}},
};

/* y1 → y3 → y2 → y1: a cycle of three. */
static const scenario CYCLE = {
    5,
    {{"y0", 0, 1}, {"y1", 1, 2}, {"y2", 2, 3}, {"y3", 3, 4}, {"y4", 4, 5}},
    1,
    {{5, {"y0", "y3", "y1", "y2", "y4"}, {0, 1, 2, 3, 4, 5}}},
    3,
    {{1, "y1", "y3"}, {2, "y2", "y1"}, {3, "y3", "y2"}},
};

static void test_swaps_and_cycles_do_not_deadlock(void)
{
    CHECK(run_ok(&SWAP, "swap"));
    CHECK(run_ok(&CYCLE, "cycle"));
}

/* j0 held everything and is idle now: i0's layer 1 from j0 goes over TCP (left alone
 * here), layer 2 from i1 over the transport. */
static const scenario IDLE_SOURCE = {
    3,
    {{"i0", 0, 1}, {"i1", 1, 5}, {"j0", 0, 5}},
    1,
    {{2, {"i0", "i1"}, {0, 3, 5}}},
    2,
    {{1, "j0", "i0"}, {2, "i1", "i0"}},
};

static void test_idle_source_is_left_to_tcp(void)
{
    CHECK(run_ok(&IDLE_SOURCE, "idle source"));
    world *w = calloc(1, sizeof *w);
    char err[256];
    CHECK(w && world_init(w, &IDLE_SOURCE, PL_TRANSPORT_NCCL, 5000, err, sizeof err) == 0);
    const pl_msg_plan *p = &by_name(w, "j0")->plan, *p0 = &by_name(w, "i0")->plan;
    /* the same answers from every worker's plan, idle j0's included */
    const int possible = pl_layer_copy_xport_possible(p) && pl_layer_copy_xport_possible(p0);
    const int pairs = !pl_layer_copy_xport_pair(p, "j0", "i0") &&
                      !pl_layer_copy_xport_pair(p0, "j0", "i0") &&
                      pl_layer_copy_xport_pair(p, "i1", "i0") &&
                      pl_layer_copy_xport_pair(p0, "i1", "i0") &&
                      !pl_layer_copy_xport_pair(p0, "i0", "i0");
    by_name(w, "i0")->plan.transport = PL_TRANSPORT_TCP;
    const int tcp = pl_layer_copy_xport_possible(p0);
    world_free(w);
    free(w);
    CHECK(possible);
    CHECK(pairs);
    CHECK(!tcp);
}

/* Random reconfigurations: old pipelines over up to 8 workers, some lost, the survivors
 * (some idle) in new pipelines cut anywhere, each missing layer from a random surviving
 * holder (idle ones too). Plans whose groups the simulator cannot hold (more than
 * XSIM_GROUP_OPS operations on a rank, counted here independently) are skipped. */
static const char *const POOL[MAXW] = {"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"};

/* n stages over NL layers: bounds[0] = 0 < ... < bounds[n] = NL. */
static void random_cuts(int n, int NL, int *bounds)
{
    int used[16] = {0};
    for (int m = 0; m < n - 1;) {
        const int cut = (int)rng_range(1, NL - 1);
        if (!used[cut]) used[cut] = 1, m++;
    }
    bounds[0] = 0;
    for (int cut = 1, k = 1; cut < NL; cut++)
        if (used[cut]) bounds[k++] = cut;
    bounds[n] = NL;
}

/* Operations on the busiest rank: per pair, runs of consecutive layers plus the wte of a
 * head-only destination, three each. */
static int max_ops(const scenario *s, const int *newb)
{
    const int L = config()->L;
    int ops[MAXW] = {0};
    for (int a = 0; a < s->nw; a++)
        for (int d = 0; d < s->nw; d++) {
            if (newb[a] == -2 || newb[d] < 0) continue; /* TCP, or no destination */
            int seg = 0, prev = -2, head = 0;
            for (int l = 0; l <= L + 1; l++)
                for (int i = 0; i < s->nc; i++)
                    if (s->c[i].layer == l && !strcmp(s->c[i].source, POOL[a]) &&
                        !strcmp(s->c[i].dest, POOL[d])) {
                        seg += l != prev + 1;
                        prev = l;
                        head |= l == L + 1;
                    }
            seg += head && newb[d] > 0;
            ops[a] += 3 * seg, ops[d] += 3 * seg;
        }
    int m = 0;
    for (int i = 0; i < s->nw; i++) m = ops[i] > m ? ops[i] : m;
    return m;
}

static void test_random_reconfigurations(void)
{
    const int NL = config()->L + 2;
    int ran = 0, skipped = 0, moved = 0;
    for (int c = 0; c < 300 && ran < 60; c++) {
        rng_state = 4200 + (uint64_t)c;
        scenario s;
        memset(&s, 0, sizeof s);
        /* old: 1–3 pipelines of 1–4 stages */
        int nold = 0, np = (int)rng_range(1, 3);
        for (int q = 0; q < np && nold < MAXW; q++) {
            int ns = (int)rng_range(1, 4), b[MAXS + 1];
            if (ns > MAXW - nold) ns = MAXW - nold;
            random_cuts(ns, NL, b);
            for (int j = 0; j < ns; j++, nold++)
                s.w[nold] = (old_worker){POOL[nold], b[j], b[j + 1]};
        }
        s.nw = nold;
        /* lost (−1), idle (−2) or placed (its new layer_begin) */
        int fate[MAXW], alive = 0, order[MAXW];
        for (int i = 0; i < nold; i++) {
            const int64_t f = rng_range(0, 9);
            fate[i] = f == 0 ? -1 : f == 1 ? -2 : 0;
            if (fate[i] == 0) order[alive++] = i;
        }
        if (alive == 0) continue;
        for (int i = alive - 1; i > 0; i--) {
            const int j = (int)rng_range(0, i), t = order[i];
            order[i] = order[j], order[j] = t;
        }
        /* new: the placed survivors in 1–2 pipelines, shuffled */
        s.np = alive > 1 ? (int)rng_range(1, 2) : 1;
        for (int q = 0, k = 0; q < s.np; q++) {
            const int ns = q + 1 < s.np ? (int)rng_range(1, alive - k - (s.np - q - 1)) : alive - k;
            int b[MAXS + 1];
            random_cuts(ns > NL ? NL : ns, NL, b);
            for (int j = NL; j < ns; j++) fate[order[k + j]] = -2; /* more than layers: idle */
            const int used = ns > NL ? NL : ns;
            s.p[q].n = used;
            for (int j = 0; j <= used; j++) s.p[q].layers[j] = b[j];
            for (int j = 0; j < used; j++) {
                s.p[q].nodes[j] = POOL[order[k + j]];
                fate[order[k + j]] = b[j];
            }
            k += ns;
        }
        /* copies: each missing layer from a random surviving holder */
        int ok = 1;
        for (int q = 0; q < s.np && ok; q++)
            for (int j = 0; j < s.p[q].n && ok; j++) {
                const old_worker *d = &s.w[s.p[q].nodes[j][1] - '0'];
                for (int l = s.p[q].layers[j]; l < s.p[q].layers[j + 1] && ok; l++) {
                    if (l >= d->ob && l < d->oe) continue;
                    int hold[MAXW], nh = 0;
                    for (int i = 0; i < nold; i++)
                        if (fate[i] != -1 && l >= s.w[i].ob && l < s.w[i].oe) hold[nh++] = i;
                    if (!nh) ok = 0; /* lost: a checkpoint's job */
                    else
                        s.c[s.nc++] = (copy_spec){l, POOL[hold[rng_range(0, nh - 1)]], d->name};
                }
            }
        if (!ok || s.nc == 0) continue;
        for (int i = 0; i < nold; i++) /* the lost are not there at all */
            if (fate[i] == -1) s.w[i].ob = -1;
        if (max_ops(&s, fate) > XSIM_GROUP_OPS) {
            skipped++;
            continue;
        }
        for (int i = 0; i < s.nc; i++) moved += fate[s.c[i].source[1] - '0'] != -2;
        char label[48];
        snprintf(label, sizeof label, "random plan %d", c);
        CHECK(run_ok(&s, label));
        ran++;
    }
    printf("    %d random reconfigurations (%d layers over the transport), %d skipped (groups "
           "beyond the simulator's %d operations)\n", ran, moved, skipped, XSIM_GROUP_OPS);
    CHECK(ran >= 30);
}

/* ---- (f) failures ---- */

/* Runs s; worker `bad` must fail with `want` before enqueuing anything; every rank waiting
 * for it must fail too, well before the test's alarm: by the simulator's deadline when the
 * failed rank vanishes (a dead or stuck process), by its deadlock detection when it parks
 * (it went on to report the failure). */
static int run_bad(const scenario *s, const char *bad, const char *want, int park,
                   const char *label)
{
    world *w = calloc(1, sizeof *w);
    char err[256];
    if (!w || world_init(w, s, PL_TRANSPORT_NCCL, 300, err, sizeof err)) {
        printf("    %s: setup: %s\n", label, w ? err : "out of memory");
        if (w) world_free(w);
        free(w);
        return 0;
    }
    worker *b = by_name(w, bad);
    b->no_park = !park;
    const double t0 = xsim_now_ms();
    world_run(w);
    const double ms = xsim_now_ms() - t0;
    int ok = ms < 5000;
    if (b->rc != -1 || !strstr(b->err, want)) {
        printf("    %s: %s returned %d: \"%s\"\n", label, bad, b->rc, b->err);
        ok = 0;
    }
    int waited = 0;
    for (int i = 0; i < s->nw; i++) {
        worker *k = &w->wk[i];
        if (k == b || k->rc == 0) continue;
        waited++;
        if (!strstr(k->err, park ? "deadlock" : "no progress for 300 ms")) {
            printf("    %s: %s: \"%s\"\n", label, k->name, k->err);
            ok = 0;
        }
    }
    printf("    %s: %s: %s; %d waiting rank(s) failed after %.0f ms\n", label, bad, b->err,
           waited, ms);
    world_free(w);
    free(w);
    return ok && waited > 0;
}

static void test_wrong_plans_fail_instead_of_hanging(void)
{
    /* a1 held only layer 2; b1 waits for it */
    scenario lacking = LOSS;
    lacking.c[0].source = lacking.c[1].source = "a1";
    const char *want = "send of layer 3 to b1: not held here (layers [2, 3))";
    CHECK(run_bad(&lacking, "a1", want, 0, "source lacks the layer, vanishes"));
    CHECK(run_bad(&lacking, "a1", want, 1, "source lacks the layer, parks"));
    /* a1 lacks the head: the tied wte is named too */
    lacking.nc = 1;
    lacking.c[0] = (copy_spec){4, "a1", "b1"};
    CHECK(run_bad(&lacking, "a1", "send of layer 4 with the tied wte to b1: not held here", 0,
                  "source lacks the head"));
}

/* A rank dying in the middle of the copy (its transport fails at the group) fails the
 * peers that exchange with it instead of leaving them waiting. */
static void test_a_dead_rank_fails_its_peers(void)
{
    world *w = calloc(1, sizeof *w);
    char err[256];
    CHECK(w && world_init(w, &SWAP, PL_TRANSPORT_NCCL, 300, err, sizeof err) == 0);
    worker *z1 = by_name(w, "z1"), *z2 = by_name(w, "z2");
    xsim_fail_at(w->sim, z1->rank, 1);
    z1->no_park = 1;
    world_run(w);
    char e1[sizeof z1->err], e2[sizeof z2->err];
    snprintf(e1, sizeof e1, "%s", z1->err);
    snprintf(e2, sizeof e2, "%s", z2->err);
    const int rc1 = z1->rc, rc2 = z2->rc, rc0 = by_name(w, "z0")->rc;
    world_free(w);
    free(w);
    CHECK_EQ_INT(rc1, -1);
    CHECK_STR_CONTAINS(e1, "injected failure");
    CHECK_EQ_INT(rc2, -1);
    CHECK_STR_CONTAINS(e2, "no progress for 300 ms");
    CHECK_STR_CONTAINS(e2, "rank 2: dead");
    CHECK_EQ_INT(rc0, 0); /* nothing to move */
}

static void test_abort_ends_a_stuck_copy(void)
{
    world *w = calloc(1, sizeof *w);
    char err[256];
    CHECK(w && world_init(w, &LOSS, PL_TRANSPORT_NCCL, 60000, err, sizeof err) == 0);
    by_name(w, "a2")->absent = 1;
    xsim_aborter ab = {w->sim, 200};
    pthread_t ta;
    pthread_create(&ta, NULL, xsim_abort_later, &ab);
    const double t0 = xsim_now_ms();
    world_run(w);
    const double ms = xsim_now_ms() - t0;
    pthread_join(ta, NULL);
    worker *b1 = by_name(w, "b1");
    char e[sizeof b1->err];
    snprintf(e, sizeof e, "%s", b1->err);
    const int rc = b1->rc;
    world_free(w);
    free(w);
    CHECK_EQ_INT(rc, -1);
    CHECK_STR_CONTAINS(e, "aborted by the control thread");
    CHECK(ms < 5000);
}

/* Errors found before anything is enqueued, each on its own: the failing rank's call
 * returns at once, whatever the others do. */
static void test_errors_before_enqueue(void)
{
    world *w = calloc(1, sizeof *w);
    char err[256];
    CHECK(w && world_init(w, &LOSS, PL_TRANSPORT_NCCL, 300, err, sizeof err) == 0);
    worker *a2 = by_name(w, "a2"), *b0 = by_name(w, "b0"), *b1 = by_name(w, "b1");
    const pl_gpt_config *c = config();
    enum { N = 7 };
    struct {
        const char *want;
        int rc;
        int64_t bytes;
        char err[512];
    } r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++) r[i].bytes = 7;
    /* a send to an idle worker (not a rank of the plan) */
    snprintf(a2->sends[0].dest, sizeof a2->sends[0].dest, "%s", "idle7");
    r[0].want = "send of layer 3 to idle7: not a worker of the plan";
    r[0].rc = pl_layer_copy_xport(&w->sim->x[a2->rank], &a2->plan, c, &a2->src, &a2->dst,
                                  &r[0].bytes, r[0].err, sizeof r[0].err);
    snprintf(a2->sends[0].dest, sizeof a2->sends[0].dest, "%s", "b1");
    /* the transport of another rank */
    r[1].want = "the transport is rank 0 of 5, the plan places this worker at rank 4 of 5";
    r[1].rc = pl_layer_copy_xport(&w->sim->x[0], &b1->plan, c, &b1->src, &b1->dst, &r[1].bytes,
                                  r[1].err, sizeof r[1].err);
    /* a layer with two sources */
    b1->copies[1].layer = 3;
    snprintf(b1->copies[1].source, sizeof b1->copies[1].source, "%s", "a1");
    r[2].want = "layer 3 has two sources, a2 and a1";
    r[2].rc = pl_layer_copy_xport(&w->sim->x[b1->rank], &b1->plan, c, &b1->src, &b1->dst,
                                  &r[2].bytes, r[2].err, sizeof r[2].err);
    b1->copies[1].layer = 4;
    snprintf(b1->copies[1].source, sizeof b1->copies[1].source, "%s", "a2");
    /* a new engine of another range */
    r[3].want = "the new engine holds layers [3, 5), the plan gives b1 layers [2, 5)";
    r[3].rc = pl_layer_copy_xport(&w->sim->x[b1->rank], &b1->plan, c, &b1->src, &a2->dst,
                                  &r[3].bytes, r[3].err, sizeof r[3].err);
    /* sends without a previous engine */
    r[4].want = "send of layer 3 to b1: this worker holds no layers";
    r[4].rc = pl_layer_copy_xport(&w->sim->x[a2->rank], &a2->plan, c, NULL, &a2->dst,
                                  &r[4].bytes, r[4].err, sizeof r[4].err);
    /* a copy outside the destination's range (its source sees it too, from the pipelines) */
    b0->plan.ncopies = 1;
    b0->copies[0] = b1->copies[1];
    r[5].want = "copy of layer 4 from a2: this worker runs layers [0, 2)";
    r[5].rc = pl_layer_copy_xport(&w->sim->x[b0->rank], &b0->plan, c, &b0->src, &b0->dst,
                                  &r[5].bytes, r[5].err, sizeof r[5].err);
    snprintf(a2->sends[1].dest, sizeof a2->sends[1].dest, "%s", "b0");
    r[6].want = "send of layer 4 to b0, which runs layers [0, 2)";
    r[6].rc = pl_layer_copy_xport(&w->sim->x[a2->rank], &a2->plan, c, &a2->src, &a2->dst,
                                  &r[6].bytes, r[6].err, sizeof r[6].err);
    const long completed = w->sim->completed;
    int queued = 0;
    for (int i = 0; i < w->nranks; i++) queued += w->sim->len[i];
    world_free(w);
    free(w);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(r[i].rc, -1);
        CHECK_STR_CONTAINS(r[i].err, r[i].want);
        CHECK_EQ_INT(r[i].bytes, 0);
    }
    CHECK_EQ_INT(queued, 0);
    CHECK_EQ_INT(completed, 0);
}

TEST_MAIN_BEGIN
alarm(120); /* a hang is a failure too */
RUN(test_loss_head_only_destination_gets_wte);
RUN(test_two_sources_and_mixed_roles);
RUN(test_swaps_and_cycles_do_not_deadlock);
RUN(test_idle_source_is_left_to_tcp);
RUN(test_random_reconfigurations);
RUN(test_wrong_plans_fail_instead_of_hanging);
RUN(test_a_dead_rank_fails_its_peers);
RUN(test_abort_ends_a_stuck_copy);
RUN(test_errors_before_enqueue);
TEST_MAIN_END
