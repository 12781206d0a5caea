/* safetensors: round trips (dtypes, shapes, scalars, empty tensors, metadata),
 * the exact on-disk layout, strict rejection of corrupted headers, offsets and
 * lengths with errors naming file and tensor, and atomic writes. */
#include <dirent.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "tmpfiles.h"
#include "safetensors.h"

static char err[512];

static unsigned char *read_raw(const char *p, size_t *len)
{
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    if (buf) buf[n] = 0;
    return buf;
}

/* A file with the given header length field, header text (padded with spaces
 * to hlen) and data_len data bytes. */
static int write_st(const char *p, uint64_t hlen_field, const char *json, size_t hlen,
                    size_t data_len)
{
    size_t jlen = strlen(json);
    if (hlen < jlen) hlen = jlen;
    size_t len = 8 + hlen + data_len;
    unsigned char *buf = calloc(1, len);
    if (!buf) return -1;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen_field >> (8 * i));
    memcpy(buf + 8, json, jlen);
    memset(buf + 8 + jlen, ' ', hlen - jlen);
    for (size_t i = 0; i < data_len; i++) buf[8 + hlen + i] = (unsigned char)i;
    int rc = write_raw(p, buf, len);
    free(buf);
    return rc;
}

/* A well-formed header text file; expects pl_st_open to fail with `want` in
 * the message. Returns 0 if it did. */
static int expect_reject(const char *json, size_t data_len, const char *want)
{
    const char *p = path_in("bad.safetensors");
    size_t hlen = (strlen(json) + 7) / 8 * 8;
    if (write_st(p, hlen, json, hlen, data_len) != 0) return -1;
    pl_st_file f;
    err[0] = 0;
    int rc = pl_st_open(p, &f, err, sizeof err);
    if (rc == 0) {
        printf("    accepted: %s\n", json);
        pl_st_close(&f);
        return -1;
    }
    if (!strstr(err, want) || !strstr(err, p)) {
        printf("    for %s\n    got \"%s\", want \"%s\"\n", json, err, want);
        return -1;
    }
    return f.ntensors == 0 && f.map == NULL ? 0 : -1;
}

static void test_round_trip(void)
{
    float w[3][4];
    for (int i = 0; i < 12; i++) w[i / 4][i % 4] = (float)i * 0.5f - 2.25f;
    int32_t ids[5] = {-1, 0, 1, 2147483647, -2147483647 - 1};
    uint16_t toks[7] = {0, 1, 255, 256, 50256, 65535, 7}; /* odd byte count */
    float scalar = 3.5f;
    double dd[2] = {1e300, -0.0};
    float *none = NULL;

    pl_st_writer *wr = pl_st_writer_new();
    CHECK(wr);
    int64_t s_w[2] = {3, 4}, s_ids[1] = {5}, s_tok[1] = {7}, s_empty[2] = {0, 3}, s_dd[1] = {2};
    CHECK_EQ_INT(pl_st_writer_add(wr, "h.0.attn.weight", PL_ST_F32, 2, s_w, w, err, sizeof err), 0);
    CHECK_EQ_INT(pl_st_writer_add(wr, "toks", PL_ST_U16, 1, s_tok, toks, err, sizeof err), 0);
    CHECK_EQ_INT(pl_st_writer_add(wr, "ids", PL_ST_I32, 1, s_ids, ids, err, sizeof err), 0);
    CHECK_EQ_INT(pl_st_writer_add(wr, "scalar", PL_ST_F32, 0, NULL, &scalar, err, sizeof err), 0);
    CHECK_EQ_INT(pl_st_writer_add(wr, "empty", PL_ST_F32, 2, s_empty, none, err, sizeof err), 0);
    CHECK_EQ_INT(pl_st_writer_add(wr, "dd", PL_ST_F64, 1, s_dd, dd, err, sizeof err), 0);
    CHECK_EQ_INT(pl_st_writer_meta(wr, "format", "pt", err, sizeof err), 0);
    CHECK_EQ_INT(pl_st_writer_meta(wr, "step", "1200", err, sizeof err), 0);
    CHECK_EQ_INT(pl_st_writer_meta(wr, "odd \"key\"", "line\nbreak \\ \xc3\xa9", err, sizeof err), 0);
    const char *p = path_in("model.safetensors");
    int rc = pl_st_write(wr, p, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    pl_st_writer_free(wr);

    /* The on-disk layout. */
    size_t len;
    unsigned char *raw = read_raw(p, &len);
    CHECK(raw);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)raw[i] << (8 * i);
    int layout_ok = hlen % 8 == 0 && raw[8] == '{' && 8 + hlen + 16 + 48 + 4 + 20 + 14 == len &&
                    (raw[8 + hlen - 1] == ' ' || raw[8 + hlen - 1] == '}');
    /* Data section by decreasing element size, insertion order within a size:
     * F64 dd; the 4-byte w, ids, scalar, empty; U16 toks. */
    const unsigned char *data = raw + 8 + hlen;
    int data_ok = memcmp(data, dd, 16) == 0 && memcmp(data + 16, w, 48) == 0 &&
                  memcmp(data + 64, ids, 20) == 0 && memcmp(data + 84, &scalar, 4) == 0 &&
                  memcmp(data + 88, toks, 14) == 0;
    int json_ok = strstr((char *)raw + 8, "\"__metadata__\":{\"format\":\"pt\"") != NULL &&
                  strstr((char *)raw + 8,
                         "\"h.0.attn.weight\":{\"dtype\":\"F32\",\"shape\":[3,4],"
                         "\"data_offsets\":[16,64]}") != NULL &&
                  strstr((char *)raw + 8, "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],") != NULL;
    if (!data_ok || !json_ok) printf("    header: %.*s\n", (int)hlen, (char *)raw + 8);
    free(raw);
    CHECK(layout_ok);
    CHECK(data_ok);
    CHECK(json_ok);

    pl_st_file f;
    rc = pl_st_open(p, &f, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(f.ntensors, 6);
    CHECK_EQ_INT(f.nmeta, 3);
    CHECK(strcmp(pl_st_meta(&f, "format"), "pt") == 0);
    CHECK(strcmp(pl_st_meta(&f, "step"), "1200") == 0);
    CHECK(strcmp(pl_st_meta(&f, "odd \"key\""), "line\nbreak \\ \xc3\xa9") == 0);
    CHECK(pl_st_meta(&f, "missing") == NULL);

    const pl_st_tensor *t = pl_st_expect(&f, "h.0.attn.weight", PL_ST_F32, 2, s_w, err, sizeof err);
    CHECK(t);
    CHECK_EQ_INT(t->nelem, 12);
    CHECK_EQ_INT(t->nbytes, 48);
    CHECK(memcmp(t->data, w, sizeof w) == 0);
    CHECK_EQ_INT((uintptr_t)t->data % 4, 0);
    t = pl_st_expect(&f, "ids", PL_ST_I32, 1, s_ids, err, sizeof err);
    CHECK(t && memcmp(t->data, ids, sizeof ids) == 0);
    CHECK_EQ_INT((uintptr_t)t->data % 4, 0);
    t = pl_st_expect(&f, "toks", PL_ST_U16, 1, s_tok, err, sizeof err);
    CHECK(t && memcmp(t->data, toks, sizeof toks) == 0);
    t = pl_st_expect(&f, "scalar", PL_ST_F32, 0, NULL, err, sizeof err);
    CHECK(t && t->ndim == 0 && t->nelem == 1 && *(const float *)t->data == 3.5f);
    t = pl_st_expect(&f, "empty", PL_ST_F32, 2, s_empty, err, sizeof err);
    CHECK(t && t->nelem == 0 && t->nbytes == 0);
    t = pl_st_expect(&f, "dd", PL_ST_F64, 1, s_dd, err, sizeof err);
    CHECK(t && memcmp(t->data, dd, sizeof dd) == 0);
    CHECK_EQ_INT((uintptr_t)t->data % 8, 0);
    CHECK(pl_st_find(&f, "nope") == NULL);

    /* pl_st_expect's errors. */
    CHECK(!pl_st_expect(&f, "nope", PL_ST_F32, 0, NULL, err, sizeof err));
    CHECK_STR_CONTAINS(err, "model.safetensors: tensor \"nope\" missing");
    CHECK(!pl_st_expect(&f, "ids", PL_ST_F32, 1, s_ids, err, sizeof err));
    CHECK_STR_CONTAINS(err, "tensor \"ids\" has dtype I32, expected F32");
    int64_t other[2] = {4, 3};
    CHECK(!pl_st_expect(&f, "h.0.attn.weight", PL_ST_F32, 2, other, err, sizeof err));
    CHECK_STR_CONTAINS(err, "tensor \"h.0.attn.weight\" has shape [3, 4], expected [4, 3]");
    CHECK(!pl_st_expect(&f, "h.0.attn.weight", PL_ST_F32, 1, other, err, sizeof err));
    CHECK_STR_CONTAINS(err, "has shape [3, 4], expected [4]");
    pl_st_close(&f);
    CHECK_EQ_INT(f.ntensors, 0);
    remove(p);
}

/* Byte-for-byte the files of the reference implementation's own tests
 * (huggingface/safetensors, safetensors/src/tensor.rs: test_serialization,
 * test_serialization_forced_alignement, test_empty). */
static int same_bytes(const char *p, const char *header, const void *data, size_t data_len)
{
    size_t hlen = strlen(header), len;
    unsigned char *raw = read_raw(p, &len);
    int ok = raw && len == 8 + hlen + data_len && memcmp(raw + 8, header, hlen) == 0 &&
             memcmp(raw + 8 + hlen, data, data_len) == 0;
    for (int i = 0; ok && i < 8; i++) ok = raw[i] == (unsigned char)((uint64_t)hlen >> (8 * i));
    if (!ok && raw) printf("    got header %.*s\n", (int)(len > 8 ? len - 8 : 0), (char *)raw + 8);
    free(raw);
    return ok;
}

static void test_matches_reference_bytes(void)
{
    float v[6] = {0, 1, 2, 3, 4, 5};
    const char *p = path_in("ref.safetensors");
    pl_st_writer *wr = pl_st_writer_new();
    CHECK(wr);
    CHECK_EQ_INT(pl_st_writer_add(wr, "attn.0", PL_ST_F32, 3, (int64_t[]){1, 2, 3}, v, err,
                                  sizeof err),
                 0);
    CHECK_EQ_INT(pl_st_write(wr, p, err, sizeof err), 0);
    pl_st_writer_free(wr);
    CHECK(same_bytes(p,
                     "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}",
                     v, sizeof v));

    wr = pl_st_writer_new();
    CHECK(wr);
    CHECK_EQ_INT(pl_st_writer_add(wr, "attn0", PL_ST_F32, 4, (int64_t[]){1, 1, 2, 3}, v, err,
                                  sizeof err),
                 0);
    CHECK_EQ_INT(pl_st_write(wr, p, err, sizeof err), 0);
    pl_st_writer_free(wr);
    CHECK(same_bytes(p,
                     "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}"
                     "       ",
                     v, sizeof v));

    wr = pl_st_writer_new();
    CHECK(wr);
    CHECK_EQ_INT(pl_st_writer_meta(wr, "framework", "pt", err, sizeof err), 0);
    CHECK_EQ_INT(pl_st_write(wr, p, err, sizeof err), 0);
    pl_st_writer_free(wr);
    CHECK(same_bytes(p, "{\"__metadata__\":{\"framework\":\"pt\"}}     ", "", 0));
    remove(p);
}

static void test_empty_file_and_dtypes(void)
{
    pl_st_writer *wr = pl_st_writer_new();
    CHECK(wr);
    const char *p = path_in("empty.safetensors");
    CHECK_EQ_INT(pl_st_write(wr, p, err, sizeof err), 0);
    pl_st_writer_free(wr);
    size_t len;
    unsigned char *raw = read_raw(p, &len);
    CHECK(raw);
    int ok = len == 16 && raw[0] == 8 && memcmp(raw + 8, "{}      ", 8) == 0;
    free(raw);
    CHECK(ok);
    pl_st_file f;
    CHECK_EQ_INT(pl_st_open(p, &f, err, sizeof err), 0);
    CHECK_EQ_INT(f.ntensors, 0);
    CHECK_EQ_INT(f.nmeta, 0);
    pl_st_close(&f);
    remove(p);

    for (int d = 0; d < PL_ST_NDTYPES; d++) {
        const char *name = pl_st_dtype_name((pl_st_dtype)d);
        CHECK(name);
        CHECK_EQ_INT(pl_st_dtype_parse(name), d);
        CHECK(pl_st_dtype_size((pl_st_dtype)d) >= 1);
    }
    CHECK_EQ_INT(pl_st_dtype_size(PL_ST_F32), 4);
    CHECK_EQ_INT(pl_st_dtype_size(PL_ST_BF16), 2);
    CHECK_EQ_INT(pl_st_dtype_size(PL_ST_I64), 8);
    CHECK_EQ_INT(pl_st_dtype_parse("F33"), -1);
    CHECK(pl_st_dtype_name(PL_ST_NDTYPES) == NULL);
}

static void test_writer_rejects_bad_input(void)
{
    pl_st_writer *wr = pl_st_writer_new();
    CHECK(wr);
    float x[4] = {0};
    int64_t s[2] = {2, 2}, neg[1] = {-1};
    CHECK_EQ_INT(pl_st_writer_add(wr, "a", PL_ST_F32, 2, s, x, err, sizeof err), 0);
    CHECK_EQ_INT(pl_st_writer_add(wr, "a", PL_ST_F32, 2, s, x, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "tensor \"a\": added twice");
    CHECK_EQ_INT(pl_st_writer_add(wr, "__metadata__", PL_ST_F32, 2, s, x, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "reserved name");
    CHECK_EQ_INT(pl_st_writer_add(wr, "", PL_ST_F32, 2, s, x, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "empty tensor name");
    CHECK_EQ_INT(pl_st_writer_add(wr, "b", PL_ST_F32, 1, neg, x, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "tensor \"b\": negative dimension -1");
    CHECK_EQ_INT(pl_st_writer_add(wr, "b", PL_ST_F32, 2, s, NULL, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "tensor \"b\": no data");
    CHECK_EQ_INT(pl_st_writer_add(wr, "b", PL_ST_NDTYPES, 2, s, x, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "invalid dtype");
    CHECK_EQ_INT(pl_st_writer_add(wr, "b", PL_ST_F32, 9, s, x, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "9 dimensions");
    CHECK_EQ_INT(pl_st_writer_meta(wr, "k", "v", err, sizeof err), 0);
    CHECK_EQ_INT(pl_st_writer_meta(wr, "k", "w", err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "metadata \"k\": added twice");
    /* Many tensors (growth) still write and read back. */
    char name[32];
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "t%03d", i);
        CHECK_EQ_INT(pl_st_writer_add(wr, name, PL_ST_F32, 1, (int64_t[]){1}, &x[i % 4], err,
                                      sizeof err),
                     0);
    }
    const char *p = path_in("many.safetensors");
    CHECK_EQ_INT(pl_st_write(wr, p, err, sizeof err), 0);
    pl_st_writer_free(wr);
    pl_st_file f;
    CHECK_EQ_INT(pl_st_open(p, &f, err, sizeof err), 0);
    CHECK_EQ_INT(f.ntensors, 101);
    CHECK(pl_st_find(&f, "t099") != NULL);
    pl_st_close(&f);
    remove(p);
}

static void test_corrupt_header_rejected(void)
{
    const char *p = path_in("bad.safetensors");
    pl_st_file f;

    CHECK_EQ_INT(write_raw(p, "abc", 3), 0);
    CHECK_EQ_INT(pl_st_open(p, &f, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "bad.safetensors: file is 3 bytes, too short");

    CHECK_EQ_INT(write_st(p, 1, "{", 8, 0), 0);
    CHECK_EQ_INT(pl_st_open(p, &f, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "header length 1 is too small");

    CHECK_EQ_INT(write_st(p, (uint64_t)1 << 40, "{}", 8, 0), 0);
    CHECK_EQ_INT(pl_st_open(p, &f, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "header length 1099511627776 exceeds the 100000000-byte limit");

    CHECK_EQ_INT(write_st(p, 64, "{}", 8, 0), 0);
    CHECK_EQ_INT(pl_st_open(p, &f, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "header length 64 runs past the end of the file (16 bytes)");

    CHECK_EQ_INT(expect_reject("[]", 0, "header does not start with '{'"), 0);
    CHECK_EQ_INT(expect_reject(" {}", 0, "header does not start with '{'"), 0);
    CHECK_EQ_INT(expect_reject("{\"a\": ", 0, "header is not valid JSON"), 0);
    CHECK_EQ_INT(expect_reject("{\"a\": {\"dtype\": \"F32\",}}", 0, "header is not valid JSON"), 0);
    CHECK_EQ_INT(expect_reject("{} x", 0, "trailing bytes after the JSON object (byte 3)"), 0);
    /* The JSON must end within the declared header even if the file goes on. */
    CHECK_EQ_INT(write_st(p, 8, "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 8,
                          4),
                 0);
    CHECK_EQ_INT(pl_st_open(p, &f, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "not valid JSON");

    CHECK_EQ_INT(expect_reject("{\"__metadata__\": [1]}", 0, "\"__metadata__\" is not an object"), 0);
    CHECK_EQ_INT(expect_reject("{\"__metadata__\": {\"step\": 5}}", 0,
                               "metadata \"step\": value is not a string"),
                 0);
    CHECK_EQ_INT(expect_reject("{\"__metadata__\": {}, \"__metadata__\": {}}", 0,
                               "\"__metadata__\" appears twice"),
                 0);
    CHECK_EQ_INT(expect_reject("{\"__metadata__\": {\"a\": \"1\", \"a\": \"2\"}}", 0,
                               "metadata \"a\" appears twice"),
                 0);
    remove(p);
}

static void test_corrupt_tensors_rejected(void)
{
#define T1(body) "{\"w\": " body "}"
    CHECK_EQ_INT(expect_reject(T1("7"), 0, "tensor \"w\": entry is not an object"), 0);
    CHECK_EQ_INT(expect_reject(T1("{\"shape\": [1], \"data_offsets\": [0, 4]}"), 4,
                               "tensor \"w\": missing or non-string \"dtype\""),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}"),
                               4, "tensor \"w\": unsupported dtype \"F33\""),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}"), 4,
                               "tensor \"w\": missing or non-array \"shape\""),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}"),
                               4, "tensor \"w\": shape[0] is not a non-negative integer"),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F32\", \"shape\": [1, 1.5], \"data_offsets\": [0, 4]}"),
                               4, "tensor \"w\": shape[1] is not a non-negative integer"),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], "
                                  "\"data_offsets\": [0, 4]}"),
                               4, "tensor \"w\": 9 dimensions"),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}"),
                               4, "tensor \"w\": \"data_offsets\" must be [begin, end]"),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F32\", \"shape\": [1]}"), 4,
                               "tensor \"w\": \"data_offsets\" must be [begin, end]"),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"0\", 4]}"),
                               4, "\"data_offsets\" must be [begin, end]"),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}"),
                               4, "tensor \"w\": data_offsets [4, 0] has begin after end"),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}"),
                               4, "tensor \"w\": data_offsets [0, 8] run past the end of the data "
                                  "section (4 bytes)"),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]}"),
                               12, "tensor \"w\": shape [2, 2] of F32 needs 16 bytes but "
                                   "data_offsets [0, 12] span 12"),
                 0);
    CHECK_EQ_INT(expect_reject(T1("{\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296], "
                                  "\"data_offsets\": [0, 4]}"),
                               4, "needs more than"),
                 0);
#undef T1
    /* Overlap, gap, truncated or trailing data, duplicates. */
    CHECK_EQ_INT(expect_reject("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                               " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                               12, "tensor \"b\": data_offsets [4, 12] overlap tensor \"a\" (ends at 8)"),
                 0);
    CHECK_EQ_INT(expect_reject("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                               " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
                               8, "overlap tensor \"a\""),
                 0);
    CHECK_EQ_INT(expect_reject("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                               " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
                               12, "tensor \"b\": data_offsets [8, 12] leave a gap of 4 bytes"),
                 0);
    CHECK_EQ_INT(expect_reject("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                               8, "tensor \"a\": data_offsets [4, 8] leave a gap of 4 bytes"),
                 0);
    CHECK_EQ_INT(expect_reject("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
                               6, "tensors cover 4 bytes but the data section has 6"),
                 0);
    CHECK_EQ_INT(expect_reject("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                               " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                               8, "tensor \"a\" appears twice"),
                 0);
    CHECK_EQ_INT(expect_reject("{}", 4, "tensors cover 0 bytes but the data section has 4"), 0);

    /* Accepted: out-of-order offsets, zero-size tensors, unknown extra fields. */
    const char *p = path_in("ok.safetensors");
    const char *json =
        "{\"b\": {\"dtype\": \"U16\", \"shape\": [3], \"data_offsets\": [4, 10]},"
        " \"z\": {\"dtype\": \"I32\", \"shape\": [0, 5], \"data_offsets\": [4, 4]},"
        " \"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4], \"extra\": 1},"
        " \"__metadata__\": {\"x\": \"y\"}}";
    size_t hlen = (strlen(json) + 7) / 8 * 8;
    CHECK_EQ_INT(write_st(p, hlen, json, hlen, 10), 0);
    pl_st_file f;
    int rc = pl_st_open(p, &f, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(f.ntensors, 3);
    CHECK(strcmp(f.tensors[0].name, "b") == 0 && strcmp(f.tensors[2].name, "a") == 0);
    const pl_st_tensor *b = pl_st_find(&f, "b");
    CHECK(b && b->dtype == PL_ST_U16 && b->nelem == 3 &&
          (const unsigned char *)b->data == (const unsigned char *)f.map + 8 + hlen + 4);
    CHECK(strcmp(pl_st_meta(&f, "x"), "y") == 0);
    pl_st_close(&f);
    remove(p);
    CHECK_EQ_INT(pl_st_open(path_in("missing.safetensors"), &f, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "missing.safetensors: No such file");
}

static void test_write_is_atomic(void)
{
    float x[6] = {1, 2, 3, 4, 5, 6};
    int64_t s[1] = {6};
    pl_st_writer *wr = pl_st_writer_new();
    CHECK(wr);
    CHECK_EQ_INT(pl_st_writer_add(wr, "x", PL_ST_F32, 1, s, x, err, sizeof err), 0);
    const char *p = path_in("ckpt.safetensors");
    CHECK_EQ_INT(pl_st_write(wr, p, err, sizeof err), 0);
    CHECK_EQ_INT(count_entries(dir, ".tmp."), 0);
    CHECK_EQ_INT(count_entries(dir, "ckpt.safetensors"), 1);
    struct stat st;
    CHECK_EQ_INT(stat(p, &st), 0);
    CHECK_EQ_INT(st.st_mode & 0777, 0644);

    /* Overwrite: the new content replaces the old one. */
    x[0] = 42;
    CHECK_EQ_INT(pl_st_write(wr, p, err, sizeof err), 0);
    pl_st_file f;
    CHECK_EQ_INT(pl_st_open(p, &f, err, sizeof err), 0);
    CHECK(((const float *)pl_st_find(&f, "x")->data)[0] == 42.0f);
    pl_st_close(&f);

    /* A failing write (the target is a non-empty directory) reports the
     * error and leaves no temporary file. */
    CHECK_EQ_INT(mkdir(path_in("adir"), 0755), 0);
    CHECK_EQ_INT(write_raw(path_in("adir/keep"), "k", 1), 0);
    CHECK_EQ_INT(pl_st_write(wr, path_in("adir"), err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "adir: rename failed");
    CHECK_EQ_INT(count_entries(dir, ".tmp."), 0);
    CHECK_EQ_INT(pl_st_write(wr, path_in("nodir/ckpt.safetensors"), err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "nodir/ckpt.safetensors: cannot create temporary file");
    pl_st_writer_free(wr);
    CHECK_EQ_INT(count_entries(dir, ".tmp."), 0);
    rm_rf(path_in("adir"));
    remove(p);
}

TEST_MAIN_BEGIN
snprintf(dir, sizeof dir, "/tmp/pliant_st_XXXXXX");
if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
}
RUN(test_round_trip);
RUN(test_matches_reference_bytes);
RUN(test_empty_file_and_dtypes);
RUN(test_writer_rejects_bad_input);
RUN(test_corrupt_header_rejected);
RUN(test_corrupt_tensors_rejected);
RUN(test_write_is_atomic);
rm_rf(dir);
TEST_MAIN_END
