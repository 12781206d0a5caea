/* The worker-to-worker TCP transport (worker/comm/): handshake (token, generation, rank,
 * purpose), frames, tensors, timeouts, full mesh, ring all-reduce. Peers are threads of
 * this process on 127.0.0.1. */
#include "allreduce.h"
#include "check.h"
#include "mesh.h"
#include "rng.h"
#include "tcp.h"
#include "util.h"

#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TOKEN "job-7f3a-secret-token"
#define HOST "127.0.0.1"

static pl_comm_ident ident(int rank, const char *name, const char *token, uint64_t gen)
{
    pl_comm_ident id = {.token = token, .token_len = strlen(token), .rank = rank,
                        .name = name, .generation = gen, .purpose = PL_CONN_RING};
    return id;
}

/* ---- accepting in a thread ---- */

typedef struct {
    pl_listener *l;
    pl_comm_ident id;
    int timeout_ms;
    pl_conn *c;
    int rc;
    char err[512];
} accept_job;

static void *accept_main(void *arg)
{
    accept_job *j = arg;
    j->rc = pl_listener_accept(j->l, &j->id, j->timeout_ms, &j->c, j->err, sizeof j->err);
    return NULL;
}

/* Connects dialer (rank 1) to an acceptor (rank 0); returns both codes. */
typedef struct {
    int arc, crc;
    pl_conn *a, *c;
    char aerr[512], cerr[512];
} pair_result;

static pair_result connect_pair(pl_listener *l, pl_comm_ident acc, pl_comm_ident dial,
                                int expect_rank)
{
    pair_result r = {0};
    accept_job j = {.l = l, .id = acc, .timeout_ms = 5000};
    pthread_t t;
    pthread_create(&t, NULL, accept_main, &j);
    r.crc = pl_conn_connect(HOST, pl_listener_port(l), &dial, expect_rank, 5000, &r.c, r.cerr,
                            sizeof r.cerr);
    pthread_join(t, NULL);
    r.arc = j.rc;
    r.a = j.c;
    memcpy(r.aerr, j.err, sizeof r.aerr);
    return r;
}

static void close_pair(pair_result *r)
{
    pl_conn_close(r->a);
    pl_conn_close(r->c);
    r->a = r->c = NULL;
}

/* A plain TCP connection to 127.0.0.1:port, no handshake; −1 on failure. */
static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Dials 127.0.0.1:port in a thread, timing it. */
typedef struct {
    int port;
    pl_comm_ident id;
    int timeout_ms, rc;
    double ms;
    pl_conn *c;
    char err[512];
} dial_job;

static void *dial_main(void *arg)
{
    dial_job *j = arg;
    const double t0 = pl_now_ms();
    j->rc = pl_conn_connect(HOST, j->port, &j->id, -1, j->timeout_ms, &j->c, j->err,
                            sizeof j->err);
    j->ms = pl_now_ms() - t0;
    pl_conn_close(j->c);
    return NULL;
}

/* ---- handshake ---- */

static void test_handshake_ok(void)
{
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    CHECK(pl_listener_port(l) > 0);
    pair_result r = connect_pair(l, ident(0, "worker-a", TOKEN, 3), ident(1, "worker-b", TOKEN, 3), 0);
    pl_listener_close(l);
    if (r.arc || r.crc)
        printf("    accept: %s\n    connect: %s\n", r.aerr, r.cerr);
    CHECK_EQ_INT(r.arc, 0);
    CHECK_EQ_INT(r.crc, 0);
    CHECK_EQ_INT(pl_conn_peer_rank(r.a), 1);
    CHECK_EQ_INT(pl_conn_peer_rank(r.c), 0);
    CHECK(strcmp(pl_conn_peer_name(r.a), "worker-b") == 0);
    CHECK(strcmp(pl_conn_peer_name(r.c), "worker-a") == 0);
    CHECK_EQ_INT(pl_conn_generation(r.a), 3);
    /* one frame each way */
    CHECK_EQ_INT(pl_conn_send_frame(r.c, PL_FRAME_USER, 9, 1, "hello", 5, 1000, err, sizeof err), 0);
    CHECK_EQ_INT(pl_conn_send_frame(r.a, PL_FRAME_USER + 1, 10, 2, "hi", 2, 1000, err, sizeof err), 0);
    char buf[16];
    pl_frame_hdr h;
    CHECK_EQ_INT(pl_conn_recv_frame(r.a, &h, buf, sizeof buf, 1000, err, sizeof err), 0);
    CHECK(h.type == PL_FRAME_USER && h.tag == 9 && h.aux == 1 && h.len == 5 && h.generation == 3);
    CHECK(memcmp(buf, "hello", 5) == 0);
    CHECK_EQ_INT(pl_conn_recv_frame(r.c, &h, buf, sizeof buf, 1000, err, sizeof err), 0);
    CHECK(h.type == PL_FRAME_USER + 1 && h.tag == 10 && h.len == 2 && memcmp(buf, "hi", 2) == 0);
    close_pair(&r);
}

/* pl_conn_set_silence_ms: both ends probe a silent peer after ms/2, every ms/6, 3
 * times (a peer cut off fails its connections in about ms); 0 restores the default. */
static void test_silent_peer_keepalive(void)
{
    char err[256];
    pl_listener *l;
    pl_conn_set_silence_ms(6000);
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    pair_result r = connect_pair(l, ident(0, "a", TOKEN, 1), ident(1, "b", TOKEN, 1), 0);
    pl_listener_close(l);
    pl_conn_set_silence_ms(0);
    CHECK_EQ_INT(r.arc, 0);
    CHECK_EQ_INT(r.crc, 0);
    pl_conn *ends[2] = {r.a, r.c};
    for (int k = 0; k < 2 && !r.arc && !r.crc; k++) {
        int on = 0, idle = 0, intvl = 0, cnt = 0;
        socklen_t n = sizeof on;
        getsockopt(pl_conn_fd(ends[k]), SOL_SOCKET, SO_KEEPALIVE, &on, &n);
        getsockopt(pl_conn_fd(ends[k]), IPPROTO_TCP, TCP_KEEPIDLE, &idle, &n);
        getsockopt(pl_conn_fd(ends[k]), IPPROTO_TCP, TCP_KEEPINTVL, &intvl, &n);
        getsockopt(pl_conn_fd(ends[k]), IPPROTO_TCP, TCP_KEEPCNT, &cnt, &n);
        CHECK(on && idle == 3 && intvl == 1 && cnt == 3);
    }
    close_pair(&r);
}

static void test_wrong_token_refused(void)
{
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    pair_result r = connect_pair(l, ident(0, "a", TOKEN, 1), ident(1, "intruder", "other-job-token", 1), -1);
    CHECK_EQ_INT(r.arc, PL_COMM_EAUTH);
    CHECK_EQ_INT(r.crc, PL_COMM_EAUTH);
    CHECK(r.a == NULL && r.c == NULL);
    CHECK_STR_CONTAINS(r.aerr, "token mismatch");
    CHECK_STR_CONTAINS(r.aerr, "intruder");
    CHECK_STR_CONTAINS(r.cerr, "token mismatch");
    /* a token that is a prefix of the right one is just as wrong */
    r = connect_pair(l, ident(0, "a", TOKEN, 1), ident(1, "b", "job-7f3a", 1), -1);
    CHECK_EQ_INT(r.arc, PL_COMM_EAUTH);
    CHECK_EQ_INT(r.crc, PL_COMM_EAUTH);
    /* the listener is unaffected: the right token still gets in */
    r = connect_pair(l, ident(0, "a", TOKEN, 1), ident(1, "b", TOKEN, 1), -1);
    pl_listener_close(l);
    CHECK_EQ_INT(r.arc, 0);
    CHECK_EQ_INT(r.crc, 0);
    close_pair(&r);
    /* no token at all is a caller error */
    pl_comm_ident bad = ident(1, "b", "", 1);
    pl_conn *c;
    CHECK_EQ_INT(pl_conn_connect(HOST, 1, &bad, -1, 100, &c, err, sizeof err), PL_COMM_EINVAL);
}

static void test_stale_generation_refused(void)
{
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    pair_result r = connect_pair(l, ident(0, "a", TOKEN, 8), ident(1, "b", TOKEN, 7), -1);
    CHECK_EQ_INT(r.arc, PL_COMM_ESTALE);
    CHECK_EQ_INT(r.crc, PL_COMM_ESTALE);
    CHECK_STR_CONTAINS(r.aerr, "generation 7");
    CHECK_STR_CONTAINS(r.cerr, "stale");
    /* the wrong rank is refused when the dialer expects another */
    r = connect_pair(l, ident(4, "a", TOKEN, 8), ident(1, "b", TOKEN, 8), 3);
    pl_listener_close(l);
    CHECK_EQ_INT(r.crc, PL_COMM_EPROTO);
    CHECK_EQ_INT(r.arc, PL_COMM_EPROTO);
    CHECK_STR_CONTAINS(r.cerr, "expected rank 3");
    CHECK_STR_CONTAINS(r.aerr, "unexpected rank");
}

/* ---- purpose ---- */

static pl_comm_ident with_purpose(pl_comm_ident id, pl_conn_purpose purpose)
{
    id.purpose = purpose;
    return id;
}

static void test_purpose_accepted(void)
{
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    /* the purpose the acceptor takes: both ends know it */
    pair_result r = connect_pair(l, with_purpose(ident(0, "a", TOKEN, 5), PL_CONN_STAGE_LINK),
                                 with_purpose(ident(1, "b", TOKEN, 5), PL_CONN_STAGE_LINK), 0);
    int ok = r.arc == 0 && r.crc == 0 && pl_conn_purpose_of(r.a) == PL_CONN_STAGE_LINK &&
             pl_conn_purpose_of(r.c) == PL_CONN_STAGE_LINK;
    close_pair(&r);
    /* an acceptor of any purpose learns the dialer's; a layer copy's dialer may have no rank */
    pair_result r2 = connect_pair(l, with_purpose(ident(0, "a", TOKEN, 5), PL_CONN_ANY),
                                  with_purpose(ident(PL_COMM_NO_RANK, "idle", TOKEN, 5),
                                               PL_CONN_LAYER_COPY), -1);
    pl_listener_close(l);
    if (!ok || r2.arc || r2.crc)
        printf("    accept: %s / %s\n    connect: %s / %s\n", r.aerr, r2.aerr, r.cerr, r2.cerr);
    CHECK(ok);
    CHECK_EQ_INT(r2.arc, 0);
    CHECK_EQ_INT(r2.crc, 0);
    CHECK_EQ_INT(pl_conn_purpose_of(r2.a), PL_CONN_LAYER_COPY);
    CHECK_EQ_INT(pl_conn_peer_rank(r2.a), PL_COMM_NO_RANK);
    close_pair(&r2);
}

static void test_wrong_purpose_refused(void)
{
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    pair_result r = connect_pair(l, with_purpose(ident(0, "a", TOKEN, 5), PL_CONN_STAGE_LINK),
                                 with_purpose(ident(1, "b", TOKEN, 5), PL_CONN_RING), 0);
    CHECK_EQ_INT(r.arc, PL_COMM_EPROTO);
    CHECK_EQ_INT(r.crc, PL_COMM_EPROTO);
    CHECK(r.a == NULL && r.c == NULL);
    /* each side names both purposes */
    CHECK_STR_CONTAINS(r.aerr, "wrong connection purpose");
    CHECK_STR_CONTAINS(r.aerr, "dials a ring connection");
    CHECK_STR_CONTAINS(r.aerr, "accepts stage link connections");
    CHECK_STR_CONTAINS(r.cerr, "wrong connection purpose");
    CHECK_STR_CONTAINS(r.cerr, "accepts stage link connections");
    CHECK_STR_CONTAINS(r.cerr, "dials a ring connection");
    /* the listener is unaffected */
    r = connect_pair(l, with_purpose(ident(0, "a", TOKEN, 5), PL_CONN_RING),
                     with_purpose(ident(1, "b", TOKEN, 5), PL_CONN_RING), 0);
    pl_listener_close(l);
    CHECK(r.arc == 0 && r.crc == 0);
    close_pair(&r);
    /* a dialer names one purpose; only a layer copy's dialer may have no rank */
    pl_conn *c;
    pl_comm_ident any = with_purpose(ident(1, "b", TOKEN, 5), PL_CONN_ANY);
    CHECK_EQ_INT(pl_conn_connect(HOST, 1, &any, -1, 100, &c, err, sizeof err), PL_COMM_EINVAL);
    pl_comm_ident norank = with_purpose(ident(PL_COMM_NO_RANK, "b", TOKEN, 5), PL_CONN_RING);
    CHECK_EQ_INT(pl_conn_connect(HOST, 1, &norank, -1, 100, &c, err, sizeof err), PL_COMM_EINVAL);
}

/* A relay between a dialer and a listener that rewrites the purpose byte of the dialer's
 * hello (handshake.c's HELLO_PURPOSE_AT): the listener must refuse the
 * proof, as the purpose is part of what it proves. */
#define HELLO_PURPOSE_AT 123
typedef struct {
    int lfd, target_port, tamper_to;
} relay_job;

static void *relay_main(void *arg)
{
    relay_job *j = arg;
    int cfd = accept(j->lfd, NULL, NULL), sfd = cfd >= 0 ? raw_connect(j->target_port) : -1;
    size_t from_client = 0;
    while (cfd >= 0 && sfd >= 0) {
        struct pollfd pf[2] = {{.fd = cfd, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
        if (poll(pf, 2, 5000) <= 0) break;
        unsigned char buf[4096];
        const int from = pf[0].revents ? 0 : 1;
        ssize_t n = read(pf[from].fd, buf, sizeof buf);
        if (n <= 0) break;
        if (from == 0 && from_client <= HELLO_PURPOSE_AT && from_client + (size_t)n > HELLO_PURPOSE_AT)
            buf[HELLO_PURPOSE_AT - from_client] = (unsigned char)j->tamper_to;
        if (from == 0) from_client += (size_t)n;
        if (write(pf[1 - from].fd, buf, (size_t)n) != n) break;
    }
    if (cfd >= 0) close(cfd);
    if (sfd >= 0) close(sfd);
    return NULL;
}

static void test_purpose_is_authenticated(void)
{
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0 &&
          getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
    relay_job rj = {.lfd = lfd, .target_port = pl_listener_port(l),
                    .tamper_to = PL_CONN_STAGE_LINK};
    pthread_t rt, at;
    pthread_create(&rt, NULL, relay_main, &rj);
    accept_job j = {.l = l, .id = with_purpose(ident(0, "a", TOKEN, 5), PL_CONN_ANY),
                    .timeout_ms = 5000};
    pthread_create(&at, NULL, accept_main, &j);
    pl_comm_ident dial = with_purpose(ident(1, "b", TOKEN, 5), PL_CONN_RING);
    pl_conn *c = NULL;
    int crc = pl_conn_connect(HOST, ntohs(sa.sin_port), &dial, -1, 5000, &c, err, sizeof err);
    pthread_join(at, NULL);
    pthread_join(rt, NULL);
    close(lfd);
    pl_listener_close(l);
    pl_conn_close(c);
    pl_conn_close(j.c);
    CHECK_EQ_INT(j.rc, PL_COMM_EAUTH);
    CHECK_EQ_INT(crc, PL_COMM_EAUTH);
    CHECK_STR_CONTAINS(j.err, "failed authentication");
}

/* ---- frames ---- */

typedef struct {
    pl_conn *c;
    const size_t *sizes;
    int n;
    int rc;
    char err[256];
} sender_job;

static unsigned char pattern(size_t i, size_t size) { return (unsigned char)(i * 131 + size * 7 + 1); }

static void *send_sizes_main(void *arg)
{
    sender_job *j = arg;
    unsigned char *buf = malloc(16u << 20);
    for (int k = 0; k < j->n && !j->rc; k++) {
        for (size_t i = 0; i < j->sizes[k]; i++)
            buf[i] = pattern(i, j->sizes[k]);
        j->rc = pl_conn_send_frame(j->c, PL_FRAME_USER, (uint32_t)k, (uint32_t)(k * 3), buf,
                                   j->sizes[k], 5000, j->err, sizeof j->err);
    }
    free(buf);
    return NULL;
}

static void test_frames_many_sizes(void)
{
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    pair_result r = connect_pair(l, ident(0, "a", TOKEN, 1), ident(1, "b", TOKEN, 1), -1);
    pl_listener_close(l);
    CHECK(r.arc == 0 && r.crc == 0);
    static const size_t sizes[] = {0, 1, 2, 7, 31, 32, 33, 1000, 4095, 4096, 65536, 65537,
                                   (1u << 20) + 3, 0, 5, 13u << 20};
    int n = (int)(sizeof sizes / sizeof sizes[0]);
    sender_job j = {.c = r.c, .sizes = sizes, .n = n};
    pthread_t t;
    pthread_create(&t, NULL, send_sizes_main, &j);
    unsigned char *buf = malloc(16u << 20);
    int bad = 0;
    for (int k = 0; k < n && !bad; k++) {
        pl_frame_hdr h;
        int rc;
        void *p = NULL;
        if (k % 2) {
            rc = pl_conn_recv_frame(r.a, &h, buf, 16u << 20, 5000, err, sizeof err);
            p = buf;
        } else {
            rc = pl_conn_recv_frame_alloc(r.a, &h, &p, 5000, err, sizeof err);
        }
        if (rc || h.tag != (uint32_t)k || h.aux != (uint32_t)(k * 3) || h.len != sizes[k]) {
            printf("    frame %d: rc %d (%s) len %llu\n", k, rc, err, (unsigned long long)h.len);
            bad = 1;
        }
        for (size_t i = 0; !bad && i < sizes[k]; i++)
            if (((unsigned char *)p)[i] != pattern(i, sizes[k])) {
                printf("    frame %d: byte %zu differs\n", k, i);
                bad = 1;
            }
        if (p != buf)
            free(p);
    }
    pthread_join(t, NULL);
    free(buf);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(j.rc, 0);

    /* a frame over the maximum is refused on send (EINVAL, connection intact) ... */
    pl_conn_set_max_frame(r.c, 100);
    char small[200] = {0};
    CHECK_EQ_INT(pl_conn_send_frame(r.c, PL_FRAME_USER, 0, 0, small, 101, 1000, err, sizeof err),
                 PL_COMM_EINVAL);
    CHECK_EQ_INT(pl_conn_status(r.c), 0);
    /* ... and on receive it is a protocol error that breaks the connection */
    pl_conn_set_max_frame(r.c, 1000);
    pl_conn_set_max_frame(r.a, 100);
    CHECK_EQ_INT(pl_conn_send_frame(r.c, PL_FRAME_USER, 0, 0, small, 150, 1000, err, sizeof err), 0);
    pl_frame_hdr h;
    CHECK_EQ_INT(pl_conn_recv_frame(r.a, &h, small, sizeof small, 1000, err, sizeof err),
                 PL_COMM_EPROTO);
    CHECK_STR_CONTAINS(err, "exceeds the maximum");
    CHECK_EQ_INT(pl_conn_status(r.a), PL_COMM_EPROTO);
    CHECK_EQ_INT(pl_conn_recv_frame(r.a, &h, small, sizeof small, 1000, err, sizeof err),
                 PL_COMM_EPROTO);
    CHECK_STR_CONTAINS(err, "broken");
    close_pair(&r);
}

typedef struct {
    pl_conn *c;
    const float *x;
    size_t n;
    uint32_t tag;
    int rc;
    char err[256];
} floats_job;

static void *send_floats_main(void *arg)
{
    floats_job *j = arg;
    j->rc = pl_conn_send_floats(j->c, j->tag, j->x, j->n, 5000, j->err, sizeof j->err);
    return NULL;
}

static void test_tensor_stream(void)
{
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    pair_result r = connect_pair(l, ident(0, "a", TOKEN, 1), ident(1, "b", TOKEN, 1), -1);
    pl_listener_close(l);
    CHECK(r.arc == 0 && r.crc == 0);
    /* tensor chunks do not depend on either end's maximum frame size */
    pl_conn_set_max_frame(r.a, 100);
    pl_conn_set_max_frame(r.c, 1000);
    const size_t sizes[] = {0, 1, 1000, 3 * (PL_COMM_TENSOR_CHUNK_BYTES / 4) + 17};
    for (int k = 0; k < 4; k++) {
        size_t n = sizes[k];
        float *x = malloc((n + 1) * sizeof(float)), *y = malloc((n + 1) * sizeof(float));
        for (size_t i = 0; i < n; i++)
            x[i] = (float)i * 0.25f - 7.0f;
        floats_job j = {.c = r.c, .x = x, .n = n, .tag = 40 + (uint32_t)k};
        pthread_t t;
        pthread_create(&t, NULL, send_floats_main, &j);
        int rc = pl_conn_recv_floats(r.a, 40 + (uint32_t)k, y, n, 5000, err, sizeof err);
        pthread_join(t, NULL);
        int same = rc == 0 && j.rc == 0 && (n == 0 || memcmp(x, y, n * sizeof(float)) == 0);
        free(x);
        free(y);
        if (!same)
            printf("    n=%zu: recv %d (%s), send %d (%s)\n", n, rc, err, j.rc, j.err);
        CHECK(same);
    }
    /* the receiver asking for another tag gets a protocol error */
    float v[4] = {1, 2, 3, 4}, w[4];
    CHECK_EQ_INT(pl_conn_send_floats(r.c, 5, v, 4, 1000, err, sizeof err), 0);
    CHECK_EQ_INT(pl_conn_recv_floats(r.a, 6, w, 4, 1000, err, sizeof err), PL_COMM_EPROTO);
    CHECK_STR_CONTAINS(err, "tag 6");
    close_pair(&r);
}

/* ---- timeouts and closed peers ---- */

static void test_timeouts_silent_peer(void)
{
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    pl_comm_ident a = ident(0, "a", TOKEN, 1), b = ident(1, "b", TOKEN, 1);
    pl_conn *c = NULL;
    /* nobody connects */
    double t0 = (pl_now_ms() / 1e3);
    CHECK_EQ_INT(pl_listener_accept(l, &a, 150, &c, err, sizeof err), PL_COMM_ETIMEOUT);
    CHECK((pl_now_ms() / 1e3) - t0 < 2.0);
    /* a TCP peer that connects but never speaks */
    int fd = raw_connect(pl_listener_port(l));
    CHECK(fd >= 0);
    t0 = (pl_now_ms() / 1e3);
    int rc = pl_listener_accept(l, &a, 200, &c, err, sizeof err);
    double dt = (pl_now_ms() / 1e3) - t0;
    CHECK_EQ_INT(rc, PL_COMM_ETIMEOUT);
    CHECK(dt >= 0.15 && dt < 2.0);
    CHECK_STR_CONTAINS(err, "hello");
    close(fd);
    /* dialing a socket that accepts TCP but never speaks */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0);
    CHECK(getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
    rc = pl_conn_connect(HOST, ntohs(sa.sin_port), &b, -1, 200, &c, err, sizeof err);
    close(lfd);
    CHECK_EQ_INT(rc, PL_COMM_ETIMEOUT);

    /* an established but silent peer: a receive times out and the connection survives */
    pair_result r = connect_pair(l, a, b, -1);
    pl_listener_close(l);
    CHECK(r.arc == 0 && r.crc == 0);
    char buf[64];
    pl_frame_hdr h;
    t0 = (pl_now_ms() / 1e3);
    CHECK_EQ_INT(pl_conn_recv_frame(r.a, &h, buf, sizeof buf, 100, err, sizeof err),
                 PL_COMM_ETIMEOUT);
    CHECK((pl_now_ms() / 1e3) - t0 < 2.0);
    CHECK_EQ_INT(pl_conn_status(r.a), 0);
    CHECK_EQ_INT(pl_conn_send_frame(r.c, PL_FRAME_USER, 1, 0, "x", 1, 1000, err, sizeof err), 0);
    CHECK_EQ_INT(pl_conn_recv_frame(r.a, &h, buf, sizeof buf, 1000, err, sizeof err), 0);
    /* a peer that stops reading: a large send times out and breaks the connection */
    size_t big = 48u << 20;
    char *p = calloc(1, big);
    pl_conn_set_max_frame(r.c, big);
    t0 = (pl_now_ms() / 1e3);
    rc = pl_conn_send_frame(r.c, PL_FRAME_USER, 2, 0, p, big, 150, err, sizeof err);
    free(p);
    CHECK_EQ_INT(rc, PL_COMM_ETIMEOUT);
    CHECK((pl_now_ms() / 1e3) - t0 < 3.0);
    CHECK_EQ_INT(pl_conn_status(r.c), PL_COMM_ETIMEOUT);
    close_pair(&r);
}

static void test_closed_peer(void)
{
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    int port = pl_listener_port(l);
    pl_comm_ident a = ident(0, "a", TOKEN, 1), b = ident(1, "b", TOKEN, 1);
    pair_result r = connect_pair(l, a, b, -1);
    pl_listener_close(l);
    CHECK(r.arc == 0 && r.crc == 0);
    /* the peer closes: a receive reports it as closed (not a timeout) */
    pl_conn_close(r.c);
    r.c = NULL;
    char buf[64];
    pl_frame_hdr h;
    CHECK_EQ_INT(pl_conn_recv_frame(r.a, &h, buf, sizeof buf, 1000, err, sizeof err),
                 PL_COMM_ECLOSED);
    CHECK_STR_CONTAINS(err, "closed the connection");
    pl_conn_close(r.a);
    /* sending to a closed peer: the first sends may still be buffered, then ECLOSED */
    CHECK_EQ_INT(pl_listener_open(HOST, port, &l, err, sizeof err), 0);
    r = connect_pair(l, a, b, -1);
    pl_listener_close(l);
    CHECK(r.arc == 0 && r.crc == 0);
    pl_conn_close(r.a);
    r.a = NULL;
    int rc = 0;
    for (int i = 0; i < 100 && rc == 0; i++)
        rc = pl_conn_send_frame(r.c, PL_FRAME_USER, 0, 0, buf, sizeof buf, 1000, err, sizeof err);
    CHECK_EQ_INT(rc, PL_COMM_ECLOSED);
    CHECK_EQ_INT(pl_conn_status(r.c), PL_COMM_ECLOSED);
    pl_conn_close(r.c);
    /* nobody listening any more: retries until the deadline, then a timeout naming the cause */
    pl_conn *c;
    double t0 = (pl_now_ms() / 1e3);
    rc = pl_conn_connect(HOST, port, &b, -1, 300, &c, err, sizeof err);
    CHECK_EQ_INT(rc, PL_COMM_ETIMEOUT);
    CHECK((pl_now_ms() / 1e3) - t0 >= 0.25);
    CHECK_STR_CONTAINS(err, "refused");
}

/* A peer that sends a plausible hello one byte every 100 ms: the handshake's deadline is
 * total, so it ends there whatever trickles in. */
typedef struct {
    int fd;
    volatile int stop;
} trickle_job;

static void *trickle_main(void *arg)
{
    trickle_job *j = arg;
    static const char hello[] = "PLNTHSK1\003\0\0\0";
    for (size_t i = 0; !j->stop; i++) {
        char b = i < sizeof hello - 1 ? hello[i] : 0;
        if (send(j->fd, &b, 1, MSG_NOSIGNAL) != 1) break;
        usleep(100 * 1000);
    }
    return NULL;
}

static void test_a_trickling_peer_fails_at_the_total_deadline(void)
{
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    pl_comm_ident a = ident(0, "a", TOKEN, 1), b = ident(1, "b", TOKEN, 1);
    /* accepting: the dialer trickles */
    trickle_job tj = {.fd = raw_connect(pl_listener_port(l))};
    pthread_t t;
    pthread_create(&t, NULL, trickle_main, &tj);
    pl_conn *c = NULL;
    double t0 = pl_now_ms();
    int rc = pl_listener_accept(l, &a, 600, &c, err, sizeof err);
    double waited = pl_now_ms() - t0;
    tj.stop = 1;
    pthread_join(t, NULL);
    close(tj.fd);
    pl_listener_close(l);
    CHECK_EQ_INT(rc, PL_COMM_ETIMEOUT);
    CHECK(waited >= 550 && waited < 1500);
    CHECK_STR_CONTAINS(err, "waiting for hello");
    /* dialing: the listener trickles */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0 &&
          getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
    pthread_t d;
    dial_job dj = {.port = ntohs(sa.sin_port), .id = b, .timeout_ms = 600};
    pthread_create(&d, NULL, dial_main, &dj);
    trickle_job tl = {.fd = accept(lfd, NULL, NULL)};
    pthread_create(&t, NULL, trickle_main, &tl);
    pthread_join(d, NULL);
    tl.stop = 1;
    pthread_join(t, NULL);
    close(tl.fd);
    close(lfd);
    CHECK_EQ_INT(dj.rc, PL_COMM_ETIMEOUT);
    CHECK(dj.ms >= 550 && dj.ms < 1500);
}

/* ---- meshes and all-reduce ---- */

typedef struct {
    pl_listener *l;
    int nranks;
    const char **hosts;
    const int *ports;
    pl_conn *conns[2];
    int rc;
    char err[256];
} mesh0_job;

static void *mesh0_main(void *arg)
{
    mesh0_job *j = arg;
    pl_comm_ident id = ident(0, "w0", TOKEN, 2);
    j->rc = pl_comm_mesh(j->l, &id, j->nranks, j->hosts, j->ports, 10000, j->conns, j->err,
                         sizeof j->err);
    return NULL;
}

static void test_mesh_ignores_strangers(void)
{
    /* while rank 0 waits for rank 1, a peer of another job and a peer that hangs up are
     * refused without disturbing the mesh */
    char err[256];
    pl_listener *l;
    CHECK_EQ_INT(pl_listener_open(HOST, 0, &l, err, sizeof err), 0);
    const char *hosts[2] = {HOST, HOST};
    int ports[2] = {pl_listener_port(l), 0};
    mesh0_job j = {.l = l, .nranks = 2, .hosts = hosts, .ports = ports};
    pthread_t t;
    pthread_create(&t, NULL, mesh0_main, &j);
    pl_comm_ident intruder = ident(1, "w1", "another-job", 2);
    pl_conn *c = NULL;
    int irc = pl_conn_connect(HOST, ports[0], &intruder, 0, 5000, &c, err, sizeof err);
    int fd = raw_connect(ports[0]);
    if (fd >= 0)
        close(fd);
    pl_comm_ident w1 = ident(1, "w1", TOKEN, 2);
    pl_conn *conns1[2] = {NULL, NULL};
    int rc1 = pl_comm_mesh(NULL, &w1, 2, hosts, ports, 10000, conns1, err, sizeof err);
    pthread_join(t, NULL);
    pl_listener_close(l);
    int ok = irc == PL_COMM_EAUTH && rc1 == 0 && j.rc == 0 && j.conns[1] && conns1[0] &&
             !j.conns[0] && !conns1[1] && pl_conn_peer_rank(j.conns[1]) == 1;
    if (!ok)
        printf("    intruder %d, rank 1: %d (%s), rank 0: %d (%s)\n", irc, rc1, err, j.rc, j.err);
    pl_conn_close(j.conns[1]);
    pl_conn_close(conns1[0]);
    CHECK(ok);
}

#define MAXR 6

typedef struct {
    int nranks;
    pl_conn *conn[MAXR][MAXR]; /* conn[r][s]: rank r's connection to rank s */
} mesh;

typedef struct {
    pl_listener *l;
    pl_comm_ident id;
    int nranks;
    const char **hosts;
    const int *ports;
    pl_conn **out;
    int rc;
    char err[256];
} mesh_job;

static void *mesh_main(void *arg)
{
    mesh_job *j = arg;
    j->rc = pl_comm_mesh(j->l, &j->id, j->nranks, j->hosts, j->ports, 10000, j->out, j->err,
                         sizeof j->err);
    return NULL;
}

static int mesh_open(mesh *m, int n)
{
    memset(m, 0, sizeof *m);
    m->nranks = n;
    pl_listener *ls[MAXR];
    const char *hosts[MAXR];
    int ports[MAXR];
    char err[256];
    static const char *names[MAXR] = {"w0", "w1", "w2", "w3", "w4", "w5"};
    for (int r = 0; r < n; r++) {
        if (pl_listener_open(HOST, 0, &ls[r], err, sizeof err))
            return -1;
        hosts[r] = HOST;
        ports[r] = pl_listener_port(ls[r]);
    }
    mesh_job jobs[MAXR];
    pthread_t t[MAXR];
    for (int r = 0; r < n; r++) {
        jobs[r] = (mesh_job){.l = ls[r], .id = ident(r, names[r], TOKEN, 2), .nranks = n,
                             .hosts = hosts, .ports = ports, .out = m->conn[r]};
        pthread_create(&t[r], NULL, mesh_main, &jobs[r]);
    }
    int bad = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(t[r], NULL);
        if (jobs[r].rc) {
            printf("    mesh rank %d: %s\n", r, jobs[r].err);
            bad = 1;
        }
        pl_listener_close(ls[r]);
    }
    return bad ? -1 : 0;
}

static void mesh_close(mesh *m)
{
    for (int r = 0; r < m->nranks; r++)
        for (int s = 0; s < m->nranks; s++) {
            pl_conn_close(m->conn[r][s]);
            m->conn[r][s] = NULL;
        }
}

/* One collective in a program that every rank runs in order. */
typedef struct {
    int32_t group[MAXR];
    int p;
    size_t n;
    uint32_t tag;
    float *in[MAXR];  /* per group position: the input */
    float *out[MAXR]; /* per group position: the result */
    int rc[MAXR];
    char err[MAXR][256];
    int ntensors; /* > 0: use pl_ring_allreduce_many with these splits */
    size_t split[8];
} coll;

typedef struct {
    mesh *m;
    int rank;
    coll *ops;
    int nops;
    int timeout_ms;
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    pl_peer_table pt = {.self = j->rank, .nranks = j->m->nranks, .conn = j->m->conn[j->rank]};
    for (int k = 0; k < j->nops; k++) {
        coll *o = &j->ops[k];
        int pos = -1;
        for (int i = 0; i < o->p; i++)
            if (o->group[i] == j->rank)
                pos = i;
        if (pos < 0)
            continue;
        memcpy(o->out[pos], o->in[pos], o->n * sizeof(float));
        if (o->ntensors > 0) {
            pl_tensor_ref t[8];
            size_t off = 0;
            for (int i = 0; i < o->ntensors; i++) {
                t[i] = (pl_tensor_ref){o->out[pos] + off, o->split[i]};
                off += o->split[i];
            }
            pl_ar_pack pack = {0}; /* a kept buffer: grown on the first call */
            o->rc[pos] = pl_ring_allreduce_many(&pt, o->group, o->p, t, o->ntensors, o->tag,
                                                &pack, j->timeout_ms, o->err[pos],
                                                sizeof o->err[pos]);
            pl_ar_pack_free(&pack);
        } else {
            o->rc[pos] = pl_ring_allreduce(&pt, o->group, o->p, o->out[pos], o->n, o->tag,
                                           j->timeout_ms, o->err[pos], sizeof o->err[pos]);
        }
    }
    return NULL;
}

static void run_program(mesh *m, coll *ops, int nops, int timeout_ms)
{
    rank_job jobs[MAXR];
    pthread_t t[MAXR];
    for (int r = 0; r < m->nranks; r++) {
        jobs[r] = (rank_job){m, r, ops, nops, timeout_ms};
        pthread_create(&t[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < m->nranks; r++)
        pthread_join(t[r], NULL);
}

static float rand_float(void)
{
    return (float)((double)(rng_next() >> 11) / 9007199254740992.0 * 2.0 - 1.0) *
           (float)(1 << rng_range(0, 6));
}

static void coll_init(coll *o, const int32_t *group, int p, size_t n, uint32_t tag)
{
    memset(o, 0, sizeof *o);
    memcpy(o->group, group, (size_t)p * sizeof *group);
    o->p = p;
    o->n = n;
    o->tag = tag;
    for (int i = 0; i < p; i++) {
        o->in[i] = malloc((n + 1) * sizeof(float));
        o->out[i] = malloc((n + 1) * sizeof(float));
        for (size_t e = 0; e < n; e++)
            o->in[i][e] = rand_float();
    }
}

static void coll_free(coll *o)
{
    for (int i = 0; i < o->p; i++) {
        free(o->in[i]);
        free(o->out[i]);
    }
}

/* 0 when every member succeeded, all results are bitwise equal, equal bitwise to the
 * ring-order sum and close to the exact sum. */
static int coll_verify(const coll *o)
{
    int p = o->p;
    for (int i = 0; i < p; i++)
        if (o->rc[i]) {
            printf("    member %d (rank %d): %s\n", i, (int)o->group[i], o->err[i]);
            return -1;
        }
    size_t q = o->n / (size_t)p, rem = o->n % (size_t)p;
    for (size_t e = 0; e < o->n; e++) {
        /* segment of e, as the ring splits it */
        int s = 0;
        for (s = 0; s < p - 1; s++) {
            size_t us = (size_t)(s + 1), begin = us * q + (us < rem ? us : rem);
            if (e < begin)
                break;
        }
        float ring = o->in[s][e];
        double exact = o->in[s][e];
        for (int k = 1; k < p; k++) {
            ring = ring + o->in[(s + k) % p][e];
            exact += o->in[(s + k) % p][e];
        }
        for (int i = 0; i < p; i++)
            if (memcmp(&o->out[i][e], &ring, sizeof ring) != 0) {
                printf("    p=%d n=%zu element %zu: member %d has %.9g, ring order gives %.9g\n",
                       p, o->n, e, i, (double)o->out[i][e], (double)ring);
                return -1;
            }
        if (fabs((double)ring - exact) > 1e-5 * (1.0 + fabs(exact)) * p) {
            printf("    element %zu: %.9g vs exact %.9g\n", e, (double)ring, exact);
            return -1;
        }
    }
    return 0;
}

static void random_group(int32_t *g, int p, int nranks)
{
    int32_t all[MAXR];
    for (int i = 0; i < nranks; i++)
        all[i] = i;
    for (int i = nranks - 1; i > 0; i--) {
        int j = (int)rng_range(0, i);
        int32_t t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    memcpy(g, all, (size_t)p * sizeof *g);
}

static void test_allreduce_group_sizes(void)
{
    mesh m;
    CHECK_EQ_INT(mesh_open(&m, 5), 0);
    rng_state = 1234;
    enum { NOPS = 30 };
    static coll ops[NOPS];
    for (int k = 0; k < NOPS; k++) {
        int p = 1 + k % 5;
        int32_t g[MAXR];
        random_group(g, p, 5);
        size_t n;
        switch (k / 5) {
        case 0: n = (size_t)rng_range(0, p - 1); break;         /* fewer elements than members */
        case 1: n = (size_t)p * 37 + (size_t)(p > 1); break;    /* not divisible */
        case 2: n = (size_t)rng_range(1, 5000); break;
        case 3: n = (size_t)rng_range(100000, 400000); break;   /* several chunks */
        default: n = (size_t)rng_range(0, 70000); break;
        }
        coll_init(&ops[k], g, p, n, 100 + (uint32_t)k);
    }
    run_program(&m, ops, NOPS, 10000);
    int bad = 0;
    for (int k = 0; k < NOPS && !bad; k++)
        bad = coll_verify(&ops[k]) != 0;
    for (int k = 0; k < NOPS; k++)
        coll_free(&ops[k]);
    for (int r = 0; r < 5; r++)
        for (int s = 0; s < 5; s++)
            if (m.conn[r][s] && pl_conn_status(m.conn[r][s]))
                bad = 1;
    mesh_close(&m);
    CHECK_EQ_INT(bad, 0);
}

static void test_allreduce_overlapping_groups(void)
{
    mesh m;
    CHECK_EQ_INT(mesh_open(&m, 5), 0);
    rng_state = 99;
    /* ranks 1 and 2 are in both groups, in opposite ring order; then the first group again,
     * a 2-group on ranks shared by both, and a multi-tensor collective */
    static const int32_t ga[] = {0, 1, 2}, gb[] = {2, 4, 1, 3}, gc[] = {1, 2};
    static coll ops[5];
    coll_init(&ops[0], ga, 3, 50001, 7);
    coll_init(&ops[1], gb, 4, 130003, 7);
    coll_init(&ops[2], ga, 3, 10, 8);
    coll_init(&ops[3], gc, 2, 200000, 9);
    coll_init(&ops[4], gb, 4, 3 + 0 + 100000 + 17, 10);
    ops[4].ntensors = 4;
    ops[4].split[0] = 3;
    ops[4].split[1] = 0;
    ops[4].split[2] = 100000;
    ops[4].split[3] = 17;
    run_program(&m, ops, 5, 10000);
    int bad = 0;
    for (int k = 0; k < 5 && !bad; k++)
        bad = coll_verify(&ops[k]) != 0;
    for (int k = 0; k < 5; k++)
        coll_free(&ops[k]);
    mesh_close(&m);
    CHECK_EQ_INT(bad, 0);
}

static void test_allreduce_deterministic(void)
{
    /* the same inputs and group order give the same bits on a second run */
    mesh m;
    CHECK_EQ_INT(mesh_open(&m, 3), 0);
    rng_state = 5;
    static const int32_t g[] = {2, 0, 1};
    static coll ops[2];
    coll_init(&ops[0], g, 3, 77777, 1);
    coll_init(&ops[1], g, 3, 77777, 2);
    for (int i = 0; i < 3; i++)
        memcpy(ops[1].in[i], ops[0].in[i], 77777 * sizeof(float));
    run_program(&m, ops, 2, 10000);
    int bad = coll_verify(&ops[0]) || coll_verify(&ops[1]);
    for (int i = 0; i < 3 && !bad; i++)
        bad = memcmp(ops[0].out[i], ops[1].out[i], 77777 * sizeof(float)) != 0;
    coll_free(&ops[0]);
    coll_free(&ops[1]);
    mesh_close(&m);
    CHECK_EQ_INT(bad, 0);
}

static void test_allreduce_errors(void)
{
    mesh m;
    CHECK_EQ_INT(mesh_open(&m, 3), 0);
    char err[256];
    float x[8] = {0};
    pl_peer_table pt = {.self = 0, .nranks = 3, .conn = m.conn[0]};
    const int32_t not_me[] = {1, 2}, dup[] = {0, 1, 1}, out_of_range[] = {0, 5};
    CHECK_EQ_INT(pl_ring_allreduce(&pt, not_me, 2, x, 8, 0, 100, err, sizeof err), PL_COMM_EINVAL);
    CHECK_EQ_INT(pl_ring_allreduce(&pt, dup, 3, x, 8, 0, 100, err, sizeof err), PL_COMM_EINVAL);
    CHECK_EQ_INT(pl_ring_allreduce(&pt, out_of_range, 2, x, 8, 0, 100, err, sizeof err),
                 PL_COMM_EINVAL);
    /* a group of one is a no-op */
    const int32_t solo[] = {0};
    x[0] = 3;
    CHECK_EQ_INT(pl_ring_allreduce(&pt, solo, 1, x, 8, 0, 100, err, sizeof err), 0);
    CHECK(x[0] == 3);

    /* members disagreeing on the tag: both get a protocol error */
    rng_state = 3;
    static const int32_t g2[] = {0, 1};
    static coll ops[1];
    coll_init(&ops[0], g2, 2, 1000, 1);
    rank_job j0 = {&m, 0, ops, 1, 2000};
    coll other;
    coll_init(&other, g2, 2, 1000, 2);
    rank_job j1 = {&m, 1, &other, 1, 2000};
    pthread_t t0, t1;
    pthread_create(&t0, NULL, rank_main, &j0);
    pthread_create(&t1, NULL, rank_main, &j1);
    pthread_join(t0, NULL);
    pthread_join(t1, NULL);
    int rc0 = ops[0].rc[0], rc1 = other.rc[1];
    coll_free(&ops[0]);
    coll_free(&other);
    CHECK_EQ_INT(rc0, PL_COMM_EPROTO);
    CHECK_EQ_INT(rc1, PL_COMM_EPROTO);
    CHECK_EQ_INT(pl_conn_status(m.conn[0][1]), PL_COMM_EPROTO);

    /* a member that never shows up: the others time out; one that closes: ECLOSED */
    static const int32_t g3[] = {0, 1, 2};
    coll_init(&ops[0], g3, 3, 5000, 3);
    rank_job j2 = {&m, 2, ops, 1, 200};
    pthread_create(&t0, NULL, rank_main, &j2); /* rank 2 alone; rank 0 (its next) is silent */
    pthread_join(t0, NULL);
    int rc2 = ops[0].rc[2];
    coll_free(&ops[0]);
    CHECK_EQ_INT(rc2, PL_COMM_ETIMEOUT);
    /* the connection it waited on (its prev, rank 1) failed; its next is only out of step */
    CHECK_EQ_INT(pl_conn_status(m.conn[2][1]), PL_COMM_ETIMEOUT);
    CHECK_EQ_INT(pl_conn_status(m.conn[2][0]), PL_COMM_ECANCELED);
    mesh_close(&m);

    CHECK_EQ_INT(mesh_open(&m, 2), 0);
    pl_conn_close(m.conn[1][0]);
    m.conn[1][0] = NULL;
    pt = (pl_peer_table){.self = 0, .nranks = 2, .conn = m.conn[0]};
    float big[4096] = {0};
    CHECK_EQ_INT(pl_ring_allreduce(&pt, g2, 2, big, 4096, 0, 2000, err, sizeof err),
                 PL_COMM_ECLOSED);
    /* a missing neighbour connection is a caller error */
    pt = (pl_peer_table){.self = 1, .nranks = 2, .conn = m.conn[1]};
    CHECK_EQ_INT(pl_ring_allreduce(&pt, g2, 2, big, 4096, 0, 2000, err, sizeof err),
                 PL_COMM_EINVAL);
    mesh_close(&m);
}

TEST_MAIN_BEGIN
RUN(test_handshake_ok);
RUN(test_wrong_token_refused);
RUN(test_silent_peer_keepalive);
RUN(test_stale_generation_refused);
RUN(test_purpose_accepted);
RUN(test_wrong_purpose_refused);
RUN(test_purpose_is_authenticated);
RUN(test_frames_many_sizes);
RUN(test_tensor_stream);
RUN(test_timeouts_silent_peer);
RUN(test_closed_peer);
RUN(test_a_trickling_peer_fails_at_the_total_deadline);
RUN(test_mesh_ignores_strangers);
RUN(test_allreduce_group_sizes);
RUN(test_allreduce_overlapping_groups);
RUN(test_allreduce_deterministic);
RUN(test_allreduce_errors);
TEST_MAIN_END
