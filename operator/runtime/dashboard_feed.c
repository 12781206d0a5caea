/* A job's dashboard events from its driver (see dashboard_feed.h). */
#include "dashboard_feed.h"

#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cJSON.h>

#define FEED_ETA_STEPS 20 /* the ETA's mean step time is over the last steps */
#define FEED_VIEW_INTS 8  /* per worker in a plan's signature */

struct pl_dash_feed {
    pl_dashboard_job *page;
    pl_job_driver *drv;
    const pl_job *job;
    pl_coord *coord;
    double t0, last_step_t;       /* seconds (pl_now_ms) */
    double step_dt[FEED_ETA_STEPS];
    int ndt;
    int *sig, nsig, capsig;       /* the last plan event's signature */
    int64_t sig_gen;
    pl_coord_phase_t phase;
    char reason[512];
    int64_t cost_ns, calls;
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double now_s(void) { return (double)pl_now_ms() / 1e3; }

/* An event object of `type` with its time ("t": seconds since the feed began). */
static cJSON *event(const pl_dash_feed *f, const char *type)
{
    cJSON *o = cJSON_CreateObject();
    if (o) {
        cJSON_AddStringToObject(o, "type", type);
        cJSON_AddNumberToObject(o, "t", round((now_s() - f->t0) * 1e3) / 1e3);
    }
    return o;
}

static void publish(pl_dash_feed *f, cJSON *o, int step)
{
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    if (text)
        pl_dashboard_publish(f->page, text, step);
    cJSON_free(text);
    cJSON_Delete(o);
}

static void publish_hello(pl_dash_feed *f)
{
    cJSON *o = event(f, "hello");
    if (!o)
        return;
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddStringToObject(o, "job", f->job->name);
    cJSON_AddNumberToObject(o, "steps", f->job->steps);
    cJSON_AddStringToObject(o, "strategy", pl_ft_strategy_name(f->job->fault_tolerance.strategy));
    cJSON_AddNumberToObject(o, "tolerate", f->job->fault_tolerance.tolerate);
    cJSON_AddNumberToObject(o, "global_batch", f->job->batch.global);
    cJSON_AddNumberToObject(o, "seq_len", f->job->batch.seq_len);
    cJSON_AddNumberToObject(o, "eval_every", f->job->eval_every);
    cJSON_AddNumberToObject(o, "checkpoint_every", f->job->checkpoint.every);
    cJSON_AddNumberToObject(o, "model_layers", f->job->model.layers);
    publish(f, o, 0);
}

pl_dash_feed *pl_dash_feed_new(pl_dashboard_job *page, pl_job_driver *drv)
{
    pl_dash_feed *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    int64_t t = mono_ns();
    f->page = page;
    f->drv = drv;
    f->job = pl_job_driver_job(drv);
    f->coord = pl_job_driver_coord(drv);
    f->t0 = f->last_step_t = now_s();
    f->phase = (pl_coord_phase_t)-1;
    f->sig_gen = -1;
    publish_hello(f);
    f->cost_ns += mono_ns() - t;
    f->calls++;
    return f;
}

void pl_dash_feed_free(pl_dash_feed *f)
{
    if (!f)
        return;
    free(f->sig);
    free(f);
}

/* Seconds left at the mean pace of the last steps; -1 before two steps. */
static double eta_s(const pl_dash_feed *f, int64_t step)
{
    if (f->ndt < 1)
        return -1;
    int n = f->ndt < FEED_ETA_STEPS ? f->ndt : FEED_ETA_STEPS;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += f->step_dt[i];
    double left = (double)f->job->steps - (double)(step + 1);
    return left > 0 ? left * sum / n : 0;
}

int pl_dash_cost_of(double node_hours, double samples, double spot, double on_demand,
                    pl_dash_cost *c)
{
    *c = (pl_dash_cost){.node_hours = node_hours};
    if (spot <= 0 && on_demand <= 0)
        return 0;
    c->usd = spot > 0 ? node_hours * spot : 0;
    c->usd_on_demand = on_demand > 0 ? node_hours * on_demand : 0;
    c->samples_per_usd = c->usd > 0 ? samples / c->usd : 0;
    c->samples_per_usd_on_demand = c->usd_on_demand > 0 ? samples / c->usd_on_demand : 0;
    return 1;
}

/* x into o[key]; nothing for 0 when `skip0`. */
static void add_cost(cJSON *o, const char *key, double x, int skip0)
{
    if (!(skip0 && x == 0))
        cJSON_AddNumberToObject(o, key, x);
}

void pl_dash_cost_fields(cJSON *o, double node_hours, double samples, double spot,
                         double on_demand)
{
    pl_dash_cost c;
    if (!pl_dash_cost_of(node_hours, samples, spot, on_demand, &c))
        return;
    add_cost(o, "node_hours", c.node_hours, 0);
    add_cost(o, "usd", c.usd, spot <= 0);
    add_cost(o, "usd_on_demand", c.usd_on_demand, on_demand <= 0);
    add_cost(o, "samples_per_usd", c.samples_per_usd, 1);
    add_cost(o, "samples_per_usd_on_demand", c.samples_per_usd_on_demand, 1);
}

static void publish_step(pl_dash_feed *f, const pl_coord_step_rec *s)
{
    double t = now_s(), dt = t - f->last_step_t;
    f->last_step_t = t;
    f->step_dt[f->ndt++ % FEED_ETA_STEPS] = dt;
    cJSON *o = event(f, "step");
    if (!o)
        return;
    double tokens = (double)f->job->batch.global * f->job->batch.seq_len;
    cJSON_AddNumberToObject(o, "step", (double)s->step);
    cJSON_AddNumberToObject(o, "steps", f->job->steps);
    if (isfinite(s->loss))
        cJSON_AddNumberToObject(o, "loss", s->loss);
    if (isfinite(s->val_loss))
        cJSON_AddNumberToObject(o, "val_loss", s->val_loss);
    cJSON_AddNumberToObject(o, "tokens_per_second", round(tokens / (dt > 1e-3 ? dt : 1e-3)));
    cJSON_AddNumberToObject(o, "generation", (double)s->generation);
    cJSON_AddStringToObject(o, "pipelines", s->pipelines);
    cJSON_AddNumberToObject(o, "eta_s", round(eta_s(f, s->step) * 10) / 10);
    pl_dash_cost_fields(o, pl_job_driver_node_hours(f->drv),
                        (double)pl_coord_nsteps(f->coord) * f->job->batch.global,
                        f->job->cost.spot, f->job->cost.on_demand);
    publish(f, o, 1);
}

void pl_dash_add_names(cJSON *o, const char *key, const char *list)
{
    cJSON *a = cJSON_AddArrayToObject(o, key);
    for (const char *p = list; a && p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char name[PL_PROTO_NAME_MAX + 1];
        snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1), p);
        if (len)
            cJSON_AddItemToArray(a, cJSON_CreateString(name));
        p = comma ? comma + 1 : NULL;
    }
}

static void publish_reconfig(pl_dash_feed *f, int index)
{
    const pl_coord_reconfig_rec *x = pl_coord_reconfig(f->coord, index);
    cJSON *o = x ? event(f, "reconfig") : NULL;
    if (!o)
        return;
    cJSON_AddNumberToObject(o, "index", index);
    cJSON_AddNumberToObject(o, "generation", (double)x->generation);
    cJSON_AddNumberToObject(o, "step", (double)x->step);
    cJSON_AddStringToObject(o, "cause", x->cause);
    pl_dash_add_names(o, "removed", x->removed);
    pl_dash_add_names(o, "added", x->added);
    cJSON_AddNumberToObject(o, "bytes_planned", (double)x->bytes_planned);
    cJSON_AddBoolToObject(o, "from_checkpoint", x->from_checkpoint);
    cJSON_AddStringToObject(o, "pipelines", x->pipelines);
    publish(f, o, 0);
}

static void publish_recovered(pl_dash_feed *f, int index, int64_t ms)
{
    const pl_coord_reconfig_rec *x = pl_coord_reconfig(f->coord, index);
    cJSON *o = x ? event(f, "recovered") : NULL;
    if (!o)
        return;
    cJSON_AddNumberToObject(o, "index", index);
    cJSON_AddNumberToObject(o, "generation", (double)x->generation);
    cJSON_AddNumberToObject(o, "duration_ms", (double)ms);
    cJSON_AddNumberToObject(o, "bytes_copied", (double)x->bytes_copied);
    publish(f, o, 0);
}

static void publish_checkpoint(pl_dash_feed *f, const pl_job_driver_event *ev)
{
    cJSON *o = event(f, "checkpoint");
    if (!o)
        return;
    cJSON_AddNumberToObject(o, "step", (double)ev->step);
    if (ev->error)
        cJSON_AddStringToObject(o, "error", ev->error);
    publish(f, o, 0);
}

void pl_dash_feed_event(pl_dash_feed *f, const pl_job_driver_event *ev)
{
    if (!f)
        return;
    int64_t t = mono_ns();
    switch (ev->kind) {
    case PL_JOB_DRIVER_STEP: publish_step(f, pl_coord_step_log(f->coord, ev->index)); break;
    case PL_JOB_DRIVER_RECONFIG: publish_reconfig(f, ev->index); break;
    case PL_JOB_DRIVER_RECOVERED: publish_recovered(f, ev->index, ev->ms); break;
    case PL_JOB_DRIVER_CHECKPOINT: publish_checkpoint(f, ev); break;
    case PL_JOB_DRIVER_RESUME:
    case PL_JOB_DRIVER_PROFILED: break;
    }
    f->cost_ns += mono_ns() - t;
    f->calls++;
}

static void publish_notice(pl_dash_feed *f, const char *worker, const char *what,
                           const char *detail)
{
    cJSON *o = event(f, "notice");
    if (!o)
        return;
    if (worker)
        cJSON_AddStringToObject(o, "worker", worker);
    cJSON_AddStringToObject(o, "what", what);
    cJSON_AddStringToObject(o, "detail", detail ? detail : "");
    cJSON_AddNumberToObject(o, "step", (double)pl_coord_step(f->coord));
    publish(f, o, 0);
}

static const char *worker_state(const pl_coord_worker_view *v)
{
    if (!v->live)
        return v->departing ? "leaving" : "lost";
    if (v->leaving)
        return "leaving";
    if (v->copying)
        return "copying";
    return v->pipeline >= 0 ? "training" : "idle";
}

static cJSON *worker_json(const pl_coord_worker_view *v)
{
    cJSON *w = cJSON_CreateObject();
    if (!w)
        return NULL;
    cJSON_AddStringToObject(w, "name", v->name);
    cJSON_AddStringToObject(w, "zone", v->zone);
    cJSON_AddStringToObject(w, "device", v->device[0] ? v->device : "cpu");
    cJSON_AddStringToObject(w, "state", worker_state(v));
    cJSON_AddNumberToObject(w, "pipeline", v->pipeline);
    cJSON_AddNumberToObject(w, "stage", v->stage);
    cJSON *l = cJSON_AddArrayToObject(w, "layers");
    if (l && v->pipeline >= 0) {
        cJSON_AddItemToArray(l, cJSON_CreateNumber(v->layer_begin));
        cJSON_AddItemToArray(l, cJSON_CreateNumber(v->layer_end));
    }
    return w;
}

/* A worker's preemption notice (`leaving`) or loss, as the coordinator saw it. */
static void notice_transition(pl_dash_feed *f, const pl_coord_worker_view *v, const int *old)
{
    if (old[0] && !v->live && !v->departing)
        publish_notice(f, v->name, "lost", "the coordinator lost it");
    else if (!old[1] && v->leaving && v->live)
        publish_notice(f, v->name, "leaving",
                       "preemption notice: it leaves at the step boundary, or at once when its "
                       "grace period would end first");
}

/* The plan's workers and their states as ints; 1 when they differ from the last ones
 * (with a notice for each worker lost or leaving since). */
static int plan_changed(pl_dash_feed *f)
{
    int n = pl_coord_nworkers(f->coord), need = n * FEED_VIEW_INTS;
    if (need > f->capsig) {
        int *s = realloc(f->sig, (size_t)need * sizeof *s);
        if (!s)
            return 0;
        f->sig = s;
        f->capsig = need;
    }
    int changed = need != f->nsig || pl_coord_generation(f->coord) != f->sig_gen;
    for (int i = 0; i < n; i++) {
        pl_coord_worker_view v;
        pl_coord_worker_view_at(f->coord, i, &v);
        int x[FEED_VIEW_INTS] = {v.live, v.leaving, v.copying, v.pipeline, v.stage,
                                 v.layer_begin, v.layer_end, v.departing};
        int *old = &f->sig[i * FEED_VIEW_INTS];
        if (i * FEED_VIEW_INTS < f->nsig && memcmp(old, x, sizeof x)) {
            changed = 1;
            notice_transition(f, &v, old);
        }
        memcpy(old, x, sizeof x);
    }
    f->nsig = need;
    f->sig_gen = pl_coord_generation(f->coord);
    return changed;
}

static void publish_plan(pl_dash_feed *f)
{
    cJSON *o = event(f, "plan");
    if (!o)
        return;
    cJSON_AddNumberToObject(o, "generation", (double)pl_coord_generation(f->coord));
    cJSON_AddNumberToObject(o, "step", (double)pl_coord_step(f->coord));
    cJSON_AddNumberToObject(o, "layers", pl_coord_nlayers(f->coord));
    cJSON *a = cJSON_AddArrayToObject(o, "workers");
    for (int i = 0; a && i < pl_coord_nworkers(f->coord); i++) {
        pl_coord_worker_view v;
        pl_coord_worker_view_at(f->coord, i, &v);
        cJSON_AddItemToArray(a, worker_json(&v));
    }
    publish(f, o, 0);
}

/* The phases every step goes through. */
static int stepping(pl_coord_phase_t ph)
{
    return ph == PL_COORD_RUNNING || ph == PL_COORD_COMMITTING || ph == PL_COORD_EVALUATING;
}

static void publish_phase(pl_dash_feed *f)
{
    pl_coord_phase_t ph = pl_coord_phase(f->coord);
    const char *why = pl_coord_reason(f->coord);
    if ((ph == f->phase || (stepping(ph) && stepping(f->phase))) && !strcmp(why, f->reason))
        return; /* the step's own phases are no news */
    f->phase = ph;
    snprintf(f->reason, sizeof f->reason, "%s", why);
    cJSON *o = event(f, "phase");
    if (!o)
        return;
    cJSON_AddStringToObject(o, "phase", pl_coord_phase_name(ph));
    cJSON_AddStringToObject(o, "reason", why);
    cJSON_AddNumberToObject(o, "step", (double)pl_coord_step(f->coord));
    cJSON_AddNumberToObject(o, "generation", (double)pl_coord_generation(f->coord));
    cJSON_AddNumberToObject(o, "workers", pl_coord_live_workers(f->coord));
    publish(f, o, 0);
}

void pl_dash_feed_poll(pl_dash_feed *f)
{
    if (!f)
        return;
    int64_t t = mono_ns();
    publish_phase(f);
    if (plan_changed(f))
        publish_plan(f);
    f->cost_ns += mono_ns() - t;
    f->calls++;
}

void pl_dash_feed_notice(pl_dash_feed *f, const char *worker, const char *what,
                         const char *detail)
{
    if (!f)
        return;
    int64_t t = mono_ns();
    publish_notice(f, worker, what, detail);
    f->cost_ns += mono_ns() - t;
    f->calls++;
}

int64_t pl_dash_feed_cost_ns(const pl_dash_feed *f, int64_t *calls)
{
    if (calls)
        *calls = f ? f->calls : 0;
    return f ? f->cost_ns : 0;
}
