/* llm.c token shards. A shard (`.bin`) is a header of 256 int32 — magic
 * 20240520 at [0], version 1 at [1], number of tokens at [2] — followed by
 * that many little-endian uint16 tokens; the file size is exactly
 * 1024 + 2·ntokens. A glob of shards (sorted by name, as llm.c does) is mapped
 * read-only and presented as one concatenated token stream. */
#ifndef PLIANT_TOKENS_H
#define PLIANT_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#define PL_TOKENS_MAGIC 20240520
#define PL_TOKENS_VERSION 1
#define PL_TOKENS_HEADER_INTS 256
#define PL_TOKENS_HEADER_BYTES (PL_TOKENS_HEADER_INTS * 4)

typedef struct {
    char *path;
    const uint16_t *tok; /* ntok tokens, inside the read-only mapping */
    int64_t ntok;
    int64_t start;       /* stream index of tok[0] */
    void *map;
    size_t map_len;
} pl_token_shard;

typedef struct {
    pl_token_shard *shards; /* in glob (name) order */
    int nshards;
    int64_t ntokens;        /* total over the shards */
} pl_tokens;

/* Expands glob_pattern (glob(3), sorted), maps and validates every shard
 * (magic, version, token count, file size; a shard must hold at least one
 * token, as llm.c requires). Returns 0, or −1 with "FILE: problem" in err and
 * *out left empty. A pattern that matches nothing is an error. */
int pl_tokens_open(const char *glob_pattern, pl_tokens *out, char *err, size_t errlen);
void pl_tokens_close(pl_tokens *t);

static inline int64_t pl_tokens_count(const pl_tokens *t) { return t->ntokens; }

/* Token i of the stream; 0 ≤ i < count (aborts otherwise). */
uint16_t pl_tokens_at(const pl_tokens *t, int64_t i);

/* Copies tokens [start, start+n) of the stream, widened to int32, into dst;
 * crosses shard boundaries. Returns 0, or −1 if the range is out of bounds
 * (dst untouched). */
int pl_tokens_copy(const pl_tokens *t, int64_t start, int64_t n, int32_t *dst);

/* Scans every token once; −1 with "FILE: token V at index I (byte offset O)
 * is out of range for vocabulary size VOCAB" for the first offender. */
int pl_tokens_check_vocab(const pl_tokens *t, int vocab, char *err, size_t errlen);

/* pl_tokens_open, then pl_tokens_check_vocab: what every process that loads a job's
 * data runs (`pliant train`, `pliant run`, each worker), so that a token id the
 * model has no embedding for is refused at load, naming the file, the offset and
 * the id. On error *out is left empty. */
int pl_tokens_open_vocab(const char *glob_pattern, int vocab, pl_tokens *out, char *err,
                         size_t errlen);

/* Writes one shard atomically (temporary file in the same directory, fsync,
 * rename). 1 ≤ n ≤ INT32_MAX. Returns 0 or −1 with err. */
int pl_tokens_write(const char *path, const uint16_t *tok, int64_t n, char *err, size_t errlen);

/* Byte-level tokenization (vocabulary 256): each byte of input_path is one
 * token. The first floor(0.9·size) bytes go to OUT_PREFIX_train.bin, the rest
 * to OUT_PREFIX_val.bin; the directory of out_prefix is created if missing.
 * The input needs at least 2 bytes (both shards non-empty). Returns 0 or −1. */
int pl_tokenize_bytes(const char *input_path, const char *out_prefix, char *err, size_t errlen);

#endif
