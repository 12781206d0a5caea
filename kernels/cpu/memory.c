/* CPU backend memory: blocks, their memory files, ranges shared between blocks, and the
 * context's registry of live mapped blocks that decides what freeing a block releases. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu.h"

/* Allocations. Large blocks are mappings of a memory file of their own (memfd), zero by
 * the kernel's guarantee and faulted in page by page where first written (a new engine's
 * tensors are filled while layer copies arrive, never swept with zeros first), and a range
 * of one can be mapped into another (kn_cpu_share: a layer a worker keeps is not copied);
 * the block starts after a header page: its table of shared ranges (which file backs them:
 * a block shared again shares the right memory), then, right before the block, the 64-byte
 * header every block has. Small blocks come from the heap, zeroed here, after that 64-byte
 * header alone. */
#define HEAP_HDR 64
#define MAP_HDR ((size_t)KN_SHARE_ALIGN)
#define ALLOC_MAP_MIN ((size_t)64 << 10)
#define ALLOC_MAGIC_HEAP 0x706c6865u
#define ALLOC_MAGIC_MAP 0x706c6d61u

/* Which memory file: two fds of one file, the block's own and a duplicate, compare equal. */
typedef struct {
    dev_t dev;
    ino_t ino;
} file_id;

typedef struct {
    uint32_t magic;
    int fd;     /* the memory file; −1: an anonymous mapping (no memfd) */
    size_t len; /* of the whole mapping, header page included */
    file_id id; /* of fd */
    void *next; /* the next live mapped block of the context's registry (kn_cpu_ctx) */
} alloc_hdr;

_Static_assert(sizeof(alloc_hdr) <= HEAP_HDR, "the header fits before the block");

typedef struct {
    size_t off, len; /* the block's range, bytes */
    size_t foff;     /* where it is in fd */
    int fd;          /* a duplicate, closed with the block */
    file_id id;      /* of fd */
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

static kn_cpu_ctx *cpu_of(kn_ctx *k)
{
    return (kn_cpu_ctx *)k;
}

static int fd_id(int fd, file_id *id)
{
    struct stat st;
    if (fstat(fd, &st)) return -1;
    *id = (file_id){.dev = st.st_dev, .ino = st.st_ino};
    return 0;
}

static int same_file(file_id a, file_id b)
{
    return a.dev == b.dev && a.ino == b.ino;
}

/* A memory file of len bytes, −1 where the system gives none. */
static int new_file(size_t len, file_id *id)
{
    int fd = memfd_create("pliant", MFD_CLOEXEC);
    if (fd >= 0 && (ftruncate(fd, (off_t)len) || fd_id(fd, id))) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static void *map_block(kn_cpu_ctx *c, size_t n)
{
    const size_t len = MAP_HDR + (n + MAP_HDR - 1) / MAP_HDR * MAP_HDR;
    file_id id = {0};
    const int fd = new_file(len, &id);
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
    alloc_hdr *h = hdr_of(base + MAP_HDR);
    *h = (alloc_hdr){.magic = ALLOC_MAGIC_MAP, .fd = fd, .len = len, .id = id};
    if (fd < 0) return base + MAP_HDR; /* nothing can share it: no registry */
    pthread_mutex_lock(&c->lock);
    h->next = c->live;
    c->live = base + MAP_HDR;
    pthread_mutex_unlock(&c->lock);
    return base + MAP_HDR;
}

void *kn_cpu_alloc(kn_ctx *k, size_t bytes)
{
    size_t n = kn_round64(bytes);
    if (!n || n > SIZE_MAX / 2) return NULL;
    if (n >= ALLOC_MAP_MIN) return map_block(cpu_of(k), n);
    char *base = aligned_alloc(64, n + HEAP_HDR);
    if (!base) return NULL;
    memset(base + HEAP_HDR, 0, n);
    *(alloc_hdr *)base = (alloc_hdr){.magic = ALLOC_MAGIC_HEAP, .fd = -1, .len = n + HEAP_HDR};
    return base + HEAP_HDR;
}

/* What of a memory file a mapped block maps: [lo, hi) of the file id (fd). */
typedef struct {
    file_id id;
    int fd;
    size_t lo, hi;
} extent;

/* Extent i of mapped block p: 0 its own file, whole (the offsets under the ranges it imports
 * too: none of them is of use once the block is gone); i > 0 its shared range i − 1. 0 past
 * the last. */
static int extent_of(const void *p, int i, extent *e)
{
    const shared_table *t = table_of(p);
    if (i > t->n) return 0;
    const alloc_hdr *h = hdr_of(p);
    const shared_range *r = i ? &t->r[i - 1] : NULL;
    *e = r ? (extent){.id = r->id, .fd = r->fd, .lo = r->foff, .hi = r->foff + r->len}
           : (extent){.id = h->id, .fd = h->fd, .lo = 0, .hi = h->len};
    return 1;
}

/* Over the live blocks' extents of file id: the furthest end of those holding offset `at`
 * (`at` when none does), and in *next the nearest start past `at` (SIZE_MAX when none). */
static size_t cover(const kn_cpu_ctx *c, file_id id, size_t at, size_t *next)
{
    size_t end = at;
    extent e;
    *next = SIZE_MAX;
    for (const void *p = c->live; p; p = hdr_of(p)->next)
        for (int i = 0; extent_of(p, i, &e); i++) {
            if (!same_file(e.id, id)) continue;
            if (e.lo <= at && at < e.hi && e.hi > end) end = e.hi;
            if (e.lo > at && e.lo < *next) *next = e.lo;
        }
    return end;
}

/* Whether a live block maps any of file id. */
static int file_mapped(const kn_cpu_ctx *c, file_id id)
{
    size_t next;
    return cover(c, id, 0, &next) > 0 || next != SIZE_MAX;
}

/* Punches out of e's file the parts of e no live block maps: a range another block shares
 * keeps the whole file alive, and the rest of it would stay held. Nothing where no live
 * block maps the file at all: closing its last fd releases it whole. Under c->lock. */
static void release(const kn_cpu_ctx *c, const extent *e)
{
    size_t next, at = e->lo;
    if (!file_mapped(c, e->id)) return;
    while (at < e->hi) {
        const size_t end = cover(c, e->id, at, &next);
        if (end > at) {
            at = end;
            continue;
        }
        const size_t stop = next < e->hi ? next : e->hi;
        (void)fallocate(e->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)at,
                        (off_t)(stop - at));
        at = stop;
    }
}

static void unlink_block(kn_cpu_ctx *c, const void *p)
{
    for (void **at = &c->live; *at; at = &hdr_of(*at)->next)
        if (*at == p) {
            *at = hdr_of(p)->next;
            return;
        }
}

/* A mapped block freed: what no other live block maps released, the rest kept. Its own
 * file last: its header page, which holds the table, may be punched. */
static void free_mapped(kn_cpu_ctx *c, void *p)
{
    const alloc_hdr h = *hdr_of(p);
    extent e;
    if (h.fd >= 0) {
        pthread_mutex_lock(&c->lock);
        unlink_block(c, p);
        for (int i = 1; extent_of(p, i, &e); i++) {
            release(c, &e);
            close(e.fd);
        }
        if (extent_of(p, 0, &e)) release(c, &e);
        pthread_mutex_unlock(&c->lock);
    }
    munmap((char *)p - MAP_HDR, h.len);
    if (h.fd >= 0) close(h.fd);
}

void kn_cpu_free(kn_ctx *k, void *p)
{
    if (!p) return;
    const uint32_t magic = hdr_of(p)->magic;
    if (magic == ALLOC_MAGIC_MAP) {
        free_mapped(cpu_of(k), p);
    } else if (magic == ALLOC_MAGIC_HEAP) {
        free((char *)p - HEAP_HDR);
    } else {
        fprintf(stderr, "pliant kernels: freeing memory the CPU backend did not allocate\n");
        abort();
    }
}

/* The file and offset behind [off, off + len) of mapped block p: a shared range that holds
 * it all, else the block's own file where no shared range overlaps it; NULL otherwise. */
static const extent *backing(const void *p, size_t off, size_t len, extent *e)
{
    const shared_table *t = table_of(p);
    for (int i = 0; i < t->n; i++) {
        const shared_range *r = &t->r[i];
        if (off >= r->off && off + len <= r->off + r->len) {
            *e = (extent){.id = r->id, .fd = r->fd, .lo = r->foff + (off - r->off)};
            return e;
        }
        if (off < r->off + r->len && r->off < off + len) return NULL;
    }
    const alloc_hdr *h = hdr_of(p);
    *e = (extent){.id = h->id, .fd = h->fd, .lo = MAP_HDR + off};
    return e;
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

/* kn_share under the registry's lock (a free reads the tables a share writes). */
static int share_locked(void *dst_block, size_t dst_off, const void *src_block,
                        size_t src_off, size_t bytes)
{
    const alloc_hdr d = *hdr_of(dst_block), s = *hdr_of(src_block);
    shared_table *t = table_of(dst_block);
    extent src, own;
    if (d.magic != ALLOC_MAGIC_MAP || s.magic != ALLOC_MAGIC_MAP || d.fd < 0 || !bytes ||
        (dst_off | src_off | bytes) % MAP_HDR || dst_off + bytes > d.len - MAP_HDR ||
        src_off + bytes > s.len - MAP_HDR || t->n == SHARED_MAX ||
        !backing(dst_block, dst_off, bytes, &own) || own.fd != d.fd ||
        !backing(src_block, src_off, bytes, &src) || src.fd < 0)
        return -1;
    const int dup_fd = fcntl(src.fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) return -1;
    void *at = (char *)dst_block + dst_off;
    if (map_range(at, (const char *)src_block + src_off, bytes, dup_fd, src.lo) == 0) {
        t->r[t->n++] = (shared_range){
            .off = dst_off, .len = bytes, .foff = src.lo, .fd = dup_fd, .id = src.id};
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

/* kn_share: the memory behind the source's range mapped over the destination's range. */
int kn_cpu_share(kn_ctx *k, void *dst_block, size_t dst_off, const void *src_block,
                 size_t src_off, size_t bytes)
{
    kn_cpu_ctx *c = cpu_of(k);
    pthread_mutex_lock(&c->lock);
    const int rc = share_locked(dst_block, dst_off, src_block, src_off, bytes);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels answer EINVAL */
#endif

/* The pages of [lo, hi) faulted in for writing by the kernel, 64 MiB a call: a call holds
 * the process's address-space lock, which the other threads' mmap and munmap (a large
 * malloc, a thread's stack) wait for. */
static int populate_range(uintptr_t lo, uintptr_t hi)
{
    const uintptr_t step = (uintptr_t)64 << 20;
    for (uintptr_t at = lo; at < hi; at += step)
        if (madvise((void *)at, hi - at < step ? hi - at : step, MADV_POPULATE_WRITE)) return -1;
    return 0;
}

/* Populates the runs of [lo, hi) whose pages are not in this process's page tables
 * (/proc/self/pagemap's present bit), pagemap open as pm: a populate walking pages
 * already there costs 50–100 ms a GB, reading their pagemap entries about 15. */
static int populate_absent(int pm, uintptr_t lo, uintptr_t hi, uintptr_t page)
{
    uint64_t e[2048];
    uintptr_t run = 0; /* the start of the absent run being gathered; 0: none */
    for (uintptr_t at = lo; at < hi;) {
        const size_t n = (hi - at) / page < 2048 ? (size_t)((hi - at) / page) : 2048;
        if (pread(pm, e, n * sizeof *e, (off_t)(at / page * sizeof *e)) !=
            (ssize_t)(n * sizeof *e))
            return populate_range(run ? run : at, hi); /* unreadable: the rest as before */
        for (size_t i = 0; i < n; i++, at += page) {
            const int present = (int)(e[i] >> 63);
            if (!present && !run) run = at;
            if (present && run) {
                if (populate_range(run, at)) return -1;
                run = 0;
            }
        }
    }
    return run ? populate_range(run, hi) : 0;
}

/* kn_populate: the pages faulted in for writing by the kernel, contents kept (a memory
 * file's pages allocated and zeroed, a shared range's mapped); pages already present are
 * skipped (the new engine's work memory after a plan's copies mostly is). */
int kn_cpu_populate(kn_ctx *k, void *p, size_t bytes)
{
    (void)k;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t)p & ~(page - 1);
    const uintptr_t hi = ((uintptr_t)p + bytes + page - 1) & ~(page - 1);
    if (!bytes) return 0;
    const int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (pm < 0) return populate_range(lo, hi);
    const int rc = populate_absent(pm, lo, hi, page);
    close(pm);
    return rc;
}
