/* The 1F1B pipeline schedule of one stage (Oobleck §4.1.2; PipeDream-Flush):
 * which forwards and backwards a stage runs, in what order, with which
 * activation slot, and what it receives before / sends after each; plus a
 * whole-pipeline simulator that runs every stage's schedule under a chosen
 * point-to-point semantics and reports deadlock or the makespan. Pure: no
 * I/O, no threads, no GPU.
 *
 * Stage k (0-based) of S with Nb microbatches runs
 *   warm-up:   W = min(S − k − 1, Nb) forwards F0 .. F(W−1);
 *   steady:    for j = 0 .. Nb − W − 1: F(W + j), then B(j);
 *   cool-down: B(Nb − W) .. B(Nb − 1).
 * Forwards and backwards are each in microbatch order, so the microbatches in
 * flight (forward done, backward not) are always a contiguous range of at most
 * min(S − k, Nb) of them: that many activation slots suffice and microbatch i
 * can always use slot i mod nslots.
 *
 * Communication: a forward of i on k > 0 first receives activation i from
 * k − 1, and on k < S − 1 sends its output activation i to k + 1 afterwards; a
 * backward of i on k < S − 1 first receives the output gradient i from k + 1,
 * and on k > 0 sends its input gradient i to k − 1 afterwards. Each directed
 * link carries one kind of message, in microbatch order.
 *
 * How to execute it without deadlock: blocking (rendezvous) sends run one at
 * a time DEADLOCK (S = 2, Nb = 2: stage 0 blocks sending activation 1 while
 * stage 1 blocks sending gradient 0). Either make sends asynchronous
 * (buffered: a send never waits for its receiver), or, as Megatron does, post
 * the send that follows op t−1 and the receive that precedes op t together
 * and wait for both ("paired" below) before computing op t, then after the
 * last op complete its send. Both run to completion without deadlock and give
 * the same makespan (tests/unit/test_schedule.c checks this by simulation
 * for every S ≤ 8, Nb ≤ 32 with uniform stages, and for random per-stage
 * compute times). */
#ifndef PLIANT_SCHEDULE_H
#define PLIANT_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

typedef enum { PL_SCHED_FORWARD = 0, PL_SCHED_BACKWARD = 1 } pl_sched_kind;

typedef struct {
    pl_sched_kind kind;
    int mb;         /* microbatch, 0 .. Nb−1 */
    int slot;       /* activation slot: mb mod nslots */
    int recv_from;  /* stage to receive from before computing (activation from
                       k−1 for a forward, gradient from k+1 for a backward), or −1 */
    int send_to;    /* stage to send to after computing (activation to k+1,
                       input gradient to k−1), or −1 */
} pl_sched_op;

typedef struct {
    int nstages;    /* S */
    int stage;      /* k */
    int nmicro;     /* Nb */
    int nwarmup;    /* min(S − k − 1, Nb) */
    int nslots;     /* most microbatches in flight: min(S − k, Nb) */
    int nops;       /* 2·Nb */
    pl_sched_op *ops;
} pl_schedule;

/* The 1F1B schedule of stage `stage` of `nstages` for `nmicro` microbatches.
 * Needs 1 ≤ nstages, 0 ≤ stage < nstages, 1 ≤ nmicro. Returns 0, or −1 with
 * a message in err (bad argument or out of memory). */
int pl_schedule_1f1b(int nstages, int stage, int nmicro, pl_schedule *out, char *err,
                     size_t errlen);
void pl_schedule_free(pl_schedule *s);

/* Point-to-point semantics for the simulator. */
typedef enum {
    PL_SIM_BUFFERED,   /* sends complete at once; a receive waits for its message */
    PL_SIM_PAIRED,     /* rendezvous; send after op t−1 and receive before op t are
                          posted together and both awaited (the recommended way) */
    PL_SIM_SEQUENTIAL  /* rendezvous, one at a time: send after op t−1, then
                          receive before op t (deadlocks: shown for contrast) */
} pl_sim_mode;

typedef struct {
    int nstages, nmicro;
    int deadlock;            /* 1: no stage can progress and some are unfinished */
    int64_t makespan;        /* time the last stage finishes (when no deadlock) */
    /* Start times of compute, indexed [stage·nmicro + mb]; −1 if never run. */
    int64_t *fwd_start, *bwd_start;
    int *max_inflight;       /* per stage: most microbatches in flight observed */
    char stuck[256];         /* on deadlock: where each stage is blocked */
} pl_sim_result;

/* Runs all stages' 1F1B schedules. fwd_time[k] and bwd_time[k] are stage k's
 * compute times (NULL: 1 and 2 for every stage); communication takes no time.
 * Checks the protocol as it goes: every received message is the one the
 * receiver expects (microbatch and kind, in link order) and no slot is
 * overwritten while its microbatch is in flight or read by another. Returns 0
 * (a deadlock is a result, not an error), or −1 with err on a bad argument, a
 * protocol violation, or out of memory. For uniform stages (f, b) without
 * deadlock the makespan is (Nb − 1 + S)·(f + b): (Nb − 1)·3 + 3·S at f = 1,
 * b = 2. With unequal stages it is NOT in general pl_template_time()'s
 * Σ W + (Nb − 1)·max W (W = f + b): usually below it, occasionally above. */
int pl_pipeline_simulate(int nstages, int nmicro, const int64_t *fwd_time,
                         const int64_t *bwd_time, pl_sim_mode mode, pl_sim_result *out,
                         char *err, size_t errlen);
void pl_sim_result_free(pl_sim_result *r);

#endif
