/* Layer copies over TCP (worker/engine/layer_copy.h, pl_layer_copier_tcp) with layers in
 * parts (shared/reinstantiate.h): a destination takes parts of one layer from two sources
 * at once, two parts of a layer from the same source, whole layers and the head's parts,
 * over the workers' meshes on 127.0.0.1 (threads of this process, CPU engines). The two
 * sources hold different values, so every element must be its own part's source's, and
 * bytes_in the whole layers'; received into a reserve's pages, the same. A plan whose parts do not cover a layer fails before
 * anything moves. A stop from another thread ends a copy whose peer stalls, sender or
 * receiver, at once; so does a failure on the copy's own side. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "layer_copy.h"
#include "util.h"

#define TOKEN "layer-copy-test"
#define HOST "127.0.0.1"

enum { B = 2, T = 5, NW = 3, MAXC = 16 };

static const pl_gpt_config *config(void)
{
    static pl_gpt_config c;
    char err[128];
    pl_gpt_config_init(&c, 3, 16, 2, 37, 8, err, sizeof err);
    return &c;
}

/* A value for (worker, tensor, array, element): distinct everywhere. */
static float value(int id, int tensor, int arr, size_t i)
{
    uint64_t z = ((uint64_t)id << 56) ^ ((uint64_t)tensor << 44) ^ ((uint64_t)arr << 40) ^ i;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (float)((z ^ (z >> 31)) >> 40) / (float)(1u << 24);
}

static float *array_of(const pl_engine *e, int arr)
{
    return arr == 0 ? e->params : arr == 1 ? e->m : e->v;
}

typedef struct {
    const char *name;
    pl_listener *l;
    pl_mesh *m;
    kn_ctx *k;
    pl_engine src, dst;
    int has_src, has_dst;
    pl_msg_plan plan;
    pl_msg_copy copies[MAXC];
    pl_msg_send sends[MAXC];
    pl_msg_peer peers[NW];
    pl_layer_copy_result res;
    pl_layer_copy_stop *stop;
    int fail_fill; /* filling what no copy brings fails */
    pl_reserve *reserve;
    int rc;
    char err[1024];
} node;

static int never(void *ctx) { return (void)ctx, 0; }

static void quiet(void *ctx, const char *line) { (void)ctx, (void)line; }

/* The copy of layer `layer`, part `part` of `parts`, from `from` to `to`. */
static void add_copy(node *from, node *to, int layer, int part, int parts)
{
    pl_msg_copy *c = &to->copies[to->plan.ncopies++];
    *c = (pl_msg_copy){.layer = layer, .part = part, .parts = parts};
    snprintf(c->source, sizeof c->source, "%s", from->name);
    pl_msg_send *s = &from->sends[from->plan.nsends++];
    s->layer = layer;
    snprintf(s->dest, sizeof s->dest, "%s", to->name);
}

static pl_msg_pipeline pipe_of_d;
static pl_proto_name pipe_names[1];
static int pipe_layers[2];

/* Sources a and b hold every layer (ids 1, 2); d runs them all in the new plan. */
static int setup(node *n, char *err, size_t errlen)
{
    static const char *const names[NW] = {"a", "b", "d"};
    const pl_gpt_config *c = config();
    pipe_layers[0] = 0;
    pipe_layers[1] = c->L + 2;
    snprintf(pipe_names[0], sizeof pipe_names[0], "d");
    pipe_of_d = (pl_msg_pipeline){.nnodes = 1, .template_nodes = 1, .nodes = pipe_names,
                                  .layers = pipe_layers, .microbatches = 1};
    for (int i = 0; i < NW; i++) {
        node *x = &n[i];
        memset(x, 0, sizeof *x);
        x->name = names[i];
        if (pl_listener_open(HOST, 0, &x->l, err, errlen)) return -1;
        pl_mesh_config mc = {.listener = x->l, .token = TOKEN, .token_len = strlen(TOKEN),
                             .name = x->name, .cancelled = never, .log = quiet, .redial = 1};
        if (pl_mesh_create(&mc, &x->m, err, errlen)) return -1;
        pl_mesh_set_plan(x->m, 1, i == 2 ? 0 : PL_COMM_NO_RANK);
        if (!(x->k = kn_create("cpu", 1, err, errlen))) return -1;
        pl_engine *e = i == 2 ? &x->dst : &x->src;
        if (pl_engine_create(e, x->k, c, 0, c->L + 2, B, T, 1, err, errlen)) return -1;
        x->has_src = i < 2;
        x->has_dst = i == 2;
        for (int t = 0; t < e->ntensors; t++)
            for (int a = 0; a < 3; a++)
                for (size_t j = 0; j < e->tensors[t].spec.numel; j++)
                    array_of(e, a)[e->tensors[t].offset + j] = i < 2 ? value(i + 1, t, a, j) : -1;
        x->plan = (pl_msg_plan){.generation = 1, .npipelines = 1, .pipelines = &pipe_of_d,
                                .you_pipeline = i == 2 ? 0 : -1, .you_layer_end = i == 2 ? c->L + 2 : 0,
                                .copies = x->copies, .sends = x->sends, .peers = x->peers,
                                .transport = PL_TRANSPORT_TCP};
    }
    for (int i = 0; i < NW; i++)
        for (int j = 0; j < NW; j++) {
            if (j == i) continue;
            pl_msg_peer *p = &n[i].peers[n[i].plan.npeers++];
            snprintf(p->name, sizeof p->name, "%s", n[j].name);
            snprintf(p->host, sizeof p->host, HOST);
            p->port = pl_listener_port(n[j].l);
        }
    return 0;
}

/* setup, its failure a failed check */
static int setup_checked(node *n)
{
    char err[256];
    const int ok = setup(n, err, sizeof err) == 0;
    if (!ok) {
        printf("    setup: %s\n", err);
        check_failed_ = 1;
    }
    return ok;
}

static void teardown(node *n)
{
    for (int i = 0; i < NW; i++) {
        if (n[i].has_src) pl_engine_destroy(&n[i].src);
        if (n[i].has_dst) pl_engine_destroy(&n[i].dst);
        if (n[i].k) kn_destroy(n[i].k);
        pl_mesh_destroy(n[i].m);
        pl_listener_close(n[i].l);
    }
}

static int fill_fails(void *ctx, char *err, size_t errlen)
{
    (void)ctx;
    return pl_errf(err, errlen, "filling failed");
}

static void *copy_main(void *arg)
{
    node *x = arg;
    pl_layer_copy_tcp tcp = {.mesh = x->m, .stop = x->stop};
    const pl_layer_copier c = pl_layer_copier_tcp(&tcp);
    const pl_layer_copy_job job = {.plan = &x->plan, .self = x->name, .cfg = config(),
                                   .src = x->has_src ? &x->src : NULL,
                                   .dst = x->has_dst ? &x->dst : NULL,
                                   .fill_dst = x->fail_fill ? fill_fails : NULL,
                                   .reserve = x->reserve};
    x->rc = c.copy(&c, &job, &x->res, x->err, sizeof x->err);
    return NULL;
}

static void run_all(node *n)
{
    pthread_t th[NW];
    for (int i = 0; i < NW; i++) pthread_create(&th[i], NULL, copy_main, &n[i]);
    for (int i = 0; i < NW; i++) pthread_join(th[i], NULL);
}

/* The id of the source of element j of tensor t of d's engine, from d's copies. */
static int source_id(const node *d, int t, size_t j)
{
    const pl_engine *e = &d->dst;
    const int layer = pl_layer_copy_layer_of(e, t);
    for (int i = 0; i < d->plan.ncopies; i++) {
        const pl_msg_copy *c = &d->plan.copies[i];
        size_t off, cnt;
        pl_layer_copy_part_span(e->tensors[t].spec.numel, c->part, c->parts, &off, &cnt);
        if (c->layer == layer && j >= off && j < off + cnt) return c->source[0] == 'a' ? 1 : 2;
    }
    return 0;
}

/* Elements of d's engine that differ from their copy's source (-1 where no copy brings
 * them); *bytes: the received tensors' bytes. */
static int wrong_elements(const node *d, int64_t *bytes)
{
    int wrong = 0;
    *bytes = 0;
    for (int t = 0; t < d->dst.ntensors; t++) {
        const pl_engine_tensor *x = &d->dst.tensors[t];
        const int copied = pl_layer_copy_source(&d->plan, pl_layer_copy_layer_of(&d->dst, t)) != NULL;
        *bytes += copied ? 3 * (int64_t)x->spec.numel * (int64_t)sizeof(float) : 0;
        for (int arr = 0; arr < 3; arr++)
            for (size_t j = 0; j < x->spec.numel; j++)
                wrong += array_of(&d->dst, arr)[x->offset + j] !=
                         (copied ? value(source_id(d, t, j), t, arr, j) : -1.0f);
    }
    if (wrong) printf("    %d elements differ from their part's source\n", wrong);
    return wrong;
}

/* Runs the copies of n's plans: every side succeeds, and d holds each element from its
 * part's source, every byte received once. */
static void run_and_check(node *n)
{
    run_all(n);
    for (int i = 0; i < NW; i++)
        if (n[i].rc) printf("    %s: %s\n", n[i].name, n[i].err);
    CHECK(n[0].rc == 0 && n[1].rc == 0 && n[2].rc == 0);
    int64_t want = 0;
    CHECK_EQ_INT(wrong_elements(&n[2], &want), 0);
    CHECK_EQ_INT(n[2].res.bytes_in, want);
}

static void test_parts_from_several_sources(void)
{
    node n[NW];
    if (!setup_checked(n)) return;
    node *a = &n[0], *b = &n[1], *d = &n[2];
    add_copy(a, d, 0, 0, 2); /* the embedding from both */
    add_copy(b, d, 0, 1, 2);
    add_copy(a, d, 1, 0, 3); /* two parts from a, one from b */
    add_copy(b, d, 1, 1, 3);
    add_copy(a, d, 1, 2, 3);
    add_copy(b, d, 2, 0, 1); /* whole */
    add_copy(a, d, 3, 0, 1);
    add_copy(b, d, 4, 0, 2); /* the head */
    add_copy(a, d, 4, 1, 2);
    run_and_check(n);
    teardown(n);
}

/* The embedding alone from a: wte is most of it, so a's list goes over the pair's
 * streams as wte's two halves (the second with wpe); layer 2 whole from b, split by
 * tensors; every element once, from its source. */
static void test_a_large_tensor_goes_over_both_streams(void)
{
    node n[NW];
    if (!setup_checked(n)) return;
    node *a = &n[0], *b = &n[1], *d = &n[2];
    add_copy(a, d, 0, 0, 1);
    add_copy(b, d, 2, 0, 1);
    run_and_check(n);
    teardown(n);
}

/* Bytes of one array over d's blocks of layers 0, 2 and 4 (what the test below receives),
 * each block from its first tensor to the page after its last (engine.h). */
static size_t received_span(const pl_engine *e)
{
    size_t bytes = 0;
    for (int j = 0, k; j < e->ntensors; j = k) {
        for (k = j + 1; k < e->ntensors && e->tensors[k].index != 0; k++) {
        }
        const int l = pl_layer_copy_layer_of(e, j);
        const pl_engine_tensor *t = &e->tensors[k - 1];
        if (l == 0 || l == 2 || l == 4)
            bytes += (pl_engine_align_layer(t->offset + t->spec.numel) - e->tensors[j].offset) *
                     sizeof(float);
    }
    return bytes;
}

/* d's received pages come from a reserve made present first (copy_reserve.h): every
 * element is still its source's, the layers not received keep theirs (-1), and the
 * reserve's freeing leaves them. */
static void test_received_into_the_reserve(void)
{
    node n[NW];
    if (!setup_checked(n)) return;
    node *a = &n[0], *b = &n[1], *d = &n[2];
    add_copy(a, d, 0, 0, 2); /* the embedding in parts */
    add_copy(b, d, 0, 1, 2);
    add_copy(b, d, 2, 0, 1); /* 1 and 3 not received: d keeps its own */
    add_copy(a, d, 4, 0, 1);
    pl_reserve r = {0};
    CHECK_EQ_INT(pl_reserve_renew(&r, d->k, pl_reserve_size((int64_t)d->dst.nparams * 12, 5, 0)), 1);
    for (int i = 0; i < 2000 && atomic_load(&r.ready) < r.bytes; i++) usleep(1000);
    d->reserve = &r;
    run_all(n);
    CHECK(a->rc == 0 && b->rc == 0 && d->rc == 0);
    CHECK(d->res.reserved == (int64_t)r.used && r.used == 4 * received_span(&d->dst));
    int64_t want = 0;
    CHECK_EQ_INT(wrong_elements(d, &want), 0);
    CHECK_EQ_INT(d->res.bytes_in, want);
    pl_reserve_free(&r);
    CHECK_EQ_INT(wrong_elements(d, &want), 0);
    teardown(n);
}

/* A reserve short of the gradients: the params, m and v come from it, the gradients as far
 * as it goes, and every element is still its source's. */
static void test_a_short_reserve_covers_what_it_can(void)
{
    node n[NW];
    if (!setup_checked(n)) return;
    node *a = &n[0], *b = &n[1], *d = &n[2];
    add_copy(a, d, 0, 0, 2);
    add_copy(b, d, 0, 1, 2);
    add_copy(b, d, 2, 0, 1);
    add_copy(a, d, 4, 0, 1);
    const size_t span = received_span(&d->dst);
    pl_reserve r = {0};
    CHECK_EQ_INT(pl_reserve_renew(&r, d->k, 3 * span + span / 2 / KN_SHARE_ALIGN * KN_SHARE_ALIGN), 1);
    for (int i = 0; i < 2000 && atomic_load(&r.ready) < r.bytes; i++) usleep(1000);
    d->reserve = &r;
    run_all(n);
    CHECK(a->rc == 0 && b->rc == 0 && d->rc == 0);
    CHECK(r.used >= 3 * span && r.used < 4 * span && (int64_t)r.used == d->res.reserved);
    int64_t want = 0;
    CHECK_EQ_INT(wrong_elements(d, &want), 0);
    CHECK_EQ_INT(d->res.bytes_in, want);
    pl_reserve_free(&r);
    teardown(n);
}

static void test_parts_not_covering_a_layer_fail_first(void)
{
    node n[NW];
    if (!setup_checked(n)) return;
    node *a = &n[0], *b = &n[1], *d = &n[2];
    add_copy(a, d, 1, 0, 3);
    add_copy(b, d, 1, 2, 3);
    copy_main(d); /* fails before it accepts anything: no source needed */
    CHECK(d->rc != 0 && strstr(d->err, "layer 1: some of its 3 parts have no copy"));
    d->plan.ncopies = 0;
    add_copy(a, d, 1, 0, 2);
    add_copy(b, d, 1, 0, 2);
    copy_main(d);
    CHECK(d->rc != 0 && strstr(d->err, "copies[1]: part 0 of layer 1 listed twice"));
    d->plan.ncopies = 0;
    add_copy(a, d, 1, 0, 2);
    add_copy(b, d, 1, 1, 3);
    copy_main(d);
    CHECK(d->rc != 0 && strstr(d->err, "copies[1]: layer 1 in 3 parts, an earlier entry has 2"));
    teardown(n);
}

/* ---- a peer that stalls: connected, alive, silent ---- */

typedef struct {
    node *self, *peer;
    int dial;                 /* 1: dials peer as its copy source; 0: accepts peer's copy */
    int streams;              /* of the source's PL_LAYER_COPY_STREAMS it opens */
    atomic_int connected, release;
    pthread_t th;
} staller;

static void *stall_main(void *arg)
{
    staller *st = arg;
    pl_conn *c[PL_LAYER_COPY_STREAMS] = {0};
    char err[256];
    int n = 0;
    for (int i = 0; i < st->streams; i++) {
        if (st->dial)
            pl_mesh_dial(st->self->m, HOST, pl_listener_port(st->peer->l), PL_CONN_LAYER_COPY,
                         -1, 5000, &c[i], err, sizeof err);
        else
            pl_mesh_accept(st->self->m, PL_MESH_PURPOSE(PL_CONN_LAYER_COPY), 0,
                           pl_now_ms() + 5000, &c[i], err, sizeof err);
        n += c[i] != NULL;
    }
    atomic_store(&st->connected, n == st->streams);
    while (!atomic_load(&st->release)) usleep(10 * 1000);
    for (int i = 0; i < st->streams; i++) pl_conn_close(c[i]);
    return NULL;
}

/* x copies with its peer stalled (st); once its stream is open, a stop (stop = 1): the
 * copy must return at once, its threads joined. The ms from the stop to the return. */
static double stalled_copy(node *x, staller *st, int stop)
{
    pthread_t th;
    x->stop = stop ? pl_layer_copy_stop_new() : NULL;
    pthread_create(&st->th, NULL, stall_main, st);
    pthread_create(&th, NULL, copy_main, x);
    for (int i = 0; i < 500 && !atomic_load(&st->connected); i++) usleep(10 * 1000);
    usleep(200 * 1000); /* the stream waits on the peer */
    const double t0 = pl_now_ms();
    pl_layer_copy_stop_now(x->stop, "a newer plan");
    pthread_join(th, NULL);
    const double ms = pl_now_ms() - t0;
    atomic_store(&st->release, 1);
    pthread_join(st->th, NULL);
    pl_layer_copy_stop_free(x->stop);
    x->stop = NULL;
    return ms;
}

/* a copies layer 1 to d, with the other end stalled: d receiving (a silent, after opening
 * `streams` of its streams), or a sending (d silent, its streams accepted). The copying end
 * is stopped (stop), or fails filling what no copy brings (d only): either way it returns
 * at once with err saying why, no peer blamed. */
static void stalled_case(int receive, int streams, int stop, const char *why)
{
    node n[NW];
    if (!setup_checked(n)) return;
    node *a = &n[0], *d = &n[2];
    add_copy(a, d, 1, 0, 1);
    node *x = receive ? d : a;
    x->fail_fill = !stop;
    staller st = {.self = receive ? a : d, .peer = x, .dial = receive,
                  .streams = receive ? streams : PL_LAYER_COPY_STREAMS};
    const double ms = stalled_copy(x, &st, stop); /* a failure: over before the 200 ms */
    if (x->rc == 0 || ms > 2000)
        printf("    %s: rc %d in %.0f ms: %s\n", x->name, x->rc, ms, x->err);
    CHECK(atomic_load(&st.connected));
    CHECK(x->rc != 0 && ms < 2000);
    CHECK_STR_CONTAINS(x->err, why);
    CHECK_EQ_INT((int)strlen(x->res.failed_peer), 0);
    teardown(n);
}

/* Without the stop each would wait PL_LAYER_COPY_TIMEOUT_MS for the stalled peer. */
static void test_a_stop_ends_streams_on_a_stalled_peer(void)
{
    stalled_case(1, PL_LAYER_COPY_STREAMS, 1, "layer copies stopped: a newer plan");
    stalled_case(0, PL_LAYER_COPY_STREAMS, 1, "layer copies stopped: a newer plan");
}

/* A source that opened one of its streams and went silent: the stop ends d's wait for the
 * others too. */
static void test_a_stop_ends_the_wait_for_a_sources_streams(void)
{
    stalled_case(1, 1, 1, "layer copies stopped: a newer plan");
}

/* Without, d's receiver waited out PL_LAYER_COPY_TIMEOUT_MS for the stalled source. */
static void test_a_failure_on_its_side_ends_the_other_streams(void)
{
    stalled_case(1, PL_LAYER_COPY_STREAMS, 0, "filling failed");
}

TEST_MAIN_BEGIN
RUN(test_parts_from_several_sources);
RUN(test_a_large_tensor_goes_over_both_streams);
RUN(test_received_into_the_reserve);
RUN(test_a_short_reserve_covers_what_it_can);
RUN(test_parts_not_covering_a_layer_fail_first);
RUN(test_a_stop_ends_streams_on_a_stalled_peer);
RUN(test_a_stop_ends_the_wait_for_a_sources_streams);
RUN(test_a_failure_on_its_side_ends_the_other_streams);
TEST_MAIN_END
