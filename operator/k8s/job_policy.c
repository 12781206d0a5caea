/* The run-policy arithmetic of the controller: back-off, backoffLimit, finished Pods
 * kept, status times on the monotonic clock, spec.runPolicy's fields (job_policy.h). */
#include "job_policy.h"
#include "json_num.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t pl_replacement_backoff_ms(int failures)
{
    if (failures <= 0) return 0;
    int64_t ms = PL_BACKOFF_BASE_MS;
    for (int i = 1; i < failures && ms < PL_BACKOFF_MAX_MS; i++) ms *= 2;
    return ms < PL_BACKOFF_MAX_MS ? ms : PL_BACKOFF_MAX_MS;
}

int pl_failure_streak(int streak, int64_t since_ms)
{
    return since_ms >= 0 && since_ms <= 2 * PL_BACKOFF_MAX_MS ? streak + 1 : 1;
}

int pl_backoff_limit_exceeded(int failures, int64_t limit)
{
    return limit >= 0 && failures > limit;
}

static int by_index_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

int pl_finished_to_delete(const int *ks, int n, int *out)
{
    if (n <= PL_KEEP_FINISHED) return 0;
    int *sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) return 0;
    memcpy(sorted, ks, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, by_index_desc);
    int m = n - PL_KEEP_FINISHED;
    memcpy(out, sorted + PL_KEEP_FINISHED, (size_t)m * sizeof *out);
    free(sorted);
    return m;
}

static const cJSON *run_policy_field(const cJSON *tj, const char *key)
{
    return cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(tj, "spec"), "runPolicy"),
                               key);
}

int64_t pl_run_policy_int(const cJSON *tj, const char *key)
{
    const cJSON *v = run_policy_field(tj, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : pl_json_int_or(v, 0, PL_JSON_INT_MAX, -1);
}

const char *pl_run_policy_str(const cJSON *tj, const char *key, const char *dflt)
{
    const cJSON *v = run_policy_field(tj, key);
    return cJSON_IsString(v) ? v->valuestring : dflt;
}

int64_t pl_rfc3339_to_now_ms(const char *s, int64_t now_ms)
{
    struct tm tm = {0};
    if (!s || !strptime(s, "%Y-%m-%dT%H:%M:%S", &tm)) return PL_NO_TIME;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t wall_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    return now_ms - (wall_ms - (int64_t)timegm(&tm) * 1000);
}

void pl_rfc3339_now(char *buf, int len)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    strftime(buf, (size_t)len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}
