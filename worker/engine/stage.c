#include "stage.h"

#include <stdlib.h>

#include "util.h"

int pl_stage_step(pl_engine *e, const pl_schedule *s, const pl_stage_link *link,
                  const pl_stage_batch *batch, double *loss_sum, char *err, size_t errlen)
{
    return pl_stage_step_notify(e, s, link, batch, NULL, NULL, loss_sum, err, errlen);
}

int pl_stage_step_notify(pl_engine *e, const pl_schedule *s, const pl_stage_link *link,
                         const pl_stage_batch *batch, pl_layer_done_fn done, void *ctx,
                         double *loss_sum, char *err, size_t errlen)
{
    if (s->nslots > e->nslots)
        return pl_errf(err, errlen, "stage: schedule needs %d activation slots, engine has %d",
                       s->nslots, e->nslots);
    const size_t BT = (size_t)e->B * (size_t)e->T, n = BT * (size_t)e->cfg.C;
    float *buf = (!pl_engine_has_embedding(e) || !pl_engine_has_head(e)) ? malloc(n * sizeof *buf)
                                                                         : NULL;
    if (!buf && (!pl_engine_has_embedding(e) || !pl_engine_has_head(e)))
        return pl_errf(err, errlen, "stage: out of memory");
    /* only the last backward finishes layers: earlier ones are still followed by
     * other microbatches' contributions */
    int last_bw = -1;
    for (int i = 0; i < s->nops; i++)
        if (s->ops[i].kind == PL_SCHED_BACKWARD) last_bw = i;
    double sum = 0;
    int rc = 0;
    for (int i = 0; i < s->nops && rc == 0; i++) {
        const pl_sched_op *op = &s->ops[i];
        const size_t off = (size_t)op->mb * BT;
        if (op->kind == PL_SCHED_FORWARD) {
            if (op->recv_from >= 0)
                rc = link->recv(link->ctx, op->recv_from, PL_LINK_ACTIVATION, op->mb, buf, n, err,
                                errlen);
            if (rc) break;
            const int32_t *tok = pl_engine_has_embedding(e) ? batch->tokens + off : NULL;
            const int32_t *tgt = pl_engine_has_head(e) ? batch->targets + off : NULL;
            sum += pl_engine_forward(e, op->slot, tok, buf, tgt);
            if (op->send_to >= 0)
                rc = link->send(link->ctx, op->send_to, PL_LINK_ACTIVATION, op->mb,
                                pl_engine_output(e, op->slot), n, err, errlen);
        } else {
            if (op->recv_from >= 0)
                rc = link->recv(link->ctx, op->recv_from, PL_LINK_GRADIENT, op->mb, buf, n, err,
                                errlen);
            if (rc) break;
            pl_engine_backward_notify(e, op->slot, buf, batch->dloss_scale,
                                      i == last_bw ? done : NULL, ctx);
            if (op->send_to >= 0)
                rc = link->send(link->ctx, op->send_to, PL_LINK_GRADIENT, op->mb,
                                pl_engine_input_grad(e), n, err, errlen);
        }
    }
    free(buf);
    if (loss_sum) *loss_sum = sum;
    return rc;
}
