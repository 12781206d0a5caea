/* Token shards (llm.c format), byte tokenization and the sample order: shards
 * written to a temporary directory are read back by glob across boundaries;
 * malformed shards are rejected naming the file; the shuffled order covers
 * every window once per epoch and is a pure function of (seed, step); the
 * sequential order is llm.c's DataLoader loop. */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "tmpfiles.h"
#include "rng.h"
#include "sampler.h"
#include "tokens.h"

static char err[512];

/* A raw shard with a chosen header (for the malformed cases). */
static int write_shard_raw(const char *p, int32_t magic, int32_t version, int32_t ntok,
                           int64_t actual_tokens)
{
    size_t len = 1024 + 2 * (size_t)actual_tokens;
    unsigned char *buf = calloc(1, len);
    int32_t hdr[3] = {magic, version, ntok};
    memcpy(buf, hdr, sizeof hdr);
    int rc = write_raw(p, buf, len);
    free(buf);
    return rc;
}

/* ---- shards ---- */

static void test_write_and_read_one_shard(void)
{
    uint16_t tok[1000];
    for (int i = 0; i < 1000; i++) tok[i] = (uint16_t)(i * 37 % 50257);
    const char *p = path_in("one.bin");
    CHECK_EQ_INT(pl_tokens_write(p, tok, 1000, err, sizeof err), 0);

    /* The exact llm.c layout. */
    FILE *f = fopen(p, "rb");
    CHECK(f);
    int32_t hdr[256];
    CHECK_EQ_INT(fread(hdr, 4, 256, f), 256);
    uint16_t back[1001];
    size_t got = fread(back, 2, 1001, f);
    fclose(f);
    CHECK_EQ_INT(hdr[0], 20240520);
    CHECK_EQ_INT(hdr[1], 1);
    CHECK_EQ_INT(hdr[2], 1000);
    for (int i = 3; i < 256; i++) CHECK_EQ_INT(hdr[i], 0);
    CHECK_EQ_INT(got, 1000);
    CHECK(memcmp(back, tok, sizeof tok) == 0);

    pl_tokens t;
    CHECK_EQ_INT(pl_tokens_open(p, &t, err, sizeof err), 0);
    CHECK_EQ_INT(t.nshards, 1);
    CHECK_EQ_INT(pl_tokens_count(&t), 1000);
    for (int i = 0; i < 1000; i++) CHECK_EQ_INT(pl_tokens_at(&t, i), tok[i]);
    pl_tokens_close(&t);
    CHECK_EQ_INT(t.nshards, 0);
    remove(p);
}

static void test_glob_across_shards(void)
{
    /* Written out of order: the stream follows the sorted names. */
    static const int sizes[5] = {5, 1, 300, 2, 777};
    static const char *names[5] = {"multi_000.bin", "multi_001.bin", "multi_002.bin",
                                   "multi_003.bin", "multi_010.bin"};
    static const int write_order[5] = {4, 2, 0, 3, 1};
    int64_t total = 0;
    for (int i = 0; i < 5; i++) total += sizes[i];
    uint16_t *all = malloc((size_t)total * sizeof *all);
    int32_t *dst = malloc((size_t)(total + 2) * sizeof *dst);
    CHECK(all && dst);
    rng_state = 11;
    for (int64_t i = 0; i < total; i++) all[i] = (uint16_t)rng_next();
    for (int k = 0; k < 5; k++) {
        int i = write_order[k];
        int64_t start = 0;
        for (int j = 0; j < i; j++) start += sizes[j];
        CHECK_EQ_INT(pl_tokens_write(path_in(names[i]), all + start, sizes[i], err, sizeof err),
                     0);
    }
    /* A file the glob must not pick up. */
    CHECK_EQ_INT(pl_tokens_write(path_in("other_000.bin"), all, 3, err, sizeof err), 0);

    pl_tokens t;
    int rc = pl_tokens_open(path_in("multi_*.bin"), &t, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(t.nshards, 5);
    CHECK_EQ_INT(pl_tokens_count(&t), total);
    for (int i = 0; i < 5; i++) CHECK_STR_CONTAINS(t.shards[i].path, names[i]);
    for (int64_t i = 0; i < total; i++) CHECK_EQ_INT(pl_tokens_at(&t, i), all[i]);

    /* Bulk copies: every range touching a boundary, then random ones. */
    for (int64_t start = 0; start <= total; start++) {
        for (int64_t n = 0; n <= 8 && start + n <= total; n++) {
            dst[n] = -12345;
            CHECK_EQ_INT(pl_tokens_copy(&t, start, n, dst), 0);
            for (int64_t i = 0; i < n; i++) CHECK_EQ_INT(dst[i], all[start + i]);
            CHECK_EQ_INT(dst[n], -12345); /* writes exactly n */
        }
    }
    for (int r = 0; r < 2000; r++) {
        int64_t start = rng_range(0, total), n = rng_range(0, total - start);
        CHECK_EQ_INT(pl_tokens_copy(&t, start, n, dst), 0);
        for (int64_t i = 0; i < n; i++) CHECK_EQ_INT(dst[i], all[start + i]);
    }
    CHECK_EQ_INT(pl_tokens_copy(&t, 0, total, dst), 0);
    for (int64_t i = 0; i < total; i++) CHECK_EQ_INT(dst[i], all[i]);
    /* Out of range. */
    dst[0] = -7;
    CHECK_EQ_INT(pl_tokens_copy(&t, total - 3, 4, dst), -1);
    CHECK_EQ_INT(pl_tokens_copy(&t, -1, 2, dst), -1);
    CHECK_EQ_INT(pl_tokens_copy(&t, total + 1, 0, dst), -1);
    CHECK_EQ_INT(pl_tokens_copy(&t, 0, -1, dst), -1);
    CHECK_EQ_INT(dst[0], -7);
    pl_tokens_close(&t);
    free(all);
    free(dst);
    for (int i = 0; i < 5; i++) remove(path_in(names[i]));
    remove(path_in("other_000.bin"));
}

static void test_bad_shards_rejected(void)
{
    pl_tokens t;
    const char *p = path_in("bad.bin");

    CHECK_EQ_INT(write_shard_raw(p, 20240521, 1, 10, 10), 0);
    CHECK_EQ_INT(pl_tokens_open(p, &t, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, p);
    CHECK_STR_CONTAINS(err, "bad magic 20240521");
    CHECK_EQ_INT(t.nshards, 0);

    CHECK_EQ_INT(write_shard_raw(p, 20240520, 2, 10, 10), 0);
    CHECK_EQ_INT(pl_tokens_open(p, &t, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, p);
    CHECK_STR_CONTAINS(err, "unsupported version 2");

    /* Truncated: header says 10 tokens, file holds 9. */
    CHECK_EQ_INT(write_shard_raw(p, 20240520, 1, 10, 9), 0);
    CHECK_EQ_INT(pl_tokens_open(p, &t, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, p);
    CHECK_STR_CONTAINS(err, "file is 1042 bytes but header says 10 tokens (expected 1044 bytes)");

    /* Trailing data. */
    CHECK_EQ_INT(write_shard_raw(p, 20240520, 1, 10, 11), 0);
    CHECK_EQ_INT(pl_tokens_open(p, &t, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "expected 1044 bytes");

    /* Odd size. */
    {
        unsigned char buf[1025] = {0};
        int32_t hdr[3] = {20240520, 1, 0};
        memcpy(buf, hdr, sizeof hdr);
        CHECK_EQ_INT(write_raw(p, buf, sizeof buf), 0);
        CHECK_EQ_INT(pl_tokens_open(p, &t, err, sizeof err), -1);
        CHECK_STR_CONTAINS(err, "header says 0 tokens");
    }
    CHECK_EQ_INT(write_shard_raw(p, 20240520, 1, -5, 0), 0);
    CHECK_EQ_INT(pl_tokens_open(p, &t, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "header says -5 tokens");

    /* Shorter than the header. */
    CHECK_EQ_INT(write_raw(p, "hello", 5), 0);
    CHECK_EQ_INT(pl_tokens_open(p, &t, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, p);
    CHECK_STR_CONTAINS(err, "shorter than the 1024-byte llm.c header");

    /* A bad shard among good ones: the error names it. */
    uint16_t tok[4] = {1, 2, 3, 4};
    CHECK_EQ_INT(pl_tokens_write(path_in("mix_a.bin"), tok, 4, err, sizeof err), 0);
    CHECK_EQ_INT(write_shard_raw(path_in("mix_b.bin"), 7, 1, 4, 4), 0);
    CHECK_EQ_INT(pl_tokens_write(path_in("mix_c.bin"), tok, 4, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_open(path_in("mix_*.bin"), &t, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "mix_b.bin: bad magic 7");
    CHECK_EQ_INT(t.nshards, 0);

    /* Nothing matches; a directory. */
    CHECK_EQ_INT(pl_tokens_open(path_in("nothing_*.bin"), &t, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "nothing_*.bin: no files match");
    CHECK_EQ_INT(pl_tokens_open(dir, &t, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "not a regular file");

    /* Writing: bad counts. */
    CHECK_EQ_INT(pl_tokens_write(p, tok, 0, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "token count 0 out of range");
    remove(p);
    remove(path_in("mix_a.bin"));
    remove(path_in("mix_b.bin"));
    remove(path_in("mix_c.bin"));
}

static void test_vocab_check(void)
{
    uint16_t a[50], b[100];
    for (int i = 0; i < 50; i++) a[i] = (uint16_t)(i * 5);
    for (int i = 0; i < 100; i++) b[i] = (uint16_t)(255 - i);
    b[77] = 300;
    b[90] = 400;
    CHECK_EQ_INT(pl_tokens_write(path_in("voc_0.bin"), a, 50, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_write(path_in("voc_1.bin"), b, 100, err, sizeof err), 0);
    pl_tokens t;
    CHECK_EQ_INT(pl_tokens_open(path_in("voc_*.bin"), &t, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_check_vocab(&t, 256, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "voc_1.bin: token 300 at index 77 (byte offset 1178)");
    CHECK_STR_CONTAINS(err, "vocabulary size 256");
    CHECK_EQ_INT(pl_tokens_check_vocab(&t, 301, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "token 400 at index 90");
    CHECK_EQ_INT(pl_tokens_check_vocab(&t, 401, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_check_vocab(&t, 50257, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_check_vocab(&t, 65536, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_check_vocab(&t, 0, err, sizeof err), -1);
    pl_tokens_close(&t);
    /* open and check in one: what every process loading a job's data runs */
    CHECK_EQ_INT(pl_tokens_open_vocab(path_in("voc_*.bin"), 256, &t, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "voc_1.bin: token 300 at index 77 (byte offset 1178)");
    CHECK(t.nshards == 0 && t.shards == NULL);
    CHECK_EQ_INT(pl_tokens_open_vocab(path_in("voc_*.bin"), 401, &t, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_count(&t), 150);
    pl_tokens_close(&t);
    CHECK_EQ_INT(pl_tokens_open_vocab(path_in("none_*.bin"), 256, &t, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "no files match");
    remove(path_in("voc_0.bin"));
    remove(path_in("voc_1.bin"));
}

static void test_write_is_atomic(void)
{
    uint16_t tok[10] = {0};
    CHECK_EQ_INT(pl_tokens_write(path_in("atomic.bin"), tok, 10, err, sizeof err), 0);
    CHECK_EQ_INT(count_entries(dir, ".tmp."), 0);
    CHECK_EQ_INT(count_entries(dir, "atomic.bin"), 1);
    /* Overwriting replaces the file. */
    tok[3] = 9;
    CHECK_EQ_INT(pl_tokens_write(path_in("atomic.bin"), tok, 5, err, sizeof err), 0);
    pl_tokens t;
    CHECK_EQ_INT(pl_tokens_open(path_in("atomic.bin"), &t, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_count(&t), 5);
    CHECK_EQ_INT(pl_tokens_at(&t, 3), 9);
    pl_tokens_close(&t);
    /* Failure (the target is a non-empty directory): no temp file left. */
    CHECK_EQ_INT(mkdir(path_in("adir"), 0755), 0);
    CHECK_EQ_INT(pl_tokens_write(path_in("adir/x.bin"), tok, 5, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_write(path_in("adir"), tok, 5, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "rename failed");
    CHECK_EQ_INT(count_entries(dir, ".tmp."), 0);
    CHECK_EQ_INT(pl_tokens_write(path_in("nodir/x.bin"), tok, 5, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "nodir/x.bin: cannot create temporary file");
    remove(path_in("adir/x.bin"));
    remove(path_in("adir"));
    remove(path_in("atomic.bin"));
}

static void test_tokenize_bytes(void)
{
    /* 1003 bytes covering every byte value: train = floor(902.7) = 902. */
    unsigned char text[1003];
    for (int i = 0; i < 1003; i++) text[i] = (unsigned char)(i * 7 + 3);
    char in[256];
    snprintf(in, sizeof in, "%s", path_in("text.txt"));
    CHECK_EQ_INT(write_raw(in, text, sizeof text), 0);
    const char *prefix = path_in("out/nested/ts");
    int rc = pl_tokenize_bytes(in, prefix, err, sizeof err);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    pl_tokens tr, va;
    CHECK_EQ_INT(pl_tokens_open(path_in("out/nested/ts_train.bin"), &tr, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_open(path_in("out/nested/ts_val.bin"), &va, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_count(&tr), 902);
    CHECK_EQ_INT(pl_tokens_count(&va), 101);
    for (int i = 0; i < 902; i++) CHECK_EQ_INT(pl_tokens_at(&tr, i), text[i]);
    for (int i = 0; i < 101; i++) CHECK_EQ_INT(pl_tokens_at(&va, i), text[902 + i]);
    CHECK_EQ_INT(pl_tokens_check_vocab(&tr, 256, err, sizeof err), 0);
    CHECK_EQ_INT(pl_tokens_check_vocab(&va, 256, err, sizeof err), 0);
    pl_tokens_close(&tr);
    pl_tokens_close(&va);
    CHECK_EQ_INT(count_entries(path_in("out/nested"), ".tmp."), 0);

    /* Exact splits: 10 bytes -> 9 + 1; 2 bytes -> 1 + 1; 1 byte is an error. */
    static const struct { int n, train; } cases[] = {{10, 9}, {2, 1}, {19, 17}, {20, 18}, {100, 90}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CHECK_EQ_INT(write_raw(in, text, (size_t)cases[c].n), 0);
        rc = pl_tokenize_bytes(in, path_in("small"), err, sizeof err);
        if (rc) printf("    %s\n", err);
        CHECK_EQ_INT(rc, 0);
        CHECK_EQ_INT(pl_tokens_open(path_in("small_train.bin"), &tr, err, sizeof err), 0);
        CHECK_EQ_INT(pl_tokens_open(path_in("small_val.bin"), &va, err, sizeof err), 0);
        CHECK_EQ_INT(pl_tokens_count(&tr), cases[c].train);
        CHECK_EQ_INT(pl_tokens_count(&va), cases[c].n - cases[c].train);
        CHECK_EQ_INT(pl_tokens_at(&va, 0), text[cases[c].train]);
        pl_tokens_close(&tr);
        pl_tokens_close(&va);
    }
    CHECK_EQ_INT(write_raw(in, text, 1), 0);
    CHECK_EQ_INT(pl_tokenize_bytes(in, path_in("small"), err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "need at least 2");
    CHECK_EQ_INT(pl_tokenize_bytes(path_in("missing.txt"), path_in("small"), err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "missing.txt: No such file");
    /* The output directory cannot be created (a file is in the way). */
    CHECK_EQ_INT(write_raw(in, text, 100), 0);
    CHECK_EQ_INT(pl_tokenize_bytes(in, path_in("text.txt/sub/ts"), err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "text.txt/sub");
    remove(in);
    remove(path_in("small_train.bin"));
    remove(path_in("small_val.bin"));
    rm_rf(path_in("out"));
}

/* ---- sampler ---- */

/* Tokens 0..n-1 with token i = i * 31 + 7 (mod 65536), split over shards of the
 * given sizes (summing to n). */
static int make_stream(const char *stem, const int64_t *sizes, int nsizes, pl_tokens *t)
{
    int64_t start = 0;
    for (int k = 0; k < nsizes; k++) {
        uint16_t *tok = malloc((size_t)sizes[k] * sizeof *tok);
        if (!tok) return -1;
        for (int64_t i = 0; i < sizes[k]; i++) tok[i] = (uint16_t)((start + i) * 31 + 7);
        char name[64];
        snprintf(name, sizeof name, "%s_%03d.bin", stem, k);
        int rc = pl_tokens_write(path_in(name), tok, sizes[k], err, sizeof err);
        free(tok);
        if (rc) return -1;
        start += sizes[k];
    }
    char g[64];
    snprintf(g, sizeof g, "%s_*.bin", stem);
    return pl_tokens_open(path_in(g), t, err, sizeof err);
}

static void remove_stream(const char *stem, int nsizes)
{
    for (int k = 0; k < nsizes; k++) {
        char name[64];
        snprintf(name, sizeof name, "%s_%03d.bin", stem, k);
        remove(path_in(name));
    }
}

static void test_shuffled_covers_each_window_once_per_epoch(void)
{
    static const struct { int64_t W; int T, G; } cases[] = {
        {1, 4, 1},   {1, 3, 5},   {2, 1, 1},   {3, 2, 2},    {7, 5, 7},     {10, 4, 3},
        {37, 2, 64}, {64, 8, 8},  {65, 3, 8},  {100, 16, 6}, {1000, 3, 7},  {1024, 1, 32},
        {1025, 2, 33}, {4097, 1, 100}, {12345, 2, 64},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t W = cases[c].W;
        int T = cases[c].T, G = cases[c].G;
        for (int extra = 0; extra < T; extra += (T > 2 ? T - 1 : 1)) {
            int64_t ntok = W * T + 1 + extra; /* leftover < T tokens make no window */
            pl_sampler s;
            CHECK_EQ_INT(pl_sampler_init(&s, PL_ORDER_SHUFFLED, 1234 + c, ntok, T, G, err,
                                         sizeof err),
                         0);
            CHECK_EQ_INT(s.windows, W);
            int *seen = calloc((size_t)W, sizeof *seen);
            CHECK(seen);
            int64_t epochs = 3, total = epochs * W;
            for (int64_t g = 0; g < total; g++) {
                int64_t step = g / G;
                int j = (int)(g % G);
                int64_t off = pl_sampler_window(&s, step, j);
                if (off < 0 || off % T != 0 || off / T >= W || off + T + 1 > ntok) {
                    printf("    W %lld T %d G %d: bad offset %lld\n", (long long)W, T, G,
                           (long long)off);
                    free(seen);
                    CHECK(0);
                }
                seen[off / T]++;
                if ((g + 1) % W == 0) { /* end of an epoch */
                    int64_t e = g / W;
                    for (int64_t w = 0; w < W; w++) {
                        if (seen[w] != (int)(e + 1)) {
                            printf("    W %lld G %d epoch %lld: window %lld seen %d times\n",
                                   (long long)W, G, (long long)e, (long long)w, seen[w] - (int)e);
                            free(seen);
                            CHECK(0);
                        }
                    }
                }
            }
            free(seen);
            /* Epoch of a step. */
            CHECK_EQ_INT(pl_sampler_epoch(&s, 0), 0);
            CHECK_EQ_INT(pl_sampler_epoch(&s, 5), 5 * G / W);
        }
    }
}

static void test_permutation_direct(void)
{
    /* pl_sampler_permute is a bijection of [0, W) for many W and keys. */
    for (int64_t W = 1; W <= 300; W++) {
        unsigned char seen[300] = {0};
        for (int64_t i = 0; i < W; i++) {
            int64_t p = pl_sampler_permute((uint64_t)W * 7, (uint64_t)W % 3, W, i);
            CHECK(p >= 0 && p < W);
            CHECK(!seen[p]);
            seen[p] = 1;
        }
    }
    /* A large domain: spot checks of the range (no materialisation). */
    int64_t big = (int64_t)1 << 40;
    big += 12345;
    rng_state = 99;
    for (int r = 0; r < 1000; r++) {
        int64_t i = rng_range(0, big - 1);
        int64_t p = pl_sampler_permute(5, 17, big, i);
        CHECK(p >= 0 && p < big);
    }
    /* Looks shuffled: few fixed points, mean displacement about W/3. */
    int64_t W = 10000, fixed = 0;
    double disp = 0;
    for (int64_t i = 0; i < W; i++) {
        int64_t p = pl_sampler_permute(42, 0, W, i);
        fixed += p == i;
        disp += (double)(p > i ? p - i : i - p);
    }
    disp /= (double)W;
    CHECK(fixed < 20);
    CHECK(disp > 0.28 * (double)W && disp < 0.39 * (double)W);
}

static void test_shuffled_differs_across_seeds_and_epochs(void)
{
    int64_t W = 1000;
    int diff_seed = 0, diff_epoch = 0, diff_ident = 0;
    for (int64_t i = 0; i < W; i++) {
        int64_t a = pl_sampler_permute(1, 0, W, i);
        diff_seed += a != pl_sampler_permute(2, 0, W, i);
        diff_epoch += a != pl_sampler_permute(1, 1, W, i);
        diff_ident += a != i;
    }
    CHECK(diff_seed > 950);
    CHECK(diff_epoch > 950);
    CHECK(diff_ident > 950);
    /* Through the sampler: epoch 1 is not epoch 0 again. */
    pl_sampler s;
    CHECK_EQ_INT(pl_sampler_init(&s, PL_ORDER_SHUFFLED, 7, 100 * 4 + 1, 4, 10, err, sizeof err),
                 0);
    int same = 0;
    for (int step = 0; step < 10; step++)
        for (int j = 0; j < 10; j++)
            same += pl_sampler_window(&s, step, j) == pl_sampler_window(&s, step + 10, j);
    CHECK(same < 10);
    pl_sampler s2;
    CHECK_EQ_INT(pl_sampler_init(&s2, PL_ORDER_SHUFFLED, 8, 100 * 4 + 1, 4, 10, err, sizeof err),
                 0);
    same = 0;
    for (int j = 0; j < 10; j++) same += pl_sampler_window(&s, 0, j) == pl_sampler_window(&s2, 0, j);
    CHECK(same < 5);
}

/* The same (seed, step) gives the same sequences whatever order steps are
 * computed in and however a step is cut into microbatches. */
static void test_pure_function_of_seed_and_step(void)
{
    int64_t sizes[4] = {1000, 3, 517, 1201};
    pl_tokens t;
    int rc = make_stream("pure", sizes, 4, &t);
    if (rc) printf("    %s\n", err);
    CHECK_EQ_INT(rc, 0);
    enum { T = 16, G = 12, STEPS = 40 };
    static const pl_data_order orders[2] = {PL_ORDER_SHUFFLED, PL_ORDER_SEQUENTIAL};
    for (int o = 0; o < 2; o++) {
        pl_sampler s;
        CHECK_EQ_INT(pl_sampler_init(&s, orders[o], 2024, pl_tokens_count(&t), T, G, err,
                                     sizeof err),
                     0);
        /* Reference: whole steps, in order. */
        static int32_t in_ref[STEPS][G * T], tg_ref[STEPS][G * T];
        int64_t win_ref[STEPS][G];
        for (int step = 0; step < STEPS; step++) {
            CHECK_EQ_INT(pl_sampler_fill(&s, &t, step, 0, G, in_ref[step], tg_ref[step]), 0);
            for (int j = 0; j < G; j++) {
                win_ref[step][j] = pl_sampler_window(&s, step, j);
                /* Inputs and targets are the window, shifted by one. */
                for (int k = 0; k < T; k++) {
                    CHECK_EQ_INT(in_ref[step][j * T + k], pl_tokens_at(&t, win_ref[step][j] + k));
                    CHECK_EQ_INT(tg_ref[step][j * T + k],
                                 pl_tokens_at(&t, win_ref[step][j] + k + 1));
                    CHECK_EQ_INT(in_ref[step][j * T + k],
                                 (uint16_t)((win_ref[step][j] + k) * 31 + 7));
                }
            }
        }
        /* A fresh sampler, steps in random order, random microbatch cuts. */
        pl_sampler s2;
        CHECK_EQ_INT(pl_sampler_init(&s2, orders[o], 2024, pl_tokens_count(&t), T, G, err,
                                     sizeof err),
                     0);
        rng_state = 5 + (uint64_t)o;
        for (int r = 0; r < 200; r++) {
            int step = (int)rng_range(0, STEPS - 1);
            int first = 0;
            uint64_t dsum = 0;
            while (first < G) {
                int n = (int)rng_range(1, G - first);
                int32_t in[G * T], tg[G * T];
                CHECK_EQ_INT(pl_sampler_fill(&s2, &t, step, first, n, in, tg), 0);
                CHECK(memcmp(in, &in_ref[step][first * T], sizeof(int32_t) * (size_t)(n * T)) == 0);
                CHECK(memcmp(tg, &tg_ref[step][first * T], sizeof(int32_t) * (size_t)(n * T)) == 0);
                for (int j = first; j < first + n; j++)
                    CHECK_EQ_INT(pl_sampler_window(&s2, step, j), win_ref[step][j]);
                dsum = pl_sampler_digest_combine(dsum, pl_sampler_digest(&s2, step, first, n));
                first += n;
            }
            CHECK(dsum == pl_sampler_digest(&s, step, 0, G));
        }
        /* Slices outside the step. */
        int32_t in[G * T], tg[G * T];
        CHECK_EQ_INT(pl_sampler_fill(&s, &t, 0, G - 2, 3, in, tg), -1);
        CHECK_EQ_INT(pl_sampler_fill(&s, &t, 0, -1, 1, in, tg), -1);
        CHECK_EQ_INT(pl_sampler_fill(&s, &t, 0, G, 0, in, tg), 0);
    }
    pl_tokens_close(&t);
    remove_stream("pure", 4);
}

/* llm.c's DataLoader (shuffling off, one process), written as llm.c does. */
static void llmc_loader(int64_t ntok, int B, int T, int nbatches, int64_t *positions)
{
    int64_t current_position = 0;
    for (int b = 0; b < nbatches; b++) {
        if (current_position + (int64_t)B * T + 1 > ntok) current_position = 0;
        positions[b] = current_position;
        current_position += (int64_t)B * T;
    }
}

static void test_sequential_matches_llmc_loader(void)
{
    int64_t sizes[3] = {700, 1, 350};
    pl_tokens t;
    CHECK_EQ_INT(make_stream("seq", sizes, 3, &t), 0);
    int64_t ntok_all = pl_tokens_count(&t);
    static const struct { int64_t ntok; int B, T; } cases[] = {
        {1051, 4, 8}, {1051, 1, 1}, {1051, 3, 7},  {33, 4, 8},   {32, 1, 31}, {65, 4, 8},
        {64, 4, 8},   {1000, 5, 20}, {1051, 1, 1050}, {1051, 2, 525}, {101, 10, 10}, {200, 6, 11},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t n = cases[c].ntok;
        int B = cases[c].B, T = cases[c].T;
        CHECK(n <= ntok_all);
        pl_sampler s;
        CHECK_EQ_INT(pl_sampler_init(&s, PL_ORDER_SEQUENTIAL, 99, n, T, B, err, sizeof err), 0);
        CHECK_EQ_INT(s.batches, (n - 1) / ((int64_t)B * T));
        int nb = (int)(3 * s.batches + 5);
        int64_t *pos = malloc((size_t)nb * sizeof *pos);
        int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
        CHECK(pos && in && tg);
        llmc_loader(n, B, T, nb, pos);
        int bad = 0;
        for (int b = 0; b < nb && !bad; b++) {
            for (int j = 0; j < B; j++)
                if (pl_sampler_window(&s, b, j) != pos[b] + (int64_t)j * T) bad = 1;
            /* llm.c: inputs = buffer[0, B*T), targets = buffer[1, B*T+1). */
            if (pl_sampler_fill(&s, &t, b, 0, B, in, tg) != 0) bad = 2;
            for (int64_t i = 0; i < (int64_t)B * T && !bad; i++) {
                if (in[i] != pl_tokens_at(&t, pos[b] + i)) bad = 3;
                if (tg[i] != pl_tokens_at(&t, pos[b] + i + 1)) bad = 4;
            }
            if (pos[b] + (int64_t)B * T + 1 > n) bad = 5;
            if (pl_sampler_epoch(&s, b) != b / s.batches) bad = 6;
            if (bad)
                printf("    ntok %lld B %d T %d: batch %d differs (%d)\n", (long long)n, B, T, b,
                       bad);
        }
        free(pos);
        free(in);
        free(tg);
        CHECK(!bad);
    }
    /* Too short for one batch: llm.c needs B*T+1 tokens. */
    pl_sampler s;
    CHECK_EQ_INT(pl_sampler_init(&s, PL_ORDER_SEQUENTIAL, 0, 32, 8, 4, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "32 tokens, need at least 33 for one batch of 4 sequences of 8 tokens");
    CHECK_EQ_INT(pl_sampler_init(&s, PL_ORDER_SEQUENTIAL, 0, 33, 8, 4, err, sizeof err), 0);
    CHECK_EQ_INT(s.batches, 1);
    pl_tokens_close(&t);
    remove_stream("seq", 3);
}

static void test_init_errors(void)
{
    pl_sampler s;
    CHECK_EQ_INT(pl_sampler_init(&s, PL_ORDER_SHUFFLED, 0, 8, 8, 1, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "8 tokens, need at least 9 for one sequence of 8 tokens");
    CHECK_EQ_INT(pl_sampler_init(&s, PL_ORDER_SHUFFLED, 0, 9, 8, 100, err, sizeof err), 0);
    CHECK_EQ_INT(s.windows, 1);
    CHECK_EQ_INT(pl_sampler_init(&s, PL_ORDER_SHUFFLED, 0, 0, 8, 1, err, sizeof err), -1);
    CHECK_EQ_INT(pl_sampler_init(&s, PL_ORDER_SHUFFLED, 0, 100, 0, 1, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "sequence length 0");
    CHECK_EQ_INT(pl_sampler_init(&s, PL_ORDER_SEQUENTIAL, 0, 100, 4, 0, err, sizeof err), -1);
    CHECK_STR_CONTAINS(err, "global batch 0");
}

static void test_digest_stable_and_partition_consistent(void)
{
    pl_sampler sh, sq;
    CHECK_EQ_INT(pl_sampler_init(&sh, PL_ORDER_SHUFFLED, 42, 1000001, 64, 16, err, sizeof err), 0);
    CHECK_EQ_INT(pl_sampler_init(&sq, PL_ORDER_SEQUENTIAL, 42, 1000001, 64, 16, err, sizeof err),
                 0);
    /* Pinned values: changing them changes the data order of existing jobs
     * (a resumed run would see different samples). */
    static const int64_t pinned_windows[8] = {427584, 749696, 415488, 85760,
                                              705984, 290816, 652800, 998080};
    for (int j = 0; j < 8; j++) {
        int64_t w = pl_sampler_window(&sh, 3, j);
        if (w != pinned_windows[j]) printf("    window %d: %lld\n", j, (long long)w);
        CHECK_EQ_INT(w, pinned_windows[j]);
    }
    uint64_t d_sh = pl_sampler_digest(&sh, 3, 0, 16), d_sq = pl_sampler_digest(&sq, 3, 0, 16);
    const uint64_t pinned_sh = 0xfd063be2bb039ed6ull, pinned_sq = 0x99afebff20475266ull;
    if (d_sh != pinned_sh || d_sq != pinned_sq)
        printf("    digests 0x%016llxull 0x%016llxull\n", (unsigned long long)d_sh,
               (unsigned long long)d_sq);
    CHECK(d_sh == pinned_sh);
    CHECK(d_sq == pinned_sq);

    /* Partitions add up; n = 0 is 0; steps and orders differ. */
    CHECK(pl_sampler_digest(&sh, 3, 5, 0) == 0);
    for (int cut = 0; cut <= 16; cut++)
        CHECK(pl_sampler_digest_combine(pl_sampler_digest(&sh, 3, 0, cut),
                                        pl_sampler_digest(&sh, 3, cut, 16 - cut)) == d_sh);
    CHECK(pl_sampler_digest(&sh, 4, 0, 16) != d_sh);
    CHECK(d_sq != d_sh);
    /* Same windows at another position in the step give another digest. */
    CHECK(pl_sampler_digest(&sh, 3, 0, 1) != pl_sampler_digest(&sh, 3, 1, 1));
    /* Sequential order wraps: step K is step 0 again, but its digest differs
     * (the sample index is part of it). */
    int64_t K = sq.batches;
    CHECK_EQ_INT(pl_sampler_window(&sq, K, 0), pl_sampler_window(&sq, 0, 0));
    CHECK(pl_sampler_digest(&sq, K, 0, 16) != pl_sampler_digest(&sq, 0, 0, 16));
}

static void test_eval_batches(void)
{
    int64_t sizes[1] = {1000};
    pl_tokens t;
    CHECK_EQ_INT(make_stream("val", sizes, 1, &t), 0);
    pl_sampler ev, seq;
    CHECK_EQ_INT(pl_sampler_init_eval(&ev, pl_tokens_count(&t), 32, 4, err, sizeof err), 0);
    CHECK_EQ_INT(pl_sampler_init(&seq, PL_ORDER_SEQUENTIAL, 0, 1000, 32, 4, err, sizeof err), 0);
    CHECK_EQ_INT(ev.batches, 7); /* (1000 - 1) / 128 */
    CHECK_EQ_INT(pl_sampler_eval_batches(&ev, 0), 7);
    CHECK_EQ_INT(pl_sampler_eval_batches(&ev, -1), 7);
    CHECK_EQ_INT(pl_sampler_eval_batches(&ev, 3), 3);
    CHECK_EQ_INT(pl_sampler_eval_batches(&ev, 70), 7);
    for (int k = 0; k < 7; k++) {
        for (int j = 0; j < 4; j++) {
            CHECK_EQ_INT(pl_sampler_window(&ev, k, j), k * 128 + j * 32);
            CHECK_EQ_INT(pl_sampler_window(&ev, k, j), pl_sampler_window(&seq, k, j));
        }
    }
    /* Every evaluation sees the same batches. */
    int32_t a[128], b[128], c[128], d[128];
    CHECK_EQ_INT(pl_sampler_fill(&ev, &t, 2, 0, 4, a, b), 0);
    CHECK_EQ_INT(pl_sampler_fill(&ev, &t, 2, 0, 4, c, d), 0);
    CHECK(memcmp(a, c, sizeof a) == 0 && memcmp(b, d, sizeof b) == 0);
    CHECK_EQ_INT(pl_sampler_init_eval(&ev, 100, 32, 4, err, sizeof err), -1);
    pl_tokens_close(&t);
    remove_stream("val", 1);
}

TEST_MAIN_BEGIN
snprintf(dir, sizeof dir, "/tmp/pliant_tokens_XXXXXX");
if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
}
RUN(test_write_and_read_one_shard);
RUN(test_glob_across_shards);
RUN(test_bad_shards_rejected);
RUN(test_vocab_check);
RUN(test_write_is_atomic);
RUN(test_tokenize_bytes);
RUN(test_shuffled_covers_each_window_once_per_epoch);
RUN(test_permutation_direct);
RUN(test_shuffled_differs_across_seeds_and_epochs);
RUN(test_pure_function_of_seed_and_step);
RUN(test_sequential_matches_llmc_loader);
RUN(test_init_errors);
RUN(test_digest_stable_and_partition_consistent);
RUN(test_eval_batches);
rm_rf(dir);
TEST_MAIN_END
