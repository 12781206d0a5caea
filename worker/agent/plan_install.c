/* Installing a plan on the compute thread (agent_state.h): this worker's place in the
 * plan, its engine and layer copies (worker/engine/layer_copy.h: TCP copies while the
 * engine changes, those between ranks over the plan's NCCL world once it is joined), the
 * checkpoint of a restart, and the peer connections of the plan's transport: ring and
 * stage-link connections over the mesh (worker/comm/mesh.h), or the NCCL world
 * (nccl_plan.h). */
#include "agent_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint.h"
#include "layer_copy.h"
#include "trainer.h"
#include "util.h"

/* Closes the plan's links, NCCL world and connections, frees its groups and schedule. */
void agent_teardown_links(agent *a)
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

/* A plan that leaves this worker's layers as they are keeps the engine: nothing is copied
 * into it, and the plan's sends are served from it (nothing writes it while they run). */
static int keep_engine(agent *a, const pl_msg_plan *p, int b, int e, int nslots)
{
    if (p->ncopies || !a->have_src || a->src.begin != b || a->src.end != e ||
        a->src.nslots != nslots)
        return 0;
    a->e = a->src;
    a->have_engine = 1;
    a->have_src = 0;
    memset(&a->src, 0, sizeof a->src);
    return 1;
}

/* The engine this worker's sends read: the previous plan's, or the kept one. */
static const pl_engine *send_source(const agent *a)
{
    return a->have_src ? &a->src : a->have_engine ? &a->e : NULL;
}

/* Making the new engine of layers [b, e) while the network copies run (layer_copy.h:
 * make_dst, fill_dst): what this worker held is copied over, and a first plan (nothing
 * held, nothing to copy) starts from the job's initial state. */
typedef struct {
    agent *a;
    const pl_layer_copy_job *job;
    int b, e, nslots;
} engine_maker;

static int make_engine(void *ctx, char *err, size_t errlen)
{
    engine_maker *mk = ctx;
    agent *a = mk->a;
    return pl_engine_create(mk->job->dst, a->k, &a->cfg, mk->b, mk->e, a->job.batch.micro,
                            a->job.batch.seq_len, mk->nslots, err, errlen);
}

/* After the copies, the new engine's gradients and activations at once, not one fault at a
 * time in its first step (on 2 cores this cannot overlap the copies, which use both): the
 * old engine's activations and scratch first (present, and nothing in them outlives a
 * step), then what the reserve has left, then fresh pages. Bytes that were present. A
 * first plan's engine is left to fill as it runs. */
static size_t ready_work(agent *a, pl_engine *dst)
{
    const size_t present = pl_engine_share_work(dst, a->have_src ? &a->src : NULL,
                                                pl_reserve_work_source, &a->reserve);
    pl_engine_populate_work(dst);
    return present;
}

static int fill_engine(void *ctx, char *err, size_t errlen)
{
    engine_maker *mk = ctx;
    int fresh = 0;
    if (pl_layer_copy_local(mk->job, &fresh, err, errlen)) return -1;
    return fresh ? pl_engine_init_from_job(mk->job->dst, &mk->a->job, err, errlen) : 0;
}

/* Under mu: the stop of the copies running (NULL: none). A newer plan (or the exit) that
 * came before it was set found nothing to stop: newest_plan / done are set before the
 * control thread takes mu. */
static void set_copy_stop(agent *a, pl_layer_copy_stop *stop)
{
    pthread_mutex_lock(&a->mu);
    a->copy_stop = stop;
    if (stop && agent_superseded(a)) pl_layer_copy_stop_now(stop, SUPERSEDED_MSG);
    pthread_mutex_unlock(&a->mu);
}

/* The plan's copies over TCP; the control thread stops them (a newer plan, the exit). */
static int copy_over_tcp(agent *a, const pl_layer_copy_job *job, pl_layer_copy_result *res,
                         char *err, size_t errlen)
{
    pl_layer_copy_stop *stop = pl_layer_copy_stop_new();
    if (!stop) return pl_errf(err, errlen, "layer copies: out of memory");
    pl_layer_copy_tcp tcp = {.mesh = a->mesh, .after_send = pl_fault_after_copy_send,
                             .hook_ctx = &a->fault, .stop = stop};
    const pl_layer_copier copier = pl_layer_copier_tcp(&tcp);
    set_copy_stop(a, stop);
    const int rc = copier.copy(&copier, job, res, err, errlen);
    set_copy_stop(a, NULL);
    pl_layer_copy_stop_free(stop);
    return rc;
}

/* Installs the engine of the plan: for a pipeline worker (in_pipe) layers [b, e) with
 * nslots, made and filled locally while the plan's copies over TCP arrive in it; its sends
 * are served from the previous engine (layer_copy.h; those over NCCL come later,
 * install_nccl). *bytes_in: bytes received; the times go to the log. */
static int change_engine(agent *a, const pl_msg_plan *p, int in_pipe, int b, int e, int nslots,
                         int64_t *bytes_in, char *err, size_t errlen)
{
    *bytes_in = 0;
    retire_engine(a);
    const int kept = in_pipe && keep_engine(a, p, b, e, nslots);
    if (kept && !p->nsends) return 0;
    pl_engine ne;
    memset(&ne, 0, sizeof ne);
    pl_layer_copy_job job = {.plan = p, .self = a->o->name, .cfg = &a->cfg,
                             .src = send_source(a), .dst = in_pipe && !kept ? &ne : NULL,
                             .shadow = a->have_shadow_src ? &a->shadow_src : NULL,
                             .make_dst = make_engine, .fill_dst = fill_engine,
                             .reserve = &a->reserve};
    engine_maker mk = {.a = a, .job = &job, .b = b, .e = e, .nslots = nslots};
    job.dst_ctx = &mk;
    pl_layer_copy_result res = {0};
    const int rc = copy_over_tcp(a, &job, &res, err, errlen);
    *bytes_in = res.bytes_in;
    if (res.failed_peer[0]) snprintf(a->broken, sizeof a->broken, "%s", res.failed_peer);
    const double tp = pl_now_ms();
    const size_t present = rc == 0 && job.dst && p->ncopies ? ready_work(a, job.dst) : 0;
    if (p->ncopies || !kept)
        agent_log(a, "generation %lld: engine made in %.1f ms (%lld bytes from the reserve), "
                  "filled locally in %.1f ms, copies received in %.1f ms after the first "
                  "source, populated in %.1f ms (%zu bytes of work memory were present)",
                  (long long)a->gen, res.make_ms, (long long)res.reserved, res.fill_ms,
                  res.net_ms, pl_now_ms() - tp, present);
    if (rc == 0 && job.dst) {
        a->e = ne;
        a->have_engine = 1;
    } else if (job.dst) {
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
    agent_log(a, "generation %lld: layers [%d, %d) loaded from %s in %.1f ms", (long long)a->gen,
          a->e.begin, a->e.end, dir, pl_now_ms() - t0);
    return 0;
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
    a->npipes = p->npipelines;
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
static int nccl_cancelled(void *ctx) { return agent_superseded((agent *)ctx); }

/* Rank 0 makes the world's id and sends it to the coordinator (nccl_root). */
static int send_nccl_root(agent *a, char *err, size_t errlen)
{
    pl_msg m;
    pl_msg_init(&m, PL_MSG_NCCL_ROOT, a->gen);
    if (pl_nccl_plan_make_id(m.u.nccl_root.id, sizeof m.u.nccl_root.id, err, errlen)) return -1;
    if (agent_post(a, &m)) return pl_errf(err, errlen, "cannot send nccl_root");
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
    while (a->nccl_gen != a->gen && !agent_superseded(a) && pl_now_ms() < deadline) {
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
        return pl_errf(err, errlen, "%s", agent_superseded(a) ? SUPERSEDED_MSG
                                                        : "no nccl_init from the coordinator");
    pl_nccl_plan *ncp;
    const double t0 = pl_now_ms();
    /* cancelled by a newer plan (or the exit): the create waits for every rank, and
     * one that died after rank 0's nccl_root never comes */
    if (pl_nccl_plan_open(a->k, id, a->nranks, a->rank, &a->g, PL_LAYER_COPY_TIMEOUT_MS,
                          nccl_cancelled, a, &ncp, err, errlen)) {
        if (agent_superseded(a)) pl_errf(err, errlen, "%s", SUPERSEDED_MSG);
        return -1;
    }
    agent_log(a, "generation %lld: joined the NCCL world as rank %d of %d in %.1f ms",
          (long long)a->gen, a->rank, a->nranks, pl_now_ms() - t0);
    pthread_mutex_lock(&a->mu);
    a->ncp = ncp;
    /* A newer plan (or the exit) that came while a->ncp was still NULL found nothing
     * to abort: newest_plan / done are set before the control thread takes mu. */
    if (agent_superseded(a)) pl_nccl_plan_abort(ncp, SUPERSEDED_MSG);
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
    /* a kept engine (keep_engine) is its own send source */
    const pl_layer_copy_job job = {.plan = p, .self = a->o->name, .cfg = &a->cfg,
                                   .src = send_source(a), .dst = &a->e};
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

static int start_stage_link(agent *a, const pl_mesh_links *links, char *err, size_t errlen)
{
    int fp, fn;
    pl_tcp_link_pending_limits(&a->sched, &fp, &fn);
    /* a shadow's holder takes its successor's gradient messages after its own schedule */
    const int shadow = a->job.fault_tolerance.strategy == PL_STRATEGY_REDUNDANT
                           ? pl_shadow_grad_messages(a->cfg.L) : 0;
    fp += shadow;
    fn += shadow;
    pl_tcp_link_config lc = {.stage = a->stage, .prev = links->prev, .next = links->next,
                             .timeout_ms = PEER_TIMEOUT_MS, .max_pending_prev = fp > 0 ? fp : 1,
                             .max_pending_next = fn > 0 ? fn : 1, .wrap = links->wrap,
                             .wrap_stage = agent_wrap_stage(a), .max_pending_wrap = shadow};
    pl_tcp_link *link;
    if (pl_tcp_link_create(&lc, &link, err, errlen)) return -1;
    pthread_mutex_lock(&a->mu);
    a->link = link;
    /* a newer plan (or the exit) that came before found no link to abort (set_copy_stop) */
    if (agent_superseded(a)) pl_tcp_link_abort(link, SUPERSEDED_MSG);
    pthread_mutex_unlock(&a->mu);
    return 0;
}

/* The stage link's peers: a->link_peer, a->link_stage (k − 1, k + 1, the ring's wrap). */
static void name_link_peers(agent *a, const pl_mesh_peers *peers)
{
    const int rank[3] = {peers->link_prev, peers->link_next, peers->link_wrap};
    for (int k = 0; k < 3; k++) {
        snprintf(a->link_peer[k], sizeof a->link_peer[k], "%s",
                 rank[k] >= 0 ? peers->names[rank[k]] : "");
        a->link_stage[k] = rank[k] >= 0 ? a->stage + rank[k] - a->rank : -1;
    }
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
    const int wrap = agent_wrap_stage(a); /* ranks are consecutive along a pipeline */
    const pl_mesh_peers peers = {
        .nranks = n, .names = names, .hosts = hosts, .ports = ports, .ring = ring,
        .link_prev = a->stage > 0 ? a->rank - 1 : -1,
        .link_next = a->stage + 1 < a->nstages ? a->rank + 1 : -1,
        .link_wrap = wrap >= 0 ? a->rank - a->stage + wrap : -1};
    pl_mesh_links links = {.ring = a->conns};
    name_link_peers(a, &peers);
    if (pl_mesh_connect(a->mesh, &peers, PEER_TIMEOUT_MS, &links, err, errlen)) {
        if (links.failed_rank >= 0)
            snprintf(a->broken, sizeof a->broken, "%s", names[links.failed_rank]);
        goto out;
    }
    rc = start_stage_link(a, &links, err, errlen);
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
int agent_install_plan(agent *a, const pl_msg *m, int64_t *bytes_in, char *err, size_t errlen)
{
    const pl_msg_plan *p = &m->u.plan;
    a->broken[0] = 0;
    agent_teardown_links(a);
    agent_retire_shadow(a);
    pthread_mutex_lock(&a->mu);
    a->gen = m->gen;
    pthread_mutex_unlock(&a->mu);
    agent_tell_client(a, a->gen, -1);
    pl_fault_set_plan(&a->fault, a->gen, -1); /* its rank once placed */
    a->pipe = p->you_pipeline;
    pl_reserve_pause(&a->reserve);
    a->reserve_bytes = p->reserve_bytes;
    *bytes_in = 0;
    if (p->has_checkpoint) { /* a restart: the checkpoint replaces whatever is held */
        if (a->have_engine) pl_engine_destroy(&a->e);
        if (a->have_src) pl_engine_destroy(&a->src);
        a->have_engine = a->have_src = 0;
        agent_drop_shadow_src(a);
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
    pl_fault_set_plan(&a->fault, a->gen, a->rank);
    const double tc = pl_now_ms();
    pthread_mutex_lock(&a->mu);
    const double waited = tc - a->plan_ms; /* for the compute thread: the step before */
    pthread_mutex_unlock(&a->mu);
    const int ob = a->have_src ? a->src.begin : a->have_engine ? a->e.begin : 0;
    const int oe = a->have_src ? a->src.end : a->have_engine ? a->e.end : 0;
    if (change_engine(a, p, 1, p->you_layer_begin, p->you_layer_end, a->sched.nslots, bytes_in,
                      err, errlen) ||
        load_checkpoint(a, p, err, errlen))
        return -1;
    if (p->ncopies || p->nsends)
        agent_log(a, "generation %lld: layers [%d, %d) -> [%d, %d), received %d layers in %d copies "
              "(%lld bytes), sent %d, in %.1f ms, begun %.1f ms after the plan arrived",
              (long long)a->gen, ob, oe, p->you_layer_begin, p->you_layer_end,
              pl_layer_copy_layers(p), p->ncopies, (long long)*bytes_in, p->nsends,
              pl_now_ms() - tc, waited);
    if (size_batch(a, p, err, errlen)) return -1;
    if (p->transport == PL_TRANSPORT_NCCL) return install_nccl(a, p, bytes_in, err, errlen);
    if (connect_tcp_peers(a, p, err, errlen)) return -1;
    return agent_install_shadow(a, p, err, errlen);
}
