/* Layer copies over an ordered transport: see layer_copy.h. */
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

/* One layer moved between this rank and a peer. */
typedef struct {
    int peer, send, layer;
} item;

/* Consecutive layers [first, last] of one pair, or the tied wte; where they are in the
 * local engine. */
typedef struct {
    int peer, send, first, last, wte;
    size_t off, count;
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
    for (int l = lo; l <= hi; l++) {
        pl_tensor_spec s[PL_MAX_LAYER_TENSORS];
        int n = pl_gpt_layer_tensors(cfg, l, s);
        if (g->wte) n = 1; /* wte is layer 0's first tensor */
        for (int i = 0; i < n; i++) {
            const pl_engine_tensor *t = pl_engine_find(e, l, i);
            if (!t) return pl_errf(err, errlen, "tensor (%d, %d) is not in layers [%d, %d)", l, i,
                                   e->begin, e->end);
            if (t->spec.numel != s[i].numel || (started && t->offset != next))
                return pl_errf(err, errlen, "tensor (%d, %d) of layers [%d, %d) is not where "
                               "the layout puts it", l, i, e->begin, e->end);
            if (!started) g->off = t->offset, started = 1;
            next = t->offset + t->spec.numel;
        }
    }
    g->count = next - g->off;
    return 0;
}

/* The pair's items [i, j) (one peer and direction, layers ascending) as segments: runs of
 * consecutive layers, then the tied wte when the destination's range has the head but not
 * the embedding (it comes with the head, as change_engine decides). */
static int add_segments(const item *it, int i, int j, int dest_begin, int L, segment *seg,
                        int nseg)
{
    for (int k = i; k < j; k++) {
        if (k > i && it[k].layer == it[k - 1].layer + 1) {
            seg[nseg - 1].last = it[k].layer;
            continue;
        }
        seg[nseg++] = (segment){it[k].peer, it[k].send, it[k].layer, it[k].layer, 0, 0, 0};
    }
    if (it[j - 1].layer == L + 1 && dest_begin > 0)
        seg[nseg++] = (segment){it[i].peer, it[i].send, 0, 0, 1, 0, 0};
    return nseg;
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
    const int L = cfg->L, NL = cfg->L + 2;
    ranks r;
    if (ranks_of(p, &r)) return pl_errf(err, errlen, "layer copy: out of memory");
    int rc = -1, nitems = 0, nseg = 0, nops = 0;
    int *from = malloc((size_t)NL * sizeof *from);
    item *it = malloc((size_t)(p->ncopies + p->nsends + 1) * sizeof *it);
    segment *seg = malloc((size_t)(2 * (p->ncopies + p->nsends) + 1) * sizeof *seg);
    pl_xport_op *ops = malloc((size_t)(6 * (p->ncopies + p->nsends) + 1) * sizeof *ops);
    if (!from || !it || !seg || !ops) {
        pl_errf(err, errlen, "layer copy: out of memory");
        goto out;
    }
    /* this worker's rank: its place in the flattened pipelines */
    int self = 0;
    for (int q = 0; q < p->you_pipeline && q < p->npipelines; q++)
        self += p->pipelines[q].nnodes;
    self += p->you_stage;
    if (p->you_pipeline >= p->npipelines || p->you_stage < 0 ||
        p->you_stage >= p->pipelines[p->you_pipeline].nnodes || x->self != self ||
        x->nranks != r.n) {
        pl_errf(err, errlen, "layer copy: the transport is rank %d of %d, the plan places this "
                "worker at rank %d of %d", x->self, x->nranks, self, r.n);
        goto out;
    }
    const int b = p->you_layer_begin, e = p->you_layer_end;
    if (dst->begin != b || dst->end != e || r.begin[self] != b || r.end[self] != e) {
        pl_errf(err, errlen, "layer copy: the new engine holds layers [%d, %d), the plan gives "
                "%s layers [%d, %d)", dst->begin, dst->end, r.name[self], b, e);
        goto out;
    }
    /* receives: from[l] = the source's rank, −2 for an idle source (TCP), −1 none */
    for (int l = 0; l < NL; l++) from[l] = -1;
    for (int i = 0; i < p->ncopies; i++) {
        const pl_msg_copy *c = &p->copies[i];
        if (c->layer < b || c->layer >= e) {
            pl_errf(err, errlen, "layer copy: copy of layer %d from %s: this worker runs "
                    "layers [%d, %d)", c->layer, c->source, b, e);
            goto out;
        }
        int s = rank_of(&r, c->source);
        if (s == self) {
            pl_errf(err, errlen, "layer copy: copy of layer %d from this worker itself",
                    c->layer);
            goto out;
        }
        if (s < 0) s = -2;
        if (from[c->layer] != -1 && from[c->layer] != s) {
            int k = 0; /* the earlier copy of this layer, for the message */
            while (p->copies[k].layer != c->layer) k++;
            pl_errf(err, errlen, "layer copy: layer %d has two sources, %s and %s", c->layer,
                    p->copies[k].source, c->source);
            goto out;
        }
        from[c->layer] = s;
    }
    for (int l = 0; l < NL; l++)
        if (from[l] >= 0) it[nitems++] = (item){from[l], 0, l};
    /* sends: what the destination's range holds of each layer, known from the pipelines */
    for (int i = 0; i < p->nsends; i++) {
        const pl_msg_send *s = &p->sends[i];
        const int d = rank_of(&r, s->dest);
        if (d < 0 || d == self) {
            pl_errf(err, errlen, "layer copy: send of layer %d to %s: %s", s->layer, s->dest,
                    d < 0 ? "not a worker of the plan" : "that is this worker");
            goto out;
        }
        if (s->layer < r.begin[d] || s->layer >= r.end[d]) {
            pl_errf(err, errlen, "layer copy: send of layer %d to %s, which runs layers "
                    "[%d, %d)", s->layer, s->dest, r.begin[d], r.end[d]);
            goto out;
        }
        const int wte = s->layer == L + 1 && r.begin[d] > 0;
        if (!src || !holds_layer(src, cfg, s->layer) || (wte && !pl_engine_find(src, 0, 0))) {
            if (!src)
                pl_errf(err, errlen, "layer copy: send of layer %d to %s: this worker holds no "
                        "layers", s->layer, s->dest);
            else
                pl_errf(err, errlen, "layer copy: send of layer %d%s to %s: not held here "
                        "(layers [%d, %d))", s->layer, wte ? " with the tied wte" : "",
                        s->dest, src->begin, src->end);
            goto out;
        }
        it[nitems++] = (item){d, 1, s->layer};
    }
    /* per pair, layers ascending; a send listed twice moves once */
    qsort(it, (size_t)nitems, sizeof *it, item_cmp);
    int n = 0;
    for (int i = 0; i < nitems; i++)
        if (!n || item_cmp(&it[n - 1], &it[i])) it[n++] = it[i];
    nitems = n;
    for (int i = 0, j; i < nitems; i = j) {
        for (j = i + 1; j < nitems && it[j].peer == it[i].peer && it[j].send == it[i].send;) j++;
        nseg = add_segments(it, i, j, it[i].send ? r.begin[it[i].peer] : b, L, seg, nseg);
    }
    int64_t in = 0;
    for (int i = 0; i < nseg; i++) {
        segment *g = &seg[i];
        const pl_engine *eng = g->send ? src : dst;
        char why[256];
        if (locate(eng, cfg, g, why, sizeof why)) {
            pl_errf(err, errlen, "layer copy: %s of %s %d %s %s: %s", g->send ? "send" : "receive",
                    g->wte ? "the tied wte with layer" : "layer", g->wte ? L + 1 : g->first,
                    g->send ? "to" : "from", r.name[g->peer], why);
            goto out;
        }
        float *arr[3] = {eng->params, eng->m, eng->v};
        for (int a = 0; a < 3; a++)
            ops[nops++] = (pl_xport_op){g->peer, g->send, arr[a] + g->off, g->count};
        if (!g->send) in += 3 * (int64_t)g->count * (int64_t)sizeof(float);
    }
    if (nops == 0) {
        rc = 0;
        goto out;
    }
    /* src was last written by compute (AdamW); the host then frees src and reports the copy
     * done, and the kernels that read dst come after */
    char why[512];
    if (x->after_compute(x->ctx, why, sizeof why) ||
        x->p2p(x->ctx, ops, nops, why, sizeof why) ||
        x->wait(x->ctx, PL_LAYER_COPY_TIMEOUT_MS, why, sizeof why) ||
        x->before_compute(x->ctx, why, sizeof why)) {
        pl_errf(err, errlen, "layer copy (%d operations with %d segments): %s", nops, nseg, why);
        goto out;
    }
    *bytes_in = in;
    rc = 0;
out:
    free(from);
    free(it);
    free(seg);
    free(ops);
    ranks_free(&r);
    return rc;
}
