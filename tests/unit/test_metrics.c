/* The Prometheus registry: the exact text exposition of counters, gauges and
 * histograms, sorting, help escaping, clear, refused calls, and concurrent
 * updates; counters set to totals, a job's series dropped, and the per-job series
 * (job_metrics.h: labels trainingjob_namespace and trainingjob). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "check.h"
#include "job_metrics.h"
#include "metrics.h"

static void test_text_format(void)
{
    pl_metrics *m = pl_metrics_new();
    CHECK(m);
    char *text = pl_metrics_text(m);
    CHECK(text && strcmp(text, "") == 0);
    free(text);
    pl_metrics_gauge_set(m, "pliant_jobs", "Jobs by phase.", "phase=\"Running\"", 2);
    pl_metrics_gauge_set(m, "pliant_jobs", "ignored", "phase=\"Pending\"", 1);
    pl_metrics_counter_add(m, "pliant_reconfigurations_total", "Reconfigurations,\nall \\ jobs.",
                           "job=\"b\"", 1);
    pl_metrics_counter_add(m, "pliant_reconfigurations_total", NULL, "job=\"a\"", 2);
    pl_metrics_counter_add(m, "pliant_reconfigurations_total", NULL, "job=\"a\"", 0.5);
    pl_metrics_gauge_set(m, "pliant_up", "Up.", NULL, 1);
    pl_metrics_histogram_observe(m, "pliant_recovery_seconds", "Recovery time.", "job=\"a\"",
                                 0.3);
    pl_metrics_histogram_observe(m, "pliant_recovery_seconds", NULL, "job=\"a\"", 12);
    pl_metrics_histogram_observe(m, "pliant_api_seconds", "API latency.", NULL, 0.005);
    text = pl_metrics_text(m);
    const char *want =
        "# HELP pliant_api_seconds API latency.\n"
        "# TYPE pliant_api_seconds histogram\n"
        "pliant_api_seconds_bucket{le=\"0.005\"} 1\n"
        "pliant_api_seconds_bucket{le=\"0.01\"} 1\n"
        "pliant_api_seconds_bucket{le=\"0.025\"} 1\n"
        "pliant_api_seconds_bucket{le=\"0.05\"} 1\n"
        "pliant_api_seconds_bucket{le=\"0.1\"} 1\n"
        "pliant_api_seconds_bucket{le=\"0.25\"} 1\n"
        "pliant_api_seconds_bucket{le=\"0.5\"} 1\n"
        "pliant_api_seconds_bucket{le=\"1\"} 1\n"
        "pliant_api_seconds_bucket{le=\"2.5\"} 1\n"
        "pliant_api_seconds_bucket{le=\"5\"} 1\n"
        "pliant_api_seconds_bucket{le=\"10\"} 1\n"
        "pliant_api_seconds_bucket{le=\"30\"} 1\n"
        "pliant_api_seconds_bucket{le=\"60\"} 1\n"
        "pliant_api_seconds_bucket{le=\"+Inf\"} 1\n"
        "pliant_api_seconds_sum 0.005\n"
        "pliant_api_seconds_count 1\n"
        "# HELP pliant_jobs Jobs by phase.\n"
        "# TYPE pliant_jobs gauge\n"
        "pliant_jobs{phase=\"Pending\"} 1\n"
        "pliant_jobs{phase=\"Running\"} 2\n"
        "# HELP pliant_reconfigurations_total Reconfigurations,\\nall \\\\ jobs.\n"
        "# TYPE pliant_reconfigurations_total counter\n"
        "pliant_reconfigurations_total{job=\"a\"} 2.5\n"
        "pliant_reconfigurations_total{job=\"b\"} 1\n"
        "# HELP pliant_recovery_seconds Recovery time.\n"
        "# TYPE pliant_recovery_seconds histogram\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"0.005\"} 0\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"0.01\"} 0\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"0.025\"} 0\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"0.05\"} 0\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"0.1\"} 0\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"0.25\"} 0\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"0.5\"} 1\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"1\"} 1\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"2.5\"} 1\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"5\"} 1\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"10\"} 1\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"30\"} 2\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"60\"} 2\n"
        "pliant_recovery_seconds_bucket{job=\"a\",le=\"+Inf\"} 2\n"
        "pliant_recovery_seconds_sum{job=\"a\"} 12.3\n"
        "pliant_recovery_seconds_count{job=\"a\"} 2\n"
        "# HELP pliant_up Up.\n"
        "# TYPE pliant_up gauge\n"
        "pliant_up 1\n";
    CHECK(text);
    if (strcmp(text, want) != 0) printf("%s", text);
    CHECK(strcmp(text, want) == 0);
    free(text);
    pl_metrics_free(m);
}

static void test_clear_and_refusals(void)
{
    pl_metrics *m = pl_metrics_new();
    CHECK(m);
    pl_metrics_gauge_set(m, "jobs", "Jobs.", "phase=\"Running\"", 3);
    pl_metrics_gauge_set(m, "jobs", "Jobs.", "phase=\"Failed\"", 1);
    pl_metrics_clear(m, "jobs");
    pl_metrics_clear(m, "unknown");
    char *text = pl_metrics_text(m);
    CHECK(text && strcmp(text, "") == 0); /* a family without series is left out */
    free(text);
    pl_metrics_gauge_set(m, "jobs", "Jobs.", "phase=\"Succeeded\"", 1);
    pl_metrics_counter_add(m, "jobs", "wrong type", NULL, 1);
    pl_metrics_histogram_observe(m, "jobs", "wrong type", NULL, 1);
    pl_metrics_counter_add(m, "c_total", "C.", NULL, -1); /* counters only go up */
    pl_metrics_counter_add(m, "9bad", "bad name", NULL, 1);
    pl_metrics_counter_add(m, "bad-name", "bad name", NULL, 1);
    pl_metrics_gauge_set(m, "g", "G.", NULL, 1e-300);
    pl_metrics_gauge_set(m, "g", "G.", "x=\"inf\"", 1.0 / 0.0);
    text = pl_metrics_text(m);
    CHECK(text);
    CHECK(strcmp(text, "# HELP g G.\n# TYPE g gauge\ng 1e-300\ng{x=\"inf\"} +Inf\n"
                       "# HELP jobs Jobs.\n# TYPE jobs gauge\njobs{phase=\"Succeeded\"} 1\n") == 0);
    free(text);
    pl_metrics_free(m);
}

#define NTHREADS 4
#define NOPS 5000

static void *hammer(void *arg)
{
    pl_metrics *m = arg;
    for (int i = 0; i < NOPS; i++) {
        pl_metrics_counter_add(m, "ops_total", "Ops.", NULL, 1);
        pl_metrics_histogram_observe(m, "lat_seconds", "Latency.", NULL, 0.25 * (i % 4));
        if (i % 500 == 0) free(pl_metrics_text(m));
    }
    return NULL;
}

static void test_concurrent_updates(void)
{
    pl_metrics *m = pl_metrics_new();
    CHECK(m);
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) CHECK(pthread_create(&t[i], NULL, hammer, m) == 0);
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    char *text = pl_metrics_text(m);
    CHECK_STR_CONTAINS(text, "\nops_total 20000\n");
    CHECK_STR_CONTAINS(text, "\nlat_seconds_count 20000\n");
    CHECK_STR_CONTAINS(text, "\nlat_seconds_bucket{le=\"0.25\"} 10000\n");
    free(text);
    pl_metrics_free(m);
}

/* counter_set keeps a total (never down); drop_series removes exactly one label set's
 * series, whatever more labels they have, in every family. */
static void test_totals_and_drop(void)
{
    pl_metrics *m = pl_metrics_new();
    CHECK(m);
    pl_metrics_counter_set(m, "x_total", "X.", "a=\"1\"", 5);
    pl_metrics_counter_set(m, "x_total", NULL, "a=\"1\"", 3); /* below: ignored */
    pl_metrics_counter_set(m, "x_total", NULL, "a=\"10\"", 7);
    pl_metrics_counter_set(m, "x_total", NULL, "a=\"1\"", -1);
    pl_metrics_gauge_set(m, "y", "Y.", "a=\"1\",verb=\"get\"", 2);
    pl_metrics_gauge_set(m, "y", NULL, "a=\"2\"", 4);
    pl_metrics_histogram_observe(m, "z_seconds", "Z.", "a=\"1\"", 0.1);
    char *text = pl_metrics_text(m);
    CHECK_STR_CONTAINS(text, "x_total{a=\"1\"} 5\n");
    free(text);
    pl_metrics_drop_series(m, "a=\"1\"");
    text = pl_metrics_text(m);
    CHECK(!strstr(text, "a=\"1\"") && !strstr(text, "z_seconds"));
    CHECK_STR_CONTAINS(text, "x_total{a=\"10\"} 7\n");
    CHECK_STR_CONTAINS(text, "y{a=\"2\"} 4\n");
    free(text);
    pl_metrics_free(m);
}

static void test_job_series(void)
{
    pl_metrics *m = pl_metrics_new();
    CHECK(m);
    char lab[256];
    pl_job_metrics_labels(lab, sizeof lab, "team-a", "gpt\"2");
    CHECK(!strcmp(lab, "trainingjob_namespace=\"team-a\",trainingjob=\"gpt\\\"2\""));
    pl_job_sample s = {.workers_desired = 4, .workers_ready = 3, .preemptions = 2, .failed_pods = 1,
                       .reconfigurations = 3, .checkpoints = 2, .checkpoint_step = 200, .loss = 2.5,
                       .validation_loss = NAN};
    pl_job_metrics_set(m, "team-a", "gpt", &s);
    pl_job_metrics_set(m, "team-b", "gpt", &s);
    pl_job_metrics_steps(m, "team-a", "gpt", 7, 12.5);
    pl_job_metrics_set(NULL, "team-a", "gpt", &s); /* no registry: nothing */
    char *text = pl_metrics_text(m);
    const char *want[] = {
        "pliant_workers_desired{trainingjob_namespace=\"team-a\",trainingjob=\"gpt\"} 4\n",
        "pliant_workers_ready{trainingjob_namespace=\"team-a\",trainingjob=\"gpt\"} 3\n",
        "pliant_preemptions_total{trainingjob_namespace=\"team-a\",trainingjob=\"gpt\"} 2\n",
        "pliant_failed_pods_total{trainingjob_namespace=\"team-a\",trainingjob=\"gpt\"} 1\n",
        "pliant_reconfigurations_total{trainingjob_namespace=\"team-a\",trainingjob=\"gpt\"} 3\n",
        "pliant_checkpoints_total{trainingjob_namespace=\"team-a\",trainingjob=\"gpt\"} 2\n",
        "pliant_checkpoint_last_step{trainingjob_namespace=\"team-a\",trainingjob=\"gpt\"} 200\n",
        "pliant_loss{trainingjob_namespace=\"team-a\",trainingjob=\"gpt\"} 2.5\n",
        "pliant_steps_total{trainingjob_namespace=\"team-a\",trainingjob=\"gpt\"} 7\n",
        "pliant_samples_per_second{trainingjob_namespace=\"team-a\",trainingjob=\"gpt\"} 12.5\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_STR_CONTAINS(text, want[i]);
    CHECK(!strstr(text, "pliant_validation_loss")); /* unknown: not written */
    CHECK(!strstr(text, "{job=") && !strstr(text, ",job=") && !strstr(text, "{namespace="));
    free(text);
    s.validation_loss = 2.75;
    pl_job_metrics_set(m, "team-a", "gpt", &s);
    text = pl_metrics_text(m);
    CHECK_STR_CONTAINS(text, "pliant_validation_loss{trainingjob_namespace=\"team-a\",trainingjob=\"gpt\"} 2.75\n");
    free(text);
    pl_job_metrics_forget(m, "team-a", "gpt");
    text = pl_metrics_text(m);
    CHECK(!strstr(text, "team-a"));
    CHECK_STR_CONTAINS(text, "pliant_loss{trainingjob_namespace=\"team-b\",trainingjob=\"gpt\"} 2.5\n");
    free(text);
    pl_metrics_free(m);
}

TEST_MAIN_BEGIN
RUN(test_text_format);
RUN(test_totals_and_drop);
RUN(test_job_series);
RUN(test_clear_and_refusals);
RUN(test_concurrent_updates);
TEST_MAIN_END
