/* One pipeline stage's share of a step: the 1F1B schedule run over the engine, with
 * activations and gradients exchanged through a link or a transport (stage.h). */
#include "stage.h"

#include <stdlib.h>
#include <string.h>

#include "frc.h"
#include "util.h"

/* x (backend memory, n floats) as host memory: x itself on the CPU, else its copy in
 * staging (a link's send copies the message before returning, so one buffer serves). */
static const float *host_view(pl_engine *e, float *staging, const float *x, size_t n)
{
    if (!staging) return x;
    kn_to_host(e->k, staging, x, n * sizeof *x);
    return staging;
}

int pl_stage_step(pl_engine *e, const pl_schedule *s, const pl_stage_link *link,
                  const pl_stage_batch *batch, double *loss_sum, char *err, size_t errlen)
{
    return pl_stage_step_notify(e, s, link, batch, NULL, NULL, loss_sum, err, errlen);
}

static void before_op(const pl_stage_batch *batch, const pl_sched_op *op)
{
    if (batch->before_op)
        batch->before_op(batch->op_ctx, op->kind == PL_SCHED_BACKWARD, op->mb);
}

/* Before op's receive: the eager FRC fills the wait (frc.h). */
static void frc_wait(const pl_stage_batch *batch, const pl_stage_link *link,
                     const pl_sched_op *op)
{
    if (batch->frc && op->recv_from >= 0)
        pl_frc_fill_wait(batch->frc, link, op->recv_from,
                         op->kind == PL_SCHED_FORWARD ? PL_LINK_ACTIVATION : PL_LINK_GRADIENT,
                         op->mb);
}

/* Checks that the engine has the schedule's slots and finds its last backward (*last_bw):
 * only that one finishes layers, earlier ones are still followed by other microbatches'
 * contributions. 0, or −1 with err. */
static int stage_begin(const pl_engine *e, const pl_schedule *s, int *last_bw, char *err,
                       size_t errlen)
{
    if (s->nslots > e->nslots)
        return pl_errf(err, errlen, "stage: schedule needs %d activation slots, engine has %d",
                       s->nslots, e->nslots);
    *last_bw = -1;
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].kind == PL_SCHED_BACKWARD) *last_bw = i;
    return 0;
}

int pl_stage_step_notify(pl_engine *e, const pl_schedule *s, const pl_stage_link *link,
                         const pl_stage_batch *batch, pl_layer_done_fn done, void *ctx,
                         double *loss_sum, char *err, size_t errlen)
{
    int last_bw = -1;
    if (stage_begin(e, s, &last_bw, err, errlen)) return -1;
    const size_t BT = (size_t)e->B * (size_t)e->T, n = BT * (size_t)e->cfg.C;
    const int linked = !pl_engine_has_embedding(e) || !pl_engine_has_head(e);
    /* Links move host memory: received tensors land in buf (the engine copies them
     * in); off the CPU, what is sent is first staged into out (page-locked). */
    const int staged = linked && strcmp(kn_backend(e->k), "cpu") != 0;
    float *buf = linked ? pl_engine_io_buffer(e, PL_IO_RECV, n) : NULL;
    float *out = staged ? pl_engine_io_buffer(e, PL_IO_SEND, n) : NULL;
    if ((linked && !buf) || (staged && !out)) return pl_errf(err, errlen, "stage: out of memory");
    double sum = 0;
    int rc = 0;
    for (int i = 0; i < s->nops && rc == 0; i++) {
        const pl_sched_op *op = &s->ops[i];
        const size_t off = (size_t)op->mb * BT;
        if (pl_engine_stopped(e)) break;
        before_op(batch, op);
        frc_wait(batch, link, op);
        if (op->kind == PL_SCHED_FORWARD) {
            if (op->recv_from >= 0)
                rc = link->recv(link->ctx, op->recv_from, PL_LINK_ACTIVATION, op->mb, buf, n, err,
                                errlen);
            if (rc) break;
            const int32_t *tok = pl_engine_has_embedding(e) ? batch->tokens + off : NULL;
            const int32_t *tgt = pl_engine_has_head(e) ? batch->targets + off : NULL;
            sum += pl_engine_forward(e, op->slot, tok, buf, tgt);
            if (batch->frc) pl_frc_input_ready(batch->frc, op->mb);
            if (op->send_to >= 0)
                rc = link->send(link->ctx, op->send_to, PL_LINK_ACTIVATION, op->mb,
                                host_view(e, out, pl_engine_output(e, op->slot), n), n, err,
                                errlen);
        } else {
            if (op->recv_from >= 0)
                rc = link->recv(link->ctx, op->recv_from, PL_LINK_GRADIENT, op->mb, buf, n, err,
                                errlen);
            if (rc) break;
            if (i == last_bw)
                pl_engine_backward_last(e, op->slot, buf, batch->dloss_scale, done, ctx);
            else
                pl_engine_backward(e, op->slot, buf, batch->dloss_scale);
            if (op->send_to >= 0)
                rc = link->send(link->ctx, op->send_to, PL_LINK_GRADIENT, op->mb,
                                host_view(e, out, pl_engine_input_grad(e), n), n, err, errlen);
        }
    }
    /* what an aborted step computed is incomplete: it must not be reported */
    if (rc == 0 && pl_engine_stopped(e)) rc = pl_errf(err, errlen, "stage: step aborted");
    if (loss_sum) *loss_sum = sum;
    return rc;
}

/* ---- over an ordered transport (xport.h) ---- */

/* What op `op` sends after computing: its output activation or the input gradient, in
 * the engine's backend memory. */
static pl_xport_op send_of(pl_engine *e, const pl_stage_xlink *x, const pl_sched_op *op,
                           size_t n)
{
    const float *data = op->kind == PL_SCHED_FORWARD ? pl_engine_output(e, op->slot)
                                                     : pl_engine_input_grad(e);
    return (pl_xport_op){x->stage_ranks[op->send_to], 1, (float *)data, n};
}

int pl_stage_step_xport(pl_engine *e, const pl_schedule *s, const pl_stage_xlink *x,
                        const pl_stage_batch *batch, pl_layer_done_fn done, void *ctx,
                        double *loss_sum, char *err, size_t errlen)
{
    const pl_xport *xp = x->xport;
    int last_bw = -1;
    if (stage_begin(e, s, &last_bw, err, errlen)) return -1;
    if (s->nstages > 1) {
        if (!x->stage_ranks || x->stage_ranks[s->stage] != xp->self)
            return pl_errf(err, errlen, "stage: stage %d of the pipeline is not this rank (%d)",
                           s->stage, xp->self);
        for (int k = s->stage - 1; k <= s->stage + 1; k += 2)
            if (k >= 0 && k < s->nstages &&
                (x->stage_ranks[k] < 0 || x->stage_ranks[k] >= xp->nranks ||
                 x->stage_ranks[k] == xp->self))
                return pl_errf(err, errlen, "stage: stage %d has world rank %d (of %d)", k,
                               x->stage_ranks[k], xp->nranks);
    }
    const size_t BT = (size_t)e->B * (size_t)e->T, n = BT * (size_t)e->cfg.C;
    /* received gradients land here (not in the input gradient scratch: the send of the
     * previous backward's input gradient may be in the same group) */
    float *gbuf = NULL;
    if (s->stage < s->nstages - 1 && !(gbuf = pl_engine_io_buffer(e, PL_IO_DEV_GRAD, n)))
        return pl_errf(err, errlen, "stage: out of backend memory");
    double sum = 0;
    int rc = 0;
    for (int i = 0; i < s->nops && rc == 0; i++) {
        const pl_sched_op *op = &s->ops[i];
        if (pl_engine_stopped(e)) break;
        before_op(batch, op);
        /* the paired group: the send after op i−1 and the receive before op i */
        pl_xport_op g[2];
        int ng = 0;
        if (i > 0 && s->ops[i - 1].send_to >= 0) g[ng++] = send_of(e, x, &s->ops[i - 1], n);
        float *in = NULL;
        if (op->recv_from >= 0) {
            in = op->kind == PL_SCHED_FORWARD ? pl_engine_input_buffer(e, op->slot) : gbuf;
            g[ng++] = (pl_xport_op){x->stage_ranks[op->recv_from], 0, in, n};
        }
        if (ng && (xp->after_compute(xp->ctx, err, errlen) ||
                   xp->p2p(xp->ctx, g, ng, err, errlen) ||
                   xp->before_compute(xp->ctx, err, errlen))) {
            rc = -1;
            break;
        }
        if (op->kind == PL_SCHED_FORWARD) {
            const size_t off = (size_t)op->mb * BT;
            const int32_t *tok = pl_engine_has_embedding(e) ? batch->tokens + off : NULL;
            const int32_t *tgt = pl_engine_has_head(e) ? batch->targets + off : NULL;
            sum += pl_engine_forward_dev(e, op->slot, tok, in, tgt);
        } else {
            if (i == last_bw)
                pl_engine_backward_last_dev(e, op->slot, in, batch->dloss_scale, done, ctx);
            else
                pl_engine_backward_dev(e, op->slot, in, batch->dloss_scale);
        }
    }
    if (rc == 0 && pl_engine_stopped(e)) rc = pl_errf(err, errlen, "stage: step aborted");
    if (rc == 0 && s->nops > 0 && s->ops[s->nops - 1].send_to >= 0) {
        const pl_xport_op last = send_of(e, x, &s->ops[s->nops - 1], n);
        if (xp->after_compute(xp->ctx, err, errlen) || xp->p2p(xp->ctx, &last, 1, err, errlen))
            rc = -1;
    }
    if (loss_sum) *loss_sum = sum;
    return rc;
}

/* ---- evaluation: forward only ---- */

int pl_stage_eval(pl_engine *e, int stage, const pl_stage_link *link, const int32_t *tokens,
                  const int32_t *targets, int n, double *loss_sum, char *err, size_t errlen)
{
    const size_t BT = (size_t)e->B * (size_t)e->T, nf = BT * (size_t)e->cfg.C;
    const int first = pl_engine_has_embedding(e), last = pl_engine_has_head(e);
    const int staged = !last && strcmp(kn_backend(e->k), "cpu") != 0;
    float *buf = first ? NULL : pl_engine_io_buffer(e, PL_IO_RECV, nf);
    float *out = staged ? pl_engine_io_buffer(e, PL_IO_SEND, nf) : NULL;
    if ((!first && !buf) || (staged && !out)) return pl_errf(err, errlen, "stage: out of memory");
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!first &&
            link->recv(link->ctx, stage - 1, PL_LINK_ACTIVATION, i, buf, nf, err, errlen))
            return -1;
        sum += pl_engine_forward(e, 0, first ? tokens + (size_t)i * BT : NULL, buf,
                                 last ? targets + (size_t)i * BT : NULL);
        if (!last && link->send(link->ctx, stage + 1, PL_LINK_ACTIVATION, i,
                                host_view(e, out, pl_engine_output(e, 0), nf), nf, err, errlen))
            return -1;
    }
    if (loss_sum) *loss_sum = sum;
    return 0;
}

/* One point-to-point operation as its own group, ordered after the compute queued so far
 * and before the compute that follows. */
static int xport_alone(const pl_xport *xp, pl_xport_op op, char *err, size_t errlen)
{
    return xp->after_compute(xp->ctx, err, errlen) || xp->p2p(xp->ctx, &op, 1, err, errlen) ||
                   xp->before_compute(xp->ctx, err, errlen)
               ? -1
               : 0;
}

int pl_stage_eval_xport(pl_engine *e, int stage, const pl_stage_xlink *x,
                        const int32_t *tokens, const int32_t *targets, int n, int timeout_ms,
                        double *loss_sum, char *err, size_t errlen)
{
    const pl_xport *xp = x->xport;
    const size_t BT = (size_t)e->B * (size_t)e->T, nf = BT * (size_t)e->cfg.C;
    const int first = pl_engine_has_embedding(e), last = pl_engine_has_head(e);
    if ((!first || !last) && (!x->stage_ranks || x->stage_ranks[stage] != xp->self))
        return pl_errf(err, errlen, "stage: stage %d of the pipeline is not this rank (%d)",
                       stage, xp->self);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float *in = first ? NULL : pl_engine_input_buffer(e, 0);
        if (!first && xport_alone(xp, (pl_xport_op){x->stage_ranks[stage - 1], 0, in, nf}, err,
                                  errlen))
            return -1;
        sum += pl_engine_forward_dev(e, 0, first ? tokens + (size_t)i * BT : NULL, in,
                                     last ? targets + (size_t)i * BT : NULL);
        if (!last && xport_alone(xp, (pl_xport_op){x->stage_ranks[stage + 1], 1,
                                                   (float *)pl_engine_output(e, 0), nf},
                                 err, errlen))
            return -1;
    }
    if (xp->wait(xp->ctx, timeout_ms, err, errlen)) return -1;
    if (loss_sum) *loss_sum = sum;
    return 0;
}
