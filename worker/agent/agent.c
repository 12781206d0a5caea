#include "agent.h"

#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "allreduce.h"
#include "control_client.h"
#include "engine.h"
#include "jobspec.h"
#include "profile.h"
#include "protocol.h"
#include "sampler.h"
#include "schedule.h"
#include "stage_link.h"
#include "syncgroups.h"
#include "tcp.h"
#include "templates.h"
#include "tokens.h"
#include "trainer.h"
#include "util.h"
#include "worker_step.h"

#define LINK_RANK_OFFSET 4096
#define PEER_TIMEOUT_MS 60000

typedef struct qitem {
    char *text; /* NULL: quit */
    struct qitem *next;
} qitem;

typedef struct {
    const pl_agent_options *o;
    pl_job job;
    int have_job;
    pl_gpt_config cfg;
    pl_tokens train;
    int have_train;
    pl_sampler smp;
    pl_profile prof;
    int have_prof;
    pl_template_set ts;
    int have_ts;
    pl_ctl_client *cli;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    qitem *head, *tail;
    atomic_int done;      /* the control loop ends */
    atomic_int exit_code;

    /* compute thread state */
    kn_ctx *k;
    pl_engine e;
    int have_engine;
    pl_schedule sched;
    int have_sched;
    pl_listener *lst;
    int nranks;
    pl_conn **conns;
    pl_tcp_link *link;
    pl_syncgroups g;
    int have_groups;
    int64_t gen;
    int rank, pipe, stage, nstages;
    int first_mb, nmb, global_micro;
    int32_t *tok, *tgt;
    size_t tokcap;
} agent;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void logf_(agent *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(agent *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "worker %s: ", a->o->name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void push(agent *a, char *text)
{
    qitem *q = calloc(1, sizeof *q);
    if (!q) abort();
    q->text = text;
    pthread_mutex_lock(&a->mu);
    if (a->tail)
        a->tail->next = q;
    else
        a->head = q;
    a->tail = q;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static qitem *pop(agent *a)
{
    pthread_mutex_lock(&a->mu);
    while (!a->head) pthread_cond_wait(&a->cv, &a->mu);
    qitem *q = a->head;
    a->head = q->next;
    if (!a->head) a->tail = NULL;
    pthread_mutex_unlock(&a->mu);
    return q;
}

static void fail(agent *a, const char *what, const char *err)
{
    logf_(a, "%s: %s", what, err);
    atomic_store(&a->exit_code, 1);
    atomic_store(&a->done, 1);
}

static void teardown_links(agent *a)
{
    pthread_mutex_lock(&a->mu);
    pl_tcp_link *link = a->link;
    a->link = NULL;
    pthread_mutex_unlock(&a->mu);
    pl_tcp_link_destroy(link);
    if (a->conns) {
        for (int r = 0; r < a->nranks; r++)
            if (a->conns[r]) pl_conn_close(a->conns[r]);
        free(a->conns);
        a->conns = NULL;
    }
    if (a->have_groups) {
        pl_syncgroups_free(&a->g);
        a->have_groups = 0;
    }
    if (a->have_sched) {
        pl_schedule_free(&a->sched);
        a->have_sched = 0;
    }
}

/* Layers [begin, end) of position pos in a pipeline of n nodes (the coordinator's rule). */
static int node_layers(const agent *a, int n, int pos, int *begin, int *end)
{
    const pl_template *t = pl_template_for(&a->ts, n);
    int first = 1;
    *begin = *end = 0;
    for (int s = 0; t && s < t->nstages; s++) {
        if (t->stages[s].node != pos) continue;
        if (first || t->stages[s].layer_begin < *begin) *begin = t->stages[s].layer_begin;
        if (first || t->stages[s].layer_end > *end) *end = t->stages[s].layer_end;
        first = 0;
    }
    return first ? -1 : 0;
}

/* The port of a peer: the plan's peers first, then the --peers directory. */
static int peer_port(const agent *a, const pl_msg_plan *p, const char *name, char *host,
                     size_t hostlen)
{
    for (int i = 0; i < p->npeers; i++)
        if (!strcmp(p->peers[i].name, name)) {
            snprintf(host, hostlen, "%s", p->peers[i].host);
            return p->peers[i].port;
        }
    snprintf(host, hostlen, "127.0.0.1");
    const char *s = a->o->peers;
    size_t nl = strlen(name);
    while (s && *s) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (len > nl && !strncmp(s, name, nl) && s[nl] == '=') return atoi(s + nl + 1);
        s = comma ? comma + 1 : NULL;
    }
    return -1;
}

static int post(agent *a, pl_msg *m)
{
    int rc = pl_ctl_client_post(a->cli, m);
    pl_msg_free(m);
    return rc;
}

/* Makes the engine for [b, e) with nslots, keeping the parameters and AdamW state of
 * an engine of the same range. */
static int make_engine(agent *a, int b, int e, int nslots, char *err, size_t errlen)
{
    if (a->have_engine && a->e.begin == b && a->e.end == e && a->e.nslots == nslots) return 0;
    if (a->have_engine && (a->e.begin != b || a->e.end != e))
        return pl_errf(err, errlen,
                       "plan moves this worker from layers [%d, %d) to [%d, %d): layer copies "
                       "are not supported yet",
                       a->e.begin, a->e.end, b, e);
    if (!a->k && !(a->k = kn_create("cpu", a->o->threads, err, errlen))) return -1;
    pl_engine ne;
    if (pl_engine_create(&ne, a->k, &a->cfg, b, e, a->job.batch.micro, a->job.batch.seq_len,
                         nslots, err, errlen))
        return -1;
    if (a->have_engine) {
        size_t n = ne.nparams * sizeof(float);
        memcpy(ne.params, a->e.params, n);
        memcpy(ne.m, a->e.m, n);
        memcpy(ne.v, a->e.v, n);
        pl_engine_destroy(&a->e);
    } else if (pl_engine_init_from_job(&ne, &a->job, err, errlen)) {
        pl_engine_destroy(&ne);
        return -1;
    }
    a->e = ne;
    a->have_engine = 1;
    return 0;
}

static int install_plan(agent *a, const pl_msg *m, char *err, size_t errlen)
{
    const pl_msg_plan *p = &m->u.plan;
    teardown_links(a);
    a->gen = m->gen;
    pl_ctl_client_set_gen(a->cli, a->gen);
    a->pipe = p->you_pipeline;
    if (p->you_pipeline < 0) return 0; /* idle */
    if (p->micro != a->job.batch.micro || p->seq_len != a->job.batch.seq_len ||
        p->global_batch != a->job.batch.global)
        return pl_errf(err, errlen, "plan batch %lld×%d (micro %d) differs from the job's",
                       (long long)p->global_batch, p->seq_len, p->micro);
    /* flatten: plan ranks, stage layouts */
    int n = 0;
    for (int q = 0; q < p->npipelines; q++) n += p->pipelines[q].nnodes;
    pl_sync_pipeline *pipes = calloc((size_t)p->npipelines, sizeof *pipes);
    pl_sync_stage *stages = calloc((size_t)n, sizeof *stages);
    const char **names = calloc((size_t)n, sizeof *names);
    int rc = -1;
    if (!pipes || !stages || !names) {
        pl_errf(err, errlen, "out of memory");
        goto out;
    }
    a->rank = -1;
    for (int q = 0, r = 0; q < p->npipelines; q++) {
        const pl_msg_pipeline *mp = &p->pipelines[q];
        pipes[q].nstages = mp->nnodes;
        pipes[q].stages = &stages[r];
        for (int j = 0; j < mp->nnodes; j++, r++) {
            names[r] = mp->nodes[j];
            stages[r].rank = r;
            if (node_layers(a, mp->nnodes, j, &stages[r].layer_begin, &stages[r].layer_end)) {
                pl_errf(err, errlen, "no template for a pipeline of %d nodes", mp->nnodes);
                goto out;
            }
            if (!strcmp(mp->nodes[j], a->o->name)) {
                a->rank = r;
                a->stage = j;
                a->nstages = mp->nnodes;
                a->first_mb = (int)mp->first_microbatch;
                a->nmb = (int)mp->microbatches;
            }
        }
    }
    if (a->rank < 0) {
        pl_errf(err, errlen, "plan has a place for this worker but does not name it");
        goto out;
    }
    if (stages[a->rank].layer_begin != p->you_layer_begin ||
        stages[a->rank].layer_end != p->you_layer_end) {
        pl_errf(err, errlen, "plan gives layers [%d, %d), the templates [%d, %d)",
                p->you_layer_begin, p->you_layer_end, stages[a->rank].layer_begin,
                stages[a->rank].layer_end);
        goto out;
    }
    if (pl_syncgroups_compute(pipes, p->npipelines, a->cfg.L, &a->g, err, errlen)) goto out;
    a->have_groups = 1;
    if (pl_schedule_1f1b(a->nstages, a->stage, a->nmb, &a->sched, err, errlen)) goto out;
    a->have_sched = 1;
    if (make_engine(a, p->you_layer_begin, p->you_layer_end, a->sched.nslots, err, errlen))
        goto out;
    a->global_micro = (int)(p->global_batch / p->micro);
    size_t need = (size_t)p->global_batch * (size_t)p->seq_len;
    if (need > a->tokcap) {
        free(a->tok);
        free(a->tgt);
        a->tok = calloc(need, sizeof *a->tok);
        a->tgt = calloc(need, sizeof *a->tgt);
        a->tokcap = need;
        if (!a->tok || !a->tgt) {
            a->tokcap = 0;
            pl_errf(err, errlen, "out of memory");
            goto out;
        }
    }
    /* which ranks share a sync group with this one */
    a->nranks = n;
    a->conns = calloc((size_t)n, sizeof *a->conns);
    char *need_rank = calloc((size_t)n, 1);
    if (!a->conns || !need_rank) {
        free(need_rank);
        pl_errf(err, errlen, "out of memory");
        goto out;
    }
    const pl_sync_rank *sr = pl_syncgroups_rank(&a->g, a->rank);
    for (int i = 0; sr && i < sr->ngroups; i++) {
        const pl_sync_group *grp = pl_syncgroups_group(&a->g, sr->keys[i]);
        for (int j = 0; grp && j < grp->nranks; j++) need_rank[grp->ranks[j]] = 1;
    }
    need_rank[a->rank] = 0;
    pl_comm_ident id = {.token = a->o->token, .token_len = strlen(a->o->token),
                        .rank = a->rank, .name = a->o->name, .generation = (uint64_t)a->gen};
    pl_conn *prev = NULL, *next = NULL;
    int expect = 0;
    char host[PL_PROTO_HOST_MAX + 1];
    /* dial the lower ranks, then accept the higher ones */
    for (int r = 0; r < n && rc; r++) {
        int want_link = a->stage > 0 && r == a->rank - 1;
        if (r > a->rank) {
            expect += need_rank[r] + (a->stage + 1 < a->nstages && r == a->rank + 1);
            continue;
        }
        if (!need_rank[r] && !want_link) continue;
        int port = peer_port(a, p, names[r], host, sizeof host);
        if (port <= 0) {
            pl_errf(err, errlen, "no address for peer %s", names[r]);
            break;
        }
        if (need_rank[r] && pl_conn_connect(host, port, &id, r, PEER_TIMEOUT_MS, &a->conns[r],
                                            err, errlen))
            break;
        if (want_link) {
            pl_comm_ident lid = id;
            lid.rank = a->rank + LINK_RANK_OFFSET;
            if (pl_conn_connect(host, port, &lid, r, PEER_TIMEOUT_MS, &prev, err, errlen)) break;
        }
    }
    int ok = !err[0];
    double t0 = now_ms();
    while (ok && expect > 0) {
        pl_conn *c = NULL;
        int left = PEER_TIMEOUT_MS - (int)(now_ms() - t0);
        if (left <= 0 || pl_listener_accept(a->lst, &id, left, &c, err, errlen)) {
            if (!err[0]) pl_errf(err, errlen, "timed out waiting for peers");
            ok = 0;
            break;
        }
        int pr = pl_conn_peer_rank(c);
        if (pr == a->rank + 1 + LINK_RANK_OFFSET && a->stage + 1 < a->nstages && !next) {
            next = c;
            expect--;
        } else if (pr >= 0 && pr < n && pr > a->rank && need_rank[pr] && !a->conns[pr]) {
            a->conns[pr] = c;
            expect--;
        } else {
            pl_conn_close(c); /* a stranger */
        }
    }
    free(need_rank);
    if (!ok) {
        if (prev) pl_conn_close(prev);
        if (next) pl_conn_close(next);
        goto out;
    }
    int fp, fn;
    pl_tcp_link_pending_limits(&a->sched, &fp, &fn);
    pl_tcp_link_config lc = {.stage = a->stage, .prev = prev, .next = next,
                             .timeout_ms = PEER_TIMEOUT_MS, .max_pending_prev = fp > 0 ? fp : 1,
                             .max_pending_next = fn > 0 ? fn : 1};
    pl_tcp_link *link;
    if (pl_tcp_link_create(&lc, &link, err, errlen)) goto out;
    pthread_mutex_lock(&a->mu);
    a->link = link;
    pthread_mutex_unlock(&a->mu);
    rc = 0;
out:
    free(pipes);
    free(stages);
    free(names);
    return rc;
}

static int run_step(agent *a, int64_t s, char *err, size_t errlen)
{
    const int B = a->job.batch.micro, T = a->job.batch.seq_len;
    double t0 = now_ms();
    size_t off = (size_t)a->first_mb * (size_t)B * (size_t)T;
    if (pl_sampler_fill(&a->smp, &a->train, s, a->first_mb * B, a->nmb * B, a->tok + off,
                        a->tgt + off))
        return pl_errf(err, errlen, "sampling step %lld failed", (long long)s);
    pl_stage_link link = pl_tcp_link_stage(a->link);
    pl_peer_table peers = {a->rank, a->nranks, a->conns};
    pl_worker_step_args args = {.engine = &a->e, .schedule = &a->sched, .link = &link,
                                .tokens = a->tok, .targets = a->tgt, .first_micro = a->first_mb,
                                .global_micro = a->global_micro, .groups = &a->g,
                                .peers = &peers, .step = (uint32_t)s,
                                .timeout_ms = PEER_TIMEOUT_MS};
    pl_worker_step_result res;
    if (pl_worker_step(&args, &res, err, errlen)) return -1;
    pl_msg m;
    pl_msg_init(&m, PL_MSG_REPORT, a->gen);
    m.u.report.step = s;
    m.u.report.has_loss = res.has_loss;
    m.u.report.loss = res.loss_sum;
    m.u.report.tokens = (int64_t)a->nmb * B * T;
    m.u.report.ms = now_ms() - t0;
    m.u.report.grad_sumsq = res.grad_sumsq;
    m.u.report.samples_digest =
        a->stage == 0 ? pl_sampler_digest(&a->smp, s, a->first_mb * B, a->nmb * B) : 0;
    if (post(a, &m)) return pl_errf(err, errlen, "cannot send report");
    pl_msg_init(&m, PL_MSG_REDUCED, a->gen);
    m.u.reduced.step = s;
    if (post(a, &m)) return pl_errf(err, errlen, "cannot send reduced");
    return 0;
}

static void handle(agent *a, const pl_msg *m)
{
    char err[1024] = "";
    pl_msg r;
    switch (m->type) {
    case PL_MSG_PLAN:
        if (m->gen <= a->gen) return;
        if (install_plan(a, m, err, sizeof err)) {
            fail(a, "plan", err);
            return;
        }
        pl_msg_init(&r, PL_MSG_COPY_DONE, a->gen);
        r.u.copy_done.bytes = 0;
        post(a, &r);
        return;
    case PL_MSG_START_STEP:
        if (m->gen != a->gen || a->pipe < 0) return;
        pl_ctl_client_set_step(a->cli, m->u.start_step.step);
        /* A failed step (a peer died or its link broke) is not fatal here: the
         * coordinator learns of the loss (process end, closed connection) and
         * answers abort + a new plan, which rebuilds the links. */
        if (run_step(a, m->u.start_step.step, err, sizeof err))
            logf_(a, "step %lld failed: %s (waiting for the coordinator)",
                  (long long)m->u.start_step.step, err);
        return;
    case PL_MSG_COMMIT: {
        if (m->gen != a->gen || a->pipe < 0) return;
        const pl_optimizer_spec *o = &a->job.optimizer;
        pl_adamw w = {(float)m->u.commit.lr, (float)o->beta1, (float)o->beta2, (float)o->eps,
                      (float)o->weight_decay};
        pl_worker_apply(&a->e, &w, (float)m->u.commit.grad_scale, (int)m->u.commit.step + 1);
        pl_msg_init(&r, PL_MSG_COMMITTED, a->gen);
        r.u.committed.step = m->u.commit.step;
        post(a, &r);
        return;
    }
    default: return; /* abort: the next step zeroes the gradients */
    }
}

static void *compute_main(void *arg)
{
    agent *a = arg;
    for (;;) {
        qitem *q = pop(a);
        char *text = q->text;
        free(q);
        if (!text) break;
        pl_msg m;
        char err[256];
        if (!atomic_load(&a->done) && !pl_msg_decode(text, strlen(text), &m, err, sizeof err)) {
            handle(a, &m);
            pl_msg_free(&m);
        }
        free(text);
    }
    return NULL;
}

static void on_message(pl_ctl_client *c, const pl_msg *m, void *user)
{
    agent *a = user;
    (void)c;
    switch (m->type) {
    case PL_MSG_WELCOME:
    case PL_MSG_CHALLENGE: return;
    case PL_MSG_REFUSE:
        logf_(a, "refused: %s", m->u.refuse.reason);
        atomic_store(&a->exit_code, 1);
        atomic_store(&a->done, 1);
        return;
    case PL_MSG_STOP:
        if (m->u.stop.exit_code) logf_(a, "stopped: %s", m->u.stop.reason);
        atomic_store(&a->exit_code, m->u.stop.exit_code);
        atomic_store(&a->done, 1);
        return;
    default: {
        char *text = pl_msg_encode(m);
        if (text) push(a, text);
        return;
    }
    }
}

static void on_close(pl_ctl_client *c, const char *reason, void *user)
{
    agent *a = user;
    (void)c;
    if (!atomic_load(&a->done)) {
        logf_(a, "control connection closed: %s", reason ? reason : "");
        atomic_store(&a->exit_code, 1);
        atomic_store(&a->done, 1);
    }
}

static int setup(agent *a, char *err, size_t errlen)
{
    const pl_agent_options *o = a->o;
    if (pl_job_load(o->job_path, &a->job, err, errlen)) return -1;
    a->have_job = 1;
    if (pl_job_gpt_config(&a->job, &a->cfg, err, errlen)) return -1;
    if (pl_tokens_open(a->job.data.train, &a->train, err, errlen)) return -1;
    a->have_train = 1;
    if (pl_sampler_init(&a->smp, a->job.data.order, a->job.data.seed,
                        pl_tokens_count(&a->train), a->job.batch.seq_len, a->job.batch.global,
                        err, errlen))
        return -1;
    if (!o->profile_path) return pl_errf(err, errlen, "no planner profile (PLIANT_PROFILE)");
    if (pl_profile_load(o->profile_path, &a->prof, err, errlen)) return -1;
    a->have_prof = 1;
    int F = o->tolerate >= 0 ? o->tolerate : a->job.fault_tolerance.tolerate;
    if (pl_templates_plan(&a->prof, o->nodes, F, &a->ts, err, errlen)) return -1;
    a->have_ts = 1;
    if (pl_listener_open("127.0.0.1", o->peer_port, &a->lst, err, errlen)) return -1;
    return 0;
}

int pl_agent_run(const pl_agent_options *o)
{
    agent *a = calloc(1, sizeof *a);
    if (!a) return 1;
    a->o = o;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    char err[1024] = "";
    int started = 0;
    pthread_t th;
    atomic_store(&a->exit_code, 1);
    if (setup(a, err, sizeof err)) {
        logf_(a, "%s", err);
        goto done;
    }
    char host[PL_PROTO_HOST_MAX + 1];
    const char *colon = strrchr(o->coordinator, ':');
    if (!colon || (size_t)(colon - o->coordinator) >= sizeof host) {
        logf_(a, "bad coordinator address '%s' (HOST:PORT)", o->coordinator);
        goto done;
    }
    memcpy(host, o->coordinator, (size_t)(colon - o->coordinator));
    host[colon - o->coordinator] = 0;
    pl_ctl_client_config cc = {.host = host, .port = atoi(colon + 1), .ca_path = o->ca_path,
                               .insecure = !o->ca_path, .token = o->token,
                               .token_len = strlen(o->token), .on_message = on_message,
                               .on_close = on_close, .user = a};
    snprintf(cc.reg.job, sizeof cc.reg.job, "%s", a->job.name);
    snprintf(cc.reg.name, sizeof cc.reg.name, "%s", o->name);
    char hn[PL_PROTO_NAME_MAX + 1] = "localhost";
    gethostname(hn, sizeof hn - 1);
    for (char *p = hn; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '-' || *p == '_'))
            *p = '-';
    snprintf(cc.reg.node, sizeof cc.reg.node, "%s", hn[0] ? hn : "localhost");
    cc.reg.gpus = 0;
    cc.reg.pid = getpid();
    if (!(a->cli = pl_ctl_client_create(&cc, err, sizeof err))) {
        logf_(a, "%s", err);
        goto done;
    }
    atomic_store(&a->exit_code, 0);
    if (pthread_create(&th, NULL, compute_main, a)) {
        logf_(a, "cannot start the compute thread");
        atomic_store(&a->exit_code, 1);
        goto done;
    }
    started = 1;
    while (!atomic_load(&a->done))
        if (pl_ctl_client_service(a->cli, 50) < 0 && !atomic_load(&a->done)) {
            logf_(a, "control connection lost: %s", pl_ctl_client_close_reason(a->cli));
            atomic_store(&a->exit_code, 1);
            break;
        }
    /* let queued messages (committed) go out */
    for (int i = 0; i < 4 && pl_ctl_client_get_state(a->cli) == PL_CTL_WELCOMED; i++)
        pl_ctl_client_service(a->cli, 10);
done:;
    int code = atomic_load(&a->exit_code);
    if (started) {
        if (code) { /* a step may be blocked on a stage neighbour: wake it */
            pthread_mutex_lock(&a->mu);
            if (a->link) pl_tcp_link_abort(a->link, "worker exiting");
            pthread_mutex_unlock(&a->mu);
        }
        push(a, NULL);
        pthread_join(th, NULL);
    }
    pl_ctl_client_destroy(a->cli);
    for (qitem *q = a->head; q;) {
        qitem *nx = q->next;
        free(q->text);
        free(q);
        q = nx;
    }
    teardown_links(a);
    if (a->have_engine) pl_engine_destroy(&a->e);
    if (a->k) kn_destroy(a->k);
    if (a->lst) pl_listener_close(a->lst);
    free(a->tok);
    free(a->tgt);
    if (a->have_ts) pl_template_set_free(&a->ts);
    if (a->have_prof) pl_profile_free(&a->prof);
    if (a->have_train) pl_tokens_close(&a->train);
    if (a->have_job) pl_job_free(&a->job);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
    return code;
}
