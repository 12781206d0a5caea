/* Device memory of a CUDA context: one arena per worker process, plain
 * cudaMalloc (no managed memory). kn_alloc and the workspace take blocks from
 * chunks cudaMalloc'ed on demand, each of max(request, PLIANT_GPU_ARENA_MB MiB,
 * default 256): never a share of the whole device, because several workers may
 * share one GPU. A request takes the smallest free block that fits (best fit),
 * split when larger; a freed block merges with its free neighbours in the
 * chunk. Blocks are 256-byte aligned (the alignment cudaMalloc gives).
 *
 * Chunks go back to the device when the context is destroyed, and earlier only
 * when a cudaMalloc fails while whole chunks are free (they are released and
 * the request retried), so a worker that shrinks its stage can still grow
 * another.
 *
 * The bookkeeping lives on the host: a list of chunks, each with its blocks in
 * address order tiling it. Every call is O(blocks); a worker holds tens of
 * buffers (parameters, gradients, optimizer state, activation sets). */
#include <stdint.h>

#include "cuda.cuh"

#define ARENA_ALIGN 256
#define ARENA_DEFAULT_MB 256

typedef struct arena_block {
    char *ptr;
    size_t size; /* a multiple of ARENA_ALIGN */
    int used;
    struct arena_block *prev, *next; /* neighbours in the chunk, by address */
} arena_block;

typedef struct arena_chunk {
    char *base;
    size_t size;
    arena_block *blocks; /* the first block (at base) */
    struct arena_chunk *next;
} arena_chunk;

struct kn_arena {
    arena_chunk *chunks;
    size_t grow; /* least size of a new chunk */
    size_t reserved, in_use, peak;
    int nchunks;
};

static struct kn_arena *arena_get(kn_ctx *k)
{
    struct kn_arena *a = k->cuda->arena;
    if (a) return a;
    a = (struct kn_arena *)calloc(1, sizeof *a);
    if (!a) return NULL;
    size_t mb = ARENA_DEFAULT_MB;
    const char *env = getenv("PLIANT_GPU_ARENA_MB");
    if (env && *env) {
        char *end;
        unsigned long long v = strtoull(env, &end, 10);
        if (env[0] >= '0' && env[0] <= '9' && *end == '\0' && v > 0 && v <= (SIZE_MAX >> 21))
            mb = (size_t)v;
        else
            fprintf(stderr, "pliant kernels (cuda): ignoring PLIANT_GPU_ARENA_MB=%s "
                            "(want a whole number of MiB > 0); chunks of %d MiB\n",
                    env, ARENA_DEFAULT_MB);
    }
    a->grow = mb << 20;
    k->cuda->arena = a;
    return a;
}

/* A new chunk holding one free block of its whole size (at least need bytes),
 * or NULL when the device (or the host) has no room. */
static arena_chunk *chunk_new(struct kn_arena *a, size_t need)
{
    size_t size = need > a->grow ? need : a->grow;
    arena_chunk *c = (arena_chunk *)calloc(1, sizeof *c);
    arena_block *b = (arena_block *)calloc(1, sizeof *b);
    if (!c || !b) goto fail;
    if (cudaMalloc((void **)&c->base, size) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not sticky: clear it */
        if (size == need) goto fail;
        size = need; /* the device may still hold the request itself */
        if (cudaMalloc((void **)&c->base, size) != cudaSuccess) {
            cudaGetLastError();
            goto fail;
        }
    }
    c->size = size;
    b->ptr = c->base;
    b->size = size;
    c->blocks = b;
    c->next = a->chunks;
    a->chunks = c;
    a->reserved += size;
    a->nchunks++;
    return c;
fail:
    free(c);
    free(b);
    return NULL;
}

/* Gives the chunks with no block in use back to the device; returns how many.
 * (A chunk without a used block is one free block: neighbours always merge.) */
static int release_free_chunks(struct kn_arena *a)
{
    int n = 0;
    for (arena_chunk **pc = &a->chunks; *pc;) {
        arena_chunk *c = *pc;
        if (c->blocks->used || c->blocks->next) {
            pc = &c->next;
            continue;
        }
        CUDA_CHECK(cudaFree(c->base)); /* nothing queued uses it: kn_free waited */
        a->reserved -= c->size;
        a->nchunks--;
        *pc = c->next;
        free(c->blocks);
        free(c);
        n++;
    }
    return n;
}

static arena_block *best_fit(struct kn_arena *a, size_t n)
{
    arena_block *best = NULL;
    for (arena_chunk *c = a->chunks; c; c = c->next)
        for (arena_block *b = c->blocks; b; b = b->next)
            if (!b->used && b->size >= n && (!best || b->size < best->size)) best = b;
    return best;
}

/* Marks the first n bytes of free block b used; the rest becomes a free block
 * after it. −1 when the host is out of memory for the bookkeeping. */
static int take(struct kn_arena *a, arena_block *b, size_t n)
{
    if (b->size > n) { /* both multiples of ARENA_ALIGN: the rest is a whole block */
        arena_block *r = (arena_block *)calloc(1, sizeof *r);
        if (!r) return -1;
        r->ptr = b->ptr + n;
        r->size = b->size - n;
        r->prev = b;
        r->next = b->next;
        if (b->next) b->next->prev = r;
        b->next = r;
        b->size = n;
    }
    b->used = 1;
    a->in_use += b->size;
    if (a->in_use > a->peak) a->peak = a->in_use;
    return 0;
}

void *kn_cuda_arena_alloc(kn_ctx *k, size_t bytes, int zero)
{
    struct kn_arena *a = arena_get(k);
    if (!a || bytes > SIZE_MAX - ARENA_ALIGN) return NULL;
    size_t n = bytes ? (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN : ARENA_ALIGN;
    arena_block *b = best_fit(a, n);
    if (!b) {
        arena_chunk *c = chunk_new(a, n);
        if (!c && release_free_chunks(a)) c = chunk_new(a, n);
        if (!c) return NULL;
        b = c->blocks;
    }
    if (take(a, b, n)) return NULL;
    if (zero) CUDA_CHECK(cudaMemsetAsync(b->ptr, 0, n, kn_stream(k)));
    return b->ptr;
}

static arena_block *find(struct kn_arena *a, const char *p)
{
    for (arena_chunk *c = a ? a->chunks : NULL; c; c = c->next) {
        if (p < c->base || p >= c->base + c->size) continue;
        for (arena_block *b = c->blocks; b; b = b->next)
            if (b->ptr == p) return b;
        return NULL;
    }
    return NULL;
}

/* b absorbs its next block (both free). */
static void merge_next(arena_block *b)
{
    arena_block *n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    free(n);
}

void kn_cuda_arena_free(kn_ctx *k, void *p)
{
    if (!p) return;
    struct kn_arena *a = k->cuda->arena;
    arena_block *b = find(a, (const char *)p);
    if (!b || !b->used)
        kn_cuda_fail("kn_free", "not a block of this context's arena (or freed twice)", __FILE__,
                     __LINE__);
    CUDA_CHECK(cudaStreamSynchronize(kn_stream(k))); /* queued work using p ends first */
    b->used = 0;
    a->in_use -= b->size;
    if (b->next && !b->next->used) merge_next(b);
    if (b->prev && !b->prev->used) merge_next(b->prev);
}

void kn_cuda_arena_destroy(kn_ctx *k)
{
    struct kn_arena *a = k->cuda->arena;
    if (!a) return;
    for (arena_chunk *c = a->chunks, *next; c; c = next) {
        next = c->next;
        cudaFree(c->base); /* teardown: report nothing, free what exists */
        for (arena_block *b = c->blocks, *bn; b; b = bn) {
            bn = b->next;
            free(b);
        }
        free(c);
    }
    free(a);
    k->cuda->arena = NULL;
}

int kn_cuda_memory_stats(kn_ctx *k, kn_mem_stats *out)
{
    const struct kn_arena *a = k->cuda->arena;
    out->reserved = a ? a->reserved : 0;
    out->in_use = a ? a->in_use : 0;
    out->peak = a ? a->peak : 0;
    out->chunks = a ? a->nchunks : 0;
    return 0;
}
