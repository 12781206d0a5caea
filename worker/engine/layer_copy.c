/* Layer copies: what a worker keeps from its previous engine, and where each tensor of
 * its new engine comes from (layer_copy.h). The copiers are in layer_copy_tcp.c and
 * layer_copy_xport.c. */
#include "layer_copy.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

int pl_layer_copy_layer_of(const pl_engine *e, int j)
{
    if (j == e->wte_tensor && !pl_engine_has_embedding(e)) return e->cfg.L + 1;
    return e->tensors[j].layer;
}

const char *pl_layer_copy_source(const pl_msg_plan *p, int layer)
{
    for (int i = 0; i < p->ncopies; i++)
        if (p->copies[i].layer == layer) return p->copies[i].source;
    return NULL;
}

int pl_layer_copy_check_parts(const pl_msg_plan *p, char *err, size_t errlen)
{
    /* per layer: its parts count (0: not copied) and the parts seen */
    unsigned char *n = calloc(2 * PL_PROTO_MAX_LAYERS, 1), *seen = n + PL_PROTO_MAX_LAYERS;
    if (!n) return pl_errf(err, errlen, "layer copy: out of memory");
    int rc = 0;
    for (int i = 0; i < p->ncopies && rc == 0; i++) {
        const pl_msg_copy *x = &p->copies[i];
        const int parts = x->parts > 1 ? x->parts : 1, part = x->parts > 1 ? x->part : 0;
        if (x->layer < 0 || x->layer >= PL_PROTO_MAX_LAYERS || parts > PL_PROTO_MAX_PARTS ||
            part < 0 || part >= parts)
            rc = pl_errf(err, errlen, "layer copy: copies[%d]: layer %d part %d of %d", i,
                         x->layer, part, parts);
        else if (n[x->layer] && n[x->layer] != parts)
            rc = pl_errf(err, errlen, "layer copy: copies[%d]: layer %d in %d parts, an earlier "
                         "entry has %d", i, x->layer, parts, n[x->layer]);
        else if (seen[x->layer] & (1u << part))
            rc = pl_errf(err, errlen, "layer copy: copies[%d]: part %d of layer %d listed twice",
                         i, part, x->layer);
        else
            n[x->layer] = (unsigned char)parts, seen[x->layer] |= (unsigned char)(1u << part);
    }
    for (int l = 0; l < PL_PROTO_MAX_LAYERS && rc == 0; l++)
        if (n[l] && seen[l] != (1u << n[l]) - 1)
            rc = pl_errf(err, errlen, "layer copy: layer %d: some of its %d parts have no copy",
                         l, n[l]);
    free(n);
    return rc;
}

int pl_layer_copy_layers(const pl_msg_plan *p)
{
    int n = 0;
    for (int i = 0; i < p->ncopies; i++) n += p->copies[i].parts <= 1 || p->copies[i].part == 0;
    return n;
}

void pl_layer_copy_part_span(size_t numel, int part, int parts, size_t *off, size_t *n)
{
    if (parts <= 1) part = 0, parts = 1;
    *off = numel * (size_t)part / (size_t)parts;
    *n = numel * (size_t)(part + 1) / (size_t)parts - *off;
}

/* The local engine that holds tensor t of dst (src, else the shadow) and its tensor there. */
static const pl_engine *local_holder(const pl_layer_copy_job *job, const pl_engine_tensor *t,
                                     const pl_engine_tensor **st)
{
    *st = job->src ? pl_engine_find(job->src, t->layer, t->index) : NULL;
    if (*st) return job->src;
    if (!job->shadow) return NULL; /* the shadow's layers, taken over (Bamboo §5.2) */
    *st = pl_engine_find(job->shadow, t->layer, t->index);
    return *st ? job->shadow : NULL;
}

/* The block of dst's tensors [j, *end): one layer's (or the head's wte), engine.h. */
static int block_end(const pl_engine *dst, int j)
{
    int k = j + 1;
    while (k < dst->ntensors && dst->tensors[k].index != 0) k++;
    return k;
}

/* Floats from block j's first tensor to the page after block k − 1's last: blocks [j, k)
 * with the padding after each (engine.h: each block starts on a page). */
static size_t blocks_span(const pl_engine *dst, int j, int k)
{
    const pl_engine_tensor *dl = &dst->tensors[k - 1];
    return pl_engine_align_layer(dl->offset + dl->spec.numel) - dst->tensors[j].offset;
}

/* Block [j, k) of dst from the engine that holds all of it, when both lay it out alike:
 * each of params, m, v mapped (kn_share: the same pages, no copy), else copied as one span.
 * −1 when no one local engine holds the block alike (the caller copies tensor by tensor). */
static int share_block(const pl_layer_copy_job *job, int j, int k)
{
    pl_engine *dst = job->dst;
    const pl_engine_tensor *s0 = NULL, *st = NULL;
    const pl_engine *from = NULL;
    for (int i = j; i < k; i++) {
        const pl_engine_tensor *t = &dst->tensors[i];
        const pl_engine *f = local_holder(job, t, &st);
        if (!f || (from && f != from)) return -1;
        if (!from) from = f, s0 = st;
        if (st->offset - s0->offset != t->offset - dst->tensors[j].offset) return -1;
    }
    const size_t span = blocks_span(dst, j, k);
    const pl_engine_tensor *sl = pl_engine_find(from, s0->layer, s0->index + (k - 1 - j));
    if (!sl || pl_engine_align_layer(sl->offset + sl->spec.numel) - s0->offset != span) return -1;
    const size_t d = dst->tensors[j].offset, o = s0->offset, nb = span * sizeof(float);
    float *da[3] = {dst->params, dst->m, dst->v};
    const float *sa[3] = {from->params, from->m, from->v};
    for (int a = 0; a < 3; a++)
        if (kn_share(dst->k, da[a], d * sizeof(float), sa[a], o * sizeof(float), nb))
            kn_copy(dst->k, da[a] + d, sa[a] + o, nb);
    /* gradients too where it can: their values do not matter (the first step zeroes them,
     * and the old engine's are never read again), its pages are already in memory */
    (void)kn_share(dst->k, dst->grads, d * sizeof(float), from->grads, o * sizeof(float), nb);
    return 0;
}

/* Copies tensor t of dst from its local holder; 0, or −1 when none holds it. */
static int copy_tensor(const pl_layer_copy_job *job, const pl_engine_tensor *t)
{
    const pl_engine_tensor *st;
    const pl_engine *from = local_holder(job, t, &st);
    if (!from) return -1;
    const size_t nb = t->spec.numel * sizeof(float);
    kn_copy(job->dst->k, job->dst->params + t->offset, from->params + st->offset, nb);
    kn_copy(job->dst->k, job->dst->m + t->offset, from->m + st->offset, nb);
    kn_copy(job->dst->k, job->dst->v + t->offset, from->v + st->offset, nb);
    return 0;
}

/* The received block at j: its layer has a copy in the plan. */
static int received(const pl_layer_copy_job *job, int j)
{
    return pl_layer_copy_source(job->plan, pl_layer_copy_layer_of(job->dst, j)) != NULL;
}

int pl_layer_copy_local(const pl_layer_copy_job *job, int *fresh, char *err, size_t errlen)
{
    const pl_engine *src = job->src;
    pl_engine *dst = job->dst;
    *fresh = 0;
    int missing = 0;
    for (int j = 0, k; j < dst->ntensors; j = k) {
        k = block_end(dst, j);
        if (received(job, j)) continue;
        if (share_block(job, j, k) == 0) continue;
        for (int i = j; i < k; i++) missing += copy_tensor(job, &dst->tensors[i]) != 0;
    }
    if (missing == dst->ntensors && !src && job->plan->ncopies == 0) {
        *fresh = 1; /* the job's first plan: nothing held, nothing to copy */
        return 0;
    }
    if (missing)
        return pl_errf(err, errlen, "layers [%d, %d): %d tensors have neither a local copy nor "
                       "a source", dst->begin, dst->end, missing);
    return 0;
}

int pl_layer_copy_take_reserve(const pl_layer_copy_job *job)
{
    pl_engine *dst = job->dst;
    /* the arrays the stream writes, then the gradients, which only the next step needs and
     * which are otherwise made present after the copies */
    float *arr[4] = {dst->params, dst->m, dst->v, dst->grads};
    if (!job->reserve) return -1;
    for (int a = 0; a < 4; a++)
        for (int j = 0, k; j < dst->ntensors; j = k) {
            k = block_end(dst, j);
            if (received(job, j) &&
                pl_reserve_take(job->reserve, arr[a], dst->tensors[j].offset * sizeof(float),
                                blocks_span(dst, j, k) * sizeof(float)))
                return a < 3 ? -1 : 0;
        }
    return 0;
}
