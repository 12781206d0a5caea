/* Memory a CPU worker holds ready for the layers it would receive in a loss (docs/runtime.md
 * "A reserve for the copies"). On the CPU backend a new engine's pages come from the kernel
 * where first written, allocated and zeroed one at a time, and that work ran inside the
 * copies' receive (about 0.4–0.7 s a GB on a core); a GPU's memory is there before the loss.
 * The coordinator tells each worker how much it would receive, at most, if one worker of
 * its plan were lost (pl_msg_plan.reserve_bytes); the worker holds a block of that much
 * (with the gradients' share: their pages are needed by the first step too) made present
 * by a helper thread at a low priority while it trains, and a plan's copies map its
 * pages into the new engine's received layers (kn_share: page tables move, nothing is
 * copied or faulted) before the stream starts. After the plan's first step the worker makes
 * a new reserve; the old one's pages that no engine took go back to the system (kn_free).
 *
 * Threads and ownership: a reserve belongs to the worker's compute thread, which calls
 * every function; the helper thread only populates the block, and renew, take and free
 * stop it first. Backends without kn_populate or kn_share (CUDA) hold no reserve. */
#ifndef PLIANT_COPY_RESERVE_H
#define PLIANT_COPY_RESERVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "kernels.h"

typedef struct {
    kn_ctx *k;
    char *block;         /* kn_alloc'd, `bytes` long; NULL: none */
    size_t bytes;
    size_t used;         /* from the start, mapped into an engine already (pl_reserve_take) */
    atomic_size_t ready; /* from the start, made present by the helper */
    atomic_int stop;
    double made_ms, ready_ms; /* pl_now_ms when renewed, when all present (0: not yet) */
    int running;
    pthread_t th;
} pl_reserve;

/* The reserve's size for a plan's reserve_bytes (params, m, v of the layers): gradients
 * too, each layer's pages rounded up in each of the four arrays (a model of nlayers), and
 * work_bytes for the new engine's activations and scratch (the worker's estimate). */
size_t pl_reserve_size(int64_t reserve_bytes, int nlayers, size_t work_bytes);
/* A reserve of `bytes` (whole pages), its helper started, in place of what r held; bytes 0
 * only frees. 1 when made; 0 when r already held that many unused bytes (kept, its helper
 * resumed where paused) or bytes is 0; −1 when the backend cannot or the memory is not
 * there (r then holds none). */
int pl_reserve_renew(pl_reserve *r, kn_ctx *k, size_t bytes);
/* Stops the helper until the next renew: a plan change is under way, and its copies want
 * the cores (every worker's: a sender's helper slows the stream as much as its receiver's). */
void pl_reserve_pause(pl_reserve *r);
/* Maps `bytes` (KN_SHARE_ALIGN multiple) of the reserve's present, unused memory over
 * [block + off, + bytes) of a block of r's backend. −1 when r has not that much ready or
 * the backend refuses (nothing changed: the caller's pages come as before). */
int pl_reserve_take(pl_reserve *r, void *block, size_t off, size_t bytes);
/* pl_reserve_take of as much of bytes as r has ready, with the reserve as a void *: what
 * pl_engine_share_work takes as the source of the work memory an old engine does not
 * cover (a pl_work_source). The bytes mapped. */
size_t pl_reserve_work_source(void *reserve, void *block, size_t off, size_t bytes);
/* Bytes mapped into engines since the last renew (a new one is due when > 0). */
static inline size_t pl_reserve_used(const pl_reserve *r)
{
    return r->used;
}
void pl_reserve_free(pl_reserve *r);

#endif
