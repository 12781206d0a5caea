/* Exact pipeline-template planner (Oobleck §4.1.2, with an exact optimum).
 *
 * Objective for S stages: T(4S) = Σ W_k + 2·Σ C_k + (4S − 1)·max_k W_k. The max
 * term is not additive, so we fix a threshold t on every W_k: with all W_k ≤ t,
 *     Σ W_k + 2·Σ C_k + (4S − 1)·t = Σ_k (W_k + 2·C_k + 4t) − t,
 * which is additive per stage. Minimising it over t taken from the finite set
 * of possible stage times gives the exact optimum (at t = the optimum's own max
 * the bound is tight; at any t it is an upper bound of a real layout).
 *
 * For a fixed t the additive problem is a DP over suffixes of the pipeline:
 * state (r, Q, i) = layers [i, L) on the last Q GPUs in r stages. Suffixes make
 * the memory term exact (stage k keeps S − k = r microbatches in flight) and
 * make the DP independent of the node count n: the template for n nodes is the
 * state (S, n·M, 0), so one DP answers every n and every S at once (the
 * memoisation the paper describes in §4.1.2, made exhaustive).
 *
 * Within one (r, Q, d) the next-stage choice j ranges over a window
 * [i + 1, jmax(i)] that slides left as i decreases (both the threshold and the
 * memory bound are on range sums), so a monotone deque finds each minimum in
 * amortised O(1). Which thresholds to try is decided per (n, S) pair by
 * search_thresholds below: a walk down from t = ∞ that skips every threshold
 * on which the answer cannot change. */
#include "templates.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

#define INF INT64_MAX

typedef struct {
    const pl_profile *p;
    int L, M, K, R, nmax, qmax;
    int64_t *pw;           /* [K][L+1] prefix sums of forward+backward ns */
    int64_t *pp, *pa;      /* [L+1] prefix sums of param and activation bytes */
    int64_t *c2in, *c2out; /* [L] 2·C for the output of layer j, intra / inter node */
    int64_t *f;            /* [R+1][qmax+1][L+1] DP values */
    int32_t *choice;       /* same shape: (j << 8) | key index */
    int64_t *val;          /* [L+1] scratch: candidate values of the next stage */
    int *dq;               /* [2(L+1)] scratch deque */
} planner;

static size_t idx(const planner *c, int r, int q, int i)
{
    return ((size_t)r * (size_t)(c->qmax + 1) + (size_t)q) * (size_t)(c->L + 1) + (size_t)i;
}

static int64_t stage_ns(const planner *c, int k, int i, int j)
{
    return c->pw[(size_t)k * (size_t)(c->L + 1) + (size_t)j] -
           c->pw[(size_t)k * (size_t)(c->L + 1) + (size_t)i];
}

/* Memory of a stage [i, j) on d GPUs with r microbatches in flight, per the cost model. */
static int stage_fits(const planner *c, int i, int j, int d, int r)
{
    __int128 need = (__int128)4 * (c->pp[j] - c->pp[i]) + (__int128)r * (c->pa[j] - c->pa[i]);
    return need <= (__int128)c->p->gpu_memory_bytes * d;
}

/* A stage of d GPUs ending the Q GPUs of a suffix must not cross a node boundary. */
static int fits_in_node(int q, int d, int m)
{
    return (q - 1) % m + 1 >= d;
}

static void planner_free(planner *c)
{
    free(c->pw);
    free(c->pp);
    free(c->pa);
    free(c->c2in);
    free(c->c2out);
    free(c->f);
    free(c->choice);
    free(c->val);
    free(c->dq);
}

static int planner_init(planner *c, const pl_profile *p, int nmax, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->p = p;
    c->L = p->nlayers;
    c->M = p->gpus_per_node;
    c->K = p->nkeys;
    c->nmax = nmax;
    c->qmax = nmax * c->M;
    c->R = c->L < c->qmax ? c->L : c->qmax;
    size_t L1 = (size_t)c->L + 1;
    size_t states = ((size_t)c->R + 1) * ((size_t)c->qmax + 1) * L1;
    if (states > ((size_t)1 << 28))
        return pl_errf(err, errlen, "planner: %d layers × %d GPUs is too large to plan", c->L,
                       c->qmax);
    c->pw = pl_calloc((size_t)c->K * L1, sizeof *c->pw);
    c->pp = pl_calloc(L1, sizeof *c->pp);
    c->pa = pl_calloc(L1, sizeof *c->pa);
    c->c2in = pl_calloc(L1, sizeof *c->c2in);
    c->c2out = pl_calloc(L1, sizeof *c->c2out);
    c->f = pl_calloc(states, sizeof *c->f);
    c->choice = pl_calloc(states, sizeof *c->choice);
    c->val = pl_calloc(L1, sizeof *c->val);
    c->dq = pl_calloc(2 * L1, sizeof *c->dq);
    if (!c->pw || !c->pp || !c->pa || !c->c2in || !c->c2out || !c->f || !c->choice || !c->val ||
        !c->dq) {
        planner_free(c);
        return pl_errf(err, errlen, "planner: out of memory");
    }
    for (int i = 0; i < c->L; i++) {
        const pl_layer_profile *l = &p->layers[i];
        for (int k = 0; k < c->K; k++)
            c->pw[(size_t)k * L1 + i + 1] =
                c->pw[(size_t)k * L1 + i] + l->fwd_ns[k] + l->bwd_ns[k];
        c->pp[i + 1] = c->pp[i] + l->param_bytes;
        c->pa[i + 1] = c->pa[i] + l->activation_bytes;
        c->c2in[i] = 2 * pl_transfer_ns(l->output_bytes, p->intra_node_GBps);
        c->c2out[i] = 2 * pl_transfer_ns(l->output_bytes, p->inter_node_GBps);
    }
    return 0;
}

/* Stage counts a suffix of q GPUs can have: at least one stage per node, at most one per GPU. */
static int r_lo(const planner *c, int q)
{
    return (q + c->M - 1) / c->M;
}

/* One sweep over i for fixed (r, q, key k): F[r][q][i] = min over j of
 * W(i,j) + extra + comm + F[r−1][q−d][j] with W(i,j) ≤ t and memory fitting. */
static void dp_sweep(planner *c, int r, int q, int k, int64_t t, int64_t extra)
{
    const int L = c->L, d = c->p->keys[k], qn = q - d;
    const int64_t *pwk = c->pw + (size_t)k * (size_t)(L + 1);
    if (r == 1 && qn != 0) return;
    if (r > 1 && (qn < 1 || r - 1 < r_lo(c, qn) || r - 1 > qn)) return;
    /* candidate value of a next stage starting at layer j (excluding −pw[i]) */
    for (int j = 1; j <= L; j++) {
        int64_t rest;
        if (j == L)
            rest = (r == 1) ? 0 : INF;
        else
            rest = (r == 1) ? INF : c->f[idx(c, r - 1, qn, j)];
        c->val[j] = rest == INF ? INF
                                : pwk[j] + rest + (j < L ? (qn % c->M ? c->c2in[j - 1]
                                                                      : c->c2out[j - 1])
                                                         : 0);
    }
    /* dq[head..tail) holds j ascending with values descending; it grows at the
     * front at most L times, so it starts L + 1 slots in. */
    int head = L + 1, tail = L + 1;
    int hi = L;
    int *dq = c->dq;
    for (int i = L - r; i >= 0; i--) {
        int jn = i + 1;
        if (c->val[jn] != INF) {
            while (tail > head && c->val[dq[head]] >= c->val[jn]) head++;
            dq[--head] = jn;
        }
        while (hi > i && (pwk[hi] - pwk[i] > t || !stage_fits(c, i, hi, d, r))) hi--;
        while (tail > head && dq[tail - 1] > hi) tail--;
        if (tail > head) {
            int j = dq[tail - 1];
            int64_t v = c->val[j] - pwk[i] + extra;
            size_t s = idx(c, r, q, i);
            if (v < c->f[s]) {
                c->f[s] = v;
                c->choice[s] = (int32_t)(j << 8 | k);
            }
        }
    }
}

/* Fills F for r ≤ rmax, q ≤ qmax under threshold t with per-stage cost extra. */
static void dp_run(planner *c, int64_t t, int64_t extra, int qmax, int rmax)
{
    for (int r = 0; r <= rmax; r++)
        for (int q = 0; q <= qmax; q++)
            for (int i = 0; i <= c->L; i++) c->f[idx(c, r, q, i)] = INF;
    c->f[idx(c, 0, 0, c->L)] = 0;
    for (int r = 1; r <= rmax; r++)
        for (int q = r; q <= qmax; q++) {
            if (r < r_lo(c, q)) continue;
            for (int k = 0; k < c->K; k++)
                if (fits_in_node(q, c->p->keys[k], c->M)) dp_sweep(c, r, q, k, t, extra);
        }
}

/* Bottleneck DP: the smallest possible max W_k for every (r, q, i), by the
 * same recursion with max instead of sum. Scanning j upward stops once the
 * stage alone is no better than the best found, which keeps it near-linear. */
static void dp_bottleneck(planner *c)
{
    const int L = c->L;
    for (size_t s = 0; s < idx(c, c->R + 1, 0, 0); s++) c->f[s] = INF;
    c->f[idx(c, 0, 0, L)] = 0;
    for (int r = 1; r <= c->R; r++)
        for (int q = r; q <= c->qmax; q++) {
            if (r < r_lo(c, q)) continue;
            for (int k = 0; k < c->K; k++) {
                int d = c->p->keys[k], qn = q - d;
                if (!fits_in_node(q, d, c->M)) continue;
                if (r == 1 ? qn != 0 : (qn < 1 || r - 1 < r_lo(c, qn) || r - 1 > qn)) continue;
                for (int i = L - r; i >= 0; i--) {
                    int64_t *best = &c->f[idx(c, r, q, i)];
                    for (int j = i + 1; j <= L - (r - 1); j++) {
                        int64_t w = stage_ns(c, k, i, j);
                        if (w >= *best || !stage_fits(c, i, j, d, r)) break;
                        int64_t rest = (r == 1) ? (j == L ? 0 : INF)
                                                : (j == L ? INF : c->f[idx(c, r - 1, qn, j)]);
                        if (rest == INF) continue;
                        int64_t v = w > rest ? w : rest;
                        if (v < *best) *best = v;
                    }
                }
            }
        }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Every stage time a memory-feasible stage can have: the candidate thresholds. */
static int64_t *candidate_thresholds(const planner *c, size_t *count)
{
    size_t cap = (size_t)c->K * (size_t)c->L * (size_t)(c->L + 1) / 2 + 1, n = 0;
    int64_t *t = pl_calloc(cap, sizeof *t);
    if (!t) return NULL;
    for (int k = 0; k < c->K; k++)
        for (int i = 0; i < c->L; i++)
            for (int j = i + 1; j <= c->L && stage_fits(c, i, j, c->p->keys[k], 1); j++)
                t[n++] = stage_ns(c, k, i, j);
    qsort(t, n, sizeof *t, cmp_i64);
    size_t u = 0;
    for (size_t a = 0; a < n; a++)
        if (u == 0 || t[u - 1] != t[a]) t[u++] = t[a];
    *count = u;
    return t;
}

/* Rebuilds the layout of state (S, n·M, 0) from the recorded choices. */
static int reconstruct(const planner *c, int n, int S, pl_template *out)
{
    pl_stage *st = pl_calloc((size_t)S, sizeof *st);
    if (!st) return -1;
    int q = n * c->M, i = 0;
    for (int r = S; r >= 1; r--) {
        int32_t ch = c->choice[idx(c, r, q, i)];
        int j = ch >> 8, k = ch & 0xff, d = c->p->keys[k];
        int pos = n * c->M - q; /* first GPU of this stage, counted from the pipeline's start */
        st[S - r] = (pl_stage){.layer_begin = i, .layer_end = j, .node = pos / c->M, .gpus = d};
        q -= d;
        i = j;
    }
    free(out->stages);
    out->stages = st;
    out->nstages = S;
    out->nodes = n;
    return 0;
}

int pl_template_evaluate(const pl_profile *p, pl_template *t)
{
    const int S = t->nstages, M = p->gpus_per_node;
    if (S < 1 || !t->stages || t->nodes < 1) return -1;
    int64_t sum = 0, comm = 0, mx = 0, peak = 0;
    int node = 0, used = 0;
    for (int k = 0; k < S; k++) {
        const pl_stage *s = &t->stages[k];
        int key = pl_profile_key_index(p, s->gpus);
        if (key < 0 || s->layer_begin != (k ? t->stages[k - 1].layer_end : 0) ||
            s->layer_end <= s->layer_begin || s->layer_end > p->nlayers)
            return -1;
        if (s->node != node) { /* moving to the next node: the previous one must be full */
            if (s->node != node + 1 || used != M) return -1;
            node++;
            used = 0;
        }
        used += s->gpus;
        if (used > M) return -1;
        int64_t w = 0;
        __int128 params = 0, acts = 0;
        for (int l = s->layer_begin; l < s->layer_end; l++) {
            w += p->layers[l].fwd_ns[key] + p->layers[l].bwd_ns[key];
            params += p->layers[l].param_bytes;
            acts += p->layers[l].activation_bytes;
        }
        __int128 need = 4 * params + (__int128)(S - k) * acts;
        if (need > (__int128)p->gpu_memory_bytes * s->gpus) return -1;
        int64_t per_gpu = (int64_t)((need + s->gpus - 1) / s->gpus);
        if (per_gpu > peak) peak = per_gpu;
        sum += w;
        if (w > mx) mx = w;
        if (k < S - 1) {
            int same = t->stages[k + 1].node == s->node;
            comm += 2 * pl_transfer_ns(p->layers[s->layer_end - 1].output_bytes,
                                       same ? p->intra_node_GBps : p->inter_node_GBps);
        }
    }
    if (t->stages[S - 1].layer_end != p->nlayers || node != t->nodes - 1 || used != M) return -1;
    t->sum_stage_ns = sum;
    t->comm_ns = comm;
    t->max_stage_ns = mx;
    t->peak_memory_bytes = peak;
    t->iteration_ns = sum + comm + (int64_t)(4 * S - 1) * mx;
    t->feasible = 1;
    return 0;
}

/* Search state per (n, S) pair. g(t) — the least Σ(W + 2C) with every
 * W_k ≤ t — only changes at candidate thresholds and is constant on [m, t]
 * where m is the max W_k of the layout found at t. So we walk each pair
 * downwards from t = ∞, jumping below m each time, and stop once
 * g(t) + (4S − 1)·tmin can no longer beat the best (g only grows downwards).
 * From below, g ≥ g(∞) bounds every threshold t by g(∞) + (4S − 1)·t, so
 * thresholds at or above (best − g(∞)) / (4S − 1) are skipped outright. */
typedef struct {
    int64_t *tmin;   /* [(nmax+1)·(R+1)] bottleneck minimum of the pair */
    int64_t *gnow;   /* g at the pair's last evaluated threshold */
    int64_t *ginf;   /* g(∞) */
    int64_t *target; /* next threshold to evaluate; −1 = done */
    int64_t *best;   /* [nmax+1] best T(4S) of n so far */
    int64_t *cand;   /* sorted distinct stage times */
    size_t ncand;
} search_state;

static size_t pair(const planner *c, int n, int S)
{
    return (size_t)n * (size_t)(c->R + 1) + (size_t)S;
}

/* Largest candidate below m, or −1. */
static int64_t cand_below(const search_state *ss, int64_t m)
{
    size_t lo = 0, hi = ss->ncand; /* first index with cand ≥ m */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ss->cand[mid] < m)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo ? ss->cand[lo - 1] : -1;
}

/* Records the layout of pair (n, S) just computed by dp_run and moves the
 * pair's target below its max stage time. */
static int visit_pair(planner *c, search_state *ss, int n, int S, int64_t g, pl_template *best_out)
{
    size_t k = pair(c, n, S);
    pl_template t = {0};
    if (reconstruct(c, n, S, &t) || pl_template_evaluate(c->p, &t)) {
        free(t.stages);
        return -1;
    }
    int64_t m = t.max_stage_ns;
    if (t.iteration_ns < ss->best[n]) {
        ss->best[n] = t.iteration_ns;
        free(best_out->stages);
        *best_out = t;
    } else {
        free(t.stages);
    }
    ss->gnow[k] = g;
    int64_t next = cand_below(ss, m);
    ss->target[k] = next < ss->tmin[k] ? -1 : next;
    return 0;
}

/* Lowers the pair's target under the bound from below, or ends the pair. */
static void retarget(const planner *c, search_state *ss, int n, int S)
{
    size_t k = pair(c, n, S);
    if (ss->target[k] < 0) return;
    int64_t w = 4 * S - 1;
    if (ss->gnow[k] + w * ss->tmin[k] >= ss->best[n]) {
        ss->target[k] = -1;
        return;
    }
    int64_t up = (ss->best[n] - ss->ginf[k] + w - 1) / w; /* thresholds < up can still win */
    if (ss->target[k] >= up) ss->target[k] = cand_below(ss, up);
    if (ss->target[k] < ss->tmin[k]) ss->target[k] = -1;
}

static int search_thresholds(planner *c, search_state *ss, int n_lo, int n_hi, pl_template *tmpl)
{
    /* t = ∞: the unconstrained optimum of every pair */
    dp_run(c, INF, 0, n_hi * c->M, c->R);
    for (int n = n_lo; n <= n_hi; n++)
        for (int S = n; S <= c->R; S++) {
            int64_t v = c->f[idx(c, S, n * c->M, 0)];
            ss->target[pair(c, n, S)] = -1;
            ss->ginf[pair(c, n, S)] = v;
            if (v != INF && ss->tmin[pair(c, n, S)] != INF &&
                visit_pair(c, ss, n, S, v, &tmpl[n - n_lo]))
                return -1;
        }
    for (;;) {
        int64_t t = -1;
        for (int n = n_lo; n <= n_hi; n++)
            for (int S = n; S <= c->R; S++) {
                retarget(c, ss, n, S);
                if (ss->target[pair(c, n, S)] > t) t = ss->target[pair(c, n, S)];
            }
        if (t < 0) return 0;
        int qneed = 0, rneed = 0;
        for (int n = n_lo; n <= n_hi; n++)
            for (int S = n; S <= c->R; S++)
                if (ss->target[pair(c, n, S)] == t) {
                    qneed = n * c->M;
                    if (S > rneed) rneed = S;
                }
        dp_run(c, t, 4 * t, qneed, rneed);
        for (int n = n_lo; n <= n_hi; n++)
            for (int S = n; S <= rneed; S++) {
                size_t k = pair(c, n, S);
                if (ss->target[k] != t) continue;
                int64_t v = c->f[idx(c, S, n * c->M, 0)];
                if (v == INF)
                    ss->target[k] = -1;
                else if (visit_pair(c, ss, n, S, v - 4 * t * S, &tmpl[n - n_lo]))
                    return -1;
            }
    }
}

int pl_templates_compute(const pl_profile *p, int n_lo, int n_hi, pl_template_set *out,
                         char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (n_lo < 1 || n_hi < n_lo) return pl_errf(err, errlen, "nodes: empty range %d..%d", n_lo, n_hi);
    /* a node needs at least one stage of at least one layer: more nodes than layers never fit */
    int nmax = n_hi < p->nlayers ? n_hi : p->nlayers;
    out->n_min = n_lo;
    out->n_max = n_hi;
    out->count = n_hi - n_lo + 1;
    out->templates = pl_calloc((size_t)out->count, sizeof *out->templates);
    if (!out->templates) return pl_errf(err, errlen, "planner: out of memory");
    for (int n = n_lo; n <= n_hi; n++) out->templates[n - n_lo].nodes = n;
    if (nmax < n_lo) return 0;

    planner c;
    if (planner_init(&c, p, nmax, err, errlen)) {
        pl_template_set_free(out);
        return -1;
    }
    search_state ss = {0};
    size_t cells = (size_t)(nmax + 1) * (size_t)(c.R + 1);
    ss.tmin = pl_calloc(cells, sizeof *ss.tmin);
    ss.gnow = pl_calloc(cells, sizeof *ss.gnow);
    ss.ginf = pl_calloc(cells, sizeof *ss.ginf);
    ss.target = pl_calloc(cells, sizeof *ss.target);
    ss.best = pl_calloc((size_t)nmax + 1, sizeof *ss.best);
    ss.cand = candidate_thresholds(&c, &ss.ncand);
    int rc = -1;
    if (ss.tmin && ss.gnow && ss.ginf && ss.target && ss.best && ss.cand) {
        dp_bottleneck(&c);
        for (int n = 0; n <= nmax; n++) {
            ss.best[n] = INF;
            for (int S = 0; S <= c.R; S++)
                ss.tmin[pair(&c, n, S)] = n ? c.f[idx(&c, S, n * c.M, 0)] : INF;
        }
        rc = search_thresholds(&c, &ss, n_lo, nmax, out->templates);
    }
    free(ss.tmin);
    free(ss.gnow);
    free(ss.ginf);
    free(ss.target);
    free(ss.best);
    free(ss.cand);
    planner_free(&c);
    if (rc) {
        pl_template_set_free(out);
        return pl_errf(err, errlen, "planner: out of memory");
    }
    for (int n = n_lo; n <= n_hi; n++)
        if (out->templates[n - n_lo].feasible && !out->n0) out->n0 = n;
    return 0;
}

int pl_templates_plan(const pl_profile *p, int nodes, int tolerate, pl_template_set *out,
                      char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (nodes < 1) return pl_errf(err, errlen, "--nodes: must be at least 1 (got %d)", nodes);
    if (tolerate < 0) return pl_errf(err, errlen, "--tolerate: must not be negative");
    /* n0 first: the smallest n with any feasible layout (§4.1.1) */
    int limit = nodes < p->nlayers ? nodes : p->nlayers;
    int n0 = 0;
    {
        planner c;
        if (planner_init(&c, p, limit, err, errlen)) return -1;
        dp_bottleneck(&c);
        for (int n = 1; n <= limit && !n0; n++)
            for (int S = n; S <= c.R && !n0; S++)
                if (c.f[idx(&c, S, n * c.M, 0)] != INF) n0 = n;
        planner_free(&c);
    }
    if (!n0)
        return pl_errf(err, errlen,
                       "profile: the model fits on no pipeline of up to %d nodes "
                       "(gpu_memory_bytes too small?)",
                       limit);
    if ((int64_t)(tolerate + 1) * n0 > nodes)
        return pl_errf(err, errlen,
                       "--tolerate: %d failures need at least (F+1)·n0 = %d nodes "
                       "(n0 = %d), but --nodes is %d",
                       tolerate, (tolerate + 1) * n0, n0, nodes);
    return pl_templates_compute(p, n0, nodes - tolerate * n0, out, err, errlen);
}

const pl_template *pl_template_for(const pl_template_set *s, int nodes)
{
    if (nodes < s->n_min || nodes > s->n_max) return NULL;
    const pl_template *t = &s->templates[nodes - s->n_min];
    return t->feasible ? t : NULL;
}

void pl_template_set_free(pl_template_set *s)
{
    for (int i = 0; i < s->count; i++) free(s->templates[i].stages);
    free(s->templates);
    memset(s, 0, sizeof *s);
}
