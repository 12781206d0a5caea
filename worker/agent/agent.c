/* The worker process's main loop (agent.h): the control thread serves the coordinator's
 * connection and queues its messages (msg_queue.h); the compute thread takes them in order,
 * installs plans (plan_install.c), runs steps and applies commits. The peer connections
 * are the mesh's (worker/comm/mesh.h), the recovery tests' faults fault.h's. */
#include "agent_state.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "idle_teardown.h"
#include "trainer.h"
#include "util.h"
#include "worker_step.h"

/* One write per line: the workers of `pliant run` share its stderr, and a line written in
 * pieces interleaves with another process's. */
void agent_log(agent *a, const char *fmt, ...)
{
    char line[2048];
    int n = snprintf(line, sizeof line - 1, "worker %s: ", a->o->name);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof line - 1)
        n += vsnprintf(line + n, sizeof line - 1 - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = (int)sizeof line - 2; /* cut: the line still ends */
    line[n++] = '\n';
    fflush(stderr);
    (void)!write(STDERR_FILENO, line, (size_t)n);
}

/* A fatal error: the coordinator is told why (fatal; it answers stop) and the worker
 * exits with status 1. Any thread. */
static void fail(agent *a, const char *what, const char *err)
{
    agent_log(a, "%s: %s", what, err);
    pl_msg m;
    pl_msg_init(&m, PL_MSG_FATAL, atomic_load(&a->newest_plan));
    snprintf(m.u.fatal.reason, sizeof m.u.fatal.reason, "%s: %.900s", what, err);
    if (agent_post(a, &m) == 0) atomic_store(&a->fatal_sent, 1);
    atomic_store(&a->exit_code, 1);
    atomic_store(&a->done, 1);
}

int agent_post(agent *a, pl_msg *m)
{
    pthread_mutex_lock(&a->cli_mu);
    int rc = a->cli ? pl_ctl_client_post(a->cli, m) : -1; /* lost while disconnected */
    pthread_mutex_unlock(&a->cli_mu);
    pl_msg_free(m);
    return rc;
}

void agent_tell_client(agent *a, int64_t gen, int64_t step)
{
    pthread_mutex_lock(&a->cli_mu);
    if (a->cli) {
        pl_ctl_client_set_gen(a->cli, gen);
        if (step >= 0) pl_ctl_client_set_step(a->cli, step);
    }
    pthread_mutex_unlock(&a->cli_mu);
}

int agent_superseded(agent *a)
{
    return atomic_load(&a->newest_plan) > a->gen || atomic_load(&a->done);
}

/* The mesh's cancel test and log (mesh.h). */
static int mesh_cancelled(void *ctx) { return agent_superseded(ctx); }

static void mesh_log(void *ctx, const char *line) { agent_log(ctx, "%s", line); }

/* Tells the coordinator that this worker's layers [begin, end) of the checkpoint of step
 * are written (err NULL), or why not: it retries or fails the job. Any thread. */
static void post_saved(agent *a, int64_t step, int begin, int end, int64_t bytes,
                       const char *err)
{
    pl_msg m;
    pl_msg_init(&m, PL_MSG_SAVED, atomic_load(&a->newest_plan));
    m.u.saved.step = step;
    m.u.saved.layer_begin = begin;
    m.u.saved.layer_end = end;
    m.u.saved.bytes = err ? 0 : bytes;
    if (err) {
        agent_log(a, "checkpoint of step %lld: %s", (long long)step, err);
        snprintf(m.u.saved.error, sizeof m.u.saved.error, "%.1000s",
                 err[0] ? err : "not written");
    }
    agent_post(a, &m);
}

/* The writer thread finished this worker's part of a checkpoint. */
static void on_saved(void *user, int64_t step, int begin, int end, int rc, int64_t bytes,
                     const char *err)
{
    agent *a = user;
    if (rc == 0) pl_fault_on_saved(&a->fault, step);
    post_saved(a, step, begin, end, bytes, rc ? err : NULL);
}

/* Starts writing this worker's layers as the checkpoint of step (the state after step
 * committed steps); a start that fails is told to the coordinator at once. */
static void start_save(agent *a, int64_t step)
{
    char err[1024] = "";
    if (!a->job.checkpoint.dir[0])
        snprintf(err, sizeof err, "spec.checkpoint.dir: not set");
    else if (pl_checkpoint_writer_start(a->ckw, &a->e, a->job.checkpoint.dir, step, err,
                                        sizeof err) == 0)
        return;
    post_saved(a, step, a->e.begin, a->e.end, 0, err);
}

/* ---- steps ---- */

/* Under mu, from another thread: the running step gives up within one layer's compute
 * whatever it waits for (its engine skips the layers left, its stage link's waits and
 * its all-reduce's connections fail at once, its NCCL world is aborted). */
static void interrupt_step(agent *a, const char *why)
{
    atomic_store(&a->step_stop, 1);
    a->abort_ms = pl_now_ms();
    if (a->link) pl_tcp_link_abort(a->link, why);
    pl_nccl_plan_abort(a->ncp, why);
    for (int r = 0; a->conns && r < a->nranks; r++) pl_conn_shutdown(a->conns[r]);
}

/* Under mu, from the control thread (a newer plan, the worker's exit): what the compute
 * thread waits for outside a step gives up at once: the plan's TCP layer copies (their
 * streams shut down), the stage link (an evaluation, the shadow's fill), the NCCL world
 * (its join and copies). Its mesh waits poll agent_superseded. */
static void interrupt_plan(agent *a, const char *why)
{
    if (a->stepping) {
        interrupt_step(a, why);
        return;
    }
    pl_layer_copy_stop_now(a->copy_stop, why);
    if (a->link) pl_tcp_link_abort(a->link, why);
    pl_nccl_plan_abort(a->ncp, why);
}

/* Control thread, on `abort`: a step blocked on a dead peer's links fails now
 * instead of at its timeout; one not started yet is skipped. */
static void abort_step(agent *a, int64_t gen, int64_t step)
{
    pthread_mutex_lock(&a->mu);
    a->aborted_gen = gen;
    a->aborted_step = step;
    if (a->reduced_step == step) a->reduced_step = -1;
    if (a->stepping && gen == a->gen) interrupt_step(a, "step aborted by the coordinator");
    pthread_mutex_unlock(&a->mu);
}

/* Marks the step running; 0 when the coordinator aborted it already, or a newer plan
 * came (it interrupted nothing: the step was not running yet). */
static int step_begin(agent *a, int64_t s)
{
    pthread_mutex_lock(&a->mu);
    int go = !(a->aborted_gen == a->gen && a->aborted_step == s) && !agent_superseded(a);
    a->stepping = go;
    atomic_store(&a->step_stop, 0);
    pthread_mutex_unlock(&a->mu);
    return go;
}

static void step_end(agent *a)
{
    pthread_mutex_lock(&a->mu);
    a->stepping = 0;
    pthread_mutex_unlock(&a->mu);
}

/* Fills this worker's microbatches of step s, corrupted where a fault injection says. */
static int sample_step(agent *a, int64_t s, char *err, size_t errlen)
{
    const int B = a->job.batch.micro, T = a->job.batch.seq_len;
    size_t off = (size_t)a->first_mb * (size_t)B * (size_t)T;
    if (pl_sampler_fill(&a->smp, &a->train, s, a->first_mb * B, a->nmb * B, a->tok + off,
                        a->tgt + off))
        return pl_errf(err, errlen, "sampling step %lld failed", (long long)s);
    pl_fault_bad_tokens(&a->fault, s, a->tok + off, (size_t)a->nmb * B * T);
    return 0;
}

/* Runs step s's forward, backward and reduction on the current plan; step_stop lets
 * the control thread interrupt it. */
static int compute_step(agent *a, int64_t s, pl_worker_step_result *res, char *err, size_t errlen)
{
    pl_stage_link link = {0};
    if (a->link) link = pl_tcp_link_stage(a->link);
    a->e.stop = &a->step_stop;
    pl_peer_table peers = {a->rank, a->nranks, a->conns};
    pl_worker_step_args args = {.engine = &a->e, .schedule = &a->sched, .link = &link,
                                .tokens = a->tok, .targets = a->tgt, .first_micro = a->first_mb,
                                .global_micro = a->global_micro, .groups = &a->g,
                                .peers = &peers, .step = (uint32_t)s,
                                .timeout_ms = PEER_TIMEOUT_MS, .pack = &a->pack,
                                .xport = a->ncp ? pl_nccl_plan_xport(a->ncp) : NULL,
                                .before_reduce = pl_fault_step_hook(&a->fault, s),
                                .before_op = pl_fault_before_op,
                                .hook_ctx = &a->fault, .rc = a->rc,
                                .shadow = a->have_shadow ? &a->shadow : NULL,
                                .frc = a->job.fault_tolerance.redundant_forward == PL_FRC_EAGER};
    const int failed = pl_worker_step(&args, res, err, errlen);
    a->e.stop = NULL; /* an evaluation of the committed step may follow an aborted one */
    return failed ? -1 : 0;
}

/* Tells the coordinator step s's loss and timing, then that its gradients are reduced. */
static int report_step(agent *a, int64_t s, const pl_worker_step_result *res, double t0,
                       char *err, size_t errlen)
{
    const int B = a->job.batch.micro, T = a->job.batch.seq_len;
    pl_msg m;
    pl_msg_init(&m, PL_MSG_REPORT, a->gen);
    m.u.report.step = s;
    m.u.report.has_loss = res->has_loss;
    m.u.report.loss = res->loss_sum;
    m.u.report.tokens = (int64_t)a->nmb * B * T;
    m.u.report.ms = pl_now_ms() - t0;
    m.u.report.grad_sumsq = res->grad_sumsq;
    m.u.report.samples_digest =
        a->stage == 0 ? pl_sampler_digest(&a->smp, s, a->first_mb * B, a->nmb * B) : 0;
    if (agent_post(a, &m)) return pl_errf(err, errlen, "cannot send report");
    pthread_mutex_lock(&a->mu);
    a->reduced_step = s;
    pthread_mutex_unlock(&a->mu);
    pl_msg_init(&m, PL_MSG_REDUCED, a->gen);
    m.u.reduced.step = s;
    agent_post(a, &m); /* lost while disconnected: hello_resume tells a new coordinator */
    return 0;
}

static int run_step(agent *a, int64_t s, char *err, size_t errlen)
{
    double t0 = pl_now_ms(); /* the report's ms include the sampling */
    if (sample_step(a, s, err, errlen)) return -1;
    pl_fault_begin_step(&a->fault, s, a->nmb);
    pl_worker_step_result res;
    if (compute_step(a, s, &res, err, errlen)) return -1;
    agent_count_rc(a, &res);
    return report_step(a, s, &res, t0, err, errlen);
}

/* ---- the compute thread ---- */

/* The peer whose connection failed the step or the plan's set-up (a ring or stage
 * neighbour; not one only left out of step by the other's failure), or NULL. */
static const char *failed_peer(agent *a)
{
    for (int r = 0; a->conns && r < a->nranks; r++) {
        const int code = a->conns[r] ? pl_conn_status(a->conns[r]) : 0;
        if (code && code != PL_COMM_ECANCELED) return pl_conn_peer_name(a->conns[r]);
    }
    for (int k = 0; a->link && k < 3; k++)
        if (a->link_peer[k][0] && pl_tcp_link_status(a->link, a->link_stage[k], NULL, 0))
            return a->link_peer[k];
    return NULL;
}

static void on_plan(agent *a, const pl_msg *m)
{
    char err[1024] = "";
    pl_msg r;
    if (m->gen <= a->gen) return;
    int64_t bytes = 0;
    if (agent_install_plan(a, m, &bytes, err, sizeof err) == 0) {
        /* what it holds now, copied, kept or loaded, is the state after the plan's first
         * step − 1 (a `save` of it after a writer was lost must find it so) */
        pthread_mutex_lock(&a->mu);
        if (m->u.plan.you_pipeline >= 0) a->last_committed = m->u.plan.step - 1;
        pthread_mutex_unlock(&a->mu);
        pl_msg_init(&r, PL_MSG_COPY_DONE, a->gen);
        r.u.copy_done.bytes = bytes;
        agent_post(a, &r);
        return;
    }
    /* a neighbour lost during the set-up (its shadow's refill, the links' handshakes) is
     * the coordinator's to replan for, not a reason for this worker to end */
    const char *peer = a->broken[0] ? NULL : failed_peer(a);
    if (peer) snprintf(a->broken, sizeof a->broken, "%s", peer);
    const int peer_fault = a->broken[0] != 0;
    if (!agent_superseded(a) && !peer_fault) {
        fail(a, "plan", err);
        return;
    }
    /* the next plan replaces it (the copy source is kept); a failed peer is reported, so
     * that the coordinator makes that plan */
    agent_log(a, "plan generation %lld given up: %s", (long long)m->gen, err);
    agent_teardown_links(a);
    pl_mesh_drop_stash(a->mesh);
    if (peer_fault && !agent_superseded(a)) {
        pl_msg_init(&r, PL_MSG_PEER_BROKEN, a->gen);
        snprintf(r.u.peer_broken.peer, sizeof r.u.peer_broken.peer, "%s", a->broken);
        snprintf(r.u.peer_broken.reason, sizeof r.u.peer_broken.reason, "%.200s", err);
        agent_post(a, &r);
    }
}

/* A failed step (a peer died or its link broke) is not fatal here: the coordinator learns
 * of a loss (process end, closed connection) and answers abort + a new plan, which
 * rebuilds the links. A link that failed with both workers alive (a network cut off
 * between them) is reported with peer_broken: the coordinator weighs both ends' reports
 * and takes out the worker cut off from the others. A failure it cannot see otherwise (an
 * NCCL error or deadline with every worker alive) is told to it in step_failed. */
static void step_failed(agent *a, int64_t step, const char *err)
{
    /* On NCCL a failed step leaves operations queued (a peer that never comes): abort the
     * world now (xport.h) rather than at the next plan, so that its kernels stop holding
     * the GPU and the kernels' stream meanwhile. A failed world never recovers: the next
     * plan makes a new one. */
    pthread_mutex_lock(&a->mu);
    pl_nccl_plan_abort(a->ncp, "step failed");
    const int aborted = a->aborted_gen == a->gen && a->aborted_step == step;
    const double since = pl_now_ms() - a->abort_ms;
    pthread_mutex_unlock(&a->mu);
    if (aborted) /* how long the step ran on after its abort delays the next plan */
        agent_log(a, "step %lld aborted: %s, %.1f ms after the abort", (long long)step, err,
                  since);
    else
        agent_log(a, "step %lld failed: %s (waiting for the coordinator)", (long long)step, err);
    if (aborted || agent_superseded(a)) return;
    pl_msg r;
    const char *peer = failed_peer(a);
    if (peer) {
        pl_msg_init(&r, PL_MSG_PEER_BROKEN, a->gen);
        snprintf(r.u.peer_broken.peer, sizeof r.u.peer_broken.peer, "%s", peer);
        snprintf(r.u.peer_broken.reason, sizeof r.u.peer_broken.reason, "%.200s", err);
    } else {
        pl_msg_init(&r, PL_MSG_STEP_FAILED, a->gen);
        r.u.step_failed.step = step;
        snprintf(r.u.step_failed.reason, sizeof r.u.step_failed.reason, "%.900s", err);
    }
    agent_post(a, &r);
}

/* Minor page faults of the process so far (−1 when unknown). */
static long minor_faults(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? -1 : ru.ru_minflt;
}

/* The work memory (activations, scratch) a new engine would need beyond the current
 * engine's, which it takes over: this engine's per layer held, for each block of
 * copy_bytes (params, m, v) received. An estimate: at 350M a receiver needed 53–71 MB
 * there, made present after the copies in 350–425 ms on two busy cores. */
static size_t work_share(const agent *a, int64_t copy_bytes)
{
    const int held = a->e.end - a->e.begin;
    const size_t block = 3 * pl_gpt_layer_params(&a->cfg, 1) * sizeof(float);
    if (copy_bytes <= 0 || held <= 0 || !block) return 0;
    const size_t blocks = ((size_t)copy_bytes + block - 1) / block;
    return a->e.act_bytes / (size_t)held * blocks;
}

/* The reserve for the plan's worst single loss, made after the plan's first step (its old
 * engine gone; again after a plan's copies took it): its helper fills it while the next
 * steps run. At most this worker's own params, m and v (and the work memory for them): the
 * reserve never more than doubles what its layers' state takes (beyond it, a loss's pages
 * fault in as they come). */
static void renew_reserve(agent *a)
{
    pl_reserve *r = &a->reserve;
    const int64_t own = a->have_engine && !a->o->no_copy_reserve
                            ? 3 * (int64_t)a->e.nparams * (int64_t)sizeof(float)
                            : 0;
    const int64_t copies = a->reserve_bytes < own ? a->reserve_bytes : own;
    const size_t want = pl_reserve_size(copies, a->cfg.L + 2, work_share(a, copies));
    if (pl_reserve_renew(r, a->k, want) == 1) {
        agent_log(a, "generation %lld: a reserve of %zu bytes for a loss's copies",
                  (long long)a->gen, r->bytes);
        a->reserve_told = 0;
    } else if (!a->reserve_told && r->bytes && atomic_load(&r->ready) == r->bytes) {
        agent_log(a, "generation %lld: the reserve is present, %.0f ms after it was made",
                  (long long)a->gen, r->ready_ms - r->made_ms);
        a->reserve_told = 1;
    }
}

static void on_start_step(agent *a, const pl_msg *m)
{
    char err[1024] = "";
    const int64_t step = m->u.start_step.step;
    if (m->gen != a->gen || a->pipe < 0) return;
    const double t0 = pl_now_ms();
    /* a re-plan's first step is timed on every worker: a recovery ends with it */
    const int timed = a->gen > 1 && a->timed_gen != a->gen;
    if (a->have_src) { /* the plan is stable now: the old layers are no longer needed */
        pl_engine_destroy(&a->src);
        a->have_src = 0;
    }
    agent_drop_shadow_src(a);
    agent_tell_client(a, a->gen, step);
    if (!step_begin(a, step)) return; /* aborted before it began */
    a->timed_gen = a->gen;
    const double t1 = pl_now_ms();
    const long faults = minor_faults();
    const int failed = run_step(a, step, err, sizeof err);
    step_end(a);
    renew_reserve(a); /* after the step: the first on a new engine ends the recovery */
    if (timed && !failed)
        agent_log(a, "generation %lld: first step %lld in %.1f ms, %ld page faults, old engine "
                  "freed in %.1f ms before it", (long long)a->gen, (long long)step,
                  pl_now_ms() - t1, minor_faults() - faults, t1 - t0);
    if (failed) step_failed(a, step, err);
}

static void on_commit(agent *a, const pl_msg *m)
{
    const pl_msg_commit *c = &m->u.commit;
    if (m->gen != a->gen || a->pipe < 0) return;
    pl_fault_on_commit(&a->fault, c->step);
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
    if (c->save) start_save(a, c->step + 1);
    pl_msg r;
    pl_msg_init(&r, PL_MSG_COMMITTED, a->gen);
    r.u.committed.step = c->step;
    agent_post(a, &r);
    /* The shadow's update after `committed`: it overlaps the coordinator's round trip to
     * the next start_step instead of lengthening the step; nothing reads the shadow before
     * this thread's next message. */
    if (a->have_shadow) {
        const double t0 = pl_now_ms();
        pl_worker_apply(&a->shadow, &w, (float)c->grad_scale, (int)c->step + 1);
        a->rc_stats.apply_ms += pl_now_ms() - t0;
        /* a shadow that missed an update is refilled at the next plan, never kept */
        a->shadow_step = a->shadow_step == c->step ? c->step + 1 : -1;
    }
}

/* save s: this worker's layers written again as the checkpoint of s (an attempt at the
 * job's last checkpoint failed); its state must still be the state after s steps. */
static void on_save(agent *a, const pl_msg *m)
{
    const int64_t step = m->u.save.step;
    if (m->gen != a->gen || a->pipe < 0 || !a->have_engine) return;
    if (a->last_committed + 1 == step) {
        start_save(a, step);
        return;
    }
    char err[160];
    snprintf(err, sizeof err, "this worker holds the state after step %lld, not %lld",
             (long long)(a->last_committed + 1), (long long)step);
    post_saved(a, step, a->e.begin, a->e.end, 0, err);
}

/* eval s: after the commit of s, the plan's pipelines share the validation batches. */
static void on_eval(agent *a, const pl_msg *m)
{
    char err[1024] = "";
    if (m->gen != a->gen || a->pipe < 0) return;
    if (agent_eval(a, m->u.eval.step, err, sizeof err))
        step_failed(a, m->u.eval.step, err);
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
            else if (m.type == PL_MSG_EVAL) on_eval(a, &m);
            else if (m.type == PL_MSG_SAVE) on_save(a, &m);
            else if (m.type == PL_MSG_PROFILE_REQUEST) agent_profile(a, &m);
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
        agent_log(a, "reconnected: resuming at generation %lld, step %lld committed",
              (long long)gen, (long long)m.u.hello_resume.committed_step);
    pl_msg_free(&m);
}

/* The job's data is unusable: the coordinator is told why (FATAL) and the worker ends. */
static void send_data_fatal(agent *a)
{
    pl_msg f;
    pl_msg_init(&f, PL_MSG_FATAL, 0);
    snprintf(f.u.fatal.reason, sizeof f.u.fatal.reason, "data: %.1000s", a->data_err);
    if (pl_ctl_client_send(a->cli, &f) == 0) atomic_store(&a->fatal_sent, 1);
    atomic_store(&a->exit_code, 1);
    atomic_store(&a->done, 1);
}

static void on_stop(agent *a, const pl_msg *m)
{
    if (m->u.stop.exit_code) agent_log(a, "stopped: %s", m->u.stop.reason);
    atomic_store(&a->exit_code, m->u.stop.exit_code);
    atomic_store(&a->stopped, 1);
    atomic_store(&a->done, 1);
}

/* For the compute thread waiting in join_nccl. */
static void on_nccl_init(agent *a, const pl_msg *m)
{
    pthread_mutex_lock(&a->mu);
    memcpy(a->nccl_id, m->u.nccl_init.id, sizeof a->nccl_id);
    a->nccl_gen = m->gen;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* A newer plan arrived: a copy, step or evaluation of the old plan gives up now, so
 * that the compute thread gets to the new plan (the install's waits poll
 * agent_superseded). */
static void supersede_plan(agent *a, int64_t gen)
{
    atomic_store(&a->newest_plan, gen);
    pthread_mutex_lock(&a->mu);
    a->plan_ms = pl_now_ms();
    interrupt_plan(a, SUPERSEDED_MSG);
    pthread_mutex_unlock(&a->mu);
}

/* Messages for the compute thread: queued in order; an abort or a newer plan first
 * interrupts what it is doing, which it would otherwise finish before reading them. */
static void to_compute(agent *a, const pl_msg *m)
{
    if (m->type == PL_MSG_ABORT) abort_step(a, m->gen, m->u.abort_.step);
    if (m->type == PL_MSG_PLAN && m->gen > atomic_load(&a->newest_plan))
        supersede_plan(a, m->gen);
    if (pl_msg_queue_push(a->queue, m)) fail(a, "control message", "out of memory");
}

static void on_message(pl_ctl_client *c, const pl_msg *m, void *user)
{
    agent *a = user;
    (void)c;
    switch (m->type) {
    case PL_MSG_WELCOME:
        if (a->data_err[0]) send_data_fatal(a);
        else hello_resume(a);
        return;
    case PL_MSG_CHALLENGE: return;
    case PL_MSG_REFUSE:
        agent_log(a, "refused: %s", m->u.refuse.reason);
        atomic_store(&a->exit_code, 1);
        atomic_store(&a->done, 1);
        return;
    case PL_MSG_STOP: on_stop(a, m); return;
    case PL_MSG_COMPLETE_CHECKPOINT: agent_complete_checkpoint(a, m); return;
    case PL_MSG_NCCL_INIT: on_nccl_init(a, m); return;
    default: to_compute(a, m); return;
    }
}

static void on_close(pl_ctl_client *c, const char *reason, void *user)
{
    agent *a = user;
    (void)c;
    if (!atomic_load(&a->done) && pl_ctl_client_get_state(c) != PL_CTL_REFUSED) {
        agent_log(a, "control connection closed: %s (reconnecting)", reason ? reason : "");
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
    if (strcmp(kn_backend(a->k), "cpu")) {
        agent_log(a, "kernels: %s, %s matmuls", kn_backend(a->k), kn_precision(a->k));
        return 0;
    }
    /* the CPU engine's memory is the host's: released after the connections close */
    if (pl_idle_teardown_arm(NULL, why, sizeof why)) agent_log(a, "%s", why);
    return 0;
}

/* The job's token shards, each id checked against the vocabulary, and the sample order:
 * 0, or -1 and err (the worker then registers only to tell the coordinator why). */
static int open_data(agent *a, char *err, size_t errlen)
{
    const pl_job *j = &a->job;
    if (pl_tokens_open_vocab(j->data.train, j->model.vocab_size, &a->train, err, errlen))
        return -1;
    a->have_train = 1;
    if (j->data.val[0] && j->eval_every > 0) {
        if (pl_tokens_open_vocab(j->data.val, j->model.vocab_size, &a->val, err, errlen))
            return -1;
        a->have_val = 1;
    }
    return pl_sampler_init(&a->smp, j->data.order, j->data.seed, pl_tokens_count(&a->train),
                           j->batch.seq_len, j->batch.global, err, errlen);
}

static int setup(agent *a, char *err, size_t errlen)
{
    const pl_agent_options *o = a->o;
    if (pl_job_load(o->job_path, &a->job, err, errlen)) return -1;
    a->have_job = 1;
    /* a peer cut off by the network fails its connections about when the coordinator
     * would miss its heartbeats */
    pl_conn_set_silence_ms((int)(a->job.fault_tolerance.heartbeat_seconds * 1000.0) *
                           PL_PROTO_HEARTBEAT_MISSES);
    if (o->checkpoint_dir &&
        pl_pathf(a->job.checkpoint.dir, sizeof a->job.checkpoint.dir, err, errlen, "%s",
                 o->checkpoint_dir))
        return -1;
    if (pl_job_gpt_config(&a->job, &a->cfg, err, errlen)) return -1;
    if (open_data(a, a->data_err, sizeof a->data_err)) /* told to the coordinator */
        agent_log(a, "data: %s", a->data_err);
    if (pl_listener_open(o->host ? o->host : "127.0.0.1", o->peer_port, &a->lst, err, errlen))
        return -1;
    const pl_mesh_config mc = {.listener = a->lst, .token = o->token,
                               .token_len = strlen(o->token), .name = o->name,
                               .cancelled = mesh_cancelled, .log = mesh_log, .ctx = a,
                               .redial = 1, .protection = o->peer_protection};
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
    m.u.leaving.grace_ms = a->o->grace_ms;
    if (pl_ctl_client_send(a->cli, &m) == 0) {
        agent_log(a, "SIGTERM: told the coordinator this worker is leaving");
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
        agent_log(a, "no coordinator for %d s: giving up", PL_PROTO_RECONNECT_WINDOW_MS / 1000);
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
    agent_checkpoint_report(a, &a->cc.reg); /* what it sees now */
    pl_ctl_client *c = pl_ctl_client_create(&a->cc, err, sizeof err);
    if (!c) {
        agent_log(a, "reconnecting: %s", err);
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
    if (!o->ca_path && !o->insecure)
        return pl_errf(err, errlen, "PLIANT_CA: no coordinator certificate to check, and no "
                                    "insecure connection asked for");
    memcpy(a->coordinator_host, o->coordinator, (size_t)(colon - o->coordinator));
    a->coordinator_host[colon - o->coordinator] = 0;
    pl_ctl_client_config cc = {.host = a->coordinator_host, .port = atoi(colon + 1),
                               .ca_path = o->ca_path, .insecure = !o->ca_path && o->insecure,
                               .token = o->token,
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
    agent_checkpoint_report(a, &cc.reg);
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
        if (pl_fault_take_cut(&a->fault)) atomic_store(&a->disconnected, 1);
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
    /* after a fatal error, the coordinator's stop: it has read why before this process
     * ends (an end it would otherwise count as a lost node) */
    const double until = pl_now_ms() + FATAL_WAIT_MS;
    while (atomic_load(&a->fatal_sent) && !atomic_load(&a->stopped) && a->cli &&
           pl_ctl_client_get_state(a->cli) == PL_CTL_WELCOMED && pl_now_ms() < until)
        pl_ctl_client_service(a->cli, 20);
    /* let queued messages (committed) go out */
    for (int i = 0; a->cli && i < 4 && pl_ctl_client_get_state(a->cli) == PL_CTL_WELCOMED; i++)
        pl_ctl_client_service(a->cli, 10);
}

/* Ends the compute thread: whatever it waits for gives up (interrupt_plan); queued
 * messages are dropped (done is set first: the plan's mesh waits poll it). */
static void stop_compute(agent *a, pthread_t th)
{
    atomic_store(&a->done, 1);
    pthread_mutex_lock(&a->mu);
    interrupt_plan(a, "worker exiting");
    pthread_mutex_unlock(&a->mu);
    pl_msg_queue_push_end(a->queue);
    pthread_join(th, NULL);
}

/* A worker told to stop (it left the job, or the job is done) may still be writing its
 * layers of a checkpoint: their `saved` goes out before it exits, else that checkpoint
 * could never complete. */
static void flush_checkpoint(agent *a)
{
    pl_checkpoint_writer_wait(a->ckw);
    for (int i = 0; a->cli && i < 20 && pl_ctl_client_get_state(a->cli) == PL_CTL_WELCOMED; i++)
        pl_ctl_client_service(a->cli, 10);
}

static void agent_free(agent *a)
{
    pl_checkpoint_writer_free(a->ckw); /* a write in flight ends first */
    pl_ctl_client_destroy(a->cli);
    pl_msg_queue_free(a->queue);
    agent_teardown_links(a);
    pl_mesh_destroy(a->mesh);
    if (a->have_engine) pl_engine_destroy(&a->e);
    if (a->have_src) pl_engine_destroy(&a->src);
    agent_drop_shadow(a);
    agent_drop_shadow_src(a);
    pl_reserve_free(&a->reserve);
    if (a->k) kn_destroy(a->k);
    if (a->lst) pl_listener_close(a->lst);
    pl_ar_pack_free(&a->pack);
    free(a->tok);
    free(a->tgt);
    free(a->etok);
    free(a->etgt);
    if (a->have_train) pl_tokens_close(&a->train);
    if (a->have_val) pl_tokens_close(&a->val);
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
        agent_log(a, "%s", err);
    } else if (a->data_err[0]) { /* register, tell the coordinator why, wait for its stop */
        control_loop(a);
        atomic_store(&a->exit_code, 1);
    } else {
        atomic_store(&a->exit_code, 0); /* before the compute thread can fail */
        if (pthread_create(&th, NULL, compute_main, a)) {
            agent_log(a, "cannot start the compute thread");
            atomic_store(&a->exit_code, 1);
        } else {
            control_loop(a);
            stop_compute(a, th);
            flush_checkpoint(a);
        }
    }
    const int code = atomic_load(&a->exit_code);
    agent_free(a);
    return code;
}
