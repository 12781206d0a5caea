/* `pliant export CKPT --llmc OUT.bin`: the newest checkpoint under CKPT as an
 * llm.c model file (gpt2_124M.bin format, version 3, fp32). */
#include <stdio.h>
#include <string.h>

#include "checkpoint.h"
#include "commands.h"

static const float *engine_tensor(void *ctx, int layer, int index)
{
    const pl_engine *e = ctx;
    return e->params + pl_engine_find(e, layer, index)->offset;
}

int cmd_export(int argc, char **argv)
{
    if (argc != 4 || strcmp(argv[2], "--llmc")) {
        fprintf(stderr, "pliant export: usage: pliant export CKPT --llmc OUT.bin\n");
        return 2;
    }
    char err[1024];
    kn_ctx *k = kn_create("cpu", 0, err, sizeof err);
    pl_engine e;
    int rc = 1;
    if (k && pl_engine_from_checkpoint(&e, k, argv[1], 1, 1, err, sizeof err) == 0) {
        if (pl_llmc_write(argv[3], &e.cfg, engine_tensor, &e, err, sizeof err) == 0) {
            printf("wrote %s (%zu parameters)\n", argv[3], pl_gpt_total_params(&e.cfg));
            rc = 0;
        }
        pl_engine_destroy(&e);
    }
    if (rc) fprintf(stderr, "pliant export: %s\n", err);
    kn_destroy(k);
    return rc;
}
