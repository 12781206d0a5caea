#include "worker_step.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

int pl_worker_group_tensors(const pl_engine *e, int key, pl_tensor_ref *refs)
{
    int n = 0;
    if (key == PL_SYNC_WTE) {
        if (e->wte_tensor < 0) return 0;
        const pl_engine_tensor *t = &e->tensors[e->wte_tensor];
        refs[n++] = (pl_tensor_ref){e->grads + t->offset, t->spec.numel};
        return n;
    }
    for (int i = 0; i < e->ntensors && n < PL_MAX_LAYER_TENSORS; i++) {
        const pl_engine_tensor *t = &e->tensors[i];
        if (i == e->wte_tensor || t->layer != key) continue;
        refs[n++] = (pl_tensor_ref){e->grads + t->offset, t->spec.numel};
    }
    return n;
}

/* All-reduces one group's tensors. On the CPU backend the gradients are host memory and
 * are reduced in place; elsewhere they go through a host buffer. */
static int reduce_group(const pl_worker_step_args *a, const pl_sync_group *g, uint32_t tag,
                        char *err, size_t errlen)
{
    pl_engine *e = a->engine;
    pl_tensor_ref refs[PL_MAX_LAYER_TENSORS];
    int n = pl_worker_group_tensors(e, g->key, refs);
    if (n == 0) {
        char name[32];
        pl_sync_key_name(g->key, name, sizeof name);
        return pl_errf(err, errlen, "worker step: rank %d is in group %s but holds none of it",
                       (int)a->peers->self, name);
    }
    if (g->nranks == 1) return 0;
    int32_t *group = malloc((size_t)g->nranks * sizeof *group);
    if (!group) return pl_errf(err, errlen, "worker step: out of memory");
    for (int i = 0; i < g->nranks; i++) group[i] = g->ranks[i];
    const int host = strcmp(kn_backend(e->k), "cpu") == 0;
    pl_tensor_ref staged[PL_MAX_LAYER_TENSORS];
    float *buf = NULL;
    int rc = 0;
    if (host) {
        memcpy(staged, refs, (size_t)n * sizeof *refs);
    } else {
        size_t total = 0;
        for (int i = 0; i < n; i++) total += refs[i].count;
        buf = malloc(total * sizeof *buf);
        if (!buf) {
            free(group);
            return pl_errf(err, errlen, "worker step: out of memory");
        }
        size_t off = 0;
        for (int i = 0; i < n; i++) {
            kn_to_host(e->k, buf + off, refs[i].data, refs[i].count * sizeof(float));
            staged[i] = (pl_tensor_ref){buf + off, refs[i].count};
            off += refs[i].count;
        }
    }
    char msg[256];
    if (pl_ring_allreduce_many(a->peers, group, g->nranks, staged, n, tag, a->timeout_ms, msg,
                               sizeof msg) != 0) {
        char name[32];
        pl_sync_key_name(g->key, name, sizeof name);
        rc = pl_errf(err, errlen, "worker step: all-reduce of %s: %s", name, msg);
    } else if (!host) {
        for (int i = 0; i < n; i++)
            kn_to_device(e->k, refs[i].data, staged[i].data, refs[i].count * sizeof(float));
    }
    free(buf);
    free(group);
    return rc;
}

int pl_worker_step(const pl_worker_step_args *a, pl_worker_step_result *out, char *err,
                   size_t errlen)
{
    pl_engine *e = a->engine;
    const pl_schedule *s = a->schedule;
    memset(out, 0, sizeof *out);
    if (a->first_micro < 0 || a->first_micro + s->nmicro > a->global_micro)
        return pl_errf(err, errlen,
                       "worker step: microbatches [%d, %d) outside the step's %d",
                       a->first_micro, a->first_micro + s->nmicro, a->global_micro);
    const pl_sync_rank *me = pl_syncgroups_rank(a->groups, (int)a->peers->self);
    if (!me)
        return pl_errf(err, errlen, "worker step: rank %d runs no stage in the plan",
                       (int)a->peers->self);

    pl_engine_zero_grads(e);
    const size_t BT = (size_t)e->B * (size_t)e->T, off = (size_t)a->first_micro * BT;
    pl_stage_batch batch = {
        pl_engine_has_embedding(e) && a->tokens ? a->tokens + off : NULL,
        pl_engine_has_head(e) && a->targets ? a->targets + off : NULL,
        1.0f / (float)((double)a->global_micro * (double)BT),
    };
    if (pl_engine_has_embedding(e) && !batch.tokens)
        return pl_errf(err, errlen, "worker step: the stage has the embedding and needs tokens");
    if (pl_engine_has_head(e) && !batch.targets)
        return pl_errf(err, errlen, "worker step: the stage has the head and needs targets");
    double loss = 0;
    if (pl_stage_step(e, s, a->link, &batch, &loss, err, errlen) != 0) return -1;

    const int L = a->groups->L, ngroups_total = L + 3;
    double sumsq = 0;
    for (int i = 0; i < me->ngroups; i++) {
        const pl_sync_group *g = pl_syncgroups_group(a->groups, me->keys[i]);
        if (!g) return pl_errf(err, errlen, "worker step: unknown sync group key %d", me->keys[i]);
        uint32_t tag = a->step * (uint32_t)ngroups_total + (uint32_t)pl_sync_key_order(L, g->key);
        if (reduce_group(a, g, tag, err, errlen) != 0) return -1;
        if (g->ranks[0] == (int)a->peers->self) {
            pl_tensor_ref refs[PL_MAX_LAYER_TENSORS];
            int n = pl_worker_group_tensors(e, g->key, refs);
            for (int j = 0; j < n; j++) sumsq += kn_sum_squares(e->k, refs[j].data, refs[j].count);
        }
    }
    out->grad_sumsq = sumsq;
    out->has_loss = pl_engine_has_head(e);
    out->loss_sum = out->has_loss ? loss : 0;
    return 0;
}

void pl_worker_apply(pl_engine *e, const pl_adamw *o, float grad_scale, int t)
{
    pl_engine_adamw(e, o, grad_scale, t);
}
