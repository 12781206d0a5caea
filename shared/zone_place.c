/* Zone-aware placement (zone_place.h). */
#include "zone_place.h"

#include <stdlib.h>

/* The counts behind a placement's risk, kept up to date as its slots swap zones, so that a
 * swap's risk costs its two stages' layers and neighbours rather than the whole plan. */
typedef struct {
    int nzones, nslots, nlayers;
    int *lo, *hi;   /* slot s runs layers [lo[s], hi[s]) */
    int *prev;      /* the slot before s on its pipeline's ring (−1: none), and after it */
    int *next;
    int *cnt;       /* holders of layer l in zone z: cnt[l * nzones + z] */
    int *unknown;   /* holders of layer l in no known zone */
} zcount;

static void zcount_free(zcount *c)
{
    free(c->lo);
    free(c->hi);
    free(c->prev);
    free(c->next);
    free(c->cnt);
    free(c->unknown);
}

/* Adds sign × slot s (of zone z) to the holders of its layers. */
static void count_slot(zcount *c, int s, int z, int sign)
{
    for (int l = c->lo[s]; l < c->hi[s]; l++) {
        if (z >= 0)
            c->cnt[l * c->nzones + z] += sign;
        else
            c->unknown[l] += sign;
    }
}

/* Slot s is stage j of a pipeline of n: its ring's neighbours (Bamboo §5.1: the last
 * stage holds the first's layers, so with 3 or more stages the last and the first are
 * neighbours too; with 2 the one pair is counted once). */
static void ring_neighbours(zcount *c, int s, int j, int n)
{
    c->prev[s] = j > 0 ? s - 1 : n > 2 ? s + n - 1 : -1;
    c->next[s] = j + 1 < n ? s + 1 : n > 2 ? s - n + 1 : -1;
}

static int zcount_init(zcount *c, const pl_zone_shape *sh, const int *slot_zone, int nzones)
{
    int n = 0;
    for (int q = 0; q < sh->npipes; q++)
        n += sh->nnodes[q];
    *c = (zcount){.nzones = nzones, .nslots = n, .nlayers = sh->nlayers};
    c->lo = malloc(((size_t)n + 1) * sizeof *c->lo);
    c->hi = malloc(((size_t)n + 1) * sizeof *c->hi);
    c->prev = malloc(((size_t)n + 1) * sizeof *c->prev);
    c->next = malloc(((size_t)n + 1) * sizeof *c->next);
    c->cnt = calloc((size_t)sh->nlayers * (size_t)(nzones > 0 ? nzones : 1) + 1, sizeof *c->cnt);
    c->unknown = calloc((size_t)sh->nlayers + 1, sizeof *c->unknown);
    if (!c->lo || !c->hi || !c->prev || !c->next || !c->cnt || !c->unknown) {
        zcount_free(c);
        return -1;
    }
    for (int q = 0, s = 0; q < sh->npipes; q++)
        for (int j = 0; j < sh->nnodes[q]; j++, s++) {
            c->lo[s] = sh->bounds[q][j];
            c->hi[s] = sh->bounds[q][j + 1];
            ring_neighbours(c, s, j, sh->nnodes[q]);
            count_slot(c, s, slot_zone[s], 1);
        }
    return 0;
}

/* Adds layer l's exposure and crowding to r. */
static void layer_risk(const zcount *c, int l, pl_zone_risk *r)
{
    int zones = 0;
    for (int z = 0; z < c->nzones; z++) {
        const int64_t k = c->cnt[l * c->nzones + z];
        zones += k > 0;
        r->crowding += k * k;
    }
    r->exposed += zones == 1 && !c->unknown[l];
}

/* 1 when slot s and the stage before it on its pipeline's ring are in one known zone. */
static int same_as_previous(const zcount *c, const int *slot_zone, int s)
{
    return s >= 0 && c->prev[s] >= 0 && slot_zone[s] >= 0 && slot_zone[s] == slot_zone[c->prev[s]];
}

static void zcount_risk(const zcount *c, const int *slot_zone, pl_zone_risk *r)
{
    *r = (pl_zone_risk){0};
    for (int l = 0; l < c->nlayers; l++)
        layer_risk(c, l, r);
    for (int s = 0; s < c->nslots; s++)
        r->neighbours += same_as_previous(c, slot_zone, s);
}

int pl_zone_risk_of(const pl_zone_shape *sh, const int *slot_zone, int nzones, pl_zone_risk *r)
{
    zcount c;
    if (zcount_init(&c, sh, slot_zone, nzones))
        return -1;
    zcount_risk(&c, slot_zone, r);
    zcount_free(&c);
    return 0;
}

static void swap_ints(int *v, int x, int y)
{
    const int t = v[x];
    v[x] = v[y];
    v[y] = t;
}

/* Swaps the zones of slots x and y, counts and all. */
static void swap_zones(zcount *c, int *slot_zone, int x, int y)
{
    count_slot(c, x, slot_zone[x], -1);
    count_slot(c, y, slot_zone[y], -1);
    swap_ints(slot_zone, x, y);
    count_slot(c, x, slot_zone[x], 1);
    count_slot(c, y, slot_zone[y], 1);
}

/* sign × the risk of what a swap of slots x and y touches, into r: the layers of either
 * (each once) and the neighbour pairs that end at x, after x, y or after y (each once). */
static void touched_risk(const zcount *c, const int *slot_zone, int x, int y, int sign,
                         pl_zone_risk *r)
{
    pl_zone_risk t = {0};
    const int b = c->lo[x] < c->lo[y] ? c->lo[x] : c->lo[y];
    const int e = c->hi[x] > c->hi[y] ? c->hi[x] : c->hi[y];
    for (int l = b; l < e; l++)
        if ((c->lo[x] <= l && l < c->hi[x]) || (c->lo[y] <= l && l < c->hi[y]))
            layer_risk(c, l, &t);
    const int ends[4] = {x, c->next[x], y, c->next[y]};
    for (int k = 0; k < 4; k++) {
        int seen = 0;
        for (int i = 0; i < k; i++)
            seen |= ends[i] == ends[k];
        t.neighbours += !seen && same_as_previous(c, slot_zone, ends[k]);
    }
    r->exposed += sign * t.exposed;
    r->neighbours += sign * t.neighbours;
    r->crowding += sign * t.crowding;
}

/* now's risk with the zones of slots x and y swapped (c and slot_zone are restored). */
static void risk_swapped(zcount *c, int *slot_zone, int x, int y, const pl_zone_risk *now,
                         pl_zone_risk *r)
{
    *r = *now;
    touched_risk(c, slot_zone, x, y, -1, r);
    swap_zones(c, slot_zone, x, y);
    touched_risk(c, slot_zone, x, y, 1, r);
    swap_zones(c, slot_zone, x, y);
}

/* Marks the slots that hold an exposed layer or sit next to a stage of their zone. */
static void mark_bad(const zcount *c, const int *slot_zone, char *bad)
{
    for (int s = 0; s < c->nslots; s++) {
        const int z = slot_zone[s];
        bad[s] = z >= 0 && (same_as_previous(c, slot_zone, s) ||
                            same_as_previous(c, slot_zone, c->next[s]));
        for (int l = c->lo[s]; z >= 0 && !bad[s] && l < c->hi[s]; l++) {
            int others = c->unknown[l];
            for (int y = 0; y < c->nzones; y++)
                others += y != z && c->cnt[l * c->nzones + y] > 0;
            bad[s] = !others;
        }
    }
}

/* A candidate swap of slots x and y: the copies it adds and the risk after it. */
typedef struct {
    int x, y;
    int64_t cost;
    pl_zone_risk risk;
} zswap;

/* The next swap (pl_zone_improve's order) from a bad slot among the movable ones:
 * 1 and *out, or 0 when there is none. */
static int next_swap(zcount *c, int *slot_zone, const char *bad, const int *movable, int nmov,
                     const pl_zone_price *price, const pl_zone_risk *now, zswap *out)
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
            risk_swapped(c, slot_zone, w.x, w.y, now, &w.risk);
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
    zcount c;
    if (zcount_init(&c, sh, slot_zone, nzones))
        return -1;
    char *bad = malloc((size_t)c.nslots + 1);
    pl_zone_price left = price ? *price : (pl_zone_price){0};
    pl_zone_risk now;
    zswap w = {0};
    zcount_risk(&c, slot_zone, &now);
    for (int found = bad != NULL; found && (now.exposed > 0 || now.neighbours > 0);) {
        mark_bad(&c, slot_zone, bad);
        found = next_swap(&c, slot_zone, bad, movable, nmov, price ? &left : NULL, &now, &w);
        if (found) {
            swap_zones(&c, slot_zone, w.x, w.y);
            swap_ints(slot_item, w.x, w.y);
            now = w.risk;
            left.budget -= w.cost > 0 ? w.cost : 0;
        }
    }
    const int rc = bad ? 0 : -1;
    free(bad);
    zcount_free(&c);
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
