/* The report of `pliant simulate` (sim_report.h): each strategy's timeline and plot bins
 * turned into the dashboard feed's events, written as the dashboard's static page. */
#include "sim_report.h"

#include <cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dashboard.h"
#include "dashboard_feed.h"

double pl_sim_node_hours(const pl_sim_outcome *r) { return (double)r->acct.node_ns / 3.6e12; }

double pl_sim_samples_per_s(const pl_sim_outcome *r)
{
    return r->duration_ns > 0 ? (double)r->samples / ((double)r->duration_ns / 1e9) : 0;
}

/* A growing list of event texts (owned). */
typedef struct {
    char **ev;
    int n, cap, oom;
} ev_list;

/* Appends o's text (o freed) with its type and time. */
static void push(ev_list *l, cJSON *o, const char *type, double t)
{
    if (!o || l->oom) {
        l->oom = 1;
        cJSON_Delete(o);
        return;
    }
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "t", t);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        char **ev = realloc(l->ev, (size_t)cap * sizeof *ev);
        if (!ev) l->oom = 1;
        else l->ev = ev, l->cap = cap;
    }
    if (!text || l->oom) l->oom = 1, free(text);
    else l->ev[l->n++] = text;
}

static void hello(ev_list *l, const pl_sim_report_info *info, const pl_sim_outcome *r)
{
    const pl_job *j = info->job;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddStringToObject(o, "job", j->name);
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    cJSON_AddStringToObject(o, "strategy", r->strategy);
    cJSON_AddNumberToObject(o, "tolerate", j->fault_tolerance.tolerate);
    cJSON_AddNumberToObject(o, "global_batch", j->batch.global);
    cJSON_AddNumberToObject(o, "seq_len", j->batch.seq_len);
    cJSON_AddNumberToObject(o, "eval_every", 0);
    cJSON_AddNumberToObject(o, "checkpoint_every", j->checkpoint.every);
    cJSON_AddNumberToObject(o, "model_layers", j->model.layers);
    cJSON_AddBoolToObject(o, "simulated", 1);
    push(l, o, "hello", 0);
}

/* Bin b as a step event: the steps trained by its end, its throughput, the cost so far. */
static void bin_step(ev_list *l, const pl_sim_report_info *info, const pl_sim_outcome *r, int b,
                     double samples, double node_ns)
{
    const pl_sim_account *a = &r->acct;
    double secs = (double)a->bin_ns / 1e9, gb = (double)info->job->batch.global;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", fmax(0, floor(samples / gb + 1e-9) - 1));
    cJSON_AddNumberToObject(o, "steps", (double)r->steps);
    cJSON_AddNumberToObject(o, "tokens_per_second",
                            a->bin_samples[b] / secs * info->job->batch.seq_len);
    pl_dash_cost_fields(o, node_ns / 3.6e12, samples, info->spot, info->on_demand);
    push(l, o, "step", fmin(secs * (b + 1), (double)r->duration_ns / 1e9));
}

static void copy_field(cJSON *to, const cJSON *from, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(from, name);
    if (v) cJSON_AddItemToObject(to, name, cJSON_Duplicate(v, 1));
}

static void notice(ev_list *l, const cJSON *in, const char *what, const char *detail, double t)
{
    cJSON *o = cJSON_CreateObject();
    copy_field(o, in, "step");
    const cJSON *node = cJSON_GetObjectItemCaseSensitive(in, "node");
    cJSON_AddStringToObject(o, "worker", cJSON_IsString(node) ? node->valuestring : "");
    cJSON_AddStringToObject(o, "what", what);
    cJSON_AddStringToObject(o, "detail", detail);
    push(l, o, "notice", t);
}

/* One timeline line as the feed's event; *nrec counts the reconfigurations. */
static void timeline_event(ev_list *l, const cJSON *in, int *nrec)
{
    const char *ev = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(in, "event"));
    double t = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(in, "t"));
    if (!ev) return;
    if (!strcmp(ev, "add")) return notice(l, in, "add", "the trace adds the node", t);
    if (!strcmp(ev, "notice")) return notice(l, in, "leaving", "preemption notice", t);
    if (!strcmp(ev, "remove")) return notice(l, in, "lost", "preempted", t);
    cJSON *o = cJSON_CreateObject();
    const char *type = "phase";
    if (!strcmp(ev, "reconfigure")) {
        type = "reconfig";
        cJSON_AddNumberToObject(o, "index", (*nrec)++);
        const char *f[] = {"generation", "step", "cause", "bytes_planned", "from_checkpoint",
                           "pipelines"};
        for (size_t i = 0; i < sizeof f / sizeof *f; i++) copy_field(o, in, f[i]);
        pl_dash_add_names(o, "removed",
                          cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(in, "removed")));
        pl_dash_add_names(o, "added",
                          cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(in, "added")));
    } else if (!strcmp(ev, "recovered")) {
        type = "recovered";
        cJSON_AddNumberToObject(o, "index", *nrec - 1);
        copy_field(o, in, "generation");
        copy_field(o, in, "duration_ms");
        copy_field(o, in, "bytes_copied");
    } else {
        copy_field(o, in, "phase");
        copy_field(o, in, "step");
        copy_field(o, in, "workers");
        cJSON_AddStringToObject(o, "reason", "the trace ended");
    }
    push(l, o, type, t);
}

/* One strategy's events: hello, then the timeline's lines and the bins' steps by time
 * (the last bins before the end, whatever their rounding). */
static void run_events(ev_list *l, const pl_sim_report_info *info, const pl_sim_outcome *r,
                       const char *timeline)
{
    const pl_sim_account *a = &r->acct;
    double samples = 0, node_ns = 0;
    int b = 0, nrec = 0;
    hello(l, info, r);
    for (const char *p = timeline ? timeline : ""; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        cJSON *in = cJSON_ParseWithLength(p, len);
        double t = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(in, "t"));
        const char *ev = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(in, "event"));
        if (ev && !strcmp(ev, "end")) t = INFINITY; /* every bin before the end */
        for (; in && b < a->nbins && (double)a->bin_ns * (b + 1) / 1e9 <= t; b++) {
            samples += a->bin_samples[b], node_ns += a->bin_node_ns[b];
            bin_step(l, info, r, b, samples, node_ns);
        }
        if (in) timeline_event(l, in, &nrec);
        cJSON_Delete(in);
        p += len + (nl != NULL);
    }
}

int pl_sim_report_write(FILE *f, const pl_sim_report_info *info, const pl_sim_outcome *res,
                        const char *const *names, const char *const *timelines, int n)
{
    ev_list *lists = calloc((size_t)(n > 0 ? n : 1), sizeof *lists);
    pl_dashboard_run *runs = calloc((size_t)(n > 0 ? n : 1), sizeof *runs);
    int rc = lists && runs ? 0 : -1;
    for (int i = 0; i < n && !rc; i++) {
        run_events(&lists[i], info, &res[i], timelines[i]);
        runs[i] = (pl_dashboard_run){.name = names ? names[i] : res[i].strategy,
                                     .events = (const char *const *)lists[i].ev,
                                     .n = lists[i].n};
        rc = lists[i].oom ? -1 : 0;
    }
    if (!rc) rc = pl_dashboard_write_runs(f, runs, n);
    for (int i = 0; lists && i < n; i++) {
        for (int k = 0; k < lists[i].n; k++) free(lists[i].ev[k]);
        free(lists[i].ev);
    }
    free(lists);
    free(runs);
    return rc || ferror(f) ? -1 : 0;
}
