/* The coordinator's entry points (coordinator.h): its configuration, life and clock, the
 * outbox of messages to the workers, the messages dispatched to their handlers, the tick
 * that times the waits out, the duties given to one worker (measuring the model,
 * completing a checkpoint), the job's end, and what callers read back. The state machine
 * itself is spread by concern over the coord_*.c files (coord_internal.h). */
#include "coord_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* The event's error (pl_coord_error); returns PL_COORD_ERR. */
int fail_err(pl_coord *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return PL_COORD_ERR;
}

/* snprintf at the end of buf, as far as it goes. */
void appendf(char *buf, size_t len, const char *fmt, ...)
{
    size_t n = strlen(buf);
    if (n + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, len - n, fmt, ap);
    va_end(ap);
}

/* One more cause of the next plan ("; " between them). */
void add_cause(pl_coord *c, const char *fmt, const char *a, const char *b)
{
    if (c->cause[0])
        appendf(c->cause, sizeof c->cause, "; ");
    appendf(c->cause, sizeof c->cause, fmt, a, b);
}

/* A new message to worker widx at the end of the outbox (the slots already drained are
 * reused first); NULL when memory ran out. */
pl_msg *push_msg(pl_coord *c, int widx, int type, int64_t gen)
{
    if (c->nout == c->capout) {
        if (c->headout > 0) {
            memmove(c->out, c->out + c->headout, (size_t)(c->nout - c->headout) * sizeof *c->out);
            c->nout -= c->headout;
            c->headout = 0;
        }
        if (c->nout == c->capout) {
            int cap = c->capout ? 2 * c->capout : 64;
            outmsg *o = realloc(c->out, (size_t)cap * sizeof *o);
            if (!o)
                return NULL;
            c->out = o;
            c->capout = cap;
        }
    }
    outmsg *o = &c->out[c->nout++];
    memcpy(o->to, c->w[widx].name, sizeof o->to);
    pl_msg_init(&o->m, type, gen);
    return &o->m;
}

/* start_step (step), abort (step, why) or stop (why, code) to worker widx. */
void send_text(pl_coord *c, int widx, int type, int64_t gen, int64_t step, const char *why,
                      int code)
{
    pl_msg *m = push_msg(c, widx, type, gen);
    if (!m)
        return;
    if (type == PL_MSG_START_STEP)
        m->u.start_step.step = step;
    else if (type == PL_MSG_ABORT) {
        m->u.abort_.step = step;
        snprintf(m->u.abort_.reason, sizeof m->u.abort_.reason, "%s", why);
    } else if (type == PL_MSG_STOP) {
        snprintf(m->u.stop.reason, sizeof m->u.stop.reason, "%s", why);
        m->u.stop.exit_code = code;
    }
}

int pl_coord_next(pl_coord *c, char *to, size_t tolen, pl_msg *out)
{
    if (c->headout >= c->nout) {
        c->headout = c->nout = 0;
        return 0;
    }
    outmsg *o = &c->out[c->headout++];
    if (to && tolen) {
        size_t n = strnlen(o->to, sizeof o->to);
        n = n < tolen - 1 ? n : tolen - 1;
        memcpy(to, o->to, n);
        to[n] = 0;
    }
    if (out)
        *out = o->m;
    else
        pl_msg_free(&o->m);
    return 1;
}

int pl_coord_pending(const pl_coord *c) { return c->nout - c->headout; }

/* stop to every live worker. */
void stop_all(pl_coord *c, const char *why, int code)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live)
            send_text(c, i, PL_MSG_STOP, c->gen, 0, why, code);
}

/* The job fails: FAILED with why as the reason, stop {1} to every live worker. */
void set_failed(pl_coord *c, const char *why)
{
    flush_eval(c);
    c->reason[0] = 0;
    appendf(c->reason, sizeof c->reason, "%s", why);
    c->phase = PL_COORD_FAILED;
    stop_all(c, why, 1);
}

/* The job is done: stop {0} to every live worker. */
void finish_job(pl_coord *c)
{
    flush_eval(c);
    c->phase = PL_COORD_DONE;
    stop_all(c, "done", 0);
}

void pl_coord_fail(pl_coord *c, const char *why)
{
    if (c->phase != PL_COORD_DONE && c->phase != PL_COORD_FAILED)
        set_failed(c, why);
}

void pl_coord_end(pl_coord *c, const char *why)
{
    if (c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED)
        return;
    c->reason[0] = 0;
    appendf(c->reason, sizeof c->reason, "%s", why);
    finish_job(c);
}

/* The planner's inputs against the configuration: 0, or -1 and err. */
static int check_planner(const pl_coord_config *cfg, const pl_profile *p, const pl_template_set *ts,
                         const pl_coverage *cov, int n_start, char *err, size_t errlen)
{
    if (!p || !ts || !cov)
        return pl_errf(err, errlen, "coordinator: profile, templates and coverage are required");
    int micro = cfg->microbatch_size ? cfg->microbatch_size : p->microbatch_size;
    if (micro != p->microbatch_size || micro < 1)
        return pl_errf(err, errlen, "microbatch_size: %d differs from the profile's %d", micro,
                       p->microbatch_size);
    if (cfg->tolerate != cov->tolerate)
        return pl_errf(err, errlen, "tolerate: %d differs from the coverage table's %d",
                       cfg->tolerate, cov->tolerate);
    if (cfg->global_batch != cov->global_batch || cfg->global_batch % micro)
        return pl_errf(err, errlen, "global_batch: %lld differs from the coverage table's %lld "
                       "or is not a multiple of %d", (long long)cfg->global_batch,
                       (long long)cov->global_batch, micro);
    if (ts->n0 < 1 || cov->count < 1)
        return pl_errf(err, errlen, "templates: no feasible template");
    if (n_start < cov->nodes_lo || n_start > PL_PROTO_MAX_NODES)
        return pl_errf(err, errlen, "n_start: %d workers cannot run a plan: need %d..%d", n_start,
                       cov->nodes_lo, PL_PROTO_MAX_NODES);
    return 0;
}

static void take_planner(pl_coord *c, const pl_profile *p, const pl_template_set *ts,
                         const pl_coverage *cov, int n_start)
{
    c->cfg.profile = p;
    c->cfg.templates = ts;
    c->cfg.coverage = cov;
    c->cfg.n_start = n_start;
    c->micro = p->microbatch_size;
    c->nlayers = p->nlayers;
    c->have_planner = 1;
}

/* The rest of the configuration: 0, or -1 and err. */
static int check_config(const pl_coord_config *cfg, char *err, size_t errlen)
{
    if (cfg->seq_len < 1 || cfg->seq_len > PL_PROTO_MAX_SEQ_LEN)
        return pl_errf(err, errlen, "seq_len: must be in 1..%d", PL_PROTO_MAX_SEQ_LEN);
    if (cfg->steps < 1 || cfg->steps > 2147483647)
        return pl_errf(err, errlen, "steps: must be >= 1");
    if (!(cfg->lr >= 0) || !(cfg->grad_clip >= 0) || !isfinite(cfg->grad_clip))
        return pl_errf(err, errlen, "lr and grad_clip: must be finite and >= 0");
    if (cfg->heartbeat_ms < PL_PROTO_HEARTBEAT_MIN_MS || cfg->heartbeat_ms > PL_PROTO_HEARTBEAT_MAX_MS)
        return pl_errf(err, errlen, "heartbeat_ms: must be in %d..%d", PL_PROTO_HEARTBEAT_MIN_MS,
                       PL_PROTO_HEARTBEAT_MAX_MS);
    if (cfg->heartbeat_misses < 0)
        return pl_errf(err, errlen, "heartbeat_misses: must be >= 0");
    if (cfg->n_start < 1 || cfg->n_start > PL_PROTO_MAX_NODES)
        return pl_errf(err, errlen, "n_start: must be in 1..%d", PL_PROTO_MAX_NODES);
    if (cfg->peer_port_base < 0 || cfg->peer_port_base > 65535)
        return pl_errf(err, errlen, "peer_port_base: must be in 0..65535");
    if (cfg->checkpoint_every < 0 || cfg->max_resets < 0 || cfg->wait_for_nodes_ms < 0 ||
        cfg->cooldown_ms < 0 || cfg->eval_every < 0)
        return pl_errf(err, errlen, "checkpoint_every, max_resets, wait_for_nodes_ms, "
                       "cooldown_ms, eval_every: must be >= 0");
    if (cfg->profile_repeat < 0 || cfg->profile_repeat > PL_PROTO_PROFILE_REPEAT_MAX)
        return pl_errf(err, errlen, "profile_repeat: must be in 0..%d", PL_PROTO_PROFILE_REPEAT_MAX);
    if (!cfg->resume_auto && (cfg->resume_step < 0 || cfg->resume_step >= cfg->steps))
        return pl_errf(err, errlen, "resume_step: %lld is not before the last step %lld",
                       (long long)cfg->resume_step, (long long)cfg->steps);
    const char *job = cfg->job ? cfg->job : "job";
    if (!*job || strlen(job) > PL_PROTO_NAME_MAX)
        return pl_errf(err, errlen, "job: bad name");
    return 0;
}

pl_coord *pl_coord_new(const pl_coord_config *cfg, char *err, size_t errlen)
{
    if (!cfg) {
        pl_errf(err, errlen, "coordinator: no configuration");
        return NULL;
    }
    const int profiling = cfg->profile_repeat > 0 && !cfg->profile;
    if ((!profiling && check_planner(cfg, cfg->profile, cfg->templates, cfg->coverage,
                                     cfg->n_start, err, errlen)) ||
        check_config(cfg, err, errlen))
        return NULL;
    pl_coord *c = calloc(1, sizeof *c);
    if (!c) {
        pl_errf(err, errlen, "coordinator: out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    c->tolerance = c->plan_tolerance = cfg->tolerate;
    snprintf(c->job, sizeof c->job, "%s", cfg->job ? cfg->job : "job");
    if (!profiling)
        take_planner(c, cfg->profile, cfg->templates, cfg->coverage, cfg->n_start);
    c->misses = cfg->heartbeat_misses ? cfg->heartbeat_misses : PL_PROTO_HEARTBEAT_MISSES;
    if (!c->cfg.peer_port_base)
        c->cfg.peer_port_base = 29500;
    c->phase = profiling ? PL_COORD_PROFILING : PL_COORD_WAITING_FOR_WORKERS;
    if (profiling)
        snprintf(c->reason, sizeof c->reason,
                 "waiting for a worker to measure the model (spec.profile: auto)");
    c->wait_since = -1;
    c->plan_ckpt = -1;
    c->profiler = -1;
    c->judge_at = -1;
    c->forgiven_gen = -1;
    c->fail_step = -1;
    c->probe_from = -1;
    c->resume_step = cfg->resume_auto ? -1 : cfg->resume_step;
    c->ckpt_last = c->resume_step > 0 ? c->resume_step : 0;
    c->step = c->ckpt_last;
    if (!c->cfg.cooldown_ms)
        c->cfg.cooldown_ms = 10000;
    return c;
}

void pl_coord_free(pl_coord *c)
{
    if (!c)
        return;
    for (int k = c->headout; k < c->nout; k++)
        pl_msg_free(&c->out[k].m);
    free(c->out);
    free(c->w);
    free(c->index);
    cplan_free(&c->cur);
    cplan_free(&c->stable);
    free(c->log);
    free(c->rec);
    for (int k = 0; k < SAVING_SLOTS; k++)
        free(c->saving[k].covered);
    free(c->nodes);
    free(c->profile_text);
    free(c->suspects);
    free(c);
}

/* The time an event brought (it never goes back); a wait for workers not timed yet is
 * timed from it. */
void note_time(pl_coord *c, int64_t now_ms)
{
    if (now_ms > c->now)
        c->now = now_ms;
    if (c->wait_since < 0 &&
        (c->phase == PL_COORD_WAITING_FOR_WORKERS || c->phase == PL_COORD_WAITING_FOR_NODES))
        c->wait_since = c->now;
}

void pl_coord_clock(pl_coord *c, int64_t now_ms)
{
    note_time(c, now_ms);
}

/* profile_request to a worker (none live: the next to register is asked). */
static void ask_profile(pl_coord *c)
{
    c->profiler = pick_worker(c);
    if (c->profiler < 0) {
        snprintf(c->reason, sizeof c->reason,
                 "waiting for a worker to measure the model (spec.profile: auto)");
        return;
    }
    pl_msg *m = push_msg(c, c->profiler, PL_MSG_PROFILE_REQUEST, c->gen);
    if (m)
        m->u.profile_request.repeat = c->cfg.profile_repeat;
    snprintf(c->reason, sizeof c->reason, "measuring the model on %s (spec.profile: auto)",
             c->w[c->profiler].name);
}

/* Duties whose worker is gone (or that found no live worker) go to another one. */
void reassign_duties(pl_coord *c)
{
    if (c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED)
        return;
    if (c->phase == PL_COORD_PROFILING && !c->profile_text &&
        (c->profiler < 0 || !c->w[c->profiler].live))
        ask_profile(c);
    for (int k = 0; k < SAVING_SLOTS; k++) {
        csaving *slot = &c->saving[k];
        if (!slot->completing || (slot->asked >= 0 && c->w[slot->asked].live))
            continue;
        ask_completion(c, slot);
        if (slot->asked < 0 && c->phase == PL_COORD_SAVING && slot->step >= c->cfg.steps) {
            snprintf(c->reason, sizeof c->reason, "the last checkpoint is incomplete: no worker "
                     "left to write its checkpoint.json");
            finish_job(c);
        }
    }
}

int pl_coord_profile_done(pl_coord *c, const char *name, const char *profile, const char *error)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0)
        return PL_COORD_ERR;
    if (c->phase != PL_COORD_PROFILING || i != c->profiler || c->profile_text)
        return PL_COORD_IGNORED;
    char why[700];
    if (!profile) {
        snprintf(why, sizeof why, "measuring the model on %s failed: %s", name,
                 error && error[0] ? error : "no profile");
        set_failed(c, why);
        return PL_COORD_OK;
    }
    if (!(c->profile_text = strdup(profile))) {
        set_failed(c, "coordinator: out of memory");
        return PL_COORD_ERR;
    }
    c->profiler = -1;
    snprintf(c->reason, sizeof c->reason, "the model was measured on %s: planning", name);
    return PL_COORD_OK;
}

int pl_coord_set_planner(pl_coord *c, const pl_profile *profile, const pl_template_set *ts,
                         const pl_coverage *coverage, int n_start)
{
    c->err[0] = 0;
    if (c->have_planner)
        return fail_err(c, "the planner is known already");
    if (c->phase != PL_COORD_PROFILING)
        return PL_COORD_IGNORED; /* the job ended meanwhile */
    char why[512];
    if (check_planner(&c->cfg, profile, ts, coverage, n_start, why, sizeof why)) {
        set_failed(c, why);
        return fail_err(c, "%s", why);
    }
    take_planner(c, profile, ts, coverage, n_start);
    c->phase = PL_COORD_WAITING_FOR_WORKERS;
    c->reason[0] = 0;
    c->wait_since = c->now;
    if (pl_coord_live_workers(c) >= n_start)
        replan(c);
    return PL_COORD_OK;
}

/* The waits that end with time: a burst of losses settled, a start with the workers
 * there after start_grace_ms, a restored plan's workers awaited, too few workers for
 * wait_for_nodes_ms (FAILED: 1). */
static int check_waits(pl_coord *c, int64_t now_ms)
{
    if (c->phase == PL_COORD_SETTLING && now_ms >= c->replan_at)
        replan(c);
    if (c->phase == PL_COORD_WAITING_FOR_WORKERS && c->cfg.start_grace_ms > 0 &&
        c->wait_since >= 0 && now_ms - c->wait_since >= c->cfg.start_grace_ms &&
        pl_coord_live_workers(c) >= c->cfg.coverage->nodes_lo)
        replan(c); /* some Pods stay Pending: train on those that run */
    if (c->phase == PL_COORD_RESUMING) {
        if (c->resume_at < 0)
            c->resume_at = now_ms + c->resume_ms;
        else if (now_ms >= c->resume_at)
            resume_done(c);
    }
    if (c->phase == PL_COORD_WAITING_FOR_WORKERS || c->phase == PL_COORD_WAITING_FOR_NODES) {
        int64_t limit = c->cfg.wait_for_nodes_ms;
        if (limit > 0 && now_ms - c->wait_since > limit) {
            char why[700];
            snprintf(why, sizeof why, "waitForNodesTimeoutSeconds (%lld) passed: %d live workers%s%s",
                     (long long)(limit / 1000), pl_coord_live_workers(c),
                     c->reason[0] ? "; " : "", c->reason);
            set_failed(c, why);
            return 1;
        }
    }
    return 0;
}

int pl_coord_tick(pl_coord *c, int64_t now_ms)
{
    c->err[0] = 0;
    note_time(c, now_ms);
    const int judged = c->judge_at >= 0 && now_ms >= c->judge_at;
    if (judged)
        judge_peers(c);
    if (check_waits(c, now_ms))
        return PL_COORD_OK;
    int *idx = malloc((size_t)(c->nw ? c->nw : 1) * sizeof *idx);
    if (!idx)
        return fail_err(c, "out of memory");
    int n = check_heartbeats(c, now_ms, idx);
    if (!n) {
        n = check_step_deadline(c, idx);
        n = n ? n : check_probe(c, idx);
    }
    free(idx);
    return n || judged ? PL_COORD_OK : PL_COORD_IGNORED;
}

int pl_coord_on_msg(pl_coord *c, const char *name, const pl_msg *m, int64_t now_ms)
{
    c->err[0] = 0;
    if (!m)
        return fail_err(c, "NULL message");
    if (note_heard(c, name, now_ms) < 0 && m->type != PL_MSG_SAVED)
        return PL_COORD_ERR; /* a worker that left still reports the checkpoint it wrote */
    switch (m->type) {
    case PL_MSG_HEARTBEAT: {
        const int i = find_live(c, name);
        if (m->gen > c->w[i].hb_gen)
            c->w[i].hb_gen = m->gen;
        return PL_COORD_OK;
    }
    case PL_MSG_LEAVING:
        return pl_coord_leaving(c, name, m->u.leaving.reason, m->u.leaving.grace_ms);
    case PL_MSG_REPORT:
        return pl_coord_report(c, name, m->gen, &m->u.report);
    case PL_MSG_REDUCED:
        return pl_coord_reduced(c, name, m->gen, m->u.reduced.step);
    case PL_MSG_COMMITTED:
        return pl_coord_committed(c, name, m->gen, m->u.committed.step);
    case PL_MSG_COPY_DONE:
        return pl_coord_copy_done(c, name, m->gen, m->u.copy_done.bytes);
    case PL_MSG_PEER_BROKEN:
        return pl_coord_peer_broken(c, name, m->gen, m->u.peer_broken.peer);
    case PL_MSG_SAVED:
        return pl_coord_saved(c, name, &m->u.saved);
    case PL_MSG_HELLO_RESUME:
        return pl_coord_hello_resume(c, name, m->gen, &m->u.hello_resume);
    case PL_MSG_NCCL_ROOT:
        return nccl_root(c, name, m->gen, m->u.nccl_root.id);
    case PL_MSG_STEP_FAILED:
        return step_failed(c, name, m->gen, m->u.step_failed.step, m->u.step_failed.reason);
    case PL_MSG_CHECKPOINT_DONE:
        return pl_coord_checkpoint_done(c, name, m->u.checkpoint_done.step,
                                        m->u.checkpoint_done.error);
    case PL_MSG_PROFILE_DONE:
        return pl_coord_profile_done(c, name, m->u.profile_done.profile,
                                     m->u.profile_done.error);
    case PL_MSG_EVAL_DONE:
        return pl_coord_eval_done(c, name, m->gen, &m->u.eval_done);
    case PL_MSG_FATAL:
        return pl_coord_fatal(c, name, m->u.fatal.reason);
    default:
        return fail_err(c, "worker \"%s\": unexpected message %s", name,
                        pl_msg_type_name(m->type));
    }
}

pl_coord_phase_t pl_coord_phase(const pl_coord *c) { return c->phase; }

const char *pl_coord_phase_name(pl_coord_phase_t p)
{
    static const char *const names[] = {"waiting_for_workers", "copying", "running", "committing",
                                        "waiting_for_nodes", "saving", "settling", "resuming",
                                        "profiling", "evaluating", "done", "failed"};
    return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "?";
}

int pl_coord_tolerance(const pl_coord *c)
{
    return c->tolerance;
}

const char *pl_coord_reason(const pl_coord *c) { return c->reason; }
const char *pl_coord_error(const pl_coord *c) { return c->err; }
int64_t pl_coord_generation(const pl_coord *c) { return c->gen; }
int64_t pl_coord_step(const pl_coord *c) { return c->step; }

int pl_coord_rank(const pl_coord *c, const char *name)
{
    int i = worker_index(c, name);
    return i < 0 ? -1 : c->w[i].rank;
}

int pl_coord_live_workers(const pl_coord *c)
{
    int n = 0;
    for (int i = 0; i < c->nw; i++)
        n += c->w[i].live;
    return n;
}

int pl_coord_worker_silent(const pl_coord *c, const char *name)
{
    int silent = 0;
    for (int i = 0; i < c->nw; i++) {
        if (strcmp(c->w[i].name, name))
            continue;
        if (c->w[i].live)
            return 0; /* registered again */
        silent |= c->w[i].silent;
    }
    return silent;
}

int pl_coord_nsteps(const pl_coord *c) { return c->nlog; }
int64_t pl_coord_last_checkpoint(const pl_coord *c) { return c->ckpt_last; }
int64_t pl_coord_resume_step(const pl_coord *c) { return c->resume_step; }
const char *pl_coord_resume_note(const pl_coord *c) { return c->resume_note; }
const char *pl_coord_profile_json(const pl_coord *c) { return c->profile_text; }

int64_t pl_coord_checkpoint_failed(const pl_coord *c, const char **why)
{
    if (why)
        *why = c->ckpt_fail;
    return c->ckpt_fail_step;
}

int pl_coord_checkpoint_failures(const pl_coord *c) { return c->ckpt_failed_total; }

const pl_coord_step_rec *pl_coord_step_log(const pl_coord *c, int i)
{
    return i >= 0 && i < c->nlog ? &c->log[i] : NULL;
}

int pl_coord_nreconfigs(const pl_coord *c) { return c->nrec; }

const pl_coord_reconfig_rec *pl_coord_reconfig(const pl_coord *c, int i)
{
    return i >= 0 && i < c->nrec ? &c->rec[i] : NULL;
}

int pl_coord_cooling_nodes(const pl_coord *c, int64_t now_ms, const char **names, int max)
{
    int n = 0;
    for (int k = 0; k < c->nnodes && n < max; k++)
        if (c->nodes[k].until > now_ms) names[n++] = c->nodes[k].name;
    return n;
}

int pl_coord_nworkers(const pl_coord *c) { return c->nw; }
int pl_coord_nlayers(const pl_coord *c) { return c->nlayers; }

int pl_coord_worker_view_at(const pl_coord *c, int i, pl_coord_worker_view *v)
{
    if (i < 0 || i >= c->nw)
        return -1;
    const cworker *w = &c->w[i];
    memset(v, 0, sizeof *v);
    v->name = w->name;
    v->zone = w->zone;
    v->device = w->device;
    v->live = w->live;
    v->leaving = w->leaving;
    v->departing = w->departing;
    v->pipeline = v->stage = -1;
    if (c->has_cur && w->pipe >= 0 && w->pipe < c->cur.npipes) {
        v->pipeline = w->pipe;
        v->stage = w->pos;
        pipe_layers(c, &c->cur.p[w->pipe], w->pos, &v->layer_begin, &v->layer_end);
        v->copying = c->phase == PL_COORD_COPYING && w->got_plan && !w->copy_done;
    }
    return 0;
}

int pl_coord_plan_pipeline(const pl_coord *c, int q, const char **names, int max,
                           int64_t *microbatches)
{
    if (!c->has_stable || q < 0 || q >= c->stable.npipes)
        return -1;
    const cpipe *p = &c->stable.p[q];
    if (microbatches)
        *microbatches = p->mb;
    for (int j = 0; j < p->nnodes && j < max; j++)
        names[j] = c->w[p->w[j]].name;
    return p->nnodes;
}

int pl_coord_plan_failover(const pl_coord *c, int q, int *layers, const char **names, int max)
{
    if (!c->has_stable || q < 0 || q >= c->stable.npipes)
        return -1;
    const cpipe *p = &c->stable.p[q];
    if (!p->layers)
        return 0;
    memcpy(layers, p->layers, ((size_t)p->nnodes + 1) * sizeof *layers);
    for (int j = 0; j < p->tn && j < max; j++)
        names[j] = c->w[p->tw[j]].name;
    return p->tn;
}
