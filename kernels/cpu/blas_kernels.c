/* Which OpenBLAS kernel set this CPU deserves (kn_cpu_blas_better_core, kernels.h):
 * OpenBLAS picks its kernels by CPU model when the program loads, and falls back to
 * its oldest (SSE3) ones on a model newer than the library. */
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#include "cpu.h"

extern char *openblas_get_corename(void);

/* Kernel sets with AVX2 or AVX-512 sgemm (OPENBLAS_CORETYPE names). */
static const char *const fast_cores[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                         "SapphireRapids"};

static int avx512_core(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
}

const char *kn_cpu_blas_better_core(void)
{
    const char *now = openblas_get_corename();
    for (size_t i = 0; now && i < sizeof fast_cores / sizeof fast_cores[0]; i++)
        if (!strcasecmp(now, fast_cores[i])) return NULL;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return NULL;
    /* (Cooperlake's sgemm is SkylakeX's, and 0.3.21 cannot be forced to Cooperlake) */
    return avx512_core() ? "SkylakeX" : "Haswell";
}

void kn_cpu_use_fast_blas(char **argv)
{
    const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : kn_cpu_blas_better_core();
    if (!core || setenv("OPENBLAS_CORETYPE", core, 1)) return;
    execv("/proc/self/exe", argv);
}
