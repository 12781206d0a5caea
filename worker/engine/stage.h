/* One pipeline stage's share of a training step: the 1F1B schedule
 * (shared/schedule.h) run over the engine, with activations and gradients
 * exchanged with the neighbouring stages through a link. The link is how the
 * runtime plugs in a transport (TCP between workers, or memory in tests). */
#ifndef PLIANT_STAGE_H
#define PLIANT_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "schedule.h"
#include "xport.h"

/* PL_LINK_SHADOW: strategy redundant's messages to the stage that shadows this one
 * (shadow.h), never part of the 1F1B schedule. */
typedef enum { PL_LINK_ACTIVATION = 0, PL_LINK_GRADIENT = 1, PL_LINK_SHADOW = 2 } pl_link_kind;

/* Point-to-point transfers of B·T·C floats with the stage `peer` (k − 1 or
 * k + 1) about microbatch mb. recv blocks until the message is there; send
 * must NOT wait for the peer's matching recv (copy or queue it and return):
 * with rendezvous sends 1F1B deadlocks as soon as S ≥ 2 and Nb ≥ 2 (stage k
 * sending activation i+1 while stage k+1 sends gradient i; see
 * pl_pipeline_simulate). Return 0, or −1 with err when the transport broke
 * (the runtime reports it and the step is aborted). */
typedef struct {
    void *ctx;
    int (*send)(void *ctx, int peer, pl_link_kind kind, int mb, const float *buf, size_t n,
                char *err, size_t errlen);
    int (*recv)(void *ctx, int peer, pl_link_kind kind, int mb, float *buf, size_t n, char *err,
                size_t errlen);
    /* 1 when that message is there (a recv would not wait), 0 when not or the link
     * broke (the recv reports it). NULL: unknown, read as 0. Only the forward redundant
     * computation asks (frc.h: it fills the waits). */
    int (*ready)(void *ctx, int peer, pl_link_kind kind, int mb);
} pl_stage_link;

typedef struct pl_frc pl_frc; /* frc.h */

/* The microbatches this pipeline runs in the step: tokens[mb·B·T ...] for the
 * stage with the embedding, targets likewise for the stage with the head. */
typedef struct {
    const int32_t *tokens, *targets;
    float dloss_scale; /* 1 / (tokens of the whole step, all pipelines) */
    /* Fault injection for the recovery tests (worker/agent/fault.h): called before each
     * op of the schedule, backward 0 or 1, mb the microbatch. NULL: none. */
    void (*before_op)(void *ctx, int backward, int mb);
    void *op_ctx;
    /* Eager forward redundant computation (frc.h; Bamboo §5.2), run in this stage's
     * waits; what they leave is the caller's (pl_frc_finish). NULL: none.
     * pl_stage_step_notify only (not the ordered transport's). */
    pl_frc *frc;
} pl_stage_batch;

/* Runs the schedule; gradients accumulate in the engine. With the head,
 * *loss_sum receives the sum of the microbatches' mean losses. The engine
 * needs at least s->nslots slots. Returns 0 or −1 with err; −1 ("step aborted")
 * too when the engine's stop flag was set during the step (engine.h): the
 * schedule ends at the next layer. */
int pl_stage_step(pl_engine *e, const pl_schedule *s, const pl_stage_link *link,
                  const pl_stage_batch *batch, double *loss_sum, char *err, size_t errlen);

/* pl_stage_step that reports, during the schedule's last backward, each layer
 * whose gradient for the whole step is then final (pl_engine_backward_last:
 * highest first), so the runtime can all-reduce it while the lower layers
 * still run backward (Oobleck §6.1). done may be NULL. */
int pl_stage_step_notify(pl_engine *e, const pl_schedule *s, const pl_stage_link *link,
                         const pl_stage_batch *batch, pl_layer_done_fn done, void *ctx,
                         double *loss_sum, char *err, size_t errlen);

/* The pipeline on an ORDERED transport (xport.h: NCCL's model, rendezvous p2p). */
typedef struct {
    const pl_xport *xport;
    const int *stage_ranks; /* world rank of each stage 0 .. S−1 of the pipeline;
                               stage_ranks[k] is xport->self (NULL when S = 1) */
} pl_stage_xlink;

/* pl_stage_step_notify over an ordered transport, in the schedule's PAIRED mode (what
 * Megatron does): before computing op t it enqueues ONE group holding the send that
 * follows op t−1 (if any) and the receive that precedes op t (if any), after
 * after_compute and followed by before_compute; after the last op, its send alone.
 * Tensors stay in backend memory: activations are received straight into the slot's
 * input (pl_engine_input_buffer), gradients into one backend buffer the backward
 * copies from; sends read the slot's output or the engine's input gradient in place.
 *
 * Buffer lifetimes (every one follows from the per-rank issue order):
 *  - what op t−1 sends is read by the transport before op t computes (before_compute
 *    after the group), so the input gradient scratch, which op t's backward
 *    overwrites, needs no copy; the slot output is not written again before that
 *    slot's backward;
 *  - the group before op t overwrites the gradient buffer and the slot input only
 *    after the compute queued so far (after_compute), which is the last reader of
 *    either (op t−1's copy, the slot's previous microbatch's backward);
 *  - the last send is only ENQUEUED when this returns: the caller enqueues what must
 *    follow it (the tied-wte all-reduce) and then waits (xport->wait) before touching
 *    the engine again. On −1 the transport may still hold operations on the engine's
 *    buffers (xport.h: abort it).
 * done (may be NULL) is called during the last backward, highest layer first, after
 * that layer's kernels are queued: a callback enqueuing a collective on the layer's
 * gradients calls after_compute first. */
int pl_stage_step_xport(pl_engine *e, const pl_schedule *s, const pl_stage_xlink *x,
                        const pl_stage_batch *batch, pl_layer_done_fn done, void *ctx,
                        double *loss_sum, char *err, size_t errlen);

/* Evaluation (validation loss): n microbatches forward only through the pipeline, in
 * order, each in slot 0. Stage `stage` receives microbatch i's activation from stage − 1
 * (without the embedding), runs its layers and sends its output to stage + 1 (without the
 * head); tokens / targets hold the n microbatches as in pl_stage_batch. With the head,
 * *loss_sum receives the sum of the microbatches' mean losses, in order (what one process
 * sums over the same batches). Gradients are not touched. 0, or −1 with err. */
int pl_stage_eval(pl_engine *e, int stage, const pl_stage_link *link, const int32_t *tokens,
                  const int32_t *targets, int n, double *loss_sum, char *err, size_t errlen);
/* The same over an ordered transport (stage_ranks as in pl_stage_step_xport): each receive
 * and send is its own group, then the host waits (timeout_ms) for the last send. On −1 the
 * transport may still hold operations on the engine's buffers (xport.h: abort it). */
int pl_stage_eval_xport(pl_engine *e, int stage, const pl_stage_xlink *x,
                        const int32_t *tokens, const int32_t *targets, int n, int timeout_ms,
                        double *loss_sum, char *err, size_t errlen);

#endif
