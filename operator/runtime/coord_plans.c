/* The coordinator's plans (coordinator.c): what a plan is made of and where each worker
 * stands in it; the next plan, fresh from the coverage table (placed by zone), the stable
 * one re-instantiated (pl_reinstantiate) or failed over (coord_failover.c), degraded
 * below F or restarted from a checkpoint; installing it as a new generation, and replanning
 * at once or once a burst of losses settled. */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reinstantiate.h"
#include "zone_place.h"

/* A plan's memory, freed (p zeroed). */
void cplan_free(cplan *p)
{
    for (int i = 0; i < p->npipes; i++) {
        free(p->p[i].w);
        free(p->p[i].layers);
        free(p->p[i].tw);
    }
    free(p->p);
    memset(p, 0, sizeof *p);
}

/* A deep copy of src into dst (what dst held freed): 0, or -1 out of memory (dst
 * unchanged). */
int cplan_copy(cplan *dst, const cplan *src)
{
    cplan t = {0};
    t.p = calloc((size_t)(src->npipes ? src->npipes : 1), sizeof *t.p);
    if (!t.p)
        return -1;
    t.npipes = src->npipes;
    memcpy(t.desc, src->desc, sizeof t.desc);
    for (int i = 0; i < src->npipes; i++) {
        const cpipe *s = &src->p[i];
        t.p[i] = *s;
        t.p[i].w = malloc((size_t)s->nnodes * sizeof(int));
        t.p[i].layers = s->layers ? malloc(((size_t)s->nnodes + 1) * sizeof(int)) : NULL;
        t.p[i].tw = s->tw ? malloc((size_t)s->tn * sizeof(int)) : NULL;
        if (!t.p[i].w || (s->layers && !t.p[i].layers) || (s->tw && !t.p[i].tw)) {
            cplan_free(&t);
            return -1;
        }
        memcpy(t.p[i].w, s->w, (size_t)s->nnodes * sizeof(int));
        if (s->layers)
            memcpy(t.p[i].layers, s->layers, ((size_t)s->nnodes + 1) * sizeof(int));
        if (s->tw)
            memcpy(t.p[i].tw, s->tw, (size_t)s->tn * sizeof(int));
    }
    cplan_free(dst);
    *dst = t;
    return 0;
}

/* "2x3+1x2": pipelines grouped by size, largest first. */
void cplan_describe(cplan *p)
{
    p->desc[0] = 0;
    int prev = 1 << 30;
    for (;;) {
        int best = 0, count = 0;
        for (int i = 0; i < p->npipes; i++)
            if (p->p[i].nnodes < prev && p->p[i].nnodes > best)
                best = p->p[i].nnodes;
        if (!best)
            break;
        for (int i = 0; i < p->npipes; i++)
            count += p->p[i].nnodes == best;
        appendf(p->desc, sizeof p->desc, "%s%dx%d", p->desc[0] ? "+" : "", count, best);
        prev = best;
    }
}

/* The layers [begin, end) of node position pos of the template for n nodes. */
void node_layers(const pl_coord *c, int n, int pos, int *begin, int *end)
{
    const pl_template *t = pl_template_for(c->cfg.templates, n);
    *begin = *end = 0;
    int first = 1;
    for (int s = 0; t && s < t->nstages; s++) {
        if (t->stages[s].node != pos)
            continue;
        if (first || t->stages[s].layer_begin < *begin)
            *begin = t->stages[s].layer_begin;
        if (first || t->stages[s].layer_end > *end)
            *end = t->stages[s].layer_end;
        first = 0;
    }
}

/* The layers [begin, end) of stage pos of pipeline cq: the template's, or a failover's. */
void pipe_layers(const pl_coord *c, const cpipe *cq, int pos, int *begin, int *end)
{
    if (cq->layers) {
        *begin = cq->layers[pos];
        *end = cq->layers[pos + 1];
    } else {
        node_layers(c, cq->nnodes, pos, begin, end);
    }
}

/* Worker i's place: node j of pipeline q of the current plan (q -1: idle). */
void set_place(pl_coord *c, int i, int q, int j)
{
    cworker *w = &c->w[i];
    w->pipe = q;
    w->pos = j;
    w->lb = w->le = 0;
    if (q >= 0)
        pipe_layers(c, &c->cur.p[q], j, &w->lb, &w->le);
}

/* NCCL when every worker of the current plan can run it on a GPU of its own (NCCL
 * refuses two ranks on one device), else TCP. Strategy redundant always runs on TCP:
 * the shadows' messages ride the TCP stage link (docs/redundant.md), and on NCCL no
 * worker would hold a shadow to fail over from. Workers not back (a restored plan's)
 * count as able. */
int plan_transport(const pl_coord *c)
{
    if (c->cfg.strategy_redundant) return PL_TRANSPORT_TCP;
    for (int q = 0; q < c->cur.npipes; q++)
        for (int j = 0; j < c->cur.p[q].nnodes; j++) {
            const cworker *w = &c->w[c->cur.p[q].w[j]];
            if (!w->live)
                continue;
            if (!w->nccl || !w->device[0])
                return PL_TRANSPORT_TCP;
            for (int r = 0; r <= q; r++)
                for (int k = 0; k < (r == q ? j : c->cur.p[r].nnodes); k++)
                    if (!strcmp(c->w[c->cur.p[r].w[k]].device, w->device))
                        return PL_TRANSPORT_TCP;
        }
    return PL_TRANSPORT_NCCL;
}

static void waiting_for_nodes(pl_coord *c, int live)
{
    snprintf(c->reason, sizeof c->reason,
             "%d live workers, at least (F+1)*n0 = %d needed; waiting for workers", live,
             (c->cfg.tolerate + 1) * c->cfg.templates->n0);
    if (c->phase != PL_COORD_WAITING_FOR_NODES)
        c->wait_since = c->now;
    c->phase = PL_COORD_WAITING_FOR_NODES;
}

static void names_list(char *buf, size_t len, const char *const *names, int n)
{
    buf[0] = 0;
    for (int k = 0; k < n; k++)
        appendf(buf, len, "%s%s", k ? "," : "", names[k]);
}

/* Zone ids of the workers (−1 unknown) into zid; returns how many zones. */
static int zone_ids(const pl_coord *c, int *zid)
{
    int nz = 0;
    for (int i = 0; i < c->nw; i++) {
        zid[i] = -1;
        for (int k = 0; c->w[i].zone[0] && k < i && zid[i] < 0; k++)
            if (zid[k] >= 0 && !strcmp(c->w[k].zone, c->w[i].zone))
                zid[i] = zid[k];
        if (c->w[i].zone[0] && zid[i] < 0)
            zid[i] = nz++;
    }
    return nz;
}

/* A plan's pipelines and their stages' layers, for zone_place.h. */
typedef struct {
    pl_zone_shape sh;
    int nslots, *nnodes, **bounds;
} cshape;

static void cshape_free(cshape *s)
{
    for (int q = 0; s->bounds && q < s->sh.npipes; q++)
        free(s->bounds[q]);
    free(s->bounds);
    free(s->nnodes);
}

static int cshape_init(const pl_coord *c, const cplan *np, cshape *s)
{
    memset(s, 0, sizeof *s);
    s->sh.nlayers = c->cfg.profile->nlayers;
    s->sh.npipes = np->npipes;
    s->nnodes = calloc((size_t)np->npipes + 1, sizeof *s->nnodes);
    s->bounds = calloc((size_t)np->npipes + 1, sizeof *s->bounds);
    if (!s->nnodes || !s->bounds)
        goto oom;
    for (int q = 0; q < np->npipes; q++) {
        const cpipe *cq = &np->p[q];
        s->nnodes[q] = cq->nnodes;
        s->nslots += cq->nnodes;
        if (!(s->bounds[q] = malloc(((size_t)cq->nnodes + 1) * sizeof(int))))
            goto oom;
        for (int j = 0; j < cq->nnodes; j++)
            pipe_layers(c, cq, j, &s->bounds[q][j], &s->bounds[q][j + 1]);
    }
    s->sh.nnodes = s->nnodes;
    s->sh.bounds = (const int *const *)s->bounds;
    return 0;
oom:
    cshape_free(s);
    return -1;
}

/* The live workers on the stages of np (shaped, workers unset): spread over zones so
 * that one zone's loss is not fatal (zone_place.h), rank order where zones are not
 * known. 0, or -1 out of memory. */
static int place_fresh(pl_coord *c, cplan *np)
{
    cshape s;
    int *zid = malloc(((size_t)c->nw + 1) * sizeof *zid);
    int *cand = malloc(((size_t)c->nw + 1) * sizeof *cand);
    int *czone = malloc(((size_t)c->nw + 1) * sizeof *czone);
    int *slot = NULL, rc = -1;
    if (!zid || !cand || !czone || cshape_init(c, np, &s)) {
        free(zid);
        free(cand);
        free(czone);
        return -1;
    }
    const int nz = zone_ids(c, zid);
    int ncand = 0;
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live) {
            czone[ncand] = zid[i];
            cand[ncand++] = i;
        }
    if ((slot = malloc(((size_t)s.nslots + 1) * sizeof *slot)) &&
        !pl_zone_place(&s.sh, ncand, czone, nz, slot)) {
        int k = 0;
        for (int q = 0; q < np->npipes; q++)
            for (int j = 0; j < np->p[q].nnodes; j++)
                np->p[q].w[j] = cand[slot[k++]];
        rc = 0;
    }
    cshape_free(&s);
    free(slot);
    free(zid);
    free(cand);
    free(czone);
    return rc;
}

/* A plan from scratch: the coverage entry for the live count, its workers placed by
 * place_fresh. 0, or 1 when too few workers, -1 out of memory. */
static int fresh_plan_from(pl_coord *c, const pl_coverage *cov, int live, cplan *np)
{
    const pl_instance_plan *e = NULL;
    int top = live < cov->nodes_hi ? live : cov->nodes_hi;
    for (int k = 0; k < cov->count && !e && live >= cov->nodes_lo; k++)
        if (cov->entries[k].nodes <= top && cov->entries[k].covered)
            e = &cov->entries[k];
    if (!e)
        return 1;
    np->npipes = e->npipelines;
    if (!(np->p = calloc((size_t)e->npipelines, sizeof *np->p)))
        return -1;
    for (int q = 0; q < e->npipelines; q++) {
        cpipe *cq = &np->p[q];
        cq->mb = e->pipelines[q].microbatches;
        cq->nnodes = e->pipelines[q].template_nodes;
        if (!(cq->w = malloc((size_t)cq->nnodes * sizeof(int))))
            return -1;
    }
    return place_fresh(c, np);
}

/* The best plan for the live workers from the coverage table; with below_minimum_degrade
 * and too few of them for F, from the table of the largest tolerance f < F they allow
 * (computed here: c->plan_tolerance = f). 1 when there is none, −1 out of memory. */
static int fresh_plan(pl_coord *c, int live, cplan *np)
{
    int rc = fresh_plan_from(c, c->cfg.coverage, live, np);
    for (int f = c->cfg.tolerate - 1; c->cfg.below_minimum_degrade && rc == 1 && f >= 0; f--) {
        pl_coverage cov;
        char err[256];
        if (pl_coverage_compute(c->cfg.templates, live, f, c->cfg.global_batch,
                                c->cfg.profile->microbatch_size, &cov, err, sizeof err))
            continue; /* too few workers for f too, or a batch f cannot split */
        rc = fresh_plan_from(c, &cov, live, np);
        pl_coverage_free(&cov);
        if (rc == 0)
            c->plan_tolerance = f;
    }
    return rc;
}

/* The stable plan as pl_reinstantiate reads it, and the scratch it points into: a
 * failover's pipeline as its template's, its lost places removed too (rm); the removed
 * workers under notice, which may still send; every worker's zone. */
typedef struct {
    pl_current_plan cur;
    const char **rm, **dep, **zoned;
    int nrm;
    int *zid;
    char (*alias)[16];
} cstable;

static void cstable_free(cstable *s)
{
    for (int q = 0; s->cur.pipelines && q < s->cur.npipelines; q++)
        free(s->cur.pipelines[q].nodes);
    free(s->cur.pipelines);
    free(s->rm);
    free(s->dep);
    free(s->zoned);
    free(s->zid);
    free(s->alias);
}

/* Pipeline q of plan `from` into s->cur: a failover's as its template's, its lost workers
 * removed too (s->rm). 0, or -1 out of memory. */
static int stable_pipe(const pl_coord *c, const cplan *from, int q, cstable *s)
{
    const cpipe *sq = &from->p[q];
    const int n = sq->tw ? sq->tn : sq->nnodes, *tw = sq->tw ? sq->tw : sq->w;
    pl_current_pipeline *cq = &s->cur.pipelines[q];
    cq->nnodes = n;
    if (!(cq->nodes = calloc((size_t)n, sizeof(char *))))
        return -1;
    for (int j = 0; j < n; j++) {
        cq->nodes[j] = c->w[tw[j]].name;
        int in_pipe = 0;
        for (int k = 0; k < sq->nnodes; k++)
            in_pipe |= sq->w[k] == tw[j];
        if (!in_pipe && c->w[tw[j]].live) {
            /* a ghost's name that a new worker took (it is added): the lost place
             * is named as no worker can be ('~' is not a name's character) */
            snprintf(s->alias[tw[j]], sizeof s->alias[0], "~%d", tw[j]);
            cq->nodes[j] = s->alias[tw[j]];
        }
        if (!in_pipe)
            s->rm[s->nrm++] = cq->nodes[j];
    }
    return 0;
}

/* Plan `from` (the stable one, or a new one whose loss is simulated) without the workers
 * rm[0..nrm) into s. 0, or -1 out of memory. */
static int cstable_init(const pl_coord *c, const cplan *from, const char **rm, int nrm,
                        cstable *s)
{
    memset(s, 0, sizeof *s);
    s->cur.npipelines = from->npipes;
    s->cur.pipelines = calloc((size_t)from->npipes, sizeof *s->cur.pipelines);
    s->rm = calloc((size_t)c->nw + 1, sizeof *s->rm);
    s->dep = calloc((size_t)c->nw + 1, sizeof *s->dep);
    s->zoned = calloc((size_t)c->nw + 1, sizeof *s->zoned);
    s->zid = calloc((size_t)c->nw + 1, sizeof *s->zid);
    s->alias = calloc((size_t)c->nw + 1, sizeof *s->alias);
    if (!s->cur.pipelines || !s->rm || !s->dep || !s->zoned || !s->zid || !s->alias)
        return -1;
    for (; s->nrm < nrm; s->nrm++)
        s->rm[s->nrm] = rm[s->nrm];
    for (int q = 0; q < from->npipes; q++)
        if (stable_pipe(c, from, q, s))
            return -1;
    for (int k = 0; k < s->nrm; k++) { /* their notice lets them send still */
        const int i = worker_index(c, s->rm[k]);
        if (i >= 0 && c->w[i].departing)
            s->dep[s->cur.ndeparting++] = s->rm[k];
    }
    s->cur.departing = s->dep;
    /* pl_reinstantiate places survivors and added workers by zone too */
    s->cur.nzones = zone_ids(c, s->zid);
    for (int i = 0; i < c->nw; i++)
        s->zoned[i] = c->w[i].name;
    s->cur.zoned = s->zoned;
    s->cur.zone_of = s->zid;
    s->cur.nzoned = c->nw;
    return 0;
}

/* The plan pl_reinstantiate made as np and its layer copies. 0, or -1 out of memory. */
static int take_reinstantiation(pl_coord *c, const pl_reinstantiation *r, cplan *np,
                                ccopy **cp, int *ncp)
{
    int total = 0;
    for (int k = 0; k < r->ncopies; k++)
        total += r->copies[k].nlayers;
    np->p = calloc((size_t)r->npipelines, sizeof *np->p);
    *cp = calloc((size_t)(total ? total : 1), sizeof **cp);
    if (!np->p || !*cp)
        return -1;
    np->npipes = r->npipelines;
    for (int q = 0; q < r->npipelines; q++) {
        cpipe *cq = &np->p[q];
        cq->mb = r->pipelines[q].microbatches;
        if (!(cq->w = malloc((size_t)r->pipelines[q].template_nodes * sizeof(int))))
            return -1;
        cq->nnodes = r->pipelines[q].template_nodes;
        for (int j = 0; j < cq->nnodes; j++)
            cq->w[j] = worker_index(c, r->pipelines[q].nodes[j]);
    }
    for (int k = 0; k < r->ncopies; k++)
        for (int j = 0; j < r->copies[k].nlayers; j++) {
            ccopy *x = &(*cp)[(*ncp)++];
            x->dest = worker_index(c, r->copies[k].node);
            x->src = worker_index(c, r->copies[k].layers[j].source);
            x->layer = r->copies[k].layers[j].layer;
            x->part = r->copies[k].layers[j].part;
            x->parts = r->copies[k].layers[j].parts;
            x->bytes = r->copies[k].layers[j].bytes;
        }
    return 0;
}

/* pl_reinstantiate of plan `from` without rm, with ad, at tolerance f into r; it changes
 * nothing in c. 0, or -1 with the reason in err. */
int plan_reinstantiate(const pl_coord *c, const cplan *from, int f, const char **rm, int nrm,
                       const char **ad, int nad, pl_reinstantiation *r, char *err,
                       size_t errlen)
{
    /* the coverage table holds F's plans only; a lower tolerance plans from the templates */
    const pl_coverage *cov = f == c->cfg.tolerate ? c->cfg.coverage : NULL;
    cstable s;
    int rc = cstable_init(c, from, rm, nrm, &s);
    if (rc)
        snprintf(err, errlen, "out of memory");
    else
        rc = pl_reinstantiate(c->cfg.profile, c->cfg.templates, cov, f, c->cfg.global_batch,
                              &s.cur, s.rm, s.nrm, ad, nad, r, err, errlen);
    cstable_free(&s);
    return rc;
}

/* Re-instantiation of the stable plan for the live workers (§5.1 via
 * pl_reinstantiate): fills np and the layer copies. 0, 1 when too few
 * workers, 2 on a fatal loss (lost layers appended to c->cause), -1 with the
 * reason failed. */
static int reinstantiate(pl_coord *c, int f, const char **rm, int nrm, const char **ad, int nad,
                         cplan *np, ccopy **cp, int *ncp, int64_t *bytes_planned)
{
    pl_reinstantiation r = {0};
    char e2[512] = "";
    int rc = plan_reinstantiate(c, &c->stable, f, rm, nrm, ad, nad, &r, e2, sizeof e2);
    if (rc) {
        char why[700];
        snprintf(why, sizeof why, "re-instantiation failed: %s", e2);
        set_failed(c, why);
        return -1;
    }
    if (r.fatal) {
        add_cause(c, "%s%s", "fatal: no live holder of layer", "");
        for (int k = 0; k < r.nlost; k++)
            appendf(c->cause, sizeof c->cause, "%s%d", k ? "," : " ", r.lost_layers[k]);
        rc = 2;
    } else if (r.insufficient_nodes || r.npipelines == 0) {
        rc = 1;
    } else if (take_reinstantiation(c, &r, np, cp, ncp)) {
        rc = -1;
    } else {
        *bytes_planned = r.bytes_to_copy;
        rc = rc_local_copies(c, np, *cp, ncp, bytes_planned);
    }
    if (rc < 0)
        set_failed(c, "coordinator: out of memory");
    pl_reinstantiation_free(&r);
    return rc;
}

static void log_reconfig(pl_coord *c, const char *removed, const char *added,
                         int64_t bytes_planned)
{
    if (c->nrec == c->caprec) {
        int cap = c->caprec ? 2 * c->caprec : 8;
        pl_coord_reconfig_rec *x = realloc(c->rec, (size_t)cap * sizeof *x);
        if (!x)
            return; /* the log is best effort: training goes on */
        c->rec = x;
        c->caprec = cap;
    }
    pl_coord_reconfig_rec *x = &c->rec[c->nrec++];
    memset(x, 0, sizeof *x);
    x->generation = c->gen;
    x->step = c->step;
    snprintf(x->cause, sizeof x->cause, "%s", c->cause);
    snprintf(x->removed, sizeof x->removed, "%s", removed);
    snprintf(x->added, sizeof x->added, "%s", added);
    x->bytes_planned = bytes_planned;
    x->from_checkpoint = c->plan_ckpt >= 0;
    memcpy(x->pipelines, c->cur.desc, sizeof x->pipelines);
    x->tolerance = c->tolerance;
}

/* Leaving workers leave the plan now. On TCP they stay until the next plan's copies
 * are done, as sources of the layers no survivor holds (their notice's grace period);
 * otherwise (NCCL copies need a rank) they stop now. */
static void depart_leaving(pl_coord *c)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && c->w[i].leaving) {
            c->w[i].live = 0;
            c->w[i].departing = c->has_stable && c->transport == PL_TRANSPORT_TCP;
            if (!c->w[i].departing)
                send_text(c, i, PL_MSG_STOP, c->gen, 0, "left the job", 0);
        }
}

/* Departing workers are stopped, but (keep_sources) those the current plan copies from. */
void stop_departed(pl_coord *c, int keep_sources)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].departing && !(keep_sources && c->w[i].is_source)) {
            c->w[i].departing = 0;
            send_text(c, i, PL_MSG_STOP, c->gen, 0, "left the job", 0);
        }
}

/* Fills ch from plan `from` (mark: scratch, one byte a worker, zeroed). */
void find_change(const pl_coord *c, const cplan *from, char *mark, cchange *ch)
{
    for (int q = 0; q < from->npipes; q++)
        for (int j = 0; j < from->p[q].nnodes; j++) {
            int i = from->p[q].w[j];
            mark[i] = 1;
            if (!c->w[i].live)
                ch->rm[ch->nrm++] = c->w[i].name;
        }
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && !mark[i])
            ch->ad[ch->nad++] = c->w[i].name;
    names_list(ch->removed, sizeof ch->removed, ch->rm, ch->nrm);
    names_list(ch->added, sizeof ch->added, ch->ad, ch->nad);
}

/* The checkpoint the next plan restarts from, or -1: after a fatal loss, for
 * strategy checkpoint, or to resume a job (the first plan). */
static int64_t restart_step(const pl_coord *c)
{
    /* a plan replacing a first plan that never became stable starts from the resume point
     * too, step 0 included: the workers drop what that plan's unfinished install gave them
     * (engines for other ranges) instead of taking it as held */
    if (!c->has_stable && (c->resume_step > 0 || (c->resume_step == 0 && c->gen > 0)))
        return c->resume_step;
    if (c->has_stable && (c->need_ckpt || c->cfg.strategy_checkpoint))
        return c->ckpt_last;
    return -1;
}

/* Too few live workers for F (reinstantiate returned 1): with below_minimum_degrade, the
 * largest tolerance f < F that the live workers allow (c->plan_tolerance); 1 when none
 * does, or when the job waits instead. */
static int degraded_plan(pl_coord *c, const cchange *ch, cplan *np, ccopy **cp, int *ncp,
                         int64_t *bytes_planned)
{
    int rc = 1;
    for (int f = c->cfg.tolerate - 1; c->cfg.below_minimum_degrade && rc == 1 && f >= 0; f--) {
        rc = reinstantiate(c, f, ch->rm, ch->nrm, ch->ad, ch->nad, np, cp, ncp, bytes_planned);
        if (rc == 0)
            c->plan_tolerance = f;
    }
    return rc;
}

/* The next plan np: the stable plan re-instantiated, or a fresh one (the first
 * plan, or a restart from checkpoint *ckpt, which a fatal loss sets). 0, 1
 * when too few workers, -1 failed. */
static int next_plan(pl_coord *c, const cchange *ch, int live, int64_t *ckpt, cplan *np,
                     ccopy **cp, int *ncp, int64_t *bytes_planned)
{
    int rc = 1;
    c->plan_tolerance = c->cfg.tolerate;
    if (c->has_stable && *ckpt < 0 && (rc = rc_failover(c, ch->nrm, ch->nad, np)) <= 0) {
        if (rc < 0)
            set_failed(c, "coordinator: out of memory");
        return rc;
    }
    if (c->has_stable && *ckpt < 0) {
        rc = reinstantiate(c, c->cfg.tolerate, ch->rm, ch->nrm, ch->ad, ch->nad, np, cp, ncp,
                           bytes_planned);
        if (rc == 1)
            rc = degraded_plan(c, ch, np, cp, ncp, bytes_planned);
        if (rc < 0)
            return -1;
        if (rc == 2) { /* no live holder: the checkpoint is all there is */
            c->need_ckpt = 1;
            *ckpt = c->ckpt_last;
            cplan_free(np);
        }
    }
    if (*ckpt >= 0 || !c->has_stable) {
        rc = fresh_plan(c, live, np);
        if (rc < 0) {
            set_failed(c, "coordinator: out of memory");
            return -1;
        }
    }
    return rc;
}

/* On NCCL a layer moves GPU to GPU as whole segments (layer_copy.h), so a layer planned in
 * parts comes whole from its first part's source. */
static void whole_layers(ccopy *cp, int *ncp)
{
    int n = 0;
    for (int k = 0; k < *ncp; k++) {
        if (cp[k].parts > 1 && cp[k].part > 0) {
            for (int y = n - 1; y >= 0; y--)
                if (cp[y].dest == cp[k].dest && cp[y].layer == cp[k].layer) {
                    cp[y].bytes += cp[k].bytes;
                    break;
                }
            continue;
        }
        cp[n] = cp[k];
        cp[n].part = 0;
        cp[n++].parts = 1;
    }
    *ncp = n;
}

/* Makes np the current plan, of a new generation: microbatch ranges, the
 * workers' places, the transport, the copies' sources. */
static void install_plan(pl_coord *c, cplan *np, int64_t ckpt, ccopy *cp, int *ncp)
{
    int64_t first = 0;
    for (int q = 0; q < np->npipes; q++) {
        np->p[q].first = first;
        first += np->p[q].mb;
    }
    cplan_describe(np);
    cplan_free(&c->cur);
    c->cur = *np;
    memset(np, 0, sizeof *np);
    c->has_cur = 1;
    c->gen++;
    c->plan_ckpt = ckpt;
    if (ckpt >= 0) {
        flush_eval(c); /* its steps are redone: evaluated again when they are */
        c->step = ckpt;
        forget_saving_after(c, ckpt);
    }
    for (int i = 0; i < c->nw; i++) {
        cworker *w = &c->w[i];
        set_place(c, i, -1, -1);
        w->got_plan = w->copy_done = w->is_source = 0;
    }
    c->scan_copy = 0;
    for (int q = 0; q < c->cur.npipes; q++)
        for (int j = 0; j < c->cur.p[q].nnodes; j++)
            set_place(c, c->cur.p[q].w[j], q, j);
    c->transport = plan_transport(c);
    if (c->transport == PL_TRANSPORT_NCCL)
        whole_layers(cp, ncp);
    for (int k = 0; k < *ncp; k++)
        c->w[cp[k].src].is_source = 1;
}

/* find_change's room: a mark per worker, and lists of removed and added workers;
 * fails the job when out of memory (what is allocated already is the caller's). */
static int alloc_change(pl_coord *c, char **mark, cchange *ch)
{
    if (!(*mark = calloc((size_t)c->nw + 1, 1)) ||
        !(ch->rm = calloc((size_t)c->nw + 1, sizeof *ch->rm)) ||
        !(ch->ad = calloc((size_t)c->nw + 1, sizeof *ch->ad))) {
        set_failed(c, "coordinator: out of memory");
        return -1;
    }
    return 0;
}

/* What changed since the stable plan; a reconfiguration past maxResets fails the job,
 * naming what caused it. */
static int change_since_stable(pl_coord *c, char *mark, cchange *ch)
{
    find_change(c, &c->stable, mark, ch);
    if (c->cfg.max_resets > 0 && c->nrec >= c->cfg.max_resets) {
        char why[700];
        snprintf(why, sizeof why, "maxResets (%d) exceeded: %s", c->cfg.max_resets, c->cause);
        set_failed(c, why);
        return -1;
    }
    return 0;
}

/* The installed plan starts with its copies: what caused it and what waited for it are
 * done with. */
static void enter_copying(pl_coord *c, const cchange *ch, int64_t bytes_planned)
{
    c->tolerance = c->plan_tolerance;
    if (c->gen > 1)
        log_reconfig(c, ch->removed, ch->added, bytes_planned);
    c->cause[0] = 0;
    c->pending = c->join_pending = 0;
    c->reason[0] = 0;
    c->wait_since = -1;
    c->phase = PL_COORD_COPYING;
    plan_reserves(c);
}

/* Makes a new plan for the live workers and sends it (or enters
 * WAITING_FOR_NODES / FAILED). */
void replan(pl_coord *c)
{
    depart_leaving(c);
    reassign_duties(c);
    if (c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED)
        return;
    if (!c->has_stable && c->resume_step < 0 && decide_resume(c))
        return; /* nothing to train, or no worker can read the checkpoints */
    int live = pl_coord_live_workers(c);
    cplan np = {0};
    ccopy *cp = NULL;
    int ncp = 0;
    int64_t bytes_planned = 0;
    char *mark = NULL;
    cchange ch = {0};
    if (alloc_change(c, &mark, &ch) || (c->has_stable && change_since_stable(c, mark, &ch)))
        goto done;
    int64_t ckpt = restart_step(c);
    int rc = next_plan(c, &ch, live, &ckpt, &np, &cp, &ncp, &bytes_planned);
    if (rc < 0)
        goto done;
    if (rc == 1) {
        waiting_for_nodes(c, live);
        goto done;
    }
    install_plan(c, &np, ckpt, cp, &ncp);
    enter_copying(c, &ch, bytes_planned);
    send_plans(c, cp, ncp);
done:
    stop_departed(c, c->phase == PL_COORD_COPYING);
    cplan_free(&np);
    free(cp);
    free(mark);
    free(ch.rm);
    free(ch.ad);
}

/* A loss needs a new plan: now, or after settle_ms without further losses so
 * that simultaneous preemptions (one zone, Bamboo §3) make one plan, not one
 * each. Step messages are ignored meanwhile (phase SETTLING). */
void replan_soon(pl_coord *c)
{
    if (c->cfg.settle_ms <= 0) {
        replan(c);
        return;
    }
    c->phase = PL_COORD_SETTLING;
    c->replan_at = c->now + c->cfg.settle_ms;
}
