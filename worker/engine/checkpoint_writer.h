/* Checkpoints written in the background (docs/protocol.md "Checkpoints"): the
 * engine's parameters and AdamW state are copied at once (a few memcpy, the
 * training goes on with the next step) and a thread writes the copy with
 * pl_checkpoint_save. One write at a time per writer: starting a second one
 * waits for the first. */
#ifndef PLIANT_CHECKPOINT_WRITER_H
#define PLIANT_CHECKPOINT_WRITER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

typedef struct pl_checkpoint_writer pl_checkpoint_writer;

/* Called on the writer's thread when a write ends: rc 0 (bytes written) or −1 (err). */
typedef void (*pl_checkpoint_done_fn)(void *user, int64_t step, int layer_begin, int layer_end,
                                int rc, int64_t bytes, const char *err);

pl_checkpoint_writer *pl_checkpoint_writer_new(pl_checkpoint_done_fn done, void *user);
/* Waits for the write in flight, then frees. NULL is fine. */
void pl_checkpoint_writer_free(pl_checkpoint_writer *w);

/* Snapshots e (CPU memory or a device copy) and starts writing it as the layers
 * of DIR/step-<step>/. Returns 0, or −1 with err (out of memory, no thread);
 * write errors come through the callback. */
int pl_checkpoint_writer_start(pl_checkpoint_writer *w, const pl_engine *e, const char *dir, int64_t step,
                         char *err, size_t errlen);

/* Waits for the write in flight, if any. */
void pl_checkpoint_writer_wait(pl_checkpoint_writer *w);

#endif
