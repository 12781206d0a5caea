/* Layer copies over an ordered transport (NCCL on GPUs): which copies of a plan go over
 * it, and the one p2p group that moves them. See layer_copy.h. */
#include "layer_copy.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* The plan's ranks: names and layer bounds, pipelines flattened in order. */
typedef struct {
    int n;
    const char **name;
    int *begin, *end;
} ranks;

static void ranks_free(ranks *r)
{
    free(r->name);
    free(r->begin);
    free(r->end);
}

static int ranks_of(const pl_msg_plan *p, ranks *r)
{
    memset(r, 0, sizeof *r);
    for (int q = 0; q < p->npipelines; q++) r->n += p->pipelines[q].nnodes;
    const size_t n = (size_t)(r->n ? r->n : 1);
    r->name = malloc(n * sizeof *r->name);
    r->begin = malloc(n * sizeof *r->begin);
    r->end = malloc(n * sizeof *r->end);
    if (!r->name || !r->begin || !r->end) {
        ranks_free(r);
        return -1;
    }
    for (int q = 0, k = 0; q < p->npipelines; q++)
        for (int j = 0; j < p->pipelines[q].nnodes; j++, k++) {
            r->name[k] = p->pipelines[q].nodes[j];
            r->begin[k] = p->pipelines[q].layers[j];
            r->end[k] = p->pipelines[q].layers[j + 1];
        }
    return 0;
}

static int rank_of(const ranks *r, const char *name)
{
    for (int k = 0; k < r->n; k++)
        if (!strcmp(r->name[k], name)) return k;
    return -1;
}

int pl_layer_copy_xport_possible(const pl_msg_plan *p)
{
    if (p->transport != PL_TRANSPORT_NCCL || p->npipelines < 1) return 0;
    ranks r;
    if (ranks_of(p, &r)) return 0; /* out of memory: TCP still works */
    int ok = r.n > 0;
    /* a name twice would make rank_of ambiguous (decoding refuses it already) */
    for (int i = 0; ok && i < r.n; i++)
        ok = rank_of(&r, r.name[i]) == i;
    ranks_free(&r);
    return ok;
}

int pl_layer_copy_xport_pair(const pl_msg_plan *p, const char *source, const char *dest)
{
    ranks r;
    if (strcmp(source, dest) == 0 || ranks_of(p, &r)) return 0;
    int both = rank_of(&r, source) >= 0 && rank_of(&r, dest) >= 0;
    ranks_free(&r);
    return both;
}

int pl_layer_copy_over_xport(const pl_msg_plan *p, const char *source, const char *dest)
{
    return pl_layer_copy_xport_possible(p) && pl_layer_copy_xport_pair(p, source, dest);
}

/* One layer moved between this rank and a peer. */
typedef struct {
    int peer, send, layer;
} item;

/* Consecutive layers [first, last] of one pair, or the tied wte; where they are in the
 * local engine. */
typedef struct {
    int peer, send, first, last, wte;
    size_t off, count; /* count: floats from the first tensor to the end of the last */
    size_t held;       /* floats of the segment's tensors (count less the layout's padding) */
} segment;

static int item_cmp(const void *a, const void *b)
{
    const item *x = a, *y = b;
    if (x->peer != y->peer) return x->peer < y->peer ? -1 : 1;
    if (x->send != y->send) return x->send < y->send ? -1 : 1;
    return (x->layer > y->layer) - (x->layer < y->layer);
}

static int same_model(const pl_gpt_config *a, const pl_gpt_config *b)
{
    return a->L == b->L && a->C == b->C && a->NH == b->NH && a->V == b->V && a->Vp == b->Vp &&
           a->maxT == b->maxT;
}

/* 1 when e holds every tensor of `layer`. */
static int holds_layer(const pl_engine *e, const pl_gpt_config *cfg, int layer)
{
    pl_tensor_spec s[PL_MAX_LAYER_TENSORS];
    const int n = pl_gpt_layer_tensors(cfg, layer, s);
    for (int i = 0; i < n; i++)
        if (!pl_engine_find(e, layer, i)) return 0;
    return 1;
}

/* Where segment g is in e: its tensors must be contiguous and of the model's sizes, so that
 * both ends count the same floats (the peer computes its count from its own engine). */
static int locate(const pl_engine *e, const pl_gpt_config *cfg, segment *g, char *err,
                  size_t errlen)
{
    const int lo = g->wte ? 0 : g->first, hi = g->wte ? 0 : g->last;
    size_t next = 0;
    int started = 0;
    g->held = 0;
    for (int l = lo; l <= hi; l++) {
        pl_tensor_spec s[PL_MAX_LAYER_TENSORS];
        int n = pl_gpt_layer_tensors(cfg, l, s);
        if (g->wte) n = 1; /* wte is layer 0's first tensor */
        for (int i = 0; i < n; i++) {
            const pl_engine_tensor *t = pl_engine_find(e, l, i);
            if (!t) return pl_errf(err, errlen, "tensor (%d, %d) is not in layers [%d, %d)", l, i,
                                   e->begin, e->end);
            const size_t at = i == 0 ? pl_engine_align_layer(next) : next; /* engine.h */
            if (t->spec.numel != s[i].numel || (started && t->offset != at))
                return pl_errf(err, errlen, "tensor (%d, %d) of layers [%d, %d) is not where "
                               "the layout puts it", l, i, e->begin, e->end);
            if (!started) g->off = t->offset, started = 1;
            next = t->offset + t->spec.numel;
            g->held += t->spec.numel;
        }
    }
    g->count = next - g->off;
    return 0;
}

/* The pair's items [i, j) (one peer and direction, layers ascending) as segments: runs of
 * consecutive layers, then the tied wte when the destination's range has the head but not
 * the embedding (it comes with the head, as pl_layer_copy_layer_of says). */
static int add_segments(const item *it, int i, int j, int dest_begin, int L, segment *seg,
                        int nseg)
{
    for (int k = i; k < j; k++) {
        if (k > i && it[k].layer == it[k - 1].layer + 1) {
            seg[nseg - 1].last = it[k].layer;
            continue;
        }
        seg[nseg++] = (segment){it[k].peer, it[k].send, it[k].layer, it[k].layer, 0, 0, 0, 0};
    }
    if (it[j - 1].layer == L + 1 && dest_begin > 0)
        seg[nseg++] = (segment){it[i].peer, it[i].send, 0, 0, 1, 0, 0, 0};
    return nseg;
}

/* One worker's copies over the transport, worked out before anything is enqueued. */
typedef struct {
    const pl_msg_plan *p;
    const pl_gpt_config *cfg;
    const pl_engine *src;
    pl_engine *dst;
    ranks r;
    int self, b, e; /* this worker's rank and layers [b, e) */
    int *from;      /* per layer: the source's rank, −2 an idle source (TCP), −1 none */
    item *it;
    int nitems;
    segment *seg;
    int nseg;
    pl_xport_op *ops;
    int nops;
    int64_t in;     /* bytes the receives bring */
} xcopy;

static void xcopy_free(xcopy *c)
{
    free(c->from);
    free(c->it);
    free(c->seg);
    free(c->ops);
    ranks_free(&c->r);
}

static int xcopy_alloc(xcopy *c)
{
    const int nl = c->cfg->L + 2, n = c->p->ncopies + c->p->nsends;
    if (ranks_of(c->p, &c->r)) return -1;
    c->from = malloc((size_t)nl * sizeof *c->from);
    c->it = malloc((size_t)(n + 1) * sizeof *c->it);
    c->seg = malloc((size_t)(2 * n + 1) * sizeof *c->seg);
    c->ops = malloc((size_t)(6 * n + 1) * sizeof *c->ops);
    return c->from && c->it && c->seg && c->ops ? 0 : -1;
}

/* The transport's rank and the new engine's range must be this worker's place in the plan. */
static int check_place(xcopy *c, const pl_xport *x, char *err, size_t errlen)
{
    const pl_msg_plan *p = c->p;
    c->self = 0; /* its place in the flattened pipelines */
    for (int q = 0; q < p->you_pipeline && q < p->npipelines; q++)
        c->self += p->pipelines[q].nnodes;
    c->self += p->you_stage;
    if (p->you_pipeline >= p->npipelines || p->you_stage < 0 ||
        p->you_stage >= p->pipelines[p->you_pipeline].nnodes || x->self != c->self ||
        x->nranks != c->r.n)
        return pl_errf(err, errlen, "layer copy: the transport is rank %d of %d, the plan "
                       "places this worker at rank %d of %d", x->self, x->nranks, c->self,
                       c->r.n);
    c->b = p->you_layer_begin;
    c->e = p->you_layer_end;
    if (c->dst->begin != c->b || c->dst->end != c->e || c->r.begin[c->self] != c->b ||
        c->r.end[c->self] != c->e)
        return pl_errf(err, errlen, "layer copy: the new engine holds layers [%d, %d), the "
                       "plan gives %s layers [%d, %d)", c->dst->begin, c->dst->end,
                       c->r.name[c->self], c->b, c->e);
    return 0;
}

/* The receives: each copied layer's source rank (from[]), one item per layer from a rank. */
static int add_receives(xcopy *c, char *err, size_t errlen)
{
    const pl_msg_plan *p = c->p;
    for (int l = 0; l < c->cfg->L + 2; l++) c->from[l] = -1;
    for (int i = 0; i < p->ncopies; i++) {
        const pl_msg_copy *cp = &p->copies[i];
        if (cp->parts > 1)
            return pl_errf(err, errlen, "layer copy: copies[%d]: layer %d in %d parts: the "
                           "transport moves whole layers", i, cp->layer, cp->parts);
        if (cp->layer < c->b || cp->layer >= c->e)
            return pl_errf(err, errlen, "layer copy: copy of layer %d from %s: this worker runs "
                           "layers [%d, %d)", cp->layer, cp->source, c->b, c->e);
        int s = rank_of(&c->r, cp->source);
        if (s == c->self)
            return pl_errf(err, errlen, "layer copy: copy of layer %d from this worker itself",
                           cp->layer);
        if (s < 0) s = -2;
        if (c->from[cp->layer] != -1 && c->from[cp->layer] != s) {
            int k = 0; /* the earlier copy of this layer, for the message */
            while (p->copies[k].layer != cp->layer) k++;
            return pl_errf(err, errlen, "layer copy: layer %d has two sources, %s and %s",
                           cp->layer, p->copies[k].source, cp->source);
        }
        c->from[cp->layer] = s;
    }
    for (int l = 0; l < c->cfg->L + 2; l++)
        if (c->from[l] >= 0) c->it[c->nitems++] = (item){c->from[l], 0, l};
    return 0;
}

/* The sends: what the destination's range holds of each layer, known from the pipelines. */
static int add_sends(xcopy *c, char *err, size_t errlen)
{
    const pl_msg_plan *p = c->p;
    for (int i = 0; i < p->nsends; i++) {
        const pl_msg_send *s = &p->sends[i];
        const int d = rank_of(&c->r, s->dest);
        if (d < 0 || d == c->self)
            return pl_errf(err, errlen, "layer copy: send of layer %d to %s: %s", s->layer,
                           s->dest, d < 0 ? "not a worker of the plan" : "that is this worker");
        if (s->layer < c->r.begin[d] || s->layer >= c->r.end[d])
            return pl_errf(err, errlen, "layer copy: send of layer %d to %s, which runs layers "
                           "[%d, %d)", s->layer, s->dest, c->r.begin[d], c->r.end[d]);
        const int wte = s->layer == c->cfg->L + 1 && c->r.begin[d] > 0;
        if (!c->src)
            return pl_errf(err, errlen, "layer copy: send of layer %d to %s: this worker holds "
                           "no layers", s->layer, s->dest);
        if (!holds_layer(c->src, c->cfg, s->layer) || (wte && !pl_engine_find(c->src, 0, 0)))
            return pl_errf(err, errlen, "layer copy: send of layer %d%s to %s: not held here "
                           "(layers [%d, %d))", s->layer, wte ? " with the tied wte" : "",
                           s->dest, c->src->begin, c->src->end);
        c->it[c->nitems++] = (item){d, 1, s->layer};
    }
    return 0;
}

/* Per pair, layers ascending (a send listed twice moves once), as segments. */
static void make_segments(xcopy *c)
{
    qsort(c->it, (size_t)c->nitems, sizeof *c->it, item_cmp);
    int n = 0;
    for (int i = 0; i < c->nitems; i++)
        if (!n || item_cmp(&c->it[n - 1], &c->it[i])) c->it[n++] = c->it[i];
    c->nitems = n;
    for (int i = 0, j; i < c->nitems; i = j) {
        for (j = i + 1; j < c->nitems && c->it[j].peer == c->it[i].peer &&
                        c->it[j].send == c->it[i].send;)
            j++;
        const int dest_begin = c->it[i].send ? c->r.begin[c->it[i].peer] : c->b;
        c->nseg = add_segments(c->it, i, j, dest_begin, c->cfg->L, c->seg, c->nseg);
    }
}

/* Three operations per segment: params, m, v. */
static int make_ops(xcopy *c, char *err, size_t errlen)
{
    for (int i = 0; i < c->nseg; i++) {
        segment *g = &c->seg[i];
        const pl_engine *eng = g->send ? c->src : c->dst;
        char why[256];
        if (locate(eng, c->cfg, g, why, sizeof why))
            return pl_errf(err, errlen, "layer copy: %s of %s %d %s %s: %s",
                           g->send ? "send" : "receive",
                           g->wte ? "the tied wte with layer" : "layer",
                           g->wte ? c->cfg->L + 1 : g->first, g->send ? "to" : "from",
                           c->r.name[g->peer], why);
        float *arr[3] = {eng->params, eng->m, eng->v};
        for (int a = 0; a < 3; a++)
            c->ops[c->nops++] = (pl_xport_op){g->peer, g->send, arr[a] + g->off, g->count};
        if (!g->send) c->in += 3 * (int64_t)g->held * (int64_t)sizeof(float);
    }
    return 0;
}

/* src was last written by compute (AdamW); the host then frees src and reports the copy
 * done, and the kernels that read dst come after. */
static int run_ops(const xcopy *c, const pl_xport *x, char *err, size_t errlen)
{
    char why[512];
    if (x->after_compute(x->ctx, why, sizeof why) ||
        x->p2p(x->ctx, c->ops, c->nops, why, sizeof why) ||
        x->wait(x->ctx, PL_LAYER_COPY_TIMEOUT_MS, why, sizeof why) ||
        x->before_compute(x->ctx, why, sizeof why))
        return pl_errf(err, errlen, "layer copy (%d operations with %d segments): %s", c->nops,
                       c->nseg, why);
    return 0;
}

int pl_layer_copy_xport(const pl_xport *x, const pl_msg_plan *p, const pl_gpt_config *cfg,
                        const pl_engine *src, pl_engine *dst, int64_t *bytes_in, char *err,
                        size_t errlen)
{
    *bytes_in = 0;
    if (p->you_pipeline < 0) { /* idle: no rank; its sends go over TCP */
        if (dst || p->ncopies > 0)
            return pl_errf(err, errlen, "layer copy: an idle worker gets %s",
                           dst ? "no engine" : "no layers to receive");
        return 0;
    }
    if (!x || !dst)
        return pl_errf(err, errlen, "layer copy: a worker of the plan needs %s",
                       x ? "its new engine" : "the transport");
    if (!same_model(&dst->cfg, cfg) || (src && !same_model(&src->cfg, cfg)))
        return pl_errf(err, errlen, "layer copy: an engine is of another model");
    xcopy c = {.p = p, .cfg = cfg, .src = src, .dst = dst};
    int rc = -1;
    if (xcopy_alloc(&c))
        pl_errf(err, errlen, "layer copy: out of memory");
    else if (!check_place(&c, x, err, errlen) && !add_receives(&c, err, errlen) &&
             !add_sends(&c, err, errlen)) {
        make_segments(&c);
        if (!make_ops(&c, err, errlen) && (c.nops == 0 || !run_ops(&c, x, err, errlen))) {
            *bytes_in = c.in;
            rc = 0;
        }
    }
    xcopy_free(&c);
    return rc;
}

static int copy_xport(const pl_layer_copier *self, const pl_layer_copy_job *job,
                      pl_layer_copy_result *res, char *err, size_t errlen)
{
    int64_t in = 0;
    int rc = pl_layer_copy_xport(self->ctx, job->plan, job->cfg, job->src, job->dst, &in, err,
                                 errlen);
    res->bytes_in += in;
    return rc;
}

pl_layer_copier pl_layer_copier_xport(const pl_xport *x)
{
    return (pl_layer_copier){.copy = copy_xport, .ctx = (void *)x};
}
