/* JSON views of planner results (the `pliant plan` output format). */
#ifndef PLIANT_PLAN_JSON_H
#define PLIANT_PLAN_JSON_H

#include <cJSON.h>

#include "coverage.h"
#include "templates.h"

/* Milliseconds for JSON from the planner's integer nanoseconds. */
double pl_ns_to_ms(int64_t ns);

cJSON *pl_template_to_json(const pl_template *t);
cJSON *pl_instance_plan_to_json(const pl_instance_plan *e);

/* The whole plan: n0, tolerate, microbatches, templates, coverage, uncovered,
 * infeasible_template_nodes. NULL on allocation failure. */
cJSON *pl_plan_to_json(const pl_template_set *ts, const pl_coverage *cov);

#endif
