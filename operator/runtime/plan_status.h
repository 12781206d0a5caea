/* A TrainingJob's status.plan (crds/trainingjob.yaml): the coordinator's stable plan,
 * which a new operator leader takes over (pl_coord_restore; docs/protocol.md "A restarted
 * coordinator"). Per pipeline: "nodes" (stage order) and "microbatches"; after a failover
 * (strategy redundant, docs/redundant.md) also "layers", its stage bounds, and
 * "templateNodes", its template's workers with the lost ones. */
#ifndef PLIANT_PLAN_STATUS_H
#define PLIANT_PLAN_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "coordinator.h"

typedef struct {
    int64_t generation;
    int npipes;
    pl_coord_pipe *pipes; /* names point into the JSON read */
} pl_plan_status;

/* The coordinator's stable plan and generation as status.plan; NULL when it has no
 * stable plan or memory ran out. */
cJSON *pl_plan_status_json(const pl_coord *c);
/* status.plan read back: 0, or -1 and err naming the field
 * ("status.plan.pipelines[1].layers[2]: ..."). out's names point into plan. */
int pl_plan_status_read(const cJSON *plan, pl_plan_status *out, char *err, size_t errlen);
void pl_plan_status_free(pl_plan_status *p);

#endif
