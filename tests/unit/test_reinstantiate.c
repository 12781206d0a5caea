/* Pipeline re-instantiation (Oobleck §5.1): every single and double failure of
 * 4-pipeline examples, the Figure 8 cases, fatal loss, too few nodes, added
 * nodes, idle nodes, JSON and input errors. */
#include <stdlib.h>

#include "check.h"
#include "coverage.h"
#include "reinstantiate.h"
#include "zone_place.h"

#define MAXN 32

/* A profile, its templates and a current plan named n0, n1, ... in order. */
typedef struct {
    pl_profile p;
    pl_template_set ts;
    pl_current_plan cur;
    int tolerate;
    int64_t global_batch;
    int nnodes;
    char *names[MAXN];
} fixture;

/* L layers with distinct sizes. gpu_memory is chosen so that one node cannot
 * hold the model but two can (n0 = 2), unless single_layer_nodes: then every
 * node holds exactly one layer (n0 = L). */
static void make_profile(pl_profile *p, int L, int M, int single_layer_nodes)
{
    memset(p, 0, sizeof *p);
    strcpy(p->model, "synthetic");
    p->microbatch_size = 1;
    p->gpus_per_node = M;
    p->intra_node_GBps = 100;
    p->inter_node_GBps = 10;
    p->nkeys = M == 1 ? 1 : 2;
    p->keys[0] = 1;
    p->keys[1] = M;
    p->nlayers = L;
    p->layers = calloc((size_t)L, sizeof *p->layers);
    int64_t total = 0;
    for (int l = 0; l < L; l++) {
        pl_layer_profile *y = &p->layers[l];
        snprintf(y->name, sizeof y->name, "layer%d", l);
        y->param_bytes = single_layer_nodes ? 1000 + 100 * l : 1000 * (l + 1);
        y->output_bytes = 4096;
        for (int k = 0; k < p->nkeys; k++) {
            y->fwd_ns[k] = (100000 + 7919 * l) / p->keys[k];
            y->bwd_ns[k] = 2 * y->fwd_ns[k];
        }
        total += y->param_bytes;
    }
    /* memory need of a stage is 4 × its param bytes (no activations here) */
    if (single_layer_nodes)
        p->gpu_memory_bytes = 4 * (p->layers[L - 1].param_bytes + 50);
    else if (M == 1)
        p->gpu_memory_bytes = 4 * total * 6 / 10;
    else
        p->gpu_memory_bytes = 4 * total * 35 / 100;
}

/* sizes: pipeline sizes of the current plan; nodes = N given to the planner. */
static int fixture_init(fixture *f, int L, int M, int single, int nodes, int tolerate,
                        const int *sizes, int npipes)
{
    char err[256];
    memset(f, 0, sizeof *f);
    make_profile(&f->p, L, M, single);
    f->tolerate = tolerate;
    f->global_batch = 16;
    if (pl_templates_plan(&f->p, nodes, tolerate, &f->ts, err, sizeof err)) {
        printf("    templates: %s\n", err);
        return -1;
    }
    f->cur.npipelines = npipes;
    f->cur.pipelines = calloc((size_t)npipes, sizeof *f->cur.pipelines);
    for (int q = 0; q < npipes; q++) {
        f->cur.pipelines[q].nnodes = sizes[q];
        f->cur.pipelines[q].nodes = calloc((size_t)sizes[q], sizeof(char *));
        for (int j = 0; j < sizes[q]; j++) {
            char buf[16];
            snprintf(buf, sizeof buf, "n%d", f->nnodes);
            f->cur.pipelines[q].nodes[j] = strdup(buf);
            f->names[f->nnodes++] = f->cur.pipelines[q].nodes[j];
        }
    }
    return 0;
}

static void fixture_free(fixture *f)
{
    pl_current_plan_free(&f->cur);
    pl_template_set_free(&f->ts);
    free(f->p.layers);
}

static int node_index(const fixture *f, const char *name)
{
    for (int i = 0; i < f->nnodes; i++)
        if (strcmp(f->names[i], name) == 0)
            return i;
    return -1;
}

/* Did current node i hold layer l? (node j of pipeline q holds its template's stages) */
static int held_before(const fixture *f, int i, int l)
{
    for (int q = 0, base = 0; q < f->cur.npipelines; base += f->cur.pipelines[q++].nnodes) {
        int k = f->cur.pipelines[q].nnodes;
        if (i >= base + k)
            continue;
        const pl_template *t = pl_template_for(&f->ts, k);
        for (int s = 0; s < t->nstages; s++)
            if (t->stages[s].node == i - base && t->stages[s].layer_begin <= l &&
                l < t->stages[s].layer_end)
                return 1;
        return 0;
    }
    return 0;
}

static int needs(const pl_template *t, int pos, int l)
{
    for (int s = 0; s < t->nstages; s++)
        if (t->stages[s].node == pos && t->stages[s].layer_begin <= l && l < t->stages[s].layer_end)
            return 1;
    return 0;
}

static int is_in(const char *const *list, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(list[i], name) == 0)
            return 1;
    return 0;
}

/* Bytes a pipeline must copy when names[pos] runs template position pos. */
static int64_t pipeline_copy_bytes(const fixture *f, const pl_template *t, const int *who)
{
    int64_t b = 0;
    for (int pos = 0; pos < t->nodes; pos++)
        for (int l = 0; l < f->p.nlayers; l++)
            if (needs(t, pos, l) && (who[pos] < 0 || !held_before(f, who[pos], l)))
                b += 3 * f->p.layers[l].param_bytes;
    return b;
}

/* Smallest copy bytes over every order of the pipeline's nodes (k ≤ 7). */
static int64_t best_copy_bytes(const fixture *f, const pl_template *t, int *who, int k)
{
    if (k <= 1)
        return pipeline_copy_bytes(f, t, who);
    int64_t best = INT64_MAX;
    for (int i = 0; i < k; i++) {
        int tmp = who[i];
        who[i] = who[k - 1];
        who[k - 1] = tmp;
        int64_t b = best_copy_bytes(f, t, who, k - 1);
        if (b < best)
            best = b;
        who[k - 1] = who[i];
        who[i] = tmp;
    }
    return best;
}

/* Every invariant of a result after removing `removed` and adding `added`. */
static void check_result(const fixture *f, const char *const *removed, int nremoved,
                         const char *const *added, int nadded, const pl_reinstantiation *r)
{
    int L = f->p.nlayers, F = f->tolerate, live = f->nnodes - nremoved + nadded;
    int lost = 0;
    for (int l = 0; l < L; l++) {
        int held = 0;
        for (int i = 0; i < f->nnodes; i++)
            held |= !is_in(removed, nremoved, f->names[i]) && held_before(f, i, l);
        lost += !held;
    }
    CHECK_EQ_INT(r->fatal, lost > 0);
    CHECK_EQ_INT(r->nlost, lost);
    CHECK_EQ_INT(r->insufficient_nodes, live < (F + 1) * f->ts.n0);
    if (r->fatal || r->insufficient_nodes) {
        CHECK_EQ_INT(r->npipelines, 0);
        CHECK_EQ_INT(r->nidle, live);
        return;
    }
    CHECK(r->npipelines >= F + 1);

    /* every live node exactly once, in a pipeline or idle */
    int seen = 0;
    int64_t mb = 0;
    for (int x = 0; x < r->npipelines; x++) {
        const pl_reinst_pipeline *rp = &r->pipelines[x];
        const pl_template *t = pl_template_for(&f->ts, rp->template_nodes);
        CHECK(t != NULL);
        CHECK(rp->microbatches >= 1);
        CHECK_EQ_INT(rp->iteration_ns, pl_template_time(t, rp->microbatches));
        CHECK(rp->iteration_ns <= r->iteration_ns);
        mb += rp->microbatches;
        for (int j = 0; j < rp->template_nodes; j++) {
            const char *n = rp->nodes[j];
            CHECK(!is_in(removed, nremoved, n));
            CHECK(node_index(f, n) >= 0 || is_in(added, nadded, n));
            for (int y = 0; y <= x; y++)
                for (int k = 0; k < (y < x ? r->pipelines[y].template_nodes : j); k++)
                    CHECK(strcmp(r->pipelines[y].nodes[k], n) != 0);
            seen++;
        }
    }
    CHECK_EQ_INT(mb, f->global_batch / f->p.microbatch_size);
    for (int i = 0; i < r->nidle; i++)
        CHECK(!is_in(removed, nremoved, r->idle_nodes[i]));
    CHECK_EQ_INT(seen + r->nidle, live);
    if (nadded == 0 && pl_template_for(&f->ts, 2 * f->ts.n0 - 1))
        CHECK_EQ_INT(r->nidle, 0); /* failures alone, appendix B holds: every survivor is used */

    /* copies: only missing layers, only from live holders; each node then holds its stages */
    int64_t total = 0;
    for (int c = 0; c < r->ncopies; c++) {
        const pl_node_copy *nc = &r->copies[c];
        int64_t b = 0;
        CHECK(nc->nlayers > 0);
        for (int d = 0; d < c; d++)
            CHECK(strcmp(r->copies[d].node, nc->node) != 0);
        for (int k = 0; k < nc->nlayers; k++) {
            const pl_layer_copy *lc = &nc->layers[k];
            int src = node_index(f, lc->source);
            CHECK(src >= 0);
            CHECK(!is_in(removed, nremoved, lc->source));
            CHECK(held_before(f, src, lc->layer));
            /* part k of n: its share of the layer's bytes, parts in order, each from a
             * holder of its own */
            const int64_t all = 3 * f->p.layers[lc->layer].param_bytes;
            CHECK(lc->parts >= 1 && lc->parts <= PL_COPY_MAX_PARTS);
            CHECK(lc->part >= 0 && lc->part < lc->parts);
            CHECK_EQ_INT(lc->bytes, all * (lc->part + 1) / lc->parts - all * lc->part / lc->parts);
            CHECK(lc->parts == 1 || all / lc->parts >= PL_COPY_PART_MIN_BYTES);
            if (lc->part > 0) {
                CHECK(k > 0 && nc->layers[k - 1].layer == lc->layer &&
                      nc->layers[k - 1].part == lc->part - 1 &&
                      nc->layers[k - 1].parts == lc->parts);
                for (int y = k - lc->part; y < k; y++)
                    CHECK(strcmp(nc->layers[y].source, lc->source) != 0);
            } else if (k > 0) {
                CHECK(lc->layer > nc->layers[k - 1].layer);
                CHECK(nc->layers[k - 1].part == nc->layers[k - 1].parts - 1);
            }
            if (k == nc->nlayers - 1)
                CHECK(lc->part == lc->parts - 1);
            b += lc->bytes;
        }
        CHECK_EQ_INT(nc->bytes, b);
        total += b;
    }
    CHECK_EQ_INT(r->bytes_to_copy, total);
    for (int x = 0; x < r->npipelines; x++) {
        const pl_reinst_pipeline *rp = &r->pipelines[x];
        const pl_template *t = pl_template_for(&f->ts, rp->template_nodes);
        int who[MAXN];
        for (int j = 0; j < rp->template_nodes; j++) {
            const char *n = rp->nodes[j];
            int i = node_index(f, n);
            who[j] = i;
            const pl_node_copy *nc = NULL;
            for (int c = 0; c < r->ncopies; c++)
                if (strcmp(r->copies[c].node, n) == 0)
                    nc = &r->copies[c];
            for (int l = 0; l < L; l++) {
                int had = i >= 0 && held_before(f, i, l), got = 0;
                for (int k = 0; nc && k < nc->nlayers; k++)
                    got |= nc->layers[k].layer == l;
                CHECK(!(had && got));
                CHECK(!got || needs(t, j, l));
                CHECK(!needs(t, j, l) || had || got);
            }
        }
        /* the node order is an optimal mapping */
        if (rp->template_nodes <= 7) {
            int64_t mine = pipeline_copy_bytes(f, t, who);
            CHECK_EQ_INT(mine, best_copy_bytes(f, t, who, rp->template_nodes));
        }
    }
}

static int has_step(const pl_reinstantiation *r, const char *prefix)
{
    for (int i = 0; i < r->nsteps; i++)
        if (strncmp(r->steps[i], prefix, strlen(prefix)) == 0)
            return 1;
    return 0;
}

static int run_case(const fixture *f, const char *const *removed, int nremoved,
                    const char *const *added, int nadded, pl_reinstantiation *r)
{
    char err[256] = "";
    int rc = pl_reinstantiate(&f->p, &f->ts, NULL, f->tolerate, f->global_batch, &f->cur, removed,
                              nremoved, added, nadded, r, err, sizeof err);
    if (rc) {
        printf("    pl_reinstantiate: %s\n", err);
        return rc;
    }
    /* the same with the precomputed coverage table: identical result */
    pl_coverage cov;
    int nodes = f->ts.n_max + f->tolerate * f->ts.n0;
    if (pl_coverage_compute(&f->ts, nodes, f->tolerate, f->global_batch, f->p.microbatch_size,
                            &cov, err, sizeof err)) {
        printf("    pl_coverage_compute: %s\n", err);
        return -1;
    }
    pl_reinstantiation r2;
    rc = pl_reinstantiate(&f->p, &f->ts, &cov, f->tolerate, f->global_batch, &f->cur, removed,
                          nremoved, added, nadded, &r2, err, sizeof err);
    pl_coverage_free(&cov);
    if (rc) {
        printf("    pl_reinstantiate with coverage: %s\n", err);
        return rc;
    }
    cJSON *a = pl_reinstantiation_to_json(r), *b = pl_reinstantiation_to_json(&r2);
    char *ta = cJSON_PrintUnformatted(a), *tb = cJSON_PrintUnformatted(b);
    if (strcmp(ta, tb)) {
        printf("    with and without the coverage table differ:\n    %s\n    %s\n", ta, tb);
        rc = -1;
    }
    free(ta);
    free(tb);
    cJSON_Delete(a);
    cJSON_Delete(b);
    pl_reinstantiation_free(&r2);
    return rc;
}

/* Runs every single and double failure; counts which steps appeared. */
static void all_failures(const fixture *f, int *simple, int *borrow, int *merge, int *fatal,
                         int *insufficient)
{
    for (int a = 0; a < f->nnodes; a++)
        for (int b = a; b < f->nnodes; b++) {
            const char *removed[2] = {f->names[a], f->names[b]};
            int nr = a == b ? 1 : 2;
            pl_reinstantiation r;
            /* with nodes joining at the same time too */
            const char *added[] = {"new0", "new1", "new2"};
            for (int na = 1; na <= 3; na++) {
                CHECK(run_case(f, removed, nr, added, na, &r) == 0);
                check_result(f, removed, nr, added, na, &r);
                pl_reinstantiation_free(&r);
            }
            CHECK(run_case(f, removed, nr, NULL, 0, &r) == 0);
            check_result(f, removed, nr, NULL, 0, &r);
            *simple += has_step(&r, "simple:");
            *borrow += has_step(&r, "borrow:");
            *merge += has_step(&r, "merge:");
            *fatal += r.fatal;
            *insufficient += r.insufficient_nodes;
            pl_reinstantiation_free(&r);
            if (check_failed_) {
                printf("    removed %s %s\n", removed[0], nr > 1 ? removed[1] : "");
                return;
            }
        }
}

static void test_every_failure_mixed_sizes(void)
{
    fixture f;
    const int sizes[] = {3, 3, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 10, 1, sizes, 4) == 0);
    CHECK_EQ_INT(f.ts.n0, 2);
    int s = 0, b = 0, m = 0, fa = 0, in = 0;
    all_failures(&f, &s, &b, &m, &fa, &in);
    fixture_free(&f);
    CHECK(!check_failed_);
    CHECK(s > 0 && b > 0);
    CHECK_EQ_INT(fa, 0);
    CHECK_EQ_INT(in, 0);
}

static void test_every_failure_smallest_pipelines(void)
{
    fixture f;
    const int sizes[] = {2, 2, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 8, 1, sizes, 4) == 0);
    int s = 0, b = 0, m = 0, fa = 0, in = 0;
    all_failures(&f, &s, &b, &m, &fa, &in);
    fixture_free(&f);
    CHECK(!check_failed_);
    CHECK(m > 0);
    CHECK_EQ_INT(b, 0); /* nobody can yield a node */
}

static void test_every_failure_tolerate_two(void)
{
    fixture f;
    const int sizes[] = {2, 2, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 8, 2, sizes, 4) == 0);
    int s = 0, b = 0, m = 0, fa = 0, in = 0;
    all_failures(&f, &s, &b, &m, &fa, &in);
    fixture_free(&f);
    CHECK(!check_failed_);
    CHECK(m > 0);
}

static void test_every_failure_two_gpus_per_node(void)
{
    fixture f;
    const int sizes[] = {3, 3, 2, 2};
    CHECK(fixture_init(&f, 8, 2, 0, 10, 1, sizes, 4) == 0);
    CHECK_EQ_INT(f.ts.n0, 2);
    int s = 0, b = 0, m = 0, fa = 0, in = 0;
    all_failures(&f, &s, &b, &m, &fa, &in);
    fixture_free(&f);
    CHECK(!check_failed_);
    CHECK(s > 0 && b > 0);
}

/* Figure 8a: a 3-node pipeline loses a node and runs the 2-node template. */
static void test_simple(void)
{
    fixture f;
    const int sizes[] = {3, 3, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 10, 1, sizes, 4) == 0);
    const char *removed[] = {"n1"};
    pl_reinstantiation r;
    CHECK(run_case(&f, removed, 1, NULL, 0, &r) == 0);
    check_result(&f, removed, 1, NULL, 0, &r);
    CHECK_EQ_INT(r.nsteps, 1);
    CHECK_STR_CONTAINS(r.steps[0], "simple: pipeline 0 (3 -> 2 nodes)");
    CHECK_EQ_INT(r.npipelines, 4);
    CHECK_EQ_INT(r.pipelines[0].template_nodes, 2);
    /* untouched pipelines keep their nodes in order and copy nothing */
    CHECK(strcmp(r.pipelines[1].nodes[0], "n3") == 0);
    CHECK(strcmp(r.pipelines[1].nodes[2], "n5") == 0);
    for (int c = 0; c < r.ncopies; c++)
        CHECK(strcmp(r.copies[c].node, "n0") == 0 || strcmp(r.copies[c].node, "n2") == 0);
    pl_reinstantiation_free(&r);
    fixture_free(&f);
}

/* Figure 8b: a 2-node pipeline loses a node and borrows one from a 3-node one. */
static void test_borrow(void)
{
    fixture f;
    const int sizes[] = {3, 3, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 10, 1, sizes, 4) == 0);
    const char *removed[] = {"n7"};
    pl_reinstantiation r;
    CHECK(run_case(&f, removed, 1, NULL, 0, &r) == 0);
    check_result(&f, removed, 1, NULL, 0, &r);
    CHECK_EQ_INT(r.nsteps, 1);
    CHECK_STR_CONTAINS(r.steps[0], "borrow: pipeline 2 (1 -> 2 nodes) borrows ");
    CHECK_STR_CONTAINS(r.steps[0], " from pipeline 0 (3 -> 2 nodes)");
    CHECK_EQ_INT(r.npipelines, 4);
    CHECK_EQ_INT(r.pipelines[0].template_nodes, 2);
    CHECK_EQ_INT(r.pipelines[2].template_nodes, 2);
    CHECK(is_in(r.pipelines[2].nodes, 2, "n6"));
    pl_reinstantiation_free(&r);
    fixture_free(&f);
}

/* Figure 8c: no pipeline can yield, so the damaged one is merged. */
static void test_merge(void)
{
    fixture f;
    const int sizes[] = {2, 2, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 8, 1, sizes, 4) == 0);
    const char *removed[] = {"n3"};
    pl_reinstantiation r;
    CHECK(run_case(&f, removed, 1, NULL, 0, &r) == 0);
    check_result(&f, removed, 1, NULL, 0, &r);
    CHECK_EQ_INT(r.nsteps, 1);
    CHECK_STR_CONTAINS(r.steps[0], "merge: pipelines 0 and 1 (2 + 1 -> 3 nodes)");
    CHECK_EQ_INT(r.npipelines, 3);
    CHECK_EQ_INT(r.pipelines[0].template_nodes, 3);
    pl_reinstantiation_free(&r);
    fixture_free(&f);
}

/* Losing both pipelines' holders of layer 0 (every node 0) loses that layer. */
static void test_fatal(void)
{
    fixture f;
    const int sizes[] = {3, 3, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 10, 1, sizes, 4) == 0);
    const char *removed[] = {"n0", "n3", "n6", "n8"};
    pl_reinstantiation r;
    CHECK(run_case(&f, removed, 4, NULL, 0, &r) == 0);
    check_result(&f, removed, 4, NULL, 0, &r);
    CHECK(r.fatal);
    CHECK(r.nlost >= 1 && r.lost_layers[0] == 0);
    CHECK_EQ_INT(r.npipelines, 0);
    cJSON *j = pl_reinstantiation_to_json(&r);
    CHECK(j != NULL);
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "fatal")));
    CHECK_EQ_INT(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "lost_layers"), 0)->valueint, 0);
    cJSON_Delete(j);
    pl_reinstantiation_free(&r);
    fixture_free(&f);
}

/* The same losses, two of the nodes under a preemption notice (departing): they hold
 * layer 0 still, so the loss is not fatal; a layer comes from a departing node only when
 * no survivor holds it, and no departing node gets a place. */
static void test_departing_sources(void)
{
    fixture f;
    const int sizes[] = {3, 3, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 10, 1, sizes, 4) == 0);
    const char *removed[] = {"n0", "n3", "n6", "n8"};
    const char *departing[] = {"n0", "n3"};
    f.cur.departing = departing;
    f.cur.ndeparting = 2;
    pl_reinstantiation r;
    CHECK(run_case(&f, removed, 4, NULL, 0, &r) == 0);
    CHECK(!r.fatal && r.npipelines > 0);
    int from_departing = 0;
    for (int k = 0; k < r.ncopies; k++)
        for (int j = 0; j < r.copies[k].nlayers; j++) {
            const pl_layer_copy *x = &r.copies[k].layers[j];
            const int dep = !strcmp(x->source, "n0") || !strcmp(x->source, "n3");
            from_departing += dep;
            for (int i = 0; dep && i < f.nnodes; i++)
                if (i != 0 && i != 3 && i != 6 && i != 8)
                    CHECK(!held_before(&f, i, x->layer));
        }
    CHECK(from_departing > 0);
    for (int q = 0; q < r.npipelines; q++)
        for (int j = 0; j < r.pipelines[q].template_nodes; j++)
            for (int k = 0; k < 4; k++)
                CHECK(strcmp(r.pipelines[q].nodes[j], removed[k]) != 0);
    pl_reinstantiation_free(&r);
    /* a departing node must be one of the removed */
    const char *kept[] = {"n1"};
    f.cur.departing = kept;
    f.cur.ndeparting = 1;
    char err[256];
    CHECK(pl_reinstantiate(&f.p, &f.ts, NULL, f.tolerate, f.global_batch, &f.cur, removed, 4, NULL,
                           0, &r, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "departing[0]");
    f.cur.departing = NULL;
    f.cur.ndeparting = 0;
    fixture_free(&f);
}

/* F = 2 needs 3·n0 = 6 nodes; three failures leave 5. */
static void test_insufficient(void)
{
    fixture f;
    const int sizes[] = {2, 2, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 8, 2, sizes, 4) == 0);
    const char *removed[] = {"n0", "n2", "n4"};
    pl_reinstantiation r;
    CHECK(run_case(&f, removed, 3, NULL, 0, &r) == 0);
    check_result(&f, removed, 3, NULL, 0, &r);
    CHECK(r.insufficient_nodes);
    CHECK(!r.fatal);
    CHECK_EQ_INT(r.nidle, 5);
    pl_reinstantiation_free(&r);
    fixture_free(&f);
}

/* A wiped-out pipeline is dropped when f+1 pipelines remain, rebuilt by
 * borrowing when they would not. */
static void test_wiped_out_pipeline(void)
{
    fixture f;
    const int sizes[] = {4, 4};
    CHECK(fixture_init(&f, 8, 1, 0, 8, 1, sizes, 2) == 0);
    const char *removed[] = {"n4", "n5", "n6", "n7"};
    pl_reinstantiation r;
    CHECK(run_case(&f, removed, 4, NULL, 0, &r) == 0);
    check_result(&f, removed, 4, NULL, 0, &r);
    CHECK_EQ_INT(r.npipelines, 2);
    CHECK_STR_CONTAINS(r.steps[0], "borrow: pipeline 1 (0 -> 1 nodes)");
    pl_reinstantiation_free(&r);
    fixture_free(&f);
}

/* One node leaves and one joins: the new node takes its place, the template
 * stays and nothing else changes. */
static void test_replace_with_added(void)
{
    fixture f;
    const int sizes[] = {3, 3, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 10, 1, sizes, 4) == 0);
    const char *removed[] = {"n9"}, *added[] = {"fresh"};
    pl_reinstantiation r;
    CHECK(run_case(&f, removed, 1, added, 1, &r) == 0);
    check_result(&f, removed, 1, added, 1, &r);
    CHECK_EQ_INT(r.nsteps, 1);
    CHECK_STR_CONTAINS(r.steps[0], "replace: pipeline 3 (1 -> 2 nodes) takes added node fresh");
    CHECK(strcmp(r.pipelines[3].nodes[0], "n8") == 0);
    CHECK(strcmp(r.pipelines[3].nodes[1], "fresh") == 0);
    CHECK_EQ_INT(r.ncopies, 1);
    CHECK(strcmp(r.copies[0].node, "fresh") == 0);
    pl_reinstantiation_free(&r);

    /* a wiped-out pipeline is rebuilt from added nodes rather than dropped */
    const char *gone[] = {"n6", "n7"}, *two[] = {"x0", "x1"};
    CHECK(run_case(&f, gone, 2, two, 2, &r) == 0);
    check_result(&f, gone, 2, two, 2, &r);
    CHECK_EQ_INT(r.nsteps, 2);
    CHECK_STR_CONTAINS(r.steps[1], "replace: pipeline 2 (1 -> 2 nodes) takes added node x1");
    CHECK_EQ_INT(r.npipelines, 4);
    pl_reinstantiation_free(&r);
    fixture_free(&f);
}

/* Added nodes move the plan to the best one for the new total. */
static void test_add_reaches_best_plan(void)
{
    fixture f;
    const int sizes[] = {3, 3, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 10, 1, sizes, 4) == 0);
    const char *added[] = {"a0", "a1", "a2", "a3"};
    for (int na = 1; na <= 4; na++) {
        pl_reinstantiation r;
        CHECK(run_case(&f, NULL, 0, added, na, &r) == 0);
        check_result(&f, NULL, 0, added, na, &r);
        CHECK(has_step(&r, "plan:"));
        pl_instance_plan best;
        char err[256];
        CHECK(pl_instantiate(&f.ts, 10 + na, f.tolerate, f.global_batch, 1, &best, err,
                             sizeof err) == 0);
        CHECK(best.covered);
        CHECK_EQ_INT(r.npipelines, best.npipelines);
        CHECK_EQ_INT(r.iteration_ns, best.iteration_ns);
        CHECK_EQ_INT(r.nidle, 0);
        pl_instance_plan_free(&best);
        pl_reinstantiation_free(&r);
        if (check_failed_)
            break;
    }
    fixture_free(&f);
}

/* The best plan for 12 nodes has smaller pipelines than the current 3-node
 * ones: they shrink and the freed nodes join new pipelines. */
static void test_add_reshapes(void)
{
    fixture f;
    const int sizes[] = {3, 3, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 10, 1, sizes, 4) == 0);
    const char *added[] = {"a0", "a1", "a2", "a3", "a4", "a5"};
    int reshaped = 0;
    for (int na = 1; na <= 6; na++) {
        const char *removed[] = {"n0"};
        for (int nr = 0; nr <= 1; nr++) {
            pl_reinstantiation r;
            CHECK(run_case(&f, removed, nr, added, na, &r) == 0);
            check_result(&f, removed, nr, added, na, &r);
            pl_instance_plan best;
            char err[256];
            CHECK(pl_instantiate(&f.ts, 10 - nr + na, f.tolerate, f.global_batch, 1, &best, err,
                                 sizeof err) == 0);
            CHECK_EQ_INT(r.npipelines, best.npipelines);
            CHECK_EQ_INT(r.iteration_ns, best.iteration_ns);
            reshaped += has_step(&r, "shrink:");
            pl_instance_plan_free(&best);
            pl_reinstantiation_free(&r);
        }
    }
    fixture_free(&f);
    CHECK(reshaped > 0);
}

/* New pipelines of added nodes receive every layer, from many holders. */
static void test_copy_sources_spread(void)
{
    fixture f;
    const int sizes[] = {2, 2, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 8, 1, sizes, 4) == 0);
    const char *added[] = {"a0", "a1", "a2", "a3"};
    pl_reinstantiation r;
    CHECK(run_case(&f, NULL, 0, added, 4, &r) == 0);
    check_result(&f, NULL, 0, added, 4, &r);
    CHECK(has_step(&r, "new: pipeline of 2 nodes"));
    int64_t sent[MAXN] = {0}, most = 0;
    for (int c = 0; c < r.ncopies; c++)
        for (int k = 0; k < r.copies[c].nlayers; k++)
            sent[node_index(&f, r.copies[c].layers[k].source)] += r.copies[c].layers[k].bytes;
    int senders = 0;
    for (int i = 0; i < f.nnodes; i++) {
        senders += sent[i] > 0;
        most = sent[i] > most ? sent[i] : most;
    }
    CHECK(senders >= 4);
    CHECK(most < r.bytes_to_copy / 2);
    pl_reinstantiation_free(&r);
    fixture_free(&f);
}

/* Layers of 16 MiB and more with several surviving holders come in parts, each from a
 * holder of its own, so that the bytes rather than whole layers are spread: four new
 * nodes take every layer from four holders (one per pipeline); after a loss with F = 2
 * the lost layers have two holders left. Small layers stay whole. */
static void test_large_layers_come_in_parts(void)
{
    fixture f;
    const int sizes[] = {2, 2, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 8, 1, sizes, 4) == 0);
    /* layer l: 3 × (l + 1) × 6 MiB copied, so layer 0 stays whole (18 MiB, one part of
     * 16 MiB at most) and layer 7 has 144 MiB: four parts, one per holder */
    pl_template_set_free(&f.ts);
    for (int l = 0; l < f.p.nlayers; l++)
        f.p.layers[l].param_bytes *= 6 * 1048576 / 1000;
    f.p.gpu_memory_bytes *= 6 * 1048576 / 1000;
    char err[256];
    CHECK(pl_templates_plan(&f.p, 8, 1, &f.ts, err, sizeof err) == 0);
    const char *added[] = {"a0", "a1", "a2", "a3"};
    pl_reinstantiation r;
    CHECK(run_case(&f, NULL, 0, added, 4, &r) == 0);
    check_result(&f, NULL, 0, added, 4, &r);
    int parts[8] = {0};
    int64_t sent[MAXN] = {0}, most = 0, largest = 0;
    for (int c = 0; c < r.ncopies; c++)
        for (int k = 0; k < r.copies[c].nlayers; k++) {
            const pl_layer_copy *lc = &r.copies[c].layers[k];
            parts[lc->layer] = lc->parts;
            sent[node_index(&f, lc->source)] += lc->bytes;
            largest = lc->bytes > largest ? lc->bytes : largest;
        }
    CHECK_EQ_INT(parts[0], 1);
    CHECK_EQ_INT(parts[1], 2);
    CHECK_EQ_INT(parts[7], 4);
    for (int i = 0; i < f.nnodes; i++)
        most = sent[i] > most ? sent[i] : most;
    CHECK(largest <= 3 * f.p.layers[7].param_bytes / 4 + 1);
    CHECK(most <= r.bytes_to_copy / 4 + largest); /* balanced to within one part */
    pl_reinstantiation_free(&r);
    fixture_free(&f);

    /* F = 2, three pipelines of 3: a lost node's layers have two holders */
    const int three[] = {3, 3, 3};
    CHECK(fixture_init(&f, 9, 1, 0, 9, 2, three, 3) == 0);
    pl_template_set_free(&f.ts);
    for (int l = 0; l < f.p.nlayers; l++)
        f.p.layers[l].param_bytes *= 6 * 1048576 / 1000;
    f.p.gpu_memory_bytes *= 6 * 1048576 / 1000;
    CHECK(pl_templates_plan(&f.p, 9, 2, &f.ts, err, sizeof err) == 0);
    const char *removed[] = {"n1"};
    CHECK(run_case(&f, removed, 1, NULL, 0, &r) == 0);
    check_result(&f, removed, 1, NULL, 0, &r);
    int split = 0;
    for (int c = 0; c < r.ncopies; c++)
        for (int k = 0; k < r.copies[c].nlayers; k++)
            split += r.copies[c].layers[k].parts == 2;
    CHECK(split > 0);
    pl_reinstantiation_free(&r);
    fixture_free(&f);
}

/* Every node holds one layer (n0 = L = 4), so only 4-node pipelines exist and
 * a ninth node has nowhere to go. */
static void test_idle_when_uncovered(void)
{
    fixture f;
    const int sizes[] = {4, 4};
    CHECK(fixture_init(&f, 4, 1, 1, 8, 1, sizes, 2) == 0);
    CHECK_EQ_INT(f.ts.n0, 4);
    const char *removed[] = {"n2"}, *added[] = {"a0", "a1"};
    pl_reinstantiation r;
    CHECK(run_case(&f, removed, 1, added, 2, &r) == 0);
    check_result(&f, removed, 1, added, 2, &r);
    CHECK_EQ_INT(r.npipelines, 2);
    CHECK_EQ_INT(r.nidle, 1);
    CHECK(strcmp(r.idle_nodes[0], "a1") == 0);
    CHECK(has_step(&r, "idle: a1"));
    CHECK(has_step(&r, "plan: best plan for 9 nodes is 2x4 nodes (1 idle)"));
    pl_reinstantiation_free(&r);

    fixture_free(&f);

    /* a damaged pipeline that can neither borrow (4 -> 3 has no template) nor
     * merge (nor 7 nodes) is dissolved: the best plan for 11 nodes idles 3 */
    const int three[] = {4, 4, 4};
    CHECK(fixture_init(&f, 4, 1, 1, 12, 1, three, 3) == 0);
    CHECK(run_case(&f, removed, 1, NULL, 0, &r) == 0);
    check_result(&f, removed, 1, NULL, 0, &r);
    CHECK_EQ_INT(r.npipelines, 2);
    CHECK_EQ_INT(r.nidle, 3);
    CHECK(has_step(&r, "dissolve: pipeline 0 (3 nodes)"));
    CHECK(strcmp(r.pipelines[0].nodes[0], "n4") == 0);
    pl_reinstantiation_free(&r);
    fixture_free(&f);
}

static void test_json_and_determinism(void)
{
    fixture f;
    const int sizes[] = {3, 3, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 10, 1, sizes, 4) == 0);
    const char *removed[] = {"n2", "n7"}, *added[] = {"x"};
    char *text[2];
    for (int i = 0; i < 2; i++) {
        pl_reinstantiation r;
        CHECK(run_case(&f, removed, 2, added, 1, &r) == 0);
        cJSON *j = pl_reinstantiation_to_json(&r);
        CHECK(j != NULL);
        text[i] = cJSON_PrintUnformatted(j);
        const char *keys[] = {"pipelines", "iteration_ms", "copies", "bytes_to_copy", "idle_nodes",
                              "fatal", "lost_layers", "insufficient_nodes", "steps"};
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
            CHECK(cJSON_GetObjectItem(j, keys[k]) != NULL);
        cJSON *p0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "pipelines"), 0);
        CHECK(cJSON_GetObjectItem(p0, "nodes") && cJSON_GetObjectItem(p0, "template_nodes") &&
              cJSON_GetObjectItem(p0, "microbatches") && cJSON_GetObjectItem(p0, "iteration_ms"));
        CHECK_EQ_INT(cJSON_GetObjectItem(j, "bytes_to_copy")->valuedouble, r.bytes_to_copy);
        cJSON_Delete(j);
        pl_reinstantiation_free(&r);
    }
    CHECK(strcmp(text[0], text[1]) == 0);
    CHECK_STR_CONTAINS(text[0], "\"copies\":[{\"node\":");
    free(text[0]);
    free(text[1]);
    fixture_free(&f);
}

static void test_parse(void)
{
    char err[256];
    pl_current_plan c;
    CHECK(pl_current_parse("{\"pipelines\": [{\"nodes\": [\"a\", \"b\"]}, {\"nodes\": [\"c\"]}]}",
                           &c, err, sizeof err) == 0);
    CHECK_EQ_INT(c.npipelines, 2);
    CHECK_EQ_INT(c.pipelines[0].nnodes, 2);
    CHECK(strcmp(c.pipelines[0].nodes[1], "b") == 0);
    CHECK(strcmp(c.pipelines[1].nodes[0], "c") == 0);
    pl_current_plan_free(&c);

    struct {
        const char *json, *msg;
    } bad[] = {
        {"{", "not valid JSON"},
        {"[]", "current plan: must be a JSON object"},
        {"{}", "pipelines: missing"},
        {"{\"pipelines\": []}", "pipelines: must be a non-empty array"},
        {"{\"pipelines\": [3]}", "pipelines[0]: must be an object"},
        {"{\"pipelines\": [{\"nodes\": []}]}", "pipelines[0].nodes: must be a non-empty array"},
        {"{\"pipelines\": [{\"nodes\": [\"a\"]}, {\"nodes\": [1]}]}",
         "pipelines[1].nodes[0]: must be a string"},
        {"{\"pipelines\": [{\"nodes\": [\"\"]}]}", "pipelines[0].nodes[0]: must not be empty"},
        {"{\"pipelines\": [{\"nodes\": [\"a\"]}, {\"nodes\": [\"b\", \"a\"]}]}",
         "pipelines[1].nodes[1]: node \"a\" is already in pipelines[0]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        CHECK(pl_current_parse(bad[i].json, &c, err, sizeof err) == -1);
        CHECK_STR_CONTAINS(err, bad[i].msg);
        CHECK_EQ_INT(c.npipelines, 0);
    }
}

static void test_bad_arguments(void)
{
    fixture f;
    const int sizes[] = {3, 3, 2, 2};
    CHECK(fixture_init(&f, 8, 1, 0, 10, 1, sizes, 4) == 0);
    char err[256];
    pl_reinstantiation r;
    const char *unknown[] = {"nope"}, *twice[] = {"n1", "n1"}, *exists[] = {"n4"},
               *dup[] = {"z", "z"}, *empty[] = {""};
    struct {
        const char *const *removed;
        int nr;
        const char *const *added;
        int na;
        const char *msg;
    } bad[] = {
        {unknown, 1, NULL, 0, "removed[0]: unknown node \"nope\""},
        {twice, 2, NULL, 0, "removed[1]: node \"n1\" is listed twice"},
        {NULL, 0, exists, 1, "added[0]: node \"n4\" is already in the current plan"},
        {NULL, 0, dup, 2, "added[1]: node \"z\" is listed twice"},
        {NULL, 0, empty, 1, "added[0]: must be a non-empty name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        CHECK(pl_reinstantiate(&f.p, &f.ts, NULL, 1, 16, &f.cur, bad[i].removed, bad[i].nr,
                               bad[i].added, bad[i].na, &r, err, sizeof err) == -1);
        CHECK_STR_CONTAINS(err, bad[i].msg);
    }
    CHECK(pl_reinstantiate(&f.p, &f.ts, NULL, -1, 16, &f.cur, NULL, 0, NULL, 0, &r, err, sizeof err) ==
          -1);
    CHECK_STR_CONTAINS(err, "tolerate");
    CHECK(pl_reinstantiate(&f.p, &f.ts, NULL, 1, 0, &f.cur, NULL, 0, NULL, 0, &r, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "global-batch");

    /* more pipelines than microbatches */
    CHECK(pl_reinstantiate(&f.p, &f.ts, NULL, 1, 2, &f.cur, NULL, 0, NULL, 0, &r, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "global_batch: 2 microbatches cannot feed 4 pipelines");

    /* a pipeline size with no template (n0 = 2) */
    pl_current_plan one;
    CHECK(pl_current_parse("{\"pipelines\": [{\"nodes\": [\"a\", \"b\"]}, {\"nodes\": [\"c\"]}]}",
                           &one, err, sizeof err) == 0);
    CHECK(pl_reinstantiate(&f.p, &f.ts, NULL, 1, 16, &one, NULL, 0, NULL, 0, &r, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "pipelines[1]: no pipeline template for 1 nodes");
    pl_current_plan_free(&one);

    /* templates built for another profile */
    pl_profile shorter = f.p;
    shorter.nlayers = 4;
    CHECK(pl_reinstantiate(&shorter, &f.ts, NULL, 1, 16, &f.cur, NULL, 0, NULL, 0, &r, err, sizeof err) ==
          -1);
    CHECK_STR_CONTAINS(err, "templates: the template for 3 nodes does not fit");

    /* duplicate names in a plan built in code */
    char *saved = f.cur.pipelines[3].nodes[1];
    f.cur.pipelines[3].nodes[1] = f.cur.pipelines[0].nodes[0];
    int rc = pl_reinstantiate(&f.p, &f.ts, NULL, 1, 16, &f.cur, NULL, 0, NULL, 0, &r, err, sizeof err);
    f.cur.pipelines[3].nodes[1] = saved;
    CHECK_EQ_INT(rc, -1);
    CHECK_STR_CONTAINS(err, "pipelines[3].nodes[1]: node \"n0\" appears twice");
    fixture_free(&f);
}

/* Large clusters go through the same code: many pipelines, failures in
 * several, plus added nodes. */
static void test_large_cluster(void)
{
    fixture f;
    int sizes[MAXN / 2];
    for (int i = 0; i < 15; i++)
        sizes[i] = 2;
    CHECK(fixture_init(&f, 8, 1, 0, 30, 3, sizes, 15) == 0);
    f.global_batch = 64;
    const char *removed[] = {"n1", "n4", "n5", "n9", "n20"}, *added[] = {"a0", "a1", "a2"};
    pl_reinstantiation r;
    CHECK(run_case(&f, removed, 5, NULL, 0, &r) == 0);
    check_result(&f, removed, 5, NULL, 0, &r);
    pl_reinstantiation_free(&r);
    CHECK(run_case(&f, removed, 5, added, 3, &r) == 0);
    check_result(&f, removed, 5, added, 3, &r);
    pl_reinstantiation_free(&r);
    fixture_free(&f);
}

/* ---- zones ---- */

/* Zones by node name: current node i in zone zone[i], added nodes new0, new1 in 0, 1. */
typedef struct {
    const char *names[MAXN + 2];
    int zone[MAXN + 2], n, nzones;
} zones;

static void zones_init(fixture *f, zones *z, const int *zone, int nzones)
{
    z->n = 0;
    z->nzones = nzones;
    for (int i = 0; i < f->nnodes; i++, z->n++) {
        z->names[i] = f->names[i];
        z->zone[i] = zone[i];
    }
    z->names[z->n] = "new0";
    z->zone[z->n++] = 0;
    z->names[z->n] = "new1";
    z->zone[z->n++] = 1;
    f->cur.zoned = z->names;
    f->cur.zone_of = z->zone;
    f->cur.nzoned = z->n;
    f->cur.nzones = nzones;
}

static int zone_named(const zones *z, const char *name)
{
    for (int k = 0; k < z->n; k++)
        if (!strcmp(z->names[k], name))
            return z->zone[k];
    return -1;
}

/* The zone risk (zone_place.h) of a result's placement. */
static void result_risk(const fixture *f, const zones *z, const pl_reinstantiation *r,
                        pl_zone_risk *risk)
{
    int nnodes[MAXN], bnd[MAXN][MAXN + 1], slot_zone[MAXN + 2], s = 0;
    const int *bounds[MAXN];
    for (int x = 0; x < r->npipelines; x++) {
        const pl_template *t = pl_template_for(&f->ts, r->pipelines[x].template_nodes);
        nnodes[x] = t->nodes;
        bounds[x] = bnd[x];
        bnd[x][t->nodes] = f->p.nlayers;
        for (int k = t->nstages - 1; k >= 0; k--)
            bnd[x][t->stages[k].node] = t->stages[k].layer_begin;
        for (int j = 0; j < t->nodes; j++)
            slot_zone[s++] = zone_named(z, r->pipelines[x].nodes[j]);
    }
    const pl_zone_shape sh = {f->p.nlayers, r->npipelines, nnodes, bounds};
    CHECK(pl_zone_risk_of(&sh, slot_zone, z->nzones, risk) == 0);
}

/* One case placed blind and by zone: its risks and copy bytes. */
typedef struct {
    pl_zone_risk blind, zoned;
    int64_t blind_bytes, zoned_bytes;
} zcmp;

/* Runs the case both ways (run_case: with and without the coverage table alike). Zones
 * never leave a plan more exposed, never add copies unless blind placement leaves a layer
 * exposed, and then add at most one replica (3 × the parameters). */
static void compare_zoned(fixture *f, const zones *z, const char *const *rm, int nrm,
                          const char *const *ad, int nad, zcmp *out)
{
    pl_reinstantiation blind, zoned;
    memset(out, 0, sizeof *out);
    f->cur.nzones = 0;
    CHECK(run_case(f, rm, nrm, ad, nad, &blind) == 0);
    f->cur.nzones = z->nzones;
    CHECK(run_case(f, rm, nrm, ad, nad, &zoned) == 0);
    if (!check_failed_ && blind.npipelines > 0) {
        result_risk(f, z, &blind, &out->blind);
        result_risk(f, z, &zoned, &out->zoned);
        out->blind_bytes = blind.bytes_to_copy;
        out->zoned_bytes = zoned.bytes_to_copy;
        int64_t replica = 0;
        for (int l = 0; l < f->p.nlayers; l++)
            replica += 3 * f->p.layers[l].param_bytes;
        CHECK(pl_zone_risk_cmp(&out->zoned, &out->blind) <= 0);
        CHECK(out->zoned_bytes <= out->blind_bytes + (out->blind.exposed ? replica : 0));
    }
    pl_reinstantiation_free(&blind);
    pl_reinstantiation_free(&zoned);
}

/* Pipelines of 3, 3, 2 and 2 nodes, n0 .. n9 in zones a, b, a, b, ... */
static void zoned_fixture(fixture *f, zones *z)
{
    const int sizes[] = {3, 3, 2, 2}, zone[] = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1};
    CHECK(fixture_init(f, 8, 1, 0, 10, 1, sizes, 4) == 0);
    zones_init(f, z, zone, 2);
}

/* Every single and double failure, alone and with two nodes joining (compare_zoned's
 * bounds hold); some plans are spread at no copy cost. */
static void test_zones_never_cost_copies_unless_exposed(void)
{
    fixture f;
    zones z;
    zoned_fixture(&f, &z);
    int spread = 0, free_spread = 0;
    const char *added[] = {"new0", "new1"};
    for (int a = 0; a < f.nnodes && !check_failed_; a++)
        for (int b = a; b < f.nnodes && !check_failed_; b++)
            for (int na = 0; na <= 2; na += 2) {
                const char *removed[2] = {f.names[a], f.names[b]};
                zcmp c;
                compare_zoned(&f, &z, removed, a == b ? 1 : 2, added, na, &c);
                const int better = pl_zone_risk_cmp(&c.zoned, &c.blind) < 0;
                spread += better;
                free_spread += better && c.zoned_bytes == c.blind_bytes;
            }
    printf("    %d of %d plans spread by zone, %d of them at no copy cost\n", spread,
           f.nnodes * (f.nnodes + 1), free_spread);
    CHECK(free_spread > 0);
    fixture_free(&f);
}

/* compare_zoned on the zoned fixture after nodes a and b go (no node joins). */
static void zoned_loss(const char *a, const char *b, zcmp *c)
{
    fixture f;
    zones z;
    zoned_fixture(&f, &z);
    const char *removed[] = {a, b};
    compare_zoned(&f, &z, removed, 2, NULL, 0, c);
    fixture_free(&f);
}

/* n1 and n6 go: pipeline 0 runs on n0, n2 (both zone a) and pipeline 2 borrows n3 to run
 * with n7 (both zone b). n0 and n3 held the same layers (stage 0 of the 3-node template):
 * swapped, no stage sits next to its zone, at the same copy bytes. */
static void test_zones_spread_survivors(void)
{
    zcmp c;
    zoned_loss("n1", "n6", &c);
    CHECK_EQ_INT(c.blind.neighbours, 2);
    CHECK_EQ_INT(c.zoned.neighbours, 0);
    CHECK_EQ_INT(c.zoned_bytes, c.blind_bytes);
}

/* n1 and n3 go: placed by copies alone, every pipeline (all of 2 nodes now) runs its first
 * stage in zone a (n0, n4, n6, n8), whose loss would take those layers. Swapping pipeline
 * 1's two nodes fixes it, at a copy cost within one replica. */
static void test_zones_fix_exposed_layer(void)
{
    zcmp c;
    zoned_loss("n1", "n3", &c);
    CHECK(c.blind.exposed > 0);
    CHECK_EQ_INT(c.zoned.exposed, 0);
    CHECK(c.zoned_bytes > c.blind_bytes);
}

/* A zone out of range is an error that names it. */
static void test_zones_bad_zone(void)
{
    fixture f;
    zones z;
    zoned_fixture(&f, &z);
    z.zone[3] = 2;
    pl_reinstantiation r;
    char err[256];
    CHECK(pl_reinstantiate(&f.p, &f.ts, NULL, 1, 16, &f.cur, NULL, 0, NULL, 0, &r, err,
                           sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "zone_of[3]: zone 2 is not in -1 .. 1");
    fixture_free(&f);
}

/* The ring's wrap (Bamboo §5.1: the last stage holds the first's layers): the last and the
 * first stage of 3 or more in one zone are neighbours; of 2, the one pair counts once; and
 * pl_zone_improve moves them apart. */
static void test_zone_risk_counts_the_rings_wrap(void)
{
    const int nn3[] = {3}, b3[] = {0, 2, 4, 6}, nn2[] = {2}, b2[] = {0, 3, 6};
    const int *bounds3[] = {b3}, *bounds2[] = {b2};
    const pl_zone_shape three = {6, 1, nn3, bounds3}, two = {6, 1, nn2, bounds2};
    int z3[] = {0, 1, 0}, z2[] = {0, 0};
    pl_zone_risk r;
    CHECK(pl_zone_risk_of(&three, z3, 3, &r) == 0);
    CHECK_EQ_INT((int)r.neighbours, 1);
    CHECK(pl_zone_risk_of(&two, z2, 3, &r) == 0);
    CHECK_EQ_INT((int)r.neighbours, 1);
    const int nn4[] = {4}, b4[] = {0, 2, 3, 5, 6}, *bounds4[] = {b4};
    const pl_zone_shape four = {6, 1, nn4, bounds4};
    int z4[] = {0, 1, 1, 0}, item[] = {0, 1, 2, 3}, all[] = {0, 1, 2, 3};
    CHECK(pl_zone_risk_of(&four, z4, 2, &r) == 0);
    CHECK_EQ_INT((int)r.neighbours, 2); /* stages 1 and 2, and the wrap 3 → 0 */
    CHECK(pl_zone_improve(&four, 2, z4, item, all, 4, NULL) == 0);
    CHECK(pl_zone_risk_of(&four, z4, 2, &r) == 0);
    CHECK_EQ_INT((int)r.neighbours, 0);
    CHECK(z4[0] != z4[3]);
}

TEST_MAIN_BEGIN
RUN(test_every_failure_mixed_sizes);
RUN(test_every_failure_smallest_pipelines);
RUN(test_every_failure_tolerate_two);
RUN(test_every_failure_two_gpus_per_node);
RUN(test_simple);
RUN(test_borrow);
RUN(test_merge);
RUN(test_fatal);
RUN(test_departing_sources);
RUN(test_insufficient);
RUN(test_wiped_out_pipeline);
RUN(test_replace_with_added);
RUN(test_add_reaches_best_plan);
RUN(test_add_reshapes);
RUN(test_copy_sources_spread);
RUN(test_large_layers_come_in_parts);
RUN(test_idle_when_uncovered);
RUN(test_json_and_determinism);
RUN(test_parse);
RUN(test_bad_arguments);
RUN(test_large_cluster);
RUN(test_zones_never_cost_copies_unless_exposed);
RUN(test_zones_spread_survivors);
RUN(test_zones_fix_exposed_layer);
RUN(test_zones_bad_zone);
RUN(test_zone_risk_counts_the_rings_wrap);
TEST_MAIN_END
