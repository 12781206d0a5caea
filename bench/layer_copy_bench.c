/* The layer copy path against one loopback stream, interleaved in one run: a recovery's
 * copy (worker/engine/layer_copy.h, the TCP copier: PL_LAYER_COPY_STREAMS connections per
 * pair) of layers [A, B) of a preset's model, params, AdamW m and v, from a source engine
 * to a destination engine (two workers' meshes on 127.0.0.1, threads of this process, CPU
 * engines), and the same bytes sent over one connection of the same meshes with
 * send/recv (what comm_bench's "send/recv 1 stream" row measures). Both use the default
 * frame protection. Repetitions alternate the two after one untimed warm-up of each, so
 * a change in the machine's load moves both; the row prints each one's median and the
 * copy's throughput as a share of the stream's, and the share in each repetition.
 * What make bench-recovery measures inside a job, here without the job's other work.
 * Usage: layer_copy_bench [--preset NAME] [--layers A:B] [--reps N] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobspec.h"
#include "layer_copy.h"
#include "util.h"

#define HOST "127.0.0.1"
#define TOKEN "layer-copy-bench"
#define MAXREPS 32
#define TIMEOUT_MS 60000

typedef struct {
    const char *name;
    pl_listener *l;
    pl_mesh *m;
    kn_ctx *k;
    pl_engine e;
    pl_msg_plan plan;
    pl_msg_copy copies[64];
    pl_msg_send sends[64];
    pl_msg_peer peer;
    pl_layer_copy_result res;
    int rc;
    char err[512];
} node;

static pl_gpt_config cfg;
static pl_msg_pipeline pipe_of_dst;
static pl_proto_name pipe_names[1] = {"dst"};
static int pipe_layers[2];

static void quiet(void *ctx, const char *line) { (void)ctx, (void)line; }
static int never(void *ctx) { return (void)ctx, 0; }

/* A worker: its listener, mesh and CPU engine of layers [a, b); the source's arrays hold
 * values, the destination's are made present (the job's reserve does that in a worker). */
static int node_open(node *x, const char *name, int a, int b, char *err, size_t errlen)
{
    memset(x, 0, sizeof *x);
    x->name = name;
    if (pl_listener_open(HOST, 0, &x->l, err, errlen)) return -1;
    pl_mesh_config mc = {.listener = x->l, .token = TOKEN, .token_len = strlen(TOKEN),
                         .name = name, .cancelled = never, .log = quiet, .redial = 1};
    if (pl_mesh_create(&mc, &x->m, err, errlen)) return -1;
    if (!(x->k = kn_create("cpu", 1, err, errlen))) return -1;
    if (pl_engine_create(&x->e, x->k, &cfg, a, b, 1, 64, 1, err, errlen)) return -1;
    float *arrays[3] = {x->e.params, x->e.m, x->e.v};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < x->e.nparams; i++) arrays[k][i] = (float)(i % 1000) * 1e-3f;
    return 0;
}

static void node_close(node *x)
{
    pl_engine_destroy(&x->e);
    if (x->k) kn_destroy(x->k);
    pl_mesh_destroy(x->m);
    pl_listener_close(x->l);
}

/* The plans of one copy: dst runs [a, b) and takes every layer of it from src. */
static void plan_copies(node *src, node *dst, int a, int b)
{
    pipe_layers[0] = a;
    pipe_layers[1] = b;
    pipe_of_dst = (pl_msg_pipeline){.nnodes = 1, .template_nodes = 1, .nodes = pipe_names,
                                    .layers = pipe_layers, .microbatches = 1};
    node *ends[2] = {src, dst};
    for (int i = 0; i < 2; i++) {
        node *x = ends[i], *other = ends[1 - i];
        snprintf(x->peer.name, sizeof x->peer.name, "%s", other->name);
        snprintf(x->peer.host, sizeof x->peer.host, HOST);
        x->peer.port = pl_listener_port(other->l);
        x->plan = (pl_msg_plan){.npipelines = 1, .pipelines = &pipe_of_dst,
                                .you_pipeline = x == dst ? 0 : -1,
                                .you_layer_end = x == dst ? b : 0, .copies = x->copies,
                                .sends = x->sends, .npeers = 1, .peers = &x->peer,
                                .transport = PL_TRANSPORT_TCP};
    }
    for (int l = a; l < b; l++) {
        dst->copies[dst->plan.ncopies++] = (pl_msg_copy){.layer = l, .source = "src"};
        src->sends[src->plan.nsends++] = (pl_msg_send){.layer = l, .dest = "dst"};
    }
}

static void *copy_main(void *arg)
{
    node *x = arg;
    pl_layer_copy_tcp tcp = {.mesh = x->m};
    const pl_layer_copier c = pl_layer_copier_tcp(&tcp);
    const int is_dst = x->plan.you_pipeline == 0;
    const pl_layer_copy_job job = {.plan = &x->plan, .self = x->name, .cfg = &cfg,
                                   .src = is_dst ? NULL : &x->e, .dst = is_dst ? &x->e : NULL};
    x->res = (pl_layer_copy_result){0};
    x->rc = c.copy(&c, &job, &x->res, x->err, sizeof x->err);
    return NULL;
}

/* One copy of generation gen; *secs from the start to both ends' return. */
static int copy_once(node *src, node *dst, uint64_t gen, double *secs)
{
    pl_mesh_set_plan(src->m, gen, PL_COMM_NO_RANK);
    pl_mesh_set_plan(dst->m, gen, 0);
    src->plan.generation = dst->plan.generation = gen;
    const double t0 = pl_now_ms();
    pthread_t th;
    pthread_create(&th, NULL, copy_main, src);
    copy_main(dst);
    pthread_join(th, NULL);
    *secs = (pl_now_ms() - t0) / 1e3;
    if (src->rc) fprintf(stderr, "layer_copy_bench: source: %s\n", src->err);
    if (dst->rc) fprintf(stderr, "layer_copy_bench: destination: %s\n", dst->err);
    return src->rc || dst->rc;
}

typedef struct {
    pl_conn *c;
    const pl_engine *e;
    int rep, rc;
    char err[256];
} stream_send;

/* The three arrays as three tensors: the bytes the copy moves (and the padding between
 * layers, a page each, which the copy skips). */
static void *stream_send_main(void *arg)
{
    stream_send *s = arg;
    const float *arrays[3] = {s->e->params, s->e->m, s->e->v};
    s->rc = 0;
    for (int k = 0; k < 3 && !s->rc; k++)
        s->rc = pl_conn_send_floats(s->c, (uint32_t)(3 * s->rep + k), arrays[k], s->e->nparams,
                                    TIMEOUT_MS, s->err, sizeof s->err);
    return NULL;
}

static int stream_once(pl_conn *out, pl_conn *in, const pl_engine *src, pl_engine *dst, int rep,
                       double *secs)
{
    stream_send s = {.c = out, .e = src, .rep = rep};
    float *arrays[3] = {dst->params, dst->m, dst->v};
    char err[256] = "";
    const double t0 = pl_now_ms();
    pthread_t th;
    pthread_create(&th, NULL, stream_send_main, &s);
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++)
        rc = pl_conn_recv_floats(in, (uint32_t)(3 * rep + k), arrays[k], dst->nparams, TIMEOUT_MS,
                                 err, sizeof err);
    pthread_join(th, NULL);
    *secs = (pl_now_ms() - t0) / 1e3;
    if (rc || s.rc) fprintf(stderr, "layer_copy_bench: stream: %s %s\n", err, s.err);
    return rc || s.rc;
}

typedef struct {
    node *dst;
    pl_conn *c;
    char err[256];
} stream_accept;

static void *stream_accept_main(void *arg)
{
    stream_accept *a = arg;
    if (pl_mesh_accept(a->dst->m, PL_MESH_PURPOSE(PL_CONN_STAGE_LINK), 0,
                       pl_now_ms() + TIMEOUT_MS, &a->c, a->err, sizeof a->err))
        a->c = NULL;
    return NULL;
}

/* One connection from src to dst, its frames protected as the copies' are. */
static int stream_open(node *src, node *dst, pl_conn **out, pl_conn **in)
{
    pl_mesh_set_plan(src->m, 1, 0);
    pl_mesh_set_plan(dst->m, 1, 1);
    stream_accept a = {.dst = dst};
    pthread_t th;
    pthread_create(&th, NULL, stream_accept_main, &a);
    char err[256];
    const int rc = pl_mesh_dial(src->m, HOST, pl_listener_port(dst->l), PL_CONN_STAGE_LINK, 1,
                                TIMEOUT_MS, out, err, sizeof err);
    pthread_join(th, NULL);
    *in = a.c;
    if (rc) fprintf(stderr, "layer_copy_bench: dial: %s\n", err);
    if (!a.c) fprintf(stderr, "layer_copy_bench: accept: %s\n", a.err);
    return rc || !a.c;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double s[MAXREPS];
    memcpy(s, v, (size_t)n * sizeof *v);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return s[n / 2];
}

static int run(const char *preset, int a, int b, int reps)
{
    node src, dst;
    char err[512];
    if (node_open(&src, "src", a, b, err, sizeof err) ||
        node_open(&dst, "dst", a, b, err, sizeof err)) {
        fprintf(stderr, "layer_copy_bench: %s\n", err);
        return 1;
    }
    plan_copies(&src, &dst, a, b);
    pl_conn *out = NULL, *in = NULL;
    double tc[MAXREPS], ts[MAXREPS], warm;
    int bad = stream_open(&src, &dst, &out, &in) ||
              stream_once(out, in, &src.e, &dst.e, 0, &warm) || copy_once(&src, &dst, 2, &warm);
    for (int r = 0; r < reps && !bad; r++)
        bad = stream_once(out, in, &src.e, &dst.e, r + 1, &ts[r]) ||
              copy_once(&src, &dst, (uint64_t)r + 3, &tc[r]);
    const double copied = (double)dst.res.bytes_in;
    if (!bad) {
        const double stream_bytes = 3.0 * (double)src.e.nparams * sizeof(float);
        const double c = copied / median(tc, reps) / 1e9;
        const double s = stream_bytes / median(ts, reps) / 1e9;
        printf("%s layers [%d, %d): %.0f MB, %d reps, default frame protection\n", preset, a, b,
               copied / 1e6, reps);
        printf("layer copy (%d streams) %7.1f ms %5.2f GB/s | send/recv 1 stream %7.1f ms "
               "%5.2f GB/s | copy / stream %3.0f%%\n",
               PL_LAYER_COPY_STREAMS, median(tc, reps) * 1e3, c, median(ts, reps) * 1e3, s,
               100 * c / s);
        printf("per repetition:");
        for (int r = 0; r < reps; r++)
            printf(" %.0f%%", 100 * (copied / tc[r]) / (stream_bytes / ts[r]));
        printf("\n");
    }
    pl_conn_close(out);
    pl_conn_close(in);
    node_close(&src);
    node_close(&dst);
    return bad;
}

int main(int argc, char **argv)
{
    const char *preset = "gpt2-124m";
    int a = 6, b = 12, reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc &&
                 sscanf(argv[++i], "%d:%d", &a, &b) == 2)
            continue;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: layer_copy_bench [--preset NAME] [--layers A:B] [--reps N]\n");
            return 2;
        }
    }
    pl_model_spec m;
    char err[256];
    if (pl_model_preset(preset, &m)) {
        fprintf(stderr, "layer_copy_bench: --preset: unknown model preset \"%s\"\n", preset);
        return 2;
    }
    if (pl_gpt_config_init(&cfg, m.layers, m.channels, m.heads, m.vocab_size, m.max_seq_len, err,
                           sizeof err)) {
        fprintf(stderr, "layer_copy_bench: %s\n", err);
        return 2;
    }
    if (a < 0 || b > pl_gpt_nlayers(&cfg) || a >= b) {
        fprintf(stderr, "layer_copy_bench: --layers: [%d, %d) is not a range within [0, %d)\n",
                a, b, pl_gpt_nlayers(&cfg));
        return 2;
    }
    if (reps < 1 || reps > MAXREPS) {
        fprintf(stderr, "layer_copy_bench: --reps: %d is not 1 .. %d\n", reps, MAXREPS);
        return 2;
    }
    return run(preset, a, b, reps);
}
