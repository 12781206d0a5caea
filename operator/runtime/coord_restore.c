/* The coordinator taken over (docs/protocol.md "A restarted coordinator"): a new operator
 * leader restores the running plan (pl_coord_restore), its workers come back with
 * hello_resume, and the step that was in flight is settled before the next plan. */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every restored worker is back, or the wait is over: settle the step that was
 * in flight, then plan from the restored plan without the missing workers. */
void resume_done(pl_coord *c)
{
    int64_t last = -1;
    int committer = -1;
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && c->w[i].resumed && c->w[i].r_committed > last) {
            last = c->w[i].r_committed;
            committer = i;
        }
    for (int i = 0; i < c->nw; i++) {
        cworker *w = &c->w[i];
        if (!w->live || !w->resumed || w->r_reduced < 0)
            continue;
        if (committer >= 0 && w->r_reduced == last) { /* the old coordinator committed it */
            pl_msg *m = push_msg(c, i, PL_MSG_COMMIT, c->gen);
            if (m) {
                m->u.commit.step = last;
                m->u.commit.grad_scale = c->w[committer].r_scale;
                m->u.commit.lr = c->w[committer].r_lr;
            }
        } else if (w->r_reduced > last) { /* committed nowhere: dropped everywhere */
            send_text(c, i, PL_MSG_ABORT, c->gen, w->r_reduced, "the coordinator changed", 0);
        }
    }
    if (committer >= 0)
        c->step = last + 1;
    c->transport = plan_transport(c);
    if (c->cfg.resume_auto) { /* what a fatal loss would restart from */
        int nread, nerr, differ;
        const int64_t best = newest_reported(c, &nread, &nerr, &differ);
        if (best > c->ckpt_last && best <= c->step)
            c->ckpt_last = best;
    }
    add_cause(c, "%s%s", "resumed by a new coordinator", "");
    replan(c);
}

/* A restored failover's bounds and template workers: 0, or -1 and the error. */
static int check_restored_failover(pl_coord *c, int q, const pl_coord_pipe *p)
{
    const int n = p->ntemplate;
    if (!c->cfg.strategy_redundant || n <= p->nnodes || !p->template_nodes)
        return fail_err(c, "restore: pipeline %d: layers: a failover's bounds need strategy "
                        "redundant and template_nodes beyond the %d workers", q, p->nnodes);
    for (int j = 0; j <= p->nnodes; j++) {
        const int b = p->layers[j];
        if ((!j && b) || (j && b <= p->layers[j - 1]) || (j == p->nnodes && b != c->nlayers))
            return fail_err(c, "restore: pipeline %d: layers[%d]: %d (bounds rise from 0 to "
                            "%d)", q, j, b, c->nlayers);
    }
    for (int j = 0; j < n; j++)
        if (!p->template_nodes[j])
            return fail_err(c, "restore: pipeline %d: template_nodes[%d]: no name", q, j);
    for (int k = 0; k < p->nnodes; k++) {
        int seen = 0;
        for (int j = 0; p->nodes[k] && j < n; j++)
            seen += !strcmp(p->nodes[k], p->template_nodes[j]);
        if (seen != 1)
            return fail_err(c, "restore: pipeline %d: template_nodes: nodes[%d] is there %d "
                            "times, not once", q, k, seen);
    }
    return 0;
}

/* Pipeline q of a plan to restore, against the planner: 0, or -1 and the error. */
static int check_restored(pl_coord *c, int q, const pl_coord_pipe *p)
{
    const int n = p->layers ? p->ntemplate : p->nnodes;
    if (p->nnodes < 1 || p->nnodes > PL_PROTO_MAX_NODES || !p->nodes)
        return fail_err(c, "restore: pipeline %d: nodes: %d workers", q, p->nnodes);
    if (p->microbatches < 1 || p->microbatches > c->cfg.global_batch)
        return fail_err(c, "restore: pipeline %d: microbatches: %lld, not 1..%lld", q,
                        (long long)p->microbatches, (long long)c->cfg.global_batch);
    if (!p->layers && (p->ntemplate || p->template_nodes))
        return fail_err(c, "restore: pipeline %d: template_nodes without layers", q);
    if (!pl_template_for(c->cfg.templates, n))
        return fail_err(c, "restore: pipeline %d: %s: no template for %d workers", q,
                        p->layers ? "template_nodes" : "nodes", n);
    return p->layers ? check_restored_failover(c, q, p) : 0;
}

/* A worker of a plan to restore, at field[j] of pipeline q: registered, not live until it
 * reconnects (a ghost: never). Its index, or -1 and the error. */
static int restore_worker(pl_coord *c, int q, const char *field, int j, const char *name,
                          int ghost)
{
    if (worker_index(c, name) >= 0)
        return fail_err(c, "restore: pipeline %d: %s[%d]: %s is listed twice", q, field, j,
                        name);
    if (pl_coord_worker_registered(c, name, NULL, NULL, 0, c->now) != PL_COORD_OK) {
        char why[sizeof c->err];
        memcpy(why, c->err, sizeof why);
        return fail_err(c, "restore: pipeline %d: %s[%d]: %s", q, field, j, why);
    }
    cworker *w = &c->w[c->nw - 1];
    w->live = 0;
    w->restored = !ghost;
    w->ghost = ghost;
    return c->nw - 1;
}

/* Restored pipeline q's workers: 0, or -1 and the error. */
static int restore_pipe(pl_coord *c, int q, const pl_coord_pipe *p, cpipe *cq)
{
    cq->mb = p->microbatches;
    if (!(cq->w = malloc((size_t)p->nnodes * sizeof(int))))
        return fail_err(c, "out of memory");
    for (; cq->nnodes < p->nnodes; cq->nnodes++)
        if ((cq->w[cq->nnodes] = restore_worker(c, q, "nodes", cq->nnodes,
                                                p->nodes[cq->nnodes], 0)) < 0)
            return -1;
    return 0;
}

/* A restored failover's bounds and template workers, its lost ones as ghosts (after
 * every pipeline's workers, so that a name of two pipelines is an error). 0, or -1. */
static int restore_failover(pl_coord *c, int q, const pl_coord_pipe *p, cpipe *cq)
{
    cq->tn = p->ntemplate;
    cq->tw = malloc((size_t)cq->tn * sizeof(int));
    cq->layers = malloc(((size_t)cq->nnodes + 1) * sizeof(int));
    if (!cq->tw || !cq->layers)
        return fail_err(c, "out of memory");
    memcpy(cq->layers, p->layers, ((size_t)cq->nnodes + 1) * sizeof(int));
    for (int j = 0; j < cq->tn; j++) {
        int i = -1;
        for (int k = 0; k < cq->nnodes; k++)
            if (!strcmp(c->w[cq->w[k]].name, p->template_nodes[j]))
                i = cq->w[k];
        if (i < 0 && (i = restore_worker(c, q, "template_nodes", j, p->template_nodes[j], 1)) < 0)
            return -1;
        cq->tw[j] = i;
    }
    return 0;
}

/* The restored plan p, checked, into c (its workers registered). 0, or -1 and the error. */
static int restore_plan(pl_coord *c, const pl_coord_pipe *pipes, int npipes, cplan *p)
{
    int64_t mb = 0;
    for (int q = 0; q < npipes; q++) {
        if (check_restored(c, q, &pipes[q]))
            return -1;
        mb += pipes[q].microbatches;
    }
    if (mb * c->micro != c->cfg.global_batch)
        return fail_err(c, "restore: microbatches: %lld of %d samples, the batch is %lld",
                        (long long)mb, c->micro, (long long)c->cfg.global_batch);
    if (!(p->p = calloc((size_t)npipes, sizeof *p->p)))
        return fail_err(c, "out of memory");
    p->npipes = npipes;
    for (int q = 0; q < npipes; q++)
        if (restore_pipe(c, q, &pipes[q], &p->p[q]))
            return -1;
    for (int q = 0; q < npipes; q++)
        if (pipes[q].layers && restore_failover(c, q, &pipes[q], &p->p[q]))
            return -1;
    return 0;
}

int pl_coord_restore(pl_coord *c, int64_t generation, int64_t step, const pl_coord_pipe *pipes,
                     int npipes, int64_t resume_ms)
{
    c->err[0] = 0;
    if (c->nw || c->has_stable || npipes < 1 || generation < 1 || step < 0 || step >= c->cfg.steps)
        return fail_err(c, "restore: only a new coordinator restores a running plan");
    if (!c->have_planner)
        return fail_err(c, "restore: the plan needs the planner's profile (not measured yet)");
    cplan p = {0};
    c->phase = PL_COORD_RESUMING; /* registering the plan's names must not plan */
    if (restore_plan(c, pipes, npipes, &p)) {
        cplan_free(&p);
        return PL_COORD_ERR;
    }
    /* the welcomes queued by registration are for nobody yet */
    for (int k = c->headout; k < c->nout; k++)
        pl_msg_free(&c->out[k].m);
    c->headout = c->nout = 0;
    int64_t first = 0;
    for (int q = 0; q < p.npipes; q++) {
        p.p[q].first = first;
        first += p.p[q].mb;
    }
    cplan_describe(&p);
    if (cplan_copy(&c->cur, &p)) {
        cplan_free(&p);
        return fail_err(c, "out of memory");
    }
    c->stable = p;
    c->has_stable = c->has_cur = 1;
    for (int q = 0; q < p.npipes; q++)
        for (int j = 0; j < p.p[q].nnodes; j++)
            set_place(c, p.p[q].w[j], q, j);
    c->gen = generation;
    c->step = step;
    c->cause[0] = 0;
    c->resume_ms = resume_ms > 0 ? resume_ms : 10000;
    c->took_over = 1;
    c->resume_at = -1;
    c->phase = PL_COORD_RESUMING;
    return PL_COORD_OK;
}

/* A worker that holds the state of plan generation gen while this coordinator took no
 * plan over (it started afresh: the job's status lost). Its plans, from generation 1,
 * would be older than the worker's, which ignores them, and a range it kept would train
 * on from its old state beside workers starting from the checkpoint or the seed: it is
 * told to end, so that a fresh worker takes its place (not its node's fault). */
static int stop_stranger(pl_coord *c, int i, int64_t gen)
{
    char why[300];
    snprintf(why, sizeof why, "it holds the state of plan generation %lld, which this "
             "coordinator did not take over: a fresh worker must replace it", (long long)gen);
    c->w[i].leaving = 1;
    pl_coord_worker_lost(c, c->w[i].name, why);
    send_text(c, i, PL_MSG_STOP, c->gen, 0, why, 1);
    return PL_COORD_OK;
}

int pl_coord_hello_resume(pl_coord *c, const char *name, int64_t gen,
                          const pl_msg_hello_resume *h)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0)
        return PL_COORD_ERR;
    if (!c->took_over && gen > 0)
        return stop_stranger(c, i, gen);
    if (c->phase != PL_COORD_RESUMING || !c->w[i].restored || c->w[i].resumed)
        return PL_COORD_IGNORED;
    cworker *w = &c->w[i];
    w->resumed = 1;
    w->r_committed = h->committed_step;
    w->r_reduced = h->reduced_step;
    w->r_scale = h->grad_scale;
    w->r_lr = h->lr;
    if (gen > c->gen) /* the status the plan came from may lag behind */
        c->gen = gen;
    for (int k = 0; k < c->nw; k++)
        if (c->w[k].restored && (!c->w[k].live || !c->w[k].resumed))
            return PL_COORD_OK;
    resume_done(c);
    return PL_COORD_OK;
}
