/* Checked reads of JSON numbers (cJSON): every integer taken from outside input
 * goes through pl_json_int, so that 1e300, 2.5 or 4294967298 is an error naming
 * the field and never a silent cast. */
#ifndef PLIANT_JSON_NUM_H
#define PLIANT_JSON_NUM_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

/* Integers a double holds exactly: bounds beyond ±(2^53 − 1) are clamped to it. */
#define PL_JSON_INT_MAX 9007199254740991LL

/* v must be a JSON number holding an integer in [lo, hi]: 0 and *out, or −1 with
 * "FIELD: missing" (v NULL) or "FIELD: must be an integer in [lo, hi] (got X)". */
int pl_json_int(const cJSON *v, const char *field, int64_t lo, int64_t hi, int64_t *out,
                char *err, size_t errlen);

/* The same for an int (bounds within INT_MIN..INT_MAX). */
int pl_json_i32(const cJSON *v, const char *field, int lo, int hi, int *out, char *err,
                size_t errlen);

/* obj's member key through pl_json_int, the field named "PREFIX.key" (or "key" when
 * prefix is NULL or empty). */
int pl_json_get_int(const cJSON *obj, const char *prefix, const char *key, int64_t lo,
                    int64_t hi, int64_t *out, char *err, size_t errlen);

/* v's integer when v is an integer in [lo, hi], else dflt: for fields of objects read
 * back (a TrainingJob's status, a Lease) where a missing or odd value means the default. */
int64_t pl_json_int_or(const cJSON *v, int64_t lo, int64_t hi, int64_t dflt);

#endif
