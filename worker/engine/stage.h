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

typedef enum { PL_LINK_ACTIVATION = 0, PL_LINK_GRADIENT = 1 } pl_link_kind;

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
} pl_stage_link;

/* The microbatches this pipeline runs in the step: tokens[mb·B·T ...] for the
 * stage with the embedding, targets likewise for the stage with the head. */
typedef struct {
    const int32_t *tokens, *targets;
    float dloss_scale; /* 1 / (tokens of the whole step, all pipelines) */
} pl_stage_batch;

/* Runs the schedule; gradients accumulate in the engine. With the head,
 * *loss_sum receives the sum of the microbatches' mean losses. The engine
 * needs at least s->nslots slots. Returns 0 or −1 with err. */
int pl_stage_step(pl_engine *e, const pl_schedule *s, const pl_stage_link *link,
                  const pl_stage_batch *batch, double *loss_sum, char *err, size_t errlen);

/* pl_stage_step that reports, during the schedule's last backward, each layer
 * whose gradient for the whole step is then final (pl_engine_backward_notify:
 * highest first), so the runtime can all-reduce it while the lower layers
 * still run backward (Oobleck §6.1). done may be NULL. */
int pl_stage_step_notify(pl_engine *e, const pl_schedule *s, const pl_stage_link *link,
                         const pl_stage_batch *batch, pl_layer_done_fn done, void *ctx,
                         double *loss_sum, char *err, size_t errlen);

#endif
