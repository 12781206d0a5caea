/* The whole model as the reference of the split tests: the small model they split, and
 * one engine over every layer that runs a step's microbatches in order, the last through
 * pl_engine_backward_last, or only their forwards (evaluation). */
#ifndef PLIANT_TEST_WHOLE_MODEL_H
#define PLIANT_TEST_WHOLE_MODEL_H

#include "engine.h"

/* 3 blocks of 16 channels, 2 heads, a vocabulary of 37, sequences of up to 8. */
static inline const pl_gpt_config *whole_model_config(void)
{
    static pl_gpt_config c;
    char err[128];
    pl_gpt_config_init(&c, 3, 16, 2, 37, 8, err, sizeof err);
    return &c;
}

/* Forward + backward of nmb microbatches of B·T tokens (tok, tgt: nmb·B·T each) into
 * e's gradients (not zeroed here); returns the sum of the microbatches' losses. */
static inline double whole_model_step(pl_engine *e, const int32_t *tok, const int32_t *tgt,
                                      int nmb, float dloss_scale)
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

/* The forwards alone of nmb microbatches in slot 0: the sum of their losses. */
static inline double whole_model_forward(pl_engine *e, const int32_t *tok, const int32_t *tgt,
                                         int nmb)
{
    const size_t BT = (size_t)e->B * (size_t)e->T;
    double loss = 0;
    for (int m = 0; m < nmb; m++)
        loss += pl_engine_forward(e, 0, tok + (size_t)m * BT, NULL, tgt + (size_t)m * BT);
    return loss;
}

#endif
