/* The coordinator's plan messages (coordinator.c): each worker's plan (its pipelines, its
 * place, its peers, the layers it receives and sends), and the NCCL id of a plan passed
 * to its workers. */
#include "coord_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reinstantiate.h"

_Static_assert(PL_COPY_MAX_PARTS <= PL_PROTO_MAX_PARTS, "a plan message carries every part");

/* Worker i holds the layer in the current plan. */
static int holds(const pl_coord *c, int i, int layer)
{
    const cworker *w = &c->w[i];
    return w->pipe >= 0 && w->lb <= layer && layer < w->le;
}

/* Worker i holds one of the layers [b, e). */
static int holds_any(const pl_coord *c, int i, int b, int e)
{
    const cworker *w = &c->w[i];
    return w->pipe >= 0 && w->lb < w->le && b < e && w->lb < e && b < w->le;
}

/* Scratch for one plan's messages (replan): the plan's copies indexed by receiver
 * and by sender (stable: in the copies' order), the peers of the worker being planned
 * as marks and as a list. */
typedef struct {
    const ccopy *cp;
    int ncp;
    int *in_at, *in, *out_at, *out; /* worker i: cp[in[in_at[i] .. in_at[i + 1])], sends too */
    char *mark;
    int *peer, npeer;
} cplanmsg;

static void cplanmsg_free(cplanmsg *s)
{
    free(s->in_at);
    free(s->in);
    free(s->out_at);
    free(s->out);
    free(s->mark);
    free(s->peer);
    memset(s, 0, sizeof *s);
}

/* at/idx: the copies grouped by key (dest or src), a counting sort. */
static void index_copies(const ccopy *cp, int ncp, int nw, int by_src, int *at, int *idx)
{
    memset(at, 0, ((size_t)nw + 2) * sizeof *at);
    for (int k = 0; k < ncp; k++)
        at[(by_src ? cp[k].src : cp[k].dest) + 2]++;
    for (int i = 0; i < nw; i++)
        at[i + 2] += at[i + 1];
    for (int k = 0; k < ncp; k++)
        idx[at[(by_src ? cp[k].src : cp[k].dest) + 1]++] = k;
}

static int cplanmsg_init(cplanmsg *s, const pl_coord *c, const ccopy *cp, int ncp)
{
    size_t nw = (size_t)c->nw, n = (size_t)(ncp ? ncp : 1);
    memset(s, 0, sizeof *s);
    s->cp = cp;
    s->ncp = ncp;
    s->in_at = malloc((nw + 2) * sizeof(int));
    s->out_at = malloc((nw + 2) * sizeof(int));
    s->in = malloc(n * sizeof(int));
    s->out = malloc(n * sizeof(int));
    s->mark = calloc(nw + 1, 1);
    s->peer = malloc((nw + 1) * sizeof(int));
    if (!s->in_at || !s->out_at || !s->in || !s->out || !s->mark || !s->peer) {
        cplanmsg_free(s);
        return -1;
    }
    index_copies(cp, ncp, c->nw, 0, s->in_at, s->in);
    index_copies(cp, ncp, c->nw, 1, s->out_at, s->out);
    return 0;
}

static void mark_peer(cplanmsg *s, int k)
{
    if (!s->mark[k]) {
        s->mark[k] = 1;
        s->peer[s->npeer++] = k;
    }
}

static int int_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Pipeline q of the current plan as a message's, each node's layer range contiguous
 * in stage order: 0, or -1 when memory ran out. */
static int plan_pipeline(const pl_coord *c, int q, pl_msg_pipeline *mp)
{
    const cpipe *cq = &c->cur.p[q];
    mp->nodes = calloc((size_t)cq->nnodes, sizeof *mp->nodes);
    mp->layers = malloc(((size_t)cq->nnodes + 1) * sizeof *mp->layers);
    if (!mp->nodes || !mp->layers)
        return -1;
    mp->nnodes = mp->template_nodes = cq->nnodes;
    for (int j = 0; j < cq->nnodes; j++) {
        const cworker *w = &c->w[cq->w[j]];
        mp->layers[j] = w->lb;
        mp->layers[j + 1] = w->le;
        memcpy(mp->nodes[j], w->name, sizeof mp->nodes[j]);
    }
    mp->microbatches = cq->mb;
    mp->first_microbatch = cq->first;
    return 0;
}

/* The current plan's pipelines (brief plans: worker i's own, as pipeline 0). */
static int plan_pipelines(const pl_coord *c, int i, pl_msg_plan *p)
{
    int own = c->w[i].pipe, brief = c->cfg.brief_plans;
    p->npipelines = !brief ? c->cur.npipes : own >= 0;
    if (!p->npipelines)
        return 0;
    p->pipelines = calloc((size_t)p->npipelines, sizeof *p->pipelines);
    if (!p->pipelines)
        return -1;
    for (int q = 0; q < p->npipelines; q++)
        if (plan_pipeline(c, brief ? own : q, &p->pipelines[q]))
            return -1;
    return 0;
}

/* Worker i's place in the plan ("you"), and the peers that place gives it: its stage
 * neighbours and its sync-group members (none in brief plans). */
static void plan_you(const pl_coord *c, int i, pl_msg_plan *p, cplanmsg *s)
{
    const cworker *w = &c->w[i];
    int L = c->nlayers;
    p->you_pipeline = -1;
    if (w->pipe < 0)
        return;
    const cpipe *cq = &c->cur.p[w->pipe];
    p->you_pipeline = c->cfg.brief_plans ? 0 : w->pipe;
    p->you_stage = w->pos;
    p->you_layer_begin = w->lb;
    p->you_layer_end = w->le;
    if (c->cfg.brief_plans)
        return;
    if (w->pos > 0)
        mark_peer(s, cq->w[w->pos - 1]);
    if (w->pos + 1 < cq->nnodes)
        mark_peer(s, cq->w[w->pos + 1]);
    int b = w->lb, e = w->le;
    int tied = b == 0 || e == L; /* embedding or head: the wte group */
    /* sync-group members: holders of our layers in other pipelines, and every wte holder
     * (embedding or head) when we hold one — the first and last stage of our own pipeline
     * share the tied wte too */
    for (int k = 0; k < c->nw; k++) {
        if (!c->w[k].live || c->w[k].pipe < 0)
            continue;
        int other = c->w[k].pipe != w->pipe;
        if ((other && holds_any(c, k, b, e)) || (tied && (holds(c, k, 0) || holds(c, k, L - 1))))
            mark_peer(s, k);
    }
}

/* The layers worker i receives (copies) and sends, whose other ends are peers
 * too (not in brief plans); then the peers, every marked worker but i, in rank order. */
static int plan_transfers(const pl_coord *c, int i, pl_msg_plan *p, cplanmsg *s)
{
    const ccopy *cp = s->cp;
    int brief = c->cfg.brief_plans;
    p->ncopies = s->in_at[i + 1] - s->in_at[i];
    p->nsends = s->out_at[i + 1] - s->out_at[i];
    for (int k = s->in_at[i]; k < s->in_at[i + 1] && !brief; k++)
        mark_peer(s, cp[s->in[k]].src);
    for (int k = s->out_at[i]; k < s->out_at[i + 1] && !brief; k++)
        mark_peer(s, cp[s->out[k]].dest);
    qsort(s->peer, (size_t)s->npeer, sizeof *s->peer, int_cmp);
    p->peers = calloc((size_t)(s->npeer ? s->npeer : 1), sizeof *p->peers);
    p->copies = calloc((size_t)(p->ncopies ? p->ncopies : 1), sizeof *p->copies);
    p->sends = calloc((size_t)(p->nsends ? p->nsends : 1), sizeof *p->sends);
    if (!p->peers || !p->copies || !p->sends)
        return -1;
    for (int n = 0; n < s->npeer; n++) {
        const cworker *w = &c->w[s->peer[n]];
        s->mark[s->peer[n]] = 0;
        if (s->peer[n] == i)
            continue;
        memcpy(p->peers[p->npeers].name, w->name, sizeof p->peers[0].name);
        memcpy(p->peers[p->npeers].host, w->host, sizeof p->peers[0].host);
        p->peers[p->npeers++].port = w->port;
    }
    s->npeer = 0;
    for (int n = 0; n < p->ncopies; n++) {
        const ccopy *x = &cp[s->in[s->in_at[i] + n]];
        p->copies[n].layer = x->layer;
        p->copies[n].part = x->part;
        p->copies[n].parts = x->parts;
        p->copies[n].bytes = x->bytes;
        memcpy(p->copies[n].source, c->w[x->src].name, sizeof p->copies[0].source);
    }
    for (int n = 0; n < p->nsends; n++) {
        const ccopy *x = &cp[s->out[s->out_at[i] + n]];
        p->sends[n].layer = x->layer;
        memcpy(p->sends[n].dest, c->w[x->dest].name, sizeof p->sends[0].dest);
    }
    return 0;
}

/* Builds and queues the plan of generation c->gen for worker i. */
static int send_plan(pl_coord *c, int i, cplanmsg *s)
{
    pl_msg *m = push_msg(c, i, PL_MSG_PLAN, c->gen);
    if (!m)
        return -1;
    pl_msg_plan *p = &m->u.plan;
    p->generation = c->gen;
    p->step = c->step;
    p->global_batch = c->cfg.global_batch;
    p->micro = c->micro;
    p->seq_len = c->cfg.seq_len;
    if (c->plan_ckpt >= 0) { /* step 0: the initial state, no directory is read */
        p->has_checkpoint = 1;
        p->checkpoint_step = c->plan_ckpt;
        snprintf(p->checkpoint_dir, sizeof p->checkpoint_dir, "%s",
                 c->cfg.checkpoint_dir && c->cfg.checkpoint_dir[0] ? c->cfg.checkpoint_dir
                                                                   : "(none)");
    }
    p->transport = c->transport;
    p->reserve_bytes = c->w[i].reserve;
    if (plan_pipelines(c, i, p))
        return -1;
    plan_you(c, i, p, s);
    return plan_transfers(c, i, p, s);
}

/* The current plan to every live worker. */
void send_plans(pl_coord *c, const ccopy *cp, int ncp)
{
    cplanmsg s;
    if (cplanmsg_init(&s, c, cp, ncp)) {
        set_failed(c, "coordinator: out of memory");
        return;
    }
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live || (c->w[i].departing && c->w[i].is_source)) {
            if (send_plan(c, i, &s)) {
                set_failed(c, "coordinator: out of memory");
                break;
            }
            c->w[i].got_plan = 1;
        }
    cplanmsg_free(&s);
}

/* The plan's rank 0 (the first stage of pipeline 0) made the NCCL id of its
 * generation: every worker of the plan, the root too, gets it in nccl_init and
 * creates the plan's communicator from it. An id of a replaced plan is dropped. */
int nccl_root(pl_coord *c, const char *name, int64_t gen, const char *id)
{
    if (gen != c->gen || !c->has_cur || c->transport != PL_TRANSPORT_NCCL)
        return PL_COORD_OK;
    if (c->cur.npipes < 1 || c->cur.p[0].nnodes < 1 || c->cur.p[0].w[0] != worker_index(c, name))
        return fail_err(c, "worker \"%s\": nccl_root, but rank 0 of generation %lld is another",
                        name, (long long)gen);
    for (int q = 0; q < c->cur.npipes; q++)
        for (int j = 0; j < c->cur.p[q].nnodes; j++) {
            pl_msg *m = push_msg(c, c->cur.p[q].w[j], PL_MSG_NCCL_INIT, c->gen);
            if (!m) {
                set_failed(c, "coordinator: out of memory");
                return PL_COORD_ERR;
            }
            snprintf(m->u.nccl_init.id, sizeof m->u.nccl_init.id, "%s", id);
        }
    return PL_COORD_OK;
}
