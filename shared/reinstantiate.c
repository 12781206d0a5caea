/* Pipeline re-instantiation (Oobleck §5.1, appendix B). See reinstantiate.h.
 *
 * Added nodes first replace lost ones in damaged pipelines (their template
 * stays). Then failures are handled in the paper's order: damaged pipelines
 * are simply re-instantiated when a template exists for what remains,
 * otherwise they borrow nodes from pipelines that can yield one, otherwise
 * they are merged. Added nodes left over, or a result that still breaks the
 * rules (a size without template, fewer than f+1 pipelines), lead to a replan
 * toward the best plan of pl_instantiate() for the live node count that keeps
 * every pipeline whose size that plan also has. Within each rebuilt pipeline an
 * exact assignment (Hungarian algorithm) maps nodes to template positions so
 * that the bytes they already hold are as many as possible; where zones are known,
 * the placed nodes are then swapped by zone (zone_place.h) as reinstantiate.h says. */
#include "reinstantiate.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "coverage.h"
#include "util.h"
#include "zone_place.h"

/* A copied layer carries its weights and Adam's m and v (§5: "copy missing layers"). */
#define PL_COPY_FACTOR 3

typedef struct {
    int *v;
    int n, cap;
} ivec;

static int ivec_push(ivec *a, int x)
{
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 8;
        int *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static void ivec_remove_at(ivec *a, int i)
{
    memmove(a->v + i, a->v + i + 1, (size_t)(a->n - i - 1) * sizeof *a->v);
    a->n--;
}

/* Open-addressing name → id table, so validation stays linear in the nodes. */
typedef struct {
    int *slot;
    size_t mask;
    const char *const *name; /* id → name */
} name_index;

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int ni_init(name_index *h, int n, const char *const *name)
{
    size_t cap = 16;
    while (cap < 2 * (size_t)n + 1)
        cap *= 2;
    h->slot = malloc(cap * sizeof *h->slot);
    if (!h->slot)
        return -1;
    memset(h->slot, 0xff, cap * sizeof *h->slot);
    h->mask = cap - 1;
    h->name = name;
    return 0;
}

/* Returns the id of s, or inserts id (when id >= 0) and returns -1. */
static int ni_find_or_add(name_index *h, const char *s, int id)
{
    size_t i = hash_str(s) & h->mask;
    while (h->slot[i] >= 0) {
        if (strcmp(h->name[h->slot[i]], s) == 0)
            return h->slot[i];
        i = (i + 1) & h->mask;
    }
    if (id >= 0)
        h->slot[i] = id;
    return -1;
}

/* ---- CURRENT.json ---- */

void pl_current_plan_free(pl_current_plan *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->npipelines; i++) {
        for (int j = 0; j < c->pipelines[i].nnodes; j++)
            free(c->pipelines[i].nodes[j]);
        free(c->pipelines[i].nodes);
    }
    free(c->pipelines);
    c->pipelines = NULL;
    c->npipelines = 0;
}

/* The root is an object whose "pipelines" are a non-empty array of objects, each with
 * non-empty "nodes"; *total receives the node count. */
static int check_current_shape(const cJSON *root, const cJSON *pipes, int *total, char *err,
                               size_t errlen)
{
    if (!cJSON_IsObject(root))
        return pl_errf(err, errlen, "current plan: must be a JSON object");
    if (!pipes)
        return pl_errf(err, errlen, "pipelines: missing");
    if (!cJSON_IsArray(pipes) || cJSON_GetArraySize(pipes) == 0)
        return pl_errf(err, errlen, "pipelines: must be a non-empty array");
    int np = cJSON_GetArraySize(pipes);
    for (int i = 0; i < np; i++) {
        const cJSON *pi = cJSON_GetArrayItem(pipes, i);
        if (!cJSON_IsObject(pi))
            return pl_errf(err, errlen, "pipelines[%d]: must be an object", i);
        const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(pi, "nodes");
        if (!cJSON_IsArray(nodes) || cJSON_GetArraySize(nodes) == 0)
            return pl_errf(err, errlen,
                           "pipelines[%d].nodes: must be a non-empty array of node names", i);
        *total += cJSON_GetArraySize(nodes);
    }
    return 0;
}

/* The names parsed so far, to find a repeat and say where the first one is. */
typedef struct {
    const char **names; /* id → name */
    int *where;         /* id → pipeline index */
    name_index ix;
    int n;
} seen_names;

/* pipelines[i].nodes[j] (s) into cp->nodes[j]: a non-empty name not seen before. */
static int parse_current_node(const cJSON *s, int i, int j, seen_names *sn,
                              pl_current_pipeline *cp, char *err, size_t errlen)
{
    if (!cJSON_IsString(s))
        return pl_errf(err, errlen, "pipelines[%d].nodes[%d]: must be a string", i, j);
    if (s->valuestring[0] == '\0')
        return pl_errf(err, errlen, "pipelines[%d].nodes[%d]: must not be empty", i, j);
    sn->names[sn->n] = s->valuestring;
    int dup = ni_find_or_add(&sn->ix, s->valuestring, sn->n);
    if (dup >= 0)
        return pl_errf(err, errlen,
                       "pipelines[%d].nodes[%d]: node \"%s\" is already in pipelines[%d]", i, j,
                       s->valuestring, sn->where[dup]);
    sn->where[sn->n++] = i;
    cp->nodes[j] = strdup(s->valuestring);
    if (!cp->nodes[j])
        return pl_errf(err, errlen, "current plan: out of memory");
    cp->nnodes = j + 1;
    return 0;
}

/* pipelines[i]'s nodes (an array check_current_shape accepted) into cp. */
static int parse_current_pipeline(const cJSON *nodes, int i, seen_names *sn,
                                  pl_current_pipeline *cp, char *err, size_t errlen)
{
    int k = cJSON_GetArraySize(nodes);
    cp->nodes = calloc((size_t)k, sizeof *cp->nodes);
    if (!cp->nodes)
        return pl_errf(err, errlen, "current plan: out of memory");
    for (int j = 0; j < k; j++)
        if (parse_current_node(cJSON_GetArrayItem(nodes, j), i, j, sn, cp, err, errlen))
            return -1;
    return 0;
}

/* The pipelines (total nodes in all) into out. */
static int parse_current_pipelines(const cJSON *pipes, int total, pl_current_plan *out,
                                   char *err, size_t errlen)
{
    int np = cJSON_GetArraySize(pipes), rc = -1;
    out->pipelines = calloc((size_t)np, sizeof *out->pipelines);
    seen_names sn = {0};
    sn.names = malloc((size_t)total * sizeof *sn.names);
    sn.where = malloc((size_t)total * sizeof *sn.where);
    if (!out->pipelines || !sn.names || !sn.where || ni_init(&sn.ix, total, sn.names)) {
        pl_errf(err, errlen, "current plan: out of memory");
    } else {
        out->npipelines = np;
        rc = 0;
        for (int i = 0; rc == 0 && i < np; i++) {
            const cJSON *nodes =
                cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(pipes, i), "nodes");
            rc = parse_current_pipeline(nodes, i, &sn, &out->pipelines[i], err, errlen);
        }
    }
    free(sn.ix.slot);
    free(sn.names);
    free(sn.where);
    return rc;
}

int pl_current_parse(const char *json, pl_current_plan *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_Parse(json);
    if (!root)
        return pl_errf(err, errlen, "current plan: not valid JSON");
    const cJSON *pipes = cJSON_GetObjectItemCaseSensitive(root, "pipelines");
    int total = 0;
    int rc = check_current_shape(root, pipes, &total, err, errlen);
    if (rc == 0)
        rc = parse_current_pipelines(pipes, total, out, err, errlen);
    cJSON_Delete(root);
    if (rc)
        pl_current_plan_free(out);
    return rc;
}

/* ---- re-instantiation state ---- */

typedef struct {
    ivec nodes;  /* node ids */
    int label;   /* index in the current plan; -1 for a pipeline formed from free nodes */
    int size0;   /* size in the current plan */
    int changed; /* node set differs from the current plan's */
    int gone;
} group;

typedef struct {
    const pl_profile *p;
    const pl_template_set *ts;
    const pl_coverage *cov; /* precomputed best plans, or NULL */
    int tolerate;
    int ncur, nall;       /* ids [0, ncur) are current nodes, [ncur, nall) added ones */
    const char **name;
    unsigned char *alive; /* not removed */
    unsigned char *sends; /* alive, or removed and departing: can send its layers */
    int *hr_off;          /* node u held [hr_lo[i], hr_hi[i]) for i in hr_off[u] .. hr_off[u+1] */
    int *hr_lo, *hr_hi;
    int64_t *pb;          /* pb[l] = Σ param_bytes of layers < l */
    int *zone;            /* node u's zone (−1 unknown); NULL: no zone known */
    int nzones;
    group *g;
    int ng, gcap;
    ivec pool;            /* free nodes, taken from pool_head on */
    int pool_head;
    char **steps;
    int nsteps, scap;
    char *err;
    size_t errlen;
} ctx;

static int oom(ctx *c)
{
    return pl_errf(c->err, c->errlen, "re-instantiation: out of memory");
}

static int add_step(ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int add_step(ctx *c, const char *fmt, ...)
{
    if (c->nsteps == c->scap) {
        int cap = c->scap ? 2 * c->scap : 8;
        char **s = realloc(c->steps, (size_t)cap * sizeof *s);
        if (!s)
            return oom(c);
        c->steps = s;
        c->scap = cap;
    }
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (!(c->steps[c->nsteps] = strdup(buf)))
        return oom(c);
    c->nsteps++;
    return 0;
}

static const pl_template *tmpl(const ctx *c, int n)
{
    return n > 0 ? pl_template_for(c->ts, n) : NULL;
}

/* Bytes of layers [lo, hi) that node u held before the change. */
static int64_t held_in(const ctx *c, int u, int lo, int hi)
{
    int64_t b = 0;
    if (u >= c->ncur)
        return 0;
    for (int i = c->hr_off[u]; i < c->hr_off[u + 1]; i++) {
        int a = c->hr_lo[i] > lo ? c->hr_lo[i] : lo, z = c->hr_hi[i] < hi ? c->hr_hi[i] : hi;
        if (a < z)
            b += c->pb[z] - c->pb[a];
    }
    return b;
}

static int holds(const ctx *c, int u, int layer)
{
    if (u >= c->ncur)
        return 0;
    for (int i = c->hr_off[u]; i < c->hr_off[u + 1]; i++)
        if (c->hr_lo[i] <= layer && layer < c->hr_hi[i])
            return 1;
    return 0;
}

static int new_group(ctx *c, int label, int size0)
{
    if (c->ng == c->gcap) {
        int cap = c->gcap ? 2 * c->gcap : 8;
        group *g = realloc(c->g, (size_t)cap * sizeof *g);
        if (!g)
            return -1;
        c->g = g;
        c->gcap = cap;
    }
    memset(&c->g[c->ng], 0, sizeof c->g[c->ng]);
    c->g[c->ng].label = label;
    c->g[c->ng].size0 = size0;
    return c->ng++;
}

static int pool_left(const ctx *c)
{
    return c->pool.n - c->pool_head;
}

/* Steady-state microbatches per ns of the template for n nodes. */
static double rate(const ctx *c, int n)
{
    int64_t m = tmpl(c, n)->max_stage_ns;
    return 1.0 / (double)(m > 0 ? m : 1);
}

/* §5.1 borrowing: the pipeline that can yield a node (keeping a template) and
 * loses the least throughput; ties go to pipelines already being rebuilt. */
static int best_lender(const ctx *c, int borrower)
{
    int best = -1;
    double best_loss = 0;
    for (int j = 0; j < c->ng; j++) {
        const group *g = &c->g[j];
        int n = g->nodes.n;
        if (j == borrower || g->gone || !tmpl(c, n) || !tmpl(c, n - 1))
            continue;
        double loss = rate(c, n) - rate(c, n - 1);
        if (best < 0 || loss < best_loss ||
            (loss == best_loss && g->changed && !c->g[best].changed)) {
            best = j;
            best_loss = loss;
        }
    }
    return best;
}

/* Position in lender of the node whose layers the borrower lacks most: it
 * wastes the fewest held bytes, the rest of what it holds moves anyway. */
static int lend_position(const ctx *c, int lender, int borrower, unsigned char *missing,
                         int64_t *mb)
{
    int L = c->p->nlayers;
    memset(missing, 1, (size_t)L);
    const ivec *bn = &c->g[borrower].nodes;
    for (int i = 0; i < bn->n; i++) {
        int u = bn->v[i];
        if (u >= c->ncur)
            continue;
        for (int r = c->hr_off[u]; r < c->hr_off[u + 1]; r++)
            memset(missing + c->hr_lo[r], 0, (size_t)(c->hr_hi[r] - c->hr_lo[r]));
    }
    mb[0] = 0;
    for (int l = 0; l < L; l++)
        mb[l + 1] = mb[l] + (missing[l] ? c->p->layers[l].param_bytes : 0);
    const ivec *ln = &c->g[lender].nodes;
    int best = 0;
    int64_t best_waste = INT64_MAX;
    for (int i = 0; i < ln->n; i++) {
        int u = ln->v[i];
        int64_t waste = 0; /* an added node (u ≥ ncur) holds nothing: none wasted */
        if (u < c->ncur)
            for (int r = c->hr_off[u]; r < c->hr_off[u + 1]; r++)
                waste += (c->pb[c->hr_hi[r]] - c->pb[c->hr_lo[r]]) -
                         (mb[c->hr_hi[r]] - mb[c->hr_lo[r]]);
        if (waste < best_waste) {
            best = i;
            best_waste = waste;
        }
    }
    return best;
}

/* Merges groups a and b into the one earlier in the current plan. */
static int merge(ctx *c, int a, int b)
{
    int keep = a < b ? a : b, drop = a < b ? b : a;
    group *k = &c->g[keep], *d = &c->g[drop];
    int nk = k->nodes.n, nd = d->nodes.n;
    for (int i = 0; i < nd; i++)
        if (ivec_push(&k->nodes, d->nodes.v[i]))
            return oom(c);
    d->nodes.n = 0;
    d->gone = 1;
    k->changed = 1;
    if (add_step(c, "merge: pipelines %d and %d (%d + %d -> %d nodes)", k->label, d->label, nk,
                 nd, nk + nd))
        return -1;
    return keep;
}

/* Appendix B: a merge partner with a template whose merged size also has one;
 * the smallest, then one already being rebuilt, then the earliest. */
static int merge_partner(const ctx *c, int acc)
{
    int best = -1, na = c->g[acc].nodes.n;
    for (int j = 0; j < c->ng; j++) {
        const group *g = &c->g[j];
        if (j == acc || g->gone || !tmpl(c, g->nodes.n) || !tmpl(c, na + g->nodes.n))
            continue;
        if (best < 0 || g->nodes.n < c->g[best].nodes.n ||
            (g->nodes.n == c->g[best].nodes.n && g->changed && !c->g[best].changed))
            best = j;
    }
    return best;
}

/* Sort keys: qsort has no user pointer in C17, so the key travels with the id. */
typedef struct {
    int size, id;
} sized;

static int cmp_sized(const sized *a, const sized *b, int dir)
{
    if (a->size != b->size)
        return dir * (a->size < b->size ? -1 : 1);
    return a->id < b->id ? -1 : a->id > b->id;
}

static int cmp_smallest_first(const void *x, const void *y)
{
    return cmp_sized(x, y, 1);
}

static int cmp_largest_first(const void *x, const void *y)
{
    return cmp_sized(x, y, -1);
}

/* Sorts group indices by size (then index), smallest first when dir > 0. */
static int sort_groups(const ctx *c, ivec *ids, int dir)
{
    if (ids->n < 2)
        return 0;
    sized *k = malloc((size_t)ids->n * sizeof *k);
    if (!k)
        return -1;
    for (int i = 0; i < ids->n; i++)
        k[i] = (sized){c->g[ids->v[i]].nodes.n, ids->v[i]};
    qsort(k, (size_t)ids->n, sizeof *k, dir > 0 ? cmp_smallest_first : cmp_largest_first);
    for (int i = 0; i < ids->n; i++)
        ids->v[i] = k[i].id;
    free(k);
    return 0;
}

/* Added nodes first take the places of lost ones, so that a damaged pipeline
 * keeps its template: those that have no template for what remains, then the
 * others, each in plan order. */
static int replace_lost(ctx *c)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < c->ng && pool_left(c) > 0; i++) {
            group *g = &c->g[i];
            int lacks_template = !tmpl(c, g->nodes.n);
            if (lacks_template != (pass == 0))
                continue;
            while (g->nodes.n < g->size0 && pool_left(c) > 0) {
                int u = c->pool.v[c->pool_head++], n = g->nodes.n;
                if (ivec_push(&g->nodes, u))
                    return oom(c);
                if (add_step(c, "replace: pipeline %d (%d -> %d nodes) takes added node %s",
                             g->label, n, n + 1, c->name[u]))
                    return -1;
            }
        }
    return 0;
}

/* A wiped-out pipeline disappears unless it is needed for f+1 replicas: then
 * it is rebuilt by borrowing, like Figure 8b from zero nodes. */
static int drop_wiped_out(ctx *c)
{
    int nonempty = 0;
    for (int i = 0; i < c->ng; i++)
        nonempty += c->g[i].nodes.n > 0;
    int keep = c->tolerate + 1 - nonempty;
    for (int i = 0; i < c->ng; i++) {
        group *g = &c->g[i];
        if (g->nodes.n > 0)
            continue;
        if (keep-- > 0)
            continue;
        g->gone = 1;
        if (add_step(c, "drop: pipeline %d (%d -> 0 nodes)", g->label, g->size0))
            return -1;
    }
    return 0;
}

/* Damaged pipelines with a template for what remains are simply re-instantiated. */
static int note_simple(ctx *c)
{
    for (int i = 0; i < c->ng; i++) {
        group *g = &c->g[i];
        if (!g->gone && g->nodes.n < g->size0 && tmpl(c, g->nodes.n) &&
            add_step(c, "simple: pipeline %d (%d -> %d nodes)", g->label, g->size0, g->nodes.n))
            return -1;
    }
    return 0;
}

/* Group i, which lacks a template, borrows nodes one at a time up to the next
 * size that has one, while some pipeline can lend. missing and mb are
 * lend_position's scratch. */
static int borrow_into(ctx *c, int i, unsigned char *missing, int64_t *mb)
{
    group *g = &c->g[i];
    int target = 0;
    for (int m = g->nodes.n + 1; m <= c->ts->n_max && !target; m++)
        if (tmpl(c, m))
            target = m;
    /* replace_lost() left no added node when a pipeline lacks a template */
    while (target && g->nodes.n < target) {
        int n = g->nodes.n;
        int li = best_lender(c, i);
        if (li < 0)
            break;
        group *lg = &c->g[li];
        int pos = lend_position(c, li, i, missing, mb), u = lg->nodes.v[pos];
        ivec_remove_at(&lg->nodes, pos);
        lg->changed = 1;
        if (ivec_push(&g->nodes, u))
            return oom(c);
        g->changed = 1;
        if (add_step(c,
                     "borrow: pipeline %d (%d -> %d nodes) borrows %s "
                     "from pipeline %d (%d -> %d nodes)",
                     g->label, n, n + 1, c->name[u], lg->label, lg->nodes.n + 1, lg->nodes.n))
            return -1;
    }
    return 0;
}

/* §5.1 borrowing, for every pipeline still without a template, in plan order. */
static int borrow_nodes(ctx *c)
{
    int L = c->p->nlayers;
    unsigned char *missing = malloc((size_t)L + 1);
    int64_t *mb = malloc((size_t)(L + 1) * sizeof *mb);
    if (!missing || !mb) {
        free(missing);
        free(mb);
        return oom(c);
    }
    int rc = 0;
    for (int i = 0; i < c->ng && rc == 0; i++)
        if (!c->g[i].gone && !tmpl(c, c->g[i].nodes.n))
            rc = borrow_into(c, i, missing, mb);
    free(missing);
    free(mb);
    return rc ? -1 : 0;
}

/* Appendix B: pipelines still broken are merged, the smallest pairwise until
 * one has a template; a last one joins a healthy pipeline. Empty ones drop. */
static int merge_broken(ctx *c)
{
    ivec broken = {0};
    for (int i = 0; i < c->ng; i++) {
        group *g = &c->g[i];
        if (g->gone || tmpl(c, g->nodes.n))
            continue;
        if (g->nodes.n == 0) {
            g->gone = 1;
            if (add_step(c, "drop: pipeline %d (%d -> 0 nodes)", g->label, g->size0))
                goto fail;
        } else if (ivec_push(&broken, i)) {
            oom(c);
            goto fail;
        }
    }
    if (sort_groups(c, &broken, 1)) {
        oom(c);
        goto fail;
    }
    for (int i = 0; i < broken.n;) {
        int acc = broken.v[i++];
        while (!tmpl(c, c->g[acc].nodes.n)) {
            int other = i < broken.n ? broken.v[i++] : merge_partner(c, acc);
            if (other < 0)
                break;
            if ((acc = merge(c, acc, other)) < 0)
                goto fail;
        }
    }
    free(broken.v);
    return 0;
fail:
    free(broken.v);
    return -1;
}

/* 1 when every live pipeline has a template and there are f+1 of them. */
static int keeps_rules(const ctx *c)
{
    int live = 0;
    for (int i = 0; i < c->ng; i++) {
        if (c->g[i].gone)
            continue;
        if (!tmpl(c, c->g[i].nodes.n))
            return 0;
        live++;
    }
    return live >= c->tolerate + 1;
}

/* §5.1 in order: simple re-instantiation, borrowing nodes, merging pipelines.
 * Returns 1 when the result keeps the rules, 0 when a replan is needed. */
static int handle_failures(ctx *c)
{
    if (replace_lost(c) || drop_wiped_out(c) || note_simple(c) || borrow_nodes(c) ||
        merge_broken(c))
        return -1;
    return keeps_rules(c);
}

/* Bytes node u held before the change. */
static int64_t held_total(const ctx *c, int u)
{
    return held_in(c, u, 0, c->p->nlayers);
}

/* The best plan for the largest covered node count up to total (an uncovered
 * count leaves nodes idle; (f+1)·n0 at worst). Counts in the precomputed
 * coverage table are a lookup (§4.2: plans are precomputed so that
 * reconfiguration is fast); others are computed into *owned, which the caller
 * frees. *used receives the node count planned for; NULL on error. */
static const pl_instance_plan *find_target_plan(ctx *c, int total, int64_t global_batch,
                                                pl_instance_plan *owned, int *used)
{
    for (int n = total; n >= (c->tolerate + 1) * c->ts->n0; n--) {
        *used = n;
        if (c->cov && n >= c->cov->nodes_lo && n <= c->cov->nodes_hi) {
            const pl_instance_plan *e = &c->cov->entries[c->cov->nodes_hi - n];
            if (e->covered)
                return e;
            continue;
        }
        if (pl_instantiate(c->ts, n, c->tolerate, global_batch, c->p->microbatch_size, owned,
                           c->err, c->errlen))
            return NULL;
        if (owned->covered)
            return owned;
        pl_instance_plan_free(owned);
    }
    pl_errf(c->err, c->errlen, "templates: no plan covers %d nodes or fewer", total);
    return NULL;
}

/* How the live pipelines map onto the target plan's pipelines. */
typedef struct {
    int nt, ng0;  /* pipelines in the plan; groups before any new one */
    int *tsize;   /* nodes of plan pipeline k, largest first */
    int *tgroup;  /* group taking plan pipeline k, or -1 */
    int *gtarget; /* plan pipeline group i takes, or -1 */
    ivec freed;   /* nodes free for the plan: released ones first, then added ones */
    int head;     /* freed nodes handed out so far */
} pairing;

static int pairing_init(ctx *c, const pl_instance_plan *plan, pairing *pr)
{
    int nt = plan->npipelines, ng0 = c->ng;
    pr->nt = nt;
    pr->ng0 = ng0;
    pr->tsize = malloc((size_t)(nt ? nt : 1) * sizeof *pr->tsize);
    pr->tgroup = malloc((size_t)(nt ? nt : 1) * sizeof *pr->tgroup);
    pr->gtarget = malloc((size_t)(ng0 ? ng0 : 1) * sizeof *pr->gtarget);
    if (!pr->tsize || !pr->tgroup || !pr->gtarget)
        return oom(c);
    for (int k = 0; k < nt; k++) {
        pr->tsize[k] = plan->pipelines[k].template_nodes;
        pr->tgroup[k] = -1;
    }
    for (int i = 0; i < ng0; i++)
        pr->gtarget[i] = -1;
    return 0;
}

static void pairing_free(pairing *pr)
{
    free(pr->tsize);
    free(pr->tgroup);
    free(pr->gtarget);
    free(pr->freed.v);
}

/* "plan: best plan for 9 nodes is 2x3 + 1x3 nodes": counts of each template
 * size, largest first. */
static int add_plan_step(ctx *c, const pairing *pr, int total, int used)
{
    char desc[160] = "";
    int len = 0;
    for (int k = 0, run = 1; k < pr->nt; k++, run++)
        if ((k + 1 == pr->nt || pr->tsize[k + 1] != pr->tsize[k]) && len < (int)sizeof desc) {
            len += snprintf(desc + len, sizeof desc - (size_t)len, "%s%dx%d", len ? " + " : "",
                            run, pr->tsize[k]);
            run = 0;
        }
    return used < total ? add_step(c, "plan: best plan for %d nodes is %s nodes (%d idle)", total,
                                   desc, total - used)
                        : add_step(c, "plan: best plan for %d nodes is %s nodes", total, desc);
}

/* Exact matches: both lists largest first, and within a size unchanged
 * pipelines first, then the earliest; a merge-like walk pairs equal sizes. */
static int pair_equal_sizes(ctx *c, pairing *pr)
{
    sized *byfit = malloc((size_t)(pr->ng0 ? pr->ng0 : 1) * sizeof *byfit);
    if (!byfit)
        return oom(c);
    int nlive = 0;
    for (int i = 0; i < pr->ng0; i++)
        if (!c->g[i].gone)
            byfit[nlive++] = (sized){2 * c->g[i].nodes.n + !c->g[i].changed, i};
    qsort(byfit, (size_t)nlive, sizeof *byfit, cmp_largest_first);
    for (int k = 0, j = 0; k < pr->nt && j < nlive;) {
        int n = byfit[j].size / 2;
        if (n == pr->tsize[k]) {
            pr->gtarget[byfit[j].id] = k;
            pr->tgroup[k++] = byfit[j++].id;
        } else if (n > pr->tsize[k]) {
            j++; /* no later plan size is as large */
        } else {
            k++;
        }
    }
    free(byfit);
    return 0;
}

/* Group g leaves the plan; its nodes become free. */
static int dissolve(ctx *c, group *g, ivec *freed)
{
    for (int j = 0; j < g->nodes.n; j++)
        if (ivec_push(freed, g->nodes.v[j]))
            return oom(c);
    if (add_step(c, "dissolve: pipeline %d (%d nodes)", g->label, g->nodes.n))
        return -1;
    g->nodes.n = 0;
    g->gone = 1;
    return 0;
}

/* Releases the nodes of g holding least until t remain: their state is
 * cheapest to rebuild. */
static int shrink(ctx *c, group *g, int t, ivec *freed)
{
    int n = g->nodes.n;
    if (n <= t)
        return 0;
    while (g->nodes.n > t) {
        int best = 0;
        int64_t best_b = INT64_MAX;
        for (int j = 0; j < g->nodes.n; j++) {
            int64_t b = held_total(c, g->nodes.v[j]);
            if (b < best_b) {
                best = j;
                best_b = b;
            }
        }
        if (ivec_push(freed, g->nodes.v[best]))
            return oom(c);
        ivec_remove_at(&g->nodes, best);
    }
    g->changed = 1;
    return add_step(c, "shrink: pipeline %d (%d -> %d nodes)", g->label, n, t);
}

/* The pipelines without an equal plan size, largest first, take the plan's
 * remaining sizes, largest first, shrinking to them; those left over dissolve. */
static int resize_unpaired(ctx *c, pairing *pr)
{
    ivec rg = {0}, rt = {0};
    int rc = -1;
    for (int i = 0; i < pr->ng0; i++)
        if (!c->g[i].gone && pr->gtarget[i] < 0 && ivec_push(&rg, i)) {
            oom(c);
            goto done;
        }
    for (int k = 0; k < pr->nt; k++)
        if (pr->tgroup[k] < 0 && ivec_push(&rt, k)) {
            oom(c);
            goto done;
        }
    if (sort_groups(c, &rg, -1)) { /* plan sizes are already largest first */
        oom(c);
        goto done;
    }
    for (int r = 0; r < rg.n; r++) {
        int i = rg.v[r];
        if (r >= rt.n) {
            if (dissolve(c, &c->g[i], &pr->freed))
                goto done;
            continue;
        }
        pr->gtarget[i] = rt.v[r];
        pr->tgroup[rt.v[r]] = i;
        if (shrink(c, &c->g[i], pr->tsize[rt.v[r]], &pr->freed))
            goto done;
    }
    rc = 0;
done:
    free(rg.v);
    free(rt.v);
    return rc;
}

/* Nodes left in the pool (added ones) are free after the released ones. */
static int free_pool(ctx *c, pairing *pr)
{
    for (int j = c->pool_head; j < c->pool.n; j++)
        if (ivec_push(&pr->freed, c->pool.v[j]))
            return oom(c);
    return 0;
}

/* Hands out free nodes to nodes until it has size of them. */
static int take_freed(ctx *c, pairing *pr, ivec *nodes, int size)
{
    while (nodes->n < size)
        if (ivec_push(nodes, pr->freed.v[pr->head++]))
            return oom(c);
    return 0;
}

/* Paired pipelines smaller than their plan size grow with free nodes. */
static int grow_paired(ctx *c, pairing *pr)
{
    for (int i = 0; i < pr->ng0; i++) {
        group *g = &c->g[i];
        if (g->gone || pr->gtarget[i] < 0 || g->nodes.n >= pr->tsize[pr->gtarget[i]])
            continue;
        int n = g->nodes.n;
        if (take_freed(c, pr, &g->nodes, pr->tsize[pr->gtarget[i]]))
            return -1;
        g->changed = 1;
        if (add_step(c, "grow: pipeline %d (%d -> %d nodes)", g->label, n, g->nodes.n))
            return -1;
    }
    return 0;
}

/* Plan pipelines no group took are formed from free nodes. */
static int form_unpaired(ctx *c, pairing *pr)
{
    for (int k = 0; k < pr->nt; k++) {
        if (pr->tgroup[k] >= 0)
            continue;
        int gi = new_group(c, -1, 0);
        if (gi < 0)
            return oom(c);
        c->g[gi].changed = 1;
        if (take_freed(c, pr, &c->g[gi].nodes, pr->tsize[k]))
            return -1;
        if (add_step(c, "new: pipeline of %d nodes", pr->tsize[k]))
            return -1;
    }
    return 0;
}

/* What the plan cannot use stays idle: the free nodes not handed out become the pool. */
static int leave_idle(ctx *c, pairing *pr)
{
    free(c->pool.v);
    c->pool = pr->freed;
    c->pool_head = pr->head;
    pr->freed = (ivec){0};
    for (int j = c->pool_head; j < c->pool.n; j++)
        if (add_step(c, "idle: %s", c->name[c->pool.v[j]]))
            return -1;
    return 0;
}

/* Moves toward the best plan for the live node count: pipelines whose size
 * the plan has stay as they are; the others, largest first, are paired with
 * the plan's remaining sizes, largest first, and grow or shrink; free nodes
 * (released ones first, then added ones) fill the rest. */
static int replan(ctx *c, int64_t global_batch)
{
    int total = pool_left(c);
    for (int i = 0; i < c->ng; i++)
        if (!c->g[i].gone)
            total += c->g[i].nodes.n;
    pl_instance_plan owned = {0};
    int used = 0;
    const pl_instance_plan *target = find_target_plan(c, total, global_batch, &owned, &used);
    if (!target)
        return -1;
    pairing pr = {0};
    int rc = pairing_init(c, target, &pr) || add_plan_step(c, &pr, total, used) ||
                     pair_equal_sizes(c, &pr) || resize_unpaired(c, &pr) ||
                     free_pool(c, &pr) || grow_paired(c, &pr) || form_unpaired(c, &pr) ||
                     leave_idle(c, &pr)
                 ? -1
                 : 0;
    pairing_free(&pr);
    pl_instance_plan_free(&owned);
    return rc;
}

/* The Hungarian algorithm's state for a k × k cost matrix, all 1-based: the costs
 * a[i·w + j], the potentials u (rows) and v (columns), the row pr[j] matched to column j
 * (pr[0]: the row being added), and per column the least reduced cost minv from the
 * tree, the column way before it on the path there, and whether it is in the tree. */
typedef struct {
    int k;
    size_t w;
    int64_t *a, *u, *v, *minv;
    int *pr, *way;
    unsigned char *used;
} hungarian;

#define HUNGARIAN_INF (INT64_MAX / 4)

/* Puts column j0 in the tree, relaxes the columns outside it from j0's row, and shifts
 * the potentials by the least reduced cost left; returns the column that has it. */
static int hungarian_grow(hungarian *h, int j0)
{
    h->used[j0] = 1;
    int i0 = h->pr[j0], j1 = 0;
    int64_t delta = HUNGARIAN_INF;
    for (int j = 1; j <= h->k; j++) {
        if (h->used[j])
            continue;
        int64_t cur = h->a[(size_t)i0 * h->w + (size_t)j] - h->u[i0] - h->v[j];
        if (cur < h->minv[j]) {
            h->minv[j] = cur;
            h->way[j] = j0;
        }
        if (h->minv[j] < delta) {
            delta = h->minv[j];
            j1 = j;
        }
    }
    for (int j = 0; j <= h->k; j++) {
        if (h->used[j]) {
            h->u[h->pr[j]] += delta;
            h->v[j] -= delta;
        } else {
            h->minv[j] -= delta;
        }
    }
    return j1;
}

/* Matches row i too: grows the tree until it reaches a free column, then shifts the
 * matching along the path there. */
static void hungarian_add_row(hungarian *h, int i)
{
    int j0 = 0;
    h->pr[0] = i;
    for (int j = 0; j <= h->k; j++) {
        h->minv[j] = HUNGARIAN_INF;
        h->used[j] = 0;
    }
    do
        j0 = hungarian_grow(h, j0);
    while (h->pr[j0] != 0);
    do {
        int j1 = h->way[j0];
        h->pr[j0] = h->pr[j1];
        j0 = j1;
    } while (j0);
}

/* Exact assignment (Hungarian algorithm, O(k³)) of the group's nodes to the
 * template's node positions maximising the bytes each already holds there;
 * order[j] receives the node id at position j. */
static int assign_positions(const ctx *c, const group *g, const pl_template *t, int *order)
{
    int k = g->nodes.n;
    size_t w = (size_t)k + 1;
    int64_t *a = calloc(w * w, sizeof *a);
    int64_t *u = calloc(w, sizeof *u), *v = calloc(w, sizeof *v), *minv = malloc(w * sizeof *minv);
    int *pr = calloc(w, sizeof *pr), *way = calloc(w, sizeof *way);
    unsigned char *used = malloc(w);
    hungarian h = {k, w, a, u, v, minv, pr, way, used};
    int rc = -1;
    if (!a || !u || !v || !minv || !pr || !way || !used)
        goto done;
    /* a[i][j] = −(bytes node i already holds of position j's layers), 1-based. */
    for (int s = 0; s < t->nstages; s++) {
        const pl_stage *st = &t->stages[s];
        for (int i = 0; i < k; i++)
            a[(size_t)(i + 1) * w + (size_t)st->node + 1] -=
                held_in(c, g->nodes.v[i], st->layer_begin, st->layer_end);
    }
    for (int i = 1; i <= k; i++)
        hungarian_add_row(&h, i);
    for (int j = 1; j <= k; j++)
        order[j - 1] = g->nodes.v[pr[j] - 1];
    rc = 0;
done:
    free(a);
    free(u);
    free(v);
    free(minv);
    free(pr);
    free(way);
    free(used);
    return rc;
}

void pl_reinstantiation_free(pl_reinstantiation *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->npipelines; i++)
        free(r->pipelines[i].nodes);
    free(r->pipelines);
    for (int i = 0; i < r->ncopies; i++)
        free(r->copies[i].layers);
    free(r->copies);
    free(r->idle_nodes);
    free(r->lost_layers);
    for (int i = 0; i < r->nsteps; i++)
        free(r->steps[i]);
    free(r->steps);
    free(r->names_);
    memset(r, 0, sizeof *r);
}

/* Node names owned by the result, indexed by node id. */
static const char **copy_names(const ctx *c, pl_reinstantiation *out)
{
    size_t total = 0;
    for (int u = 0; u < c->nall; u++)
        total += strlen(c->name[u]) + 1;
    const char **ptr = malloc((size_t)c->nall * sizeof *ptr);
    out->names_ = malloc(total ? total : 1);
    if (!ptr || !out->names_) {
        free(ptr);
        return NULL;
    }
    char *w = out->names_;
    for (int u = 0; u < c->nall; u++) {
        size_t n = strlen(c->name[u]) + 1;
        memcpy(w, c->name[u], n);
        ptr[u] = w;
        w += n;
    }
    return ptr;
}

typedef struct {
    int u, begin; /* node id, first index in the flat copy list */
} receiver;

typedef struct {
    const char *name;
    int id;
} named;

static int cmp_named(const void *x, const void *y)
{
    return strcmp(((const named *)x)->name, ((const named *)y)->name);
}

/* Holders of each layer that can send it, in name order (the tie-break below):
 * layer l's are hold[hoff[l] .. hoff[l+1]). */
static int build_holders(const ctx *c, int **hoff_out, int **hold_out)
{
    int L = c->p->nlayers, n = 0;
    named *byname = malloc((size_t)(c->ncur ? c->ncur : 1) * sizeof *byname);
    int *hoff = calloc((size_t)L + 1, sizeof *hoff);
    int *hcur = malloc((size_t)(L ? L : 1) * sizeof *hcur);
    *hoff_out = hoff;
    *hold_out = NULL;
    if (!byname || !hoff || !hcur) {
        free(byname);
        free(hcur);
        return -1;
    }
    for (int u = 0; u < c->ncur; u++)
        if (c->sends[u])
            byname[n++] = (named){c->name[u], u};
    qsort(byname, (size_t)n, sizeof *byname, cmp_named);
    for (int u = 0; u < c->ncur; u++)
        for (int r = c->hr_off[u]; c->sends[u] && r < c->hr_off[u + 1]; r++)
            for (int l = c->hr_lo[r]; l < c->hr_hi[r]; l++)
                hoff[l + 1]++;
    for (int l = 0; l < L; l++)
        hoff[l + 1] += hoff[l];
    int *hold = malloc((size_t)(hoff[L] ? hoff[L] : 1) * sizeof *hold);
    if (hold) {
        memcpy(hcur, hoff, (size_t)L * sizeof *hcur);
        for (int i = 0; i < n; i++) {
            int u = byname[i].id;
            for (int r = c->hr_off[u]; r < c->hr_off[u + 1]; r++)
                for (int l = c->hr_lo[r]; l < c->hr_hi[r]; l++)
                    hold[hcur[l]++] = u;
        }
    }
    free(byname);
    free(hcur);
    *hold_out = hold;
    return hold ? 0 : -1;
}

/* How many parts a layer of `bytes` with nh surviving holders is copied in. */
static int copy_parts(int64_t bytes, int nh)
{
    int64_t n = bytes / PL_COPY_PART_MIN_BYTES;
    if (n > nh) n = nh;
    if (n > PL_COPY_MAX_PARTS) n = PL_COPY_MAX_PARTS;
    return n > 1 ? (int)n : 1;
}

/* Whether holder v is a better copy source than w: surviving first, then the fewest bytes
 * to send so far. */
static int better_source(const ctx *c, const int64_t *sent, int v, int w)
{
    return c->alive[v] > c->alive[w] || (c->alive[v] == c->alive[w] && sent[v] < sent[w]);
}

/* The best PL_COPY_MAX_PARTS (or fewer) of a layer's nh holders, best first, ties in the
 * holders' order, into best[]; one pass, as a layer has a holder in every pipeline (on
 * a thousand nodes, hundreds). Returns how many of the holders survive. */
static int best_sources(const ctx *c, const int *hold, int nh, const int64_t *sent, int *best)
{
    int surviving = 0, m = 0;
    for (int h = 0; h < nh; h++) {
        const int v = hold[h];
        surviving += c->alive[v] != 0;
        int p = m;
        while (p > 0 && better_source(c, sent, v, best[p - 1]))
            p--;
        if (p == PL_COPY_MAX_PARTS)
            continue;
        if (m < PL_COPY_MAX_PARTS)
            m++;
        memmove(best + p + 1, best + p, (size_t)(m - 1 - p) * sizeof *best);
        best[p] = v;
    }
    return surviving;
}

/* plan_copies' lists: every copy, receiver after receiver (flat); each receiver and its
 * first copy there (rcv); the bytes each holder sends so far (sent); the holders of each
 * layer (build_holders), built when a first layer is missing. */
typedef struct {
    int64_t *sent;
    int *hoff, *hold;
    pl_layer_copy *flat;
    receiver *rcv;
    int nflat, cflat, nrcv, crcv;
} copy_lists;

/* Layer l, which a receiver lacks: from the best holders (best_sources), in parts when
 * it is large. */
static int plan_layer_copy(const ctx *c, copy_lists *cl, int l, const char **nm)
{
    if (!cl->hold && build_holders(c, &cl->hoff, &cl->hold))
        return -1;
    const int64_t bytes = PL_COPY_FACTOR * c->p->layers[l].param_bytes;
    int chosen[PL_COPY_MAX_PARTS];
    const int surviving = best_sources(c, cl->hold + cl->hoff[l], cl->hoff[l + 1] - cl->hoff[l],
                                       cl->sent, chosen);
    const int parts = copy_parts(bytes, surviving);
    if (cl->nflat + parts > cl->cflat) {
        cl->cflat = 2 * cl->cflat + parts + 64;
        pl_layer_copy *f = realloc(cl->flat, (size_t)cl->cflat * sizeof *f);
        if (!f)
            return -1;
        cl->flat = f;
    }
    for (int k = 0; k < parts; k++) {
        const int src = chosen[k];
        const int64_t part = bytes * (k + 1) / parts - bytes * k / parts;
        cl->sent[src] += part;
        cl->flat[cl->nflat++] = (pl_layer_copy){l, k, parts, nm[src], part};
    }
    return 0;
}

/* The layers of node j of template t that node u, placed there, lacks; u becomes a
 * receiver when it lacks any. */
static int plan_node_copies(const ctx *c, copy_lists *cl, const pl_template *t, int j, int u,
                            const char **nm)
{
    const int begin = cl->nflat;
    for (int s = 0; s < t->nstages; s++) {
        const pl_stage *st = &t->stages[s];
        if (st->node != j)
            continue;
        for (int l = st->layer_begin; l < st->layer_end; l++)
            if (!holds(c, u, l) && plan_layer_copy(c, cl, l, nm))
                return -1;
    }
    if (cl->nflat == begin)
        return 0;
    if (cl->nrcv == cl->crcv) {
        cl->crcv = cl->crcv ? 2 * cl->crcv : 16;
        receiver *rr = realloc(cl->rcv, (size_t)cl->crcv * sizeof *rr);
        if (!rr)
            return -1;
        cl->rcv = rr;
    }
    cl->rcv[cl->nrcv++] = (receiver){u, begin};
    return 0;
}

/* out->copies: a pl_node_copy for each receiver, with its copies and their bytes. */
static int write_copies(const copy_lists *cl, pl_reinstantiation *out, const char **nm)
{
    out->copies = calloc((size_t)(cl->nrcv ? cl->nrcv : 1), sizeof *out->copies);
    if (!out->copies)
        return -1;
    for (int i = 0; i < cl->nrcv; i++) {
        int end = i + 1 < cl->nrcv ? cl->rcv[i + 1].begin : cl->nflat, n = end - cl->rcv[i].begin;
        pl_node_copy *nc = &out->copies[i];
        nc->node = nm[cl->rcv[i].u];
        nc->layers = malloc((size_t)n * sizeof *nc->layers);
        if (!nc->layers)
            return -1;
        out->ncopies = i + 1;
        memcpy(nc->layers, cl->flat + cl->rcv[i].begin, (size_t)n * sizeof *nc->layers);
        nc->nlayers = n;
        for (int k = 0; k < n; k++)
            nc->bytes += nc->layers[k].bytes;
        out->bytes_to_copy += nc->bytes;
    }
    return 0;
}

/* Layer copies: each missing layer, or each part of a large one (pl_layer_copy), comes
 * from the surviving holder with the fewest bytes to send so far (ties by name), a part
 * from a holder no other part of the layer uses, so sending is spread out; from a
 * departing holder only when no surviving one has the layer (then whole). */
static int plan_copies(const ctx *c, pl_reinstantiation *out, const int *const *orders,
                       const int *gidx, const char **nm)
{
    copy_lists cl = {0};
    cl.sent = calloc((size_t)c->ncur + 1, sizeof *cl.sent);
    int rc = cl.sent ? 0 : -1;
    for (int x = 0; rc == 0 && x < out->npipelines; x++) {
        if (!c->g[gidx[x]].changed) /* holds all its layers already */
            continue;
        const pl_template *t = tmpl(c, c->g[gidx[x]].nodes.n);
        for (int j = 0; rc == 0 && j < t->nodes; j++)
            rc = plan_node_copies(c, &cl, t, j, orders[x][j], nm);
    }
    if (rc == 0)
        rc = write_copies(&cl, out, nm);
    free(cl.hoff);
    free(cl.hold);
    free(cl.sent);
    free(cl.flat);
    free(cl.rcv);
    return rc;
}

/* Every current pipeline has a template that fits the profile; counts the current nodes
 * (c->ncur) and their held ranges (*nranges: the templates' stages). */
static int count_current_nodes(ctx *c, const pl_current_plan *cur, int *nranges)
{
    int L = c->p->nlayers;
    c->ncur = 0;
    *nranges = 0;
    for (int q = 0; q < cur->npipelines; q++) {
        const pl_current_pipeline *cp = &cur->pipelines[q];
        const pl_template *t = tmpl(c, cp->nnodes);
        if (!t)
            return pl_errf(c->err, c->errlen, "pipelines[%d]: no pipeline template for %d nodes", q,
                           cp->nnodes);
        for (int s = 0; s < t->nstages; s++)
            if (t->stages[s].layer_begin < 0 || t->stages[s].layer_end > L ||
                t->stages[s].node < 0 || t->stages[s].node >= t->nodes)
                return pl_errf(c->err, c->errlen,
                               "templates: the template for %d nodes does not fit the "
                               "profile's %d layers",
                               cp->nnodes, L);
        c->ncur += cp->nnodes;
        *nranges += t->nstages;
    }
    return 0;
}

/* The node tables for the current nodes and nadded added ones, every node alive, and
 * the prefix sums pb. */
static int alloc_node_tables(ctx *c, int nadded, int nranges, name_index *ix)
{
    int L = c->p->nlayers;
    c->nall = c->ncur + nadded;
    c->name = malloc((size_t)c->nall * sizeof *c->name);
    c->alive = malloc((size_t)c->nall);
    c->sends = calloc((size_t)c->nall, 1);
    c->hr_off = calloc((size_t)c->ncur + 1, sizeof *c->hr_off);
    c->hr_lo = malloc((size_t)(nranges ? nranges : 1) * sizeof *c->hr_lo);
    c->hr_hi = malloc((size_t)(nranges ? nranges : 1) * sizeof *c->hr_hi);
    c->pb = malloc((size_t)(L + 1) * sizeof *c->pb);
    if (!c->name || !c->alive || !c->sends || !c->hr_off || !c->hr_lo || !c->hr_hi || !c->pb ||
        ni_init(ix, c->nall, c->name))
        return oom(c);
    memset(c->alive, 1, (size_t)c->nall);
    c->pb[0] = 0;
    for (int l = 0; l < L; l++)
        c->pb[l + 1] = c->pb[l] + c->p->layers[l].param_bytes;
    return 0;
}

/* The current nodes get ids 0 .. ncur − 1 in plan order; names are non-empty and unique. */
static int name_current_nodes(ctx *c, const pl_current_plan *cur, name_index *ix)
{
    for (int q = 0, u = 0; q < cur->npipelines; u += cur->pipelines[q++].nnodes) {
        const pl_current_pipeline *cp = &cur->pipelines[q];
        for (int j = 0; j < cp->nnodes; j++) {
            const char *s = cp->nodes[j];
            if (!s || !*s)
                return pl_errf(c->err, c->errlen,
                               "pipelines[%d].nodes[%d]: must be a non-empty name", q, j);
            c->name[u + j] = s;
            if (ni_find_or_add(ix, s, u + j) >= 0)
                return pl_errf(c->err, c->errlen,
                               "pipelines[%d].nodes[%d]: node \"%s\" appears twice", q, j, s);
        }
    }
    return 0;
}

/* The layers each current node held: its template stages (§4.1), counted per node, then
 * filled in. */
static int load_held_ranges(ctx *c, const pl_current_plan *cur)
{
    for (int q = 0, u = 0; q < cur->npipelines; u += cur->pipelines[q++].nnodes) {
        const pl_template *t = tmpl(c, cur->pipelines[q].nnodes);
        for (int s = 0; s < t->nstages; s++)
            c->hr_off[u + t->stages[s].node + 1]++;
    }
    for (int v = 0; v < c->ncur; v++)
        c->hr_off[v + 1] += c->hr_off[v];
    int *fill = malloc((size_t)(c->ncur ? c->ncur : 1) * sizeof *fill);
    if (!fill)
        return oom(c);
    memcpy(fill, c->hr_off, (size_t)c->ncur * sizeof *fill);
    for (int q = 0, u = 0; q < cur->npipelines; u += cur->pipelines[q++].nnodes) {
        const pl_template *t = tmpl(c, cur->pipelines[q].nnodes);
        for (int s = 0; s < t->nstages; s++) {
            int r = fill[u + t->stages[s].node]++;
            c->hr_lo[r] = t->stages[s].layer_begin;
            c->hr_hi[r] = t->stages[s].layer_end;
        }
    }
    free(fill);
    return 0;
}

/* The removed nodes, current ones listed once, are no longer alive. */
static int mark_removed(ctx *c, const char *const *removed, int nremoved, name_index *ix)
{
    for (int j = 0; j < nremoved; j++) {
        int v = removed[j] ? ni_find_or_add(ix, removed[j], -1) : -1;
        if (v < 0)
            return pl_errf(c->err, c->errlen, "removed[%d]: unknown node \"%s\"", j,
                           removed[j] ? removed[j] : "(null)");
        if (!c->alive[v])
            return pl_errf(c->err, c->errlen, "removed[%d]: node \"%s\" is listed twice", j,
                           removed[j]);
        c->alive[v] = 0;
    }
    return 0;
}

/* Who can send its layers: the live current nodes and the departing ones, which must
 * be removed nodes. */
static int mark_senders(ctx *c, const pl_current_plan *cur, name_index *ix)
{
    for (int j = 0; j < cur->ndeparting; j++) {
        int v = cur->departing[j] ? ni_find_or_add(ix, cur->departing[j], -1) : -1;
        if (v < 0 || c->alive[v])
            return pl_errf(c->err, c->errlen, "departing[%d]: \"%s\" is not a removed node", j,
                           cur->departing[j] ? cur->departing[j] : "(null)");
        c->sends[v] = 1;
    }
    for (int u = 0; u < c->ncur; u++)
        c->sends[u] |= c->alive[u];
    return 0;
}

/* The added nodes get ids ncur .. nall − 1; names are non-empty and new. */
static int name_added_nodes(ctx *c, const char *const *added, int nadded, name_index *ix)
{
    for (int j = 0; j < nadded; j++) {
        const char *s = added[j];
        if (!s || !*s)
            return pl_errf(c->err, c->errlen, "added[%d]: must be a non-empty name", j);
        c->name[c->ncur + j] = s;
        int v = ni_find_or_add(ix, s, c->ncur + j);
        if (v >= 0)
            return pl_errf(c->err, c->errlen, "added[%d]: node \"%s\" %s", j, s,
                           v < c->ncur ? "is already in the current plan" : "is listed twice");
    }
    return 0;
}

/* Checks the arguments and builds the node tables: names, liveness and the
 * layers each current node held (its template stages, §4.1). */
static int load_nodes(ctx *c, const pl_current_plan *cur, const char *const *removed,
                      int nremoved, const char *const *added, int nadded, name_index *ix)
{
    int nranges;
    if (count_current_nodes(c, cur, &nranges) || alloc_node_tables(c, nadded, nranges, ix) ||
        name_current_nodes(c, cur, ix) || load_held_ranges(c, cur) ||
        mark_removed(c, removed, nremoved, ix) || mark_senders(c, cur, ix))
        return -1;
    return name_added_nodes(c, added, nadded, ix);
}

/* The zones of the current and added nodes (cur->zoned, zone_of). */
static int load_zones(ctx *c, const pl_current_plan *cur, name_index *ix)
{
    if (cur->nzones < 0 || cur->nzoned < 0 || (cur->nzoned > 0 && (!cur->zoned || !cur->zone_of)))
        return pl_errf(c->err, c->errlen, "zoned: bad list (%d names, %d zones)", cur->nzoned,
                       cur->nzones);
    if (cur->nzones == 0)
        return 0;
    if (!(c->zone = malloc((size_t)c->nall * sizeof *c->zone)))
        return oom(c);
    memset(c->zone, 0xff, (size_t)c->nall * sizeof *c->zone);
    c->nzones = cur->nzones;
    for (int k = 0; k < cur->nzoned; k++) {
        if (cur->zone_of[k] < -1 || cur->zone_of[k] >= cur->nzones)
            return pl_errf(c->err, c->errlen, "zone_of[%d]: zone %d is not in -1 .. %d", k,
                           cur->zone_of[k], cur->nzones - 1);
        const int u = cur->zoned[k] ? ni_find_or_add(ix, cur->zoned[k], -1) : -1;
        if (u >= 0)
            c->zone[u] = cur->zone_of[k];
    }
    return 0;
}

/* First layer of each node of t (b[0 .. t->nodes)), then the end (b[t->nodes]). */
static void node_bounds(const pl_template *t, int *b)
{
    b[t->nodes] = t->stages[t->nstages - 1].layer_end;
    for (int s = t->nstages - 1; s >= 0; s--)
        b[t->stages[s].node] = t->stages[s].layer_begin;
}

/* The new plan's slots (zone_place.h): layers [lo, hi) and the node on each. */
typedef struct {
    const ctx *c;
    const int *lo, *hi, *item;
} zslots;

/* Bytes swapping the nodes of slots x and y adds to the copies (pl_zone_price). */
static int64_t swap_added(void *p, int x, int y)
{
    const zslots *z = p;
    const int u = z->item[x], v = z->item[y];
    return PL_COPY_FACTOR *
           (held_in(z->c, u, z->lo[x], z->hi[x]) + held_in(z->c, v, z->lo[y], z->hi[y]) -
            held_in(z->c, u, z->lo[y], z->hi[y]) - held_in(z->c, v, z->lo[x], z->hi[x]));
}

/* Swaps the placed nodes by zone (reinstantiate.h): orders[x] of pipeline gidx[x]; a
 * pipeline whose nodes change is marked changed. The budget, one replica: an exposed layer
 * is a zone's loss away from a restart from the checkpoint, which costs more than the copy
 * a pipeline of added nodes takes anyway. 0, or −1 out of memory. */
static int spread_zones(ctx *c, int np, const int *gidx, int **orders)
{
    int n = 0;
    for (int x = 0; c->zone && x < np; x++)
        n += c->g[gidx[x]].nodes.n;
    if (n < 2)
        return 0;
    int *buf = malloc((6 * (size_t)n + 2 * (size_t)np) * sizeof *buf);
    int **bounds = malloc((size_t)np * sizeof *bounds);
    if (!buf || !bounds) {
        free(buf);
        free(bounds);
        return -1;
    }
    int *lo = buf, *hi = lo + n, *item = hi + n, *zone = item + n, *all = zone + n;
    int *nnodes = all + n, *b = nnodes + np;
    for (int x = 0, k = 0; x < np; b += nnodes[x++] + 1) {
        nnodes[x] = c->g[gidx[x]].nodes.n;
        node_bounds(tmpl(c, nnodes[x]), b);
        bounds[x] = b;
        for (int j = 0; j < nnodes[x]; j++, k++) {
            lo[k] = b[j];
            hi[k] = b[j + 1];
            item[k] = orders[x][j];
            zone[k] = c->zone[item[k]];
            all[k] = k;
        }
    }
    const pl_zone_shape sh = {c->p->nlayers, np, nnodes, (const int *const *)bounds};
    zslots z = {c, lo, hi, item};
    const pl_zone_price price = {swap_added, &z, PL_COPY_FACTOR * c->pb[c->p->nlayers]};
    const int rc = pl_zone_improve(&sh, c->nzones, zone, item, all, n, &price);
    for (int x = 0, k = 0; !rc && x < np; x++)
        for (int j = 0; j < nnodes[x]; j++, k++) {
            c->g[gidx[x]].changed |= orders[x][j] != item[k];
            orders[x][j] = item[k];
        }
    free(buf);
    free(bounds);
    return rc;
}

/* finish's tables, an entry per pipeline of the result: the group it comes from, its
 * node ids by template position, its cost and its microbatches. */
typedef struct {
    int np;
    int *gidx;
    int **orders;
    pl_pipeline_cost *cost;
    int64_t *nb;
} placement;

/* One entry per live group, in group order; out->pipelines to match. */
static int placement_init(const ctx *c, placement *pl, pl_reinstantiation *out)
{
    for (int i = 0; i < c->ng; i++)
        pl->np += !c->g[i].gone;
    pl->gidx = malloc((size_t)pl->np * sizeof *pl->gidx);
    pl->orders = calloc((size_t)pl->np, sizeof *pl->orders);
    pl->cost = malloc((size_t)pl->np * sizeof *pl->cost);
    pl->nb = malloc((size_t)pl->np * sizeof *pl->nb);
    out->pipelines = calloc((size_t)pl->np, sizeof *out->pipelines);
    if (!pl->gidx || !pl->orders || !pl->cost || !pl->nb || !out->pipelines)
        return -1;
    for (int i = 0, x = 0; i < c->ng; i++)
        if (!c->g[i].gone)
            pl->gidx[x++] = i;
    return 0;
}

static void placement_free(placement *pl)
{
    for (int x = 0; pl->orders && x < pl->np; x++)
        free(pl->orders[x]);
    free(pl->orders);
    free(pl->gidx);
    free(pl->cost);
    free(pl->nb);
}

/* Each pipeline's nodes by position (a changed one's by assign_positions) and its cost. */
static int place_pipelines(const ctx *c, placement *pl, pl_reinstantiation *out)
{
    for (int x = 0; x < pl->np; x++) {
        const group *g = &c->g[pl->gidx[x]];
        const pl_template *t = tmpl(c, g->nodes.n);
        pl_reinst_pipeline *rp = &out->pipelines[x];
        pl->orders[x] = malloc((size_t)g->nodes.n * sizeof *pl->orders[x]);
        rp->nodes = malloc((size_t)g->nodes.n * sizeof *rp->nodes);
        if (!pl->orders[x] || !rp->nodes)
            return -1;
        out->npipelines = x + 1;
        /* An untouched pipeline keeps its positions: nothing to copy. */
        if (!g->changed)
            memcpy(pl->orders[x], g->nodes.v, (size_t)g->nodes.n * sizeof *pl->orders[x]);
        else if (assign_positions(c, g, t, pl->orders[x]))
            return -1;
        rp->template_nodes = g->nodes.n;
        pl->cost[x] = (pl_pipeline_cost){pl_template_time(t, 1), t->max_stage_ns};
    }
    return 0;
}

/* The pipelines' node names, their microbatches and times. */
static void write_pipelines(const ctx *c, placement *pl, int64_t microbatches, const char **nm,
                            pl_reinstantiation *out)
{
    for (int x = 0; x < pl->np; x++)
        for (int j = 0; j < out->pipelines[x].template_nodes; j++)
            out->pipelines[x].nodes[j] = nm[pl->orders[x][j]];
    /* §5.2: the global batch stays; it is redistributed over the new pipelines. */
    out->iteration_ns = pl_distribute_batch(pl->cost, pl->np, microbatches, pl->nb);
    for (int x = 0; x < pl->np; x++) {
        out->pipelines[x].microbatches = pl->nb[x];
        const pl_template *t = tmpl(c, out->pipelines[x].template_nodes);
        out->pipelines[x].iteration_ns = pl_template_time(t, pl->nb[x]);
    }
}

/* The live nodes no pipeline took: those left in the pool. */
static int list_idle(const ctx *c, const char **nm, pl_reinstantiation *out)
{
    out->nidle = pool_left(c);
    out->idle_nodes = malloc((size_t)(out->nidle ? out->nidle : 1) * sizeof *out->idle_nodes);
    if (!out->idle_nodes)
        return -1;
    for (int j = 0; j < out->nidle; j++)
        out->idle_nodes[j] = nm[c->pool.v[c->pool_head + j]];
    return 0;
}

/* Writes the pipelines, their batch, the copies and the idle nodes. */
static int finish(ctx *c, int64_t global_batch, const char **nm, pl_reinstantiation *out)
{
    const int64_t microbatches = global_batch / c->p->microbatch_size;
    placement pl = {0};
    int rc = placement_init(c, &pl, out) ? oom(c) : 0;
    if (rc == 0 && pl.np > microbatches)
        rc = pl_errf(c->err, c->errlen, "global_batch: %lld microbatches cannot feed %d pipelines",
                     (long long)microbatches, pl.np);
    if (rc == 0 && (place_pipelines(c, &pl, out) || spread_zones(c, pl.np, pl.gidx, pl.orders)))
        rc = oom(c);
    if (rc == 0) {
        write_pipelines(c, &pl, microbatches, nm, out);
        if (plan_copies(c, out, (const int *const *)pl.orders, pl.gidx, nm) ||
            list_idle(c, nm, out))
            rc = oom(c);
    }
    placement_free(&pl);
    return rc;
}

/* No plan (fatal loss or too few nodes): every live node waits. */
static int no_plan(ctx *c, const unsigned char *covered, const char **nm, pl_reinstantiation *out)
{
    int L = c->p->nlayers;
    out->lost_layers = malloc((size_t)(L ? L : 1) * sizeof *out->lost_layers);
    out->idle_nodes = malloc((size_t)(c->nall ? c->nall : 1) * sizeof *out->idle_nodes);
    if (!out->lost_layers || !out->idle_nodes)
        return oom(c);
    for (int l = 0; l < L; l++)
        if (!covered[l])
            out->lost_layers[out->nlost++] = l;
    for (int u = 0; u < c->nall; u++)
        if (c->alive[u])
            out->idle_nodes[out->nidle++] = nm[u];
    return 0;
}

/* The arguments besides the name lists and the batch. */
static int check_args(const pl_profile *p, const pl_template_set *ts, const pl_current_plan *cur,
                      int tolerate, char *err, size_t errlen)
{
    if (!p || !ts || !cur)
        return pl_errf(err, errlen,
                       "reinstantiate: profile, templates and current plan are required");
    if (tolerate < 0)
        return pl_errf(err, errlen, "tolerate: must be >= 0, got %d", tolerate);
    if (ts->n0 <= 0)
        return pl_errf(err, errlen, "templates: no feasible pipeline template");
    if (cur->npipelines <= 0)
        return pl_errf(err, errlen, "pipelines: the current plan has no pipelines");
    return 0;
}

/* The removed, added and departing names: a count and, when it is not 0, a list. */
static int check_lists(const pl_current_plan *cur, const char *const *removed, int nremoved,
                       const char *const *added, int nadded, char *err, size_t errlen)
{
    if (nremoved < 0 || (nremoved > 0 && !removed))
        return pl_errf(err, errlen, "removed: bad list");
    if (nadded < 0 || (nadded > 0 && !added))
        return pl_errf(err, errlen, "added: bad list");
    if (cur->ndeparting < 0 || (cur->ndeparting > 0 && !cur->departing))
        return pl_errf(err, errlen, "departing: bad list");
    return 0;
}

/* Marks the layers some node that can send holds (covered[l]); returns the live node
 * count. */
static int cover_layers(const ctx *c, unsigned char *covered)
{
    int live = c->nall - c->ncur;
    for (int u = 0; u < c->ncur; u++) {
        live += c->alive[u];
        if (!c->sends[u])
            continue;
        for (int r = c->hr_off[u]; r < c->hr_off[u + 1]; r++)
            memset(covered + c->hr_lo[r], 1, (size_t)(c->hr_hi[r] - c->hr_lo[r]));
    }
    return live;
}

/* A group for each current pipeline with its live nodes (changed when it lost some);
 * the added nodes are the pool. */
static int load_groups(ctx *c, const pl_current_plan *cur)
{
    for (int q = 0, u = 0; q < cur->npipelines; q++) {
        int k = cur->pipelines[q].nnodes, gi = new_group(c, q, k);
        if (gi < 0)
            return oom(c);
        for (int j = 0; j < k; j++, u++)
            if (c->alive[u] && ivec_push(&c->g[gi].nodes, u))
                return oom(c);
        c->g[gi].changed = c->g[gi].nodes.n < k;
    }
    for (int u = c->ncur; u < c->nall; u++)
        if (ivec_push(&c->pool, u))
            return oom(c);
    return 0;
}

/* The new plan: §5.1's rules, a replan where they fail or added nodes are left, then
 * the result written. */
static int rebuild(ctx *c, const pl_current_plan *cur, int64_t global_batch, const char **nm,
                   pl_reinstantiation *out)
{
    if (load_groups(c, cur))
        return -1;
    int ok = handle_failures(c);
    if (ok < 0)
        return -1;
    if ((!ok || pool_left(c) > 0) && replan(c, global_batch))
        return -1;
    return finish(c, global_batch, nm, out);
}

/* §5: recovery needs a copy of every layer that can be sent (a survivor's or a
 * departing node's) and (f+1)·n0 nodes; without them there is no plan. */
static int recover(ctx *c, const pl_current_plan *cur, int64_t global_batch, const char **nm,
                   pl_reinstantiation *out)
{
    int L = c->p->nlayers;
    unsigned char *covered = calloc((size_t)(L ? L : 1), 1);
    if (!covered)
        return oom(c);
    int live = cover_layers(c, covered);
    for (int l = 0; l < L; l++)
        out->fatal |= !covered[l];
    out->insufficient_nodes = live < (c->tolerate + 1) * c->ts->n0;
    int rc = out->fatal || out->insufficient_nodes ? no_plan(c, covered, nm, out)
                                                   : rebuild(c, cur, global_batch, nm, out);
    free(covered);
    return rc;
}

int pl_reinstantiate(const pl_profile *p, const pl_template_set *ts, const pl_coverage *cov,
                     int tolerate, int64_t global_batch, const pl_current_plan *cur,
                     const char *const *removed, int nremoved, const char *const *added,
                     int nadded, pl_reinstantiation *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (check_args(p, ts, cur, tolerate, err, errlen) ||
        check_lists(cur, removed, nremoved, added, nadded, err, errlen) ||
        pl_batch_check(global_batch, p->microbatch_size, tolerate, err, errlen))
        return -1;

    ctx c = {.p = p, .ts = ts, .cov = cov, .tolerate = tolerate, .err = err, .errlen = errlen};
    name_index ix = {0};
    const char **nm = NULL;
    int rc = -1;
    if (load_nodes(&c, cur, removed, nremoved, added, nadded, &ix) || load_zones(&c, cur, &ix))
        goto done;
    if (!(nm = copy_names(&c, out))) {
        oom(&c);
        goto done;
    }
    rc = recover(&c, cur, global_batch, nm, out);
done:
    out->steps = c.steps;
    out->nsteps = c.nsteps;
    for (int i = 0; i < c.ng; i++)
        free(c.g[i].nodes.v);
    free(c.g);
    free(c.pool.v);
    free(c.name);
    free(c.alive);
    free(c.sends);
    free(c.hr_off);
    free(c.hr_lo);
    free(c.hr_hi);
    free(c.pb);
    free(c.zone);
    free(ix.slot);
    free(nm);
    if (rc)
        pl_reinstantiation_free(out);
    return rc;
}

/* ---- JSON ---- */

static cJSON *string_array(const char *const *s, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *x = cJSON_CreateString(s[i]);
        if (!x || !cJSON_AddItemToArray(a, x)) {
            cJSON_Delete(x);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

/* Adds item to object (or array when key is NULL); false when item is NULL. */
static int put(cJSON *to, const char *key, cJSON *item)
{
    if (!item)
        return 0;
    if (key ? cJSON_AddItemToObject(to, key, item) : cJSON_AddItemToArray(to, item))
        return 1;
    cJSON_Delete(item);
    return 0;
}

cJSON *pl_reinstantiation_to_json(const pl_reinstantiation *r)
{
    /* put() attaches each item as soon as it exists, so deleting o frees all. */
    cJSON *o = cJSON_CreateObject(), *pipes = NULL, *copies = NULL, *lost = NULL;
    int ok = o && put(o, "pipelines", pipes = cJSON_CreateArray());
    for (int i = 0; ok && i < r->npipelines; i++) {
        const pl_reinst_pipeline *rp = &r->pipelines[i];
        cJSON *x = NULL;
        ok = put(pipes, NULL, x = cJSON_CreateObject()) &&
             put(x, "nodes", string_array(rp->nodes, rp->template_nodes)) &&
             put(x, "template_nodes", cJSON_CreateNumber(rp->template_nodes)) &&
             put(x, "microbatches", cJSON_CreateNumber((double)rp->microbatches)) &&
             put(x, "iteration_ms", cJSON_CreateNumber((double)rp->iteration_ns / 1e6));
    }
    ok = ok && put(o, "iteration_ms", cJSON_CreateNumber((double)r->iteration_ns / 1e6)) &&
         put(o, "copies", copies = cJSON_CreateArray());
    for (int i = 0; ok && i < r->ncopies; i++) {
        const pl_node_copy *nc = &r->copies[i];
        cJSON *x = NULL, *layers = NULL;
        ok = put(copies, NULL, x = cJSON_CreateObject()) &&
             put(x, "node", cJSON_CreateString(nc->node)) &&
             put(x, "layers", layers = cJSON_CreateArray());
        for (int k = 0; ok && k < nc->nlayers; k++) {
            cJSON *y = NULL;
            ok = put(layers, NULL, y = cJSON_CreateObject()) &&
                 put(y, "layer", cJSON_CreateNumber(nc->layers[k].layer)) &&
                 (nc->layers[k].parts == 1 ||
                  (put(y, "part", cJSON_CreateNumber(nc->layers[k].part)) &&
                   put(y, "parts", cJSON_CreateNumber(nc->layers[k].parts)))) &&
                 put(y, "source", cJSON_CreateString(nc->layers[k].source)) &&
                 put(y, "bytes", cJSON_CreateNumber((double)nc->layers[k].bytes));
        }
        ok = ok && put(x, "bytes", cJSON_CreateNumber((double)nc->bytes));
    }
    ok = ok && put(o, "bytes_to_copy", cJSON_CreateNumber((double)r->bytes_to_copy)) &&
         put(o, "idle_nodes", string_array(r->idle_nodes, r->nidle)) &&
         put(o, "fatal", cJSON_CreateBool(r->fatal)) &&
         put(o, "lost_layers", lost = cJSON_CreateArray());
    for (int i = 0; ok && i < r->nlost; i++)
        ok = put(lost, NULL, cJSON_CreateNumber(r->lost_layers[i]));
    ok = ok && put(o, "insufficient_nodes", cJSON_CreateBool(r->insufficient_nodes)) &&
         put(o, "steps", string_array((const char *const *)r->steps, r->nsteps));
    if (ok)
        return o;
    cJSON_Delete(o);
    return NULL;
}
