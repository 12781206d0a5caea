/* The whole model as the reference of the split tests: one engine over every layer
 * runs a step's microbatches in order, the last through pl_engine_backward_last. */
#ifndef PLIANT_TEST_WHOLE_MODEL_H
#define PLIANT_TEST_WHOLE_MODEL_H

#include "engine.h"

/* Forward + backward of nmb microbatches of B·T tokens (tok, tgt: nmb·B·T each) into
 * e's gradients (not zeroed here); returns the sum of the microbatches' losses. */
static double whole_model_step(pl_engine *e, const int32_t *tok, const int32_t *tgt, int nmb,
                               float dloss_scale)
{
    const size_t BT = (size_t)e->B * (size_t)e->T;
    double loss = 0;
    for (int m = 0; m < nmb; m++) {
        loss += pl_engine_forward(e, 0, tok + (size_t)m * BT, NULL, tgt + (size_t)m * BT);
        if (m + 1 < nmb) pl_engine_backward(e, 0, NULL, dloss_scale);
        else pl_engine_backward_last(e, 0, NULL, dloss_scale, NULL, NULL);
    }
    return loss;
}

#endif
