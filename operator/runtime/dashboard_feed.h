/* What a job's dashboard shows (docs/dashboard.md "Messages"), made from its job driver:
 * the front end (`pliant run`, the operator) makes one feed per job with a dashboard,
 * hands it every event it drains from the driver (pl_dash_feed_event), calls
 * pl_dash_feed_poll after each poll (plans, workers' states, the phase) and tells it
 * what only it sees (pl_dash_feed_notice: chaos, a worker's process ending). The feed
 * publishes JSON events to the job's page on a dashboard (dashboard.h), which serves them.
 *
 * Single-threaded: every call on the front end's thread (the coordinator's). The feed
 * borrows the job's page and the driver (both must outlive it) and owns nothing else
 * but itself. It keeps the time it spent, so that its cost to the coordinator's thread
 * can be reported (pl_dash_feed_cost_ns). */
#ifndef PLIANT_DASHBOARD_FEED_H
#define PLIANT_DASHBOARD_FEED_H

#include <stdint.h>

#include "dashboard.h"
#include "job_driver.h"

typedef struct pl_dash_feed pl_dash_feed;

/* After pl_job_driver_start; publishes the job's "hello". NULL when out of memory. */
pl_dash_feed *pl_dash_feed_new(pl_dashboard_job *page, pl_job_driver *drv);
void pl_dash_feed_free(pl_dash_feed *f); /* NULL is fine */

/* One event drained from the driver (step, reconfiguration, recovery, checkpoint...). */
void pl_dash_feed_event(pl_dash_feed *f, const pl_job_driver_event *ev);
/* A plan, a worker's state or the phase changed since the last call: their events. */
void pl_dash_feed_poll(pl_dash_feed *f);
/* A notice about worker `worker` (NULL: the job): what ("kill", "term", "add", "exit",
 * ...) and a line for people. */
void pl_dash_feed_notice(pl_dash_feed *f, const char *worker, const char *what,
                         const char *detail);

/* What node_hours cost at spot and on-demand $ per node-hour (either 0: unset, its
 * fields 0), and samples per $ (0 for $0): 1, or 0 when neither price is set. */
typedef struct {
    double node_hours, usd, usd_on_demand, samples_per_usd, samples_per_usd_on_demand;
} pl_dash_cost;
int pl_dash_cost_of(double node_hours, double samples, double spot, double on_demand,
                    pl_dash_cost *c);

/* Helpers for events made elsewhere in the feed's format (`pliant simulate --report`):
 * "a,b" as ["a", "b"] into o[key]; the cost fields of a step event (docs/dashboard.md),
 * from pl_dash_cost_of (none when it gives 0). */
struct cJSON;
void pl_dash_add_names(struct cJSON *o, const char *key, const char *list);
void pl_dash_cost_fields(struct cJSON *o, double node_hours, double samples, double spot,
                         double on_demand);

/* Nanoseconds spent in this feed's calls, and how many calls. */
int64_t pl_dash_feed_cost_ns(const pl_dash_feed *f, int64_t *calls);

#endif
