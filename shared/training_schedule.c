/* The learning-rate schedule and the checkpoint cadence (training_schedule.h). */
#include "training_schedule.h"

#include <math.h>

float pl_lr_at(float lr, int cosine, int warmup, float min_ratio, int step, int steps)
{
    if (step < warmup) return lr * (float)(step + 1) / (float)warmup;
    if (!cosine || steps - 1 <= warmup) return lr;
    /* the last step (steps − 1) runs at exactly lr·min_ratio */
    float ratio = (float)(step - warmup) / (float)(steps - 1 - warmup);
    float coeff = 0.5f * (1.0f + cosf(3.14159265358979f * ratio));
    float lo = lr * min_ratio;
    return lo + coeff * (lr - lo);
}

int pl_checkpoint_due(const char *dir, int every, int64_t steps, int64_t done)
{
    return dir && dir[0] && done > 0 && (done == steps || (every > 0 && done % every == 0));
}
