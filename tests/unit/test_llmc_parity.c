/* Parity with llm.c's CPU trainer (karpathy/llm.c train_gpt2.c, commit
 * db2454f): the same model bits, the same data in sequential order and the
 * same hyper-parameters (AdamW lr 1e-4, β 0.9/0.999, ε 1e-8, no weight decay,
 * no clipping, constant lr, B=4, T=64) give the same per-step losses.
 *
 * The reference losses below were printed by llm.c's trainer (loader with
 * shuffling off) on this machine for a model written in llm.c's format from
 * pl_gpt_init_tensor (L=4, C=128, NH=4, V=256, maxT=256, seed 1337) and on the
 * byte tokens of ../shared/data/tinyshakespeare.txt (first 90% = train, last
 * 10% = val). llm.c itself is not part of this repository. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "engine.h"

static const double LLMC_TRAIN_LOSS[10] = {5.544497490, 5.370750427, 5.202232361, 5.090905190,
                                           5.048595428, 4.996260643, 4.918197632, 4.922647476,
                                           4.924084663, 4.873259544};
static const double LLMC_VAL_LOSS_STEP0 = 5.544326305; /* mean of val batches 0..4 */

#define DATA "../shared/data/tinyshakespeare.txt"

static unsigned char *text;
static long text_len;

/* Batch i of llm.c's sequential loader: tokens [i·B·T, i·B·T + B·T + 1). */
static void batch(const unsigned char *tokens, int i, int BT, int32_t *in, int32_t *tgt)
{
    for (int t = 0; t < BT; t++) {
        in[t] = tokens[(size_t)i * BT + t];
        tgt[t] = tokens[(size_t)i * BT + t + 1];
    }
}

static void test_losses_match_llmc(void)
{
    if (!text) SKIP(DATA " not found (run from the repository root with shared/ beside it)");
    char err[256];
    pl_gpt_config cfg;
    CHECK(pl_gpt_config_init(&cfg, 4, 128, 4, 256, 256, err, sizeof err) == 0);
    kn_ctx *k = kn_create("cpu", 0, err, sizeof err);
    CHECK(k != NULL);
    const int B = 4, T = 64, BT = B * T;
    pl_engine e;
    CHECK(pl_engine_create(&e, k, &cfg, 0, cfg.L + 2, B, T, 1, err, sizeof err) == 0);
    pl_engine_init_random(&e, 1337);
    const long ntrain = text_len * 9 / 10;
    const unsigned char *train = text, *val = text + ntrain;
    int32_t in[256], tgt[256];

    double val_loss = 0;
    for (int i = 0; i < 5; i++) {
        batch(val, i, BT, in, tgt);
        val_loss += pl_engine_forward(&e, 0, in, NULL, tgt);
    }
    val_loss /= 5;
    printf("    val loss at step 0: pliant %.9f, llm.c %.9f\n", val_loss, LLMC_VAL_LOSS_STEP0);

    pl_adamw o = {1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f};
    double worst = 0;
    int ok = fabs(val_loss - LLMC_VAL_LOSS_STEP0) <= 1e-4 * LLMC_VAL_LOSS_STEP0;
    for (int s = 0; s < 10; s++) {
        batch(train, s, BT, in, tgt);
        pl_engine_zero_grads(&e);
        double loss = pl_engine_forward(&e, 0, in, NULL, tgt);
        pl_engine_backward_last(&e, 0, NULL, 1.0f / (float)BT, NULL, NULL);
        pl_engine_adamw(&e, &o, 1.0f, s + 1);
        double rel = fabs(loss - LLMC_TRAIN_LOSS[s]) / LLMC_TRAIN_LOSS[s];
        printf("    step %d: pliant %.9f llm.c %.9f (rel %.1e)\n", s, loss, LLMC_TRAIN_LOSS[s], rel);
        if (rel > worst) worst = rel;
    }
    pl_engine_destroy(&e);
    kn_destroy(k);
    CHECK(ok);
    CHECK(worst <= 1e-4);
}

TEST_MAIN_BEGIN
FILE *f = fopen(DATA, "rb");
if (f) {
    fseek(f, 0, SEEK_END);
    text_len = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = malloc((size_t)text_len);
    if (fread(text, 1, (size_t)text_len, f) != (size_t)text_len) text = NULL;
    fclose(f);
}
RUN(test_losses_match_llmc);
free(text);
TEST_MAIN_END
