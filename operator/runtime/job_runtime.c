#include "job_runtime.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coord_session.h"
#include "job_plan.h"
#include "tls_selfsigned.h"
#include "util.h"

#define MAX_RECONFIGS 4096
#define PORT_RANGE 256 /* control ports tried from port_base */
#define RESUME_MS 15000
#define START_GRACE_MS 20000 /* all Pods, or after this long those running (≥ (F+1)·n0) */ /* a restored plan waits this long for its workers to reconnect */

struct pl_job_runtime {
    pl_job job;
    int have_job;
    pl_job_plan plan;
    int have_plan;
    pl_coord *coord;
    pl_coord_session *session;          /* the control server and its workers */
    pl_tls_selfsigned tls;
    char token[65];
    int64_t ckpt_done;
    int64_t disrupted_ms;               /* first loss since the last plan; -1: none */
    int64_t since[MAX_RECONFIGS];       /* per reconfiguration: its failure's time */
    int64_t recovery[MAX_RECONFIGS];    /* per reconfiguration: ms to the next commit */
    int nrec_seen, nsteps_seen;
    int64_t step_ms[8];                 /* times of the last commits, for samples/s */
    int nstep_ms;
};

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
        pl_write_atomic(t->key_path, &(pl_piece){key_pem, strlen(key_pem)}, 1, err, errlen) ||
        chmod(t->key_path, 0600)) {
        pl_tls_selfsigned_remove(t);
        return err[0] ? -1 : pl_errf(err, errlen, "cannot write the job's key");
    }
    return 0;
}

pl_job_runtime *pl_job_runtime_new(const pl_job_runtime_config *cfg, char *err, size_t errlen)
{
    pl_job_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) {
        pl_errf(err, errlen, "out of memory");
        return NULL;
    }
    rt->disrupted_ms = -1;
    for (int i = 0; i < MAX_RECONFIGS; i++) rt->recovery[i] = -1;
    if (pl_job_parse(cfg->manifest, NULL, &rt->job, err, errlen)) goto fail;
    rt->have_job = 1;
    int nmax = rt->job.nodes.max > 0 ? rt->job.nodes.max : rt->job.nodes.min;
    if (pl_job_plan_init(&rt->plan, &rt->job, nmax, err, errlen)) goto fail;
    rt->have_plan = 1;
    int64_t resume = 0;
    if (pl_job_resume_step(&rt->job, &resume, err, errlen)) goto fail;
    if (resume >= rt->job.steps) {
        pl_errf(err, errlen, "the checkpoint of step %lld in %s is the last step",
                (long long)resume, rt->job.checkpoint.dir);
        goto fail;
    }
    rt->ckpt_done = resume;
    pl_coord_config cc = pl_job_coord_config(&rt->job, &rt->plan, cfg->n_start, resume);
    cc.start_grace_ms = START_GRACE_MS;
    if (!(rt->coord = pl_coord_new(&cc, err, errlen))) goto fail;
    if (cfg->npipes > 0 &&
        pl_coord_restore(rt->coord, cfg->generation, cfg->step, cfg->pipes, cfg->npipes,
                         RESUME_MS) != PL_COORD_OK) {
        pl_errf(err, errlen, "restoring the plan: %s", pl_coord_error(rt->coord));
        goto fail;
    }
    if (cfg->token) snprintf(rt->token, sizeof rt->token, "%s", cfg->token);
    else if (pl_random_hex(rt->token, 32)) {
        pl_errf(err, errlen, "no random bytes for the job token");
        goto fail;
    }
    if (cfg->cert_pem && cfg->key_pem ? write_tls(&rt->tls, cfg->cert_pem, cfg->key_pem, err, errlen)
                                      : pl_tls_selfsigned_create(&rt->tls, cfg->cert_host, 0, NULL,
                                                                 err, errlen))
        goto fail;
    pl_coord_session_config sc = {
        .coord = rt->coord, .job = rt->job.name,
        .server = {.host = cfg->bind_host ? cfg->bind_host : "0.0.0.0",
                   .port = cfg->port ? cfg->port : cfg->port_base,
                   .cert_path = rt->tls.cert_path, .key_path = rt->tls.key_path,
                   .token = rt->token, .token_len = strlen(rt->token)},
        /* a job's port: the Service's (a new leader), else the first free one of the range
         * the chart's NetworkPolicy opens */
        .ports = cfg->port == 0 && cfg->port_base > 0 ? PORT_RANGE : 1};
    if (!(rt->session = pl_coord_session_new(&sc, err, errlen))) goto fail;
    return rt;
fail:
    pl_job_runtime_free(rt);
    return NULL;
}

void pl_job_runtime_free(pl_job_runtime *rt)
{
    if (!rt) return;
    pl_coord_session_free(rt->session); /* before the coordinator it reports to */
    pl_coord_free(rt->coord);
    pl_tls_selfsigned_remove(&rt->tls);
    if (rt->have_plan) pl_job_plan_free(&rt->plan);
    if (rt->have_job) pl_job_free(&rt->job);
    free(rt);
}

/* New reconfigurations take the pending failure's time; a commit ends them. */
static void track_recovery(pl_job_runtime *rt)
{
    int64_t now = pl_now_ms(), lost = pl_coord_session_take_disruption(rt->session);
    if (lost >= 0 && rt->disrupted_ms < 0) rt->disrupted_ms = lost;
    for (; rt->nrec_seen < pl_coord_nreconfigs(rt->coord); rt->nrec_seen++) {
        if (rt->nrec_seen < MAX_RECONFIGS)
            rt->since[rt->nrec_seen] = rt->disrupted_ms >= 0 ? rt->disrupted_ms : now;
        rt->disrupted_ms = -1;
    }
    for (; rt->nsteps_seen < pl_coord_nsteps(rt->coord); rt->nsteps_seen++) {
        const pl_coord_step_rec *s = pl_coord_step_log(rt->coord, rt->nsteps_seen);
        for (int i = 0; i < rt->nrec_seen && i < MAX_RECONFIGS; i++)
            if (rt->recovery[i] < 0 && pl_coord_reconfig(rt->coord, i)->generation <= s->generation)
                rt->recovery[i] = now - rt->since[i];
        memmove(rt->step_ms + 1, rt->step_ms, sizeof rt->step_ms - sizeof rt->step_ms[0]);
        rt->step_ms[0] = now;
        if (rt->nstep_ms < 8) rt->nstep_ms++;
    }
}

int pl_job_runtime_poll(pl_job_runtime *rt, int timeout_ms)
{
    if (pl_coord_session_poll(rt->session, timeout_ms) < 0) return -1;
    track_recovery(rt);
    if (pl_coord_last_checkpoint(rt->coord) > rt->ckpt_done) {
        char err[512];
        rt->ckpt_done = pl_coord_last_checkpoint(rt->coord);
        if (pl_job_complete_checkpoint(&rt->job, rt->ckpt_done, err, sizeof err))
            fprintf(stderr, "pliant-operator: %s: checkpoint of step %lld: %s\n", rt->job.name,
                    (long long)rt->ckpt_done, err);
    }
    return 0;
}

void pl_job_runtime_worker_gone(pl_job_runtime *rt, const char *name, const char *cause)
{
    pl_coord_session_lost(rt->session, name, cause);
}

void pl_job_runtime_set_zone(pl_job_runtime *rt, const char *name, const char *zone)
{
    pl_coord_session_set_zone(rt->session, name, zone);
}

pl_coord *pl_job_runtime_coord(pl_job_runtime *rt) { return rt->coord; }
int pl_job_runtime_port(const pl_job_runtime *rt)
{
    return pl_ctl_server_port(pl_coord_session_server(rt->session));
}
const char *pl_job_runtime_token(const pl_job_runtime *rt) { return rt->token; }

char *pl_job_runtime_cert_pem(const pl_job_runtime *rt)
{
    return pl_read_file(rt->tls.cert_path, NULL, 0);
}

char *pl_job_runtime_key_pem(const pl_job_runtime *rt)
{
    return pl_read_file(rt->tls.key_path, NULL, 0);
}

int64_t pl_job_runtime_recovery_ms(const pl_job_runtime *rt, int i)
{
    return i >= 0 && i < MAX_RECONFIGS ? rt->recovery[i] : -1;
}

double pl_job_runtime_samples_per_second(const pl_job_runtime *rt)
{
    if (rt->nstep_ms < 2) return 0;
    int64_t span = rt->step_ms[0] - rt->step_ms[rt->nstep_ms - 1];
    return span > 0 ? 1000.0 * (rt->nstep_ms - 1) * rt->job.batch.global / (double)span : 0;
}

int pl_job_runtime_connected(const pl_job_runtime *rt)
{
    return pl_coord_session_connected(rt->session);
}
