/* A TrainingJob's status (controller.c): its conditions and phase, the status written
 * through the /status subresource (merge patch), and the job's series of /metrics, which
 * agree with it. */
#include "controller_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "job_metrics.h"
#include "job_policy.h"
#include "json_num.h"
#include "oplog.h"
#include "plan_status.h"

static const char *const COND_TYPES[] = {"Created",   "Running",   "Reconfiguring", "WaitingForNodes",
                                         "Suspended", "Succeeded", "Failed",        "PodsCreated",
                                         "Degraded"};
_Static_assert(sizeof COND_TYPES / sizeof COND_TYPES[0] == NCOND, "NCOND: one per condition");

/* Sets a condition; the status is written when it changed. */
void set_cond(cjob *j, const char *type, int on, const char *reason, const char *fmt, ...)
{
    for (int i = 0; i < NCOND; i++) {
        if (strcmp(COND_TYPES[i], type)) continue;
        ccond *k = &j->cond[i];
        const char *st = on ? "True" : "False";
        char message[sizeof k->message];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(message, sizeof message, fmt, ap);
        va_end(ap);
        if (!strcmp(k->status, st) && !strcmp(k->reason, reason) && !strcmp(k->message, message))
            return;
        if (strcmp(k->status, st)) pl_rfc3339_now(k->since, sizeof k->since);
        snprintf(k->status, sizeof k->status, "%s", st);
        snprintf(k->reason, sizeof k->reason, "%s", reason);
        snprintf(k->message, sizeof k->message, "%s", message);
        j->status_dirty = 1;
    }
}

/* The phase shown, with the conditions that go with it. */
void set_phase(cjob *j, const char *phase, const char *reason, const char *msg)
{
    if (!strcmp(j->phase, phase)) return;
    snprintf(j->phase, sizeof j->phase, "%s", phase);
    static const char *const exclusive[] = {"Running", "Reconfiguring", "WaitingForNodes",
                                            "Suspended"};
    for (size_t i = 0; i < sizeof exclusive / sizeof exclusive[0]; i++)
        if (strcmp(exclusive[i], phase) && j->cond[COND_CREATED].status[0])
            set_cond(j, exclusive[i], 0, reason, "%s", msg);
    if (strcmp(phase, "Pending")) set_cond(j, phase, 1, reason, "%s", msg);
    j->status_dirty = 1;
}

/* The job ends now: phase Failed with reason, a Warning Event, its coordinator told. */
void fail_job(pl_controller *c, cjob *j, const char *reason, const char *msg)
{
    if (j->rt) {
        pl_coord_end(pl_job_driver_coord(j->rt), msg);
        j->done_ms = pl_now_ms();
    }
    set_phase(j, "Failed", reason, msg);
    job_event(c, j, "Warning", reason, "Fail", "%s", msg);
    pl_rfc3339_now(j->completion_time, sizeof j->completion_time);
    j->end_ms = pl_now_ms();
}

/* ------------------------------------------------------------------ status */

/* What the workers' duties add to the status: the newest validation loss
 * (status.lastValidation), and once the profile a worker measured (status.profile: a new
 * leader plans from it instead of measuring again; merge patches keep it). */
static void add_duties_status(cJSON *s, const cjob *j)
{
    int64_t vstep;
    double vloss = pl_job_driver_validation_loss(j->rt, &vstep);
    if (isfinite(vloss)) {
        cJSON *v = cJSON_AddObjectToObject(s, "lastValidation");
        cJSON_AddNumberToObject(v, "step", (double)vstep);
        cJSON_AddNumberToObject(v, "loss", vloss);
    }
    const char *profile = pl_job_driver_profile_json(j->rt);
    if (profile && !j->profile_saved) cJSON_AddStringToObject(s, "profile", profile);
}

/* What the job's nodes cost so far: the ended intervals and those still open. */
static pl_job_cost job_cost(const cjob *j)
{
    int64_t now = pl_now_ms(), ms = j->node_ms;
    for (const cpod *p = j->pods; p; p = p->next) ms += pl_pod_clock_open_ms(&p->clock, now);
    return pl_job_cost_of(&j->spec.cost, ms, j->samples);
}

/* status.cost (spec.cost set). */
static void add_cost_status(cJSON *s, const cjob *j)
{
    if (!j->have_spec || !pl_job_cost_enabled(&j->spec.cost)) return;
    pl_job_cost k = job_cost(j);
    cJSON *o = cJSON_AddObjectToObject(s, "cost");
    cJSON_AddNumberToObject(o, "nodeHours", round(k.node_hours * 1e6) / 1e6);
    cJSON_AddNumberToObject(o, "dollars", round(k.dollars * 1e6) / 1e6);
    cJSON_AddNumberToObject(o, "onDemandDollars", round(k.on_demand_dollars * 1e6) / 1e6);
    cJSON_AddNumberToObject(o, "samples", j->samples);
    cJSON_AddNumberToObject(o, "samplesPerDollar", round(k.samples_per_dollar));
}

/* status.conditions, those ever set, each with the generation observed. */
static void add_conditions(cJSON *s, const cjob *j, long long generation)
{
    cJSON *conds = cJSON_AddArrayToObject(s, "conditions");
    for (int i = 0; i < NCOND; i++) {
        const ccond *k = &j->cond[i];
        if (!k->status[0]) continue;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", COND_TYPES[i]);
        cJSON_AddStringToObject(x, "status", k->status);
        cJSON_AddStringToObject(x, "reason", k->reason);
        cJSON_AddStringToObject(x, "message", k->message);
        cJSON_AddStringToObject(x, "lastTransitionTime", k->since);
        cJSON_AddNumberToObject(x, "observedGeneration", (double)generation);
        cJSON_AddItemToArray(conds, x);
    }
}

/* status.reconfigurations, and status.lastReconfiguration once this runtime made one. */
static void add_reconfig_status(cJSON *s, const cjob *j, pl_coord *co)
{
    int nr = pl_coord_nreconfigs(co);
    cJSON_AddNumberToObject(s, "reconfigurations", j->reconfigs_before + nr);
    if (nr > 0) {
        const pl_coord_reconfig_rec *x = pl_coord_reconfig(co, nr - 1);
        cJSON *lr = cJSON_AddObjectToObject(s, "lastReconfiguration");
        cJSON_AddStringToObject(lr, "time", j->last_reconfig_time);
        cJSON_AddStringToObject(lr, "cause", x->cause);
        int64_t ms = pl_job_driver_recovery_ms(j->rt, nr - 1);
        if (ms >= 0) cJSON_AddNumberToObject(lr, "durationSeconds", (double)ms / 1000.0);
        cJSON_AddNumberToObject(lr, "bytesCopied", (double)x->bytes_copied);
        cJSON_AddBoolToObject(lr, "fromCheckpoint", x->from_checkpoint);
    }
}

/* What the running coordinator shows: progress, the plan (a new leader takes it over),
 * reconfigurations, the duties' results, the last checkpoint. */
static void add_training_status(cJSON *s, const cjob *j)
{
    pl_coord *co = pl_job_driver_coord(j->rt);
    int64_t step = pl_coord_step(co), steps = j->spec.steps;
    double sps = pl_job_driver_samples_per_second(j->rt);
    cJSON_AddNumberToObject(s, "step", (double)step);
    cJSON_AddNumberToObject(s, "progressPercentage", floor(100.0 * (double)step / (double)steps));
    if (sps > 0)
        cJSON_AddNumberToObject(s, "estimatedRemainingSeconds",
                                round((double)(steps - step) * j->spec.batch.global / sps));
    int ns = pl_coord_nsteps(co);
    if (ns > 0) {
        const pl_coord_step_rec *r = pl_coord_step_log(co, ns - 1);
        if (isfinite(r->loss)) cJSON_AddNumberToObject(s, "loss", r->loss);
        cJSON_AddStringToObject(s, "pipelines", r->pipelines);
    }
    cJSON_AddNumberToObject(s, "samplesPerSecond", round(sps * 10) / 10);
    cJSON_AddNumberToObject(s, "planGeneration", (double)pl_coord_generation(co));
    cJSON_AddNumberToObject(s, "coordinatorPort", pl_job_driver_port(j->rt));
    cJSON_AddItemToObject(s, "plan", pl_plan_status_json(co)); /* a new leader's */
    add_reconfig_status(s, j, co);
    add_duties_status(s, j);
    if (pl_coord_last_checkpoint(co) > 0) {
        cJSON *lc = cJSON_AddObjectToObject(s, "lastCheckpoint");
        cJSON_AddNumberToObject(lc, "step", (double)pl_coord_last_checkpoint(co));
        cJSON_AddStringToObject(lc, "time", j->last_ckpt_time);
        cJSON_AddStringToObject(lc, "dir", j->spec.checkpoint.dir);
    }
}

/* status.nodes: the workers desired, their Pods running, those training in the plan,
 * the Pods preempted and failed. */
static void add_nodes_status(cJSON *nodes, const cjob *j)
{
    int desired = j->have_spec ? (j->spec.nodes.max > 0 ? j->spec.nodes.max : j->spec.nodes.min)
                               : 0;
    int running = 0;
    for (const cpod *p = j->pods; p; p = p->next)
        running += !p->deleting && !strcmp(p->phase, "Running");
    int training = j->rt ? pl_coord_live_workers(pl_job_driver_coord(j->rt)) : 0;
    char ready[32];
    snprintf(ready, sizeof ready, "%d/%d", training, desired);
    cJSON_AddNumberToObject(nodes, "desired", desired);
    cJSON_AddNumberToObject(nodes, "running", running);
    cJSON_AddNumberToObject(nodes, "training", training);
    cJSON_AddStringToObject(nodes, "ready", ready);
    cJSON_AddNumberToObject(nodes, "preempted", j->preempted);
    cJSON_AddNumberToObject(nodes, "failed", j->failed_pods);
}

/* The status written: the phase, conditions, nodes, the coordinator's progress while it
 * runs, times, cost and the dashboard page. */
static cJSON *status_json(const cjob *j)
{
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "phase", j->phase[0] ? j->phase : "Pending");
    const cJSON *gen = cJSON_GetObjectItem(cJSON_GetObjectItem(j->obj, "metadata"), "generation");
    long long generation = pl_json_int_or(gen, 0, PL_JSON_INT_MAX, 0);
    cJSON_AddNumberToObject(s, "observedGeneration", (double)generation);
    add_conditions(s, j, generation);
    cJSON *nodes = cJSON_AddObjectToObject(s, "nodes");
    if (j->rt) add_training_status(s, j);
    add_nodes_status(nodes, j);
    if (j->start_time[0]) cJSON_AddStringToObject(s, "startTime", j->start_time);
    else cJSON_AddNullToObject(s, "startTime"); /* reset by a suspension */
    if (j->completion_time[0]) cJSON_AddStringToObject(s, "completionTime", j->completion_time);
    add_cost_status(s, j);
    char path[PL_DASHBOARD_MAX_PATH + 1];
    page_path(j, path, sizeof path);
    if (j->page) cJSON_AddStringToObject(s, "dashboard", path);
    else cJSON_AddNullToObject(s, "dashboard"); /* not served by this leader */
    return s;
}

static void update_phase_gauges(pl_controller *c)
{
    if (!c->cfg.metrics) return;
    static const char *const phases[] = {"Pending", "Profiling", "Running", "Reconfiguring",
                                         "WaitingForNodes", "Suspended", "Succeeded", "Failed"};
    for (size_t i = 0; i < sizeof phases / sizeof phases[0]; i++) {
        int n = 0;
        for (const cjob *j = c->jobs; j; j = j->next)
            n += j->obj && !strcmp(j->phase[0] ? j->phase : "Pending", phases[i]);
        char lab[64];
        snprintf(lab, sizeof lab, "phase=\"%s\"", phases[i]);
        pl_metrics_gauge_set(c->cfg.metrics, "pliant_jobs", "TrainingJobs by phase", lab, n);
    }
}

/* The job's series of /metrics, as its status shows it (a NaN loss: its series absent). */
static void update_job_metrics(pl_controller *c, cjob *j)
{
    if (!c->cfg.metrics) return;
    pl_job_sample s = {.workers_desired = j->have_spec ? (j->spec.nodes.max > 0 ? j->spec.nodes.max
                                                                                : j->spec.nodes.min)
                                                       : 0,
                       .preemptions = j->preempted, .failed_pods = j->failed_pods,
                       .reconfigurations = j->reconfigs_before, .checkpoints = j->checkpoints,
                       .loss = NAN, .validation_loss = NAN};
    if (j->rt) {
        pl_coord *co = pl_job_driver_coord(j->rt);
        s.workers_ready = pl_coord_live_workers(co);
        s.reconfigurations += pl_coord_nreconfigs(co);
        s.checkpoint_step = pl_coord_last_checkpoint(co);
        int ns = pl_coord_nsteps(co);
        if (ns > 0) s.loss = pl_coord_step_log(co, ns - 1)->loss;
        int64_t vstep;
        s.validation_loss = pl_job_driver_validation_loss(j->rt, &vstep);
    }
    if (j->have_spec && pl_job_cost_enabled(&j->spec.cost)) {
        pl_job_cost k = job_cost(j);
        s.has_cost = 1;
        s.node_hours = k.node_hours;
        s.dollars = k.dollars;
        s.on_demand_dollars = k.on_demand_dollars;
        s.samples_per_dollar = k.samples_per_dollar;
    }
    pl_job_metrics_set(c->cfg.metrics, j->ns, j->name, &s);
}

/* Also refreshes the jobs-by-phase gauges and the job's series (a phase changes only
 * with a status write; before it, so that /metrics agrees once the status shows). */
int write_status(pl_controller *c, cjob *j)
{
    /* not before the first reconcile took the status up (first_look): a new leader
     * would write its empty view (phase Pending) over the job's */
    if (!j->obj || !(j->have_spec || j->invalid)) return 0;
    if (j->rt && j->have_spec) /* the samples spec.cost prices */
        j->samples = (double)pl_coord_step(pl_job_driver_coord(j->rt)) * j->spec.batch.global;
    update_phase_gauges(c);
    update_job_metrics(c, j);
    cJSON *s = status_json(j);
    pl_kube_ref r = job_ref(j, PL_REQ_JOB_STATUS_PATCH, j->name);
    pl_kube_status st;
    int rc = API(c, JOB_STATUS_PATCH, pl_kube_patch_status(c->api, &r, s, NULL, &st), &st);
    if (!rc && cJSON_GetObjectItem(s, "profile")) j->profile_saved = 1;
    cJSON_Delete(s);
    if (rc) {
        if (st.http != 404) pl_log(PL_LOG_WARN, "%s: status: %s", j->key, st.message);
        return -1;
    }
    j->status_dirty = 0;
    j->status_ms = pl_now_ms();
    return 0;
}
