/* Fuzz target: safetensors files (shared/safetensors.c), parsed from memory with
 * the checks pl_st_open makes on a mapped file. Every tensor of an accepted file
 * lies inside it and is read whole, found by name and expected with its own shape. */
#include "fuzz.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an exact copy, so that a read past the end is caught even where data is not */
    uint8_t *copy = malloc(size ? size : 1);
    FUZZ_CHECK(copy);
    memcpy(copy, data, size);
    pl_st_file f;
    char err[512] = "";
    if (pl_st_parse(copy, size, "fuzz.safetensors", &f, err, sizeof err) == 0) {
        unsigned sum = 0;
        for (int i = 0; i < f.ntensors; i++) {
            const pl_st_tensor *t = &f.tensors[i];
            const uint8_t *p = t->data;
            FUZZ_CHECK(p >= copy && t->nbytes <= size && p + t->nbytes <= copy + size);
            for (size_t k = 0; k < t->nbytes; k++) sum += p[k];
            FUZZ_CHECK(pl_st_find(&f, t->name) == t);
            FUZZ_CHECK(pl_st_expect(&f, t->name, t->dtype, t->ndim, t->shape, err, sizeof err) == t);
        }
        for (int i = 0; i < f.nmeta; i++)
            FUZZ_CHECK(pl_st_meta(&f, f.meta_keys[i]) == f.meta_values[i]);
        (void)sum;
        pl_st_close(&f);
    } else {
        FUZZ_CHECK(err[0]);
    }
    free(copy);
    return 0;
}
