/* The coordinator's workers (coordinator.c): the registry of names and ranks, joins and
 * the cooldown of failing nodes, heartbeats, notices (`leaving`), losses and what they do
 * to the phase, fatal errors, broken links weighed (peer_broken), and workers found hung
 * at a step's deadline. */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* The index (rank) of the worker of that name, live or not; -1 when unknown. */
int worker_index(const pl_coord *c, const char *name)
{
    if (!name || !c->index_cap)
        return -1;
    size_t mask = (size_t)c->index_cap - 1;
    for (size_t k = name_hash(name) & mask;; k = (k + 1) & mask) {
        int i = c->index[k];
        if (i < 0 || strcmp(c->w[i].name, name) == 0)
            return i;
    }
}

static void index_put(pl_coord *c, int i)
{
    size_t mask = (size_t)c->index_cap - 1, k = name_hash(c->w[i].name) & mask;
    while (c->index[k] >= 0)
        k = (k + 1) & mask;
    c->index[k] = i;
}

/* Worker i, the newest (named already), into the index, which grows to stay at most
 * half full: 0, or -1 when memory ran out. */
static int index_add(pl_coord *c, int i)
{
    if (2 * c->nw > c->index_cap) {
        int cap = c->index_cap ? 2 * c->index_cap : 64;
        int *x = malloc((size_t)cap * sizeof *x);
        if (!x)
            return -1;
        for (int k = 0; k < cap; k++)
            x[k] = -1;
        free(c->index);
        c->index = x;
        c->index_cap = cap;
        for (int j = 0; j < c->nw; j++)
            if (j != i)
                index_put(c, j);
    }
    index_put(c, i);
    return 0;
}

/* The live worker of that name, or -1 (and the error). */
int find_live(pl_coord *c, const char *name)
{
    int i = worker_index(c, name);
    if (i < 0) {
        fail_err(c, "unknown worker \"%s\"", name ? name : "(null)");
        return -1;
    }
    if (!c->w[i].live) {
        fail_err(c, "worker \"%s\" is no longer part of the job", name);
        return -1;
    }
    return i;
}

/* The worker a duty goes to: the lowest-ranked live one not leaving; -1 when none. */
int pick_worker(const pl_coord *c)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && !c->w[i].leaving)
            return i;
    return -1;
}

int pl_coord_set_zone(pl_coord *c, const char *name, const char *zone)
{
    c->err[0] = 0;
    int i = worker_index(c, name);
    if (i < 0)
        return fail_err(c, "unknown worker \"%s\"", name ? name : "(null)");
    if (!zone || strlen(zone) > PL_PROTO_NAME_MAX)
        return fail_err(c, "bad zone for worker \"%s\"", name);
    snprintf(c->w[i].zone, sizeof c->w[i].zone, "%s", zone);
    return PL_COORD_OK;
}

static cnode *node_find(pl_coord *c, const char *node)
{
    for (int k = 0; k < c->nnodes; k++)
        if (!strcmp(c->nodes[k].name, node))
            return &c->nodes[k];
    return NULL;
}

/* A worker on that node failed (not a `leaving`): from the second failure on,
 * the node is kept out for cooldown · 2^(failures−2), at most 64× (Elastic
 * Horovod's blacklist, with its cooldown so that a repaired node comes back). */
static void node_failed(pl_coord *c, const char *node)
{
    cnode *n = node_find(c, node);
    if (!n) {
        if (c->nnodes == c->capnodes) {
            int cap = c->capnodes ? 2 * c->capnodes : 8;
            cnode *x = realloc(c->nodes, (size_t)cap * sizeof *x);
            if (!x)
                return; /* best effort: the node is simply not kept out */
            c->nodes = x;
            c->capnodes = cap;
        }
        n = &c->nodes[c->nnodes++];
        memset(n, 0, sizeof *n);
        snprintf(n->name, sizeof n->name, "%s", node);
    }
    n->failures++;
    if (n->failures >= 2) {
        int shift = n->failures - 2 < 6 ? n->failures - 2 : 6;
        n->until = c->now + (c->cfg.cooldown_ms << shift);
    }
}

static void welcome(pl_coord *c, int i)
{
    pl_msg *m = push_msg(c, i, PL_MSG_WELCOME, c->gen);
    if (!m)
        return;
    m->u.welcome.rank = c->w[i].rank;
    memcpy(m->u.welcome.job, c->job, sizeof m->u.welcome.job);
    m->u.welcome.token_ok = c->cfg.token_ok ? 1 : 0;
    m->u.welcome.heartbeat_ms = c->cfg.heartbeat_ms;
}

/* What the worker's register said about the checkpoint directory. */
static void note_checkpoint_report(cworker *w, const pl_coord_worker_info *wi)
{
    w->has_ckpt = wi->has_checkpoint != 0;
    w->ckpt_step = wi->has_checkpoint && wi->checkpoint_step > 0 ? wi->checkpoint_step : 0;
    snprintf(w->ckpt_err, sizeof w->ckpt_err, "%s",
             wi->has_checkpoint && wi->checkpoint_error ? wi->checkpoint_error : "");
}

/* A worker of the restored plan is back (its hello_resume follows): what its register
 * says now. */
static int rejoin(pl_coord *c, int i, const pl_coord_worker_info *wi, int64_t now_ms)
{
    cworker *w = &c->w[i];
    if (wi->zone && wi->zone[0])
        snprintf(w->zone, sizeof w->zone, "%s", wi->zone);
    snprintf(w->device, sizeof w->device, "%s", wi->device ? wi->device : "");
    w->nccl = wi->nccl != 0;
    note_checkpoint_report(w, wi);
    snprintf(w->host, sizeof w->host, "%s", wi->host ? wi->host : "127.0.0.1");
    if (wi->port > 0)
        w->port = wi->port;
    w->live = 1;
    w->last_heard = now_ms;
    welcome(c, i);
    return PL_COORD_OK;
}

/* The slot of a new worker of that name: a ghost's (ghost ≥ 0; the failover's template
 * keeps the slot as its lost place), else a new one, indexed. -1 out of memory. */
static int new_slot(pl_coord *c, const char *name, int ghost)
{
    int i = ghost;
    if (i < 0 && c->nw == c->capw) {
        int cap = c->capw ? 2 * c->capw : 16;
        cworker *x = realloc(c->w, (size_t)cap * sizeof *x);
        if (!x)
            return -1;
        c->w = x;
        c->capw = cap;
    }
    if (i < 0)
        i = c->nw++;
    memset(&c->w[i], 0, sizeof c->w[i]);
    snprintf(c->w[i].name, sizeof c->w[i].name, "%s", name);
    if (i != ghost && index_add(c, i)) {
        c->nw--;
        return -1;
    }
    return i;
}

int pl_coord_worker_registered(pl_coord *c, const char *name, const char *node,
                               const char *host, int port, int64_t now_ms)
{
    pl_coord_worker_info wi = {.name = name, .node = node, .host = host, .port = port};
    return pl_coord_worker_joined(c, &wi, now_ms);
}

/* The register's fields within the protocol's limits, and a job still running: 0, or
 * ERR. */
static int check_register(pl_coord *c, const pl_coord_worker_info *wi, const char *node)
{
    const char *name = wi->name, *host = wi->host;
    if (node && (!*node || strlen(node) > PL_PROTO_NAME_MAX))
        return fail_err(c, "bad node for worker \"%s\"", name ? name : "(null)");
    if (!name || !*name || strlen(name) > PL_PROTO_NAME_MAX)
        return fail_err(c, "bad worker name");
    if (host && (!*host || strlen(host) > PL_PROTO_HOST_MAX))
        return fail_err(c, "bad host for worker \"%s\"", name);
    if (wi->port > 65535)
        return fail_err(c, "bad port %d for worker \"%s\"", wi->port, name);
    if ((wi->zone && strlen(wi->zone) > PL_PROTO_NAME_MAX) ||
        (wi->device && strlen(wi->device) > PL_PROTO_NAME_MAX))
        return fail_err(c, "bad zone or device for worker \"%s\"", name);
    if (c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED)
        return fail_err(c, "the job is %s", c->phase == PL_COORD_DONE ? "finished" : "failed");
    return 0;
}

/* A new worker may join (old: the slot of its name, a ghost's; -1: none): a name not
 * used before, room in the job, its node not cooling down. 0, or ERR. */
static int check_admission(pl_coord *c, const char *name, const char *node, int old,
                           int64_t now_ms)
{
    if (old >= 0 && !c->w[old].ghost)
        return fail_err(c, "worker \"%s\" was removed from the job; use a new name", name);
    if (pl_coord_live_workers(c) >= PL_PROTO_MAX_NODES || c->nw >= PL_PROTO_MAX_RANK)
        return fail_err(c, "too many workers (%d)", PL_PROTO_MAX_NODES);
    const cnode *cn = node_find(c, node);
    if (cn && cn->until > now_ms)
        return fail_err(c, "node %s is kept out for %lld s more after %d failures", node,
                        (long long)((cn->until - now_ms + 999) / 1000), cn->failures);
    return 0;
}

/* New worker i as its register describes it: live, idle. */
static void fill_worker(pl_coord *c, int i, const pl_coord_worker_info *wi, const char *node,
                        int64_t now_ms)
{
    cworker *w = &c->w[i];
    snprintf(w->node, sizeof w->node, "%s", node);
    snprintf(w->host, sizeof w->host, "%s", wi->host ? wi->host : "127.0.0.1");
    w->rank = i;
    w->port = wi->port > 0 ? wi->port : c->cfg.peer_port_base + i;
    if (w->port > 65535)
        w->port = 1 + (w->port - 1) % 65535;
    snprintf(w->zone, sizeof w->zone, "%s", wi->zone ? wi->zone : "");
    snprintf(w->device, sizeof w->device, "%s", wi->device ? wi->device : "");
    w->nccl = wi->nccl != 0;
    w->live = 1;
    w->last_heard = now_ms;
    set_place(c, i, -1, -1);
    note_checkpoint_report(w, wi);
}

/* When a new worker gets a place: in the first plan once n_start are there, at once while
 * the job waits for nodes, else at the next check (hostsAddedCheckEvery). */
static void place_joined(pl_coord *c, const char *name)
{
    if (c->phase == PL_COORD_PROFILING) {
        /* placed once the planner is known */
    } else if (c->phase == PL_COORD_RESUMING) {
        add_cause(c, "joined %s%s", name, "");
    } else if (c->phase == PL_COORD_WAITING_FOR_WORKERS) {
        if (pl_coord_live_workers(c) >= c->cfg.n_start)
            replan(c);
    } else if (c->phase == PL_COORD_WAITING_FOR_NODES) {
        add_cause(c, "joined %s%s", name, "");
        replan(c);
    } else {
        add_cause(c, "joined %s%s", name, "");
        c->join_pending = 1; /* placed at the next check (hostsAddedCheckEvery) */
    }
}

int pl_coord_worker_joined(pl_coord *c, const pl_coord_worker_info *wi, int64_t now_ms)
{
    const char *name = wi->name, *node = wi->node ? wi->node : wi->name;
    c->err[0] = 0;
    note_time(c, now_ms);
    if (check_register(c, wi, node))
        return PL_COORD_ERR;
    int old = worker_index(c, name);
    if (old >= 0 && c->w[old].live)
        return fail_err(c, "a worker named \"%s\" is already registered", name);
    if (old >= 0 && c->phase == PL_COORD_RESUMING && c->w[old].restored)
        return rejoin(c, old, wi, now_ms);
    if (check_admission(c, name, node, old, now_ms))
        return PL_COORD_ERR;
    int i = new_slot(c, name, old);
    if (i < 0)
        return fail_err(c, "out of memory");
    fill_worker(c, i, wi, node, now_ms);
    welcome(c, i);
    reassign_duties(c); /* a duty nobody could take (no live worker) */
    place_joined(c, name);
    return PL_COORD_OK;
}

/* Live worker `name` was heard at now_ms: its index, or -1 and the error. */
int note_heard(pl_coord *c, const char *name, int64_t now_ms)
{
    note_time(c, now_ms);
    int i = find_live(c, name);
    if (i < 0)
        return -1;
    if (now_ms > c->w[i].last_heard)
        c->w[i].last_heard = now_ms;
    return i;
}

int pl_coord_heartbeat(pl_coord *c, const char *name, int64_t step, int64_t now_ms)
{
    c->err[0] = 0;
    (void)step;
    return note_heard(c, name, now_ms) < 0 ? PL_COORD_ERR : PL_COORD_OK;
}

/* How long sending worker i's layers takes over the profile's inter-node link; without
 * one, half the grace period is kept for it. */
static int64_t copy_ms(const pl_coord *c, int i, int64_t grace_ms)
{
    const pl_profile *p = c->cfg.profile;
    if (!p || p->inter_node_GBps <= 0)
        return grace_ms / 2;
    const int64_t bytes = pl_profile_state_bytes(p, c->w[i].lb, c->w[i].le);
    return pl_transfer_ns(bytes, p->inter_node_GBps) / 1000000;
}

/* Plan worker i's notice of grace_ms ends before the running step's expected end (its
 * median time) and the copies from it: the step is better given up now than the worker
 * lost at its deadline, its layers with it. Not while the leaving workers are held in the
 * plan (leaving_held): they train on then. */
static int notice_outlasts_step(const pl_coord *c, int i, int64_t grace_ms)
{
    const int64_t median = median_step_ms(c);
    if (c->phase != PL_COORD_RUNNING || !in_pipes(c, i) || grace_ms <= 0 || median < 0 ||
        leaving_held(c))
        return 0;
    return median - (c->now - c->step_t0) + copy_ms(c, i, grace_ms) > grace_ms;
}

/* Worker i's notice came while the plan's copies run, and the plan holds it (a stage, or a
 * copy source): its copies are planned again now, with it a departing source, rather than
 * finished, a step trained and planned again at the boundary; its grace may end first. */
static int notice_during_copies(const pl_coord *c, int i)
{
    return c->phase == PL_COORD_COPYING && (in_pipes(c, i) || c->w[i].is_source) &&
           !leaving_held(c);
}

int pl_coord_leaving(pl_coord *c, const char *name, int reason, int64_t grace_ms)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0)
        return PL_COORD_ERR;
    if (c->w[i].leaving)
        return PL_COORD_IGNORED;
    c->w[i].leaving = 1;
    add_cause(c, "leaving %s (%s)", name, pl_leave_reason_name(reason));
    switch (c->phase) {
    case PL_COORD_WAITING_FOR_WORKERS:
    case PL_COORD_WAITING_FOR_NODES:
    case PL_COORD_PROFILING:
        send_text(c, i, PL_MSG_STOP, c->gen, 0, "left the job", 0);
        c->w[i].live = 0;
        reassign_duties(c);
        break;
    case PL_COORD_DONE:
    case PL_COORD_FAILED:
        break;
    default:
        if (notice_outlasts_step(c, i, grace_ms)) {
            to_pipeline_workers(c, PL_MSG_ABORT, "a worker's notice ends before the step");
            replan_soon(c); /* its plan makes the leaving workers copy sources */
        } else if (notice_during_copies(c, i)) {
            replan_soon(c);
        } else {
            c->pending = 1; /* at the step boundary */
        }
        break;
    }
    return PL_COORD_OK;
}

/* Whether losing workers idx[0..n) breaks the current phase: one in a pipeline (while
 * saving, only pipeline 0's writers count) or, while copying, a copy's source. */
static int loss_is_critical(pl_coord *c, const int *idx, int n)
{
    int critical = 0;
    for (int k = 0; k < n; k++) {
        const cworker *w = &c->w[idx[k]];
        if ((in_pipes(c, idx[k]) && (c->phase != PL_COORD_SAVING || w->pipe == 0)) ||
            (c->phase == PL_COORD_COPYING && w->is_source))
            critical = 1;
    }
    return critical;
}

/* A critical loss needs a new plan; otherwise the phase goes on without the lost
 * workers (a new plan at the boundary), and may be complete now that they are not
 * waited for. */
static void replan_or_go_on(pl_coord *c, int critical, void (*check_complete)(pl_coord *))
{
    if (critical) {
        replan_soon(c);
    } else {
        c->pending = 1;
        check_complete(c);
    }
}

/* A writer lost before its `saved` (writer_lost): the survivors hold the last state,
 * the new plan's pipeline 0 writes it again (after_step). */
static void after_saver_loss(pl_coord *c)
{
    const csaving *last = saving_slot(c, c->step);
    if (last && last->failed)
        replan_soon(c);
}

/* What losses do to the phase: workers idx[0..n), marked not live already. */
static void after_loss(pl_coord *c, const int *idx, int n)
{
    for (int k = 0; k < n; k++)
        writer_lost(c, idx[k]);
    const int critical = loss_is_critical(c, idx, n);
    switch (c->phase) {
    case PL_COORD_COPYING:
        replan_or_go_on(c, critical, check_copy_complete);
        break;
    case PL_COORD_RUNNING:
        if (critical)
            to_pipeline_workers(c, PL_MSG_ABORT, "a worker of the plan was lost");
        replan_or_go_on(c, critical, check_reduced_complete);
        break;
    case PL_COORD_COMMITTING: /* reduced already: the survivors commit it */
        replan_or_go_on(c, 0, check_committed_complete);
        break;
    case PL_COORD_EVALUATING: /* the step is committed: evaluated again under the new plan */
        replan_or_go_on(c, critical, check_eval_complete);
        break;
    case PL_COORD_SETTLING:
        replan_soon(c); /* one more loss of the same event: wait for the rest too */
        break;
    case PL_COORD_SAVING:
        after_saver_loss(c);
        break;
    default:
        break;
    }
}

/* A worker taken out while its control connection may still be open (its links or its
 * heartbeats failed): told to exit, so that its Pod or process ends and is replaced
 * rather than idling outside the job. */
static void stop_removed(pl_coord *c, int i, const char *why)
{
    char reason[600];
    snprintf(reason, sizeof reason, "removed from the job: %s", why);
    send_text(c, i, PL_MSG_STOP, c->gen, 0, reason, 1);
}

int pl_coord_worker_lost(pl_coord *c, const char *name, const char *cause)
{
    c->err[0] = 0;
    int i = worker_index(c, name);
    if (i < 0)
        return fail_err(c, "unknown worker \"%s\"", name ? name : "(null)");
    if (!c->w[i].live) { /* gone after its stop (it left): a write it had yet to report */
        writer_gone_after_leaving(c, i);
        const int owed = c->w[i].departing && c->phase == PL_COORD_COPYING && c->w[i].is_source;
        c->w[i].departing = 0;
        if (!owed)
            return PL_COORD_IGNORED;
        /* its notice ran out before its copies were done: planned again without it */
        add_cause(c, "lost %s (%s) before its copies were sent", name, cause ? cause : "?");
        replan_soon(c);
        return PL_COORD_OK;
    }
    c->w[i].live = 0;
    add_cause(c, "lost %s (%s)", name, cause ? cause : "?");
    if (!c->w[i].leaving)
        node_failed(c, c->w[i].node);
    after_loss(c, &i, 1);
    reassign_duties(c);
    return PL_COORD_OK;
}

/* Every worker that registered failed, each with the same fatal error, and at least
 * min(n_start, 2) of them: the job is at fault, not its nodes (Elastic Horovod's rule). */
static int same_failure_everywhere(const pl_coord *c)
{
    const int enough = c->cfg.n_start < 2 ? c->cfg.n_start : 2;
    return c->fatal_same && c->nfatal >= enough && pl_coord_live_workers(c) == 0;
}

int pl_coord_fatal(pl_coord *c, const char *name, const char *reason)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0)
        return PL_COORD_ERR;
    if (!reason || !reason[0])
        return fail_err(c, "worker \"%s\": fatal without a reason", name);
    if (c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED)
        return PL_COORD_IGNORED; /* it exits anyway */
    /* a reason another worker gave too is the job's: its node is not to blame */
    const int repeated = c->nfatal > 0 && !strncmp(c->fatal_reason, reason,
                                                   sizeof c->fatal_reason - 1);
    if (!c->nfatal) {
        snprintf(c->fatal_reason, sizeof c->fatal_reason, "%s", reason);
        c->fatal_same = 1;
    } else if (!repeated) {
        c->fatal_same = 0;
    }
    c->nfatal++;
    cworker *w = &c->w[i];
    send_text(c, i, PL_MSG_STOP, c->gen, 0, reason, 1);
    w->live = 0;
    add_cause(c, "failed %s (%.200s)", name, reason);
    if (!repeated && !w->leaving)
        node_failed(c, w->node);
    if (same_failure_everywhere(c)) {
        char why[700];
        snprintf(why, sizeof why, "every worker failed the same way (%d workers): %.400s; a bug "
                 "in the job or its data, not a node failure", c->nfatal, c->fatal_reason);
        set_failed(c, why);
        return PL_COORD_OK;
    }
    after_loss(c, &i, 1);
    reassign_duties(c);
    return PL_COORD_OK;
}

/* Distinct live workers that share a reported broken link with worker w. */
static int broken_links(const pl_coord *c, int w)
{
    int n = 0;
    for (int k = 0; k < c->nsuspects; k++) {
        const cpair *p = &c->suspects[k];
        int other = p->reporter == w ? p->peer : p->peer == w ? p->reporter : -1;
        if (other < 0 || !c->w[other].live || !c->w[w].live)
            continue;
        int seen = 0;
        for (int j = 0; j < k && !seen; j++) {
            const cpair *q = &c->suspects[j];
            seen = (q->reporter == w && q->peer == other) || (q->peer == w && q->reporter == other);
        }
        n += !seen;
    }
    return n;
}

/* The live worker at the other end of w's first reported broken link. */
static int broken_partner(const pl_coord *c, int w)
{
    for (int k = 0; k < c->nsuspects; k++) {
        const cpair *p = &c->suspects[k];
        int other = p->reporter == w ? p->peer : p->peer == w ? p->reporter : -1;
        if (other >= 0 && c->w[other].live)
            return other;
    }
    return -1;
}

/* A link that broke with no other broken link beside it names no culprit (a frame
 * altered on the way, a reset): the first time, the plan is made again with both ends
 * (a running step is aborted and redone); the same link broken again within two
 * generations loses one of them. */
static int forgive_lone_link(pl_coord *c, int w)
{
    const int other = broken_partner(c, w);
    const cpair *f = &c->forgiven;
    const int again = c->forgiven_gen >= 0 && c->gen - c->forgiven_gen <= 2 &&
                      ((f->reporter == w && f->peer == other) ||
                       (f->reporter == other && f->peer == w));
    if (again)
        return 0;
    c->forgiven = (cpair){w, other};
    c->forgiven_gen = c->gen;
    char why[2 * sizeof(pl_proto_name) + 40];
    snprintf(why, sizeof why, "the link between %s and %s broke", c->w[w].name,
             other >= 0 ? c->w[other].name : "?");
    if (c->phase == PL_COORD_RUNNING || c->phase == PL_COORD_COPYING ||
        c->phase == PL_COORD_COMMITTING || c->phase == PL_COORD_EVALUATING) {
        if (c->phase == PL_COORD_RUNNING) /* no attempt counted: it happens once */
            to_pipeline_workers(c, PL_MSG_ABORT, why);
        add_cause(c, "%s%s", why, "");
        replan_soon(c);
    }
    return 1;
}

/* The reports weighed together: while a reported link joins two live workers, the one
 * with the most broken links is lost (a node cut off from its peers is reported by each
 * of them, and reports each of them); a tie goes to the peer reported first, once the
 * same lone link broke twice (forgive_lone_link). */
void judge_peers(pl_coord *c)
{
    c->judge_at = -1;
    if (c->suspects_gen != c->gen)
        c->nsuspects = 0; /* the links they were about are gone */
    for (;;) {
        int lost = -1, most = 0;
        for (int k = 0; k < c->nsuspects; k++) {
            const int cand[2] = {c->suspects[k].peer, c->suspects[k].reporter};
            for (int j = 0; j < 2; j++) {
                int n = broken_links(c, cand[j]);
                if (n > most) {
                    most = n;
                    lost = cand[j];
                }
            }
        }
        if (lost < 0 || (most == 1 && forgive_lone_link(c, lost)))
            break;
        char why[512] = "peer_broken: its links to";
        for (int k = 0, first = 1; k < c->nsuspects; k++) {
            const cpair *p = &c->suspects[k];
            int other = p->peer == lost ? p->reporter : p->reporter == lost ? p->peer : -1;
            if (other >= 0 && c->w[other].live && !strstr(why, c->w[other].name)) {
                appendf(why, sizeof why, "%s %s", first ? "" : ",", c->w[other].name);
                first = 0;
            }
        }
        appendf(why, sizeof why, " broke");
        pl_coord_worker_lost(c, c->w[lost].name, why);
        stop_removed(c, lost, why);
    }
    c->nsuspects = 0;
}

int pl_coord_peer_broken(pl_coord *c, const char *name, int64_t gen, const char *peer)
{
    int rc = PL_COORD_OK;
    int i = gen_check(c, name, gen, &rc);
    if (i < 0)
        return rc;
    int p = worker_index(c, peer);
    if (p < 0 || p == i || !c->w[p].live)
        return PL_COORD_IGNORED;
    if (c->suspects_gen != gen)
        c->nsuspects = 0;
    if (c->nsuspects == c->capsuspects) {
        int cap = c->capsuspects ? 2 * c->capsuspects : 8;
        cpair *np = realloc(c->suspects, (size_t)cap * sizeof *np);
        if (!np)
            return fail_err(c, "out of memory");
        c->suspects = np;
        c->capsuspects = cap;
    }
    c->suspects[c->nsuspects++] = (cpair){i, p};
    c->suspects_gen = gen;
    if (c->judge_at < 0)
        c->judge_at = c->now + c->cfg.peer_judge_ms;
    if (c->cfg.peer_judge_ms <= 0)
        judge_peers(c);
    return PL_COORD_OK;
}

/* Declares lost every live worker silent for more than misses × heartbeat_ms. idx: room
 * for every worker. The count lost. */
int check_heartbeats(pl_coord *c, int64_t now_ms, int *idx)
{
    const int64_t limit = (int64_t)c->misses * c->cfg.heartbeat_ms;
    int n = 0;
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && now_ms - c->w[i].last_heard > limit) {
            c->w[i].live = 0;
            c->w[i].silent = 1;
            add_cause(c, "lost %s (%s)", c->w[i].name, "missed heartbeats");
            if (!c->w[i].leaving)
                node_failed(c, c->w[i].node);
            stop_removed(c, i, "missed heartbeats");
            idx[n++] = i;
        }
    if (n) {
        after_loss(c, idx, n);
        reassign_duties(c);
    }
    return n;
}

/* Takes plan worker i out as hung (its control thread may still heartbeat): lost, told to
 * exit, and silent, so that the front end ends its process. */
static void lose_hung(pl_coord *c, int i, const char *why, int *idx, int *n)
{
    cworker *w = &c->w[i];
    w->live = 0;
    w->silent = 1;
    add_cause(c, "lost %s (%s)", w->name, why);
    node_failed(c, w->node);
    stop_removed(c, i, why);
    idx[(*n)++] = i;
}

/* The running step passed its deadline (pl_coord_step_deadline). COMMITTING: applying a
 * commit waits on nobody, so the workers without `committed` are hung and lost. RUNNING:
 * a stuck compute thread blocks its stage neighbours and the all-reduce partners too, so
 * the step is aborted and planned again with the same workers; those whose compute thread
 * does not take the new plan (check_probe) are the hung ones. idx: room for every worker.
 * The count lost. */
int check_step_deadline(pl_coord *c, int *idx)
{
    const int running = c->phase == PL_COORD_RUNNING;
    if (!running && c->phase != PL_COORD_COMMITTING)
        return 0;
    const int64_t limit = pl_coord_step_deadline(c);
    if (limit < 0 || c->now - c->step_t0 <= limit)
        return 0;
    char why[160];
    snprintf(why, sizeof why, "step %lld not %s within its deadline of %.1f s", (long long)c->step,
             running ? "reported" : "committed", (double)limit / 1000.0);
    int n = 0;
    if (running) {
        add_cause(c, "%s%s", why, ": aborted, planned again");
        to_pipeline_workers(c, PL_MSG_ABORT, why);
        c->probe_from = c->gen;
        c->probe_t0 = c->now + (c->cfg.settle_ms > 0 ? c->cfg.settle_ms : 0); /* replanned */
        c->probe_ms = limit;
        replan_soon(c);
        return 1;
    }
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && in_pipes(c, i) && !c->w[i].committed)
            lose_hung(c, i, why, idx, &n);
    if (n) {
        after_loss(c, idx, n);
        reassign_duties(c);
    }
    return n;
}

/* The plan made after a step deadline: the workers whose heartbeats still carry an older
 * generation probe_ms after it went out have a compute thread that never took it (the
 * others' aborted step let theirs go): lost as hung. The count lost. */
int check_probe(pl_coord *c, int *idx)
{
    if (c->probe_from < 0 || c->gen <= c->probe_from)
        return 0;
    if (c->phase != PL_COORD_COPYING) {
        c->probe_from = -1; /* the plan went through */
        return 0;
    }
    if (c->now - c->probe_t0 <= c->probe_ms)
        return 0;
    char why[160];
    snprintf(why, sizeof why, "hung: plan %lld not taken within %.1f s of the step deadline",
             (long long)c->gen, (double)c->probe_ms / 1000.0);
    int n = 0;
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && c->w[i].got_plan && !c->w[i].copy_done && c->w[i].hb_gen < c->gen)
            lose_hung(c, i, why, idx, &n);
    c->probe_from = -1;
    if (n) {
        after_loss(c, idx, n);
        reassign_duties(c);
    }
    return n;
}
