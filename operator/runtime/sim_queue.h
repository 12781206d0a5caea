/* The simulator's clock (`pliant simulate`, docs/simulate.md): a priority queue of timed
 * events, earliest first; events of the same time come out in the order they went in,
 * so a simulation is deterministic. Single-threaded; the queue owns its array. */
#ifndef PLIANT_SIM_QUEUE_H
#define PLIANT_SIM_QUEUE_H

#include <stdint.h>

typedef enum {
    PL_SIM_EV_NODE_ADD,    /* the trace: a node joins the cluster (it starts up) */
    PL_SIM_EV_NODE_REMOVE, /* the trace: a node is preempted */
    PL_SIM_EV_NOTICE,      /* the preemption notice of a node removed later */
    PL_SIM_EV_REGISTER,    /* a started node's worker registers */
    PL_SIM_EV_COPY_DONE,   /* a worker installed its plan (copies, checkpoint load) */
    PL_SIM_EV_COMMITTED,   /* a worker applied a commit */
    PL_SIM_EV_SAVED,       /* a worker wrote its layers of a checkpoint */
    PL_SIM_EV_CKPT_DONE,   /* a worker wrote a checkpoint's checkpoint.json */
    PL_SIM_EV_TICK,        /* the coordinator's timers (settling, waiting for nodes) */
    PL_SIM_EV_END          /* the end of the trace */
} pl_sim_ev_kind;

typedef struct {
    int64_t t_ns;
    uint64_t seq;         /* insertion order: ties keep it */
    pl_sim_ev_kind kind;
    int node;             /* the node (= worker) it concerns; -1: none */
    int64_t gen, step, bytes;
    int layer_begin, layer_end; /* SAVED */
} pl_sim_event;

typedef struct {
    pl_sim_event *ev;
    int n, cap;
    uint64_t next_seq;
} pl_sim_queue;

void pl_sim_queue_init(pl_sim_queue *q);
void pl_sim_queue_free(pl_sim_queue *q);
/* Adds e (its seq is set here): 0, or -1 when memory ran out. */
int pl_sim_queue_push(pl_sim_queue *q, pl_sim_event e);
/* Removes the earliest event into *e: 1, or 0 when empty. */
int pl_sim_queue_pop(pl_sim_queue *q, pl_sim_event *e);
/* The earliest event's time, or INT64_MAX when empty. */
int64_t pl_sim_queue_next_time(const pl_sim_queue *q);
/* The earliest event, or NULL when empty. */
const pl_sim_event *pl_sim_queue_peek(const pl_sim_queue *q);
/* An insertion number for something timed outside the queue (the step in flight), so
 * that it keeps its place among the queue's events of the same time. */
uint64_t pl_sim_queue_ticket(pl_sim_queue *q);

#endif
