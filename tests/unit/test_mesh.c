/* The connections of a plan (worker/comm/mesh.h): the stash keeps a connection for a
 * later purpose and is bounded, a connection for no wanted purpose is closed, accepts and
 * dials time out and give up when cancelled, a peer at another generation is dialed
 * again, and a plan's ring and stage-link connections come out where they belong; a
 * dialer that gives up on a handshake (its redial slice) leaves the listener nothing to
 * take in place of its next connection. Peers are threads of this process on 127.0.0.1. */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "loopback.h"
#include "mesh.h"
#include "util.h"

#define TOKEN "mesh-test-token"
#define HOST "127.0.0.1"
#define RING PL_MESH_PURPOSE(PL_CONN_RING)
#define LINK PL_MESH_PURPOSE(PL_CONN_STAGE_LINK)
#define COPY PL_MESH_PURPOSE(PL_CONN_LAYER_COPY)

typedef struct {
    pl_listener *l;
    pl_mesh *m;
    atomic_int cancel;
    char log[512];   /* the last line logged */
    char all[16384]; /* every line logged, one after another */
} node;

static int node_cancelled(void *ctx) { return atomic_load(&((node *)ctx)->cancel); }

static void node_log(void *ctx, const char *line)
{
    node *n = ctx;
    snprintf(n->log, sizeof n->log, "%s", line);
    const size_t used = strlen(n->all);
    snprintf(n->all + used, sizeof n->all - used, "%s\n", line);
}

/* A worker's mesh: a listener (listen = 1), generation gen, rank; accepted handshakes end
 * after handshake_ms (0: the default). */
static int node_open_hs(node *n, const char *name, int listen, uint64_t gen, int32_t rank,
                        int handshake_ms)
{
    char err[256];
    memset(n, 0, sizeof *n);
    if (listen && pl_listener_open(HOST, 0, &n->l, err, sizeof err)) return -1;
    pl_mesh_config cfg = {.listener = n->l, .token = TOKEN, .token_len = strlen(TOKEN),
                          .name = name, .cancelled = node_cancelled, .log = node_log, .ctx = n,
                          .redial = 1, .handshake_ms = handshake_ms};
    if (pl_mesh_create(&cfg, &n->m, err, sizeof err)) return -1;
    pl_mesh_set_plan(n->m, gen, rank);
    return 0;
}

static int node_open(node *n, const char *name, int listen, uint64_t gen, int32_t rank)
{
    return node_open_hs(n, name, listen, gen, rank, 0);
}

static void node_close(node *n)
{
    pl_mesh_destroy(n->m);
    pl_listener_close(n->l);
}

/* ---- a dialer thread: connections of the given purposes, one after another ---- */

#define MAXDIAL 80

typedef struct {
    int port;
    uint64_t gen;
    int n;
    pl_conn_purpose purpose[MAXDIAL];
    pl_conn *c[MAXDIAL];
    int rc[MAXDIAL];
    pthread_t th;
} dialer;

static void *dialer_main(void *arg)
{
    dialer *d = arg;
    for (int i = 0; i < d->n; i++) {
        pl_comm_ident id = {.token = TOKEN, .token_len = strlen(TOKEN), .rank = 1, .name = "peer",
                            .generation = d->gen, .purpose = d->purpose[i]};
        char err[256];
        d->rc[i] = pl_conn_connect(HOST, d->port, &id, -1, 5000, &d->c[i], err, sizeof err);
    }
    return NULL;
}

static void dialer_start(dialer *d, const node *to, uint64_t gen)
{
    d->port = pl_listener_port(to->l);
    d->gen = gen;
    pthread_create(&d->th, NULL, dialer_main, d);
}

static void dialer_end(dialer *d)
{
    pthread_join(d->th, NULL);
    for (int i = 0; i < d->n; i++) pl_conn_close(d->c[i]);
}

/* 1 when the peer has closed c within wait_ms. */
static int closed_by_peer(const pl_conn *c, int wait_ms)
{
    struct pollfd pf = {.fd = pl_conn_fd(c), .events = POLLIN | POLLRDHUP};
    return poll(&pf, 1, wait_ms) == 1 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* ---- tests ---- */

static void test_later_purposes_wait_in_the_stash(void)
{
    node a;
    CHECK_EQ_INT(node_open(&a, "a", 1, 3, 0), 0);
    /* a stage neighbour and a ring neighbour come before the layer copy */
    dialer d = {.n = 3, .purpose = {PL_CONN_STAGE_LINK, PL_CONN_RING, PL_CONN_LAYER_COPY}};
    dialer_start(&d, &a, 3);
    char err[256];
    pl_conn *copy = NULL, *first = NULL, *second = NULL, *none = NULL;
    int rc = pl_mesh_accept(a.m, COPY, RING | LINK, pl_now_ms() + 5000, &copy, err, sizeof err);
    pthread_join(d.th, NULL);
    const int stashed = pl_mesh_stashed(a.m);
    /* the links' accepts take them from the stash (either may still be finishing its
     * handshake when the copy's accept returns: it completes in the next accept); nobody
     * dials any more */
    int rc1 = pl_mesh_accept(a.m, RING | LINK, 0, pl_now_ms() + 5000, &first, err, sizeof err);
    int rc2 = pl_mesh_accept(a.m, RING | LINK, 0, pl_now_ms() + 5000, &second, err, sizeof err);
    int rc3 = pl_mesh_accept(a.m, RING | LINK, 0, pl_now_ms() + 100, &none, err, sizeof err);
    const int links = rc1 == 0 && rc2 == 0
                          ? (1 << pl_conn_purpose_of(first)) | (1 << pl_conn_purpose_of(second))
                          : 0;
    int ok = rc == 0 && copy && pl_conn_purpose_of(copy) == PL_CONN_LAYER_COPY && stashed <= 2 &&
             links == ((1 << PL_CONN_STAGE_LINK) | (1 << PL_CONN_RING)) &&
             pl_mesh_stashed(a.m) == 0 && rc3 == PL_COMM_ETIMEOUT;
    if (!ok) printf("    rc %d %d %d %d, stashed %d: %s\n", rc, rc1, rc2, rc3, stashed, err);
    pl_conn_close(copy);
    pl_conn_close(first);
    pl_conn_close(second);
    for (int i = 0; i < d.n; i++) pl_conn_close(d.c[i]);
    node_close(&a);
    CHECK(ok);
}

static void test_the_stash_is_bounded_and_a_new_plan_empties_it(void)
{
    node a;
    CHECK_EQ_INT(node_open(&a, "a", 1, 3, 0), 0);
    dialer d = {.n = PL_MESH_STASH_MAX + 3};
    for (int i = 0; i < d.n - 1; i++) d.purpose[i] = PL_CONN_RING;
    d.purpose[d.n - 1] = PL_CONN_LAYER_COPY;
    dialer_start(&d, &a, 3);
    char err[256];
    pl_conn *copy = NULL;
    int rc = pl_mesh_accept(a.m, COPY, RING, pl_now_ms() + 10000, &copy, err, sizeof err);
    pthread_join(d.th, NULL);
    /* handshakes that finished in the copy's round are dealt with by the next accept */
    pl_conn *none = NULL;
    char err2[256];
    pl_mesh_accept(a.m, 0, RING, pl_now_ms() + 300, &none, err2, sizeof err2);
    const int stashed = pl_mesh_stashed(a.m);
    /* the first ones are kept, the ones beyond the bound closed */
    const int kept_open = !closed_by_peer(d.c[0], 0);
    const int dropped = closed_by_peer(d.c[d.n - 2], 2000);
    pl_mesh_set_plan(a.m, 4, 0);
    const int emptied = pl_mesh_stashed(a.m) == 0 && closed_by_peer(d.c[0], 2000);
    for (int i = 0; i < d.n; i++) pl_conn_close(d.c[i]);
    pl_conn_close(copy);
    node_close(&a);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(stashed, PL_MESH_STASH_MAX);
    CHECK(kept_open && dropped);
    CHECK_STR_CONTAINS(a.all, "stash is full");
    CHECK(emptied);
}

static void test_a_purpose_not_wanted_is_closed(void)
{
    node a;
    CHECK_EQ_INT(node_open(&a, "a", 1, 3, 0), 0);
    dialer d = {.n = 2, .purpose = {PL_CONN_LAYER_COPY, PL_CONN_RING}};
    dialer_start(&d, &a, 3);
    char err[256];
    pl_conn *ring = NULL;
    int rc = pl_mesh_accept(a.m, RING, 0, pl_now_ms() + 5000, &ring, err, sizeof err);
    pthread_join(d.th, NULL);
    /* both handshakes may finish in one round, the ring's returned first: the copy's is
     * then closed by the next accept */
    pl_conn *none = NULL;
    const int rc2 = pl_mesh_accept(a.m, RING, 0, pl_now_ms() + 300, &none, err, sizeof err);
    const int copy_closed = closed_by_peer(d.c[0], 2000);
    for (int i = 0; i < d.n; i++) pl_conn_close(d.c[i]);
    pl_conn_close(ring);
    node_close(&a);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(rc2, PL_COMM_ETIMEOUT);
    CHECK(copy_closed);
    CHECK_STR_CONTAINS(a.all, "layer copy connection from peer");
    CHECK_STR_CONTAINS(a.all, "not wanted now");
}

static void test_timeouts_name_the_last_refusal(void)
{
    node a;
    CHECK_EQ_INT(node_open(&a, "a", 1, 3, 0), 0);
    char err[256];
    pl_conn *c = NULL;
    double t0 = pl_now_ms();
    int rc = pl_mesh_accept(a.m, RING, 0, t0 + 300, &c, err, sizeof err);
    const double waited = pl_now_ms() - t0;
    CHECK_EQ_INT(rc, PL_COMM_ETIMEOUT);
    CHECK(waited >= 250 && waited < 3000);
    CHECK_STR_CONTAINS(err, "timed out waiting for peers");
    /* a peer at another generation is refused; the timeout says so */
    dialer d = {.n = 1, .purpose = {PL_CONN_RING}};
    dialer_start(&d, &a, 2);
    rc = pl_mesh_accept(a.m, RING, 0, pl_now_ms() + 600, &c, err, sizeof err);
    dialer_end(&d);
    node_close(&a);
    CHECK_EQ_INT(rc, PL_COMM_ETIMEOUT);
    CHECK_STR_CONTAINS(err, "last refused");
    CHECK_STR_CONTAINS(err, "stale");
}

typedef struct {
    node *n;
    int dial_port; /* > 0: dial there; else accept */
    int rc;
    double ms;
    char err[256];
} cancel_job;

static void *wait_until_cancelled(void *arg)
{
    cancel_job *j = arg;
    pl_conn *c = NULL;
    const double t0 = pl_now_ms();
    if (j->dial_port > 0)
        j->rc = pl_mesh_dial(j->n->m, HOST, j->dial_port, PL_CONN_RING, 0, 20000, &c, j->err,
                             sizeof j->err);
    else
        j->rc = pl_mesh_accept(j->n->m, RING, 0, t0 + 20000, &c, j->err, sizeof j->err);
    j->ms = pl_now_ms() - t0;
    pl_conn_close(c);
    return NULL;
}

static void test_cancel_ends_waits(void)
{
    /* b at generation 5 dials a at generation 3: a refuses it as stale, b dials again,
     * until both are cancelled */
    node a, b;
    CHECK_EQ_INT(node_open(&a, "a", 1, 3, 0), 0);
    CHECK_EQ_INT(node_open(&b, "b", 0, 5, 1), 0);
    cancel_job ja = {.n = &a}, jb = {.n = &b, .dial_port = pl_listener_port(a.l)};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, wait_until_cancelled, &ja);
    pthread_create(&tb, NULL, wait_until_cancelled, &jb);
    usleep(600 * 1000);
    atomic_store(&a.cancel, 1);
    atomic_store(&b.cancel, 1);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    node_close(&a);
    node_close(&b);
    CHECK_EQ_INT(ja.rc, PL_COMM_ECANCELED);
    CHECK_EQ_INT(jb.rc, PL_COMM_ECANCELED);
    CHECK(ja.ms < 5000 && jb.ms < 5000);
    CHECK_STR_CONTAINS(a.log, "stale");
}

typedef struct {
    node *n;
    uint64_t later_gen;
    int rc;
    pl_conn *c;
    char err[256];
} stale_job;

/* Accepts at the old generation for a while (the dialer is refused as stale), then moves
 * to the dialer's generation and accepts it. */
static void *accept_after_moving_on(void *arg)
{
    stale_job *j = arg;
    pl_conn *c = NULL;
    pl_mesh_accept(j->n->m, RING, 0, pl_now_ms() + 400, &c, j->err, sizeof j->err);
    pl_conn_close(c);
    pl_mesh_set_plan(j->n->m, j->later_gen, 0);
    j->rc = pl_mesh_accept(j->n->m, RING, 0, pl_now_ms() + 5000, &j->c, j->err, sizeof j->err);
    return NULL;
}

static void test_a_peer_at_an_older_plan_is_dialed_again(void)
{
    node a, b;
    CHECK_EQ_INT(node_open(&a, "a", 1, 3, 0), 0);
    CHECK_EQ_INT(node_open(&b, "b", 0, 4, 1), 0);
    stale_job j = {.n = &a, .later_gen = 4};
    pthread_t t;
    pthread_create(&t, NULL, accept_after_moving_on, &j);
    pl_conn *c = NULL;
    char err[256];
    int rc = pl_mesh_dial(b.m, HOST, pl_listener_port(a.l), PL_CONN_RING, 0, 5000, &c, err,
                          sizeof err);
    pthread_join(t, NULL);
    const int ok = rc == 0 && j.rc == 0 && pl_conn_generation(c) == 4 &&
                   pl_conn_peer_rank(j.c) == 1;
    if (!ok) printf("    dial %d: %s\n    accept %d: %s\n", rc, err, j.rc, j.err);
    pl_conn_close(c);
    pl_conn_close(j.c);
    node_close(&a);
    node_close(&b);
    CHECK(ok);
}

/* ---- a plan's connections: 3 ranks of one pipeline, all in one ring, its stage links
 * closed into a ring by the wrap between the first and the last stage ---- */

#define NR 3

typedef struct {
    node n;
    int rank, nranks; /* nranks ≤ NR; the wrap only with 3 or more */
    const char *const *hosts;
    const int *ports;
    pl_conn *ring[NR];
    pl_mesh_links links;
    int rc;
    char err[256];
} rank_job;

static void *connect_main(void *arg)
{
    rank_job *j = arg;
    static const char *const names[NR] = {"w0", "w1", "w2"};
    static const unsigned char ring_all[NR] = {1, 1, 1};
    const int me = j->rank, n = j->nranks;
    unsigned char ring[NR];
    memcpy(ring, ring_all, sizeof ring);
    const pl_mesh_peers peers = {.nranks = n, .names = names, .hosts = j->hosts,
                                 .ports = j->ports, .ring = ring,
                                 .link_prev = me > 0 ? me - 1 : -1,
                                 .link_next = me + 1 < n ? me + 1 : -1,
                                 .link_wrap = n < 3 ? -1 : me == 0 ? n - 1 : me == n - 1 ? 0 : -1};
    j->links.ring = j->ring;
    j->rc = pl_mesh_connect(j->n.m, &peers, 10000, &j->links, j->err, sizeof j->err);
    return NULL;
}

static void test_a_plans_connections(void)
{
    rank_job j[NR];
    const char *hosts[NR];
    int ports[NR];
    static const char *const names[NR] = {"w0", "w1", "w2"};
    for (int r = 0; r < NR; r++) {
        memset(&j[r], 0, sizeof j[r]);
        CHECK_EQ_INT(node_open(&j[r].n, names[r], 1, 7, r), 0);
        hosts[r] = HOST;
        ports[r] = pl_listener_port(j[r].n.l);
    }
    pthread_t t[NR];
    for (int r = 0; r < NR; r++) {
        j[r].hosts = hosts;
        j[r].ports = ports;
        j[r].rank = r;
        j[r].nranks = NR;
        pthread_create(&t[r], NULL, connect_main, &j[r]);
    }
    for (int r = 0; r < NR; r++) pthread_join(t[r], NULL);
    int ok = 1;
    for (int r = 0; r < NR; r++) {
        if (j[r].rc) printf("    rank %d: %s\n", r, j[r].err);
        ok &= j[r].rc == 0 && j[r].links.failed_rank == -1;
        for (int s = 0; s < NR && ok; s++)
            ok &= s == r ? !j[r].ring[s]
                         : j[r].ring[s] && pl_conn_peer_rank(j[r].ring[s]) == s &&
                               pl_conn_purpose_of(j[r].ring[s]) == PL_CONN_RING;
        ok &= r > 0 ? j[r].links.prev && pl_conn_peer_rank(j[r].links.prev) == r - 1 &&
                          pl_conn_purpose_of(j[r].links.prev) == PL_CONN_STAGE_LINK
                    : !j[r].links.prev;
        ok &= r + 1 < NR ? j[r].links.next && pl_conn_peer_rank(j[r].links.next) == r + 1 &&
                               pl_conn_purpose_of(j[r].links.next) == PL_CONN_STAGE_LINK
                         : !j[r].links.next;
        const int wrap = r == 0 ? NR - 1 : r == NR - 1 ? 0 : -1; /* the ring's ends */
        ok &= wrap >= 0 ? j[r].links.wrap && pl_conn_peer_rank(j[r].links.wrap) == wrap &&
                              pl_conn_purpose_of(j[r].links.wrap) == PL_CONN_STAGE_LINK
                        : !j[r].links.wrap;
    }
    for (int r = 0; r < NR; r++) {
        for (int s = 0; s < NR; s++) pl_conn_close(j[r].ring[s]);
        pl_conn_close(j[r].links.prev);
        pl_conn_close(j[r].links.next);
        pl_conn_close(j[r].links.wrap);
        node_close(&j[r].n);
    }
    CHECK(ok);
}

static void test_a_missing_address_and_a_failed_dial(void)
{
    node a;
    CHECK_EQ_INT(node_open(&a, "w1", 1, 7, 1), 0);
    const char *hosts[2] = {NULL, HOST};
    int ports[2] = {0, pl_listener_port(a.l)};
    const unsigned char ring[2] = {1, 0};
    pl_conn *conns[2];
    pl_mesh_peers peers = {.nranks = 2, .hosts = hosts, .ports = ports, .ring = ring,
                           .link_prev = -1, .link_next = -1, .link_wrap = -1};
    pl_mesh_links links = {.ring = conns};
    char err[256];
    int rc = pl_mesh_connect(a.m, &peers, 500, &links, err, sizeof err);
    CHECK_EQ_INT(rc, PL_COMM_EINVAL);
    CHECK_STR_CONTAINS(err, "no address for peer rank 0");
    CHECK_EQ_INT(links.failed_rank, -1);
    /* rank 0 at a port where nobody answers: the dial fails and names the rank */
    pl_listener *dead;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &dead, err, sizeof err), 0);
    hosts[0] = HOST;
    ports[0] = pl_listener_port(dead);
    pl_listener_close(dead);
    rc = pl_mesh_connect(a.m, &peers, 500, &links, err, sizeof err);
    node_close(&a);
    CHECK_EQ_INT(rc, PL_COMM_ETIMEOUT);
    CHECK_EQ_INT(links.failed_rank, 0);
    CHECK(conns[0] == NULL && conns[1] == NULL);
}

/* ---- strangers on the listener ---- */

/* A TCP connection to 127.0.0.1:port that says nothing, or trickles the start of a
 * plausible hello one byte every 100 ms; addr: its own address, as the mesh names it. */
typedef struct {
    int port, trickle, fd;
    char addr[32];
    atomic_int stop;
    double closed_at; /* when the mesh closed it (pl_now_ms), 0: not seen */
    pthread_t th;
} stranger;

static void *stranger_main(void *arg)
{
    stranger *s = arg;
    static const char hello[] = "PLNTHSK1\003\0\0\0";
    for (size_t i = 0; !atomic_load(&s->stop); i++) {
        char b = i < sizeof hello - 1 ? hello[i] : 0;
        if (s->trickle && send(s->fd, &b, 1, MSG_NOSIGNAL) != 1) break;
        struct pollfd pf = {.fd = s->fd, .events = POLLIN | POLLRDHUP};
        if (poll(&pf, 1, 100) == 1) { /* the mesh's hello, then its close */
            char junk[256];
            if (recv(s->fd, junk, sizeof junk, 0) <= 0) break;
        }
    }
    if (!atomic_load(&s->stop)) s->closed_at = pl_now_ms();
    return NULL;
}

static int stranger_start(stranger *s, int port, int trickle)
{
    memset(s, 0, sizeof *s);
    s->port = port;
    s->trickle = trickle;
    s->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof a;
    if (connect(s->fd, (struct sockaddr *)&a, sizeof a) ||
        getsockname(s->fd, (struct sockaddr *)&a, &sl))
        return -1;
    snprintf(s->addr, sizeof s->addr, "127.0.0.1:%d", ntohs(a.sin_port));
    return pthread_create(&s->th, NULL, stranger_main, s);
}

static void stranger_end(stranger *s)
{
    atomic_store(&s->stop, 1);
    pthread_join(s->th, NULL);
    close(s->fd);
}

static void test_silent_and_trickling_strangers_cost_the_real_peers_nothing(void)
{
    node a;
    CHECK_EQ_INT(node_open_hs(&a, "a", 1, 3, 0, 1000), 0);
    const int port = pl_listener_port(a.l);
    stranger silent, trickler;
    CHECK_EQ_INT(stranger_start(&silent, port, 0), 0);
    CHECK_EQ_INT(stranger_start(&trickler, port, 1), 0);
    usleep(50 * 1000); /* they wait on the listener before the real peers */
    dialer d = {.n = 2, .purpose = {PL_CONN_RING, PL_CONN_STAGE_LINK}};
    const double t0 = pl_now_ms();
    dialer_start(&d, &a, 3);
    char err[256];
    pl_conn *ring = NULL, *link = NULL, *none = NULL;
    int rc1 = pl_mesh_accept(a.m, RING | LINK, 0, t0 + 5000, &ring, err, sizeof err);
    int rc2 = pl_mesh_accept(a.m, RING | LINK, 0, t0 + 5000, &link, err, sizeof err);
    const double real_ms = pl_now_ms() - t0;
    pthread_join(d.th, NULL);
    /* the plan waits on; the strangers reach their deadline meanwhile */
    int rc3 = pl_mesh_accept(a.m, RING, 0, t0 + 2000, &none, err, sizeof err);
    stranger_end(&silent);
    stranger_end(&trickler);
    for (int i = 0; i < d.n; i++) pl_conn_close(d.c[i]);
    pl_conn_close(ring);
    pl_conn_close(link);
    node_close(&a);
    if (rc1 || rc2 || real_ms > 500) printf("    accepts %d %d in %.0f ms: %s\n", rc1, rc2, real_ms, err);
    CHECK(rc1 == 0 && rc2 == 0 && real_ms < 500); /* the strangers' deadline is 1000 ms */
    CHECK_EQ_INT(rc3, PL_COMM_ETIMEOUT);
    for (int k = 0; k < 2; k++) {
        const stranger *s = k ? &trickler : &silent;
        char line[160];
        snprintf(line, sizeof line, "dropped the connection from %s: no complete handshake "
                                    "within 1000 ms", s->addr);
        CHECK_STR_CONTAINS(a.all, line);
        const double at = s->closed_at - t0;
        if (at < 900 || at > 1900) printf("    %s closed after %.0f ms\n", s->addr, at);
        CHECK(at >= 900 && at <= 1900);
    }
}

static void test_over_the_bound_the_oldest_handshake_is_dropped(void)
{
    node a;
    CHECK_EQ_INT(node_open(&a, "a", 1, 3, 0), 0);
    enum { N = PL_MESH_PENDING_MAX + 4 };
    stranger s[N];
    int started = 0;
    for (; started < N; started++)
        if (stranger_start(&s[started], pl_listener_port(a.l), 0)) break;
    usleep(50 * 1000);
    dialer d = {.n = 1, .purpose = {PL_CONN_RING}};
    dialer_start(&d, &a, 3);
    char err[256];
    pl_conn *ring = NULL;
    int rc = pl_mesh_accept(a.m, RING, 0, pl_now_ms() + 5000, &ring, err, sizeof err);
    pthread_join(d.th, NULL);
    for (int i = 0; i < started; i++) stranger_end(&s[i]);
    for (int i = 0; i < d.n; i++) pl_conn_close(d.c[i]);
    pl_conn_close(ring);
    node_close(&a);
    CHECK_EQ_INT(started, N);
    CHECK_EQ_INT(rc, 0);
    char line[160];
    snprintf(line, sizeof line, "dropped the connection from %s: %d handshakes pending, this the "
                                "oldest", s[0].addr, PL_MESH_PENDING_MAX);
    CHECK_STR_CONTAINS(a.all, line);
}

/* ---- a dialer's slice ends while the listener's verdict is on its way ---- */

/* One direction of the handshake before its verdict (handshake.c): hello 126, proof 32. */
#define BEFORE_VERDICT 158

/* A relay in front of a listener. Its first connection passes the listener's bytes up to
 * its verdict only, and keeps the listener's side open when the dialer closes its own:
 * the dialer's slice ends waiting for that verdict, and its close reaches the listener
 * late (never, here). Later connections pass as they are. */
typedef struct {
    int cfd, sfd;  /* the dialer's side, the listener's (−1: closed) */
    size_t back;   /* the listener's bytes passed to the dialer */
} hop;

typedef struct {
    int lfd, port, target;
    atomic_int end;
    hop h[8];
    int n;
    pthread_t th;
} relay;

static void hop_close(hop *h)
{
    if (h->cfd >= 0) close(h->cfd);
    if (h->sfd >= 0) close(h->sfd);
    h->cfd = h->sfd = -1;
}

/* Passes what one side of hop h has to the other; held: the first connection's rules. */
static void hop_pass(hop *h, int from_listener, int held)
{
    unsigned char buf[4096];
    const int from = from_listener ? h->sfd : h->cfd, to = from_listener ? h->cfd : h->sfd;
    const ssize_t n = from >= 0 ? read(from, buf, sizeof buf) : -1;
    if (n <= 0 && held && !from_listener) { /* the listener is not told */
        close(h->cfd);
        h->cfd = -1;
        return;
    }
    size_t pass = n > 0 ? (size_t)n : 0;
    if (held && from_listener)
        pass = h->back >= BEFORE_VERDICT ? 0
               : pass < BEFORE_VERDICT - h->back ? pass : BEFORE_VERDICT - h->back;
    if (from_listener) h->back += pass;
    if (n <= 0 || (pass && (to < 0 || write(to, buf, pass) != (ssize_t)pass))) hop_close(h);
}

static void *relay_main(void *arg)
{
    relay *r = arg;
    while (!atomic_load(&r->end)) {
        struct pollfd pf[1 + 2 * 8] = {{.fd = r->lfd, .events = POLLIN}};
        int end[1 + 2 * 8]; /* 2 · hop + (1: the listener's side) */
        int nf = 1;
        for (int e = 0; e < 2 * r->n; e++) {
            const int fd = e % 2 ? r->h[e / 2].sfd : r->h[e / 2].cfd;
            if (fd < 0) continue;
            end[nf] = e;
            pf[nf++] = (struct pollfd){.fd = fd, .events = POLLIN};
        }
        if (poll(pf, (nfds_t)nf, 20) <= 0) continue;
        for (int j = 1; j < nf; j++)
            if (pf[j].revents) hop_pass(&r->h[end[j] / 2], end[j] % 2, end[j] / 2 == 0);
        if ((pf[0].revents & POLLIN) && r->n < 8) {
            const int cfd = accept(r->lfd, NULL, NULL);
            r->h[r->n++] = (hop){.cfd = cfd, .sfd = connect_to(r->target)};
        }
    }
    for (int i = 0; i < r->n; i++) hop_close(&r->h[i]);
    return NULL;
}

static void relay_start(relay *r, int target)
{
    memset(r, 0, sizeof *r);
    r->lfd = listen_loopback(&r->port);
    r->target = target;
    pthread_create(&r->th, NULL, relay_main, r);
}

static void relay_end(relay *r)
{
    atomic_store(&r->end, 1);
    pthread_join(r->th, NULL);
    close(r->lfd);
}

/* The frame a sends on c is the one b receives on d: c and d are one connection. */
static int one_connection(pl_conn *c, pl_conn *d)
{
    pl_frame_hdr h;
    char err[256], got[8] = "";
    return c && d &&
           pl_conn_send_frame(c, PL_FRAME_USER, 1, 0, "redial", 7, 1000, err, sizeof err) == 0 &&
           pl_conn_recv_frame(d, &h, got, sizeof got, 1000, err, sizeof err) == 0 &&
           !strcmp(got, "redial");
}

/* Rank 1 dials rank 0 (a ring connection, then a stage link) through the relay; its first
 * handshake's slice ends waiting for rank 0's verdict, so it dials again. Rank 0 must keep
 * the connections rank 1 keeps. (When the dialer sent its verdict before the listener's
 * came, rank 0 took the connection given up: it closed the redial as a duplicate, or had
 * its connections and left the plan, and the redial waited until its timeout, 60 s in a
 * worker.) */
static void test_a_redial_wins_over_the_handshake_it_gave_up(void)
{
    rank_job j[2];
    for (int r = 0; r < 2; r++) {
        memset(&j[r], 0, sizeof j[r]);
        CHECK_EQ_INT(node_open(&j[r].n, r ? "w1" : "w0", r == 0, 7, r), 0);
    }
    relay rl;
    relay_start(&rl, pl_listener_port(j[0].n.l));
    const char *hosts[2] = {HOST, HOST};
    const int ports[2] = {rl.port, 0};
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        j[r].hosts = hosts;
        j[r].ports = ports;
        j[r].rank = r;
        j[r].nranks = 2;
        pthread_create(&t[r], NULL, connect_main, &j[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
    const int ok = j[0].rc == 0 && j[1].rc == 0 && one_connection(j[1].ring[0], j[0].ring[1]) &&
                   one_connection(j[1].links.prev, j[0].links.next);
    for (int r = 0; r < 2; r++) {
        if (j[r].rc) printf("    rank %d: %s\n", r, j[r].err);
        pl_conn_close(j[r].ring[1 - r]);
        pl_conn_close(r ? j[r].links.prev : j[r].links.next);
    }
    relay_end(&rl);
    for (int r = 0; r < 2; r++) node_close(&j[r].n);
    CHECK(ok);
    CHECK(rl.n >= 3); /* the redial came */
}

TEST_MAIN_BEGIN
RUN(test_later_purposes_wait_in_the_stash);
RUN(test_the_stash_is_bounded_and_a_new_plan_empties_it);
RUN(test_a_purpose_not_wanted_is_closed);
RUN(test_timeouts_name_the_last_refusal);
RUN(test_cancel_ends_waits);
RUN(test_a_peer_at_an_older_plan_is_dialed_again);
RUN(test_a_plans_connections);
RUN(test_a_missing_address_and_a_failed_dial);
RUN(test_silent_and_trickling_strangers_cost_the_real_peers_nothing);
RUN(test_over_the_bound_the_oldest_handshake_is_dropped);
RUN(test_a_redial_wins_over_the_handshake_it_gave_up);
TEST_MAIN_END
