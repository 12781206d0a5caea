/* Pipeline re-instantiation (Oobleck §5.1, appendix B): after nodes leave or
 * join, rebuild the pipelines from the templates (simple re-instantiation, then
 * borrowing nodes, then merging pipelines), map nodes to template positions so
 * that the fewest bytes move (then, where zones are known, by zone: see
 * pl_reinstantiate), and plan which surviving node sends each missing layer. Pure and deterministic: the same input gives the same output. */
#ifndef PLIANT_REINSTANTIATE_H
#define PLIANT_REINSTANTIATE_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "coverage.h"
#include "profile.h"
#include "templates.h"

/* One running pipeline. It was instantiated from the template for nnodes
 * nodes; nodes[i] runs that template's node index i (stage order). */
typedef struct {
    int nnodes;
    char **nodes;
} pl_current_pipeline;

typedef struct {
    int npipelines;
    pl_current_pipeline *pipelines;
    /* removed nodes that can still send their layers while the new plan installs (a
     * preemption notice's grace period): no place in the new plan, but holders for the
     * copies (those of a live holder first) and for the fatal-loss check. Borrowed, not
     * freed by pl_current_plan_free; NULL, 0: none. */
    const char *const *departing;
    int ndeparting;
    /* the nodes' zones, for zone-aware placement (zone_place.h): node zoned[k] is in zone
     * zone_of[k] (0 .. nzones − 1, −1 unknown); names neither current nor added are
     * ignored, nodes not listed are in no known zone. Borrowed, not freed by
     * pl_current_plan_free; nzones 0: no zone known (placed by the copies alone). */
    const char *const *zoned;
    const int *zone_of;
    int nzoned, nzones;
} pl_current_plan;

/* Parses {"pipelines": [{"nodes": ["a", "b"]}, ...]}. Node names must be
 * non-empty and unique. On error returns -1 and names the path in err
 * (e.g. "pipelines[1].nodes[0]: must be a string"). */
int pl_current_parse(const char *json, pl_current_plan *out, char *err, size_t errlen);
void pl_current_plan_free(pl_current_plan *c);

typedef struct {
    int template_nodes;         /* the template this pipeline runs (pl_template_for) */
    const char **nodes;         /* template_nodes names; nodes[i] runs template node index i */
    int64_t microbatches;
    int64_t iteration_ns;       /* this pipeline's time for its microbatches */
} pl_reinst_pipeline;

/* A large layer with several surviving holders is copied in parts, one from each of
 * up to PL_COPY_MAX_PARTS holders at once, so that its bytes rather than whole layers
 * are spread over the holders' links: part k of n is, of every tensor of the layer
 * (weights, Adam m and v), the elements [numel·k/n, numel·(k+1)/n). A layer is split
 * into parts of at least PL_COPY_PART_MIN_BYTES. */
#define PL_COPY_MAX_PARTS 8
#define PL_COPY_PART_MIN_BYTES ((int64_t)16 << 20)

typedef struct {
    int layer;
    int part, parts;            /* part `part` of `parts` (0 of 1: the whole layer) */
    const char *source;         /* a surviving node that held the layer before the change */
    int64_t bytes;              /* of weights + Adam m and v (3 × param_bytes in all) */
} pl_layer_copy;

typedef struct {
    const char *node;           /* a node that must receive layers */
    int nlayers;
    pl_layer_copy *layers;      /* ascending (layer, part) order */
    int64_t bytes;
} pl_node_copy;

/* Pipelines keep the current plan's order (a merged one takes the earlier
 * place); pipelines formed from free nodes come last. */
typedef struct {
    int npipelines;             /* 0 when fatal or insufficient_nodes */
    pl_reinst_pipeline *pipelines;
    int64_t iteration_ns;       /* makespan of one step */
    int ncopies;                /* only nodes with something to receive */
    pl_node_copy *copies;
    int64_t bytes_to_copy;
    int nidle;                  /* live nodes in no pipeline (all of them when there is no plan) */
    const char **idle_nodes;
    int fatal;                  /* some layer has no surviving holder */
    int nlost;
    int *lost_layers;
    int insufficient_nodes;     /* fewer than (tolerate+1)·n0 live nodes */
    int nsteps;                 /* what was done, in order; pipeline numbers are */
    char **steps;               /* indices in the current plan */
    char *names_;               /* storage behind every name above */
} pl_reinstantiation;

/* Re-instantiates `cur` after removing `removed` and adding `added` (names).
 * p and ts are the profile and templates the current plan was built from;
 * cov, when not NULL, is their coverage table (pl_coverage_compute for the
 * same tolerate and batch): the target plan is looked up there instead of
 * being computed, which keeps re-instantiation within milliseconds;
 * global_batch is split into microbatches of p->microbatch_size. Live nodes =
 * current − removed + added. Steps, in order: "replace:" (an added node takes
 * a lost one's place), "drop:" (a wiped-out pipeline not needed for f+1),
 * "simple:", "borrow:", "merge:" (§5.1), then, when added nodes are left or
 * the rules still fail, "plan:" (the best plan for the live count) followed by
 * "grow:", "shrink:", "dissolve:", "new:" and "idle:". Where cur gives zones, the
 * nodes placed are then swapped by zone (pl_zone_improve, Bamboo §3): a swap that moves
 * no more bytes and leaves the plan less exposed to a zone's loss is made; a swap that
 * moves more is made only while a layer's holders are all in one zone and it leaves fewer
 * such layers, the cheapest first, all of them together moving at most one replica of
 * the model (its weights and Adam state: what a pipeline of added nodes receives).
 * Without an exposed layer zones never add copies. Returns 0 (fatal and
 * insufficient_nodes are results, not errors), or -1 with a message naming the
 * bad argument or field. */
int pl_reinstantiate(const pl_profile *p, const pl_template_set *ts, const pl_coverage *cov,
                     int tolerate, int64_t global_batch, const pl_current_plan *cur,
                     const char *const *removed, int nremoved, const char *const *added,
                     int nadded, pl_reinstantiation *out, char *err, size_t errlen);

void pl_reinstantiation_free(pl_reinstantiation *r);

/* {"pipelines": [{"nodes", "template_nodes", "microbatches", "iteration_ms"}],
 *  "iteration_ms", "copies": [{"node", "layers": [{"layer", "source", "bytes"} (with
 *  "part" and "parts" when the layer comes in parts)],
 *  "bytes"}], "bytes_to_copy", "idle_nodes", "fatal", "lost_layers",
 *  "insufficient_nodes", "steps"}. NULL when out of memory. */
cJSON *pl_reinstantiation_to_json(const pl_reinstantiation *r);

#endif
