/* The rules of a TrainingJob's run policy that need no API, apart for tests:
 *
 * - failed worker Pods (not preempted ones) are replaced after a back-off of 10 s
 *   doubling per failure in a row, at most 5 min, as a batch Job's; a failure more
 *   than twice the longest back-off after the last starts a new row;
 * - runPolicy.backoffLimit: the job fails once more Pods failed than the limit;
 * - finished worker Pods beyond the newest PL_KEEP_FINISHED are deleted (their logs
 *   kept for the last few);
 * - a time stored in status (RFC 3339) seen on pl_now_ms()'s clock;
 * - spec.runPolicy read from the TrainingJob as it is now (suspend, backoffLimit, the
 *   deadlines, cleanPodPolicy apply to a running job, as a batch Job's do). */
#ifndef PLIANT_JOB_POLICY_H
#define PLIANT_JOB_POLICY_H

#include <stdint.h>

#include <cJSON.h>

#define PL_BACKOFF_BASE_MS 10000
#define PL_BACKOFF_MAX_MS 300000
#define PL_KEEP_FINISHED 3
#define PL_NO_TIME INT64_MIN

/* The wait before replacing a Pod after `failures` failures in a row (0: none). */
int64_t pl_replacement_backoff_ms(int failures);
/* The failures in a row with one more, since_ms after the last (< 0: the first). */
int pl_failure_streak(int streak, int64_t since_ms);
/* 1 when failures exceed limit (limit < 0: none). */
int pl_backoff_limit_exceeded(int failures, int64_t limit);
/* Of n finished Pods with indices ks (any order), the indices to delete (all but the
 * PL_KEEP_FINISHED highest) into out; their count. */
int pl_finished_to_delete(const int *ks, int n, int *out);
/* The pl_now_ms() instant of an RFC 3339 UTC time ("2026-01-02T03:04:05Z"), now_ms
 * being pl_now_ms() now (the instant may be negative); PL_NO_TIME when it does not
 * parse. The wall clock is read once, to place the stored time. */
int64_t pl_rfc3339_to_now_ms(const char *s, int64_t now_ms);
/* spec.runPolicy.KEY of the TrainingJob tj: a number, 1 for true, 0 for false, -1 when
 * absent or of another type. */
int64_t pl_run_policy_int(const cJSON *tj, const char *key);
/* spec.runPolicy.KEY of tj when it is a string, else dflt. */
const char *pl_run_policy_str(const cJSON *tj, const char *key, const char *dflt);
/* The time now as RFC 3339 UTC, second precision, into buf (at least 21 bytes). */
void pl_rfc3339_now(char *buf, int len);

#endif
