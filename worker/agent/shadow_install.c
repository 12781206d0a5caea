/* Strategy redundant: the shadow engine of a plan, kept from the stable plan or filled with
 * the owner's state over the stage link (agent_state.h, worker/engine/shadow.h). Compute
 * thread. */
#include "agent_state.h"

#include <stdio.h>
#include <string.h>

#include "util.h"

/* The refresh's messages on the stage link: kind PL_LINK_SHADOW, these microbatch
 * numbers (the step's gradients use PL_SHADOW_GRAD_TAG0 and up). */
enum { REFRESH_PARAMS = 1, REFRESH_M = 2, REFRESH_V = 3, REFRESH_ASK = 4, REFRESH_ANSWER = 5 };

void agent_count_rc(agent *a, const pl_worker_step_result *r)
{
    if (!a->have_shadow) return;
    a->rc_stats.steps++;
    a->rc_stats.recv_ms += r->shadow_recv_ms;
    const pl_frc_stats *f = &r->frc;
    if (f->bubble + f->forced == 0) return;
    a->rc_stats.frc.bubble += f->bubble;
    a->rc_stats.frc.forced += f->forced;
    a->rc_stats.frc.bubble_ms += f->bubble_ms;
    a->rc_stats.frc.forced_ms += f->forced_ms;
    a->rc_stats.frc_steps++;
}

/* The shadow's costs (bench/rc_overhead_bench.py reads these lines). */
static void log_rc(agent *a)
{
    const int n = a->rc_stats.steps;
    if (n)
        agent_log(a, "rc: %d steps, shadow gradients received after the stage %.2f ms a step, "
                  "shadow AdamW after the commit %.2f ms a step",
                  n, a->rc_stats.recv_ms / n, a->rc_stats.apply_ms / n);
    const pl_frc_stats *f = &a->rc_stats.frc;
    if (a->rc_stats.frc_steps)
        agent_log(a, "frc: %d steps, %d microbatches in waits (%.1f ms), %d exposed (%.1f ms)",
                  a->rc_stats.frc_steps, f->bubble, f->bubble_ms, f->forced, f->forced_ms);
    memset(&a->rc_stats, 0, sizeof a->rc_stats);
}

void agent_drop_shadow(agent *a)
{
    log_rc(a);
    if (a->have_shadow) pl_engine_destroy(&a->shadow);
    a->have_shadow = 0;
    a->rc = PL_RC_NONE;
    memset(&a->shadow, 0, sizeof a->shadow);
}

void agent_retire_shadow(agent *a)
{
    if (a->have_shadow && !a->have_shadow_src) {
        a->shadow_src = a->shadow;
        a->shadow_src_step = a->shadow_step;
        a->have_shadow_src = 1;
        a->have_shadow = 0;
        memset(&a->shadow, 0, sizeof a->shadow);
    }
    agent_drop_shadow(a);
}

void agent_drop_shadow_src(agent *a)
{
    if (a->have_shadow_src) pl_engine_destroy(&a->shadow_src);
    a->have_shadow_src = 0;
    memset(&a->shadow_src, 0, sizeof a->shadow_src);
}

int agent_wrap_stage(const agent *a)
{
    if (a->job.fault_tolerance.strategy != PL_STRATEGY_REDUNDANT || a->nstages < 3) return -1;
    return a->stage == 0 ? a->nstages - 1 : a->stage == a->nstages - 1 ? 0 : -1;
}

/* Bamboo's ring (§5.1) on the TCP stage link, which has the wrap between the last and the
 * first stage with ≥ 3 stages (agent_wrap_stage). */
static pl_rc_layout layout_of(const agent *a, const pl_msg_plan *p)
{
    if (a->job.fault_tolerance.strategy != PL_STRATEGY_REDUNDANT || a->nstages < 2 ||
        p->transport != PL_TRANSPORT_TCP || !a->link)
        return PL_RC_NONE;
    return PL_RC_RING;
}

/* Sends one of the owner's state buffers (backend memory) to the shadow's holder. */
static int send_state(agent *a, const pl_stage_link *l, int holder, int what, const float *x,
                      char *err, size_t errlen)
{
    const float *buf = x;
    if (strcmp(kn_backend(a->k), "cpu")) {
        float *h = pl_engine_io_buffer(&a->e, PL_IO_SEND, a->e.nparams);
        if (!h) return pl_errf(err, errlen, "shadow: out of memory");
        kn_to_host(a->k, h, x, a->e.nparams * sizeof(float));
        buf = h;
    }
    return l->send(l->ctx, holder, PL_LINK_SHADOW, what, buf, a->e.nparams, err, errlen);
}

static int recv_state(agent *a, const pl_stage_link *l, int succ, int what, float *x,
                      char *err, size_t errlen)
{
    float *buf = x;
    if (strcmp(kn_backend(a->k), "cpu") &&
        !(buf = pl_engine_io_buffer(&a->shadow, PL_IO_RECV, a->shadow.nparams)))
        return pl_errf(err, errlen, "shadow: out of memory");
    if (l->recv(l->ctx, succ, PL_LINK_SHADOW, what, buf, a->shadow.nparams, err, errlen))
        return -1;
    if (buf != x) kn_to_device(a->k, x, buf, a->shadow.nparams * sizeof(float));
    return 0;
}

/* The plan's exchange with the neighbours on the ring (REFRESH_ASK, REFRESH_ANSWER): the
 * holder asks with the range and committed step of the shadow it could keep, -1s for none;
 * the owner answers 1 (kept) or 0 (its state follows). Int64s in a float message, bit for
 * bit. */
enum { ASK_INTS = 3 };
_Static_assert(sizeof(int64_t) == 2 * sizeof(float), "an int64 is two floats on the link");

static int send_ints(const pl_stage_link *l, int peer, int tag, const int64_t *v, int n,
                     char *err, size_t errlen)
{
    float buf[2 * ASK_INTS];
    memcpy(buf, v, (size_t)n * sizeof *v);
    return l->send(l->ctx, peer, PL_LINK_SHADOW, tag, buf, 2 * (size_t)n, err, errlen);
}

static int recv_ints(const pl_stage_link *l, int peer, int tag, int64_t *v, int n, char *err,
                     size_t errlen)
{
    float buf[2 * ASK_INTS];
    if (l->recv(l->ctx, peer, PL_LINK_SHADOW, tag, buf, 2 * (size_t)n, err, errlen)) return -1;
    memcpy(v, buf, (size_t)n * sizeof *v);
    return 0;
}

/* The holder's request: the stable plan's shadow (shadow_src), if its step is known. */
static int ask_successor(agent *a, const pl_stage_link *l, int succ, char *err, size_t errlen)
{
    const pl_engine *s = &a->shadow_src;
    const int have = a->have_shadow_src && a->shadow_src_step >= 0;
    const int64_t ask[ASK_INTS] = {have ? s->begin : -1, have ? s->end : -1,
                                   have ? a->shadow_src_step : -1};
    return send_ints(l, succ, REFRESH_ASK, ask, ASK_INTS, err, errlen);
}

/* The owner's side. Its engine holds the state after the plan's step − 1 (copied, kept or
 * loaded: on_plan), like every replica of its layers (identical after each commit), so a
 * shadow of the same range with as many committed steps holds its bytes, whoever filled it. */
static int serve_holder(agent *a, const pl_stage_link *l, int holder, int64_t step, char *err,
                        size_t errlen)
{
    int64_t ask[ASK_INTS];
    if (recv_ints(l, holder, REFRESH_ASK, ask, ASK_INTS, err, errlen)) return -1;
    const int64_t kept = ask[0] == a->e.begin && ask[1] == a->e.end && ask[2] == step;
    if (send_ints(l, holder, REFRESH_ANSWER, &kept, 1, err, errlen)) return -1;
    if (kept) return 0;
    if (send_state(a, l, holder, REFRESH_PARAMS, a->e.params, err, errlen)) return -1;
    pl_fault_after_shadow_send(&a->fault);
    return send_state(a, l, holder, REFRESH_M, a->e.m, err, errlen) ||
                   send_state(a, l, holder, REFRESH_V, a->e.v, err, errlen)
               ? -1
               : 0;
}

/* The holder's side of the answer: *kept, or a new shadow of layers [b, e) filled with the
 * owner's state. */
static int take_answer(agent *a, const pl_stage_link *l, int succ, int b, int e, int *kept,
                       char *err, size_t errlen)
{
    int64_t answer;
    if (recv_ints(l, succ, REFRESH_ANSWER, &answer, 1, err, errlen)) return -1;
    *kept = answer == 1;
    if (*kept) return 0;
    pl_engine *sh = &a->shadow;
    if (pl_shadow_create(sh, a->k, &a->cfg, b, e, a->job.batch.micro, a->job.batch.seq_len,
                         err, errlen))
        return -1;
    a->have_shadow = 1;
    return recv_state(a, l, succ, REFRESH_PARAMS, sh->params, err, errlen) ||
                   recv_state(a, l, succ, REFRESH_M, sh->m, err, errlen) ||
                   recv_state(a, l, succ, REFRESH_V, sh->v, err, errlen)
               ? -1
               : 0;
}

/* The sends are queued: every stage asks first, then serves its holder, then takes its
 * answer, so no stage waits on one that waits on it (2 stages, the wrap included). */
static int refresh(agent *a, const pl_msg_plan *p, int holder, int succ, int *kept, char *err,
                   size_t errlen)
{
    const pl_stage_link l = pl_tcp_link_stage(a->link);
    const pl_msg_pipeline *mp = &p->pipelines[a->pipe];
    *kept = 0;
    if (succ >= 0 && ask_successor(a, &l, succ, err, errlen)) return -1;
    if (holder >= 0 && serve_holder(a, &l, holder, p->step, err, errlen)) return -1;
    if (succ >= 0)
        return take_answer(a, &l, succ, mp->layers[succ], mp->layers[succ + 1], kept, err,
                           errlen);
    return 0;
}

/* A kept shadow becomes the plan's: it shares no page with the engine (the layer copies map
 * shadow_src's layers only into a range that holds them, and the successor's is not this
 * stage's). */
static void keep_shadow(agent *a)
{
    a->shadow = a->shadow_src;
    a->shadow_step = a->shadow_src_step;
    a->have_shadow = 1;
    a->have_shadow_src = 0;
    memset(&a->shadow_src, 0, sizeof a->shadow_src);
}

int agent_install_shadow(agent *a, const pl_msg_plan *p, char *err, size_t errlen)
{
    agent_drop_shadow(a);
    const pl_rc_layout rc = layout_of(a, p);
    if (rc == PL_RC_NONE) return 0;
    const int succ = pl_shadow_successor(rc, a->stage, a->nstages);
    const int holder = pl_shadow_holder(rc, a->stage, a->nstages);
    const double t0 = pl_now_ms();
    char msg[400];
    int kept;
    if (refresh(a, p, holder, succ, &kept, msg, sizeof msg)) {
        agent_drop_shadow(a);
        return pl_errf(err, errlen, "shadow layers: %s", msg);
    }
    a->rc = rc;
    if (succ < 0) return 0;
    if (kept) {
        keep_shadow(a);
        agent_log(a, "generation %lld: shadow of stage %d, layers [%d, %d), kept at step %lld, "
                  "0 bytes (%lld in refills so far)", (long long)a->gen, succ, a->shadow.begin,
                  a->shadow.end, (long long)p->step, (long long)a->shadow_refill_bytes);
        return 0;
    }
    const int64_t bytes = 3 * (int64_t)a->shadow.nparams * (int64_t)sizeof(float);
    a->shadow_step = p->step;
    a->shadow_refill_bytes += bytes;
    agent_log(a, "generation %lld: shadow of stage %d, layers [%d, %d), refilled: %zu floats ×3, "
              "%lld bytes in %.1f ms (%lld in refills so far)", (long long)a->gen, succ,
              a->shadow.begin, a->shadow.end, a->shadow.nparams, (long long)bytes,
              pl_now_ms() - t0, (long long)a->shadow_refill_bytes);
    return 0;
}
