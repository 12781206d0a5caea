/* Fuzz target: llm.c token shards (shared/tokens.c), the input being one shard
 * file: opened with the vocabulary check every loader runs (vocabulary 256, the
 * byte-level one) and, when accepted, read back whole and token by token. */
#include "fuzz.h"
#include "tokens.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file(data, size);
    pl_tokens t;
    char err[512] = "";
    if (pl_tokens_open_vocab(path, 256, &t, err, sizeof err) != 0) {
        FUZZ_CHECK(err[0] && t.nshards == 0);
        return 0;
    }
    int64_t n = pl_tokens_count(&t);
    FUZZ_CHECK(n >= 1 && (size_t)n * 2 + PL_TOKENS_HEADER_BYTES == size);
    int32_t *all = malloc((size_t)n * sizeof *all);
    FUZZ_CHECK(all);
    FUZZ_CHECK(pl_tokens_copy(&t, 0, n, all) == 0);
    for (int64_t i = 0; i < n; i++) FUZZ_CHECK(all[i] == pl_tokens_at(&t, i) && all[i] < 256);
    FUZZ_CHECK(pl_tokens_copy(&t, n, 1, all) == -1);
    free(all);
    pl_tokens_close(&t);
    return 0;
}
