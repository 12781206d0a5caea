/* `pliant simulate --report`: the dashboard's page (dashboard.h, docs/dashboard.md) with
 * each simulation (a strategy, or a strategy under a belowMinimum) built in as a run of the
 * feed's events, chosen on the page: throughput over the steps with the reconfigurations,
 * the timeline of the trace's events and of the recoveries, dollars and samples per dollar.
 * Readable offline.
 * Single-threaded; reads the results and timelines, owns nothing it returns. */
#ifndef PLIANT_SIM_REPORT_H
#define PLIANT_SIM_REPORT_H

#include <stdio.h>

#include "simulator.h"

typedef struct {
    const pl_job *job;
    double spot, on_demand;      /* $ per node-hour */
} pl_sim_report_info;

/* Writes the page to f from res[i], the run named names[i] on the page (NULL: runs named
 * by their strategies), and its timeline timelines[i] (the JSON lines of `--out`, one
 * text): 0, or -1 when writing failed or memory ran out. */
int pl_sim_report_write(FILE *f, const pl_sim_report_info *info, const pl_sim_outcome *res,
                        const char *const *names, const char *const *timelines, int n);

/* Dollars and value of a result at the given prices. */
double pl_sim_node_hours(const pl_sim_outcome *r);
double pl_sim_samples_per_s(const pl_sim_outcome *r);

#endif
