/* Checked reads of JSON integers: range, integrality and a field-named error
 * (json_num.h). */
#include "json_num.h"

#include <math.h>
#include <stdio.h>

#include "util.h"

int pl_json_int(const cJSON *v, const char *field, int64_t lo, int64_t hi, int64_t *out,
                char *err, size_t errlen)
{
    if (lo < -PL_JSON_INT_MAX) lo = -PL_JSON_INT_MAX;
    if (hi > PL_JSON_INT_MAX) hi = PL_JSON_INT_MAX;
    if (!v) return pl_errf(err, errlen, "%s: missing", field);
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(d) || d != floor(d) || d < (double)lo || d > (double)hi) {
        char got[40] = "not a number";
        if (cJSON_IsNumber(v)) snprintf(got, sizeof got, "%.17g", d);
        return pl_errf(err, errlen, "%s: must be an integer in [%lld, %lld] (got %s)", field,
                       (long long)lo, (long long)hi, got);
    }
    *out = (int64_t)d;
    return 0;
}

int pl_json_i32(const cJSON *v, const char *field, int lo, int hi, int *out, char *err,
                size_t errlen)
{
    int64_t x;
    if (pl_json_int(v, field, lo, hi, &x, err, errlen)) return -1;
    *out = (int)x;
    return 0;
}

int pl_json_get_int(const cJSON *obj, const char *prefix, const char *key, int64_t lo,
                    int64_t hi, int64_t *out, char *err, size_t errlen)
{
    char field[256];
    snprintf(field, sizeof field, "%s%s%s", prefix && *prefix ? prefix : "",
             prefix && *prefix ? "." : "", key);
    return pl_json_int(cJSON_GetObjectItemCaseSensitive(obj, key), field, lo, hi, out, err,
                       errlen);
}

int64_t pl_json_int_or(const cJSON *v, int64_t lo, int64_t hi, int64_t dflt)
{
    int64_t x;
    return v && pl_json_int(v, "", lo, hi, &x, NULL, 0) == 0 ? x : dflt;
}
