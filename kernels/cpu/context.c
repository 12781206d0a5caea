/* CPU backend: context, memory, copies, and its table of kernels. */
#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>

#include "cpu.h"

static void cpu_destroy(kn_ctx *k)
{
    free(k->ws);
    free(k);
}

static size_t round64(size_t bytes) /* 0 when bytes cannot be rounded up */
{
    return bytes ? (bytes > SIZE_MAX - 63 ? 0 : (bytes + 63) / 64 * 64) : 64;
}

void *kn_cpu_workspace(kn_ctx *k, size_t bytes)
{
    if (bytes <= k->ws_bytes && k->ws) return k->ws;
    free(k->ws);
    size_t n = round64(bytes);
    k->ws = n ? aligned_alloc(64, n) : NULL;
    if (!k->ws) {
        fprintf(stderr, "pliant kernels: cannot allocate %zu bytes of workspace\n", n);
        abort();
    }
    k->ws_bytes = n;
    return k->ws;
}

static void cpu_zero(kn_ctx *k, void *p, size_t bytes)
{
    if (bytes < ((size_t)4 << 20)) {
        memset(p, 0, bytes);
        return;
    }
#pragma omp parallel num_threads(k->threads)
    {
        size_t lo, hi;
        kn_split(bytes, omp_get_num_threads(), omp_get_thread_num(), 4096, &lo, &hi);
        if (hi > lo) memset((char *)p + lo, 0, hi - lo);
    }
}

/* Allocations. Large blocks are mappings of a memory file of their own (memfd), zero by
 * the kernel's guarantee and faulted in page by page where first written (a new engine's
 * tensors are filled while layer copies arrive, never swept with zeros first), and a range
 * of one can be mapped into another (cpu_share: a layer a worker keeps is not copied); the
 * block starts after a header page: its table of shared ranges (which file backs them: a
 * block shared again shares the right memory), then, right before the block, the 64-byte
 * header every block has. Small blocks come from the heap, zeroed here, after that 64-byte
 * header alone. */
#define HEAP_HDR 64
#define MAP_HDR ((size_t)KN_SHARE_ALIGN)
#define ALLOC_MAP_MIN ((size_t)64 << 10)
#define ALLOC_MAGIC_HEAP 0x706c6865u
#define ALLOC_MAGIC_MAP 0x706c6d61u

typedef struct {
    uint32_t magic;
    int fd;     /* the memory file; −1: an anonymous mapping (no memfd) */
    size_t len; /* of the whole mapping, header page included */
} alloc_hdr;

typedef struct {
    size_t off, len; /* the block's range, bytes */
    size_t foff;     /* where it is in fd */
    int fd;          /* a duplicate, closed with the block */
} shared_range;

#define SHARED_MAX (int)((MAP_HDR - HEAP_HDR - sizeof(int)) / sizeof(shared_range))

typedef struct {
    int n;
    shared_range r[SHARED_MAX];
} shared_table;

/* Right before every block, whichever header it has. */
static alloc_hdr *hdr_of(const void *p)
{
    return (alloc_hdr *)((char *)p - HEAP_HDR);
}

/* A mapped block's table of shared ranges, at the start of its header page. */
static shared_table *table_of(const void *p)
{
    return (shared_table *)((char *)p - MAP_HDR);
}

static void *map_block(size_t n)
{
    const size_t len = MAP_HDR + (n + MAP_HDR - 1) / MAP_HDR * MAP_HDR;
    int fd = memfd_create("pliant", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)len)) {
        close(fd);
        fd = -1;
    }
    char *base = fd >= 0 ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                         : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                -1, 0);
    if (base == MAP_FAILED) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    /* huge pages where the system gives them to memory files on request (shmem_enabled
     * "advise"): a 2 MiB page is allocated, zeroed and populated at a fraction of the cost
     * of 512 small ones; elsewhere the advice changes nothing, and a refusal is no error */
    (void)madvise(base, len, MADV_HUGEPAGE);
    *hdr_of(base + MAP_HDR) = (alloc_hdr){.magic = ALLOC_MAGIC_MAP, .fd = fd, .len = len};
    return base + MAP_HDR;
}

static void *cpu_alloc(kn_ctx *k, size_t bytes)
{
    size_t n = round64(bytes);
    if (!n || n > SIZE_MAX / 2) return NULL;
    if (n >= ALLOC_MAP_MIN) return map_block(n);
    char *base = aligned_alloc(64, n + HEAP_HDR);
    if (!base) return NULL;
    cpu_zero(k, base + HEAP_HDR, n);
    *(alloc_hdr *)base = (alloc_hdr){.magic = ALLOC_MAGIC_HEAP, .fd = -1, .len = n + HEAP_HDR};
    return base + HEAP_HDR;
}

static void cpu_free(kn_ctx *k, void *p)
{
    (void)k;
    if (!p) return;
    const alloc_hdr h = *hdr_of(p);
    if (h.magic == ALLOC_MAGIC_MAP) {
        const shared_table *t = table_of(p);
        for (int i = 0; i < t->n; i++) close(t->r[i].fd);
        munmap((char *)p - MAP_HDR, h.len);
        if (h.fd >= 0) close(h.fd);
    } else if (h.magic == ALLOC_MAGIC_HEAP) {
        free((char *)p - HEAP_HDR);
    } else {
        fprintf(stderr, "pliant kernels: freeing memory the CPU backend did not allocate\n");
        abort();
    }
}

/* The file and offset behind [off, off + len) of mapped block p: a shared range that holds
 * it all, else the block's own file where no shared range overlaps it; −1 otherwise. */
static int backing(const void *p, size_t off, size_t len, size_t *foff)
{
    const shared_table *t = table_of(p);
    for (int i = 0; i < t->n; i++) {
        const shared_range *r = &t->r[i];
        if (off >= r->off && off + len <= r->off + r->len) {
            *foff = r->foff + (off - r->off);
            return r->fd;
        }
        if (off < r->off + r->len && r->off < off + len) return -1;
    }
    *foff = MAP_HDR + off;
    return hdr_of(p)->fd;
}

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4 /* Linux 5.7, file mappings since 5.13; older kernels answer EINVAL */
#endif

/* Maps [foff, foff + bytes) of fd at `at` (over what was there), taking over the source
 * range's page tables where the system can (mremap, MREMAP_DONTUNMAP): the pages are
 * present at `at` at once rather than faulted in again, and the source's range stays
 * mapped, empty, its pages faulted back from the same file if it is touched again (a
 * sender reading it, a later share); else a plain mapping. The source range is one
 * mapping of fd at foff (backing). */
static int map_range(void *at, const void *src, size_t bytes, int fd, size_t foff)
{
    if (mremap((void *)src, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
               at) == at)
        return 0;
    return mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)foff) == at
               ? 0
               : -1;
}

/* kn_share: the memory behind the source's range mapped over the destination's range. */
static int cpu_share(kn_ctx *k, void *dst_block, size_t dst_off, const void *src_block,
                     size_t src_off, size_t bytes)
{
    (void)k;
    const alloc_hdr d = *hdr_of(dst_block), s = *hdr_of(src_block);
    shared_table *t = table_of(dst_block);
    size_t foff, unused;
    if (d.magic != ALLOC_MAGIC_MAP || s.magic != ALLOC_MAGIC_MAP || d.fd < 0 || !bytes ||
        (dst_off | src_off | bytes) % MAP_HDR || dst_off + bytes > d.len - MAP_HDR ||
        src_off + bytes > s.len - MAP_HDR || t->n == SHARED_MAX ||
        backing(dst_block, dst_off, bytes, &unused) != d.fd)
        return -1;
    const int fd = backing(src_block, src_off, bytes, &foff);
    const int dup_fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (dup_fd < 0) return -1;
    void *at = (char *)dst_block + dst_off;
    if (map_range(at, (const char *)src_block + src_off, bytes, dup_fd, foff) == 0) {
        t->r[t->n++] = (shared_range){.off = dst_off, .len = bytes, .foff = foff, .fd = dup_fd};
        return 0;
    }
    close(dup_fd);
    /* the range may be gone: map the destination's own memory back, or give up */
    if (mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, d.fd,
             (off_t)(MAP_HDR + dst_off)) != at) {
        fprintf(stderr, "pliant kernels: cannot map a shared range back\n");
        abort();
    }
    return -1;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels answer EINVAL */
#endif

/* kn_populate: the pages faulted in for writing by the kernel, contents kept (a memory
 * file's pages allocated and zeroed, a shared range's mapped), 64 MiB a call: a call holds
 * the process's address-space lock, which the other threads' mmap and munmap (a large
 * malloc, a thread's stack) wait for. */
static int cpu_populate(kn_ctx *k, void *p, size_t bytes)
{
    (void)k;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), step = (uintptr_t)64 << 20;
    const uintptr_t lo = (uintptr_t)p & ~(page - 1);
    const uintptr_t hi = ((uintptr_t)p + bytes + page - 1) & ~(page - 1);
    for (uintptr_t at = lo; bytes && at < hi; at += step)
        if (madvise((void *)at, hi - at < step ? hi - at : step, MADV_POPULATE_WRITE)) return -1;
    return 0;
}

static void cpu_to_device(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    (void)k;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_to_host(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    (void)k;
    if (bytes) memcpy(dst, src, bytes);
}

static void cpu_sync(kn_ctx *k)
{
    (void)k;
}

static void cpu_copy(kn_ctx *k, void *dst, const void *src, size_t bytes)
{
    (void)k;
    if (bytes) memcpy(dst, src, bytes);
}

static void *cpu_host_alloc(kn_ctx *k, size_t bytes)
{
    return cpu_alloc(k, bytes);
}

/* Kernel timing (kn_profile_enable): the CPU kernels are synchronous, so the
 * clock around the call is the kernel's time. */
static double cpu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void cpu_prof_begin(kn_ctx *k) { k->prof->t0 = cpu_now_s(); }

static void cpu_prof_end(kn_ctx *k, int op)
{
    k->prof->ms[op] += (cpu_now_s() - k->prof->t0) * 1e3;
}

static const kn_ops kn_cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .zero = cpu_zero,
    .to_device = cpu_to_device,
    .to_host = cpu_to_host,
    .sync = cpu_sync,
    .encoder_forward = kn_cpu_encoder_forward,
    .encoder_backward = kn_cpu_encoder_backward,
    .layernorm_forward = kn_cpu_layernorm_forward,
    .layernorm_backward = kn_cpu_layernorm_backward,
    .matmul_forward = kn_cpu_matmul_forward,
    .matmul_backward = kn_cpu_matmul_backward,
    .attention_forward = kn_cpu_attention_forward,
    .attention_backward = kn_cpu_attention_backward,
    .gelu_forward = kn_cpu_gelu_forward,
    .gelu_backward = kn_cpu_gelu_backward,
    .residual_forward = kn_cpu_residual_forward,
    .accumulate = kn_cpu_accumulate,
    .softmax_crossentropy_forward = kn_cpu_softmax_crossentropy_forward,
    .crossentropy_softmax_backward = kn_cpu_crossentropy_softmax_backward,
    .crossentropy_forward = kn_cpu_crossentropy_forward,
    .crossentropy_backward = kn_cpu_crossentropy_backward,
    .adamw_update = kn_cpu_adamw_update,
    .adamw_update_spans = kn_cpu_adamw_update_spans,
    .matmul_backward_set = kn_cpu_matmul_backward_set,
    .sum_squares = kn_cpu_sum_squares,
    .sum = kn_cpu_sum,
    .copy = cpu_copy,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_free,
    .share = cpu_share,
    .populate = cpu_populate,
    .attention_state_floats = kn_cpu_attention_state_floats,
    .matmul_gelu_forward = kn_cpu_matmul_gelu_forward,
    .matmul_backward_gelu = kn_cpu_matmul_backward_gelu,
    .prof_begin = cpu_prof_begin,
    .prof_end = cpu_prof_end,
};

kn_ctx *kn_cpu_create(int threads, char *err, size_t errlen)
{
    kn_ctx *k = calloc(1, sizeof *k);
    if (!k) {
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    k->ops = &kn_cpu_ops;
    k->precision = "fp32";
    k->threads = threads > 0 ? threads : omp_get_num_procs();
    if (k->threads < 1) k->threads = 1;
    /* One pool of threads: OpenMP's. Matrix products are split across it and
     * each thread calls a single-threaded sgemm (see cpu.h). */
    openblas_set_num_threads(1);
    return k;
}
