/* Deterministic random numbers for tests (splitmix64): a test seeds
 * rng_state and gets the same cases on every run and machine. */
#ifndef PLIANT_TEST_RNG_H
#define PLIANT_TEST_RNG_H

#include <stdint.h>

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static int64_t rng_range(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1));
}

#endif
