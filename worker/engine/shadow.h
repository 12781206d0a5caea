/* Redundant layers (Bamboo, NSDI '23 §5.1; docs/redundant.md): with strategy
 * redundant each stage of a pipeline also holds its successor's layers, the
 * "shadow", with their AdamW state, so that it can take over when the successor
 * is lost without copying a byte.
 *
 * How the shadow stays equal to the owner, bit for bit. The owner's gradient of
 * a layer is final once the layer's sync group has all-reduced it
 * (worker_step.h). Each stage sends each group's reduced gradients to the stage
 * that shadows it over the pipeline's stage link (kind PL_LINK_SHADOW) as soon as
 * that group is reduced, from the step's comm thread, while the stage's last
 * backward and its other all-reduces still run; the holder receives them into its
 * shadow engine's gradients after its own step. Both then run the same AdamW
 * (pl_worker_apply) with the same grad_scale, lr and t on the same bytes: AdamW is
 * elementwise, so the results are identical.
 *
 * Why this and not the shadow joining the layer's all-reduce group: joining
 * would give the same bits too (a ring all-reduce hands every member the same
 * reduced chunks) but changes the owners' ring (one more member per pipeline:
 * other chunk boundaries, so other sums than the templates strategy's, and
 * 2·(n−1)/n of the layer's bytes per member instead of once per pipeline), and
 * it needs a ring connection per shadow and layer group. The stage link exists
 * already, carries the bytes once per owner, and leaves the training sums of
 * strategy redundant identical to those of strategy templates. The cost is one
 * gradient-sized transfer per stage and step, overlapped with the stage's last
 * backward and all-reduces but for the last group's.
 *
 * Messages: one per contiguous run of a group's tensors (pl_shadow_grad_tag), so
 * no tensor is gathered; at most pl_shadow_grad_messages a step, which the stage
 * link's stash must hold on top of the 1F1B bound (the holder takes them after
 * its own schedule).
 *
 * Which stage shadows which (pl_rc_layout): Bamboo's ring (§5.1: "the first node
 * has its layer replica stored on the last node"): stage k shadows stage
 * (k + 1) mod S, over the stage link's wrap between the last and the first stage
 * when S ≥ 3 (worker/comm/stage_link.h). The last stage's FRC runs on the
 * microbatch's tokens (§5.1: "we let it fetch input samples directly").
 *
 * Threads: no state of its own; the functions run on the caller's thread, on
 * engines it owns (the compute thread), except pl_shadow_send_group, which reads
 * only host memory and the link (the step's comm thread). */
#ifndef PLIANT_SHADOW_H
#define PLIANT_SHADOW_H

#include <stddef.h>

#include "allreduce.h"
#include "engine.h"
#include "stage.h"

typedef enum {
    PL_RC_NONE = 0, /* no redundant layers */
    PL_RC_RING,     /* stage k shadows (k + 1) mod S (Bamboo §5.1) */
} pl_rc_layout;

/* The stage whose layers `stage` shadows, or −1 (none: PL_RC_NONE, one stage). */
int pl_shadow_successor(pl_rc_layout rc, int stage, int nstages);
/* The stage that shadows `stage`, or −1 (none). */
int pl_shadow_holder(pl_rc_layout rc, int stage, int nstages);

/* The shadow engine of layers [begin, end): an engine like the owner's, with one
 * activation slot (what a forward redundant computation needs, Bamboo §5.2). */
int pl_shadow_create(pl_engine *shadow, kn_ctx *k, const pl_gpt_config *cfg, int begin,
                     int end, int B, int T, char *err, size_t errlen);

/* The link tags (microbatch numbers of kind PL_LINK_SHADOW) of the step's gradient
 * messages start here; the plan's refresh of the shadow uses tags below it. */
#define PL_SHADOW_GRAD_TAG0 16

/* The tag of the run-th contiguous run of sync group key's tensors (syncgroups.h) in a
 * model of L blocks. */
int pl_shadow_grad_tag(int L, int key, int run);
/* The most gradient messages a stage sends its holder in one step, model of L blocks. */
int pl_shadow_grad_messages(int L);

/* Sends sync group key's reduced gradients, refs[0 .. n) in host memory, to stage
 * `holder`: one message per contiguous run. The link copies them: any thread that may
 * use the link. 0, or −1 with err (the link's). */
int pl_shadow_send_group(const pl_stage_link *link, int holder, int L, int key,
                         const pl_tensor_ref *refs, int n, char *err, size_t errlen);
/* Receives stage `successor`'s gradients of group key into the shadow's tensors refs
 * (the shadow's gradients, backend memory: staged through host off the CPU). 0, or −1
 * with err (the link's, or a message of another size: another layer range). */
int pl_shadow_recv_group(pl_engine *shadow, const pl_stage_link *link, int successor, int key,
                         const pl_tensor_ref *refs, int n, char *err, size_t errlen);

/* 1 when a and b hold the same layer range and their parameters and AdamW m and v
 * are byte-identical (the redundancy check of the tests and of a debug run). */
int pl_shadow_identical(const pl_engine *a, const pl_engine *b);

#endif
