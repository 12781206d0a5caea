/* The operator's cost accounting (job_cost.h): a Pod's running intervals summed into node
 * time, the open interval counted up to now, and its price at the spot and on-demand rates. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "job_cost.h"
#include "job_metrics.h"

#define HOUR_MS 3600000

/* Two Pods: one runs 1 h, stops, runs 30 min more; the other starts later and is still
 * running: 1.5 h closed + 0.5 h open. */
static void test_pod_intervals(void)
{
    pl_pod_clock a = {0}, b = {0};
    int64_t closed = 0;
    pl_pod_clock_set(&a, 1, 1000, &closed);
    pl_pod_clock_set(&a, 1, 5000, &closed); /* still running: the start stays */
    pl_pod_clock_set(&a, 0, 1000 + HOUR_MS, &closed);
    CHECK_EQ_INT(closed, HOUR_MS);
    pl_pod_clock_set(&a, 0, 2 * HOUR_MS, &closed); /* not running: nothing more */
    CHECK_EQ_INT(closed, HOUR_MS);
    pl_pod_clock_set(&a, 1, 2 * HOUR_MS, &closed);
    pl_pod_clock_set(&a, 0, 2 * HOUR_MS + HOUR_MS / 2, &closed);
    CHECK_EQ_INT(closed, HOUR_MS + HOUR_MS / 2);
    pl_pod_clock_set(&b, 1, 3 * HOUR_MS, &closed);
    CHECK_EQ_INT(pl_pod_clock_open_ms(&a, 4 * HOUR_MS), 0);
    CHECK_EQ_INT(pl_pod_clock_open_ms(&b, 3 * HOUR_MS + HOUR_MS / 2), HOUR_MS / 2);
    CHECK_EQ_INT(pl_pod_clock_open_ms(&b, HOUR_MS), 0); /* a clock that went back */
}

/* 2 node-hours at $0.918 spot, $3.06 on demand, 1000 samples. */
static void test_prices(void)
{
    pl_cost_spec spec = {.spot = 0.918, .on_demand = 3.06}, none = {0};
    CHECK(pl_job_cost_enabled(&spec) && !pl_job_cost_enabled(&none));
    pl_job_cost k = pl_job_cost_of(&spec, 2 * HOUR_MS, 1000);
    CHECK(fabs(k.node_hours - 2) < 1e-12);
    CHECK(fabs(k.dollars - 1.836) < 1e-12);
    CHECK(fabs(k.on_demand_dollars - 6.12) < 1e-12);
    CHECK(fabs(k.samples_per_dollar - 1000 / 1.836) < 1e-9);
    pl_cost_spec od = {.on_demand = 3.06};
    k = pl_job_cost_of(&od, HOUR_MS, 1000); /* no spot price: no samples per dollar */
    CHECK(k.dollars == 0 && k.samples_per_dollar == 0 && fabs(k.on_demand_dollars - 3.06) < 1e-12);
}

/* The cost series appear with has_cost, under the job's labels; samples per dollar only
 * once a dollar is spent. */
static void test_metrics(void)
{
    pl_metrics *m = pl_metrics_new();
    CHECK(m != NULL);
    pl_job_sample s = {.loss = NAN, .validation_loss = NAN};
    pl_job_metrics_set(m, "ns", "j", &s);
    char *text = pl_metrics_text(m);
    CHECK(text && !strstr(text, "pliant_job_dollars"));
    free(text);
    s.has_cost = 1;
    s.node_hours = 2;
    s.dollars = 1.836;
    s.on_demand_dollars = 6.12;
    s.samples_per_dollar = 544.6;
    pl_job_metrics_set(m, "ns", "j", &s);
    text = pl_metrics_text(m);
    CHECK(text != NULL);
    CHECK(strstr(text, "pliant_job_dollars{trainingjob_namespace=\"ns\",trainingjob=\"j\"} 1.836"));
    CHECK(strstr(text, "pliant_job_on_demand_dollars{"));
    CHECK(strstr(text, "pliant_job_node_hours{"));
    CHECK(strstr(text, "pliant_job_samples_per_dollar{trainingjob_namespace=\"ns\",trainingjob=\"j\"} 544.6"));
    free(text);
    pl_metrics_free(m);
}

TEST_MAIN_BEGIN
RUN(test_pod_intervals);
RUN(test_prices);
RUN(test_metrics);
TEST_MAIN_END
