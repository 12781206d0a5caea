#include "stage.h"

#include <stdlib.h>
#include <string.h>

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

int pl_stage_step_notify(pl_engine *e, const pl_schedule *s, const pl_stage_link *link,
                         const pl_stage_batch *batch, pl_layer_done_fn done, void *ctx,
                         double *loss_sum, char *err, size_t errlen)
{
    if (s->nslots > e->nslots)
        return pl_errf(err, errlen, "stage: schedule needs %d activation slots, engine has %d",
                       s->nslots, e->nslots);
    const size_t BT = (size_t)e->B * (size_t)e->T, n = BT * (size_t)e->cfg.C;
    const int linked = !pl_engine_has_embedding(e) || !pl_engine_has_head(e);
    /* Links move host memory: received tensors land in buf (the engine copies them
     * in); off the CPU, what is sent is first staged into out (page-locked). */
    const int staged = linked && strcmp(kn_backend(e->k), "cpu") != 0;
    float *buf = linked ? kn_host_alloc(e->k, n * sizeof *buf) : NULL;
    float *out = staged ? kn_host_alloc(e->k, n * sizeof *out) : NULL;
    if ((linked && !buf) || (staged && !out)) {
        kn_host_free(e->k, buf);
        kn_host_free(e->k, out);
        return pl_errf(err, errlen, "stage: out of memory");
    }
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
                                host_view(e, out, pl_engine_output(e, op->slot), n), n, err,
                                errlen);
        } else {
            if (op->recv_from >= 0)
                rc = link->recv(link->ctx, op->recv_from, PL_LINK_GRADIENT, op->mb, buf, n, err,
                                errlen);
            if (rc) break;
            pl_engine_backward_notify(e, op->slot, buf, batch->dloss_scale,
                                      i == last_bw ? done : NULL, ctx);
            if (op->send_to >= 0)
                rc = link->send(link->ctx, op->send_to, PL_LINK_GRADIENT, op->mb,
                                host_view(e, out, pl_engine_input_grad(e), n), n, err, errlen);
        }
    }
    kn_host_free(e->k, buf);
    kn_host_free(e->k, out);
    if (loss_sum) *loss_sum = sum;
    return rc;
}
