/* `pliant simulate --report`: one HTML page, readable offline (inline SVG, no script, no
 * CDN): throughput and nodes over trace time per strategy, the time split as bars, and
 * the summary table. Single-threaded; reads the results, owns nothing. */
#ifndef PLIANT_SIM_REPORT_H
#define PLIANT_SIM_REPORT_H

#include <stdio.h>

#include "simulator.h"

typedef struct {
    const char *job, *trace;
    int scale;
    double spot, on_demand;      /* $ per node-hour */
} pl_sim_report_info;

/* Writes the page to f: 0, or -1 when writing failed. */
int pl_sim_report_write(FILE *f, const pl_sim_report_info *info, const pl_sim_outcome *res, int n);

/* Dollars and value of a result at the given prices. */
double pl_sim_node_hours(const pl_sim_outcome *r);
double pl_sim_samples_per_s(const pl_sim_outcome *r);

#endif
