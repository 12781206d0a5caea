/* A minimal unit-test harness: each test is a void function; a failed CHECK
 * reports file:line and returns from the test. Every test prints one line,
 * "ok NAME", "FAIL NAME" (after its detail lines) or "skip NAME: why", which
 * tests/run_tests.py counts. */
#ifndef PLIANT_CHECK_H
#define PLIANT_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static int check_failed_;
static const char *check_skip_reason_;

/* Ends the current test as skipped (it prints "skip NAME: reason"). */
#define SKIP(reason)                                                             \
    do {                                                                         \
        check_skip_reason_ = (reason);                                           \
        return;                                                                  \
    } while (0)

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            printf("    %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);  \
            check_failed_ = 1;                                                   \
            return;                                                              \
        }                                                                        \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                       \
    do {                                                                         \
        long long a_ = (long long)(a), b_ = (long long)(b);                      \
        if (a_ != b_) {                                                          \
            printf("    %s:%d: %s == %lld, expected %s == %lld\n", __FILE__,     \
                   __LINE__, #a, a_, #b, b_);                                    \
            check_failed_ = 1;                                                   \
            return;                                                              \
        }                                                                        \
    } while (0)

#define CHECK_STR_CONTAINS(haystack, needle)                                     \
    do {                                                                         \
        const char *h_ = (haystack);                                             \
        if (!h_ || !strstr(h_, (needle))) {                                      \
            printf("    %s:%d: \"%s\" does not contain \"%s\"\n", __FILE__,      \
                   __LINE__, h_ ? h_ : "(null)", (needle));                      \
            check_failed_ = 1;                                                   \
            return;                                                              \
        }                                                                        \
    } while (0)

/* Counts a failed condition in `counter` without leaving the test, printing
 * the first `limit` failures: for tests that sweep many random cases. */
#define CHECK_COUNT(counter, limit, cond, ...)                                   \
    do {                                                                         \
        if (!(cond)) {                                                           \
            if ((counter) < (limit)) {                                           \
                printf("    %s:%d: ", __FILE__, __LINE__);                       \
                printf(__VA_ARGS__);                                             \
                printf("\n");                                                   \
            }                                                                    \
            (counter)++;                                                         \
        }                                                                        \
    } while (0)

static int check_run_(const char *name, void (*fn)(void), int *failures)
{
    check_failed_ = 0;
    check_skip_reason_ = NULL;
    fn();
    if (check_skip_reason_ && !check_failed_)
        printf("skip %s: %s\n", name, check_skip_reason_);
    else
        printf("%s %s\n", check_failed_ ? "FAIL" : "ok", name);
    fflush(stdout);
    *failures += check_failed_;
    return check_failed_;
}

#define RUN(fn) check_run_(#fn, fn, &failures_)
#define TEST_MAIN_BEGIN int main(void) { int failures_ = 0;
#define TEST_MAIN_END return failures_ ? 1 : 0; }

#endif
