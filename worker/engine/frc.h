/* Eager forward redundant computation (FRC; Bamboo, NSDI '23 §5.2 "Eager FRC";
 * docs/redundant.md): with strategy redundant each stage also runs the forward of the
 * layers it shadows (its successor's, shadow.h) on its own output, microbatch by
 * microbatch, so that the successor's activations of the step exist twice.
 *
 * When it runs. Bamboo schedules the FRC "before the node starts communicating with its
 * successor node. This is where a bubble exists" and overlaps the FRC of microbatch
 * k − 1 with the normal forward of microbatch k (§5.2 "Scheduling", Figure 9). A stage
 * here has one compute stream, so the FRC goes where the stage would otherwise wait:
 *  - bubble: before each receive of the schedule, while the message is not there yet
 *    (pl_stage_link.ready), and at the step's end while the stage waits for its
 *    all-reduces and its shadow's gradients (pl_frc_fill_while), the next FRC whose
 *    input exists runs (oldest first);
 *  - exposed: what no wait took runs after all of them (pl_frc_finish).
 * The FRC of microbatch i reads the stage's output of i, which the backward of i frees
 * with its activation slot: pl_frc_input_ready keeps a copy in host memory (B·T·C floats
 * a microbatch, PL_IO_FRC_IN of the shadow engine: swapped out like the results, so the
 * device holds no more than one FRC slot), so that an FRC never has to run before that
 * backward and the cool-down's and the step end's waits can take it too. With the
 * embedding as the FRC's input (the ring's last stage shadows stage 0: its input
 * is the tokens) nothing is kept.
 * An FRC runs a layer at a time (pl_engine_forward_part), the wait checked between
 * layers, so a message that arrives during one waits for a layer, not the whole range;
 * an abort of the step (the stage engine's stop flag, pl_engine.stop) ends every fill
 * and pl_frc_finish the same way: the aborted step's FRC results are never read.
 * Every microbatch's FRC runs once per step, in order; the bubble runs are what the
 * bubbles hide, the others are exposed (pl_frc_stats; shared/rc_plan.h predicts the
 * same split: nb·F_succ against the idle time T(nb) − nb·W_k).
 *
 * Where its results go. A normal step never reads them (§5.2: "we swap out these data
 * after FRC is done for each microbatch on each node"; only a lazy BRC would): after each
 * FRC the shadow's slot, every activation its backward would read, is copied to the
 * shadow engine's PL_IO_FRC host buffer (page-locked off the CPU: kn_host_alloc; a
 * separate host buffer on the CPU backend), nmicro slots, kept until the next step.
 *
 * Exactness: the FRC writes only the shadow engine's slot, scratch, PL_IO_FRC and
 * PL_IO_FRC_IN; it reads the stage's output and the shadow's parameters. Nothing of the
 * normal step (the stage's engine, the messages, the gradients) changes, so a step with
 * eager FRC sums exactly what a step without it sums.
 *
 * Threads: the stage's compute thread, like the stage. */
#ifndef PLIANT_FRC_H
#define PLIANT_FRC_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "schedule.h"
#include "stage.h"

typedef struct {
    int bubble, forced;         /* FRCs whose last part ran while the stage waited / after
                                   every wait of the step (exposed) */
    double bubble_ms, forced_ms; /* the time of the parts run in each */
} pl_frc_stats;

struct pl_frc {
    pl_engine *shadow;           /* the successor's layers, one slot */
    const pl_engine *stage;      /* this stage: its outputs are the FRC's inputs */
    const int32_t *tokens;       /* the pipeline's microbatches (shadow with the embedding) */
    const int32_t *targets;      /* the same, for a shadow with the head */
    int nmicro, nslots;          /* the step's microbatches; the stage's slots (mb mod nslots) */
    float *inputs;               /* nmicro of the stage's outputs (PL_IO_FRC_IN, host), or NULL
                                    (the shadow has the embedding: the tokens) */
    char *host;                  /* nmicro swapped-out slots (PL_IO_FRC) */
    size_t slot_bytes;
    int next;                    /* the next microbatch to run */
    int part;                    /* its next part (pl_engine_forward_part) */
    int avail;                   /* microbatches [0, avail) have their input */
    pl_frc_stats stats;
};

/* Prepares a step's FRC: the shadow (one slot), the stage, the schedule (nmicro, the
 * slots), the pipeline's tokens and targets from its first microbatch (NULL when the
 * shadow does not need them). 0, or −1 with err (out of host memory, or a shadow with
 * the embedding or the head without tokens or targets). */
int pl_frc_begin(pl_frc *f, pl_engine *shadow, const pl_engine *stage, const pl_schedule *s,
                 const int32_t *tokens, const int32_t *targets, char *err, size_t errlen);

/* The stage's output of microbatch mb is in its slot (after its forward): kept for
 * its FRC. */
void pl_frc_input_ready(pl_frc *f, int mb);

/* A wait point: before receiving (peer, kind, mb), runs pending FRCs while that
 * message is not there. */
void pl_frc_fill_wait(pl_frc *f, const pl_stage_link *link, int peer, pl_link_kind kind, int mb);

/* Another wait (the step's end): runs pending FRCs while waiting(ctx). */
void pl_frc_fill_while(pl_frc *f, int (*waiting)(void *ctx), void *ctx);

/* After the step's waits: runs what is left, exposed. */
void pl_frc_finish(pl_frc *f);

/* Microbatch mb's swapped-out FRC results (pl_engine_slot_bytes of the shadow: its
 * slot as the shadow's backward would read it), or NULL when it has not run. */
const void *pl_frc_result(const pl_frc *f, int mb);

#endif
