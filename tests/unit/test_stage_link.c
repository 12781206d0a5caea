/* The TCP stage link (worker/comm/stage_link.c): stages in threads joined by
 * real TCP connections on 127.0.0.1 train exactly like the whole model (as in
 * test_stage.c, which uses an in-memory link); messages far bigger than the
 * socket buffers never deadlock; out-of-order arrivals are stashed within
 * the bound; a peer that dies, a peer that hangs and an abort all end a
 * blocked recv with −1 and a clear message. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "check.h"
#include "rng.h"
#include "stage.h"
#include "stage_link.h"
#include "whole_model.h"

#define MAXST 8

static const char *const names[MAXST] = {"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"};

static pl_comm_ident ident(int rank)
{
    return (pl_comm_ident){.token = "t", .token_len = 1, .rank = rank, .name = names[rank],
                           .generation = 1, .purpose = PL_CONN_STAGE_LINK};
}

static int64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct {
    int port, rank, rc;
    pl_conn *conn;
    char err[256];
} dial_arg;

static void *dial_main(void *a)
{
    dial_arg *d = a;
    pl_comm_ident id = ident(d->rank);
    d->rc = pl_conn_connect("127.0.0.1", d->port, &id, d->rank - 1, 5000, &d->conn, d->err,
                            sizeof d->err);
    return NULL;
}

/* Shrinks a socket's kernel buffers so that every big message overflows them. */
static void small_buffers(pl_conn *c)
{
    int sz = 32 << 10;
    setsockopt(pl_conn_fd(c), SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(pl_conn_fd(c), SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
}

/* Connects stage k to k + 1 for every k (k + 1 dials k): prev[k], next[k]. */
static int make_chain(int nst, pl_conn **prev, pl_conn **next, int shrink)
{
    for (int k = 0; k < nst; k++) prev[k] = next[k] = NULL;
    for (int k = 0; k + 1 < nst; k++) {
        char err[256];
        pl_listener *lis;
        if (pl_listener_open("127.0.0.1", 0, &lis, err, sizeof err)) {
            printf("    listen: %s\n", err);
            return -1;
        }
        dial_arg d = {.port = pl_listener_port(lis), .rank = k + 1};
        pthread_t th;
        pthread_create(&th, NULL, dial_main, &d);
        pl_comm_ident id = ident(k);
        int rc = pl_listener_accept(lis, &id, 5000, &next[k], err, sizeof err);
        pthread_join(th, NULL);
        pl_listener_close(lis);
        if (rc || d.rc) {
            printf("    chain: %s / %s\n", rc ? err : "", d.rc ? d.err : "");
            return -1;
        }
        prev[k + 1] = d.conn;
        if (shrink) {
            small_buffers(next[k]);
            small_buffers(prev[k + 1]);
        }
    }
    return 0;
}

/* Links for a chain of nst stages running nmicro microbatches. */
static int make_links(int nst, int nmicro, int timeout_ms, int shrink, pl_tcp_link **links)
{
    pl_conn *prev[MAXST], *next[MAXST];
    if (make_chain(nst, prev, next, shrink)) return -1;
    int rc = 0;
    for (int k = 0; k < nst; k++) {
        pl_schedule s;
        char err[256];
        pl_schedule_1f1b(nst, k, nmicro, &s, err, sizeof err);
        pl_tcp_link_config cfg = {.stage = k, .prev = prev[k], .next = next[k],
                                  .timeout_ms = timeout_ms};
        pl_tcp_link_pending_limits(&s, &cfg.max_pending_prev, &cfg.max_pending_next);
        pl_schedule_free(&s);
        links[k] = NULL;
        if (pl_tcp_link_create(&cfg, &links[k], err, sizeof err)) {
            printf("    link %d: %s\n", k, err);
            rc = -1;
        }
    }
    return rc;
}

/* ---- whole model vs stages over TCP ---- */

typedef struct {
    pl_engine e;
    pl_schedule s;
    pl_tcp_link *link;
    pl_stage_batch batch;
    double loss;
    int rc;
    char err[320];
} stage_thread;

static void *run_stage(void *arg)
{
    stage_thread *st = arg;
    pl_stage_link link = pl_tcp_link_stage(st->link);
    st->rc = pl_stage_step(&st->e, &st->s, &link, &st->batch, &st->loss, st->err,
                           sizeof st->err);
    return NULL;
}

static const pl_gpt_config *small_config(void)
{
    static pl_gpt_config c;
    char err[128];
    pl_gpt_config_init(&c, 3, 16, 2, 37, 8, err, sizeof err);
    return &c;
}

static const pl_gpt_config *wide_config(void)
{
    static pl_gpt_config c;
    char err[128];
    pl_gpt_config_init(&c, 1, 16, 2, 37, 8, err, sizeof err);
    return &c;
}

static int compare(const pl_gpt_config *c, int B, int T, const int *cuts, int nst, int Nb,
                   int shrink)
{
    const int BT = B * T;
    char err[256];
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)Nb * (size_t)BT);
    int32_t *tgt = malloc(sizeof(int32_t) * (size_t)Nb * (size_t)BT);
    rng_state = 7;
    for (int i = 0; i < Nb * BT; i++) {
        tok[i] = (int32_t)rng_range(0, c->V - 1);
        tgt[i] = (int32_t)rng_range(0, c->V - 1);
    }
    const float scale = 1.0f / (float)(Nb * BT);

    kn_ctx *kw = kn_create("cpu", 1, err, sizeof err);
    pl_engine whole;
    pl_engine_create(&whole, kw, c, 0, c->L + 2, B, T, 1, err, sizeof err);
    pl_engine_init_random(&whole, 3);
    const double whole_loss = whole_model_step(&whole, tok, tgt, Nb, scale);

    pl_tcp_link *links[MAXST];
    int ok = make_links(nst, Nb, 20000, shrink, links) == 0;
    stage_thread *st = calloc((size_t)nst, sizeof *st);
    kn_ctx *kc[MAXST];
    pthread_t th[MAXST];
    for (int k = 0; k < nst; k++) {
        int lo = k ? cuts[k - 1] : 0, hi = k < nst - 1 ? cuts[k] : c->L + 2;
        kc[k] = kn_create("cpu", 1, err, sizeof err);
        pl_schedule_1f1b(nst, k, Nb, &st[k].s, err, sizeof err);
        pl_engine_create(&st[k].e, kc[k], c, lo, hi, B, T, st[k].s.nslots, err, sizeof err);
        pl_engine_init_random(&st[k].e, 3);
        st[k].link = links[k];
        st[k].batch = (pl_stage_batch){.tokens = tok, .targets = tgt, .dloss_scale = scale};
        if (ok) pthread_create(&th[k], NULL, run_stage, &st[k]);
    }
    if (ok)
        for (int k = 0; k < nst; k++) pthread_join(th[k], NULL);

    for (int k = 0; k < nst && ok; k++)
        if (st[k].rc) {
            printf("    stage %d: %s\n", k, st[k].err);
            ok = 0;
        }
    ok &= st[nst - 1].loss == whole_loss;
    for (int k = 0; k < nst && ok; k++)
        for (int i = 0; i < st[k].e.ntensors; i++) {
            const pl_engine_tensor *t = &st[k].e.tensors[i];
            const pl_engine_tensor *w = pl_engine_find(&whole, t->layer, t->index);
            if (t->layer == 0 && t->index == 0) continue;
            ok &= !memcmp(st[k].e.grads + t->offset, whole.grads + w->offset,
                          t->spec.numel * sizeof(float));
        }
    const pl_engine_tensor *we = pl_engine_find(&st[0].e, 0, 0);
    const pl_engine_tensor *wh = &st[nst - 1].e.tensors[st[nst - 1].e.wte_tensor];
    const pl_engine_tensor *ww = pl_engine_find(&whole, 0, 0);
    for (size_t j = 0; j < we->spec.numel && ok; j++) {
        float emb = st[0].e.grads[we->offset + j], head = st[nst - 1].e.grads[wh->offset + j];
        float ref = whole.grads[ww->offset + j];
        /* the tied wte: each holder's share, added once (see test_stage.c) */
        ok &= emb + head == ref;
    }
    if (!ok) printf("    mismatch: %d stages, Nb %d, B %d T %d\n", nst, Nb, B, T);
    for (int k = 0; k < nst; k++) {
        pl_tcp_link_destroy(links[k]);
        pl_engine_destroy(&st[k].e);
        pl_schedule_free(&st[k].s);
        kn_destroy(kc[k]);
    }
    pl_engine_destroy(&whole);
    kn_destroy(kw);
    free(st);
    free(tok);
    free(tgt);
    return ok;
}

static void test_two_stages_every_cut(void)
{
    const pl_gpt_config *c = small_config();
    for (int cut = 1; cut <= c->L + 1; cut++)
        for (int Nb = 1; Nb <= 8; Nb++) {
            int cuts[1] = {cut};
            CHECK(compare(c, 2, 5, cuts, 2, Nb, 0));
        }
}

static void test_three_and_four_stages(void)
{
    const pl_gpt_config *c = small_config();
    static const int three[][2] = {{1, 2}, {1, 4}, {2, 3}, {3, 4}};
    static const int four[3] = {1, 2, 3};
    for (int Nb = 1; Nb <= 8; Nb++) {
        CHECK(compare(c, 2, 5, three[Nb % 4], 3, Nb, 0));
        CHECK(compare(c, 2, 5, four, 4, Nb, 0));
    }
}

/* Activations of 4 MiB over sockets with 32 KiB buffers. */
static void test_large_activations(void)
{
    const pl_gpt_config *c = wide_config();
    const int B = 8192, T = 8;
    static const int two[1] = {2}, three[2] = {1, 2};
    CHECK(compare(c, B, T, two, 2, 3, 1));
    CHECK(compare(c, B, T, three, 3, 3, 1));
}

/* ---- the link alone: 1F1B traffic with 8 MiB messages, no compute ---- */

static float pattern(int from, int kind, int mb, size_t i)
{
    return (float)((i * 2654435761u + (size_t)from * 977 + (size_t)kind * 131 + (size_t)mb) % 65521);
}

typedef struct {
    pl_tcp_link *link;
    pl_schedule s;
    size_t n;
    int rc, bad;
    char err[320];
} traffic_thread;

static void *run_traffic(void *arg)
{
    traffic_thread *t = arg;
    float *buf = malloc(t->n * sizeof *buf);
    const int k = t->s.stage;
    for (int i = 0; i < t->s.nops && !t->rc; i++) {
        const pl_sched_op *op = &t->s.ops[i];
        int kind = op->kind == PL_SCHED_FORWARD ? PL_LINK_ACTIVATION : PL_LINK_GRADIENT;
        if (op->recv_from >= 0) {
            t->rc = pl_tcp_link_recv(t->link, op->recv_from, kind, op->mb, buf, t->n, t->err,
                                     sizeof t->err);
            for (size_t j = 0; j < t->n && !t->rc; j += 997)
                t->bad += buf[j] != pattern(op->recv_from, kind, op->mb, j);
        }
        if (op->send_to >= 0 && !t->rc) {
            for (size_t j = 0; j < t->n; j++) buf[j] = pattern(k, kind, op->mb, j);
            t->rc = pl_tcp_link_send(t->link, op->send_to, kind, op->mb, buf, t->n, t->err,
                                     sizeof t->err);
            memset(buf, 0, t->n * sizeof *buf); /* send copied it */
        }
    }
    if (!t->rc) t->rc = pl_tcp_link_flush(t->link, 20000, t->err, sizeof t->err);
    free(buf);
    return NULL;
}

static void test_big_messages_never_rendezvous(void)
{
    const size_t n = (size_t)2 << 20; /* 8 MiB per message */
    for (int nst = 2; nst <= 4; nst++) {
        const int Nb = 4;
        pl_tcp_link *links[MAXST];
        CHECK(make_links(nst, Nb, 20000, 1, links) == 0);
        traffic_thread t[MAXST];
        pthread_t th[MAXST];
        for (int k = 0; k < nst; k++) {
            char err[128];
            memset(&t[k], 0, sizeof t[k]);
            t[k].link = links[k];
            t[k].n = n;
            pl_schedule_1f1b(nst, k, Nb, &t[k].s, err, sizeof err);
            pthread_create(&th[k], NULL, run_traffic, &t[k]);
        }
        /* every stage ends before any link closes: closing one while a neighbour still
         * reads would reset the connection under it */
        for (int k = 0; k < nst; k++) pthread_join(th[k], NULL);
        int ok = 1;
        for (int k = 0; k < nst; k++) {
            if (t[k].rc || t[k].bad) {
                printf("    %d stages, stage %d: rc %d, %d bad values: %s\n", nst, k, t[k].rc,
                       t[k].bad, t[k].err);
                ok = 0;
            }
            pl_schedule_free(&t[k].s);
            pl_tcp_link_destroy(links[k]);
        }
        CHECK(ok);
    }
}

/* ---- ordering, stash bound, errors ---- */

static void test_out_of_order_and_bound(void)
{
    pl_conn *prev[2], *next[2];
    char err[320];
    float x[4] = {1, 2, 3, 4}, y[4];
    /* receiver keeps up to 3: asks for 2, 0, 1 of 3 sent in order */
    CHECK(make_chain(2, prev, next, 0) == 0);
    pl_tcp_link *a, *b;
    pl_tcp_link_config ca = {.stage = 0, .next = next[0], .timeout_ms = 5000, .max_pending_next = 3};
    pl_tcp_link_config cb = {.stage = 1, .prev = prev[1], .timeout_ms = 5000, .max_pending_prev = 3};
    CHECK(pl_tcp_link_create(&ca, &a, err, sizeof err) == 0);
    CHECK(pl_tcp_link_create(&cb, &b, err, sizeof err) == 0);
    for (int mb = 0; mb < 3; mb++) {
        x[0] = (float)mb;
        CHECK(pl_tcp_link_send(a, 1, PL_LINK_ACTIVATION, mb, x, 4, err, sizeof err) == 0);
    }
    static const int order[3] = {2, 0, 1};
    for (int i = 0; i < 3; i++) {
        CHECK(pl_tcp_link_recv(b, 0, PL_LINK_ACTIVATION, order[i], y, 4, err, sizeof err) == 0);
        CHECK(y[0] == (float)order[i] && y[3] == 4);
    }
    /* a gradient from the next stage: wrong direction for stage 1's peer 0 is fine, wrong size is not */
    CHECK(pl_tcp_link_send(b, 0, PL_LINK_GRADIENT, 0, x, 4, err, sizeof err) == 0);
    CHECK(pl_tcp_link_recv(a, 1, PL_LINK_GRADIENT, 0, y, 3, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "expected 3 floats");
    /* no such peer */
    CHECK(pl_tcp_link_send(a, 5, PL_LINK_ACTIVATION, 0, x, 4, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "no connection to stage 5");
    pl_tcp_link_destroy(a);
    pl_tcp_link_destroy(b);

    /* receiver keeps 2: three arrive, the third is asked for first: refused, not a hang */
    CHECK(make_chain(2, prev, next, 0) == 0);
    ca.next = next[0];
    cb.prev = prev[1];
    cb.max_pending_prev = 2;
    CHECK(pl_tcp_link_create(&ca, &a, err, sizeof err) == 0);
    CHECK(pl_tcp_link_create(&cb, &b, err, sizeof err) == 0);
    for (int mb = 0; mb < 3; mb++)
        CHECK(pl_tcp_link_send(a, 1, PL_LINK_ACTIVATION, mb, x, 4, err, sizeof err) == 0);
    int64_t t0 = ms_now();
    CHECK(pl_tcp_link_recv(b, 0, PL_LINK_ACTIVATION, 2, y, 4, err, sizeof err) == -1);
    CHECK(ms_now() - t0 < 4000);
    CHECK_STR_CONTAINS(err, "activation 2 from stage 0 is not among the 2");
    /* the stashed ones are still there, and the third follows once room is made */
    for (int mb = 0; mb < 3; mb++)
        CHECK(pl_tcp_link_recv(b, 0, PL_LINK_ACTIVATION, mb, y, 4, err, sizeof err) == 0);
    pl_tcp_link_destroy(a);
    pl_tcp_link_destroy(b);
}

/* The ring's wrap (Bamboo §5.1): stage 0 and stage 2 of 3 talk over a third connection,
 * both ways, by stage index; a wrap to a neighbour is refused. */
static void test_the_wrap_closes_the_ring(void)
{
    pl_conn *prev[2], *next[2];
    char err[320];
    float x[4] = {1, 2, 3, 4}, y[4];
    CHECK(make_chain(2, prev, next, 0) == 0);
    pl_tcp_link *first, *last;
    pl_tcp_link_config c0 = {.stage = 0, .wrap = next[0], .wrap_stage = 2, .timeout_ms = 5000,
                             .max_pending_wrap = 2};
    pl_tcp_link_config c2 = {.stage = 2, .wrap = prev[1], .wrap_stage = 0, .timeout_ms = 5000,
                             .max_pending_wrap = 2};
    CHECK(pl_tcp_link_create(&c0, &first, err, sizeof err) == 0);
    CHECK(pl_tcp_link_create(&c2, &last, err, sizeof err) == 0);
    CHECK(pl_tcp_link_send(first, 2, PL_LINK_SHADOW, 1, x, 4, err, sizeof err) == 0);
    CHECK(pl_tcp_link_recv(last, 0, PL_LINK_SHADOW, 1, y, 4, err, sizeof err) == 0);
    CHECK(memcmp(x, y, sizeof x) == 0);
    x[0] = 7;
    CHECK(pl_tcp_link_send(last, 0, PL_LINK_SHADOW, 2, x, 4, err, sizeof err) == 0);
    CHECK(pl_tcp_link_recv(first, 2, PL_LINK_SHADOW, 2, y, 4, err, sizeof err) == 0);
    CHECK(y[0] == 7);
    CHECK(pl_tcp_link_send(first, 1, PL_LINK_ACTIVATION, 0, x, 4, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "no connection to stage 1");
    CHECK(pl_tcp_link_status(last, 0, err, sizeof err) == 0);
    pl_tcp_link_destroy(first);
    pl_tcp_link_destroy(last);

    CHECK(make_chain(2, prev, next, 0) == 0);
    pl_conn_close(prev[1]);
    c0.wrap = next[0];
    c0.wrap_stage = 1;
    CHECK(pl_tcp_link_create(&c0, &first, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "wrap_stage");
}

typedef struct {
    pl_tcp_link *link;
    int peer, rc;
    int64_t ms;
    char err[320];
} blocked_recv;

static void *run_blocked_recv(void *arg)
{
    blocked_recv *r = arg;
    float y[4];
    int64_t t0 = ms_now();
    r->rc = pl_tcp_link_recv(r->link, r->peer, PL_LINK_GRADIENT, 0, y, 4, r->err, sizeof r->err);
    r->ms = ms_now() - t0;
    return NULL;
}

static void test_timeout_and_abort(void)
{
    pl_tcp_link *links[2];
    char err[320];
    float x[4] = {0};
    /* the peer is alive but silent: recv gives up after the timeout */
    CHECK(make_links(2, 2, 300, 0, links) == 0);
    blocked_recv r = {.link = links[0], .peer = 1};
    run_blocked_recv(&r);
    CHECK(r.rc == -1);
    CHECK(r.ms >= 290 && r.ms < 3000);
    CHECK_STR_CONTAINS(r.err, "timeout: no gradient 0 from stage 1 (rank 1, s1)");
    /* a timeout does not break the connection */
    CHECK(pl_tcp_link_status(links[0], 1, err, sizeof err) == 0);
    CHECK(pl_tcp_link_send(links[1], 0, PL_LINK_GRADIENT, 0, x, 4, err, sizeof err) == 0);
    CHECK(pl_tcp_link_recv(links[0], 1, PL_LINK_GRADIENT, 0, x, 4, err, sizeof err) == 0);
    pl_tcp_link_destroy(links[0]);
    pl_tcp_link_destroy(links[1]);

    /* abort wakes a recv that would wait 20 s */
    CHECK(make_links(2, 2, 20000, 0, links) == 0);
    r = (blocked_recv){.link = links[0], .peer = 1};
    pthread_t th;
    pthread_create(&th, NULL, run_blocked_recv, &r);
    sleep_ms(100);
    pl_tcp_link_abort(links[0], "step 7 aborted by the coordinator");
    pthread_join(th, NULL);
    CHECK(r.rc == -1);
    CHECK(r.ms < 2000);
    CHECK_STR_CONTAINS(r.err, "aborted: step 7 aborted by the coordinator");
    CHECK(pl_tcp_link_send(links[0], 1, PL_LINK_ACTIVATION, 0, x, 4, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "aborted");
    pl_tcp_link_destroy(links[0]);
    pl_tcp_link_destroy(links[1]);
}

/* A stage that dies after `die_after` link calls: it closes its connections. */
typedef struct {
    pl_tcp_link *link;
    int calls, die_after;
} dying_ctx;

static int dying_send(void *ctx, int peer, pl_link_kind kind, int mb, const float *buf, size_t n,
                      char *err, size_t errlen)
{
    dying_ctx *d = ctx;
    if (d->die_after >= 0 && d->calls++ == d->die_after) {
        pl_tcp_link_destroy(d->link);
        d->link = NULL;
        snprintf(err, errlen, "killed");
        return -1;
    }
    return pl_tcp_link_send(d->link, peer, kind, mb, buf, n, err, errlen);
}

static int dying_recv(void *ctx, int peer, pl_link_kind kind, int mb, float *buf, size_t n,
                      char *err, size_t errlen)
{
    dying_ctx *d = ctx;
    if (d->die_after >= 0 && d->calls++ == d->die_after) {
        pl_tcp_link_destroy(d->link);
        d->link = NULL;
        snprintf(err, errlen, "killed");
        return -1;
    }
    return pl_tcp_link_recv(d->link, peer, kind, mb, buf, n, err, errlen);
}

typedef struct {
    pl_engine e;
    pl_schedule s;
    dying_ctx d;
    pl_stage_batch batch;
    int rc;
    int64_t end_ms;
    char err[320];
} dying_thread;

static void *run_dying(void *arg)
{
    dying_thread *st = arg;
    pl_stage_link link = {&st->d, dying_send, dying_recv, NULL};
    double loss;
    st->rc = pl_stage_step(&st->e, &st->s, &link, &st->batch, &loss, st->err, sizeof st->err);
    st->end_ms = ms_now();
    /* like the runtime: a failed step tears the link down, which its other neighbour sees */
    if (st->rc && st->d.link) {
        pl_tcp_link_destroy(st->d.link);
        st->d.link = NULL;
    }
    return NULL;
}

static void test_peer_dies_mid_step(void)
{
    const pl_gpt_config *c = small_config();
    const int nst = 4, Nb = 6, B = 2, T = 5, timeout = 10000;
    static const int cuts[3] = {1, 2, 3};
    char err[256];
    int32_t tok[6 * 10] = {0}, tgt[6 * 10] = {0};
    for (int victim = 0; victim < nst; victim++) {
        pl_tcp_link *links[MAXST];
        CHECK(make_links(nst, Nb, timeout, 0, links) == 0);
        dying_thread st[MAXST];
        kn_ctx *kc[MAXST];
        pthread_t th[MAXST];
        memset(st, 0, sizeof st);
        for (int k = 0; k < nst; k++) {
            int lo = k ? cuts[k - 1] : 0, hi = k < nst - 1 ? cuts[k] : c->L + 2;
            kc[k] = kn_create("cpu", 1, err, sizeof err);
            pl_schedule_1f1b(nst, k, Nb, &st[k].s, err, sizeof err);
            pl_engine_create(&st[k].e, kc[k], c, lo, hi, B, T, st[k].s.nslots, err, sizeof err);
            pl_engine_init_random(&st[k].e, 3);
            st[k].d = (dying_ctx){links[k], 0, k == victim ? 3 : -1};
            st[k].batch = (pl_stage_batch){.tokens = tok, .targets = tgt, .dloss_scale = 1.0f / 60};
        }
        int64_t t0 = ms_now();
        for (int k = 0; k < nst; k++) pthread_create(&th[k], NULL, run_dying, &st[k]);
        int ok = 1;
        for (int k = 0; k < nst; k++) {
            pthread_join(th[k], NULL);
            /* everyone fails, well before the 10 s timeout */
            ok &= st[k].rc == -1 && st[k].end_ms - t0 < timeout / 2;
            if (k == victim) ok &= strstr(st[k].err, "killed") != NULL;
            if (k == victim - 1 || k == victim + 1)
                ok &= strstr(st[k].err, "closed") != NULL &&
                      strstr(st[k].err, names[victim]) != NULL;
            if (!ok) printf("    victim %d, stage %d: rc %d after %lld ms: %s\n", victim, k,
                            st[k].rc, (long long)(st[k].end_ms - t0), st[k].err);
        }
        for (int k = 0; k < nst; k++) {
            pl_tcp_link_destroy(st[k].d.link);
            pl_engine_destroy(&st[k].e);
            pl_schedule_free(&st[k].s);
            kn_destroy(kc[k]);
        }
        CHECK(ok);
    }
}

TEST_MAIN_BEGIN
RUN(test_out_of_order_and_bound);
RUN(test_the_wrap_closes_the_ring);
RUN(test_timeout_and_abort);
RUN(test_two_stages_every_cut);
RUN(test_three_and_four_stages);
RUN(test_big_messages_never_rendezvous);
RUN(test_large_activations);
RUN(test_peer_dies_mid_step);
TEST_MAIN_END
