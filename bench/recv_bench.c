/* Receiving layers into fresh memory: fp32 tensors (768 × 3072 floats, a GPT-2 124M MLP
 * weight, each) streamed over one loopback connection with the workers' frames
 * (integrity-protected by default, as layer copies are) into a destination that each
 * variant prepares its own way, repetitions of all the variants interleaved; each row
 * prints the median time, rate and share of the warm buffer's rate, and the page faults
 * left for the first writes after the receive (one write per page, untimed). Variants:
 *   warm        a buffer written before (the loopback stream itself)
 *   fresh       a new memory file mapping (what kn_alloc gives), received into, each page
 *               faulted, allocated and zeroed inside the receive's copy
 *   populate    the same, each tensor's pages made present first (MADV_POPULATE_WRITE)
 *   ahead       the same, a helper thread populating the tensors ahead of the receive
 *               (pl_ahead: what the layer copies do, worker/engine/populate_ahead.h)
 *   fallocate   the memory file's pages allocated first (fallocate), then received into
 *   pwrite      each 4 MiB frame received into a warm buffer and checked there, then
 *               written into the file (pwrite: pages wholly written are not zeroed); the
 *               pages are left out of the mapping
 *   pwrite+read the same, then each tensor's pages mapped by MADV_POPULATE_READ
 *   pwrite+write the same with MADV_POPULATE_WRITE
 *   fallocate ahead+pwrite  pwrite+read, a helper thread allocating the file ahead
 * --huge adds MADV_HUGEPAGE to every memory file mapping (effective only where
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled allows it).
 * Usage: recv_bench [--mb N] [--reps R] [--protection none|integrity|encrypt] [--huge] */
#include "populate_ahead.h"
#include "tcp.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define TENSOR_FLOATS ((size_t)768 * 3072)
#define MAXREPS 16
#define TIMEOUT_MS 60000

enum {
    WARM, FRESH, POPULATE, AHEAD, FALLOCATE, PWRITE, PWRITE_READ, PWRITE_WRITE, FALLOC_AHEAD,
    NVAR
};
static const char *names[NVAR] = {"warm",        "fresh",        "populate",
                                  "ahead",       "fallocate",    "pwrite",
                                  "pwrite+read", "pwrite+write", "fallocate ahead+pwrite"};

static int huge;
static kn_ctx *cpu;               /* kn_populate's backend, for pl_ahead */
static unsigned char *frame_buf; /* the pwrite variants' warm frame */

typedef struct {
    pl_conn *c;
    float *src; /* one tensor, sent again and again, its first float its index */
    size_t n;
    int rc;
    char err[256];
} sender_job;

/* The destination of one receive. */
typedef struct {
    float *p;
    int fd; /* −1: p is the warm buffer */
    size_t len;
} dest;

static size_t tensor_len(size_t n, size_t at)
{
    return n - at < TENSOR_FLOATS ? n - at : TENSOR_FLOATS;
}

static void *sender_main(void *arg)
{
    sender_job *j = arg;
    j->rc = 0;
    for (size_t at = 0; at < j->n && !j->rc; at += TENSOR_FLOATS) {
        j->src[0] = (float)(at / TENSOR_FLOATS);
        j->rc = pl_conn_send_floats(j->c, (uint32_t)(at / TENSOR_FLOATS), j->src,
                                    tensor_len(j->n, at), TIMEOUT_MS, j->err, sizeof j->err);
    }
    return NULL;
}

typedef struct {
    pl_listener *l;
    pl_comm_ident id;
    pl_conn *c;
    char err[256];
} dial_job;

static void *dial_main(void *arg)
{
    dial_job *d = arg;
    pl_conn_connect("127.0.0.1", pl_listener_port(d->l), &d->id, -1, TIMEOUT_MS, &d->c, d->err,
                    sizeof d->err);
    return NULL;
}

/* One connection of this process to itself: *tx dialed, *rx accepted. */
static int pair_open(pl_frame_protection mode, pl_conn **tx, pl_conn **rx)
{
    char err[256];
    dial_job d = {.id = {.token = "bench", .token_len = 5, .rank = 1, .name = "tx",
                         .generation = 1, .purpose = PL_CONN_LAYER_COPY, .protection = mode}};
    pl_comm_ident self = d.id;
    self.rank = 0, self.name = "rx", self.purpose = PL_CONN_ANY;
    pthread_t t;
    if (pl_listener_open("127.0.0.1", 0, &d.l, err, sizeof err) ||
        pthread_create(&t, NULL, dial_main, &d)) {
        fprintf(stderr, "recv_bench: %s\n", err);
        return -1;
    }
    const int rc = pl_listener_accept(d.l, &self, TIMEOUT_MS, rx, err, sizeof err);
    pthread_join(t, NULL);
    pl_listener_close(d.l);
    if (rc || !d.c) {
        fprintf(stderr, "recv_bench: %s\n", rc ? err : d.err);
        pl_conn_close(*rx);
        pl_conn_close(d.c);
        return -1;
    }
    *tx = d.c;
    return 0;
}

/* A new memory file of len bytes, mapped (MADV_HUGEPAGE with --huge). */
static int dest_map(dest *d, size_t len)
{
    d->len = len;
    d->fd = memfd_create("recv_bench", MFD_CLOEXEC);
    if (d->fd < 0 || ftruncate(d->fd, (off_t)len)) return -1;
    d->p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, d->fd, 0);
    if (d->p == MAP_FAILED) return -1;
    if (huge) madvise(d->p, len, MADV_HUGEPAGE); /* refused where the system has it off */
    return 0;
}

static void dest_free(dest *d)
{
    munmap(d->p, d->len);
    close(d->fd);
}

/* A frame of the stream: into the warm frame buffer (checked there), then written into
 * the file at byte off. Its payload's bytes, or −1. */
static long recv_frame_pwrite(pl_conn *c, const dest *d, size_t off, char *err, size_t errlen)
{
    pl_frame_hdr h;
    if (pl_conn_recv_frame(c, &h, frame_buf, PL_COMM_TENSOR_CHUNK_BYTES, TIMEOUT_MS, err,
                           errlen))
        return -1;
    if (h.type != PL_FRAME_TENSOR) return pl_errf(err, errlen, "frame of type %u", h.type);
    if (pwrite(d->fd, frame_buf, h.len, (off_t)off) != (ssize_t)h.len)
        return pl_errf(err, errlen, "pwrite: %s", strerror(errno));
    return (long)h.len;
}

/* The receiver's ranges for pl_ahead: its tensors. */
static void tensor_range(void *ctx, int i, void **p, size_t *bytes)
{
    const dest *d = ctx;
    const size_t n = d->len / sizeof(float), at = (size_t)i * TENSOR_FLOATS;
    *p = d->p + at;
    *bytes = tensor_len(n, at) * sizeof(float);
}

/* fallocate ahead of the receive, 8 MiB a call. */
static void *falloc_main(void *arg)
{
    const dest *d = arg;
    const size_t step = (size_t)8 << 20;
    for (size_t at = 0; at < d->len; at += step)
        if (fallocate(d->fd, 0, (off_t)at, (off_t)(d->len - at < step ? d->len - at : step)))
            break; /* the receive allocates the rest */
    return NULL;
}

/* Receives one tensor of m floats at float offset at the variant's way. */
static int recv_tensor(int v, pl_conn *c, const dest *d, pl_ahead *ahead, size_t at, size_t m,
                       char *err, size_t errlen)
{
    float *x = d->p + at;
    const uint32_t tag = (uint32_t)(at / TENSOR_FLOATS);
    if (v == POPULATE && madvise(x, m * sizeof(float), MADV_POPULATE_WRITE))
        return pl_errf(err, errlen, "MADV_POPULATE_WRITE: %s", strerror(errno));
    if (v == AHEAD) pl_ahead_reach(ahead, (int)tag);
    if (v < PWRITE) return pl_conn_recv_floats(c, tag, x, m, TIMEOUT_MS, err, errlen);
    for (size_t off = 0; off < m * sizeof(float);) {
        const long got = recv_frame_pwrite(c, d, at * sizeof(float) + off, err, errlen);
        if (got < 0) return -1;
        off += (size_t)got;
    }
    const int advice = v == PWRITE_WRITE ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
    if (v != PWRITE && madvise(x, m * sizeof(float), advice))
        return pl_errf(err, errlen, "madvise: %s", strerror(errno));
    return 0;
}

/* Faults taken writing every page of d once (adding 0 to a byte: a write that keeps it). */
static long faults_left(const dest *d)
{
    struct rusage a, b;
    getrusage(RUSAGE_THREAD, &a);
    for (size_t at = 0; at < d->len; at += 4096)
        __atomic_fetch_add((char *)d->p + at, 0, __ATOMIC_RELAXED);
    getrusage(RUSAGE_THREAD, &b);
    return b.ru_minflt - a.ru_minflt;
}

/* Every tensor equals src but its first float, its index. */
static int check(const dest *d, const float *src, size_t n)
{
    for (size_t at = 0; at < n; at += TENSOR_FLOATS) {
        const size_t m = tensor_len(n, at);
        if (d->p[at] != (float)(at / TENSOR_FLOATS) ||
            memcmp(d->p + at + 1, src + 1, (m - 1) * sizeof(float)))
            return -1;
    }
    return 0;
}

/* One receive of n floats by variant v into d (the warm buffer for WARM); its seconds. */
static int run_once(int v, pl_conn *tx, pl_conn *rx, float *src, float *warm, size_t n,
                    double *secs, long *faults)
{
    char err[256] = "";
    dest d = {.p = warm, .fd = -1, .len = n * sizeof(float)};
    if (v != WARM && dest_map(&d, n * sizeof(float))) {
        perror("recv_bench: memory file");
        return -1;
    }
    sender_job s = {.c = tx, .src = src, .n = n};
    const int ntensors = (int)((n + TENSOR_FLOATS - 1) / TENSOR_FLOATS);
    pl_ahead ahead = {0};
    pthread_t st, ft;
    const double t0 = pl_now_ms();
    int rc = pthread_create(&st, NULL, sender_main, &s);
    if (v == AHEAD) pl_ahead_start(&ahead, cpu, ntensors, tensor_range, &d);
    if (v == FALLOC_AHEAD && !rc) rc = pthread_create(&ft, NULL, falloc_main, &d);
    if (v == FALLOCATE && !rc && fallocate(d.fd, 0, 0, (off_t)d.len))
        rc = pl_errf(err, sizeof err, "fallocate: %s", strerror(errno));
    for (size_t x = 0; x < n && !rc; x += TENSOR_FLOATS)
        rc = recv_tensor(v, rx, &d, &ahead, x, tensor_len(n, x), err, sizeof err);
    pl_ahead_stop(&ahead);
    if (v == FALLOC_AHEAD) pthread_join(ft, NULL);
    *secs = (pl_now_ms() - t0) / 1e3;
    pthread_join(st, NULL);
    if (rc || s.rc)
        fprintf(stderr, "recv_bench: %s: %s\n", names[v], rc ? err : s.err);
    else if ((*faults = faults_left(&d)), (rc = check(&d, src, n)))
        fprintf(stderr, "recv_bench: %s: wrong bytes\n", names[v]);
    if (v != WARM) dest_free(&d);
    return rc || s.rc ? -1 : 0;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static void print_loadavg(const char *when)
{
    char line[128] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && !fgets(line, sizeof line, f)) snprintf(line, sizeof line, "?\n");
    if (f) fclose(f);
    printf("load average %s: %s", when, line);
}

/* Every variant reps times, interleaved, each repetition starting one variant later (a
 * variant that follows one that freed memory gets the pages the kernel just had back). */
static int bench(pl_conn *tx, pl_conn *rx, float *src, float *warm, size_t n, int reps)
{
    double ts[NVAR][MAXREPS];
    long faults[NVAR] = {0};
    for (int k = 0; k < reps; k++)
        for (int u = 0; u < NVAR; u++) {
            const int v = (u + k) % NVAR;
            if (run_once(v, tx, rx, src, warm, n, &ts[v][k], &faults[v])) return -1;
        }
    const double bytes = (double)n * sizeof(float), warm_t = median(ts[WARM], reps);
    printf("%-24s | %9s | %9s | %7s | %s\n", "variant", "median", "rate", "of warm",
           "faults left");
    for (int v = 0; v < NVAR; v++) {
        const double t = v == WARM ? warm_t : median(ts[v], reps);
        printf("%-24s | %7.0f ms | %4.2f GB/s | %6.0f %% | %ld\n", names[v], t * 1e3,
               bytes / t / 1e9, 100 * warm_t / t, faults[v]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    size_t mb = 512;
    int reps = 5;
    pl_frame_protection mode = PL_PROTECT_INTEGRITY;
    char err[256];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mb") && i + 1 < argc)
            mb = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--huge"))
            huge = 1;
        else if (!(!strcmp(argv[i], "--protection") && i + 1 < argc &&
                   pl_frame_protection_parse(argv[++i], &mode, err, sizeof err) == 0)) {
            fprintf(stderr, "usage: %s [--mb N] [--reps R] [--protection none|integrity|"
                            "encrypt] [--huge]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > MAXREPS || mb < 1) {
        fprintf(stderr, "recv_bench: --reps 1..%d, --mb >= 1\n", MAXREPS);
        return 2;
    }
    const size_t n = mb * 1000 * 1000 / sizeof(float);
    float *src = malloc(TENSOR_FLOATS * sizeof(float)), *warm = malloc(n * sizeof(float));
    pl_conn *tx = NULL, *rx = NULL;
    frame_buf = malloc(PL_COMM_TENSOR_CHUNK_BYTES);
    if (!(cpu = kn_create("cpu", 1, err, sizeof err))) {
        fprintf(stderr, "recv_bench: %s\n", err);
        return 1;
    }
    if (!src || !warm || !frame_buf || pair_open(mode, &tx, &rx)) return 1;
    memset(frame_buf, 0, PL_COMM_TENSOR_CHUNK_BYTES);
    for (size_t i = 0; i < TENSOR_FLOATS; i++) src[i] = (float)(i % 1000) * 0.001f;
    memset(warm, 0, n * sizeof(float));
    printf("recv_bench: %zu MB in %zu-float tensors over loopback TCP, %s frames, %d reps "
           "(median)%s\n", mb, TENSOR_FLOATS, pl_frame_protection_name(pl_conn_protection(rx)),
           reps, huge ? ", MADV_HUGEPAGE" : "");
    print_loadavg("before");
    const int rc = bench(tx, rx, src, warm, n, reps);
    print_loadavg("after");
    pl_conn_close(tx);
    pl_conn_close(rx);
    free(src);
    free(warm);
    free(frame_buf);
    kn_destroy(cpu);
    return rc ? 1 : 0;
}
