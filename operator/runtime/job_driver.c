/* The job driver (job_driver.h): what `pliant run` and the operator do around the
 * coordinator for one TrainingJob — set-up (job, plan, token, TLS, control server,
 * a plan taken over), and in every poll the plan made from a measured profile, the
 * checkpoints and resume point the workers reported, and the disruption,
 * reconfiguration and commit times that make the recovery times and the
 * throughput. */
#include "job_driver.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coord_session.h"
#include "job_plan.h"
#include "tls_selfsigned.h"
#include "util.h"

#define MAX_RECONFIGS 4096 /* with recovery times; later ones have none */
#define RATE_STEPS 8       /* samples/s over this many last commits */
#define RESUME_MS 15000    /* a restored plan waits this long for its workers to reconnect */

struct pl_job_driver {
    pl_job_driver_config cfg;
    pl_job job;
    pl_job_plan plan;
    int have_plan, started, nmax;
    char *profile_json;              /* spec.profile auto: measured or given; NULL before */
    int profiled, profiled_reported; /* the measured profile was planned; said */
    int64_t resume_step;             /* -1 until the coordinator took it */
    int resume_reported;
    pl_coord *coord;
    pl_coord_session *session;       /* the control server and its workers */
    pl_tls_selfsigned tls;
    char token[65];
    /* checkpoints completed by a worker, and those it could not complete: reported */
    int64_t ckpt_done, ckpt_reported;
    int ckpt_failures_reported;      /* failed checkpoint attempts said */
    double val_loss;                 /* the newest validation loss, after step val_step */
    int64_t val_step;
    /* recovery: the first loss since the last plan; per reconfiguration the time of
     * its failure, its recovery and the step record that ended it */
    int64_t disrupted_ms;            /* -1: none */
    int64_t since[MAX_RECONFIGS], recovery[MAX_RECONFIGS];
    int recovered_by[MAX_RECONFIGS];
    int nrec_seen, nsteps_seen, nrecovered;
    /* what pl_job_driver_next gave */
    int rec_reported, steps_reported, recovered_reported;
    int64_t step_ms[RATE_STEPS];     /* times of the last commits, newest first */
    int nstep_ms;
    /* node time: Σ over live workers of their time, integrated at each poll */
    int64_t node_ms, node_at_ms;
    int node_live;
};

pl_job_driver *pl_job_driver_new(const pl_job_driver_config *cfg, char *err, size_t errlen)
{
    pl_job_driver *d = calloc(1, sizeof *d);
    if (!d) {
        pl_errf(err, errlen, "out of memory");
        return NULL;
    }
    d->cfg = *cfg;
    d->disrupted_ms = -1;
    d->resume_step = -1;
    d->val_loss = NAN;
    d->val_step = -1;
    for (int i = 0; i < MAX_RECONFIGS; i++) d->recovery[i] = -1;
    if (cfg->manifest ? pl_job_parse(cfg->manifest, NULL, &d->job, err, errlen)
                      : pl_job_load(cfg->path, &d->job, err, errlen)) {
        free(d);
        return NULL;
    }
    if (cfg->steps > 0) d->job.steps = cfg->steps;
    if (cfg->gpus_per_node > 0) d->job.nodes.gpus_per_node = cfg->gpus_per_node;
    if ((cfg->checkpoint_dir &&
         pl_pathf(d->job.checkpoint.dir, sizeof d->job.checkpoint.dir, err, errlen, "%s",
                  cfg->checkpoint_dir)) ||
        (cfg->profile &&
         pl_pathf(d->job.profile, sizeof d->job.profile, err, errlen, "%s", cfg->profile))) {
        pl_job_driver_free(d);
        return NULL;
    }
    return d;
}

void pl_job_driver_free(pl_job_driver *d)
{
    if (!d) return;
    pl_coord_session_free(d->session); /* before the coordinator it reports to */
    pl_coord_free(d->coord);
    pl_tls_selfsigned_remove(&d->tls);
    if (d->have_plan) pl_job_plan_free(&d->plan);
    free(d->profile_json);
    pl_job_free(&d->job);
    free(d);
}

/* cert_pem + key_pem written into a private directory, as the server wants files. */
static int write_tls(pl_tls_selfsigned *t, const char *cert_pem, const char *key_pem, char *err,
                     size_t errlen)
{
    memset(t, 0, sizeof *t);
    snprintf(t->dir, sizeof t->dir, "/tmp/pliant-job-tls-XXXXXX");
    if (!mkdtemp(t->dir)) return pl_errf(err, errlen, "mkdtemp: %s", strerror(errno));
    snprintf(t->cert_path, sizeof t->cert_path, "%s/cert.pem", t->dir);
    snprintf(t->key_path, sizeof t->key_path, "%s/key.pem", t->dir);
    if (pl_write_atomic(t->cert_path, &(pl_piece){cert_pem, strlen(cert_pem)}, 1, err, errlen) ||
        pl_write_atomic_mode(t->key_path, &(pl_piece){key_pem, strlen(key_pem)}, 1, 0600, err,
                             errlen)) {
        pl_tls_selfsigned_remove(t);
        return err[0] ? -1 : pl_errf(err, errlen, "cannot write the job's key");
    }
    return 0;
}

/* The coordinator, and the running plan it takes over when there is one. */
static int start_coord(pl_job_driver *d, char *err, size_t errlen)
{
    const pl_job_driver_config *cfg = &d->cfg;
    pl_coord_config cc = pl_job_coord_config(&d->job, d->have_plan ? &d->plan : NULL,
                                             cfg->n_start);
    cc.start_grace_ms = cfg->start_grace_ms;
    if (!(d->coord = pl_coord_new(&cc, err, errlen))) return -1;
    if (cfg->npipes > 0 &&
        pl_coord_restore(d->coord, cfg->generation, cfg->step, cfg->pipes, cfg->npipes,
                         RESUME_MS) != PL_COORD_OK)
        return pl_errf(err, errlen, "restoring the plan: %s", pl_coord_error(d->coord));
    return 0;
}

/* The token, the certificate and the control server in front of the coordinator. */
static int start_server(pl_job_driver *d, char *err, size_t errlen)
{
    const pl_job_driver_config *cfg = &d->cfg;
    if (cfg->token) snprintf(d->token, sizeof d->token, "%s", cfg->token);
    else if (pl_random_hex(d->token, 32))
        return pl_errf(err, errlen, "no random bytes for the job token");
    if (cfg->cert_pem && cfg->key_pem
            ? write_tls(&d->tls, cfg->cert_pem, cfg->key_pem, err, errlen)
            : pl_tls_selfsigned_create(&d->tls, cfg->cert_host, 0, NULL, err, errlen))
        return -1;
    pl_coord_session_config sc = {
        .coord = d->coord, .job = d->job.name, .admit = cfg->admit, .user = cfg->user,
        .server = {.host = cfg->bind_host ? cfg->bind_host : "127.0.0.1",
                   .port = cfg->port ? cfg->port : cfg->port_base,
                   .cert_path = d->tls.cert_path, .key_path = d->tls.key_path,
                   .token = d->token, .token_len = strlen(d->token)},
        .ports = cfg->port == 0 && cfg->port_base > 0 ? cfg->ports : 1,
        .port_taken = cfg->port_taken, .port_ctx = cfg->port_ctx};
    return (d->session = pl_coord_session_new(&sc, err, errlen)) ? 0 : -1;
}

/* The planner now, unless spec.profile auto has no profile yet (a worker measures it). */
static int plan_job(pl_job_driver *d, const char *profile_json, char *err, size_t errlen)
{
    const int measured = !strcmp(d->job.profile, "auto");
    if (measured && !profile_json) return 0;
    if (measured ? pl_job_plan_from_json(&d->plan, &d->job, profile_json, d->nmax, err, errlen)
                 : pl_job_plan_init(&d->plan, &d->job, d->nmax, err, errlen)) {
        pl_job_plan_free(&d->plan);
        return -1;
    }
    if (measured && !(d->profile_json = strdup(profile_json))) {
        pl_job_plan_free(&d->plan);
        return pl_errf(err, errlen, "out of memory");
    }
    d->have_plan = 1;
    return 0;
}

int pl_job_driver_start(pl_job_driver *d, char *err, size_t errlen)
{
    if (d->started) return pl_errf(err, errlen, "job driver: started already");
    d->started = 1;
    err[0] = 0;
    d->nmax = d->job.nodes.max > d->cfg.n_start ? d->job.nodes.max : d->cfg.n_start;
    if (plan_job(d, d->cfg.profile_json, err, errlen)) return -1;
    if (!d->have_plan && d->cfg.npipes > 0)
        return pl_errf(err, errlen, "taking over a running plan needs the profile a worker "
                       "measured (spec.profile auto)");
    return start_coord(d, err, errlen) || start_server(d, err, errlen) ? -1 : 0;
}

/* spec.profile auto: the profile a worker measured becomes the job's planner, or the job
 * fails naming why. */
static void plan_measured_profile(pl_job_driver *d)
{
    const char *text = pl_coord_profile_json(d->coord);
    if (d->have_plan || d->profiled || !text) return;
    d->profiled = 1;
    char err[512] = "";
    if (plan_job(d, text, err, sizeof err)) {
        char why[700];
        snprintf(why, sizeof why, "spec.profile auto: planning the measured profile: %s", err);
        pl_coord_fail(d->coord, why);
        return;
    }
    pl_coord_set_planner(d->coord, &d->plan.prof, &d->plan.ts, &d->plan.cov,
                         pl_job_plan_n_start(&d->plan, d->cfg.n_start));
}

/* The session's first loss since the last look, unless an earlier one is pending. */
static void take_disruption(pl_job_driver *d)
{
    pl_job_driver_disrupted(d, pl_coord_session_take_disruption(d->session));
}

void pl_job_driver_disrupted(pl_job_driver *d, int64_t at_ms)
{
    if (at_ms >= 0 && d->disrupted_ms < 0) d->disrupted_ms = at_ms;
}

/* New reconfigurations take the pending failure's time; a commit by their plan ends them. */
static void track_recovery(pl_job_driver *d)
{
    int64_t now = pl_now_ms();
    take_disruption(d);
    for (; d->nrec_seen < pl_coord_nreconfigs(d->coord); d->nrec_seen++) {
        if (d->nrec_seen < MAX_RECONFIGS)
            d->since[d->nrec_seen] = d->disrupted_ms >= 0 ? d->disrupted_ms : now;
        d->disrupted_ms = -1;
    }
    for (; d->nsteps_seen < pl_coord_nsteps(d->coord); d->nsteps_seen++) {
        const pl_coord_step_rec *s = pl_coord_step_log(d->coord, d->nsteps_seen);
        for (; d->nrecovered < d->nrec_seen && d->nrecovered < MAX_RECONFIGS &&
               pl_coord_reconfig(d->coord, d->nrecovered)->generation <= s->generation;
             d->nrecovered++) {
            d->recovery[d->nrecovered] = now - d->since[d->nrecovered];
            d->recovered_by[d->nrecovered] = d->nsteps_seen;
        }
        memmove(d->step_ms + 1, d->step_ms, sizeof d->step_ms - sizeof d->step_ms[0]);
        d->step_ms[0] = now;
        if (!isnan(s->val_loss)) {
            d->val_loss = s->val_loss;
            d->val_step = s->step;
        }
        if (d->nstep_ms < RATE_STEPS) d->nstep_ms++;
    }
}

/* The resume point once the coordinator took it (a checkpoint it starts from is no news),
 * then the checkpoints completed since. */
static void track_checkpoints(pl_job_driver *d)
{
    int64_t r = pl_coord_resume_step(d->coord);
    if (d->resume_step < 0 && r >= 0) {
        d->resume_step = r;
        if (d->ckpt_done < r) d->ckpt_done = d->ckpt_reported = r;
    }
    if (pl_coord_last_checkpoint(d->coord) > d->ckpt_done)
        d->ckpt_done = pl_coord_last_checkpoint(d->coord);
}

/* The live workers' time since the last poll, at the count seen then. */
static void track_node_time(pl_job_driver *d)
{
    int64_t now = pl_now_ms();
    if (d->node_at_ms > 0) d->node_ms += d->node_live * (now - d->node_at_ms);
    d->node_at_ms = now;
    d->node_live = pl_coord_live_workers(d->coord);
}

int pl_job_driver_poll(pl_job_driver *d, int timeout_ms, char *err, size_t errlen)
{
    if (pl_coord_session_poll(d->session, timeout_ms) < 0)
        return pl_errf(err, errlen, "control server failed");
    plan_measured_profile(d);
    track_checkpoints(d);
    track_recovery(d);
    track_node_time(d);
    return 0;
}

int pl_job_driver_worker_gone(pl_job_driver *d, const char *name, const char *cause)
{
    int news = pl_coord_session_lost(d->session, name, cause);
    take_disruption(d);
    return news;
}

void pl_job_driver_set_zone(pl_job_driver *d, const char *name, const char *zone)
{
    pl_coord_session_set_zone(d->session, name, zone);
}

/* Events of the workers' duties: the profile planned, the resume point, checkpoints
 * completed or not. 1 and *ev, or 0. */
static int next_duty_event(pl_job_driver *d, pl_job_driver_event *ev)
{
    if (d->profiled && d->have_plan && !d->profiled_reported) {
        d->profiled_reported = 1;
        *ev = (pl_job_driver_event){.kind = PL_JOB_DRIVER_PROFILED};
        return 1;
    }
    if (d->resume_step >= 0 && !d->resume_reported) {
        d->resume_reported = 1;
        const char *note = pl_coord_resume_note(d->coord);
        *ev = (pl_job_driver_event){.kind = PL_JOB_DRIVER_RESUME, .step = d->resume_step,
                                    .error = note[0] ? note : NULL};
        return 1;
    }
    const char *why = NULL;
    int64_t failed = pl_coord_checkpoint_failed(d->coord, &why);
    if (pl_coord_checkpoint_failures(d->coord) > d->ckpt_failures_reported) {
        d->ckpt_failures_reported = pl_coord_checkpoint_failures(d->coord);
        *ev = (pl_job_driver_event){.kind = PL_JOB_DRIVER_CHECKPOINT, .step = failed,
                                    .error = why};
        return 1;
    }
    if (d->ckpt_reported < d->ckpt_done) {
        d->ckpt_reported = d->ckpt_done;
        *ev = (pl_job_driver_event){.kind = PL_JOB_DRIVER_CHECKPOINT, .step = d->ckpt_done};
        return 1;
    }
    return 0;
}

int pl_job_driver_next(pl_job_driver *d, pl_job_driver_event *ev)
{
    memset(ev, 0, sizeof *ev);
    if (next_duty_event(d, ev)) return 1;
    if (d->rec_reported < d->nrec_seen) {
        *ev = (pl_job_driver_event){.kind = PL_JOB_DRIVER_RECONFIG, .index = d->rec_reported++};
        return 1;
    }
    if (d->steps_reported >= d->nsteps_seen) return 0;
    int j = d->recovered_reported;
    if (j < d->nrecovered && d->recovered_by[j] <= d->steps_reported) {
        *ev = (pl_job_driver_event){.kind = PL_JOB_DRIVER_RECOVERED, .index = j,
                                    .ms = d->recovery[j]};
        d->recovered_reported++;
        return 1;
    }
    *ev = (pl_job_driver_event){.kind = PL_JOB_DRIVER_STEP, .index = d->steps_reported++};
    return 1;
}

const pl_job *pl_job_driver_job(const pl_job_driver *d) { return &d->job; }
int64_t pl_job_driver_resume_step(const pl_job_driver *d) { return d->resume_step; }
const char *pl_job_driver_profile_json(const pl_job_driver *d) { return d->profile_json; }

double pl_job_driver_validation_loss(const pl_job_driver *d, int64_t *step)
{
    if (step) *step = d->val_step;
    return d->val_loss;
}
pl_coord *pl_job_driver_coord(pl_job_driver *d) { return d->coord; }

int pl_job_driver_port(const pl_job_driver *d)
{
    return pl_ctl_server_port(pl_coord_session_server(d->session));
}

const char *pl_job_driver_token(const pl_job_driver *d) { return d->token; }
const char *pl_job_driver_cert_path(const pl_job_driver *d) { return d->tls.cert_path; }

char *pl_job_driver_cert_pem(const pl_job_driver *d)
{
    return pl_read_file(d->tls.cert_path, NULL, 0);
}

char *pl_job_driver_key_pem(const pl_job_driver *d)
{
    return pl_read_file(d->tls.key_path, NULL, 0);
}

int64_t pl_job_driver_recovery_ms(const pl_job_driver *d, int i)
{
    return i >= 0 && i < MAX_RECONFIGS ? d->recovery[i] : -1;
}

double pl_job_driver_samples_per_second(const pl_job_driver *d)
{
    if (d->nstep_ms < 2) return 0;
    int64_t span = d->step_ms[0] - d->step_ms[d->nstep_ms - 1];
    return span > 0 ? 1000.0 * (d->nstep_ms - 1) * d->job.batch.global / (double)span : 0;
}

double pl_job_driver_node_hours(const pl_job_driver *d) { return (double)d->node_ms / 3.6e6; }

int pl_job_driver_connected(const pl_job_driver *d)
{
    return pl_coord_session_connected(d->session);
}
