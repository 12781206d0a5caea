/* The populating helper of a receiver: see populate_ahead.h. */
#include "populate_ahead.h"

/* The helper's step within a range: it notices the receiver leaving the range at the next
 * step, and each call holds the address-space lock for a short time (kn_populate). */
#define STEP ((size_t)4 << 20)

/* Range i made present until the receiver has finished it (the helper began it first, so
 * it works ahead of the receiver's position in it); −1 where the backend cannot populate
 * (the helper stops: the receiver's writes fault the pages in). */
static int populate_range(pl_ahead *a, int i)
{
    void *p;
    size_t bytes;
    a->range(a->ctx, i, &p, &bytes);
    for (size_t off = 0; off < bytes && atomic_load(&a->reached) <= i + 1; off += STEP)
        if (kn_populate(a->k, (char *)p + off, bytes - off < STEP ? bytes - off : STEP))
            return -1;
    return 0;
}

static void *ahead_main(void *arg)
{
    pl_ahead *a = arg;
    /* a range the receiver has begun is skipped: starting it behind the receiver, the
     * helper would chase it over the same pages */
    for (int i = 0; i < a->n; i++)
        if (atomic_load(&a->reached) <= i && populate_range(a, i)) break;
    return NULL;
}

void pl_ahead_start(pl_ahead *a, kn_ctx *k, int n, pl_ahead_range range, void *ctx)
{
    *a = (pl_ahead){.k = k, .n = n, .range = range, .ctx = ctx};
    atomic_init(&a->reached, 0);
    a->running = n > 0 && pthread_create(&a->th, NULL, ahead_main, a) == 0;
}

void pl_ahead_reach(pl_ahead *a, int i)
{
    atomic_store(&a->reached, i + 1);
    if (a->running) return;
    void *p;
    size_t bytes;
    a->range(a->ctx, i, &p, &bytes);
    /* where the backend cannot, the pages come when written */
    kn_populate(a->k, p, bytes);
}

void pl_ahead_stop(pl_ahead *a)
{
    atomic_store(&a->reached, a->n + 1);
    if (a->running) pthread_join(a->th, NULL);
    a->running = 0;
}
