/* A helper thread that makes a receiver's memory present ahead of it (kn_populate), so that
 * the receiver's copy writes pages that are already there: on the CPU backend a new
 * engine's pages are allocated and zeroed by the kernel where first touched, and without a
 * helper that work runs inside the receive's copy, on the receiving thread, which the
 * stream then waits for (docs/runtime.md "Where a layer copy's time goes").
 *
 * The receiver writes ranges 0 … n−1 in that order and calls pl_ahead_reach(a, i) before
 * writing range i. The helper populates them in the same order, skipping those the
 * receiver has begun before the helper came to them; where the receiver catches up with
 * it, the receiver faults in the pages at its position while the helper populates further
 * on in the same range (populating keeps what the memory holds), so that the two split
 * the work and never do the same pages twice. */
#ifndef PLIANT_POPULATE_AHEAD_H
#define PLIANT_POPULATE_AHEAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "kernels.h"

/* Range i of the receiver's: where it starts and its bytes. */
typedef void (*pl_ahead_range)(void *ctx, int i, void **p, size_t *bytes);

typedef struct {
    kn_ctx *k;
    int n;
    pl_ahead_range range;
    void *ctx;
    atomic_int reached; /* ranges the receiver has begun; n + 1 once it stops */
    int running;
    pthread_t th;
} pl_ahead;

/* Starts the helper over n ranges of memory of k. Where no thread starts, the receiver
 * populates each range itself (pl_ahead_reach), in one call rather than a fault a page. */
void pl_ahead_start(pl_ahead *a, kn_ctx *k, int n, pl_ahead_range range, void *ctx);
/* The receiver is about to write range i (ranges in increasing order). */
void pl_ahead_reach(pl_ahead *a, int i);
/* Stops the helper and waits for it: the receiver is done or failed. A zeroed pl_ahead
 * (never started) is stopped already. */
void pl_ahead_stop(pl_ahead *a);

#endif
