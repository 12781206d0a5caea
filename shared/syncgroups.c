/* Per-layer gradient all-reduce groups between heterogeneous pipelines
 * (Oobleck §6.1; syncgroups.h). */
#include "syncgroups.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct {
    int rank, pipe, stage;
} rank_entry;

static int cmp_entry(const void *a, const void *b)
{
    const rank_entry *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    if (x->pipe != y->pipe) return x->pipe < y->pipe ? -1 : 1;
    return (x->stage > y->stage) - (x->stage < y->stage);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int validate(const pl_sync_pipeline *pipes, int np, int L, char *err, size_t errlen)
{
    if (L < 0) return pl_errf(err, errlen, "L: %d, must be at least 0", L);
    if (L > (1 << 24)) return pl_errf(err, errlen, "L: %d, too large", L);
    if (np < 1 || !pipes) return pl_errf(err, errlen, "pipelines: none given");
    int nlayers = L + 2;
    for (int p = 0; p < np; p++) {
        const pl_sync_pipeline *pp = &pipes[p];
        if (pp->nstages < 1 || !pp->stages)
            return pl_errf(err, errlen, "pipelines[%d]: no stages", p);
        int at = 0;
        for (int s = 0; s < pp->nstages; s++) {
            const pl_sync_stage *st = &pp->stages[s];
            int b = st->layer_begin, e = st->layer_end;
            if (st->rank < 0)
                return pl_errf(err, errlen, "pipelines[%d].stages[%d]: rank %d, must be >= 0", p,
                               s, st->rank);
            if (b < 0 || e > nlayers)
                return pl_errf(err, errlen,
                               "pipelines[%d].stages[%d]: layers [%d, %d) outside the model's "
                               "[0, %d)",
                               p, s, b, e, nlayers);
            if (b >= e)
                return pl_errf(err, errlen, "pipelines[%d].stages[%d]: empty layer range [%d, %d)",
                               p, s, b, e);
            if (b > at)
                return pl_errf(err, errlen,
                               "pipelines[%d].stages[%d]: starts at layer %d, layers [%d, %d) "
                               "are in no stage (stages must be contiguous and in order)",
                               p, s, b, at, b);
            if (b < at)
                return pl_errf(err, errlen,
                               "pipelines[%d].stages[%d]: layers [%d, %d) are also in "
                               "stages[%d] (each layer must be in exactly one stage, in order)",
                               p, s, b, e < at ? e : at, s - 1);
            at = e;
        }
        if (at != nlayers)
            return pl_errf(err, errlen,
                           "pipelines[%d]: ends at layer %d, layers [%d, %d) are in no stage", p,
                           at, at, nlayers);
    }
    return 0;
}

int pl_sync_key_order(int L, int key)
{
    if (key == PL_SYNC_WTE) return L + 2;
    if (key < 0 || key > L + 1) return -1;
    return L + 1 - key;
}

int pl_sync_key_name(int key, char *buf, size_t len)
{
    if (key == PL_SYNC_WTE) return snprintf(buf, len, "wte");
    return snprintf(buf, len, "layer.%d", key);
}

void pl_syncgroups_free(pl_syncgroups *g)
{
    if (!g) return;
    if (g->groups)
        for (int i = 0; i < g->ngroups; i++) free(g->groups[i].ranks);
    if (g->ranks)
        for (int i = 0; i < g->nranks; i++) free(g->ranks[i].keys);
    free(g->groups);
    free(g->ranks);
    memset(g, 0, sizeof *g);
}

static int same_set(const pl_sync_group *a, const pl_sync_group *b)
{
    return a->nranks == b->nranks && !memcmp(a->ranks, b->ranks, (size_t)a->nranks * sizeof(int));
}

int pl_syncgroups_compute(const pl_sync_pipeline *pipes, int np, int L, pl_syncgroups *out,
                          char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (validate(pipes, np, L, err, errlen)) return -1;

    int total = 0;
    for (int p = 0; p < np; p++) total += pipes[p].nstages;
    rank_entry *ent = pl_calloc((size_t)total, sizeof *ent);
    if (!ent) return pl_errf(err, errlen, "out of memory");
    int n = 0;
    for (int p = 0; p < np; p++)
        for (int s = 0; s < pipes[p].nstages; s++)
            ent[n++] = (rank_entry){pipes[p].stages[s].rank, p, s};
    qsort(ent, (size_t)n, sizeof *ent, cmp_entry);
    for (int i = 1; i < n; i++)
        if (ent[i].rank == ent[i - 1].rank) {
            pl_errf(err, errlen, "pipelines[%d].stages[%d]: rank %d already runs pipelines[%d].stages[%d]",
                    ent[i].pipe, ent[i].stage, ent[i].rank, ent[i - 1].pipe, ent[i - 1].stage);
            free(ent);
            return -1;
        }

    int nlayers = L + 2;
    out->L = L;
    out->ngroups = nlayers + 1;
    out->groups = pl_calloc((size_t)out->ngroups, sizeof *out->groups);
    out->nranks = n;
    out->ranks = pl_calloc((size_t)n, sizeof *out->ranks);
    if (!out->groups || !out->ranks) goto oom;

    /* Layer groups: one holder per pipeline. */
    for (int l = 0; l < nlayers; l++) {
        pl_sync_group *g = &out->groups[l];
        g->key = l;
        g->ranks = pl_calloc((size_t)np, sizeof *g->ranks);
        if (!g->ranks) goto oom;
    }
    for (int p = 0; p < np; p++)
        for (int s = 0; s < pipes[p].nstages; s++) {
            const pl_sync_stage *st = &pipes[p].stages[s];
            for (int l = st->layer_begin; l < st->layer_end; l++) {
                pl_sync_group *g = &out->groups[l];
                g->ranks[g->nranks++] = st->rank;
            }
        }
    for (int l = 0; l < nlayers; l++)
        qsort(out->groups[l].ranks, (size_t)out->groups[l].nranks, sizeof(int), cmp_int);
    /* wte: holders of layer 0 ∪ holders of layer L+1, both ascending. */
    {
        pl_sync_group *g = &out->groups[nlayers];
        const pl_sync_group *a = &out->groups[0], *b = &out->groups[nlayers - 1];
        g->key = PL_SYNC_WTE;
        g->ranks = pl_calloc((size_t)(a->nranks + b->nranks), sizeof *g->ranks);
        if (!g->ranks) goto oom;
        int i = 0, j = 0;
        while (i < a->nranks || j < b->nranks) {
            int r;
            if (j >= b->nranks || (i < a->nranks && a->ranks[i] < b->ranks[j])) r = a->ranks[i++];
            else if (i >= a->nranks || b->ranks[j] < a->ranks[i]) r = b->ranks[j++];
            else {
                r = a->ranks[i++];
                j++;
            }
            g->ranks[g->nranks++] = r;
        }
    }
    /* Distinct member sets and the largest group. */
    for (int i = 0; i < out->ngroups; i++) {
        pl_sync_group *g = &out->groups[i];
        g->set = -1;
        for (int j = 0; j < i && g->set < 0; j++)
            if (same_set(g, &out->groups[j])) g->set = out->groups[j].set;
        if (g->set < 0) g->set = out->nsets++;
        if (g->nranks > out->largest) out->largest = g->nranks;
    }
    /* Per rank, in the global order: its layers from the highest down, then wte. */
    for (int i = 0; i < n; i++) {
        const pl_sync_stage *st = &pipes[ent[i].pipe].stages[ent[i].stage];
        pl_sync_rank *r = &out->ranks[i];
        r->rank = st->rank;
        int has_wte = st->layer_begin == 0 || st->layer_end == nlayers;
        r->keys = pl_calloc((size_t)(st->layer_end - st->layer_begin + has_wte), sizeof *r->keys);
        if (!r->keys) goto oom;
        for (int l = st->layer_end - 1; l >= st->layer_begin; l--) r->keys[r->ngroups++] = l;
        if (has_wte) r->keys[r->ngroups++] = PL_SYNC_WTE;
    }
    free(ent);
    return 0;
oom:
    free(ent);
    pl_syncgroups_free(out);
    return pl_errf(err, errlen, "out of memory");
}

const pl_sync_group *pl_syncgroups_group(const pl_syncgroups *g, int key)
{
    if (key == PL_SYNC_WTE) return &g->groups[g->L + 2];
    if (key < 0 || key > g->L + 1) return NULL;
    return &g->groups[key];
}

const pl_sync_rank *pl_syncgroups_rank(const pl_syncgroups *g, int rank)
{
    int lo = 0, hi = g->nranks - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (g->ranks[mid].rank == rank) return &g->ranks[mid];
        if (g->ranks[mid].rank < rank) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

int pl_syncgroups_stats(const pl_syncgroups *g, int *largest)
{
    if (largest) *largest = g->largest;
    return g->nsets;
}
