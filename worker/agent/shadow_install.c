/* Strategy redundant: the shadow engine of a plan and its first state, from the owner
 * over the stage link (agent_state.h, worker/engine/shadow.h). Compute thread. */
#include "agent_state.h"

#include <stdio.h>
#include <string.h>

#include "util.h"

/* The refresh's messages on the stage link: kind PL_LINK_SHADOW, these microbatch
 * numbers (the step's gradients use PL_SHADOW_GRAD_TAG0 and up). */
enum { REFRESH_PARAMS = 1, REFRESH_M = 2, REFRESH_V = 3 };

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

/* Every stage sends first (the link queues), then receives: no order between stages. */
static int refresh(agent *a, int holder, int succ, char *err, size_t errlen)
{
    const pl_stage_link l = pl_tcp_link_stage(a->link);
    pl_engine *e = &a->e, *sh = &a->shadow;
    if (holder >= 0 && (send_state(a, &l, holder, REFRESH_PARAMS, e->params, err, errlen) ||
                        send_state(a, &l, holder, REFRESH_M, e->m, err, errlen) ||
                        send_state(a, &l, holder, REFRESH_V, e->v, err, errlen)))
        return -1;
    if (succ >= 0 && (recv_state(a, &l, succ, REFRESH_PARAMS, sh->params, err, errlen) ||
                      recv_state(a, &l, succ, REFRESH_M, sh->m, err, errlen) ||
                      recv_state(a, &l, succ, REFRESH_V, sh->v, err, errlen)))
        return -1;
    return 0;
}

int agent_install_shadow(agent *a, const pl_msg_plan *p, char *err, size_t errlen)
{
    agent_drop_shadow(a);
    const pl_rc_layout rc = layout_of(a, p);
    if (rc == PL_RC_NONE) return 0;
    const int succ = pl_shadow_successor(rc, a->stage, a->nstages);
    const int holder = pl_shadow_holder(rc, a->stage, a->nstages);
    const double t0 = pl_now_ms();
    if (succ >= 0) {
        const pl_msg_pipeline *mp = &p->pipelines[a->pipe];
        if (pl_shadow_create(&a->shadow, a->k, &a->cfg, mp->layers[succ], mp->layers[succ + 1],
                             a->job.batch.micro, a->job.batch.seq_len, err, errlen))
            return -1;
        a->have_shadow = 1;
    }
    char msg[400];
    if (refresh(a, holder, succ, msg, sizeof msg)) {
        agent_drop_shadow(a);
        return pl_errf(err, errlen, "shadow layers: %s", msg);
    }
    a->rc = rc;
    if (succ >= 0)
        agent_log(a, "generation %lld: shadow of stage %d, layers [%d, %d), %zu floats ×3 in %.1f ms",
                  (long long)a->gen, succ, a->shadow.begin, a->shadow.end, a->shadow.nparams,
                  pl_now_ms() - t0);
    return 0;
}
