/* The per-TrainingJob series of /metrics and their labels (job_metrics.h). */
#include "job_metrics.h"

#include <math.h>
#include <stdio.h>

/* A label value as the text format wants it: \\, \" and \n escaped. */
static size_t escape(char *out, size_t len, const char *s)
{
    size_t n = 0;
    for (; *s && n + 3 < len; s++) {
        if (*s == '\\' || *s == '"' || *s == '\n') out[n++] = '\\';
        out[n++] = *s == '\n' ? 'n' : *s;
    }
    out[n] = 0;
    return n;
}

void pl_job_metrics_labels(char *buf, size_t len, const char *ns, const char *name)
{
    char ens[512], ename[768];
    escape(ens, sizeof ens, ns);
    escape(ename, sizeof ename, name);
    snprintf(buf, len, "trainingjob_namespace=\"%s\",trainingjob=\"%s\"", ens, ename);
}

static void gauge(pl_metrics *m, const char *name, const char *help, const char *lab, double v)
{
    if (isfinite(v)) pl_metrics_gauge_set(m, name, help, lab, v);
}

/* The cost series (spec.cost set); samples per dollar once a dollar is spent. */
static void set_cost(pl_metrics *m, const char *lab, const pl_job_sample *s)
{
    gauge(m, "pliant_job_node_hours", "Node-hours of the job's running worker Pods", lab,
          s->node_hours);
    gauge(m, "pliant_job_dollars", "Node-hours at the spot price (spec.cost.spot)", lab,
          s->dollars);
    gauge(m, "pliant_job_on_demand_dollars",
          "Node-hours at the on-demand price (spec.cost.onDemand)", lab, s->on_demand_dollars);
    if (s->dollars > 0)
        gauge(m, "pliant_job_samples_per_dollar", "Committed training samples per spot dollar",
              lab, s->samples_per_dollar);
}

void pl_job_metrics_set(pl_metrics *m, const char *ns, const char *name, const pl_job_sample *s)
{
    if (!m) return;
    char lab[1400];
    pl_job_metrics_labels(lab, sizeof lab, ns, name);
    gauge(m, "pliant_workers_desired", "Worker Pods requested", lab, s->workers_desired);
    gauge(m, "pliant_workers_ready", "Workers training in the current plan", lab,
          s->workers_ready);
    pl_metrics_counter_set(m, "pliant_preemptions_total", "Worker Pods lost to disruptions", lab,
                           (double)s->preemptions);
    pl_metrics_counter_set(m, "pliant_failed_pods_total", "Worker Pods that failed on their own",
                           lab, (double)s->failed_pods);
    pl_metrics_counter_set(m, "pliant_reconfigurations_total", "Plan changes", lab,
                           (double)s->reconfigurations);
    pl_metrics_counter_set(m, "pliant_checkpoints_total", "Checkpoints completed", lab,
                           (double)s->checkpoints);
    if (s->checkpoint_step > 0)
        gauge(m, "pliant_checkpoint_last_step", "Step of the newest complete checkpoint", lab,
              (double)s->checkpoint_step);
    gauge(m, "pliant_loss", "Training loss of the last committed step", lab, s->loss);
    gauge(m, "pliant_validation_loss", "Loss on spec.data.val of the last evaluation", lab,
          s->validation_loss);
    if (s->has_cost) set_cost(m, lab, s);
}

void pl_job_metrics_steps(pl_metrics *m, const char *ns, const char *name, int steps,
                          double samples_per_second)
{
    if (!m) return;
    char lab[1400];
    pl_job_metrics_labels(lab, sizeof lab, ns, name);
    pl_metrics_counter_add(m, "pliant_steps_total", "Committed training steps", lab, steps);
    gauge(m, "pliant_samples_per_second", "Training throughput", lab, samples_per_second);
}

void pl_job_metrics_forget(pl_metrics *m, const char *ns, const char *name)
{
    if (!m) return;
    char lab[1400];
    pl_job_metrics_labels(lab, sizeof lab, ns, name);
    pl_metrics_drop_series(m, lab);
}
