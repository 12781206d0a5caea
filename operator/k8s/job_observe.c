/* What a job's runtime reports (controller.c), looked at after each poll of its driver:
 * Events for the workers that joined and left, the plans, checkpoints and the job's end; the
 * phase and conditions that follow; recovery and step metrics; the dashboard's feed. */
#include "controller_internal.h"

#include <stdio.h>
#include <string.h>

#include "job_metrics.h"
#include "job_policy.h"
#include "oplog.h"

/* The phase a job shows while its coordinator is in this one. */
static const char *phase_of(pl_coord *co)
{
    switch (pl_coord_phase(co)) {
    case PL_COORD_WAITING_FOR_WORKERS: return "Pending";
    case PL_COORD_PROFILING: return "Profiling";
    case PL_COORD_WAITING_FOR_NODES: return "WaitingForNodes";
    case PL_COORD_COPYING:
    case PL_COORD_SETTLING: return pl_coord_generation(co) > 1 ? "Reconfiguring" : "Running";
    case PL_COORD_DONE: return "Succeeded";
    case PL_COORD_FAILED: return "Failed";
    default: return "Running";
    }
}

/* Each name of a comma-separated list as an Event of that reason. */
static void name_events(pl_controller *c, cjob *j, const char *list, const char *reason,
                        const char *what)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *n = strtok_r(buf, ",", &save); n; n = strtok_r(NULL, ",", &save))
        job_event(c, j, strcmp(reason, "NodeLost") ? "Normal" : "Warning", reason, what,
              "worker %s %s", n, strcmp(reason, "NodeLost") ? "joined" : "left the job");
}

/* faultTolerance.belowMinimum degrade: a plan with less than the job's tolerance sets the
 * condition Degraded (a Warning Event), one with all of it clears it (a Normal Event). */
static void observe_tolerance(pl_controller *c, cjob *j, const pl_coord_reconfig_rec *x)
{
    const int f = j->spec.fault_tolerance.tolerate, was = !strcmp(j->cond[COND_DEGRADED].status, "True");
    if (x->tolerance < f) {
        set_cond(j, "Degraded", 1, "BelowMinimum", "tolerance %d of %d until workers join",
                 x->tolerance, f);
        job_event(c, j, "Warning", "Degraded", "Reconfigure",
              "too few workers for tolerance %d: training on with tolerance %d", f, x->tolerance);
    } else if (was) {
        set_cond(j, "Degraded", 0, "ToleranceRestored", "tolerance %d", f);
        job_event(c, j, "Normal", "ToleranceRestored", "Reconfigure", "tolerance %d restored", f);
    }
}

/* A new plan: Events for the workers it removed and added and for itself. */
static void observe_reconfig(pl_controller *c, cjob *j, const pl_coord_reconfig_rec *x)
{
    pl_rfc3339_now(j->last_reconfig_time, sizeof j->last_reconfig_time);
    name_events(c, j, x->removed, "NodeLost", "RemoveNode");
    name_events(c, j, x->added, "NodeAdded", "AddNode");
    job_event(c, j, "Normal", "Reconfigured", "Reconfigure",
          "generation %lld at step %lld: %s; pipelines %s%s", (long long)x->generation,
          (long long)x->step, x->cause, x->pipelines,
          x->from_checkpoint ? " (from the checkpoint)" : "");
    observe_tolerance(c, j, x);
    j->status_dirty = 1;
}

/* What the workers' duties brought: a checkpoint a worker could not complete, the resume
 * point they reported, the profile one measured (saved in the status). */
static void observe_duty_event(cjob *j, const pl_job_driver_event *ev)
{
    if (ev->kind == PL_JOB_DRIVER_CHECKPOINT && ev->error)
        pl_log(PL_LOG_WARN, "%s: checkpoint of step %lld: %s", j->key, (long long)ev->step,
               ev->error);
    if (ev->kind == PL_JOB_DRIVER_RESUME && (ev->step > 0 || ev->error))
        pl_log(ev->error ? PL_LOG_WARN : PL_LOG_INFO, "%s: starting from the checkpoint of step %lld%s%s",
               j->key, (long long)ev->step, ev->error ? ": " : "", ev->error ? ev->error : "");
    if (ev->kind == PL_JOB_DRIVER_PROFILED) {
        pl_log(PL_LOG_INFO, "%s: the profile measured by a worker is planned", j->key);
        j->status_dirty = 1;
    }
}

/* Events and metrics from what the driver reports since the last look. */
static void observe_driver(pl_controller *c, cjob *j)
{
    pl_metrics *m = c->cfg.metrics;
    int steps = 0;
    pl_job_driver_event ev;
    while (pl_job_driver_next(j->rt, &ev)) {
        pl_dash_feed_event(j->feed, &ev);
        switch (ev.kind) {
        case PL_JOB_DRIVER_STEP: steps++; break;
        case PL_JOB_DRIVER_RECONFIG:
            observe_reconfig(c, j, pl_coord_reconfig(pl_job_driver_coord(j->rt), ev.index));
            break;
        case PL_JOB_DRIVER_RECOVERED:
            if (m)
                pl_metrics_histogram_observe(m, "pliant_recovery_seconds",
                                             "Failure to the next committed step", NULL,
                                             ev.ms / 1000.0);
            j->status_dirty = 1;
            break;
        case PL_JOB_DRIVER_CHECKPOINT:
        case PL_JOB_DRIVER_RESUME:
        case PL_JOB_DRIVER_PROFILED: observe_duty_event(j, &ev); break;
        }
    }
    if (steps > 0) {
        pl_job_metrics_steps(m, j->ns, j->name, steps, pl_job_driver_samples_per_second(j->rt));
        if (pl_now_ms() - j->status_ms >= STATUS_EVERY_MS) j->status_dirty = 1;
    }
}

/* Events, status, metrics from the driver and the coordinator since the last look. */
void observe_job(pl_controller *c, cjob *j)
{
    pl_coord *co = pl_job_driver_coord(j->rt);
    observe_driver(c, j);
    pl_dash_feed_poll(j->feed);
    if (pl_coord_last_checkpoint(co) > j->ckpt_seen) {
        j->ckpt_seen = pl_coord_last_checkpoint(co);
        j->checkpoints++;
        pl_rfc3339_now(j->last_ckpt_time, sizeof j->last_ckpt_time);
        job_event(c, j, "Normal", "CheckpointSaved", "Checkpoint", "step %lld saved to %s",
              (long long)j->ckpt_seen, j->spec.checkpoint.dir);
        j->status_dirty = 1;
    }
    if (silent_pod(j))
        pl_workqueue_add(c->q, j->key); /* reconcile deletes it (fence_lost) */
    const char *phase = phase_of(co);
    if (strcmp(phase, j->phase)) {
        if (!strcmp(phase, "Running") &&
            (!j->phase[0] || !strcmp(j->phase, "Pending") || !strcmp(j->phase, "Profiling")))
            job_event(c, j, "Normal", "Started", "Train", "training on %d workers",
                  pl_coord_live_workers(co));
        if (!strcmp(phase, "Succeeded") || !strcmp(phase, "Failed")) {
            pl_rfc3339_now(j->completion_time, sizeof j->completion_time);
            j->end_ms = j->done_ms = pl_now_ms();
            job_event(c, j, !strcmp(phase, "Failed") ? "Warning" : "Normal", phase, "Finish", "%s",
                  pl_coord_reason(co)[0] ? pl_coord_reason(co) : "every step committed");
            pl_workqueue_add_after(c->q, j->key, FLUSH_MS + 100);
        }
        set_phase(j, phase, phase, pl_coord_reason(co)[0] ? pl_coord_reason(co) : phase);
    }
}
