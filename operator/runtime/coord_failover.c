/* The coordinator's strategy redundant (Bamboo, NSDI '23; docs/redundant.md): stage j of a
 * pipeline holds stage (j + 1) mod n's layers as its shadow, the last stage the first's
 * (§5.1, the ring: pl_rc_successor); the workers do so on the TCP transport. A loss that
 * shadows cover fails over without copies; re-instantiation's copies use shadows as
 * local sources (coord_plans.c). */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rc_plan.h"

/* The stable plan's shadows are there: strategy redundant (always on TCP: plan_transport),
 * and every worker installed the stable plan (a worker keeps its shadow until a step of
 * a newer plan). */
static int rc_active(const pl_coord *c)
{
    return c->cfg.strategy_redundant && c->has_stable;
}

/* 1 when the worker at stage j of the stable plan's pipeline q held `layer` in its
 * engine, or (shadow) in its shadow. */
static int stable_holds(const pl_coord *c, int q, int j, int layer, int shadow)
{
    int b, e;
    const cpipe *cq = &c->stable.p[q];
    pipe_layers(c, cq, j, &b, &e);
    if (b <= layer && layer < e)
        return 1;
    const int s = shadow && rc_active(c) ? pl_rc_successor(j, cq->nnodes) : -1;
    if (s < 0)
        return 0;
    pipe_layers(c, cq, s, &b, &e);
    return b <= layer && layer < e;
}

/* Workers a and b trade places in pipeline nq's template. */
static void swap_template_places(cpipe *nq, int a, int b)
{
    int *pa = NULL, *pb = NULL;
    for (int k = 0; k < nq->tn; k++) {
        if (nq->tw[k] == a) pa = &nq->tw[k];
        if (nq->tw[k] == b) pb = &nq->tw[k];
    }
    if (pa && pb) {
        *pa = b;
        *pb = a;
    }
}

/* Pipeline q of the stable plan after its losses (lost stages' layers to their
 * holders, the last stage first when stage 0 is lost: pl_rc_failover) into np->p[q].
 * 1 done, 0 a lost stage has no live holder, -1 out of memory. */
static int failover_pipe(pl_coord *c, int q, cplan *np)
{
    const cpipe *sq = &c->stable.p[q];
    cpipe *nq = &np->p[q];
    const int n = sq->nnodes;
    int *b = malloc(((size_t)n + 1) * sizeof(int)), *lost = calloc((size_t)n, sizeof(int));
    int *keep = malloc((size_t)n * sizeof(int)), nlost = 0, nkeep = 0, rc = -1;
    nq->layers = malloc(((size_t)n + 1) * sizeof(int));
    nq->w = malloc((size_t)n * sizeof(int));
    nq->tn = sq->tw ? sq->tn : n;
    nq->tw = malloc((size_t)nq->tn * sizeof(int));
    if (!b || !lost || !keep || !nq->layers || !nq->w || !nq->tw)
        goto out;
    memcpy(nq->tw, sq->tw ? sq->tw : sq->w, (size_t)nq->tn * sizeof(int));
    for (int j = 0; j < n; j++) {
        pipe_layers(c, sq, j, &b[j], &b[j + 1]);
        nlost += lost[j] = !c->w[sq->w[j]].live;
    }
    rc = pl_rc_failover(n, b, lost, keep, &nkeep, nq->layers);
    /* Over the ring's wrap the last stage gives its layers to stage n - 2 and runs stage
     * 0's: it takes the lost stage 0's place in the template, which re-instantiation reads
     * as the layers a worker holds (a join then copies the last place's layers to it). */
    if (rc && n >= 3 && lost[0] && nkeep && keep[0] == n - 1)
        swap_template_places(nq, sq->w[0], sq->w[n - 1]);
    nq->nnodes = nkeep;
    nq->mb = sq->mb;
    for (int k = 0; rc && k < nkeep; k++) {
        nq->w[k] = sq->w[keep[k]];
        if (nlost && (nq->layers[k] != b[keep[k]] || nq->layers[k + 1] != b[keep[k] + 1])) {
            char what[96];
            snprintf(what, sizeof what, "layers [%d, %d) without a copy", nq->layers[k],
                     nq->layers[k + 1]);
            add_cause(c, "failover: %s runs %s", c->w[nq->w[k]].name, what);
        }
    }
    if (rc && !nlost && !sq->layers) { /* untouched: stays a template pipeline */
        free(nq->layers);
        free(nq->tw);
        nq->layers = nq->tw = NULL;
        nq->tn = 0;
    }
out:
    free(b);
    free(lost);
    free(keep);
    return rc;
}

/* Failover without copies (Bamboo §4, §5.2): when every lost worker of the stable plan
 * has a live shadow holder, the new plan is the stable one with each holder running its
 * own layers and the lost stage's, built locally from its engine and its shadow
 * (pl_layer_copy_local); neighbours and sync groups follow from the plan, the microbatches
 * stay, and the aborted step is redone (steps are atomic). Only for losses alone, from a
 * stable plan whose shadows are up; without a loss (a restored plan resumed) a pipeline
 * that failed over stays as it is, where re-instantiation would copy it back to its
 * template's layout. 0 done, 1 not possible, -1 out of memory. */
int rc_failover(pl_coord *c, int nremoved, int nadded, cplan *np)
{
    int merged = 0;
    for (int q = 0; q < c->stable.npipes; q++)
        merged |= c->stable.p[q].layers != NULL;
    if (!rc_active(c) || nadded || (!nremoved && !merged))
        return 1;
    char cause[sizeof c->cause];
    memcpy(cause, c->cause, sizeof cause);
    if (!(np->p = calloc((size_t)c->stable.npipes, sizeof *np->p)))
        return -1;
    np->npipes = c->stable.npipes;
    for (int q = 0; q < c->stable.npipes; q++) {
        const int rc = failover_pipe(c, q, np);
        if (rc <= 0) {
            cplan_free(np);
            memcpy(c->cause, cause, sizeof cause);
            return rc < 0 ? -1 : 1;
        }
    }
    return 0;
}

/* Each worker's place: stable plan pipeline and stage (sq[i], sj[i], −1 when not in it)
 * and new pipeline (nq[i]); arrays of c->nw, so that a plan's thousands of copies on a
 * thousand workers look them up at once. */
static void index_places(const pl_coord *c, const cplan *np, int *sq, int *sj, int *nq)
{
    for (int i = 0; i < c->nw; i++)
        sq[i] = sj[i] = nq[i] = -1;
    for (int q = 0; q < c->stable.npipes; q++)
        for (int j = 0; j < c->stable.p[q].nnodes; j++) {
            sq[c->stable.p[q].w[j]] = q;
            sj[c->stable.p[q].w[j]] = j;
        }
    for (int q = 0; q < np->npipes; q++)
        for (int j = 0; j < np->p[q].nnodes; j++)
            nq[np->p[q].w[j]] = q;
}

/* A copy the stable plan's holdings make unnecessary or nearer: the destination held the
 * layer (its engine, or its shadow: a local source), or a worker of its new pipeline held
 * it in its engine (a failover holder: it sends it, restoring the redundancy when a new
 * node takes the lost one's place). Dropped copies leave *bytes_planned. 0, or −1 out of
 * memory. */
int rc_local_copies(pl_coord *c, const cplan *np, ccopy *cp, int *ncp,
                           int64_t *bytes_planned)
{
    if (!rc_active(c))
        return 0;
    int *sq = malloc(3 * (size_t)(c->nw ? c->nw : 1) * sizeof *sq), n = 0;
    if (!sq)
        return -1;
    int *sj = sq + c->nw, *nq = sj + c->nw;
    index_places(c, np, sq, sj, nq);
    for (int k = 0; k < *ncp; k++) {
        ccopy x = cp[k];
        if (sq[x.dest] >= 0 && stable_holds(c, sq[x.dest], sj[x.dest], x.layer, 1)) {
            *bytes_planned -= x.bytes;
            continue;
        }
        const int q = nq[x.dest];
        for (int s = 0; q >= 0 && s < np->p[q].nnodes; s++) {
            const int y = np->p[q].w[s];
            if (y != x.dest && sq[y] >= 0 && stable_holds(c, sq[y], sj[y], x.layer, 0)) {
                x.src = y;
                break;
            }
        }
        cp[n++] = x;
    }
    *ncp = n;
    free(sq);
    return 0;
}
