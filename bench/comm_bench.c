/* Loopback figures for the worker-to-worker TCP transport (worker/comm/): large tensor
 * send/recv between two threads and ring all-reduce of a 100 MB fp32 buffer among 2, 3
 * and 4 ranks (threads of this process on 127.0.0.1), next to a memcpy baseline taken
 * in the same run. "algbw" = buffer bytes / time; "busbw" = algbw · 2(p−1)/p, the bytes
 * each rank actually sends per second in a ring (comparable with NCCL's figure).
 * Usage: comm_bench [--mb N] [--reps R] */
#include "allreduce.h"
#include "mesh.h"
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

static pl_comm_ident ident(int rank)
{
    static const char *names[MAXR] = {"r0", "r1", "r2", "r3"};
    pl_comm_ident id = {.token = TOKEN, .token_len = strlen(TOKEN), .rank = rank,
                        .name = names[rank], .generation = 1};
    return id;
}

typedef struct {
    pl_listener *l;
    int rank, nranks;
    const char **hosts;
    const int *ports;
    pl_conn *conn[MAXR];
    int rc;
    char err[256];
} mesh_job;

static void *mesh_main(void *arg)
{
    mesh_job *j = arg;
    pl_comm_ident id = ident(j->rank);
    j->rc = pl_comm_mesh(j->l, &id, j->nranks, j->hosts, j->ports, 10000, j->conn, j->err,
                         sizeof j->err);
    return NULL;
}

static int mesh_open(mesh_job *jobs, int n)
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

/* ---- send/recv ---- */

typedef struct {
    pl_conn *c;
    float *x;
    size_t n;
    int reps, rc;
    char err[256];
} stream_job;

static void *sender_main(void *arg)
{
    stream_job *j = arg;
    for (int k = 0; k < j->reps && !j->rc; k++)
        j->rc = pl_conn_send_floats(j->c, (uint32_t)k, j->x, j->n, 30000, j->err, sizeof j->err);
    return NULL;
}

/* ---- all-reduce ---- */

typedef struct {
    mesh_job *m;
    int rank, p;
    float *buf;
    size_t n;
    int reps, rc;
    double t[16];
    pthread_barrier_t *bar;
    char err[256];
} ar_job;

static void *ar_main(void *arg)
{
    ar_job *j = arg;
    int32_t group[MAXR];
    for (int i = 0; i < j->p; i++)
        group[i] = i;
    pl_peer_table pt = {.self = j->rank, .nranks = j->p, .conn = j->m[j->rank].conn};
    for (int k = 0; k < j->reps && !j->rc; k++) {
        pthread_barrier_wait(j->bar);
        double t0 = (pl_now_ms() / 1e3);
        j->rc = pl_ring_allreduce(&pt, group, j->p, j->buf, j->n, (uint32_t)k, 30000, j->err,
                                  sizeof j->err);
        j->t[k] = (pl_now_ms() / 1e3) - t0;
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* memcpy of the buffer on one thread: the baseline, in GB/s. */
static double bench_memcpy(float *a, float *b, size_t n, int reps)
{
    const size_t bytes = n * sizeof(float);
    double ts[16];
    memcpy(b, a, bytes);
    for (int k = 0; k < reps; k++) {
        double t0 = (pl_now_ms() / 1e3);
        memcpy(b, a, bytes);
        ts[k] = (pl_now_ms() / 1e3) - t0;
        a[k] = b[k + 1]; /* keep the copies alive */
    }
    qsort(ts, (size_t)reps, sizeof ts[0], cmp_double);
    double memcpy_gbs = bytes / ts[reps / 2] / 1e9;
    printf("%-34s %9.1f ms %7.2f GB/s\n", "memcpy (one thread)", ts[reps / 2] * 1e3, memcpy_gbs);
    return memcpy_gbs;
}

/* send/recv between two connected threads. 0, or 1 on failure. */
static int bench_stream(float *a, float *b, size_t n, int reps, double memcpy_gbs)
{
    const size_t bytes = n * sizeof(float);
    double ts[16];
    mesh_job m[MAXR];
    if (mesh_open(m, 2))
        return 1;
    stream_job sj = {.c = m[1].conn[0], .x = a, .n = n, .reps = reps};
    pthread_t st;
    pthread_create(&st, NULL, sender_main, &sj);
    char err[256];
    int rc = 0;
    for (int k = 0; k < reps && !rc; k++) {
        double t0 = (pl_now_ms() / 1e3);
        rc = pl_conn_recv_floats(m[0].conn[1], (uint32_t)k, b, n, 30000, err, sizeof err);
        ts[k] = (pl_now_ms() / 1e3) - t0;
    }
    pthread_join(st, NULL);
    mesh_close(m, 2);
    if (rc || sj.rc) {
        fprintf(stderr, "comm_bench: send/recv: %s %s\n", rc ? err : "", sj.rc ? sj.err : "");
        return 1;
    }
    if (memcmp(a, b, bytes) != 0) {
        fprintf(stderr, "comm_bench: send/recv: data differs\n");
        return 1;
    }
    qsort(ts, (size_t)reps, sizeof ts[0], cmp_double);
    double gbs = bytes / ts[reps / 2] / 1e9;
    printf("%-34s %9.1f ms %7.2f GB/s (%.0f%% of memcpy)\n", "send/recv 1 stream",
           ts[reps / 2] * 1e3, gbs, 100 * gbs / memcpy_gbs);
    return 0;
}

/* Runs the all-reduce on p rank threads; ts[k]: the slowest rank's time of repetition k.
 * 0, or 1 on failure (the ranks' results must agree). */
static int run_allreduce(mesh_job *m, int p, size_t n, int reps, double *ts)
{
    const size_t bytes = n * sizeof(float);
    ar_job jobs[MAXR];
    pthread_t t[MAXR];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)p);
    int bad = 0;
    for (int r = 0; r < p; r++) {
        jobs[r] = (ar_job){.m = m, .rank = r, .p = p, .n = n, .reps = reps, .bar = &bar};
        jobs[r].buf = malloc(bytes);
        if (!jobs[r].buf)
            bad = 1;
        else
            for (size_t i = 0; i < n; i++)
                jobs[r].buf[i] = 1e-3f * (float)((i + (size_t)r) % 7);
    }
    if (bad)
        fprintf(stderr, "comm_bench: out of memory for %d ranks\n", p);
    for (int r = 0; r < p && !bad; r++)
        pthread_create(&t[r], NULL, ar_main, &jobs[r]);
    for (int r = 0; r < p && !bad; r++) {
        pthread_join(t[r], NULL);
        if (jobs[r].rc) {
            fprintf(stderr, "comm_bench: all-reduce p=%d rank %d: %s\n", p, r, jobs[r].err);
            bad = 1;
        }
    }
    for (int r = 1; r < p && !bad; r++)
        if (memcmp(jobs[0].buf, jobs[r].buf, bytes) != 0) {
            fprintf(stderr, "comm_bench: all-reduce p=%d: ranks 0 and %d differ\n", p, r);
            bad = 1;
        }
    for (int k = 0; k < reps; k++) {
        ts[k] = 0;
        for (int r = 0; r < p && !bad; r++)
            if (jobs[r].t[k] > ts[k])
                ts[k] = jobs[r].t[k];
    }
    for (int r = 0; r < p; r++)
        free(jobs[r].buf);
    pthread_barrier_destroy(&bar);
    return bad;
}

/* ring all-reduce among p ranks. 0, or 1 on failure. */
static int bench_allreduce(int p, size_t n, int reps, double memcpy_gbs, long cores)
{
    const size_t bytes = n * sizeof(float);
    double ts[16];
    mesh_job m[MAXR];
    if (mesh_open(m, p))
        return 1;
    const int bad = run_allreduce(m, p, n, reps, ts);
    mesh_close(m, p);
    if (bad)
        return 1;
    /* the slowest rank's time per repetition, median over repetitions */
    qsort(ts, (size_t)reps, sizeof ts[0], cmp_double);
    double alg = bytes / ts[reps / 2] / 1e9, bus = alg * 2.0 * (p - 1) / p;
    char name[64];
    snprintf(name, sizeof name, "ring all-reduce, %d ranks", p);
    printf("%-34s %9.1f ms %7.2f GB/s algbw, %5.2f GB/s busbw (%.0f%% of memcpy)%s\n", name,
           ts[reps / 2] * 1e3, alg, bus, 100 * bus / memcpy_gbs,
           p > cores ? "  [more ranks than cores]" : "");
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
        else {
            fprintf(stderr, "usage: %s [--mb N] [--reps R]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 16 || mb < 1) {
        fprintf(stderr, "comm_bench: --reps 1..16, --mb >= 1\n");
        return 2;
    }
    size_t bytes = mb * 1000 * 1000, n = bytes / sizeof(float);
    bytes = n * sizeof(float);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("comm_bench: %zu MB fp32 buffers, loopback TCP, %d reps (median), %ld CPU cores\n",
           bytes / 1000000, reps, cores);
    float *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        fprintf(stderr, "comm_bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(i % 1000) * 0.001f;
    const double memcpy_gbs = bench_memcpy(a, b, n, reps);
    int rc = bench_stream(a, b, n, reps, memcpy_gbs);
    free(b);
    for (int p = 2; p <= MAXR && !rc; p++)
        rc = bench_allreduce(p, n, reps, memcpy_gbs, cores);
    free(a);
    return rc;
}
