/* Fuzz target: the frames a peer sends after the handshake (worker/comm/tcp.c: the frame
 * header's decoding and checks — magic, generation, the maximum frame size — then the
 * payload and, on protected connections, the tag), received by pl_conn_recv_frame_alloc
 * on a real connection over 127.0.0.1. The input's first byte picks the protection and
 * whether the client makes its frames valid (magic, generation, length and tag right:
 * the payload path is reached) or sends the header bytes as they are; the rest is frames:
 * 32 header bytes, then payload bytes up to the header's length. The client then ends its
 * stream. Every frame received must be one of the connection's generation within the
 * maximum size, valid frames arrive intact, and the first refusal says why and leaves the
 * connection broken (the next call fails too). */
#include "fuzz.h"
#include "aead.h"
#include "comm_io.h"
#include "handshake.h"
#include "util.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#define TOKEN "fuzz-peer-frame-token"
#define GENERATION 9
#define MAX_FRAME 4096
#define MAX_INPUT 65536

static pl_comm_ident ident(int rank, const char *name, int purpose, int prot)
{
    pl_comm_ident id = {.token = TOKEN, .token_len = strlen(TOKEN), .rank = rank, .name = name,
                        .generation = GENERATION, .purpose = (pl_conn_purpose)purpose,
                        .protection = (pl_frame_protection)prot};
    return id;
}

static pl_listener *listener(void)
{
    static pl_listener *l;
    char err[256];
    if (!l) FUZZ_CHECK(pl_listener_open("127.0.0.1", 0, &l, err, sizeof err) == 0);
    return l;
}

static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    FUZZ_CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    struct linger lg = {.l_onoff = 1, .l_linger = 0}; /* no TIME_WAIT per input */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    return fd;
}

/* Both handshakes to their end; the client's result. */
static const pl_handshake_result *connect_pair(int prot, int *cfd, pl_conn **server,
                                               pl_handshake **hs)
{
    char err[512] = "";
    static const pl_comm_ident *ls;
    static pl_comm_ident lid;
    lid = ident(0, "a", PL_CONN_ANY, prot);
    ls = &lid;
    *cfd = dial(pl_listener_port(listener()));
    pl_comm_ident cid = ident(1, "b", PL_CONN_RING, prot);
    *hs = pl_handshake_new(&cid, 1, 0, pl_now_ms() + 5000, err, sizeof err);
    FUZZ_CHECK(*hs);
    *server = NULL;
    for (int i = 0; i < 1000 && !*server; i++)
        FUZZ_CHECK(pl_listener_accept_begin(listener(), ls, 5000, server, err, sizeof err) == 0);
    FUZZ_CHECK(*server);
    int rc = 0, rs = 0;
    while (rc == 0 || rs == 0) {
        if (rc == 0) rc = pl_handshake_step(*hs, *cfd, "server", err, sizeof err);
        if (rs == 0) rs = pl_conn_handshake_step(*server, err, sizeof err);
        if (rc < 0 || rs < 0) printf("%s\n", err);
        FUZZ_CHECK(rc >= 0 && rs >= 0);
        struct pollfd p[2] = {{.fd = *cfd, .events = POLLIN}, {.fd = pl_conn_fd(*server), .events = POLLIN}};
        if (rc == 0 || rs == 0) poll(p, 2, 10);
    }
    return pl_handshake_result_of(*hs);
}

static void send_all(int fd, const void *p, size_t n)
{
    const unsigned char *b = p;
    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w <= 0) return; /* the server gave up: what follows does not matter */
        b += w;
        n -= (size_t)w;
    }
}

/* The client's frames from the input; valid: each made right and sealed. Returns how
 * many frames were valid ones (all, when valid). */
static int send_frames(int fd, const uint8_t *data, size_t size, int valid, pl_aead *seal)
{
    int frames = 0;
    unsigned char *sealed = malloc(MAX_INPUT);
    FUZZ_CHECK(sealed);
    while (size >= PL_FRAME_HDR_BYTES) {
        unsigned char hdr[PL_FRAME_HDR_BYTES];
        memcpy(hdr, data, sizeof hdr);
        data += sizeof hdr;
        size -= sizeof hdr;
        uint64_t len = pl_get64(hdr + 24);
        if (valid) {
            pl_frame_hdr h;
            pl_frame_decode(hdr, &h);
            h.generation = GENERATION;
            h.len = len % (MAX_FRAME + 1) < size ? len % (MAX_FRAME + 1) : size;
            pl_frame_encode(&h, hdr);
            len = h.len;
        }
        const size_t n = len < size ? (size_t)len : size;
        send_all(fd, hdr, sizeof hdr);
        if (valid && seal) {
            unsigned char tag[PL_AEAD_TAG_BYTES];
            FUZZ_CHECK(pl_aead_seal(seal, hdr, data, sealed, n, tag) == 0);
            send_all(fd, seal->encrypt ? sealed : data, n);
            send_all(fd, tag, sizeof tag);
        } else {
            send_all(fd, data, n);
        }
        data += n;
        size -= n;
        frames++;
    }
    free(sealed);
    return frames;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > MAX_INPUT) return 0;
    const int prot = PL_PROTECT_NONE + data[0] % 3, valid = (data[0] >> 2) & 1;
    int cfd;
    pl_conn *server;
    pl_handshake *hs;
    const pl_handshake_result *r = connect_pair(prot, &cfd, &server, &hs);
    FUZZ_CHECK((int)r->protection == prot);
    pl_conn_set_max_frame(server, MAX_FRAME);
    pl_aead seal = {0};
    const int protected_ = prot != PL_PROTECT_NONE;
    if (protected_)
        FUZZ_CHECK(pl_aead_init(&seal, r->cipher, prot == PL_PROTECT_ENCRYPT, 1, r->key_tx) == 0);
    const int sent = send_frames(cfd, data + 1, size - 1, valid, protected_ ? &seal : NULL);
    shutdown(cfd, SHUT_WR);
    /* the server: frames until the stream ends or one is refused */
    const uint8_t *p = data + 1;
    int got = 0, rc;
    char err[512] = "";
    for (;;) {
        pl_frame_hdr h;
        void *payload = NULL;
        err[0] = 0;
        rc = pl_conn_recv_frame_alloc(server, &h, &payload, 5000, err, sizeof err);
        if (rc) break;
        FUZZ_CHECK(h.generation == GENERATION && h.len <= MAX_FRAME);
        if (valid) { /* intact: the payload the client took from the input */
            FUZZ_CHECK(h.len == 0 || memcmp(payload, p + PL_FRAME_HDR_BYTES, (size_t)h.len) == 0);
            p += PL_FRAME_HDR_BYTES + h.len;
        }
        free(payload);
        got++;
    }
    FUZZ_CHECK(rc < 0 && err[0] && pl_conn_status(server) != 0);
    if (valid) FUZZ_CHECK(got == sent && rc == PL_COMM_ECLOSED);
    pl_frame_hdr h;
    void *payload = NULL;
    FUZZ_CHECK(pl_conn_recv_frame_alloc(server, &h, &payload, 0, err, sizeof err) != 0);
    pl_aead_free(&seal);
    pl_handshake_free(hs);
    pl_conn_close(server);
    close(cfd);
    return 0;
}
