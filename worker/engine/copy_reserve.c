/* A worker's reserve for its copies: see copy_reserve.h. */
#include "copy_reserve.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util.h"

/* The helper's step: it notices a stop at the next one (a stop waits for the step, slow
 * to end at a low priority on busy cores), and each call holds the address-space lock
 * for a short time (kn_populate). */
#define STEP ((size_t)2 << 20)

size_t pl_reserve_size(int64_t reserve_bytes, int nlayers, size_t work_bytes)
{
    if (reserve_bytes <= 0) return 0;
    const size_t page = KN_SHARE_ALIGN, pad = 4 * (size_t)nlayers * page;
    const size_t four = (size_t)reserve_bytes / 3 * 4; /* params, m, v → grads too */
    return (four + pad + work_bytes + page - 1) / page * page;
}

/* At a low priority (nice 10: about a tenth of a core the training keeps busy, all of an
 * idle one): the reserve is ready a few steps after a plan change and slows those steps
 * little. At the lowest (19) five workers on two busy cores had it half made after three
 * steps. */
static void *reserve_main(void *arg)
{
    pl_reserve *r = arg;
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
    /* a descriptor table of its own, empty: the process's files close once its other
     * threads have ended, so a kill that finds this one waiting for a core at its low
     * priority does not keep the worker's connections open (seen: 1.3–2.5 s) */
    if (unshare(CLONE_FILES) == 0) (void)close_range(0, ~0U, 0);
    for (size_t at = atomic_load(&r->ready); at < r->bytes && !atomic_load(&r->stop); at += STEP) {
        const size_t n = r->bytes - at < STEP ? r->bytes - at : STEP;
        if (kn_populate(r->k, r->block + at, n)) break;
        if (at + n == r->bytes) r->ready_ms = pl_now_ms(); /* seen once ready is */
        atomic_store(&r->ready, at + n);
    }
    return NULL;
}

void pl_reserve_pause(pl_reserve *r)
{
    atomic_store(&r->stop, 1);
    if (r->running) pthread_join(r->th, NULL);
    r->running = 0;
}

/* The helper on from where it stopped, unless the block is all present. */
static void resume(pl_reserve *r)
{
    if (r->running || atomic_load(&r->ready) >= r->bytes) return;
    atomic_store(&r->stop, 0);
    r->running = pthread_create(&r->th, NULL, reserve_main, r) == 0;
}

void pl_reserve_free(pl_reserve *r)
{
    pl_reserve_pause(r);
    if (r->block) kn_free(r->k, r->block);
    r->block = NULL;
    r->bytes = r->used = 0;
    atomic_store(&r->ready, 0);
}

int pl_reserve_renew(pl_reserve *r, kn_ctx *k, size_t bytes)
{
    if (r->block && r->k == k && r->bytes == bytes && r->used == 0) {
        resume(r);
        return 0;
    }
    pl_reserve_free(r);
    r->k = k;
    /* a backend whose memory is always present has nothing to gain (and no kn_populate) */
    if (!bytes || kn_populate(k, NULL, 0)) return bytes ? -1 : 0;
    if (!(r->block = kn_alloc(k, bytes))) return -1;
    r->bytes = bytes;
    r->made_ms = pl_now_ms();
    r->ready_ms = 0;
    resume(r);
    return 1;
}

int pl_reserve_take(pl_reserve *r, void *block, size_t off, size_t bytes)
{
    pl_reserve_pause(r);
    if (!r->block || r->used + bytes > atomic_load(&r->ready) ||
        kn_share(r->k, block, off, r->block, r->used, bytes))
        return -1;
    r->used += bytes;
    return 0;
}

size_t pl_reserve_work_source(void *reserve, void *block, size_t off, size_t bytes)
{
    pl_reserve *r = reserve; /* pl_reserve_take pauses the helper; ready only grows */
    const size_t ready = r->block ? atomic_load(&r->ready) - r->used : 0;
    const size_t n = (ready < bytes ? ready : bytes) / KN_SHARE_ALIGN * KN_SHARE_ALIGN;
    return n && !pl_reserve_take(r, block, off, n) ? n : 0;
}
