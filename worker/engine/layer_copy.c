/* Layer copies: what a worker keeps from its previous engine, and where each tensor of
 * its new engine comes from (layer_copy.h). The copiers are in layer_copy_tcp.c and
 * layer_copy_xport.c. */
#include "layer_copy.h"

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

int pl_layer_copy_local(const pl_layer_copy_job *job, int *fresh, char *err, size_t errlen)
{
    const pl_engine *src = job->src;
    pl_engine *dst = job->dst;
    *fresh = 0;
    int missing = 0;
    for (int j = 0; j < dst->ntensors; j++) {
        if (pl_layer_copy_source(job->plan, pl_layer_copy_layer_of(dst, j))) continue;
        const pl_engine_tensor *t = &dst->tensors[j];
        const pl_engine *from = src;
        const pl_engine_tensor *st = src ? pl_engine_find(src, t->layer, t->index) : NULL;
        if (!st && job->shadow) { /* the shadow's layers, taken over (Bamboo §5.2) */
            from = job->shadow;
            st = pl_engine_find(from, t->layer, t->index);
        }
        if (!st) {
            missing++;
            continue;
        }
        const size_t nb = t->spec.numel * sizeof(float);
        kn_copy(dst->k, dst->params + t->offset, from->params + st->offset, nb);
        kn_copy(dst->k, dst->m + t->offset, from->m + st->offset, nb);
        kn_copy(dst->k, dst->v + t->offset, from->v + st->offset, nb);
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
