/* Fuzz target: a checkpoint's checkpoint.json (worker/engine/checkpoint_info.c
 * pl_checkpoint_meta_parse, behind pl_checkpoint_config and resuming): step, model
 * sizes and sequence length, every number checked. */
#include <limits.h>

#include "checkpoint.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    pl_checkpoint_meta m;
    char err[512] = "";
    if (pl_checkpoint_meta_parse(text, "checkpoint.json", &m, err, sizeof err) == 0) {
        FUZZ_CHECK(m.step >= 0 && m.step <= INT_MAX);
        FUZZ_CHECK(m.cfg.L >= 1 && m.cfg.C >= 1 && m.cfg.NH >= 1 && m.cfg.C % m.cfg.NH == 0);
        FUZZ_CHECK(m.seq_len >= 0 && m.seq_len <= m.cfg.maxT);
    } else {
        FUZZ_CHECK(err[0]);
    }
    free(text);
    return 0;
}
