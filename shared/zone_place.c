/* Zone-aware placement (zone_place.h). */
#include "zone_place.h"

#include <stdlib.h>

/* Holders of each layer in each known zone (slot_zone[s]: the zone on slot s). */
static void count_holders(const pl_zone_shape *sh, const int *slot_zone, int nzones, int *cnt)
{
    int s = 0;
    for (int q = 0; q < sh->npipes; q++)
        for (int j = 0; j < sh->nnodes[q]; j++, s++) {
            const int z = slot_zone[s];
            for (int l = sh->bounds[q][j]; z >= 0 && l < sh->bounds[q][j + 1]; l++)
                cnt[l * nzones + z]++;
        }
}

int pl_zone_risk_of(const pl_zone_shape *sh, const int *slot_zone, int nzones, pl_zone_risk *r)
{
    *r = (pl_zone_risk){0};
    int *cnt = calloc((size_t)sh->nlayers * (size_t)(nzones > 0 ? nzones : 1), sizeof *cnt);
    int *unknown = calloc((size_t)sh->nlayers + 1, sizeof *unknown);
    if (!cnt || !unknown) {
        free(cnt);
        free(unknown);
        return -1;
    }
    count_holders(sh, slot_zone, nzones, cnt);
    int s = 0;
    for (int q = 0; q < sh->npipes; q++)
        for (int j = 0; j < sh->nnodes[q]; j++, s++) {
            for (int l = sh->bounds[q][j]; slot_zone[s] < 0 && l < sh->bounds[q][j + 1]; l++)
                unknown[l] = 1;
            r->neighbours += j > 0 && slot_zone[s] >= 0 && slot_zone[s] == slot_zone[s - 1];
        }
    for (int l = 0; l < sh->nlayers; l++) {
        int zones = 0;
        for (int z = 0; z < nzones; z++) {
            const int64_t k = cnt[l * nzones + z];
            zones += k > 0;
            r->crowding += k * k;
        }
        r->exposed += zones == 1 && !unknown[l];
    }
    free(cnt);
    free(unknown);
    return 0;
}

/* Marks the slots that hold an exposed layer or sit next to a stage of their zone. */
static int mark_bad(const pl_zone_shape *sh, const int *slot_zone, int nzones, char *bad)
{
    int *cnt = calloc((size_t)sh->nlayers * (size_t)(nzones > 0 ? nzones : 1), sizeof *cnt);
    if (!cnt)
        return -1;
    count_holders(sh, slot_zone, nzones, cnt);
    int s = 0;
    for (int q = 0; q < sh->npipes; q++)
        for (int j = 0; j < sh->nnodes[q]; j++, s++) {
            const int z = slot_zone[s];
            bad[s] = z >= 0 && ((j > 0 && slot_zone[s - 1] == z) ||
                                (j + 1 < sh->nnodes[q] && slot_zone[s + 1] == z));
            for (int l = sh->bounds[q][j]; z >= 0 && !bad[s] && l < sh->bounds[q][j + 1]; l++) {
                int others = 0;
                for (int y = 0; y < nzones; y++)
                    others += y != z && cnt[l * nzones + y] > 0;
                bad[s] = !others;
            }
        }
    free(cnt);
    return 0;
}

static void swap_ints(int *v, int x, int y)
{
    const int t = v[x];
    v[x] = v[y];
    v[y] = t;
}

/* A candidate swap of slots x and y: the copies it adds and the risk after it. */
typedef struct {
    int x, y;
    int64_t cost;
    pl_zone_risk risk;
} zswap;

/* The risk with the zones of slots x and y swapped (slot_zone is restored). */
static int risk_swapped(const pl_zone_shape *sh, int *slot_zone, int nzones, int x, int y,
                        pl_zone_risk *r)
{
    swap_ints(slot_zone, x, y);
    const int rc = pl_zone_risk_of(sh, slot_zone, nzones, r);
    swap_ints(slot_zone, x, y);
    return rc;
}

/* The next swap (pl_zone_improve's order) from a bad slot among the movable ones:
 * 1 and *out, 0 when there is none, −1 out of memory. */
static int next_swap(const pl_zone_shape *sh, int nzones, int *slot_zone, const char *bad,
                     const int *movable, int nmov, const pl_zone_price *price,
                     const pl_zone_risk *now, zswap *out)
{
    int found = 0;
    for (int a = 0; a < nmov; a++)
        for (int b = 0; b < nmov; b++) {
            zswap w = {.x = movable[a], .y = movable[b]};
            if (!bad[w.x] || slot_zone[w.x] == slot_zone[w.y])
                continue;
            w.cost = price ? price->added(price->ctx, w.x, w.y) : 0;
            if (w.cost > 0 && (now->exposed == 0 || w.cost > price->budget ||
                               (found && w.cost >= out->cost)))
                continue;
            if (risk_swapped(sh, slot_zone, nzones, w.x, w.y, &w.risk))
                return -1;
            if (w.cost <= 0 && pl_zone_risk_cmp(&w.risk, now) < 0) {
                *out = w;
                return 1;
            }
            if (w.cost > 0 && w.risk.exposed < now->exposed) {
                *out = w;
                found = 1;
            }
        }
    return found;
}

int pl_zone_improve(const pl_zone_shape *sh, int nzones, int *slot_zone, int *slot_item,
                    const int *movable, int nmov, const pl_zone_price *price)
{
    int nslots = 0;
    for (int q = 0; q < sh->npipes; q++)
        nslots += sh->nnodes[q];
    char *bad = malloc((size_t)nslots + 1);
    pl_zone_risk now;
    pl_zone_price left = price ? *price : (pl_zone_price){0};
    zswap w = {0};
    int rc = -1, found = 1;
    if (!bad || pl_zone_risk_of(sh, slot_zone, nzones, &now))
        goto out;
    while (found > 0 && (now.exposed > 0 || now.neighbours > 0)) {
        if (mark_bad(sh, slot_zone, nzones, bad))
            goto out;
        found = next_swap(sh, nzones, slot_zone, bad, movable, nmov, price ? &left : NULL,
                          &now, &w);
        if (found < 0)
            goto out;
        if (found) {
            swap_ints(slot_zone, w.x, w.y);
            swap_ints(slot_item, w.x, w.y);
            now = w.risk;
            left.budget -= w.cost > 0 ? w.cost : 0;
        }
    }
    rc = 0;
out:
    free(bad);
    return rc;
}

int pl_zone_risk_cmp(const pl_zone_risk *a, const pl_zone_risk *b)
{
    if (a->exposed != b->exposed) return a->exposed < b->exposed ? -1 : 1;
    if (a->neighbours != b->neighbours) return a->neighbours < b->neighbours ? -1 : 1;
    if (a->crowding != b->crowding) return a->crowding < b->crowding ? -1 : 1;
    return 0;
}

int pl_zone_place(const pl_zone_shape *sh, int ncand, const int *cand_zone, int nzones,
                  int *slot_cand)
{
    /* candidates grouped by zone (group 0: unknown, group z + 1: zone z), rank order kept */
    const int ng = nzones + 1;
    int *start = calloc((size_t)ng + 1, sizeof *start), *next = calloc((size_t)ng, sizeof *next);
    int *order = malloc((size_t)(ncand ? ncand : 1) * sizeof *order);
    int *cnt = calloc((size_t)sh->nlayers * (size_t)(nzones > 0 ? nzones : 1), sizeof *cnt);
    if (!start || !next || !order || !cnt) {
        free(start);
        free(next);
        free(order);
        free(cnt);
        return -1;
    }
    for (int k = 0; k < ncand; k++)
        start[cand_zone[k] + 2]++;
    for (int g = 1; g <= ng; g++)
        start[g] += start[g - 1];
    for (int g = 0; g < ng; g++)
        next[g] = start[g];
    for (int k = 0; k < ncand; k++)
        order[next[cand_zone[k] + 1]++] = k;
    for (int g = 0; g < ng; g++)
        next[g] = start[g];
    int s = 0;
    for (int q = 0; q < sh->npipes; q++)
        for (int j = 0; j < sh->nnodes[q]; j++, s++) {
            const int b = sh->bounds[q][j], e = sh->bounds[q][j + 1];
            const int prev = j ? cand_zone[slot_cand[s - 1]] : -1;
            int best = -1;
            int64_t best_cost = 0;
            for (int g = 0; g < ng; g++) {
                if (next[g] == start[g + 1])
                    continue;
                const int z = g - 1;
                /* crowding first (a layer's holders in one zone), then neighbours */
                int64_t cost = 0;
                for (int l = b; z >= 0 && l < e; l++)
                    cost += cnt[l * nzones + z];
                cost = 2 * cost + (z >= 0 && z == prev);
                if (best < 0 || cost < best_cost ||
                    (cost == best_cost && order[next[g]] < order[next[best]])) {
                    best = g;
                    best_cost = cost;
                }
            }
            slot_cand[s] = order[next[best]++];
            for (int l = b; best > 0 && l < e; l++)
                cnt[l * nzones + best - 1]++;
        }
    free(start);
    free(next);
    free(order);
    free(cnt);
    /* the greedy does not look ahead: its last stages may find only one zone left */
    int *sz = malloc(((size_t)s + 1) * sizeof *sz), *all = malloc(((size_t)s + 1) * sizeof *all);
    int rc = -1;
    if (sz && all) {
        for (int k = 0; k < s; k++) {
            sz[k] = cand_zone[slot_cand[k]];
            all[k] = k;
        }
        rc = pl_zone_improve(sh, nzones, sz, slot_cand, all, s, NULL);
    }
    free(sz);
    free(all);
    return rc;
}
