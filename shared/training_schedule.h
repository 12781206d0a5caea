/* What a job does at each step, the same in `pliant train`, the coordinator and its
 * workers: the learning rate of the step, and whether the state after it is saved. */
#ifndef PLIANT_TRAINING_SCHEDULE_H
#define PLIANT_TRAINING_SCHEDULE_H

#include <stdint.h>

/* Learning rate at step s (0-based) of `steps`: linear warmup, then cosine
 * decay to lr·min_ratio (or constant). */
float pl_lr_at(float lr, int cosine, int warmup, float min_ratio, int step, int steps);

/* 1 when the state after `done` committed steps (of `steps`) gets a
 * checkpoint: dir set, and done the last step or a multiple of every (> 0). */
int pl_checkpoint_due(const char *dir, int every, int64_t steps, int64_t done);

#endif
