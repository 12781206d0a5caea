/* Frame protection after the peer handshake (worker/comm/tcp.h "Frame protection"): the
 * protection and cipher both sides agree on, frames of every size through each mode, and
 * a relay in the middle that flips one bit (payload, header, tag), replays, reorders or
 * drops a frame: the receiver refuses it with an authentication error naming the peer and
 * the connection ends, on plain frames, tensors, the stage link and the ring all-reduce.
 * Peers are threads of this process on 127.0.0.1. */
#include "allreduce.h"
#include "check.h"
#include "loopback.h"
#include "stage_link.h"
#include "tcp.h"
#include "util.h"

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define TOKEN "frame-protection-token"
#define HOST "127.0.0.1"
/* One direction of the handshake (handshake.c): hello 126, proof 32, verdict 4 bytes. */
#define HANDSHAKE_BYTES 162

static pl_comm_ident ident(int rank, const char *name, pl_frame_protection p, pl_frame_cipher c)
{
    pl_comm_ident id = {.token = TOKEN, .token_len = strlen(TOKEN), .rank = rank, .name = name,
                        .generation = 4, .purpose = PL_CONN_RING, .protection = p, .cipher = c};
    return id;
}

/* ---- a relay between a dialer (the client) and a listener that acts on one frame of
 * the client's ---- */

typedef enum { FORWARD, FLIP_PAYLOAD, FLIP_HEADER, FLIP_TAG, REPLAY, SWAP, DROP } relay_action;

typedef struct {
    int lfd, port, target_port;
    relay_action action;
    int frame;     /* the client's frame acted on (0: the first after the handshake) */
    size_t mac;    /* tag bytes after each payload */
    unsigned char seen[16]; /* the first 16 payload bytes of the client's first frame */
    size_t nseen;
    pthread_t th;
} relay;

typedef struct {
    unsigned char *p;
    size_t len, cap;
} buf;

static void buf_add(buf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void buf_take(buf *b, size_t n)
{
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The client's complete frames in `in` (after the handshake), acted on and sent to sfd. */
static int relay_frames(relay *r, buf *in, size_t *skip, int *index, buf *held, int sfd)
{
    size_t n = *skip < in->len ? *skip : in->len;
    if (n && write_all(sfd, in->p, n)) return -1;
    buf_take(in, n);
    *skip -= n;
    while (*skip == 0 && in->len >= PL_FRAME_HDR_BYTES) {
        uint64_t len = 0;
        for (int i = 7; i >= 0; i--) len = (len << 8) | in->p[24 + i];
        const size_t total = PL_FRAME_HDR_BYTES + (size_t)len + r->mac;
        if (in->len < total) break;
        unsigned char *f = in->p;
        if (*index == 0) {
            r->nseen = len < sizeof r->seen ? (size_t)len : sizeof r->seen;
            memcpy(r->seen, f + PL_FRAME_HDR_BYTES, r->nseen);
        }
        const int me = *index == r->frame;
        int rc = 0;
        if (me && r->action == FLIP_PAYLOAD) f[PL_FRAME_HDR_BYTES + len / 2] ^= 0x10;
        if (me && r->action == FLIP_HEADER) f[12] ^= 0x01; /* aux */
        if (me && r->action == FLIP_TAG) f[total - 1] ^= 0x80;
        if (me && r->action == SWAP) {
            buf_add(held, f, total);
        } else if (!(me && r->action == DROP)) {
            rc = write_all(sfd, f, total);
            if (rc == 0 && me && r->action == REPLAY) rc = write_all(sfd, f, total);
            if (rc == 0 && *index == r->frame + 1 && held->len) rc = write_all(sfd, held->p, held->len);
        }
        buf_take(in, total);
        ++*index;
        if (rc) return -1;
    }
    return 0;
}

/* The listener's bytes back to the client, as they come. */
typedef struct {
    int from, to;
} plain_pipe;

static void *pipe_main(void *arg)
{
    plain_pipe *pp = arg;
    unsigned char chunk[65536];
    for (;;) {
        ssize_t n = read(pp->from, chunk, sizeof chunk);
        if (n <= 0 || write_all(pp->to, chunk, (size_t)n)) break;
    }
    shutdown(pp->from, SHUT_RDWR);
    shutdown(pp->to, SHUT_RDWR);
    return NULL;
}

/* The client's bytes to the listener, frame by frame (relay_frames); the other way on a
 * thread of its own, so that neither direction waits for the other. */
static void *relay_main(void *arg)
{
    relay *r = arg;
    int cfd = accept(r->lfd, NULL, NULL), sfd = cfd >= 0 ? connect_to(r->target_port) : -1;
    buf in = {0}, held = {0};
    size_t skip = HANDSHAKE_BYTES;
    int index = 0;
    plain_pipe back = {.from = sfd, .to = cfd};
    pthread_t bt;
    const int two = cfd >= 0 && sfd >= 0 && pthread_create(&bt, NULL, pipe_main, &back) == 0;
    while (two) {
        unsigned char chunk[65536];
        ssize_t n = read(cfd, chunk, sizeof chunk);
        if (n <= 0) break;
        buf_add(&in, chunk, (size_t)n);
        if (relay_frames(r, &in, &skip, &index, &held, sfd)) break;
    }
    if (cfd >= 0) shutdown(cfd, SHUT_RDWR);
    if (sfd >= 0) shutdown(sfd, SHUT_RDWR);
    if (two) pthread_join(bt, NULL);
    if (cfd >= 0) close(cfd);
    if (sfd >= 0) close(sfd);
    free(in.p);
    free(held.p);
    return NULL;
}

static void relay_start(relay *r, int target_port, relay_action action, int frame, size_t mac)
{
    memset(r, 0, sizeof *r);
    r->lfd = listen_loopback(&r->port);
    r->target_port = target_port;
    r->action = action;
    r->frame = frame;
    r->mac = mac;
    pthread_create(&r->th, NULL, relay_main, r);
}

static void relay_end(relay *r)
{
    pthread_join(r->th, NULL);
    close(r->lfd);
}

/* ---- a connected pair: the listener "a" (rank 0), the dialer "b" (rank 1) ---- */

typedef struct {
    pl_listener *l;
    pl_comm_ident id;
    pl_conn *c;
    int rc;
    char err[512];
} accept_job;

static void *accept_main(void *arg)
{
    accept_job *j = arg;
    j->rc = pl_listener_accept(j->l, &j->id, 5000, &j->c, j->err, sizeof j->err);
    return NULL;
}

typedef struct {
    pl_conn *a, *b; /* a accepted, b dialed */
    relay r;
    int via_relay;
} pair;

/* b dials a directly, or through a relay that takes `action` on frame `frame` of b's. */
static int pair_open(pair *p, pl_comm_ident ia, pl_comm_ident ib, int via_relay,
                     relay_action action, int frame)
{
    char err[512];
    memset(p, 0, sizeof *p);
    accept_job j = {.id = ia};
    if (pl_listener_open(HOST, 0, &j.l, err, sizeof err)) return -1;
    int port = pl_listener_port(j.l);
    p->via_relay = via_relay;
    if (via_relay) {
        const int prot = ia.protection > ib.protection ? ia.protection : ib.protection;
        relay_start(&p->r, port, action, frame,
                    prot == PL_PROTECT_NONE ? 0 : PL_FRAME_TAG_BYTES);
        port = p->r.port;
    }
    pthread_t t;
    pthread_create(&t, NULL, accept_main, &j);
    int rc = pl_conn_connect(HOST, port, &ib, 0, 5000, &p->b, err, sizeof err);
    pthread_join(t, NULL);
    pl_listener_close(j.l);
    if (rc || j.rc) printf("    dial: %s\n    accept: %s\n", rc ? err : "", j.rc ? j.err : "");
    p->a = j.c;
    return rc || j.rc ? -1 : 0;
}

static void pair_close(pair *p)
{
    pl_conn_close(p->a);
    pl_conn_close(p->b);
    if (p->via_relay) relay_end(&p->r);
}

/* ---- agreement ---- */

static void test_the_stronger_protection_and_a_common_cipher_are_agreed(void)
{
    static const struct {
        pl_frame_protection a, b, want;
        pl_frame_cipher ca, cb, wantc;
    } cases[] = {
        {PL_PROTECT_NONE, PL_PROTECT_NONE, PL_PROTECT_NONE, PL_CIPHER_AES_256_GCM,
         PL_CIPHER_AES_256_GCM, PL_CIPHER_AES_256_GCM},
        {PL_PROTECT_NONE, PL_PROTECT_INTEGRITY, PL_PROTECT_INTEGRITY, PL_CIPHER_AES_256_GCM,
         PL_CIPHER_AES_256_GCM, PL_CIPHER_AES_256_GCM},
        {PL_PROTECT_ENCRYPT, PL_PROTECT_INTEGRITY, PL_PROTECT_ENCRYPT, PL_CIPHER_AES_256_GCM,
         PL_CIPHER_CHACHA20_POLY1305, PL_CIPHER_CHACHA20_POLY1305},
        {PL_PROTECT_DEFAULT, PL_PROTECT_DEFAULT, PL_PROTECT_DEFAULT_MODE,
         PL_CIPHER_CHACHA20_POLY1305, PL_CIPHER_CHACHA20_POLY1305, PL_CIPHER_CHACHA20_POLY1305},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        pair p;
        CHECK_EQ_INT(pair_open(&p, ident(0, "a", cases[k].a, cases[k].ca),
                               ident(1, "b", cases[k].b, cases[k].cb), 0, FORWARD, 0), 0);
        const int ok = pl_conn_protection(p.a) == cases[k].want &&
                       pl_conn_protection(p.b) == cases[k].want &&
                       (cases[k].want == PL_PROTECT_NONE ||
                        (pl_conn_cipher(p.a) == cases[k].wantc &&
                         pl_conn_cipher(p.b) == cases[k].wantc));
        if (!ok)
            printf("    case %zu: %s/%s, %s/%s\n", k, pl_frame_protection_name(pl_conn_protection(p.a)),
                   pl_frame_protection_name(pl_conn_protection(p.b)),
                   pl_frame_cipher_name(pl_conn_cipher(p.a)), pl_frame_cipher_name(pl_conn_cipher(p.b)));
        pair_close(&p);
        CHECK(ok);
    }
    pl_frame_protection parsed;
    char err[128];
    CHECK_EQ_INT(pl_frame_protection_parse("encrypt", &parsed, err, sizeof err), 0);
    CHECK_EQ_INT(parsed, PL_PROTECT_ENCRYPT);
    CHECK_EQ_INT(pl_frame_protection_parse("secret", &parsed, err, sizeof err), PL_COMM_EINVAL);
    CHECK_STR_CONTAINS(err, "secret");
}

/* ---- frames of every size in every mode ---- */

typedef struct {
    pl_conn *c;
    const unsigned char *x;
    const size_t *sizes;
    int n, rc;
    char err[256];
} sender;

static void *send_main(void *arg)
{
    sender *s = arg;
    for (int k = 0; k < s->n && !s->rc; k++)
        s->rc = pl_conn_send_frame(s->c, PL_FRAME_USER, (uint32_t)k, 7, s->x, s->sizes[k], 5000,
                                   s->err, sizeof s->err);
    if (!s->rc) /* then a tensor of several chunks */
        s->rc = pl_conn_send_floats(s->c, 99, (const float *)s->x, (5u << 20) / 4, 5000, s->err,
                                    sizeof s->err);
    return NULL;
}

/* Sends frames of sizes around the protocol's pieces and chunks, then a tensor of two
 * chunks, through a relay that only forwards: they arrive intact. */
static void round_trip(pl_frame_protection prot, pl_frame_cipher cipher)
{
    static const size_t sizes[] = {0, 1, 15, 16, 17, 1000, (256u << 10) - 1, (256u << 10) + 1,
                                   5u << 20};
    const int n = (int)(sizeof sizes / sizeof sizes[0]);
    unsigned char *x = malloc(5u << 20), *y = malloc(5u << 20);
    for (size_t i = 0; i < (5u << 20); i++) x[i] = (unsigned char)(i * 7 + 3);
    pair p;
    CHECK_EQ_INT(pair_open(&p, ident(0, "a", prot, cipher), ident(1, "b", prot, cipher), 1,
                           FORWARD, 0), 0);
    sender s = {.c = p.b, .x = x, .sizes = sizes, .n = n};
    pthread_t t;
    pthread_create(&t, NULL, send_main, &s);
    int bad = 0;
    char err[512];
    for (int k = 0; k < n && !bad; k++) {
        pl_frame_hdr h;
        void *got = NULL;
        int rc = pl_conn_recv_frame_alloc(p.a, &h, &got, 5000, err, sizeof err);
        bad = rc || h.len != sizes[k] || h.tag != (uint32_t)k || (sizes[k] && memcmp(got, x, sizes[k]));
        if (bad) printf("    %s frame %d (%zu bytes): %d %s\n", pl_frame_protection_name(prot), k, sizes[k], rc, err);
        free(got);
    }
    if (!bad && pl_conn_recv_floats(p.a, 99, (float *)y, (5u << 20) / 4, 5000, err, sizeof err)) {
        printf("    tensor: %s\n", err);
        bad = 1;
    }
    bad = bad || memcmp(x, y, 5u << 20);
    pthread_join(t, NULL);
    pair_close(&p);
    free(x);
    free(y);
    CHECK_EQ_INT(s.rc, 0);
    CHECK_EQ_INT(bad, 0);
}

static void test_frames_of_every_size_pass_in_every_mode(void)
{
    round_trip(PL_PROTECT_NONE, PL_CIPHER_AUTO);
    round_trip(PL_PROTECT_INTEGRITY, PL_CIPHER_AES_256_GCM);
    round_trip(PL_PROTECT_ENCRYPT, PL_CIPHER_AES_256_GCM);
    round_trip(PL_PROTECT_INTEGRITY, PL_CIPHER_CHACHA20_POLY1305);
    round_trip(PL_PROTECT_ENCRYPT, PL_CIPHER_CHACHA20_POLY1305);
}

/* What the relay saw of the first frame's payload: the plaintext, or not. */
static void test_encrypt_hides_the_payload_and_integrity_does_not(void)
{
    const char secret[] = "gradients of layer 7";
    for (int enc = 0; enc < 2; enc++) {
        const pl_frame_protection prot = enc ? PL_PROTECT_ENCRYPT : PL_PROTECT_INTEGRITY;
        pair p;
        CHECK_EQ_INT(pair_open(&p, ident(0, "a", prot, 0), ident(1, "b", prot, 0), 1, FORWARD, 0),
                     0);
        char err[256], got[64];
        pl_frame_hdr h;
        CHECK_EQ_INT(pl_conn_send_frame(p.b, PL_FRAME_USER, 1, 0, secret, sizeof secret, 5000, err,
                                        sizeof err), 0);
        CHECK_EQ_INT(pl_conn_recv_frame(p.a, &h, got, sizeof got, 5000, err, sizeof err), 0);
        const int plain_on_wire = memcmp(p.r.seen, secret, 16) == 0;
        pair_close(&p);
        CHECK(memcmp(got, secret, sizeof secret) == 0);
        CHECK_EQ_INT(plain_on_wire, !enc);
    }
}

/* ---- a relay that tampers ---- */

/* b sends frames 0..3 (100 bytes each); the relay acts on one; a receives until it fails.
 * Returns the index of the frame a's receive failed on (4: none), its code and error. */
static int tamper_frames(pl_frame_protection prot, relay_action action, int frame, int *code,
                         char *err, size_t errlen)
{
    pair p;
    if (pair_open(&p, ident(0, "a", prot, 0), ident(1, "b", prot, 0), 1, action, frame)) return -1;
    unsigned char x[100];
    memset(x, 0x5a, sizeof x);
    for (int k = 0; k < 4; k++)
        pl_conn_send_frame(p.b, PL_FRAME_USER, (uint32_t)k, 0, x, sizeof x, 5000, err, errlen);
    int k = 0;
    *code = 0;
    for (; k < 4; k++) {
        pl_frame_hdr h;
        unsigned char y[100];
        *code = pl_conn_recv_frame(p.a, &h, y, sizeof y, 2000, err, errlen);
        if (*code || h.tag != (uint32_t)k || memcmp(x, y, sizeof y)) break;
    }
    /* the receiver ends the connection: the relay ends, and so does b's side */
    const int status = pl_conn_status(p.a);
    char more[256];
    pl_frame_hdr h;
    unsigned char y[100];
    int again = *code, b_sees_end = PL_COMM_ECLOSED;
    if (k < 4) {
        again = pl_conn_recv_frame(p.a, &h, y, sizeof y, 100, more, sizeof more);
        b_sees_end = pl_conn_recv_frame(p.b, &h, y, sizeof y, 3000, more, sizeof more);
    }
    pair_close(&p);
    if (k < 4 && (status != *code || again != *code || b_sees_end != PL_COMM_ECLOSED)) {
        printf("    status %d, again %d, the dialer sees %d\n", status, again, b_sees_end);
        return -1;
    }
    return k;
}

static void test_a_flipped_bit_is_refused_naming_the_peer(void)
{
    static const relay_action actions[] = {FLIP_PAYLOAD, FLIP_HEADER, FLIP_TAG};
    for (int enc = 0; enc < 2; enc++)
        for (int i = 0; i < 3; i++) {
            char err[512] = "";
            int code;
            const pl_frame_protection prot = enc ? PL_PROTECT_ENCRYPT : PL_PROTECT_INTEGRITY;
            const int k = tamper_frames(prot, actions[i], 1, &code, err, sizeof err);
            if (k != 1) printf("    %s, action %d: frame %d failed (%d) %s\n",
                               pl_frame_protection_name(prot), (int)actions[i], k, code, err);
            CHECK_EQ_INT(k, 1);
            CHECK_EQ_INT(code, PL_COMM_EAUTH);
            CHECK_STR_CONTAINS(err, "frame 1 from rank 1 (\"b\", 127.0.0.1:");
            CHECK_STR_CONTAINS(err, "failed authentication");
        }
}

static void test_replayed_reordered_and_dropped_frames_are_refused(void)
{
    static const relay_action actions[] = {REPLAY, SWAP, DROP};
    static const int fails_at[] = {2, 1, 1}; /* a's receive that fails */
    for (int i = 0; i < 3; i++) {
        char err[512] = "";
        int code;
        const int k = tamper_frames(PL_PROTECT_INTEGRITY, actions[i], 1, &code, err, sizeof err);
        if (k != fails_at[i]) printf("    action %d: receive %d failed (%d) %s\n",
                                     (int)actions[i], k, code, err);
        CHECK_EQ_INT(k, fails_at[i]);
        CHECK_EQ_INT(code, PL_COMM_EAUTH);
        CHECK_STR_CONTAINS(err, "replayed or reordered");
    }
}

static void test_a_flipped_tensor_bit_is_refused(void)
{
    pair p;
    CHECK_EQ_INT(pair_open(&p, ident(0, "a", PL_PROTECT_INTEGRITY, 0),
                           ident(1, "b", PL_PROTECT_INTEGRITY, 0), 1, FLIP_PAYLOAD, 1), 0);
    const size_t n = (5u << 20) / 4; /* two chunks; the relay flips a bit in the second */
    float *x = calloc(n, sizeof *x), *y = calloc(n, sizeof *y);
    sender s = {.c = p.b, .x = (const unsigned char *)x, .sizes = NULL, .n = 0};
    char err[512];
    int rc = 0;
    pthread_t t;
    pthread_create(&t, NULL, send_main, &s); /* sends a 5 MiB tensor of tag 99 */
    rc = pl_conn_recv_floats(p.a, 99, y, n, 5000, err, sizeof err);
    pl_conn_shutdown(p.a);
    pthread_join(t, NULL);
    pair_close(&p);
    free(x);
    free(y);
    CHECK_EQ_INT(rc, PL_COMM_EAUTH);
    CHECK_STR_CONTAINS(err, "failed authentication");
}

/* ---- the stage link and the all-reduce ---- */

static void test_the_stage_link_refuses_a_flipped_bit(void)
{
    pair p;
    CHECK_EQ_INT(pair_open(&p, ident(0, "a", PL_PROTECT_INTEGRITY, 0),
                           ident(1, "b", PL_PROTECT_INTEGRITY, 0), 1, FLIP_PAYLOAD, 2), 0);
    /* stage 0 holds a (accepted from b), stage 1 holds b: stage 1 sends gradients back */
    pl_tcp_link_config c0 = {.stage = 0, .next = p.a, .timeout_ms = 5000, .max_pending_prev = 4,
                             .max_pending_next = 4};
    pl_tcp_link_config c1 = {.stage = 1, .prev = p.b, .timeout_ms = 5000, .max_pending_prev = 4,
                             .max_pending_next = 4};
    p.a = p.b = NULL; /* the links own them */
    pl_tcp_link *l0 = NULL, *l1 = NULL;
    char err[512];
    CHECK_EQ_INT(pl_tcp_link_create(&c0, &l0, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tcp_link_create(&c1, &l1, err, sizeof err), 0);
    const size_t n = (6u << 20) / 4; /* two frames each */
    float *x = calloc(n, sizeof *x), *y = calloc(n, sizeof *y);
    int rc[3] = {-2, -2, -2};
    /* the first message taken before the next is sent: a link whose reader already failed
     * on frame 2 answers every receive with its failure, the one stashed before it too */
    for (int mb = 0; mb < 3; mb++) {
        pl_tcp_link_send(l1, 0, PL_LINK_GRADIENT, mb, x, n, err, sizeof err);
        if (mb == 0)
            rc[0] = pl_tcp_link_recv(l0, 1, PL_LINK_GRADIENT, 0, y, n, err, sizeof err);
    }
    for (int mb = 1; mb < 3; mb++)
        rc[mb] = pl_tcp_link_recv(l0, 1, PL_LINK_GRADIENT, mb, y, n, err, sizeof err);
    char why[512];
    const int status = pl_tcp_link_status(l0, 1, why, sizeof why);
    pl_tcp_link_destroy(l0);
    pl_tcp_link_destroy(l1);
    pair_close(&p);
    free(x);
    free(y);
    CHECK(rc[0] == 0 && rc[1] == -1 && rc[2] == -1); /* frame 2 is the second message's first */
    CHECK_EQ_INT(status, PL_COMM_EAUTH);
    CHECK_STR_CONTAINS(err, "stage link to stage 1 (rank 1, b)");
    CHECK_STR_CONTAINS(err, "frame 2 from rank 1 (\"b\"");
    CHECK_STR_CONTAINS(err, "failed authentication");
}

typedef struct {
    pl_conn *c;
    int rank, rc;
    float *buf;
    size_t n;
    char err[512];
} ar_job;

static void *ar_main(void *arg)
{
    ar_job *j = arg;
    pl_conn *conn[2] = {NULL, NULL};
    conn[1 - j->rank] = j->c;
    const int32_t group[2] = {0, 1};
    pl_peer_table pt = {.self = j->rank, .nranks = 2, .conn = conn};
    j->rc = pl_ring_allreduce(&pt, group, 2, j->buf, j->n, 3, 5000, j->err, sizeof j->err);
    return NULL;
}

/* A small send buffer: writes stop short, anywhere in a chunk, all the time (a small
 * receive buffer too would only slow loopback TCP down to its persist timer). */
static void small_buffers(pl_conn *c)
{
    int sz = 4096;
    setsockopt(pl_conn_fd(c), SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
}

static void test_the_all_reduce_refuses_a_flipped_bit(void)
{
    for (int enc = 0; enc < 2; enc++) {
        const pl_frame_protection prot = enc ? PL_PROTECT_ENCRYPT : PL_PROTECT_INTEGRITY;
        /* an untouched all-reduce first (socket buffers small), then one whose second frame
         * from rank 1 is flipped */
        for (int tamper = 0; tamper < 2; tamper++) {
            pair p;
            CHECK_EQ_INT(pair_open(&p, ident(0, "a", prot, 0), ident(1, "b", prot, 0), 1,
                                   tamper ? FLIP_PAYLOAD : FORWARD, 1), 0);
            if (!tamper) {
                small_buffers(p.a);
                small_buffers(p.b);
            }
            const size_t n = (tamper ? 3 : 8) * PL_ALLREDUCE_CHUNK_FLOATS + 5;
            ar_job j[2] = {{.c = p.a, .rank = 0, .n = n}, {.c = p.b, .rank = 1, .n = n}};
            pthread_t t[2];
            for (int r = 0; r < 2; r++) {
                j[r].buf = malloc(n * sizeof(float));
                for (size_t i = 0; i < n; i++) j[r].buf[i] = (float)(i % 13) + (float)r;
                pthread_create(&t[r], NULL, ar_main, &j[r]);
            }
            for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
            const int same = memcmp(j[0].buf, j[1].buf, n * sizeof(float)) == 0 &&
                             j[0].buf[14] == (float)(14 % 13) * 2 + 1;
            for (int r = 0; r < 2; r++) free(j[r].buf);
            pair_close(&p);
            if (!tamper) {
                if (j[0].rc || j[1].rc) printf("    %s / %s\n", j[0].err, j[1].err);
                CHECK(j[0].rc == 0 && j[1].rc == 0 && same);
                continue;
            }
            CHECK_EQ_INT(j[0].rc, PL_COMM_EAUTH);
            CHECK_STR_CONTAINS(j[0].err, "all-reduce: frame 1 from rank 1 (\"b\"");
            CHECK(j[1].rc != 0); /* its neighbour ended the connection */
        }
    }
}

/* The plain mode has no frame protection: what the handshake proves is all there is. */
static void test_a_plain_connection_carries_no_tag(void)
{
    char err[512] = "";
    int code;
    CHECK_EQ_INT(tamper_frames(PL_PROTECT_NONE, FORWARD, 0, &code, err, sizeof err), 4);
    CHECK_EQ_INT(code, 0);
}

TEST_MAIN_BEGIN
RUN(test_the_stronger_protection_and_a_common_cipher_are_agreed);
RUN(test_frames_of_every_size_pass_in_every_mode);
RUN(test_encrypt_hides_the_payload_and_integrity_does_not);
RUN(test_a_flipped_bit_is_refused_naming_the_peer);
RUN(test_replayed_reordered_and_dropped_frames_are_refused);
RUN(test_a_flipped_tensor_bit_is_refused);
RUN(test_the_stage_link_refuses_a_flipped_bit);
RUN(test_the_all_reduce_refuses_a_flipped_bit);
RUN(test_a_plain_connection_carries_no_tag);
TEST_MAIN_END
