/* llm.c token shards: reading a glob of them, mapped, as one token stream, and
 * writing them (tokens.h). */
#include "tokens.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token shards are little-endian; this code maps them directly"
#endif


/* ---- reading ------------------------------------------------------------ */

static void shard_unmap(pl_token_shard *s)
{
    if (s->map) munmap(s->map, s->map_len);
    free(s->path);
    memset(s, 0, sizeof *s);
}

/* Maps path read-only (*map, *len) once it is a regular file long enough for the header. */
static int map_shard_file(const char *path, void **map, size_t *len, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return pl_errf(err, errlen, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pl_errf(err, errlen, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return pl_errf(err, errlen, "%s: not a regular file", path);
    }
    if (st.st_size < PL_TOKENS_HEADER_BYTES) {
        close(fd);
        return pl_errf(err, errlen,
                       "%s: file is %lld bytes, shorter than the %d-byte llm.c header", path,
                       (long long)st.st_size, PL_TOKENS_HEADER_BYTES);
    }
    *len = (size_t)st.st_size;
    *map = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (*map == MAP_FAILED) return pl_errf(err, errlen, "%s: mmap: %s", path, strerror(e));
    return 0;
}

/* What is wrong with a shard's header (written to buf), or NULL when it matches the file. */
static const char *header_problem(const int32_t hdr[3], size_t len, char *buf, size_t bufsz)
{
    if (hdr[0] != PL_TOKENS_MAGIC)
        snprintf(buf, bufsz, "bad magic %" PRId32 " (expected %d: not an llm.c token shard)",
                 hdr[0], PL_TOKENS_MAGIC);
    else if (hdr[1] != PL_TOKENS_VERSION)
        snprintf(buf, bufsz, "unsupported version %" PRId32 " (expected %d)", hdr[1],
                 PL_TOKENS_VERSION);
    else if (hdr[2] <= 0)
        snprintf(buf, bufsz, "header says %" PRId32 " tokens (need at least 1)", hdr[2]);
    else if ((int64_t)len != PL_TOKENS_HEADER_BYTES + 2 * (int64_t)hdr[2])
        snprintf(buf, bufsz,
                 "file is %zu bytes but header says %" PRId32 " tokens (expected %" PRId64
                 " bytes)",
                 len, hdr[2], PL_TOKENS_HEADER_BYTES + 2 * (int64_t)hdr[2]);
    else
        return NULL;
    return buf;
}

static int shard_map(const char *path, pl_token_shard *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    void *map;
    size_t len = 0;
    if (map_shard_file(path, &map, &len, err, errlen)) return -1;

    int32_t hdr[3];
    memcpy(hdr, map, sizeof hdr);
    char buf[160];
    const char *problem = header_problem(hdr, len, buf, sizeof buf);
    if (problem) {
        munmap(map, len);
        return pl_errf(err, errlen, "%s: %s", path, problem);
    }
    s->path = strdup(path);
    if (!s->path) {
        munmap(map, len);
        return pl_errf(err, errlen, "%s: out of memory", path);
    }
    s->map = map;
    s->map_len = len;
    s->tok = (const uint16_t *)((const char *)map + PL_TOKENS_HEADER_BYTES);
    s->ntok = hdr[2];
    return 0;
}

void pl_tokens_close(pl_tokens *t)
{
    if (!t) return;
    for (int i = 0; i < t->nshards; i++) shard_unmap(&t->shards[i]);
    free(t->shards);
    memset(t, 0, sizeof *t);
}

int pl_tokens_open(const char *glob_pattern, pl_tokens *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!glob_pattern || !*glob_pattern) return pl_errf(err, errlen, "token shards: empty glob");
    glob_t g;
    int rc = glob(glob_pattern, GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        globfree(&g);
        return pl_errf(err, errlen, "%s: no files match", glob_pattern);
    }
    if (rc != 0) {
        globfree(&g);
        return pl_errf(err, errlen, "%s: glob failed (%s)", glob_pattern,
                       rc == GLOB_NOSPACE ? "out of memory" : "read error");
    }
    if (g.gl_pathc > (size_t)INT32_MAX) {
        globfree(&g);
        return pl_errf(err, errlen, "%s: too many files", glob_pattern);
    }
    pl_tokens t = {0};
    t.shards = pl_calloc(g.gl_pathc, sizeof *t.shards);
    if (!t.shards) {
        globfree(&g);
        return pl_errf(err, errlen, "%s: out of memory", glob_pattern);
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        if (shard_map(g.gl_pathv[i], &t.shards[i], err, errlen) != 0) {
            pl_tokens_close(&t);
            globfree(&g);
            return -1;
        }
        t.nshards = (int)i + 1;
        t.shards[i].start = t.ntokens;
        t.ntokens += t.shards[i].ntok;
    }
    globfree(&g);
    *out = t;
    return 0;
}

/* Index of the shard holding stream index i (0 ≤ i < ntokens). */
static int shard_of(const pl_tokens *t, int64_t i)
{
    int lo = 0, hi = t->nshards - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (t->shards[mid].start <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

uint16_t pl_tokens_at(const pl_tokens *t, int64_t i)
{
    if (i < 0 || i >= t->ntokens) {
        fprintf(stderr, "pl_tokens_at: index %" PRId64 " out of range [0, %" PRId64 ")\n", i,
                t->ntokens);
        abort();
    }
    const pl_token_shard *s = &t->shards[shard_of(t, i)];
    return s->tok[i - s->start];
}

int pl_tokens_copy(const pl_tokens *t, int64_t start, int64_t n, int32_t *dst)
{
    if (start < 0 || n < 0 || start > t->ntokens || n > t->ntokens - start) return -1;
    if (n == 0) return 0;
    int k = shard_of(t, start);
    int64_t pos = start;
    while (n > 0) {
        const pl_token_shard *s = &t->shards[k];
        int64_t off = pos - s->start;
        int64_t take = s->ntok - off;
        if (take > n) take = n;
        const uint16_t *src = s->tok + off;
        for (int64_t i = 0; i < take; i++) dst[i] = src[i];
        dst += take;
        pos += take;
        n -= take;
        k++;
    }
    return 0;
}

int pl_tokens_check_vocab(const pl_tokens *t, int vocab, char *err, size_t errlen)
{
    if (vocab <= 0) return pl_errf(err, errlen, "vocabulary size %d: must be positive", vocab);
    if (vocab > UINT16_MAX) return 0; /* every uint16 token fits */
    uint16_t v = (uint16_t)vocab;
    for (int k = 0; k < t->nshards; k++) {
        const pl_token_shard *s = &t->shards[k];
        for (int64_t i = 0; i < s->ntok; i++) {
            if (s->tok[i] >= v)
                return pl_errf(err, errlen,
                               "%s: token %u at index %" PRId64 " (byte offset %" PRId64
                               ") is out of range for vocabulary size %d",
                               s->path, (unsigned)s->tok[i], i,
                               (int64_t)PL_TOKENS_HEADER_BYTES + 2 * i, vocab);
        }
    }
    return 0;
}

int pl_tokens_open_vocab(const char *glob_pattern, int vocab, pl_tokens *out, char *err,
                         size_t errlen)
{
    if (pl_tokens_open(glob_pattern, out, err, errlen)) return -1;
    if (pl_tokens_check_vocab(out, vocab, err, errlen) == 0) return 0;
    pl_tokens_close(out);
    return -1;
}

/* ---- writing ------------------------------------------------------------ */

int pl_tokens_write(const char *path, const uint16_t *tok, int64_t n, char *err, size_t errlen)
{
    if (n < 1 || n > INT32_MAX)
        return pl_errf(err, errlen, "%s: token count %" PRId64 " out of range [1, %d]", path, n,
                       INT32_MAX);
    int32_t hdr[PL_TOKENS_HEADER_INTS] = {0};
    hdr[0] = PL_TOKENS_MAGIC;
    hdr[1] = PL_TOKENS_VERSION;
    hdr[2] = (int32_t)n;
    pl_piece p[2] = {{hdr, sizeof hdr}, {tok, (size_t)n * sizeof *tok}};
    return pl_write_atomic(path, p, 2, err, errlen);
}

/* mkdir -p for the directory part of prefix ("data/ts" -> "data"). */
static int make_parent_dirs(const char *prefix, char *err, size_t errlen)
{
    const char *slash = strrchr(prefix, '/');
    if (!slash || slash == prefix) return 0;
    size_t len = (size_t)(slash - prefix);
    char *dir = malloc(len + 1);
    if (!dir) return pl_errf(err, errlen, "%s: out of memory", prefix);
    memcpy(dir, prefix, len);
    dir[len] = '\0';
    for (size_t i = 1; i <= len; i++) {
        if (dir[i] != '/' && dir[i] != '\0') continue;
        char saved = dir[i];
        dir[i] = '\0';
        struct stat st;
        if (stat(dir, &st) != 0 && mkdir(dir, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            pl_errf(err, errlen, "%s: cannot create directory: %s", dir, strerror(e));
            free(dir);
            return -1;
        }
        dir[i] = saved;
    }
    struct stat st;
    int rc = 0;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        rc = pl_errf(err, errlen, "%s: not a directory", dir);
    free(dir);
    return rc;
}

/* Maps the input read-only (*bytes, *n) and splits its length 9:1 into training (*n_train)
 * and validation. */
static int map_input(const char *input_path, unsigned char **bytes, int64_t *n, int64_t *n_train,
                     char *err, size_t errlen)
{
    int fd = open(input_path, O_RDONLY);
    if (fd < 0) return pl_errf(err, errlen, "%s: %s", input_path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return pl_errf(err, errlen, "%s: not a readable regular file", input_path);
    }
    *n = st.st_size;
    if (*n < 2) {
        close(fd);
        return pl_errf(err, errlen,
                       "%s: %" PRId64 " bytes; need at least 2 (one for training, one for "
                       "validation)",
                       input_path, *n);
    }
    *n_train = *n / 10 * 9 + (*n % 10) * 9 / 10; /* floor(0.9·n) without overflow */
    if (*n_train > INT32_MAX || *n - *n_train > INT32_MAX) {
        close(fd);
        return pl_errf(err, errlen, "%s: too large for one shard per split (%" PRId64 " bytes)",
                       input_path, *n);
    }
    *bytes = mmap(NULL, (size_t)*n, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (*bytes == MAP_FAILED) return pl_errf(err, errlen, "%s: mmap: %s", input_path, strerror(e));
    return 0;
}

int pl_tokenize_bytes(const char *input_path, const char *out_prefix, char *err, size_t errlen)
{
    unsigned char *bytes;
    int64_t n = 0, n_train = 0;
    if (map_input(input_path, &bytes, &n, &n_train, err, errlen)) return -1;

    int rc = -1;
    size_t plen = strlen(out_prefix);
    char *path = malloc(plen + 16);
    uint16_t *tok = pl_calloc((size_t)n, sizeof *tok);
    if (!path || !tok) {
        pl_errf(err, errlen, "%s: out of memory", input_path);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) tok[i] = bytes[i];
    if (make_parent_dirs(out_prefix, err, errlen) != 0) goto done;
    snprintf(path, plen + 16, "%s_train.bin", out_prefix);
    if (pl_tokens_write(path, tok, n_train, err, errlen) != 0) goto done;
    snprintf(path, plen + 16, "%s_val.bin", out_prefix);
    if (pl_tokens_write(path, tok + n_train, n - n_train, err, errlen) != 0) goto done;
    rc = 0;
done:
    munmap(bytes, (size_t)n);
    free(tok);
    free(path);
    return rc;
}
