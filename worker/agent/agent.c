/* The worker process's main loop (agent.h): the control thread serves the coordinator's
 * connection and queues its messages; the compute thread installs plans, runs steps and
 * applies commits. The peer connections are the mesh's (worker/comm/mesh.h), layer copies
 * the copiers' (worker/engine/layer_copy.h), the NCCL world nccl_plan.h's, the recovery
 * tests' faults fault.h's. */
#include "agent.h"

#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "allreduce.h"
#include "checkpoint.h"
#include "checkpoint_writer.h"
#include "control_client.h"
#include "engine.h"
#include "fault.h"
#include "jobspec.h"
#include "layer_copy.h"
#include "mesh.h"
#include "msg_queue.h"
#include "nccl_plan.h"
#include "protocol.h"
#include "sampler.h"
#include "schedule.h"
#include "stage_link.h"
#include "syncgroups.h"
#include "tcp.h"
#include "tokens.h"
#include "trainer.h"
#include "util.h"
#include "worker_step.h"

/* A peer that makes no progress for this long has failed (dials, the step's links). */
#define PEER_TIMEOUT_MS 60000
#define SUPERSEDED_MSG "superseded by a newer plan"

typedef struct {
    const pl_agent_options *o;
    pl_job job;
    int have_job;
    pl_gpt_config cfg;
    pl_tokens train;
    int have_train;
    pl_sampler smp;
    pl_ctl_client *cli;   /* replaced on reconnection under cli_mu (posts come from any thread) */
    pthread_mutex_t cli_mu;
    pl_ctl_client_config cc;
    char coordinator_host[PL_PROTO_HOST_MAX + 1]; /* cc.host */
    atomic_int disconnected; /* the control connection closed: reconnect (a new coordinator) */
    double lost_since;       /* control thread: when the connection was lost; -1: connected */
    int reconnects;
    pl_checkpoint_writer *ckw;  /* checkpoints of this worker's layers, in the background */
    pl_fault fault;
    pl_proto_name broken; /* the peer whose link or copy failed the plan being installed */
    pl_msg_queue *queue;  /* the control thread's messages for the compute thread */

    pthread_mutex_t mu;   /* the fields marked "under mu" */
    pthread_cond_t cv;    /* nccl_init arrived */
    atomic_int done;      /* the control loop ends */
    atomic_int exit_code;
    atomic_llong newest_plan; /* the newest plan generation received (control thread) */

    /* compute thread state */
    kn_ctx *k;
    pl_engine e;
    int have_engine;
    pl_engine src;   /* the engine of the last plan before this one: copy source until */
    int have_src;    /* the next start_step (the coordinator's stable plan) */
    pl_schedule sched;
    int have_sched;
    pl_listener *lst;
    pl_mesh *mesh;   /* the peer connections over lst */
    int nranks;
    pl_conn **conns; /* ring connections by plan rank */
    pl_tcp_link *link;
    pl_nccl_plan *ncp;    /* under mu: the NCCL world of a plan whose transport is nccl */
    char nccl_id[PL_PROTO_NCCL_ID_HEX + 1]; /* under mu: the id of nccl_init for nccl_gen */
    int64_t nccl_gen;
    pl_syncgroups g;
    int have_groups;
    int64_t gen;
    /* under mu: the step running (its links may be interrupted from the control
     * thread) and the newest step the coordinator aborted */
    int stepping;
    int64_t aborted_gen, aborted_step;
    /* under mu: what hello_resume tells a new coordinator */
    int64_t last_committed, reduced_step;
    double last_scale, last_lr;
    int rank, pipe, stage, nstages;
    int first_mb, nmb, global_micro;
    int32_t *tok, *tgt;
    size_t tokcap;
} agent;

static void logf_(agent *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(agent *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "worker %s: ", a->o->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void fail(agent *a, const char *what, const char *err)
{
    logf_(a, "%s: %s", what, err);
    atomic_store(&a->exit_code, 1);
    atomic_store(&a->done, 1);
}

static int post(agent *a, pl_msg *m)
{
    pthread_mutex_lock(&a->cli_mu);
    int rc = a->cli ? pl_ctl_client_post(a->cli, m) : -1; /* lost while disconnected */
    pthread_mutex_unlock(&a->cli_mu);
    pl_msg_free(m);
    return rc;
}

/* What heartbeats carry: the plan generation and the step (step < 0: unchanged). */
static void tell_client(agent *a, int64_t gen, int64_t step)
{
    pthread_mutex_lock(&a->cli_mu);
    if (a->cli) {
        pl_ctl_client_set_gen(a->cli, gen);
        if (step >= 0) pl_ctl_client_set_step(a->cli, step);
    }
    pthread_mutex_unlock(&a->cli_mu);
}

/* A newer plan is waiting: the one being installed can be given up. Read by the compute
 * thread and the threads it waits for (copy senders, NCCL's), never while a->gen moves. */
static int superseded(agent *a)
{
    return atomic_load(&a->newest_plan) > a->gen || atomic_load(&a->done);
}

/* The mesh's cancel test and log (mesh.h). */
static int mesh_cancelled(void *ctx) { return superseded(ctx); }

static void mesh_log(void *ctx, const char *line) { logf_(ctx, "%s", line); }

static void teardown_links(agent *a)
{
    pthread_mutex_lock(&a->mu);
    pl_tcp_link *link = a->link;
    pl_nccl_plan *ncp = a->ncp;
    a->link = NULL;
    a->ncp = NULL;
    pthread_mutex_unlock(&a->mu);
    pl_tcp_link_destroy(link);
    pl_nccl_plan_close(ncp);
    if (a->conns) {
        for (int r = 0; r < a->nranks; r++) pl_conn_close(a->conns[r]);
        free(a->conns);
        a->conns = NULL;
    }
    if (a->have_groups) {
        pl_syncgroups_free(&a->g);
        a->have_groups = 0;
    }
    if (a->have_sched) {
        pl_schedule_free(&a->sched);
        a->have_sched = 0;
    }
}

/* ---- the engine of a plan ---- */

/* The engine of the last plan becomes the copy source; one of a plan that never started a
 * step is dropped (the source stays the one of the plan before). */
static void retire_engine(agent *a)
{
    if (!a->have_engine) return;
    if (!a->have_src) {
        a->src = a->e;
        a->have_src = 1;
    } else {
        pl_engine_destroy(&a->e);
    }
    a->have_engine = 0;
    memset(&a->e, 0, sizeof a->e);
}

/* A plan that leaves this worker's layers as they are keeps the engine. */
static int keep_engine(agent *a, const pl_msg_plan *p, int b, int e, int nslots)
{
    if (p->nsends || p->ncopies || !a->have_src || a->src.begin != b || a->src.end != e ||
        a->src.nslots != nslots)
        return 0;
    a->e = a->src;
    a->have_engine = 1;
    a->have_src = 0;
    memset(&a->src, 0, sizeof a->src);
    return 1;
}

/* A new engine for layers [b, e): what this worker held is copied over, and a first plan
 * (nothing held, nothing to copy) starts from the job's initial state. */
static int new_engine(agent *a, const pl_layer_copy_job *job, int b, int e, int nslots,
                      char *err, size_t errlen)
{
    int fresh = 0;
    if (pl_engine_create(job->dst, a->k, &a->cfg, b, e, a->job.batch.micro,
                         a->job.batch.seq_len, nslots, err, errlen))
        return -1;
    if (pl_layer_copy_local(job, &fresh, err, errlen) ||
        (fresh && pl_engine_init_from_job(job->dst, &a->job, err, errlen))) {
        pl_engine_destroy(job->dst);
        return -1;
    }
    return 0;
}

/* Installs the engine of the plan: for a pipeline worker (in_pipe) layers [b, e) with
 * nslots; the plan's copies over TCP arrive in it and its sends are served from the
 * previous engine (layer_copy.h; those over NCCL come later, install_nccl). *bytes_in:
 * bytes received. */
static int change_engine(agent *a, const pl_msg_plan *p, int in_pipe, int b, int e, int nslots,
                         int64_t *bytes_in, char *err, size_t errlen)
{
    *bytes_in = 0;
    retire_engine(a);
    if (in_pipe && keep_engine(a, p, b, e, nslots)) return 0;
    pl_engine ne;
    memset(&ne, 0, sizeof ne);
    pl_layer_copy_job job = {.plan = p, .self = a->o->name, .cfg = &a->cfg,
                             .src = a->have_src ? &a->src : NULL, .dst = in_pipe ? &ne : NULL};
    if (in_pipe && new_engine(a, &job, b, e, nslots, err, errlen)) return -1;
    pl_layer_copy_tcp tcp = {.mesh = a->mesh, .after_send = pl_fault_after_copy_send,
                             .hook_ctx = &a->fault};
    const pl_layer_copier copier = pl_layer_copier_tcp(&tcp);
    pl_layer_copy_result res = {0};
    const int rc = copier.copy(&copier, &job, &res, err, errlen);
    *bytes_in = res.bytes_in;
    if (res.failed_peer[0]) snprintf(a->broken, sizeof a->broken, "%s", res.failed_peer);
    if (rc == 0 && in_pipe) {
        a->e = ne;
        a->have_engine = 1;
    } else if (in_pipe) {
        pl_engine_destroy(&ne);
    }
    return rc;
}

/* A plan that restarts from a checkpoint: the engine (initialised from the job
 * by change_engine, which is the state of step 0) loads the checkpoint's layers. */
static int load_checkpoint(agent *a, const pl_msg_plan *p, char *err, size_t errlen)
{
    if (!p->has_checkpoint || p->checkpoint_step == 0) return 0;
    char dir[PL_PROTO_PATH_MAX + 32];
    if (pl_pathf(dir, sizeof dir, err, errlen, "%s/step-%08lld", p->checkpoint_dir,
                 (long long)p->checkpoint_step))
        return -1;
    double t0 = pl_now_ms();
    if (pl_checkpoint_load(&a->e, dir, 1, err, errlen)) return -1;
    logf_(a, "generation %lld: layers [%d, %d) loaded from %s in %.1f ms", (long long)a->gen,
          a->e.begin, a->e.end, dir, pl_now_ms() - t0);
    return 0;
}

/* The writer thread finished this worker's part of a checkpoint. */
static void on_saved(void *user, int64_t step, int begin, int end, int rc, int64_t bytes,
                     const char *err)
{
    agent *a = user;
    if (rc) { /* the checkpoint stays incomplete; training goes on */
        logf_(a, "checkpoint of step %lld: %s", (long long)step, err);
        return;
    }
    pl_msg m;
    pl_msg_init(&m, PL_MSG_SAVED, atomic_load(&a->newest_plan));
    m.u.saved.step = step;
    m.u.saved.layer_begin = begin;
    m.u.saved.layer_end = end;
    m.u.saved.bytes = bytes;
    post(a, &m);
}

/* ---- installing a plan ---- */

/* The layer count of a plan (decoding checked that every pipeline has it). */
static int mp_last(const pl_msg_plan *p)
{
    return p->pipelines[0].layers[p->pipelines[0].nnodes];
}

/* This worker's place in the plan (its rank: its position in the pipelines flattened in
 * order), the sync groups of every layer and its stage's schedule. */
static int place_in_plan(agent *a, const pl_msg_plan *p, char *err, size_t errlen)
{
    if (p->npipelines < 1) return pl_errf(err, errlen, "pipelines: none in the plan");
    int n = 0;
    for (int q = 0; q < p->npipelines; q++) n += p->pipelines[q].nnodes;
    pl_sync_pipeline *pipes = calloc((size_t)p->npipelines, sizeof *pipes);
    pl_sync_stage *stages = calloc((size_t)n, sizeof *stages);
    int rc = -1;
    a->nranks = n;
    a->rank = -1;
    if (!pipes || !stages) {
        pl_errf(err, errlen, "out of memory");
        goto out;
    }
    for (int q = 0, r = 0; q < p->npipelines; q++) {
        const pl_msg_pipeline *mp = &p->pipelines[q];
        pipes[q].nstages = mp->nnodes;
        pipes[q].stages = &stages[r];
        for (int j = 0; j < mp->nnodes; j++, r++) {
            stages[r] = (pl_sync_stage){.rank = r, .layer_begin = mp->layers[j],
                                        .layer_end = mp->layers[j + 1]};
            if (strcmp(mp->nodes[j], a->o->name)) continue;
            a->rank = r;
            a->stage = j;
            a->nstages = mp->nnodes;
            a->first_mb = (int)mp->first_microbatch;
            a->nmb = (int)mp->microbatches;
        }
    }
    if (a->rank < 0) {
        pl_errf(err, errlen, "plan has a place for this worker but does not name it");
        goto out;
    }
    if (mp_last(p) != a->cfg.L + 2) {
        pl_errf(err, errlen, "plan covers %d layers, the model has %d", mp_last(p), a->cfg.L + 2);
        goto out;
    }
    if (pl_syncgroups_compute(pipes, p->npipelines, a->cfg.L, &a->g, err, errlen)) goto out;
    a->have_groups = 1;
    if (pl_schedule_1f1b(a->nstages, a->stage, a->nmb, &a->sched, err, errlen)) goto out;
    a->have_sched = 1;
    rc = 0;
out:
    free(pipes);
    free(stages);
    return rc;
}

/* The step's token buffers, for the plan's global batch. */
static int size_batch(agent *a, const pl_msg_plan *p, char *err, size_t errlen)
{
    a->global_micro = (int)(p->global_batch / p->micro);
    size_t need = (size_t)p->global_batch * (size_t)p->seq_len;
    if (need <= a->tokcap) return 0;
    free(a->tok);
    free(a->tgt);
    a->tok = calloc(need, sizeof *a->tok);
    a->tgt = calloc(need, sizeof *a->tgt);
    a->tokcap = need;
    if (a->tok && a->tgt) return 0;
    a->tokcap = 0;
    return pl_errf(err, errlen, "out of memory");
}

/* pl_nccl_plan_open's cancel test: polled by the compute thread while NCCL waits for
 * other ranks (the only thread that reads a->gen). */
static int nccl_cancelled(void *ctx) { return superseded((agent *)ctx); }

/* Rank 0 makes the world's id and sends it to the coordinator (nccl_root). */
static int send_nccl_root(agent *a, char *err, size_t errlen)
{
    pl_msg m;
    pl_msg_init(&m, PL_MSG_NCCL_ROOT, a->gen);
    if (pl_nccl_plan_make_id(m.u.nccl_root.id, sizeof m.u.nccl_root.id, err, errlen)) return -1;
    if (post(a, &m)) return pl_errf(err, errlen, "cannot send nccl_root");
    return 0;
}

/* A time on pl_now_ms's clock as a timespec: a->cv's clock (pl_agent_run). */
static struct timespec timespec_at(double ms)
{
    const time_t sec = (time_t)(ms / 1e3);
    return (struct timespec){.tv_sec = sec, .tv_nsec = (long)((ms - 1e3 * (double)sec) * 1e6)};
}

/* The id of the coordinator's nccl_init for this generation into id; "" when a newer plan
 * came first or it did not come while copies may take (ranks join after their TCP copies
 * from idle sources). */
static void wait_nccl_id(agent *a, char id[PL_PROTO_NCCL_ID_HEX + 1])
{
    const double deadline = pl_now_ms() + PL_LAYER_COPY_TIMEOUT_MS;
    id[0] = 0;
    pthread_mutex_lock(&a->mu);
    while (a->nccl_gen != a->gen && !superseded(a) && pl_now_ms() < deadline) {
        const struct timespec ts = timespec_at(pl_now_ms() + 100); /* superseded is polled */
        pthread_cond_timedwait(&a->cv, &a->mu, &ts);
    }
    if (a->nccl_gen == a->gen) memcpy(id, a->nccl_id, PL_PROTO_NCCL_ID_HEX + 1);
    pthread_mutex_unlock(&a->mu);
}

/* A plan on NCCL (docs/nccl.md): rank 0 makes the world's id and sends it (nccl_root);
 * every rank waits for the coordinator's nccl_init of this generation and joins. */
static int join_nccl(agent *a, char *err, size_t errlen)
{
    char why[256], id[PL_PROTO_NCCL_ID_HEX + 1];
    if (!pl_nccl_plan_supported(a->k, why, sizeof why))
        return pl_errf(err, errlen, "the plan's transport is nccl but %s", why);
    if (a->rank == 0 && send_nccl_root(a, err, errlen)) return -1;
    wait_nccl_id(a, id);
    if (!id[0])
        return pl_errf(err, errlen, "%s", superseded(a) ? SUPERSEDED_MSG
                                                        : "no nccl_init from the coordinator");
    pl_nccl_plan *ncp;
    const double t0 = pl_now_ms();
    /* cancelled by a newer plan (or the exit): the create waits for every rank, and
     * one that died after rank 0's nccl_root never comes */
    if (pl_nccl_plan_open(a->k, id, a->nranks, a->rank, &a->g, PL_LAYER_COPY_TIMEOUT_MS,
                          nccl_cancelled, a, &ncp, err, errlen)) {
        if (superseded(a)) pl_errf(err, errlen, "%s", SUPERSEDED_MSG);
        return -1;
    }
    logf_(a, "generation %lld: joined the NCCL world as rank %d of %d in %.1f ms",
          (long long)a->gen, a->rank, a->nranks, pl_now_ms() - t0);
    pthread_mutex_lock(&a->mu);
    a->ncp = ncp;
    /* A newer plan (or the exit) that came while a->ncp was still NULL found nothing
     * to abort: newest_plan / done are set before the control thread takes mu. */
    if (superseded(a)) pl_nccl_plan_abort(ncp, SUPERSEDED_MSG);
    pthread_mutex_unlock(&a->mu);
    return 0;
}

/* The NCCL side of a plan: the world, then the layer copies between ranks over it (those
 * from idle sources came over TCP in change_engine); the steps run on it. */
static int install_nccl(agent *a, const pl_msg_plan *p, int64_t *bytes_in, char *err,
                        size_t errlen)
{
    if (join_nccl(a, err, errlen)) return -1;
    if (!pl_layer_copy_xport_possible(p)) return 0;
    const pl_layer_copier copier = pl_layer_copier_xport(pl_nccl_plan_xport(a->ncp));
    const pl_layer_copy_job job = {.plan = p, .self = a->o->name, .cfg = &a->cfg,
                                   .src = a->have_src ? &a->src : NULL, .dst = &a->e};
    pl_layer_copy_result res = {0};
    const int rc = copier.copy(&copier, &job, &res, err, errlen);
    *bytes_in += res.bytes_in;
    return rc;
}

/* The ranks this one shares a sync group with, as ring neighbours: a ring all-reduce talks
 * to the rank's two neighbours in each group's order only, O(n) connections rather than a
 * full mesh (what a reconfiguration must set up again). */
static void ring_neighbours(const agent *a, unsigned char *ring)
{
    const pl_sync_rank *sr = pl_syncgroups_rank(&a->g, a->rank);
    for (int i = 0; sr && i < sr->ngroups; i++) {
        const pl_sync_group *grp = pl_syncgroups_group(&a->g, sr->keys[i]);
        for (int j = 0; grp && j < grp->nranks; j++)
            if (grp->ranks[j] == a->rank) {
                ring[grp->ranks[(j + 1) % grp->nranks]] = 1;
                ring[grp->ranks[(j + grp->nranks - 1) % grp->nranks]] = 1;
            }
    }
    ring[a->rank] = 0;
}

static int start_stage_link(agent *a, pl_conn *prev, pl_conn *next, char *err, size_t errlen)
{
    int fp, fn;
    pl_tcp_link_pending_limits(&a->sched, &fp, &fn);
    pl_tcp_link_config lc = {.stage = a->stage, .prev = prev, .next = next,
                             .timeout_ms = PEER_TIMEOUT_MS, .max_pending_prev = fp > 0 ? fp : 1,
                             .max_pending_next = fn > 0 ? fn : 1};
    pl_tcp_link *link;
    if (pl_tcp_link_create(&lc, &link, err, errlen)) return -1;
    pthread_mutex_lock(&a->mu);
    a->link = link;
    pthread_mutex_unlock(&a->mu);
    return 0;
}

/* The TCP side of a plan: ring connections to the sync-group neighbours and the stage
 * links, over the mesh (the higher rank dials); a dial that fails names its peer. */
static int connect_tcp_peers(agent *a, const pl_msg_plan *p, char *err, size_t errlen)
{
    const int n = a->nranks;
    const char **names = calloc((size_t)n, sizeof *names);
    const char **hosts = calloc((size_t)n, sizeof *hosts);
    int *ports = calloc((size_t)n, sizeof *ports);
    unsigned char *ring = calloc((size_t)n, 1);
    a->conns = calloc((size_t)n, sizeof *a->conns);
    int rc = -1;
    if (!names || !hosts || !ports || !ring || !a->conns) {
        pl_errf(err, errlen, "out of memory");
        goto out;
    }
    for (int q = 0, r = 0; q < p->npipelines; q++)
        for (int j = 0; j < p->pipelines[q].nnodes; j++, r++) {
            const pl_msg_peer *peer = pl_msg_plan_peer(p, p->pipelines[q].nodes[j]);
            names[r] = p->pipelines[q].nodes[j];
            hosts[r] = peer ? peer->host : NULL;
            ports[r] = peer ? peer->port : 0;
        }
    ring_neighbours(a, ring);
    const pl_mesh_peers peers = {
        .nranks = n, .names = names, .hosts = hosts, .ports = ports, .ring = ring,
        .link_prev = a->stage > 0 ? a->rank - 1 : -1,
        .link_next = a->stage + 1 < a->nstages ? a->rank + 1 : -1};
    pl_mesh_links links = {.ring = a->conns};
    if (pl_mesh_connect(a->mesh, &peers, PEER_TIMEOUT_MS, &links, err, errlen)) {
        if (links.failed_rank >= 0)
            snprintf(a->broken, sizeof a->broken, "%s", names[links.failed_rank]);
        goto out;
    }
    rc = start_stage_link(a, links.prev, links.next, err, errlen);
out:
    free(names);
    free(hosts);
    free(ports);
    free(ring);
    return rc;
}

/* Installs a plan: this worker's place, its engine and layer copies, its checkpoint when the
 * plan restarts from one, then its peer connections on the plan's transport. An idle worker
 * only serves its sends. */
static int install_plan(agent *a, const pl_msg *m, int64_t *bytes_in, char *err, size_t errlen)
{
    const pl_msg_plan *p = &m->u.plan;
    a->broken[0] = 0;
    teardown_links(a);
    pthread_mutex_lock(&a->mu);
    a->gen = m->gen;
    pthread_mutex_unlock(&a->mu);
    tell_client(a, a->gen, -1);
    pl_fault_set_plan(&a->fault, a->gen);
    a->pipe = p->you_pipeline;
    *bytes_in = 0;
    if (p->has_checkpoint) { /* a restart: the checkpoint replaces whatever is held */
        if (a->have_engine) pl_engine_destroy(&a->e);
        if (a->have_src) pl_engine_destroy(&a->src);
        a->have_engine = a->have_src = 0;
    }
    if (p->you_pipeline < 0) { /* idle: serve the sends only */
        pl_mesh_set_plan(a->mesh, (uint64_t)a->gen, PL_COMM_NO_RANK);
        return change_engine(a, p, 0, 0, 0, 0, bytes_in, err, errlen);
    }
    if (p->micro != a->job.batch.micro || p->seq_len != a->job.batch.seq_len ||
        p->global_batch != a->job.batch.global)
        return pl_errf(err, errlen, "plan batch %lld×%d (micro %d) differs from the job's",
                       (long long)p->global_batch, p->seq_len, p->micro);
    if (place_in_plan(a, p, err, errlen)) return -1;
    pl_mesh_set_plan(a->mesh, (uint64_t)a->gen, a->rank);
    const double tc = pl_now_ms();
    const int ob = a->have_src ? a->src.begin : a->have_engine ? a->e.begin : 0;
    const int oe = a->have_src ? a->src.end : a->have_engine ? a->e.end : 0;
    if (change_engine(a, p, 1, p->you_layer_begin, p->you_layer_end, a->sched.nslots, bytes_in,
                      err, errlen) ||
        load_checkpoint(a, p, err, errlen))
        return -1;
    if (p->ncopies || p->nsends)
        logf_(a, "generation %lld: layers [%d, %d) -> [%d, %d), received %d layers (%lld bytes), "
              "sent %d, in %.1f ms", (long long)a->gen, ob, oe, p->you_layer_begin,
              p->you_layer_end, p->ncopies, (long long)*bytes_in, p->nsends, pl_now_ms() - tc);
    if (size_batch(a, p, err, errlen)) return -1;
    if (p->transport == PL_TRANSPORT_NCCL) return install_nccl(a, p, bytes_in, err, errlen);
    return connect_tcp_peers(a, p, err, errlen);
}

/* ---- steps ---- */

/* Control thread, on `abort`: a step blocked on a dead peer's links fails now
 * instead of at its timeout; one not started yet is skipped. */
static void abort_step(agent *a, int64_t gen, int64_t step)
{
    pthread_mutex_lock(&a->mu);
    a->aborted_gen = gen;
    a->aborted_step = step;
    if (a->reduced_step == step) a->reduced_step = -1;
    if (a->stepping && gen == a->gen) {
        if (a->link) pl_tcp_link_abort(a->link, "step aborted by the coordinator");
        pl_nccl_plan_abort(a->ncp, "step aborted by the coordinator");
        for (int r = 0; a->conns && r < a->nranks; r++) pl_conn_shutdown(a->conns[r]);
    }
    pthread_mutex_unlock(&a->mu);
}

/* Marks the step running; 0 when the coordinator aborted it already. */
static int step_begin(agent *a, int64_t s)
{
    pthread_mutex_lock(&a->mu);
    int go = !(a->aborted_gen == a->gen && a->aborted_step == s);
    a->stepping = go;
    pthread_mutex_unlock(&a->mu);
    return go;
}

static void step_end(agent *a)
{
    pthread_mutex_lock(&a->mu);
    a->stepping = 0;
    pthread_mutex_unlock(&a->mu);
}

static int run_step(agent *a, int64_t s, char *err, size_t errlen)
{
    const int B = a->job.batch.micro, T = a->job.batch.seq_len;
    double t0 = pl_now_ms();
    size_t off = (size_t)a->first_mb * (size_t)B * (size_t)T;
    if (pl_sampler_fill(&a->smp, &a->train, s, a->first_mb * B, a->nmb * B, a->tok + off,
                        a->tgt + off))
        return pl_errf(err, errlen, "sampling step %lld failed", (long long)s);
    pl_stage_link link = {0};
    if (a->link) link = pl_tcp_link_stage(a->link);
    pl_peer_table peers = {a->rank, a->nranks, a->conns};
    pl_worker_step_args args = {.engine = &a->e, .schedule = &a->sched, .link = &link,
                                .tokens = a->tok, .targets = a->tgt, .first_micro = a->first_mb,
                                .global_micro = a->global_micro, .groups = &a->g,
                                .peers = &peers, .step = (uint32_t)s,
                                .timeout_ms = PEER_TIMEOUT_MS,
                                .xport = a->ncp ? pl_nccl_plan_xport(a->ncp) : NULL,
                                .before_reduce = pl_fault_step_hook(&a->fault, s),
                                .hook_ctx = &a->fault};
    pl_worker_step_result res;
    if (pl_worker_step(&args, &res, err, errlen)) return -1;
    pl_msg m;
    pl_msg_init(&m, PL_MSG_REPORT, a->gen);
    m.u.report.step = s;
    m.u.report.has_loss = res.has_loss;
    m.u.report.loss = res.loss_sum;
    m.u.report.tokens = (int64_t)a->nmb * B * T;
    m.u.report.ms = pl_now_ms() - t0;
    m.u.report.grad_sumsq = res.grad_sumsq;
    m.u.report.samples_digest =
        a->stage == 0 ? pl_sampler_digest(&a->smp, s, a->first_mb * B, a->nmb * B) : 0;
    if (post(a, &m)) return pl_errf(err, errlen, "cannot send report");
    pthread_mutex_lock(&a->mu);
    a->reduced_step = s;
    pthread_mutex_unlock(&a->mu);
    pl_msg_init(&m, PL_MSG_REDUCED, a->gen);
    m.u.reduced.step = s;
    post(a, &m); /* lost while disconnected: hello_resume tells a new coordinator */
    return 0;
}

/* ---- the compute thread ---- */

static void on_plan(agent *a, const pl_msg *m)
{
    char err[1024] = "";
    pl_msg r;
    if (m->gen <= a->gen) return;
    int64_t bytes = 0;
    if (install_plan(a, m, &bytes, err, sizeof err) == 0) {
        pl_msg_init(&r, PL_MSG_COPY_DONE, a->gen);
        r.u.copy_done.bytes = bytes;
        post(a, &r);
        return;
    }
    const int peer_fault = a->broken[0] != 0;
    if (!superseded(a) && !peer_fault) {
        fail(a, "plan", err);
        return;
    }
    /* the next plan replaces it (the copy source is kept); a failed peer is reported, so
     * that the coordinator makes that plan */
    logf_(a, "plan generation %lld given up: %s", (long long)m->gen, err);
    teardown_links(a);
    pl_mesh_drop_stash(a->mesh);
    if (peer_fault && !superseded(a)) {
        pl_msg_init(&r, PL_MSG_PEER_BROKEN, a->gen);
        snprintf(r.u.peer_broken.peer, sizeof r.u.peer_broken.peer, "%s", a->broken);
        snprintf(r.u.peer_broken.reason, sizeof r.u.peer_broken.reason, "%.200s", err);
        post(a, &r);
    }
}

/* A failed step (a peer died or its link broke) is not fatal here: the coordinator learns
 * of a loss (process end, closed connection) and answers abort + a new plan, which
 * rebuilds the links; a failure it cannot see (an NCCL error or deadline with every worker
 * alive) is told to it in step_failed. */
static void step_failed(agent *a, int64_t step, const char *err)
{
    /* On NCCL a failed step leaves operations queued (a peer that never comes): abort the
     * world now (xport.h) rather than at the next plan, so that its kernels stop holding
     * the GPU and the kernels' stream meanwhile. A failed world never recovers: the next
     * plan makes a new one. */
    pthread_mutex_lock(&a->mu);
    pl_nccl_plan_abort(a->ncp, "step failed");
    const int aborted = a->aborted_gen == a->gen && a->aborted_step == step;
    pthread_mutex_unlock(&a->mu);
    logf_(a, "step %lld failed: %s (waiting for the coordinator)", (long long)step, err);
    if (aborted || superseded(a)) return;
    pl_msg r;
    pl_msg_init(&r, PL_MSG_STEP_FAILED, a->gen);
    r.u.step_failed.step = step;
    snprintf(r.u.step_failed.reason, sizeof r.u.step_failed.reason, "%.900s", err);
    post(a, &r);
}

static void on_start_step(agent *a, const pl_msg *m)
{
    char err[1024] = "";
    const int64_t step = m->u.start_step.step;
    if (m->gen != a->gen || a->pipe < 0) return;
    if (a->have_src) { /* the plan is stable now: the old layers are no longer needed */
        pl_engine_destroy(&a->src);
        a->have_src = 0;
    }
    tell_client(a, a->gen, step);
    if (!step_begin(a, step)) return; /* aborted before it began */
    const int failed = run_step(a, step, err, sizeof err);
    step_end(a);
    if (failed) step_failed(a, step, err);
}

static void on_commit(agent *a, const pl_msg *m)
{
    char err[1024] = "";
    const pl_msg_commit *c = &m->u.commit;
    if (m->gen != a->gen || a->pipe < 0) return;
    const pl_optimizer_spec *o = &a->job.optimizer;
    pl_adamw w = {(float)c->lr, (float)o->beta1, (float)o->beta2, (float)o->eps,
                  (float)o->weight_decay};
    pl_worker_apply(&a->e, &w, (float)c->grad_scale, (int)c->step + 1);
    pthread_mutex_lock(&a->mu);
    a->last_committed = c->step;
    a->last_scale = c->grad_scale;
    a->last_lr = c->lr;
    a->reduced_step = -1;
    pthread_mutex_unlock(&a->mu);
    if (c->save && a->job.checkpoint.dir[0] &&
        pl_checkpoint_writer_start(a->ckw, &a->e, a->job.checkpoint.dir, c->step + 1, err,
                                   sizeof err))
        logf_(a, "checkpoint of step %lld: %s", (long long)c->step + 1, err);
    pl_msg r;
    pl_msg_init(&r, PL_MSG_COMMITTED, a->gen);
    r.u.committed.step = c->step;
    post(a, &r);
}

static void *compute_main(void *arg)
{
    agent *a = arg;
    pl_msg m;
    while (pl_msg_queue_pop(a->queue, &m) == 0) {
        if (!atomic_load(&a->done)) {
            if (m.type == PL_MSG_PLAN) on_plan(a, &m);
            else if (m.type == PL_MSG_START_STEP) on_start_step(a, &m);
            else if (m.type == PL_MSG_COMMIT) on_commit(a, &m);
            /* abort: the next step zeroes the gradients */
        }
        pl_msg_free(&m);
    }
    return NULL;
}

/* ---- the control thread ---- */

/* After a reconnection, a worker with state tells the (new) coordinator where it
 * stands (docs/protocol.md "A restarted coordinator"). */
static void hello_resume(agent *a)
{
    pl_msg m;
    pthread_mutex_lock(&a->mu);
    int64_t gen = a->gen;
    pl_msg_init(&m, PL_MSG_HELLO_RESUME, gen);
    m.u.hello_resume.committed_step = a->last_committed;
    m.u.hello_resume.grad_scale = a->last_committed >= 0 ? a->last_scale : 0;
    m.u.hello_resume.lr = a->last_committed >= 0 ? a->last_lr : 0;
    m.u.hello_resume.reduced_step =
        a->reduced_step == a->last_committed + 1 ? a->reduced_step : -1;
    pthread_mutex_unlock(&a->mu);
    if (gen > 0 && pl_ctl_client_send(a->cli, &m) == 0)
        logf_(a, "reconnected: resuming at generation %lld, step %lld committed",
              (long long)gen, (long long)m.u.hello_resume.committed_step);
    pl_msg_free(&m);
}

static void on_message(pl_ctl_client *c, const pl_msg *m, void *user)
{
    agent *a = user;
    (void)c;
    switch (m->type) {
    case PL_MSG_WELCOME:
        hello_resume(a);
        return;
    case PL_MSG_CHALLENGE: return;
    case PL_MSG_REFUSE:
        logf_(a, "refused: %s", m->u.refuse.reason);
        atomic_store(&a->exit_code, 1);
        atomic_store(&a->done, 1);
        return;
    case PL_MSG_STOP:
        if (m->u.stop.exit_code) logf_(a, "stopped: %s", m->u.stop.reason);
        atomic_store(&a->exit_code, m->u.stop.exit_code);
        atomic_store(&a->done, 1);
        return;
    case PL_MSG_NCCL_INIT: /* for the compute thread waiting in join_nccl */
        pthread_mutex_lock(&a->mu);
        memcpy(a->nccl_id, m->u.nccl_init.id, sizeof a->nccl_id);
        a->nccl_gen = m->gen;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        return;
    default: {
        if (m->type == PL_MSG_ABORT) abort_step(a, m->gen, m->u.abort_.step);
        if (m->type == PL_MSG_PLAN && m->gen > atomic_load(&a->newest_plan)) {
            atomic_store(&a->newest_plan, m->gen);
            /* a copy or step blocked in the old plan's NCCL world gives up now, so that
             * the compute thread gets to the new plan (TCP links time out or break) */
            pthread_mutex_lock(&a->mu);
            pl_nccl_plan_abort(a->ncp, "superseded by a newer plan");
            pthread_mutex_unlock(&a->mu);
        }
        if (pl_msg_queue_push(a->queue, m)) fail(a, "control message", "out of memory");
        return;
    }
    }
}

static void on_close(pl_ctl_client *c, const char *reason, void *user)
{
    agent *a = user;
    (void)c;
    if (!atomic_load(&a->done) && pl_ctl_client_get_state(c) != PL_CTL_REFUSED) {
        logf_(a, "control connection closed: %s (reconnecting)", reason ? reason : "");
        atomic_store(&a->disconnected, 1);
    }
}

/* The kernel backend of o->backend: "cpu", "cuda", or "auto"/NULL = CUDA where this
 * build has it and a device is visible, else the CPU. */
static int open_backend(agent *a, char *err, size_t errlen)
{
    const char *want = a->o->backend && strcmp(a->o->backend, "auto") ? a->o->backend : NULL;
    char why[256] = "";
    if (want) a->k = kn_create(want, a->o->threads, why, sizeof why);
    else if (!(a->k = kn_create("cuda", a->o->threads, why, sizeof why)))
        a->k = kn_create("cpu", a->o->threads, why, sizeof why);
    if (!a->k) return pl_errf(err, errlen, "kernel backend %s: %s", want ? want : "auto", why);
    if (strcmp(kn_backend(a->k), "cpu"))
        logf_(a, "kernels: %s, %s matmuls", kn_backend(a->k), kn_precision(a->k));
    return 0;
}

static int setup(agent *a, char *err, size_t errlen)
{
    const pl_agent_options *o = a->o;
    if (pl_job_load(o->job_path, &a->job, err, errlen)) return -1;
    a->have_job = 1;
    if (o->checkpoint_dir &&
        pl_pathf(a->job.checkpoint.dir, sizeof a->job.checkpoint.dir, err, errlen, "%s",
                 o->checkpoint_dir))
        return -1;
    if (pl_job_gpt_config(&a->job, &a->cfg, err, errlen)) return -1;
    if (pl_tokens_open(a->job.data.train, &a->train, err, errlen)) return -1;
    a->have_train = 1;
    if (pl_sampler_init(&a->smp, a->job.data.order, a->job.data.seed,
                        pl_tokens_count(&a->train), a->job.batch.seq_len, a->job.batch.global,
                        err, errlen))
        return -1;
    if (pl_listener_open(o->host ? o->host : "127.0.0.1", o->peer_port, &a->lst, err, errlen))
        return -1;
    const pl_mesh_config mc = {.listener = a->lst, .token = o->token,
                               .token_len = strlen(o->token), .name = o->name,
                               .cancelled = mesh_cancelled, .log = mesh_log, .ctx = a,
                               .redial = 1};
    if (pl_mesh_create(&mc, &a->mesh, err, errlen)) return -1;
    if (!(a->ckw = pl_checkpoint_writer_new(on_saved, a)) || !(a->queue = pl_msg_queue_new()))
        return pl_errf(err, errlen, "out of memory");
    if (pl_fault_parse(&a->fault, o->name, err, errlen)) return -1;
    return open_backend(a, err, errlen);
}

/* SIGTERM is the preemption notice (Kubernetes sends it when a spot node is
 * reclaimed): the control loop tells the coordinator, which moves the worker
 * out at the next step boundary and then stops it, so no step is lost. */
static volatile sig_atomic_t got_sigterm;

static void on_sigterm(int sig)
{
    (void)sig;
    got_sigterm = 1;
}

/* Sends `leaving` once after SIGTERM. */
static void announce_leaving(agent *a, int *sent)
{
    if (!got_sigterm || *sent || !a->cli || pl_ctl_client_get_state(a->cli) != PL_CTL_WELCOMED)
        return;
    pl_msg m;
    pl_msg_init(&m, PL_MSG_LEAVING, atomic_load(&a->newest_plan));
    m.u.leaving.reason = PL_LEAVE_SIGTERM;
    if (pl_ctl_client_send(a->cli, &m) == 0) {
        logf_(a, "SIGTERM: told the coordinator this worker is leaving");
        *sent = 1;
    }
    pl_msg_free(&m);
}

/* The control connection is gone (a new operator leader, a network blip): keep
 * every bit of state and connect again with back-off, for at most
 * PL_PROTO_RECONNECT_WINDOW_MS; the next welcome sends hello_resume. -1: give up. */
static int reconnect(agent *a)
{
    double now = pl_now_ms();
    if (a->lost_since < 0) a->lost_since = now;
    if (now - a->lost_since > PL_PROTO_RECONNECT_WINDOW_MS) {
        logf_(a, "no coordinator for %d s: giving up", PL_PROTO_RECONNECT_WINDOW_MS / 1000);
        return -1;
    }
    pthread_mutex_lock(&a->cli_mu);
    pl_ctl_client_destroy(a->cli);
    a->cli = NULL;
    pthread_mutex_unlock(&a->cli_mu);
    /* back-off: 100 ms, doubling up to 2 s, cut short by stop */
    int wait = 100 << (a->reconnects < 4 ? a->reconnects : 4);
    a->reconnects++;
    for (int t = 0; t < wait && !atomic_load(&a->done); t += 20) usleep(20 * 1000);
    char err[512];
    pl_ctl_client *c = pl_ctl_client_create(&a->cc, err, sizeof err);
    if (!c) {
        logf_(a, "reconnecting: %s", err);
        return 0; /* try again */
    }
    pthread_mutex_lock(&a->cli_mu);
    a->cli = c;
    pthread_mutex_unlock(&a->cli_mu);
    atomic_store(&a->disconnected, 0);
    return 0;
}

/* What register tells the coordinator (control_client.h), and where it is. */
static int client_config(agent *a, char *err, size_t errlen)
{
    const pl_agent_options *o = a->o;
    const char *colon = strrchr(o->coordinator, ':');
    if (!colon || (size_t)(colon - o->coordinator) >= sizeof a->coordinator_host)
        return pl_errf(err, errlen, "coordinator: bad address '%s' (HOST:PORT)", o->coordinator);
    memcpy(a->coordinator_host, o->coordinator, (size_t)(colon - o->coordinator));
    a->coordinator_host[colon - o->coordinator] = 0;
    pl_ctl_client_config cc = {.host = a->coordinator_host, .port = atoi(colon + 1),
                               .ca_path = o->ca_path, .insecure = !o->ca_path, .token = o->token,
                               .token_len = strlen(o->token), .on_message = on_message,
                               .on_close = on_close, .user = a};
    snprintf(cc.reg.job, sizeof cc.reg.job, "%s", a->job.name);
    snprintf(cc.reg.name, sizeof cc.reg.name, "%s", o->name);
    char hn[PL_PROTO_NAME_MAX + 1] = "localhost";
    gethostname(hn, sizeof hn - 1);
    for (char *p = hn; *p; p++) /* a node name of the protocol's characters */
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '-' || *p == '_'))
            *p = '-';
    snprintf(cc.reg.node, sizeof cc.reg.node, "%s", o->node ? o->node : hn[0] ? hn : "localhost");
    snprintf(cc.reg.host, sizeof cc.reg.host, "%s",
             o->advertise ? o->advertise : o->host ? o->host : "127.0.0.1");
    cc.reg.port = pl_listener_port(a->lst);
    snprintf(cc.reg.zone, sizeof cc.reg.zone, "%s", o->zone ? o->zone : "");
    cc.reg.gpus = strcmp(kn_backend(a->k), "cpu") ? 1 : 0; /* one device per worker */
    snprintf(cc.reg.device, sizeof cc.reg.device, "%s", kn_device_id(a->k));
    /* PLIANT_NCCL=0 keeps a GPU worker on TCP (host-staged), e.g. to compare */
    const char *use_nccl = getenv("PLIANT_NCCL");
    char why[256];
    cc.reg.nccl = pl_nccl_plan_supported(a->k, why, sizeof why) &&
                  !(use_nccl && !strcmp(use_nccl, "0"));
    cc.reg.pid = getpid();
    a->cc = cc;
    return 0;
}

/* Serves the control connection until stop or a failure, reconnecting when it is lost. */
static void control_loop(agent *a)
{
    struct sigaction sa = {.sa_handler = on_sigterm};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    int leaving_sent = 0;
    while (!atomic_load(&a->done)) {
        announce_leaving(a, &leaving_sent);
        if (atomic_load(&a->disconnected)) {
            if (reconnect(a)) {
                atomic_store(&a->exit_code, 1);
                break;
            }
            continue;
        }
        if (pl_ctl_client_service(a->cli, 50) < 0 && !atomic_load(&a->done) &&
            pl_ctl_client_get_state(a->cli) != PL_CTL_REFUSED)
            atomic_store(&a->disconnected, 1);
        if (pl_ctl_client_get_state(a->cli) == PL_CTL_WELCOMED) {
            a->lost_since = -1;
            a->reconnects = 0;
        }
    }
    /* let queued messages (committed) go out */
    for (int i = 0; a->cli && i < 4 && pl_ctl_client_get_state(a->cli) == PL_CTL_WELCOMED; i++)
        pl_ctl_client_service(a->cli, 10);
}

/* Ends the compute thread: a step blocked on a stage neighbour is woken when the worker
 * fails; queued messages are dropped (done is set). */
static void stop_compute(agent *a, pthread_t th)
{
    if (atomic_load(&a->exit_code)) {
        pthread_mutex_lock(&a->mu);
        if (a->link) pl_tcp_link_abort(a->link, "worker exiting");
        pl_nccl_plan_abort(a->ncp, "worker exiting");
        pthread_mutex_unlock(&a->mu);
    }
    atomic_store(&a->done, 1);
    pl_msg_queue_push_end(a->queue);
    pthread_join(th, NULL);
}

static void agent_free(agent *a)
{
    pl_checkpoint_writer_free(a->ckw); /* a write in flight ends first */
    pl_ctl_client_destroy(a->cli);
    pl_msg_queue_free(a->queue);
    teardown_links(a);
    pl_mesh_destroy(a->mesh);
    if (a->have_engine) pl_engine_destroy(&a->e);
    if (a->have_src) pl_engine_destroy(&a->src);
    if (a->k) kn_destroy(a->k);
    if (a->lst) pl_listener_close(a->lst);
    free(a->tok);
    free(a->tgt);
    if (a->have_train) pl_tokens_close(&a->train);
    if (a->have_job) pl_job_free(&a->job);
    pthread_mutex_destroy(&a->mu);
    pthread_mutex_destroy(&a->cli_mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

int pl_agent_run(const pl_agent_options *o)
{
    agent *a = calloc(1, sizeof *a);
    if (!a) return 1;
    a->o = o;
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->cli_mu, NULL);
    pthread_condattr_t ca; /* timed waits on the monotonic clock: pl_now_ms's */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->cv, &ca);
    pthread_condattr_destroy(&ca);
    a->lost_since = -1;
    a->last_committed = a->reduced_step = -1;
    atomic_store(&a->exit_code, 1);
    char err[1024] = "";
    pthread_t th;
    if (setup(a, err, sizeof err) || client_config(a, err, sizeof err) ||
        !(a->cli = pl_ctl_client_create(&a->cc, err, sizeof err))) {
        logf_(a, "%s", err);
    } else {
        atomic_store(&a->exit_code, 0); /* before the compute thread can fail */
        if (pthread_create(&th, NULL, compute_main, a)) {
            logf_(a, "cannot start the compute thread");
            atomic_store(&a->exit_code, 1);
        } else {
            control_loop(a);
            stop_compute(a, th);
        }
    }
    const int code = atomic_load(&a->exit_code);
    agent_free(a);
    return code;
}
