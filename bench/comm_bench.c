/* Loopback figures for the worker-to-worker TCP transport (worker/comm/), each with plain
 * frames, integrity-protected frames and encrypted frames (tcp.h "Frame protection") in
 * the same run, repetitions of the three interleaved: a large tensor sent through the
 * stage link (stage_link.h: queued send, I/O threads, receive), the same over one
 * connection with send/recv, and ring all-reduce of a 100 MB fp32 buffer among 2, 3 and
 * 4 ranks (threads of this process on 127.0.0.1), next to a memcpy baseline. Each row
 * prints every mode's median time and rate and the protected modes' throughput as a
 * share of the plain one's. "algbw" = buffer bytes / time; the all-reduce's "busbw" =
 * algbw · 2(p−1)/p, the bytes each rank actually sends per second in a ring.
 * Usage: comm_bench [--mb N] [--reps R] [--cipher aes|chacha] */
#include "allreduce.h"
#include "mesh.h"
#include "stage_link.h"
#include "tcp.h"
#include "util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HOST "127.0.0.1"
#define TOKEN "bench-token"
#define MAXR 4
#define NMODES 3
#define MAXREPS 16

static const pl_frame_protection modes[NMODES] = {PL_PROTECT_NONE, PL_PROTECT_INTEGRITY,
                                                  PL_PROTECT_ENCRYPT};
static pl_frame_cipher cipher = PL_CIPHER_AUTO;

static pl_comm_ident ident(int rank, pl_frame_protection mode)
{
    static const char *names[MAXR] = {"r0", "r1", "r2", "r3"};
    pl_comm_ident id = {.token = TOKEN, .token_len = strlen(TOKEN), .rank = rank,
                        .name = names[rank], .generation = 1, .protection = mode,
                        .cipher = cipher};
    return id;
}

typedef struct {
    pl_listener *l;
    int rank, nranks;
    pl_frame_protection mode;
    const char **hosts;
    const int *ports;
    pl_conn *conn[MAXR];
    int rc;
    char err[256];
} mesh_job;

static void *mesh_main(void *arg)
{
    mesh_job *j = arg;
    pl_comm_ident id = ident(j->rank, j->mode);
    j->rc = pl_comm_mesh(j->l, &id, j->nranks, j->hosts, j->ports, 10000, j->conn, j->err,
                         sizeof j->err);
    return NULL;
}

/* A full mesh of n ranks whose frames are protected by mode. */
static int mesh_open(mesh_job *jobs, int n, pl_frame_protection mode)
{
    const char *hosts[MAXR];
    int ports[MAXR];
    char err[256];
    for (int r = 0; r < n; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        if (pl_listener_open(HOST, 0, &jobs[r].l, err, sizeof err)) {
            fprintf(stderr, "comm_bench: %s\n", err);
            return -1;
        }
        hosts[r] = HOST;
        ports[r] = pl_listener_port(jobs[r].l);
    }
    pthread_t t[MAXR];
    for (int r = 0; r < n; r++) {
        jobs[r].rank = r;
        jobs[r].nranks = n;
        jobs[r].mode = mode;
        jobs[r].hosts = hosts;
        jobs[r].ports = ports;
        pthread_create(&t[r], NULL, mesh_main, &jobs[r]);
    }
    int bad = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(t[r], NULL);
        pl_listener_close(jobs[r].l);
        jobs[r].l = NULL;
        if (jobs[r].rc) {
            fprintf(stderr, "comm_bench: mesh rank %d: %s\n", r, jobs[r].err);
            bad = 1;
        }
    }
    return bad ? -1 : 0;
}

static void mesh_close(mesh_job *jobs, int n)
{
    for (int r = 0; r < n; r++)
        for (int s = 0; s < n; s++)
            pl_conn_close(jobs[r].conn[s]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *ts, int reps)
{
    qsort(ts, (size_t)reps, sizeof ts[0], cmp_double);
    return ts[reps / 2];
}

/* One row: every mode's median time and rate (bytes · factor / time), the protected
 * modes' throughput as a share of the plain one's. */
static void print_row(const char *name, size_t bytes, double factor, double ts[NMODES][MAXREPS],
                      int reps, const char *note)
{
    double gbs[NMODES];
    printf("%-26s", name);
    for (int k = 0; k < NMODES; k++) {
        const double t = median(ts[k], reps);
        gbs[k] = bytes * factor / t / 1e9;
        printf(" | %s %7.1f ms %5.2f GB/s", pl_frame_protection_name(modes[k]), t * 1e3, gbs[k]);
        if (k) printf(" (%3.0f%%)", 100 * gbs[k] / gbs[0]);
    }
    printf("%s\n", note);
}

/* memcpy of the buffer on one thread: the baseline, in GB/s. */
static void bench_memcpy(float *a, float *b, size_t n, int reps)
{
    const size_t bytes = n * sizeof(float);
    double ts[MAXREPS];
    memcpy(b, a, bytes);
    for (int k = 0; k < reps; k++) {
        double t0 = pl_now_ms() / 1e3;
        memcpy(b, a, bytes);
        ts[k] = pl_now_ms() / 1e3 - t0;
        a[k] = b[k + 1]; /* keep the copies alive */
    }
    const double t = median(ts, reps);
    printf("%-26s | %7.1f ms %5.2f GB/s\n", "memcpy (one thread)", t * 1e3, bytes / t / 1e9);
}

/* ---- stage link: a message from stage 0 to stage 1 ---- */

typedef struct {
    pl_tcp_link *l0, *l1;
} link_pair;

static int link_open(link_pair *lp, pl_frame_protection mode)
{
    mesh_job m[2];
    char err[256];
    if (mesh_open(m, 2, mode)) return -1;
    pl_tcp_link_config c0 = {.stage = 0, .next = m[0].conn[1], .timeout_ms = 30000,
                             .max_pending_prev = 1, .max_pending_next = 1};
    pl_tcp_link_config c1 = {.stage = 1, .prev = m[1].conn[0], .timeout_ms = 30000,
                             .max_pending_prev = 1, .max_pending_next = 1};
    lp->l0 = lp->l1 = NULL;
    if (pl_tcp_link_create(&c0, &lp->l0, err, sizeof err) ||
        pl_tcp_link_create(&c1, &lp->l1, err, sizeof err)) {
        fprintf(stderr, "comm_bench: stage link: %s\n", err);
        pl_tcp_link_destroy(lp->l0);
        return -1;
    }
    return 0;
}

/* Sends x through the link and receives it into y (one thread: the send queues). */
static int link_once(link_pair *lp, int k, const float *x, float *y, size_t n, double *secs)
{
    char err[256];
    const double t0 = pl_now_ms() / 1e3;
    if (pl_tcp_link_send(lp->l0, 1, PL_LINK_ACTIVATION, k, x, n, err, sizeof err) ||
        pl_tcp_link_recv(lp->l1, 0, PL_LINK_ACTIVATION, k, y, n, err, sizeof err)) {
        fprintf(stderr, "comm_bench: stage link: %s\n", err);
        return 1;
    }
    *secs = pl_now_ms() / 1e3 - t0;
    return 0;
}

static int bench_link(float *a, float *b, size_t n, int reps)
{
    link_pair lp[NMODES] = {{0}};
    double ts[NMODES][MAXREPS];
    int bad = 0;
    for (int m = 0; m < NMODES && !bad; m++) bad = link_open(&lp[m], modes[m]);
    for (int k = 0; k < reps && !bad; k++)
        for (int m = 0; m < NMODES && !bad; m++) {
            b[0] = -1;
            bad = link_once(&lp[m], k, a, b, n, &ts[m][k]) || memcmp(a, b, n * sizeof *a);
        }
    for (int m = 0; m < NMODES; m++) {
        pl_tcp_link_destroy(lp[m].l0);
        pl_tcp_link_destroy(lp[m].l1);
    }
    if (bad) {
        fprintf(stderr, "comm_bench: stage link failed or changed the data\n");
        return 1;
    }
    print_row("stage link 0 -> 1", n * sizeof(float), 1.0, ts, reps, "");
    return 0;
}

/* ---- send/recv over one connection ---- */

typedef struct {
    pl_conn *c;
    float *x;
    size_t n;
    int rep, rc;
    char err[256];
} stream_job;

static void *sender_main(void *arg)
{
    stream_job *j = arg;
    j->rc = pl_conn_send_floats(j->c, (uint32_t)j->rep, j->x, j->n, 30000, j->err, sizeof j->err);
    return NULL;
}

static int stream_once(mesh_job *m, int k, float *a, float *b, size_t n, double *secs)
{
    stream_job sj = {.c = m[1].conn[0], .x = a, .n = n, .rep = k};
    char err[256];
    const double t0 = pl_now_ms() / 1e3;
    pthread_t st;
    pthread_create(&st, NULL, sender_main, &sj);
    int rc = pl_conn_recv_floats(m[0].conn[1], (uint32_t)k, b, n, 30000, err, sizeof err);
    pthread_join(st, NULL);
    *secs = pl_now_ms() / 1e3 - t0;
    if (rc || sj.rc) fprintf(stderr, "comm_bench: send/recv: %s %s\n", rc ? err : "", sj.rc ? sj.err : "");
    return rc || sj.rc;
}

static int bench_stream(float *a, float *b, size_t n, int reps)
{
    mesh_job m[NMODES][2];
    double ts[NMODES][MAXREPS];
    int bad = 0, opened = 0;
    for (; opened < NMODES && !bad; opened++) bad = mesh_open(m[opened], 2, modes[opened]);
    for (int k = 0; k < reps && !bad; k++)
        for (int i = 0; i < NMODES && !bad; i++)
            bad = stream_once(m[i], k, a, b, n, &ts[i][k]) || memcmp(a, b, n * sizeof *a);
    for (int i = 0; i < opened; i++) mesh_close(m[i], 2);
    if (bad) return 1;
    print_row("send/recv 1 stream", n * sizeof(float), 1.0, ts, reps, "");
    return 0;
}

/* ---- ring all-reduce ---- */

typedef struct {
    mesh_job *m;
    int rank, p;
    float *buf;
    size_t n;
    int rep, rc;
    double t;
    char err[256];
} ar_job;

static void *ar_main(void *arg)
{
    ar_job *j = arg;
    int32_t group[MAXR];
    for (int i = 0; i < j->p; i++)
        group[i] = i;
    pl_peer_table pt = {.self = j->rank, .nranks = j->p, .conn = j->m[j->rank].conn};
    const double t0 = pl_now_ms() / 1e3;
    j->rc = pl_ring_allreduce(&pt, group, j->p, j->buf, j->n, (uint32_t)j->rep, 30000, j->err,
                              sizeof j->err);
    j->t = pl_now_ms() / 1e3 - t0;
    return NULL;
}

/* One all-reduce on p rank threads over mesh m: the slowest rank's time. The ranks'
 * results must agree. 0, or 1 on failure. */
static int allreduce_once(mesh_job *m, int p, float **bufs, size_t n, int rep, double *secs)
{
    ar_job jobs[MAXR];
    pthread_t t[MAXR];
    for (int r = 0; r < p; r++) {
        jobs[r] = (ar_job){.m = m, .rank = r, .p = p, .buf = bufs[r], .n = n, .rep = rep};
        for (size_t i = 0; i < n; i++)
            bufs[r][i] = 1e-3f * (float)((i + (size_t)r) % 7);
    }
    for (int r = 0; r < p; r++) pthread_create(&t[r], NULL, ar_main, &jobs[r]);
    int bad = 0;
    *secs = 0;
    for (int r = 0; r < p; r++) {
        pthread_join(t[r], NULL);
        if (jobs[r].rc) {
            fprintf(stderr, "comm_bench: all-reduce p=%d rank %d: %s\n", p, r, jobs[r].err);
            bad = 1;
        }
        if (jobs[r].t > *secs) *secs = jobs[r].t;
    }
    for (int r = 1; r < p && !bad; r++)
        if (memcmp(bufs[0], bufs[r], n * sizeof(float)) != 0) {
            fprintf(stderr, "comm_bench: all-reduce p=%d: ranks 0 and %d differ\n", p, r);
            bad = 1;
        }
    return bad;
}

static int bench_allreduce(int p, size_t n, int reps, long cores)
{
    mesh_job m[NMODES][MAXR];
    double ts[NMODES][MAXREPS];
    float *bufs[MAXR] = {NULL};
    int bad = 0, opened = 0;
    for (int r = 0; r < p && !bad; r++) bad = !(bufs[r] = malloc(n * sizeof(float)));
    for (; opened < NMODES && !bad; opened++) bad = mesh_open(m[opened], p, modes[opened]);
    for (int k = 0; k < reps && !bad; k++)
        for (int i = 0; i < NMODES && !bad; i++)
            bad = allreduce_once(m[i], p, bufs, n, k, &ts[i][k]);
    for (int i = 0; i < opened; i++) mesh_close(m[i], p);
    for (int r = 0; r < p; r++) free(bufs[r]);
    if (bad) return 1;
    char name[64];
    snprintf(name, sizeof name, "ring all-reduce, %d ranks", p);
    print_row(name, n * sizeof(float), 2.0 * (p - 1) / p, ts, reps,
              p > cores ? "  [busbw; more ranks than cores]" : "  [busbw]");
    return 0;
}

int main(int argc, char **argv)
{
    size_t mb = 100;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc)
            mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cipher") && i + 1 < argc && (!strcmp(argv[i + 1], "aes") ||
                                                                  !strcmp(argv[i + 1], "chacha")))
            cipher = !strcmp(argv[++i], "aes") ? PL_CIPHER_AES_256_GCM
                                               : PL_CIPHER_CHACHA20_POLY1305;
        else {
            fprintf(stderr, "usage: %s [--mb N] [--reps R] [--cipher aes|chacha]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > MAXREPS || mb < 1) {
        fprintf(stderr, "comm_bench: --reps 1..%d, --mb >= 1\n", MAXREPS);
        return 2;
    }
    size_t bytes = mb * 1000 * 1000, n = bytes / sizeof(float);
    bytes = n * sizeof(float);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    mesh_job probe[2];
    if (mesh_open(probe, 2, PL_PROTECT_ENCRYPT)) return 1;
    printf("comm_bench: %zu MB fp32 buffers, loopback TCP, %d reps (median), %ld CPU cores; "
           "protected frames: %s; default protection: %s\n",
           bytes / 1000000, reps, cores, pl_frame_cipher_name(pl_conn_cipher(probe[0].conn[1])),
           pl_frame_protection_name(PL_PROTECT_DEFAULT_MODE));
    mesh_close(probe, 2);
    float *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        fprintf(stderr, "comm_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(i % 1000) * 0.001f;
    bench_memcpy(a, b, n, reps);
    int rc = bench_link(a, b, n, reps) || bench_stream(a, b, n, reps);
    free(b);
    for (int p = 2; p <= MAXR && !rc; p++)
        rc = bench_allreduce(p, n, reps, cores);
    free(a);
    return rc;
}
