/* What each worker would receive, at most, if one worker of the current plan were lost
 * (cworker.reserve, the plan message's reserve_bytes): CPU workers receive a loss's layer
 * copies into fresh memory whose page faults slow the copy, so they keep that much
 * populated ahead. Each loss is simulated with pl_reinstantiate alone, never through
 * replanning: a simulation changes no state of the coordinator. */
#include "coord_internal.h"

#include <stdlib.h>

/* One pl_reinstantiate per worker of the plan (about 0.2 ms each at 1000 nodes): beyond
 * this many, installing a plan would wait too long for a hint. */
#define RESERVE_MAX_WORKERS 128

/* Only re-instantiation copies layers (strategy checkpoint restarts from the checkpoint,
 * redundant fails over to shadows), and only on TCP does a worker without a GPU of its
 * own take part (plan_transport): GPU workers receive into device memory. */
static int reserve_useful(const pl_coord *c)
{
    if (c->cfg.strategy_checkpoint || c->cfg.strategy_redundant ||
        c->transport != PL_TRANSPORT_TCP)
        return 0;
    int n = 0, cpu = 0;
    for (int q = 0; q < c->cur.npipes; q++)
        for (int j = 0; j < c->cur.p[q].nnodes; j++) {
            const cworker *w = &c->w[c->cur.p[q].w[j]];
            cpu |= w->live && (!w->nccl || !w->device[0]);
            n++;
        }
    return cpu && n <= RESERVE_MAX_WORKERS;
}

/* The copies of the current plan re-instantiated at tolerance f without ch's removed
 * workers and x, with ch's added ones: each destination's bytes raise its reserve. 1 when
 * too few workers are left for f; an error or a fatal loss adds nothing. */
static int simulate_loss(pl_coord *c, const cchange *ch, int x, int f)
{
    pl_reinstantiation r = {0};
    char err[512];
    ch->rm[ch->nrm] = c->w[x].name; /* rm has room for one more */
    int rc = plan_reinstantiate(c, &c->cur, f, ch->rm, ch->nrm + 1, ch->ad, ch->nad, &r, err,
                                sizeof err);
    const int few = !rc && !r.fatal && (r.insufficient_nodes || r.npipelines == 0);
    for (int k = 0; !rc && !r.fatal && !few && k < r.ncopies; k++) {
        const int i = worker_index(c, r.copies[k].node);
        if (i >= 0 && r.copies[k].bytes > c->w[i].reserve)
            c->w[i].reserve = r.copies[k].bytes;
    }
    pl_reinstantiation_free(&r);
    return few;
}

/* Worker x lost: at F, then, as next_plan degrades with below_minimum_degrade, at the
 * largest lower tolerance the survivors allow. */
static void reserve_for_loss(pl_coord *c, const cchange *ch, int x)
{
    int few = simulate_loss(c, ch, x, c->cfg.tolerate);
    for (int f = c->cfg.tolerate - 1; c->cfg.below_minimum_degrade && few && f >= 0; f--)
        few = simulate_loss(c, ch, x, f);
}

/* Every worker's reserve for the current plan (0 where not useful, or out of memory: it
 * is a hint), the worst single loss of a live worker of the plan. */
void plan_reserves(pl_coord *c)
{
    for (int i = 0; i < c->nw; i++)
        c->w[i].reserve = 0;
    if (!reserve_useful(c))
        return;
    char *mark = calloc((size_t)c->nw + 1, 1);
    cchange ch = {0};
    ch.rm = calloc((size_t)c->nw + 2, sizeof *ch.rm);
    ch.ad = calloc((size_t)c->nw + 1, sizeof *ch.ad);
    if (mark && ch.rm && ch.ad) {
        find_change(c, &c->cur, mark, &ch); /* workers not back yet, idle ones */
        for (int q = 0; q < c->cur.npipes; q++)
            for (int j = 0; j < c->cur.p[q].nnodes; j++)
                if (c->w[c->cur.p[q].w[j]].live)
                    reserve_for_loss(c, &ch, c->cur.p[q].w[j]);
    }
    free(mark);
    free(ch.rm);
    free(ch.ad);
}
