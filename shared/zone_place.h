/* Zone-aware placement of workers on a plan's pipeline stages.
 *
 * Simultaneous preemptions come from one zone (Bamboo §3), so a plan is placed such that
 * losing any one zone is not fatal:
 * - templates (Oobleck §4): every layer has a holder in each of its F + 1 or more
 *   pipelines; those holders are spread over the zones, so with zones ≥ 2 and each layer
 *   held twice or more, a zone's loss leaves every layer a live holder;
 * - redundant computation (Bamboo §5.1): a stage's shadow is held by its neighbour in the
 *   pipeline, so neighbours are put in different zones.
 *
 * A plan's shape: pipeline q has nnodes[q] stages, stage j running layers
 * [bounds[q][j], bounds[q][j + 1]). A slot is (q, j), numbered pipeline after pipeline.
 * Zones are ids 0 .. nzones − 1, −1 unknown (an unknown zone is never the same as
 * another, known or not). Pure functions; the caller owns every array. */
#ifndef PL_ZONE_PLACE_H
#define PL_ZONE_PLACE_H

#include <stdint.h>

typedef struct {
    int nlayers, npipes;
    const int *nnodes;         /* npipes stage counts */
    const int *const *bounds;  /* npipes arrays of nnodes[q] + 1 layer bounds */
} pl_zone_shape;

/* How exposed a placement is to a zone's loss, most important first:
 * - exposed: layers whose holders are all in one known zone (its loss is fatal);
 * - neighbours: consecutive stages of a pipeline in one known zone, the last and the first
 *   of 3 or more stages included (their ring: Bamboo §5.1) (the loss of a stage
 *   and its shadow holder: redundant computation cannot fail over);
 * - crowding: Σ over layers and zones of (holders of the layer in the zone)², smallest
 *   when every layer's holders are spread evenly. */
typedef struct {
    int64_t exposed, neighbours, crowding;
} pl_zone_risk;

/* The risk of the placement that puts a worker of zone slot_zone[s] on slot s. 0, or −1
 * out of memory. */
int pl_zone_risk_of(const pl_zone_shape *sh, const int *slot_zone, int nzones, pl_zone_risk *r);

/* < 0, 0, > 0 as a is less exposed than, as exposed as, more exposed than b. */
int pl_zone_risk_cmp(const pl_zone_risk *a, const pl_zone_risk *b);

/* What swapping the workers of slots x and y adds to a plan's copies, in bytes (≤ 0: nothing;
 * asked before the swap, slot_item as it stands then: pl_zone_improve permutes it in place),
 * and how many such bytes the swaps that leave fewer layers exposed may add in all. ctx is
 * the caller's, borrowed. */
typedef struct {
    int64_t (*added)(void *ctx, int x, int y);
    void *ctx;
    int64_t budget;
} pl_zone_price;

/* Swaps between the movable slots (movable[0 .. nmov)) while the plan holds an exposed
 * layer or same-zone neighbours, each involving such a slot (slot_zone and slot_item
 * permuted alike), until none is left:
 * - first a swap that adds no copies and leaves the plan less exposed;
 * - else, while a layer is exposed, the swap that adds the fewest copies within what is
 *   left of price->budget and leaves fewer layers exposed.
 * price NULL: every swap is free. 0, or −1 out of memory. */
int pl_zone_improve(const pl_zone_shape *sh, int nzones, int *slot_zone, int *slot_item,
                    const int *movable, int nmov, const pl_zone_price *price);

/* A fresh placement: slot s gets candidate slot_cand[s] (an index into 0 .. ncand − 1,
 * candidates in rank order, cand_zone[k] the zone of candidate k). Slot after slot, the
 * zone that adds the least crowding over the stage's layers, then one that differs from
 * the previous stage's, then the lowest-ranked candidate; without zones, rank order.
 * Then pl_zone_improve over every slot, as the greedy does not look ahead.
 * ncand ≥ the number of slots. 0, or −1 out of memory. */
int pl_zone_place(const pl_zone_shape *sh, int ncand, const int *cand_zone, int nzones,
                  int *slot_cand);

#endif
