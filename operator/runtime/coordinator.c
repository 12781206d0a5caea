/* The coordinator's core state machine (coordinator.h): membership, plans, the atomic
 * step, recovery, and the duties it gives workers (checkpoint completion, the resume
 * point, profiling, evaluation). */
#include "coordinator.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rc_plan.h"
#include "reinstantiate.h"
#include "training_schedule.h"
#include "util.h"
#include "zone_place.h"

_Static_assert(PL_COPY_MAX_PARTS <= PL_PROTO_MAX_PARTS, "a plan message carries every part");

typedef struct {
    pl_proto_name name, node, zone; /* zone "" : unknown */
    pl_proto_name device;           /* its GPU's UUID; "" : none */
    int nccl;                       /* it can run the NCCL transport */
    char host[PL_PROTO_HOST_MAX + 1];
    int port, rank;
    int live, leaving;
    int departing; /* left under notice, not yet stopped: a copy source of the plan it
                      left (Bamboo §3's grace period), stopped once those copies are done */
    int64_t last_heard;
    int got_plan, copy_done, reported, reduced, committed, is_source;
    int restored, resumed;      /* in the restored plan; reconnected with hello_resume */
    int ghost;     /* a restored failover's template names it, lost before this coordinator:
                      a name only, which a worker registering is free to take */
    int64_t r_committed, r_reduced;
    double r_scale, r_lr;
    int pipe, pos; /* place in the current plan; pipe -1: idle */
    int lb, le;    /* its layers [lb, le) there (0, 0: idle) */
    int has_ckpt;  /* register.checkpoint: ckpt_step, or ckpt_err when it cannot read it */
    int64_t ckpt_step;
    char ckpt_err[256];
    int evaluated; /* EVALUATING: its eval_done came */
    int64_t hb_gen; /* the newest plan generation its heartbeats carried: the one its compute
                       thread installed */
    int silent;    /* lost for missed heartbeats or a missed step deadline: hung or cut
                      off, maybe still running */
    int64_t writing;    /* the checkpoint it was asked to write its layers of, 0: none or */
    int write_b, write_e; /* its `saved` came; those layers [write_b, write_e) */
} cworker;

typedef struct {
    int nnodes;
    int *w; /* worker indices, stage order */
    int64_t mb, first;
    /* strategy redundant, after a failover (rc_failover): the merged stage bounds
     * (nnodes + 1; NULL: the template's), and the template's workers, lost ones
     * included (tn of them), which re-instantiation starts from */
    int *layers;
    int tn, *tw;
} cpipe;

typedef struct {
    int npipes;
    cpipe *p;
    char desc[64];
} cplan;

typedef struct {
    int dest, src, layer;
    int part, parts;      /* pl_layer_copy's: part of parts (0 of 1: the whole layer) */
    int64_t bytes;
} ccopy;

typedef struct {
    pl_proto_name to;
    pl_msg m;
} outmsg;

/* A link between two workers that one of them reported broken (peer_broken). */
typedef struct {
    int reporter, peer;
} cpair;

/* A machine whose workers failed: kept out until `until` (Horovod's blacklist). */
typedef struct {
    pl_proto_name name;
    int failures;
    int64_t until;
} cnode;

/* A checkpoint being written: which layers' `saved` arrived; once all, the worker asked
 * to write its checkpoint.json. */
#define SAVING_SLOTS 4
typedef struct {
    int64_t step; /* 0: free */
    unsigned char *covered;
    int completing; /* every layer saved: checkpoint.json asked of worker `asked` */
    int asked;      /* -1: nobody yet (no live worker) */
    int failed;     /* a layer or checkpoint.json could not be written: given up */
} csaving;

struct pl_coord {
    pl_coord_config cfg;
    char job[PL_PROTO_NAME_MAX + 1];
    int micro, misses, nlayers;
    cworker *w;
    int nw, capw;
    int *index;            /* worker names → indices: open addressing, -1 empty */
    /* the step's waits resume here: every worker below is done with the step or not
     * part of it (flags are only set within a step; reset_step_flags restarts them) */
    int scan_reduced, scan_committed;
    int scan_copy;         /* the same for copy_done within a plan (install_plan restarts it) */
    int index_cap;         /* a power of two ≥ 2·nw, or 0 */
    outmsg *out;
    int nout, capout, headout;
    pl_coord_phase_t phase;
    char reason[512], err[512];
    int64_t gen, step;
    int transport;         /* pl_transport of the current plan */
    cplan cur, stable;
    int has_cur, has_stable;
    int pending;           /* a membership change waits for the step boundary */
    int join_pending;      /* a worker joined: replan at the next check step */
    char cause[512];       /* causes since the last plan */
    double sumsq, loss_sum;
    int nloss;
    double norm, grad_scale, lr;
    pl_coord_step_rec *log;
    int nlog, caplog;
    pl_coord_reconfig_rec *rec;
    int nrec, caprec;
    int64_t now;           /* the latest time an event brought */
    int64_t wait_since;    /* when waiting for workers began; -1: not waiting */
    int tolerance;         /* the current plan's (cfg.tolerate, or less: degraded) */
    int plan_tolerance;    /* the one of the plan next_plan made */
    int64_t replan_at;     /* SETTLING: when to make the new plan */
    int64_t resume_ms, resume_at; /* RESUMING: how long to wait, and until when (-1: unset) */
    int64_t ckpt_last;     /* newest complete checkpoint; 0: none (the initial state) */
    int64_t plan_ckpt;     /* the current plan loads this checkpoint; -1: none */
    int need_ckpt;         /* a fatal loss: the next plan restarts from the checkpoint */
    csaving saving[SAVING_SLOTS];
    int64_t ckpt_fail_step; /* the newest checkpoint that could not be written; 0: none */
    char ckpt_fail[512];
    int ckpt_failures;     /* checkpoint attempts failed since the last complete one */
    int ckpt_failed_total; /* and since the start */
    int ckpt_retry;        /* the next commit writes a checkpoint (one failed) */
    int commit_save;       /* the commit being sent asks pipeline 0 to save */
    int64_t ckpt_writing;  /* the newest checkpoint pipeline 0 was asked to write; 0: none */
    /* a step whose attempts fail without a loss to blame (non-finite, step_failed) */
    int64_t fail_step;     /* the step they are of; -1: none */
    int fail_attempts, fail_same; /* how many; all for one reason */
    char fail_reason[512];
    /* workers that reported a fatal error: how many, the first reason, all the same */
    int nfatal, fatal_same;
    char fatal_reason[512];
    cnode *nodes;
    int nnodes, capnodes;
    /* the workers' duties */
    int have_planner;      /* profile, templates and coverage are known */
    char *profile_text;    /* PROFILING: the measured profile's JSON */
    int profiler;          /* PROFILING: the worker asked to measure; -1: none */
    int64_t resume_step;   /* the first plan's checkpoint; -1: not decided yet */
    char resume_note[512];
    cpair *suspects;       /* peer_broken reports of generation suspects_gen, not judged yet */
    int nsuspects, capsuspects;
    int64_t suspects_gen;
    int64_t judge_at;      /* when to judge them; -1: no report pending */
    cpair forgiven;        /* the last link found broken alone, judged without a loss */
    int64_t forgiven_gen;  /* its generation; -1: none */
    int eval_pending;      /* the step of eval_rec waits for its validation loss */
    pl_coord_step_rec eval_rec;
    double val_sum;
    int64_t val_batches;
    int64_t step_t0;       /* when start_step went out */
    int64_t step_ms[PL_COORD_STEP_TIMES]; /* the last committed steps' times, a ring */
    int nstep_ms;          /* steps timed (all time) */
    int64_t probe_from;    /* a step of this generation passed its deadline: the next plan
                              finds whose compute thread is hung; -1: none */
    int64_t probe_t0, probe_ms; /* when that plan goes out, the grace after it */
};

static int fail_err(pl_coord *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return PL_COORD_ERR;
}

static void appendf(char *buf, size_t len, const char *fmt, ...)
{
    size_t n = strlen(buf);
    if (n + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, len - n, fmt, ap);
    va_end(ap);
}

static void add_cause(pl_coord *c, const char *fmt, const char *a, const char *b)
{
    if (c->cause[0])
        appendf(c->cause, sizeof c->cause, "; ");
    appendf(c->cause, sizeof c->cause, fmt, a, b);
}

static void cplan_free(cplan *p)
{
    for (int i = 0; i < p->npipes; i++) {
        free(p->p[i].w);
        free(p->p[i].layers);
        free(p->p[i].tw);
    }
    free(p->p);
    memset(p, 0, sizeof *p);
}

static int cplan_copy(cplan *dst, const cplan *src)
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
static void cplan_describe(cplan *p)
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

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static int find(const pl_coord *c, const char *name)
{
    if (!name || !c->index_cap)
        return -1;
    size_t mask = (size_t)c->index_cap - 1;
    for (size_t k = name_hash(name) & mask;; k = (k + 1) & mask) {
        int i = c->index[k];
        if (i < 0 || strcmp(c->w[i].name, name) == 0)
            return i;
    }
}

static void index_put(pl_coord *c, int i)
{
    size_t mask = (size_t)c->index_cap - 1, k = name_hash(c->w[i].name) & mask;
    while (c->index[k] >= 0)
        k = (k + 1) & mask;
    c->index[k] = i;
}

/* Worker i, the newest (named already), into the index, which grows to stay at most
 * half full: 0, or -1 when memory ran out. */
static int index_add(pl_coord *c, int i)
{
    if (2 * c->nw > c->index_cap) {
        int cap = c->index_cap ? 2 * c->index_cap : 64;
        int *x = malloc((size_t)cap * sizeof *x);
        if (!x)
            return -1;
        for (int k = 0; k < cap; k++)
            x[k] = -1;
        free(c->index);
        c->index = x;
        c->index_cap = cap;
        for (int j = 0; j < c->nw; j++)
            if (j != i)
                index_put(c, j);
    }
    index_put(c, i);
    return 0;
}

/* The live worker of that name, or -1 (and the error). */
static int find_live(pl_coord *c, const char *name)
{
    int i = find(c, name);
    if (i < 0) {
        fail_err(c, "unknown worker \"%s\"", name ? name : "(null)");
        return -1;
    }
    if (!c->w[i].live) {
        fail_err(c, "worker \"%s\" is no longer part of the job", name);
        return -1;
    }
    return i;
}

/* The worker a duty goes to: the lowest-ranked live one not leaving; -1 when none. */
static int pick_worker(const pl_coord *c)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && !c->w[i].leaving)
            return i;
    return -1;
}

static void reassign_duties(pl_coord *c);
static void ask_completion(pl_coord *c, csaving *slot);
static void checkpoint_failed(pl_coord *c, csaving *slot, const char *why);
static void resave(pl_coord *c, csaving *slot);
static csaving *saving_slot(pl_coord *c, int64_t step);
static csaving *new_saving_slot(pl_coord *c, int64_t step);
static void forget_saving_after(pl_coord *c, int64_t step);
static void after_step(pl_coord *c);
static void node_layers(const pl_coord *c, int n, int pos, int *begin, int *end);

static pl_msg *push(pl_coord *c, int widx, int type, int64_t gen)
{
    if (c->nout == c->capout) {
        if (c->headout > 0) {
            memmove(c->out, c->out + c->headout, (size_t)(c->nout - c->headout) * sizeof *c->out);
            c->nout -= c->headout;
            c->headout = 0;
        }
        if (c->nout == c->capout) {
            int cap = c->capout ? 2 * c->capout : 64;
            outmsg *o = realloc(c->out, (size_t)cap * sizeof *o);
            if (!o)
                return NULL;
            c->out = o;
            c->capout = cap;
        }
    }
    outmsg *o = &c->out[c->nout++];
    memcpy(o->to, c->w[widx].name, sizeof o->to);
    pl_msg_init(&o->m, type, gen);
    return &o->m;
}

static void send_text(pl_coord *c, int widx, int type, int64_t gen, int64_t step, const char *why,
                      int code)
{
    pl_msg *m = push(c, widx, type, gen);
    if (!m)
        return;
    if (type == PL_MSG_START_STEP)
        m->u.start_step.step = step;
    else if (type == PL_MSG_ABORT) {
        m->u.abort_.step = step;
        snprintf(m->u.abort_.reason, sizeof m->u.abort_.reason, "%s", why);
    } else if (type == PL_MSG_STOP) {
        snprintf(m->u.stop.reason, sizeof m->u.stop.reason, "%s", why);
        m->u.stop.exit_code = code;
    }
}

static int in_pipes(const pl_coord *c, int i)
{
    return c->has_cur && c->w[i].pipe >= 0;
}

/* abort / start_step / commit to the live workers of the current pipelines. */
/* Worker i (of the current plan) was asked to write its layers of the checkpoint of step. */
static void note_writer(pl_coord *c, int i, int64_t step)
{
    cworker *w = &c->w[i];
    w->writing = step;
    node_layers(c, c->cur.p[w->pipe].nnodes, w->pos, &w->write_b, &w->write_e);
}

static void to_pipeline_workers(pl_coord *c, int type, const char *why)
{
    for (int i = 0; i < c->nw; i++) {
        if (!c->w[i].live || !in_pipes(c, i))
            continue;
        if (type == PL_MSG_COMMIT) {
            pl_msg *m = push(c, i, type, c->gen);
            if (m) {
                m->u.commit.step = c->step;
                m->u.commit.grad_scale = c->grad_scale;
                m->u.commit.lr = c->lr;
                /* pipeline 0 holds every layer once: its workers write the checkpoint */
                m->u.commit.save = c->w[i].pipe == 0 && c->commit_save;
                if (m->u.commit.save)
                    note_writer(c, i, c->step + 1);
            }
        } else {
            send_text(c, i, type, c->gen, c->step, why, 0);
        }
    }
}

static void stop_all(pl_coord *c, const char *why, int code)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live)
            send_text(c, i, PL_MSG_STOP, c->gen, 0, why, code);
}

/* Appends a committed step's record to the log: 0, or -1 when memory ran out. */
static int log_step(pl_coord *c, const pl_coord_step_rec *rec)
{
    if (c->nlog == c->caplog) {
        int cap = c->caplog ? 2 * c->caplog : 16;
        pl_coord_step_rec *x = realloc(c->log, (size_t)cap * sizeof *x);
        if (!x)
            return -1;
        c->log = x;
        c->caplog = cap;
    }
    c->log[c->nlog++] = *rec;
    return 0;
}

/* A committed step whose evaluation will not happen: logged without a validation loss. */
static void flush_eval(pl_coord *c)
{
    if (!c->eval_pending)
        return;
    c->eval_pending = 0;
    c->eval_rec.val_loss = NAN;
    log_step(c, &c->eval_rec); /* best effort: the job ends or restarts anyway */
}

static void set_failed(pl_coord *c, const char *why)
{
    flush_eval(c);
    c->reason[0] = 0;
    appendf(c->reason, sizeof c->reason, "%s", why);
    c->phase = PL_COORD_FAILED;
    stop_all(c, why, 1);
}

static void reset_step_flags(pl_coord *c)
{
    for (int i = 0; i < c->nw; i++)
        c->w[i].reported = c->w[i].reduced = c->w[i].committed = 0;
    c->scan_reduced = c->scan_committed = 0;
    c->sumsq = c->loss_sum = 0;
    c->nloss = 0;
}

static void start_step(pl_coord *c)
{
    reset_step_flags(c);
    c->step_t0 = c->now;
    c->phase = PL_COORD_RUNNING;
    to_pipeline_workers(c, PL_MSG_START_STEP, "");
}

/* The layers [begin, end) of node position pos of the template for n nodes. */
static void node_layers(const pl_coord *c, int n, int pos, int *begin, int *end)
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
static void pipe_layers(const pl_coord *c, const cpipe *cq, int pos, int *begin, int *end)
{
    if (cq->layers) {
        *begin = cq->layers[pos];
        *end = cq->layers[pos + 1];
    } else {
        node_layers(c, cq->nnodes, pos, begin, end);
    }
}

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

/* Worker i's place: node j of pipeline q of the current plan (q -1: idle). */
static void set_place(pl_coord *c, int i, int q, int j)
{
    cworker *w = &c->w[i];
    w->pipe = q;
    w->pos = j;
    w->lb = w->le = 0;
    if (q >= 0)
        pipe_layers(c, &c->cur.p[q], j, &w->lb, &w->le);
}

/* NCCL when every worker of the current plan can run it on a GPU of its own (NCCL
 * refuses two ranks on one device), else TCP. Workers not back (a restored plan's)
 * count as able: a plan that may have run NCCL has no shadows to fail over from. */
static int plan_transport(const pl_coord *c)
{
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
    pl_msg *m = push(c, i, PL_MSG_PLAN, c->gen);
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
    if (plan_pipelines(c, i, p))
        return -1;
    plan_you(c, i, p, s);
    return plan_transfers(c, i, p, s);
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

/* ---- strategy redundant (Bamboo, NSDI '23; docs/redundant.md) ----
 * Stage j of a pipeline holds stage (j + 1) mod n's layers as its shadow, the last stage
 * the first's (§5.1, the ring: pl_rc_successor); the workers do so on the TCP transport. */

/* The stable plan's shadows are there: strategy redundant on TCP, and every worker
 * installed the stable plan (a worker keeps its shadow until a step of a newer plan). */
static int rc_active(const pl_coord *c)
{
    return c->cfg.strategy_redundant && c->has_stable && c->transport == PL_TRANSPORT_TCP;
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
static int rc_failover(pl_coord *c, int nremoved, int nadded, cplan *np)
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
static int rc_local_copies(pl_coord *c, const cplan *np, ccopy *cp, int *ncp,
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

/* Re-instantiation of the stable plan for the live workers (§5.1 via
 * pl_reinstantiate): fills np and the layer copies. 0, 1 when too few
 * workers, 2 on a fatal loss (lost layers appended to c->cause), -1 with the
 * reason failed. */
static int reinstantiate(pl_coord *c, int f, const char **rm, int nrm, const char **ad, int nad,
                         cplan *np, ccopy **cp, int *ncp, int64_t *bytes_planned)
{
    /* the coverage table holds F's plans only; a lower tolerance plans from the templates */
    const pl_coverage *cov = f == c->cfg.tolerate ? c->cfg.coverage : NULL;
    pl_current_plan cur = {.npipelines = c->stable.npipes};
    pl_reinstantiation r = {0};
    char e2[512] = "";
    int rc = -1;
    cur.pipelines = calloc((size_t)c->stable.npipes, sizeof *cur.pipelines);
    const char **rm2 = calloc((size_t)c->nw + 1, sizeof *rm2);
    const char **dep = calloc((size_t)c->nw + 1, sizeof *dep);
    const char **zoned = calloc((size_t)c->nw + 1, sizeof *zoned);
    int *zid = calloc((size_t)c->nw + 1, sizeof *zid);
    char(*alias)[16] = calloc((size_t)c->nw + 1, sizeof *alias);
    int ok = cur.pipelines && rm2 && dep && zoned && zid && alias, nrm2 = nrm;
    for (int k = 0; ok && k < nrm; k++)
        rm2[k] = rm[k];
    for (int q = 0; ok && q < c->stable.npipes; q++) {
        /* a failover's pipeline as its template's, its lost workers removed too */
        const cpipe *sq = &c->stable.p[q];
        const int n = sq->tw ? sq->tn : sq->nnodes, *tw = sq->tw ? sq->tw : sq->w;
        cur.pipelines[q].nnodes = n;
        cur.pipelines[q].nodes = calloc((size_t)n, sizeof(char *));
        ok = cur.pipelines[q].nodes != NULL;
        for (int j = 0; ok && j < n; j++) {
            cur.pipelines[q].nodes[j] = c->w[tw[j]].name;
            int in_pipe = 0;
            for (int k = 0; k < sq->nnodes; k++)
                in_pipe |= sq->w[k] == tw[j];
            if (!in_pipe && c->w[tw[j]].live) {
                /* a ghost's name that a new worker took (it is added): the lost place
                 * is named as no worker can be ('~' is not a name's character) */
                snprintf(alias[tw[j]], sizeof alias[0], "~%d", tw[j]);
                cur.pipelines[q].nodes[j] = alias[tw[j]];
            }
            if (!in_pipe)
                rm2[nrm2++] = cur.pipelines[q].nodes[j];
        }
    }
    for (int k = 0; ok && k < nrm2; k++) { /* their notice lets them send still */
        const int i = find(c, rm2[k]);
        if (i >= 0 && c->w[i].departing)
            dep[cur.ndeparting++] = rm2[k];
    }
    cur.departing = dep;
    if (ok) { /* pl_reinstantiate places survivors and added workers by zone too */
        cur.nzones = zone_ids(c, zid);
        for (int i = 0; i < c->nw; i++)
            zoned[i] = c->w[i].name;
        cur.zoned = zoned;
        cur.zone_of = zid;
        cur.nzoned = c->nw;
    }
    int rrc = ok ? pl_reinstantiate(c->cfg.profile, c->cfg.templates, cov,
                                    f, c->cfg.global_batch, &cur, rm2, nrm2, ad,
                                    nad, &r, e2, sizeof e2)
                 : -1;
    for (int q = 0; cur.pipelines && q < cur.npipelines; q++)
        free(cur.pipelines[q].nodes);
    free(cur.pipelines);
    free(rm2);
    free(dep);
    free(zoned);
    free(zid);
    free(alias);
    if (rrc) {
        char why[700];
        snprintf(why, sizeof why, "re-instantiation failed: %s", ok ? e2 : "out of memory");
        set_failed(c, why);
        return -1;
    }
    if (r.fatal) {
        add_cause(c, "%s%s", "fatal: no live holder of layer", "");
        for (int k = 0; k < r.nlost; k++)
            appendf(c->cause, sizeof c->cause, "%s%d", k ? "," : " ", r.lost_layers[k]);
        rc = 2;
        goto out;
    }
    if (r.insufficient_nodes || r.npipelines == 0) {
        rc = 1;
        goto out;
    }
    int total = 0;
    for (int k = 0; k < r.ncopies; k++)
        total += r.copies[k].nlayers;
    np->p = calloc((size_t)r.npipelines, sizeof *np->p);
    *cp = calloc((size_t)(total ? total : 1), sizeof **cp);
    if (!np->p || !*cp)
        goto oom;
    np->npipes = r.npipelines;
    for (int q = 0; q < r.npipelines; q++) {
        cpipe *cq = &np->p[q];
        cq->mb = r.pipelines[q].microbatches;
        if (!(cq->w = malloc((size_t)r.pipelines[q].template_nodes * sizeof(int))))
            goto oom;
        cq->nnodes = r.pipelines[q].template_nodes;
        for (int j = 0; j < cq->nnodes; j++)
            cq->w[j] = find(c, r.pipelines[q].nodes[j]);
    }
    for (int k = 0; k < r.ncopies; k++)
        for (int j = 0; j < r.copies[k].nlayers; j++) {
            ccopy *x = &(*cp)[(*ncp)++];
            x->dest = find(c, r.copies[k].node);
            x->src = find(c, r.copies[k].layers[j].source);
            x->layer = r.copies[k].layers[j].layer;
            x->part = r.copies[k].layers[j].part;
            x->parts = r.copies[k].layers[j].parts;
            x->bytes = r.copies[k].layers[j].bytes;
        }
    *bytes_planned = r.bytes_to_copy;
    if (rc_local_copies(c, np, *cp, ncp, bytes_planned))
        goto oom;
    rc = 0;
    goto out;
oom:
    set_failed(c, "coordinator: out of memory");
out:
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
static void stop_departed(pl_coord *c, int keep_sources)
{
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].departing && !(keep_sources && c->w[i].is_source)) {
            c->w[i].departing = 0;
            send_text(c, i, PL_MSG_STOP, c->gen, 0, "left the job", 0);
        }
}

/* What changed since the stable plan. */
typedef struct {
    const char **rm, **ad; /* its workers no longer live; live workers not in it */
    int nrm, nad;
    char removed[512], added[512]; /* the same as text */
} cchange;

/* Fills ch from the stable plan (mark: scratch, one byte a worker). */
static void find_change(const pl_coord *c, char *mark, cchange *ch)
{
    for (int q = 0; q < c->stable.npipes; q++)
        for (int j = 0; j < c->stable.p[q].nnodes; j++) {
            int i = c->stable.p[q].w[j];
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

/* "w0: 8, w1: 4, w2: cannot read (why)": what each live worker reported. */
static void resume_reports(const pl_coord *c, char *buf, size_t len)
{
    buf[0] = 0;
    for (int i = 0; i < c->nw; i++) {
        const cworker *w = &c->w[i];
        if (!w->live || !w->has_ckpt)
            continue;
        if (w->ckpt_err[0])
            appendf(buf, len, "%s%s: cannot read (%s)", buf[0] ? ", " : "", w->name, w->ckpt_err);
        else
            appendf(buf, len, "%s%s: %lld", buf[0] ? ", " : "", w->name, (long long)w->ckpt_step);
    }
}

/* The newest checkpoint step a live worker can read (0: none); how many could read the
 * directory, how many could not, and whether those that could disagree. */
static int64_t newest_reported(const pl_coord *c, int *nread, int *nerr, int *differ)
{
    int64_t best = 0;
    *nread = *nerr = *differ = 0;
    for (int i = 0; i < c->nw; i++) {
        const cworker *w = &c->w[i];
        if (!w->live || !w->has_ckpt)
            continue;
        if (w->ckpt_err[0]) {
            (*nerr)++;
            continue;
        }
        *differ |= *nread && w->ckpt_step != best;
        if (!(*nread)++ || w->ckpt_step > best)
            best = w->ckpt_step;
    }
    return best;
}

/* The first plan's checkpoint: the newest complete one that a live worker reported at
 * register. 1 when the job ended here (its last step's checkpoint exists: DONE; no worker
 * can read the directory: FAILED), else 0. */
static int decide_resume(pl_coord *c)
{
    int nread, nerr, differ;
    const int64_t best = newest_reported(c, &nread, &nerr, &differ);
    char seen[400];
    resume_reports(c, seen, sizeof seen);
    if (!nread && nerr) {
        char why[512];
        snprintf(why, sizeof why, "no worker can read the checkpoint directory: %s", seen);
        set_failed(c, why);
        return 1;
    }
    if (differ || nerr)
        snprintf(c->resume_note, sizeof c->resume_note,
                 "the workers disagree on the newest checkpoint (%s): resuming from step %lld",
                 seen, (long long)best);
    c->resume_step = c->ckpt_last = c->step = best;
    if (best < c->cfg.steps)
        return 0;
    snprintf(c->reason, sizeof c->reason,
             "the checkpoint of step %lld is the last step: nothing to do", (long long)best);
    c->phase = PL_COORD_DONE;
    stop_all(c, "nothing to do", 0);
    return 1;
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

/* The next plan np: the stable plan re-instantiated, or a fresh one (the first
 * plan, or a restart from checkpoint *ckpt, which a fatal loss sets). 0, 1
 * when too few workers, -1 failed. */
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

/* The current plan to every live worker. */
static void send_plans(pl_coord *c, const ccopy *cp, int ncp)
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

/* Makes a new plan for the live workers and sends it (or enters
 * WAITING_FOR_NODES / FAILED). */
static void replan(pl_coord *c)
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
    if (!(mark = calloc((size_t)c->nw + 1, 1)) ||
        !(ch.rm = calloc((size_t)c->nw + 1, sizeof *ch.rm)) ||
        !(ch.ad = calloc((size_t)c->nw + 1, sizeof *ch.ad))) {
        set_failed(c, "coordinator: out of memory");
        goto done;
    }
    if (c->has_stable) {
        find_change(c, mark, &ch);
        if (c->cfg.max_resets > 0 && c->nrec >= c->cfg.max_resets) {
            char why[700];
            snprintf(why, sizeof why, "maxResets (%d) exceeded: %s", c->cfg.max_resets, c->cause);
            set_failed(c, why);
            goto done;
        }
    }
    int64_t ckpt = restart_step(c);
    int rc = next_plan(c, &ch, live, &ckpt, &np, &cp, &ncp, &bytes_planned);
    if (rc < 0)
        goto done;
    if (rc == 1) {
        waiting_for_nodes(c, live);
        goto done;
    }
    install_plan(c, &np, ckpt, cp, &ncp);
    c->tolerance = c->plan_tolerance;
    if (c->gen > 1)
        log_reconfig(c, ch.removed, ch.added, bytes_planned);
    c->cause[0] = 0;
    c->pending = c->join_pending = 0;
    c->reason[0] = 0;
    c->wait_since = -1;
    c->phase = PL_COORD_COPYING;
    send_plans(c, cp, ncp);
done:
    stop_departed(c, c->phase == PL_COORD_COPYING);
    cplan_free(&np);
    free(cp);
    free(mark);
    free(ch.rm);
    free(ch.ad);
}

/* The pipeline workers evaluate the state after the step of eval_rec (phase EVALUATING). */
static void start_eval(pl_coord *c)
{
    c->val_sum = 0;
    c->val_batches = 0;
    c->phase = PL_COORD_EVALUATING;
    for (int i = 0; i < c->nw; i++) {
        c->w[i].evaluated = 0;
        if (!c->w[i].live || !in_pipes(c, i))
            continue;
        pl_msg *m = push(c, i, PL_MSG_EVAL, c->gen);
        if (m)
            m->u.eval.step = c->eval_rec.step;
    }
}

static void check_copy_complete(pl_coord *c)
{
    if (c->phase != PL_COORD_COPYING)
        return;
    for (; c->scan_copy < c->nw; c->scan_copy++) {
        const cworker *w = &c->w[c->scan_copy];
        if (w->live && w->got_plan && !w->copy_done)
            return;
    }
    if (cplan_copy(&c->stable, &c->cur)) {
        set_failed(c, "coordinator: out of memory");
        return;
    }
    c->has_stable = 1;
    c->need_ckpt = 0;
    stop_departed(c, 0);
    if (c->eval_pending) /* a loss interrupted the evaluation of a committed step */
        start_eval(c);
    else if (c->step >= c->cfg.steps) /* a writer of the last checkpoint was lost */
        after_step(c);
    else
        start_step(c);
}

static void finish(pl_coord *c)
{
    flush_eval(c);
    c->phase = PL_COORD_DONE;
    stop_all(c, "done", 0);
}

/* Leaving workers stay in the plan while moving them out would leave too few workers for
 * one ((F + 1)·n0; n0 with below_minimum_degrade): they train on until they go, as
 * without a notice, rather than stopping the job early. Only while every worker of the
 * plan is live (a lost one needs its new plan now). */
static int leaving_held(const pl_coord *c)
{
    int live = 0, leaving = 0;
    for (int i = 0; i < c->nw; i++) {
        if (c->w[i].pipe >= 0 && !c->w[i].live)
            return 0;
        live += c->w[i].live;
        leaving += c->w[i].live && c->w[i].leaving;
    }
    const int need =
        (c->cfg.below_minimum_degrade ? 1 : c->cfg.tolerate + 1) * c->cfg.templates->n0;
    return leaving > 0 && live - leaving < need;
}

/* After a committed step (and its evaluation): the last checkpoint or the end, a new
 * plan at the step boundary, or the next step. */
static void after_step(pl_coord *c)
{
    if (c->step >= c->cfg.steps) {
        if (pl_checkpoint_due(c->cfg.checkpoint_dir, c->cfg.checkpoint_every, c->cfg.steps,
                              c->step) && c->ckpt_last < c->step) {
            csaving *last = saving_slot(c, c->step);
            if (last && last->failed && c->pending) { /* a writer was lost: the new plan's */
                replan(c);                            /* pipeline 0 writes it again */
                return;
            }
            c->phase = PL_COORD_SAVING; /* done when the last checkpoint is complete */
            if (last && last->failed) /* it failed before the step's commit was through */
                resave(c, last);
        } else {
            finish(c);
        }
        return;
    }
    int every = c->cfg.hosts_added_check_every > 1 ? c->cfg.hosts_added_check_every : 1;
    if ((c->pending && !leaving_held(c)) || (c->join_pending && c->step % every == 0))
        replan(c);
    else
        start_step(c);
}

/* A committed step's record in the log, then what follows the step. */
static void record_step(pl_coord *c, const pl_coord_step_rec *rec)
{
    if (log_step(c, rec))
        set_failed(c, "coordinator: out of memory");
    else
        after_step(c);
}

/* Every live pipeline worker committed: the step counts. Its record is logged now, or
 * once its evaluation is in (every eval_every-th step and the last). */
static void step_boundary(pl_coord *c)
{
    pl_coord_step_rec x = {.step = c->step, .norm = c->norm, .grad_scale = c->grad_scale,
                           .lr = c->lr, .val_loss = NAN, .generation = c->gen};
    int64_t mbs = c->cfg.global_batch / c->micro;
    x.loss = c->nloss ? c->loss_sum / (double)mbs : NAN;
    memcpy(x.pipelines, c->cur.desc, sizeof x.pipelines);
    c->step_ms[c->nstep_ms++ % PL_COORD_STEP_TIMES] = c->now - c->step_t0;
    if (c->fail_step == c->step)
        c->fail_step = -1; /* the step went through after all */
    c->step++;
    int every = c->cfg.eval_every;
    if (every > 0 && (c->step % every == 0 || c->step >= c->cfg.steps)) {
        c->eval_rec = x;
        c->eval_pending = 1;
        start_eval(c);
        return;
    }
    record_step(c, &x);
}

/* Every live pipeline worker of the plan evaluated: the validation loss is the mean over
 * the batches of every pipeline, as one process computes it over all of them. */
static void check_eval_complete(pl_coord *c)
{
    if (c->phase != PL_COORD_EVALUATING)
        return;
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && in_pipes(c, i) && !c->w[i].evaluated)
            return;
    c->eval_rec.val_loss = c->val_batches ? c->val_sum / (double)c->val_batches : NAN;
    c->eval_pending = 0;
    record_step(c, &c->eval_rec);
}

static void step_attempt_failed(pl_coord *c, const char *who, const char *why, int abort_step);

static void check_reduced_complete(pl_coord *c)
{
    if (c->phase != PL_COORD_RUNNING)
        return;
    for (; c->scan_reduced < c->nw; c->scan_reduced++) {
        const cworker *w = &c->w[c->scan_reduced];
        if (w->live && in_pipes(c, c->scan_reduced) && (!w->reported || !w->reduced))
            return;
    }
    c->norm = sqrt(c->sumsq);
    if (!isfinite(c->norm)) { /* finite shares whose sum is not */
        step_attempt_failed(c, NULL, "non-finite gradient norm (inf)", 1);
        return;
    }
    double clip = c->cfg.grad_clip;
    c->grad_scale = clip > 0 && c->norm > clip ? clip / c->norm : 1.0;
    c->lr = pl_lr_at(c->cfg.lr, c->cfg.lr_cosine, c->cfg.lr_warmup, c->cfg.lr_min_ratio,
                     (int)c->step, (int)c->cfg.steps);
    c->commit_save = pl_checkpoint_due(c->cfg.checkpoint_dir, c->cfg.checkpoint_every,
                                       c->cfg.steps, c->step + 1) ||
                     (c->ckpt_retry && c->cfg.checkpoint_dir && c->cfg.checkpoint_dir[0]);
    if (c->commit_save) {
        c->ckpt_retry = 0;
        c->ckpt_writing = c->step + 1;
    }
    c->phase = PL_COORD_COMMITTING;
    to_pipeline_workers(c, PL_MSG_COMMIT, "");
}

static void check_committed_complete(pl_coord *c)
{
    if (c->phase != PL_COORD_COMMITTING)
        return;
    for (; c->scan_committed < c->nw; c->scan_committed++) {
        const cworker *w = &c->w[c->scan_committed];
        if (w->live && in_pipes(c, c->scan_committed) && !w->committed)
            return;
    }
    step_boundary(c);
}

/* A loss needs a new plan: now, or after settle_ms without further losses so
 * that simultaneous preemptions (one zone, Bamboo §3) make one plan, not one
 * each. Step messages are ignored meanwhile (phase SETTLING). */
static void replan_soon(pl_coord *c)
{
    if (c->cfg.settle_ms <= 0) {
        replan(c);
        return;
    }
    c->phase = PL_COORD_SETTLING;
    c->replan_at = c->now + c->cfg.settle_ms;
}

/* Whether two attempts failed the same way. A NaN or inf from the job's data or model
 * shows as a non-finite loss on the workers with the head and as a non-finite gradient
 * norm on the others: whichever reports first names the attempt, so they are one kind. */
static int same_failure(const char *a, const char *b)
{
    static const char nf[] = "non-finite ";
    return !strcmp(a, b) || (!strncmp(a, nf, sizeof nf - 1) && !strncmp(b, nf, sizeof nf - 1));
}

/* An attempt at the running step failed with no loss to blame: a non-finite loss or
 * gradient norm, a worker's step_failed (who: the worker, NULL for the coordinator's own
 * finding), an evaluation that failed (abort_step 0: the step is committed). Nothing of it
 * is committed; it is redone under a new plan (new links, a new NCCL world), at most
 * PL_COORD_STEP_ATTEMPTS times in all: a failure that keeps coming back, the same way on
 * every attempt, is the job's (its data, its model), not a node's, and ends the job. */
static void step_attempt_failed(pl_coord *c, const char *who, const char *why, int abort_step)
{
    if (c->fail_step != c->step) {
        c->fail_step = c->step;
        c->fail_attempts = 0;
        c->fail_same = 1;
        snprintf(c->fail_reason, sizeof c->fail_reason, "%s", why);
    } else if (!same_failure(c->fail_reason, why)) {
        c->fail_same = 0;
    }
    c->fail_attempts++;
    if (abort_step)
        to_pipeline_workers(c, PL_MSG_ABORT, why);
    if (c->fail_attempts >= PL_COORD_STEP_ATTEMPTS) {
        char reason[700];
        snprintf(reason, sizeof reason, "step %lld failed %d times%s: %.400s",
                 (long long)c->step, c->fail_attempts,
                 c->fail_same ? ", every time the same way (a bug in the job or its data, not a "
                                "node failure)"
                              : "",
                 why);
        set_failed(c, reason);
        return;
    }
    if (who)
        add_cause(c, "step failed on %s (%.200s)", who, why);
    else
        add_cause(c, "step failed (%s%.200s)", "", why);
    replan_soon(c);
}

/* Reaction to workers already marked not live (idx[0..n)). */
/* Worker i, lost, may have been writing its layers of the checkpoint in flight (pipeline 0
 * writes it): without its `saved` that checkpoint can never complete, as the layers are
 * held by other workers now. It is given up at once, so that the next commit writes one
 * (or, for the last step's, a new plan's pipeline 0 writes it again: after_step) rather
 * than the job going on without the checkpoint it was told of, or waiting for it forever.
 * A loss is not the storage's fault: it does not count toward
 * PL_COORD_CHECKPOINT_ATTEMPTS. */
static void writer_lost(pl_coord *c, int i)
{
    cworker *w = &c->w[i];
    const int64_t step = w->writing;
    w->writing = 0;
    if (step <= c->ckpt_last || step < c->ckpt_writing)
        return; /* complete, or a newer one is being written */
    csaving *slot = saving_slot(c, step);
    if (!slot && !(slot = new_saving_slot(c, step)))
        return;
    if (slot->completing || slot->failed)
        return;
    const int b = w->write_b, e = w->write_e;
    int saved = 1;
    for (int l = b; l < e; l++)
        saved &= slot->covered[l] != 0;
    if (saved)
        return;
    slot->failed = 1;
    c->ckpt_fail_step = step;
    snprintf(c->ckpt_fail, sizeof c->ckpt_fail,
             "%s was gone before its layers [%d, %d) were saved; %s", w->name, b, e,
             step < c->cfg.steps ? "the next step writes a checkpoint"
                                 : "written again under the next plan");
    c->ckpt_failed_total++;
    if (step < c->cfg.steps)
        c->ckpt_retry = 1;
}

/* Worker i left the job (leaving, then stop) with its part of a checkpoint unreported
 * and is now gone for good (its connection or process ended): that checkpoint is given up
 * as for a loss; the last step's is written again at once by the plan's pipeline 0,
 * which it is no longer in. */
static void writer_gone_after_leaving(pl_coord *c, int i)
{
    const int64_t step = c->w[i].writing;
    if (!step || c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED)
        return;
    writer_lost(c, i);
    csaving *slot = saving_slot(c, step);
    if (slot && slot->failed && step >= c->cfg.steps && c->phase == PL_COORD_SAVING)
        resave(c, slot);
}

static void after_loss(pl_coord *c, const int *idx, int n)
{
    for (int k = 0; k < n; k++)
        writer_lost(c, idx[k]);
    int critical = 0;
    for (int k = 0; k < n; k++) {
        const cworker *w = &c->w[idx[k]];
        if ((in_pipes(c, idx[k]) && (c->phase != PL_COORD_SAVING || w->pipe == 0)) ||
            (c->phase == PL_COORD_COPYING && w->is_source))
            critical = 1;
    }
    switch (c->phase) {
    case PL_COORD_COPYING:
        if (critical) {
            replan_soon(c);
        } else {
            c->pending = 1;
            check_copy_complete(c);
        }
        break;
    case PL_COORD_RUNNING:
        if (critical) {
            to_pipeline_workers(c, PL_MSG_ABORT, "a worker of the plan was lost");
            replan_soon(c);
        } else {
            c->pending = 1;
            check_reduced_complete(c);
        }
        break;
    case PL_COORD_COMMITTING:
        c->pending = 1;
        check_committed_complete(c);
        break;
    case PL_COORD_EVALUATING: /* the step is committed: evaluated again under the new plan */
        if (critical) {
            replan_soon(c);
        } else {
            c->pending = 1;
            check_eval_complete(c);
        }
        break;
    case PL_COORD_SETTLING:
        replan_soon(c); /* one more loss of the same event: wait for the rest too */
        break;
    case PL_COORD_SAVING: {
        /* a writer lost before its `saved` (writer_lost): the survivors hold the last
         * state, the new plan's pipeline 0 writes it again (after_step) */
        const csaving *last = saving_slot(c, c->step);
        if (last && last->failed)
            replan_soon(c);
        break;
    }
    default:
        break;
    }
}

/* The planner's inputs against the configuration: 0, or -1 and err. */
static int check_planner(const pl_coord_config *cfg, const pl_profile *p, const pl_template_set *ts,
                         const pl_coverage *cov, int n_start, char *err, size_t errlen)
{
    if (!p || !ts || !cov)
        return pl_errf(err, errlen, "coordinator: profile, templates and coverage are required");
    int micro = cfg->microbatch_size ? cfg->microbatch_size : p->microbatch_size;
    if (micro != p->microbatch_size || micro < 1)
        return pl_errf(err, errlen, "microbatch_size: %d differs from the profile's %d", micro,
                       p->microbatch_size);
    if (cfg->tolerate != cov->tolerate)
        return pl_errf(err, errlen, "tolerate: %d differs from the coverage table's %d",
                       cfg->tolerate, cov->tolerate);
    if (cfg->global_batch != cov->global_batch || cfg->global_batch % micro)
        return pl_errf(err, errlen, "global_batch: %lld differs from the coverage table's %lld "
                       "or is not a multiple of %d", (long long)cfg->global_batch,
                       (long long)cov->global_batch, micro);
    if (ts->n0 < 1 || cov->count < 1)
        return pl_errf(err, errlen, "templates: no feasible template");
    if (n_start < cov->nodes_lo || n_start > PL_PROTO_MAX_NODES)
        return pl_errf(err, errlen, "n_start: %d workers cannot run a plan: need %d..%d", n_start,
                       cov->nodes_lo, PL_PROTO_MAX_NODES);
    return 0;
}

static void take_planner(pl_coord *c, const pl_profile *p, const pl_template_set *ts,
                         const pl_coverage *cov, int n_start)
{
    c->cfg.profile = p;
    c->cfg.templates = ts;
    c->cfg.coverage = cov;
    c->cfg.n_start = n_start;
    c->micro = p->microbatch_size;
    c->nlayers = p->nlayers;
    c->have_planner = 1;
}

/* The rest of the configuration: 0, or -1 and err. */
static int check_config(const pl_coord_config *cfg, char *err, size_t errlen)
{
    if (cfg->seq_len < 1 || cfg->seq_len > PL_PROTO_MAX_SEQ_LEN)
        return pl_errf(err, errlen, "seq_len: must be in 1..%d", PL_PROTO_MAX_SEQ_LEN);
    if (cfg->steps < 1 || cfg->steps > 2147483647)
        return pl_errf(err, errlen, "steps: must be >= 1");
    if (!(cfg->lr >= 0) || !(cfg->grad_clip >= 0) || !isfinite(cfg->grad_clip))
        return pl_errf(err, errlen, "lr and grad_clip: must be finite and >= 0");
    if (cfg->heartbeat_ms < PL_PROTO_HEARTBEAT_MIN_MS || cfg->heartbeat_ms > PL_PROTO_HEARTBEAT_MAX_MS)
        return pl_errf(err, errlen, "heartbeat_ms: must be in %d..%d", PL_PROTO_HEARTBEAT_MIN_MS,
                       PL_PROTO_HEARTBEAT_MAX_MS);
    if (cfg->heartbeat_misses < 0)
        return pl_errf(err, errlen, "heartbeat_misses: must be >= 0");
    if (cfg->n_start < 1 || cfg->n_start > PL_PROTO_MAX_NODES)
        return pl_errf(err, errlen, "n_start: must be in 1..%d", PL_PROTO_MAX_NODES);
    if (cfg->peer_port_base < 0 || cfg->peer_port_base > 65535)
        return pl_errf(err, errlen, "peer_port_base: must be in 0..65535");
    if (cfg->checkpoint_every < 0 || cfg->max_resets < 0 || cfg->wait_for_nodes_ms < 0 ||
        cfg->cooldown_ms < 0 || cfg->eval_every < 0)
        return pl_errf(err, errlen, "checkpoint_every, max_resets, wait_for_nodes_ms, "
                       "cooldown_ms, eval_every: must be >= 0");
    if (cfg->profile_repeat < 0 || cfg->profile_repeat > PL_PROTO_PROFILE_REPEAT_MAX)
        return pl_errf(err, errlen, "profile_repeat: must be in 0..%d", PL_PROTO_PROFILE_REPEAT_MAX);
    if (!cfg->resume_auto && (cfg->resume_step < 0 || cfg->resume_step >= cfg->steps))
        return pl_errf(err, errlen, "resume_step: %lld is not before the last step %lld",
                       (long long)cfg->resume_step, (long long)cfg->steps);
    const char *job = cfg->job ? cfg->job : "job";
    if (!*job || strlen(job) > PL_PROTO_NAME_MAX)
        return pl_errf(err, errlen, "job: bad name");
    return 0;
}

pl_coord *pl_coord_new(const pl_coord_config *cfg, char *err, size_t errlen)
{
    if (!cfg) {
        pl_errf(err, errlen, "coordinator: no configuration");
        return NULL;
    }
    const int profiling = cfg->profile_repeat > 0 && !cfg->profile;
    if ((!profiling && check_planner(cfg, cfg->profile, cfg->templates, cfg->coverage,
                                     cfg->n_start, err, errlen)) ||
        check_config(cfg, err, errlen))
        return NULL;
    pl_coord *c = calloc(1, sizeof *c);
    if (!c) {
        pl_errf(err, errlen, "coordinator: out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    c->tolerance = c->plan_tolerance = cfg->tolerate;
    snprintf(c->job, sizeof c->job, "%s", cfg->job ? cfg->job : "job");
    if (!profiling)
        take_planner(c, cfg->profile, cfg->templates, cfg->coverage, cfg->n_start);
    c->misses = cfg->heartbeat_misses ? cfg->heartbeat_misses : PL_PROTO_HEARTBEAT_MISSES;
    if (!c->cfg.peer_port_base)
        c->cfg.peer_port_base = 29500;
    c->phase = profiling ? PL_COORD_PROFILING : PL_COORD_WAITING_FOR_WORKERS;
    if (profiling)
        snprintf(c->reason, sizeof c->reason,
                 "waiting for a worker to measure the model (spec.profile: auto)");
    c->wait_since = -1;
    c->plan_ckpt = -1;
    c->profiler = -1;
    c->judge_at = -1;
    c->forgiven_gen = -1;
    c->fail_step = -1;
    c->probe_from = -1;
    c->resume_step = cfg->resume_auto ? -1 : cfg->resume_step;
    c->ckpt_last = c->resume_step > 0 ? c->resume_step : 0;
    c->step = c->ckpt_last;
    if (!c->cfg.cooldown_ms)
        c->cfg.cooldown_ms = 10000;
    return c;
}

void pl_coord_free(pl_coord *c)
{
    if (!c)
        return;
    for (int k = c->headout; k < c->nout; k++)
        pl_msg_free(&c->out[k].m);
    free(c->out);
    free(c->w);
    free(c->index);
    cplan_free(&c->cur);
    cplan_free(&c->stable);
    free(c->log);
    free(c->rec);
    for (int k = 0; k < SAVING_SLOTS; k++)
        free(c->saving[k].covered);
    free(c->nodes);
    free(c->profile_text);
    free(c->suspects);
    free(c);
}

static void note_time(pl_coord *c, int64_t now_ms)
{
    if (now_ms > c->now)
        c->now = now_ms;
    if (c->wait_since < 0 &&
        (c->phase == PL_COORD_WAITING_FOR_WORKERS || c->phase == PL_COORD_WAITING_FOR_NODES))
        c->wait_since = c->now;
}

void pl_coord_clock(pl_coord *c, int64_t now_ms)
{
    note_time(c, now_ms);
}

static cnode *node_find(pl_coord *c, const char *node)
{
    for (int k = 0; k < c->nnodes; k++)
        if (!strcmp(c->nodes[k].name, node))
            return &c->nodes[k];
    return NULL;
}

/* A worker on that node failed (not a `leaving`): from the second failure on,
 * the node is kept out for cooldown · 2^(failures−2), at most 64× (Elastic
 * Horovod's blacklist, with its cooldown so that a repaired node comes back). */
static void node_failed(pl_coord *c, const char *node)
{
    cnode *n = node_find(c, node);
    if (!n) {
        if (c->nnodes == c->capnodes) {
            int cap = c->capnodes ? 2 * c->capnodes : 8;
            cnode *x = realloc(c->nodes, (size_t)cap * sizeof *x);
            if (!x)
                return; /* best effort: the node is simply not kept out */
            c->nodes = x;
            c->capnodes = cap;
        }
        n = &c->nodes[c->nnodes++];
        memset(n, 0, sizeof *n);
        snprintf(n->name, sizeof n->name, "%s", node);
    }
    n->failures++;
    if (n->failures >= 2) {
        int shift = n->failures - 2 < 6 ? n->failures - 2 : 6;
        n->until = c->now + (c->cfg.cooldown_ms << shift);
    }
}

static void welcome(pl_coord *c, int i)
{
    pl_msg *m = push(c, i, PL_MSG_WELCOME, c->gen);
    if (!m)
        return;
    m->u.welcome.rank = c->w[i].rank;
    memcpy(m->u.welcome.job, c->job, sizeof m->u.welcome.job);
    m->u.welcome.token_ok = c->cfg.token_ok ? 1 : 0;
    m->u.welcome.heartbeat_ms = c->cfg.heartbeat_ms;
}

/* What the worker's register said about the checkpoint directory. */
static void note_checkpoint_report(cworker *w, const pl_coord_worker_info *wi)
{
    w->has_ckpt = wi->has_checkpoint != 0;
    w->ckpt_step = wi->has_checkpoint && wi->checkpoint_step > 0 ? wi->checkpoint_step : 0;
    snprintf(w->ckpt_err, sizeof w->ckpt_err, "%s",
             wi->has_checkpoint && wi->checkpoint_error ? wi->checkpoint_error : "");
}

/* A worker of the restored plan is back (its hello_resume follows). */
static int rejoin(pl_coord *c, int i, const char *host, int port, int64_t now_ms)
{
    cworker *w = &c->w[i];
    snprintf(w->host, sizeof w->host, "%s", host ? host : "127.0.0.1");
    if (port > 0)
        w->port = port;
    w->live = 1;
    w->last_heard = now_ms;
    welcome(c, i);
    return PL_COORD_OK;
}

/* The slot of a new worker of that name: a ghost's (ghost ≥ 0; the failover's template
 * keeps the slot as its lost place), else a new one, indexed. -1 out of memory. */
static int new_slot(pl_coord *c, const char *name, int ghost)
{
    int i = ghost;
    if (i < 0 && c->nw == c->capw) {
        int cap = c->capw ? 2 * c->capw : 16;
        cworker *x = realloc(c->w, (size_t)cap * sizeof *x);
        if (!x)
            return -1;
        c->w = x;
        c->capw = cap;
    }
    if (i < 0)
        i = c->nw++;
    memset(&c->w[i], 0, sizeof c->w[i]);
    snprintf(c->w[i].name, sizeof c->w[i].name, "%s", name);
    if (i != ghost && index_add(c, i)) {
        c->nw--;
        return -1;
    }
    return i;
}

int pl_coord_worker_registered(pl_coord *c, const char *name, const char *node,
                               const char *host, int port, int64_t now_ms)
{
    pl_coord_worker_info wi = {.name = name, .node = node, .host = host, .port = port};
    return pl_coord_worker_joined(c, &wi, now_ms);
}

int pl_coord_worker_joined(pl_coord *c, const pl_coord_worker_info *wi, int64_t now_ms)
{
    const char *name = wi->name, *node = wi->node, *host = wi->host;
    const int port = wi->port;
    c->err[0] = 0;
    note_time(c, now_ms);
    if (!node)
        node = name;
    if (node && (!*node || strlen(node) > PL_PROTO_NAME_MAX))
        return fail_err(c, "bad node for worker \"%s\"", name ? name : "(null)");
    if (!name || !*name || strlen(name) > PL_PROTO_NAME_MAX)
        return fail_err(c, "bad worker name");
    if (host && (!*host || strlen(host) > PL_PROTO_HOST_MAX))
        return fail_err(c, "bad host for worker \"%s\"", name);
    if (port > 65535)
        return fail_err(c, "bad port %d for worker \"%s\"", port, name);
    if ((wi->zone && strlen(wi->zone) > PL_PROTO_NAME_MAX) ||
        (wi->device && strlen(wi->device) > PL_PROTO_NAME_MAX))
        return fail_err(c, "bad zone or device for worker \"%s\"", name);
    if (c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED)
        return fail_err(c, "the job is %s", c->phase == PL_COORD_DONE ? "finished" : "failed");
    int old = find(c, name);
    if (old >= 0 && c->w[old].live)
        return fail_err(c, "a worker named \"%s\" is already registered", name);
    if (old >= 0 && c->phase == PL_COORD_RESUMING && c->w[old].restored) {
        if (wi->zone && wi->zone[0])
            snprintf(c->w[old].zone, sizeof c->w[old].zone, "%s", wi->zone);
        snprintf(c->w[old].device, sizeof c->w[old].device, "%s", wi->device ? wi->device : "");
        c->w[old].nccl = wi->nccl != 0;
        note_checkpoint_report(&c->w[old], wi);
        return rejoin(c, old, host, port, now_ms);
    }
    if (old >= 0 && !c->w[old].ghost)
        return fail_err(c, "worker \"%s\" was removed from the job; use a new name", name);
    if (pl_coord_live_workers(c) >= PL_PROTO_MAX_NODES || c->nw >= PL_PROTO_MAX_RANK)
        return fail_err(c, "too many workers (%d)", PL_PROTO_MAX_NODES);
    const cnode *cn = node_find(c, node);
    if (cn && cn->until > now_ms)
        return fail_err(c, "node %s is kept out for %lld s more after %d failures", node,
                        (long long)((cn->until - now_ms + 999) / 1000), cn->failures);
    int i = new_slot(c, name, old);
    if (i < 0)
        return fail_err(c, "out of memory");
    cworker *w = &c->w[i];
    snprintf(w->node, sizeof w->node, "%s", node);
    snprintf(w->host, sizeof w->host, "%s", host ? host : "127.0.0.1");
    w->rank = i;
    w->port = port > 0 ? port : c->cfg.peer_port_base + i;
    if (w->port > 65535)
        w->port = 1 + (w->port - 1) % 65535;
    snprintf(w->zone, sizeof w->zone, "%s", wi->zone ? wi->zone : "");
    snprintf(w->device, sizeof w->device, "%s", wi->device ? wi->device : "");
    w->nccl = wi->nccl != 0;
    w->live = 1;
    w->last_heard = now_ms;
    set_place(c, i, -1, -1);
    note_checkpoint_report(w, wi);
    welcome(c, i);
    reassign_duties(c); /* a duty nobody could take (no live worker) */
    if (c->phase == PL_COORD_PROFILING) {
        /* placed once the planner is known */
    } else if (c->phase == PL_COORD_RESUMING) {
        add_cause(c, "joined %s%s", name, "");
    } else if (c->phase == PL_COORD_WAITING_FOR_WORKERS) {
        if (pl_coord_live_workers(c) >= c->cfg.n_start)
            replan(c);
    } else if (c->phase == PL_COORD_WAITING_FOR_NODES) {
        add_cause(c, "joined %s%s", name, "");
        replan(c);
    } else {
        add_cause(c, "joined %s%s", name, "");
        c->join_pending = 1; /* placed at the next check (hostsAddedCheckEvery) */
    }
    return PL_COORD_OK;
}

static int heard(pl_coord *c, const char *name, int64_t now_ms)
{
    note_time(c, now_ms);
    int i = find_live(c, name);
    if (i < 0)
        return -1;
    if (now_ms > c->w[i].last_heard)
        c->w[i].last_heard = now_ms;
    return i;
}

int pl_coord_heartbeat(pl_coord *c, const char *name, int64_t step, int64_t now_ms)
{
    c->err[0] = 0;
    (void)step;
    return heard(c, name, now_ms) < 0 ? PL_COORD_ERR : PL_COORD_OK;
}

/* The live worker for a message of generation gen, or -1 with *rc set. */
static int gen_check(pl_coord *c, const char *name, int64_t gen, int *rc)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0) {
        *rc = PL_COORD_ERR;
        return -1;
    }
    if (gen != c->gen) {
        *rc = gen < c->gen ? PL_COORD_IGNORED
                           : fail_err(c, "worker \"%s\": generation %lld is ahead of %lld", name,
                                      (long long)gen, (long long)c->gen);
        return -1;
    }
    return i;
}

/* A step message for the running step from a pipeline worker? */
static int step_check(pl_coord *c, const char *name, int64_t gen, int64_t step,
                      pl_coord_phase_t phase, int *rc)
{
    int i = gen_check(c, name, gen, rc);
    if (i < 0)
        return -1;
    if (c->phase != phase || step != c->step || !in_pipes(c, i)) {
        *rc = PL_COORD_IGNORED;
        return -1;
    }
    return i;
}

int pl_coord_report(pl_coord *c, const char *name, int64_t gen, const pl_msg_report *r)
{
    int rc = PL_COORD_OK;
    if (!r)
        return fail_err(c, "report: NULL");
    int i = step_check(c, name, gen, r->step, PL_COORD_RUNNING, &rc);
    if (i < 0)
        return rc;
    if (c->w[i].reported)
        return PL_COORD_IGNORED;
    c->w[i].reported = 1;
    const int bad_loss = r->has_loss && !isfinite(r->loss);
    if (bad_loss || !isfinite(r->grad_sumsq)) { /* never committed: abort at once */
        char why[96];
        const double v = bad_loss ? r->loss : r->grad_sumsq;
        snprintf(why, sizeof why, "non-finite %s (%s)", bad_loss ? "loss" : "gradient norm",
                 isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        step_attempt_failed(c, name, why, 1);
        return PL_COORD_OK;
    }
    c->sumsq += r->grad_sumsq;
    if (r->has_loss) {
        c->loss_sum += r->loss;
        c->nloss++;
    }
    check_reduced_complete(c);
    return PL_COORD_OK;
}

int pl_coord_reduced(pl_coord *c, const char *name, int64_t gen, int64_t step)
{
    int rc = PL_COORD_OK;
    int i = step_check(c, name, gen, step, PL_COORD_RUNNING, &rc);
    if (i < 0)
        return rc;
    if (c->w[i].reduced)
        return PL_COORD_IGNORED;
    c->w[i].reduced = 1;
    check_reduced_complete(c);
    return PL_COORD_OK;
}

int pl_coord_committed(pl_coord *c, const char *name, int64_t gen, int64_t step)
{
    int rc = PL_COORD_OK;
    int i = step_check(c, name, gen, step, PL_COORD_COMMITTING, &rc);
    if (i < 0)
        return rc;
    if (c->w[i].committed)
        return PL_COORD_IGNORED;
    c->w[i].committed = 1;
    check_committed_complete(c);
    return PL_COORD_OK;
}

int pl_coord_copy_done(pl_coord *c, const char *name, int64_t gen, int64_t bytes)
{
    int rc = PL_COORD_OK;
    int i = gen_check(c, name, gen, &rc);
    if (i < 0)
        return rc;
    if (c->phase != PL_COORD_COPYING || !c->w[i].got_plan || c->w[i].copy_done)
        return PL_COORD_IGNORED;
    c->w[i].copy_done = 1;
    if (c->nrec > 0 && c->rec[c->nrec - 1].generation == c->gen && bytes > 0)
        c->rec[c->nrec - 1].bytes_copied += bytes;
    check_copy_complete(c);
    return PL_COORD_OK;
}

int pl_coord_eval_done(pl_coord *c, const char *name, int64_t gen, const pl_msg_eval_done *e)
{
    int rc = PL_COORD_OK;
    if (!e)
        return fail_err(c, "eval_done: NULL");
    int i = gen_check(c, name, gen, &rc);
    if (i < 0)
        return rc;
    if (c->phase != PL_COORD_EVALUATING || e->step != c->eval_rec.step || !in_pipes(c, i) ||
        c->w[i].evaluated)
        return PL_COORD_IGNORED;
    c->w[i].evaluated = 1;
    if (e->has_loss) {
        c->val_sum += e->loss;
        c->val_batches += e->batches;
    }
    check_eval_complete(c);
    return PL_COORD_OK;
}

static int cmp_i64(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The median time of the last committed steps; -1 before PL_COORD_STEP_TIMES_MIN were
 * timed (the first steps warm up). */
static int64_t median_step_ms(const pl_coord *c)
{
    if (c->nstep_ms < PL_COORD_STEP_TIMES_MIN)
        return -1;
    int64_t t[PL_COORD_STEP_TIMES];
    const int n = c->nstep_ms < PL_COORD_STEP_TIMES ? c->nstep_ms : PL_COORD_STEP_TIMES;
    memcpy(t, c->step_ms, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_i64);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* How long sending worker i's layers takes over the profile's inter-node link; without
 * one, half the grace period is kept for it. */
static int64_t copy_ms(const pl_coord *c, int i, int64_t grace_ms)
{
    const pl_profile *p = c->cfg.profile;
    if (!p || p->inter_node_GBps <= 0)
        return grace_ms / 2;
    const int64_t bytes = pl_profile_state_bytes(p, c->w[i].lb, c->w[i].le);
    return pl_transfer_ns(bytes, p->inter_node_GBps) / 1000000;
}

/* Plan worker i's notice of grace_ms ends before the running step's expected end (its
 * median time) and the copies from it: the step is better given up now than the worker
 * lost at its deadline, its layers with it. Not while the leaving workers are held in the
 * plan (leaving_held): they train on then. */
static int notice_outlasts_step(const pl_coord *c, int i, int64_t grace_ms)
{
    const int64_t median = median_step_ms(c);
    if (c->phase != PL_COORD_RUNNING || !in_pipes(c, i) || grace_ms <= 0 || median < 0 ||
        leaving_held(c))
        return 0;
    return median - (c->now - c->step_t0) + copy_ms(c, i, grace_ms) > grace_ms;
}

/* Worker i's notice came while the plan's copies run, and the plan holds it (a stage, or a
 * copy source): its copies are planned again now, with it a departing source, rather than
 * finished, a step trained and planned again at the boundary; its grace may end first. */
static int notice_during_copies(const pl_coord *c, int i)
{
    return c->phase == PL_COORD_COPYING && (in_pipes(c, i) || c->w[i].is_source) &&
           !leaving_held(c);
}

int pl_coord_leaving(pl_coord *c, const char *name, int reason, int64_t grace_ms)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0)
        return PL_COORD_ERR;
    if (c->w[i].leaving)
        return PL_COORD_IGNORED;
    c->w[i].leaving = 1;
    add_cause(c, "leaving %s (%s)", name, pl_leave_reason_name(reason));
    switch (c->phase) {
    case PL_COORD_WAITING_FOR_WORKERS:
    case PL_COORD_WAITING_FOR_NODES:
    case PL_COORD_PROFILING:
        send_text(c, i, PL_MSG_STOP, c->gen, 0, "left the job", 0);
        c->w[i].live = 0;
        reassign_duties(c);
        break;
    case PL_COORD_DONE:
    case PL_COORD_FAILED:
        break;
    default:
        if (notice_outlasts_step(c, i, grace_ms)) {
            to_pipeline_workers(c, PL_MSG_ABORT, "a worker's notice ends before the step");
            replan_soon(c); /* its plan makes the leaving workers copy sources */
        } else if (notice_during_copies(c, i)) {
            replan_soon(c);
        } else {
            c->pending = 1; /* at the step boundary */
        }
        break;
    }
    return PL_COORD_OK;
}

int pl_coord_worker_lost(pl_coord *c, const char *name, const char *cause)
{
    c->err[0] = 0;
    int i = find(c, name);
    if (i < 0)
        return fail_err(c, "unknown worker \"%s\"", name ? name : "(null)");
    if (!c->w[i].live) { /* gone after its stop (it left): a write it had yet to report */
        writer_gone_after_leaving(c, i);
        const int owed = c->w[i].departing && c->phase == PL_COORD_COPYING && c->w[i].is_source;
        c->w[i].departing = 0;
        if (!owed)
            return PL_COORD_IGNORED;
        /* its notice ran out before its copies were done: planned again without it */
        add_cause(c, "lost %s (%s) before its copies were sent", name, cause ? cause : "?");
        replan_soon(c);
        return PL_COORD_OK;
    }
    c->w[i].live = 0;
    add_cause(c, "lost %s (%s)", name, cause ? cause : "?");
    if (!c->w[i].leaving)
        node_failed(c, c->w[i].node);
    after_loss(c, &i, 1);
    reassign_duties(c);
    return PL_COORD_OK;
}

/* A worker taken out while its control connection may still be open (its links or its
 * heartbeats failed): told to exit, so that its Pod or process ends and is replaced
 * rather than idling outside the job. */
static void stop_removed(pl_coord *c, int i, const char *why)
{
    char reason[600];
    snprintf(reason, sizeof reason, "removed from the job: %s", why);
    send_text(c, i, PL_MSG_STOP, c->gen, 0, reason, 1);
}

/* Distinct live workers that share a reported broken link with worker w. */
static int broken_links(const pl_coord *c, int w)
{
    int n = 0;
    for (int k = 0; k < c->nsuspects; k++) {
        const cpair *p = &c->suspects[k];
        int other = p->reporter == w ? p->peer : p->peer == w ? p->reporter : -1;
        if (other < 0 || !c->w[other].live || !c->w[w].live)
            continue;
        int seen = 0;
        for (int j = 0; j < k && !seen; j++) {
            const cpair *q = &c->suspects[j];
            seen = (q->reporter == w && q->peer == other) || (q->peer == w && q->reporter == other);
        }
        n += !seen;
    }
    return n;
}

/* The live worker at the other end of w's first reported broken link. */
static int broken_partner(const pl_coord *c, int w)
{
    for (int k = 0; k < c->nsuspects; k++) {
        const cpair *p = &c->suspects[k];
        int other = p->reporter == w ? p->peer : p->peer == w ? p->reporter : -1;
        if (other >= 0 && c->w[other].live)
            return other;
    }
    return -1;
}

/* A link that broke with no other broken link beside it names no culprit (a frame
 * altered on the way, a reset): the first time, the plan is made again with both ends
 * (a running step is aborted and redone); the same link broken again within two
 * generations loses one of them. */
static int forgive_lone_link(pl_coord *c, int w)
{
    const int other = broken_partner(c, w);
    const cpair *f = &c->forgiven;
    const int again = c->forgiven_gen >= 0 && c->gen - c->forgiven_gen <= 2 &&
                      ((f->reporter == w && f->peer == other) ||
                       (f->reporter == other && f->peer == w));
    if (again)
        return 0;
    c->forgiven = (cpair){w, other};
    c->forgiven_gen = c->gen;
    char why[2 * sizeof(pl_proto_name) + 40];
    snprintf(why, sizeof why, "the link between %s and %s broke", c->w[w].name,
             other >= 0 ? c->w[other].name : "?");
    if (c->phase == PL_COORD_RUNNING || c->phase == PL_COORD_COPYING ||
        c->phase == PL_COORD_COMMITTING || c->phase == PL_COORD_EVALUATING) {
        if (c->phase == PL_COORD_RUNNING) /* no attempt counted: it happens once */
            to_pipeline_workers(c, PL_MSG_ABORT, why);
        add_cause(c, "%s%s", why, "");
        replan_soon(c);
    }
    return 1;
}

/* The reports weighed together: while a reported link joins two live workers, the one
 * with the most broken links is lost (a node cut off from its peers is reported by each
 * of them, and reports each of them); a tie goes to the peer reported first, once the
 * same lone link broke twice (forgive_lone_link). */
static void judge_peers(pl_coord *c)
{
    c->judge_at = -1;
    if (c->suspects_gen != c->gen)
        c->nsuspects = 0; /* the links they were about are gone */
    for (;;) {
        int lost = -1, most = 0;
        for (int k = 0; k < c->nsuspects; k++) {
            const int cand[2] = {c->suspects[k].peer, c->suspects[k].reporter};
            for (int j = 0; j < 2; j++) {
                int n = broken_links(c, cand[j]);
                if (n > most) {
                    most = n;
                    lost = cand[j];
                }
            }
        }
        if (lost < 0 || (most == 1 && forgive_lone_link(c, lost)))
            break;
        char why[512] = "peer_broken: its links to";
        for (int k = 0, first = 1; k < c->nsuspects; k++) {
            const cpair *p = &c->suspects[k];
            int other = p->peer == lost ? p->reporter : p->reporter == lost ? p->peer : -1;
            if (other >= 0 && c->w[other].live && !strstr(why, c->w[other].name)) {
                appendf(why, sizeof why, "%s %s", first ? "" : ",", c->w[other].name);
                first = 0;
            }
        }
        appendf(why, sizeof why, " broke");
        pl_coord_worker_lost(c, c->w[lost].name, why);
        stop_removed(c, lost, why);
    }
    c->nsuspects = 0;
}

/* Every worker that registered failed, each with the same fatal error, and at least
 * min(n_start, 2) of them: the job is at fault, not its nodes (Elastic Horovod's rule). */
static int same_failure_everywhere(const pl_coord *c)
{
    const int enough = c->cfg.n_start < 2 ? c->cfg.n_start : 2;
    return c->fatal_same && c->nfatal >= enough && pl_coord_live_workers(c) == 0;
}

int pl_coord_fatal(pl_coord *c, const char *name, const char *reason)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0)
        return PL_COORD_ERR;
    if (!reason || !reason[0])
        return fail_err(c, "worker \"%s\": fatal without a reason", name);
    if (c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED)
        return PL_COORD_IGNORED; /* it exits anyway */
    /* a reason another worker gave too is the job's: its node is not to blame */
    const int repeated = c->nfatal > 0 && !strncmp(c->fatal_reason, reason,
                                                   sizeof c->fatal_reason - 1);
    if (!c->nfatal) {
        snprintf(c->fatal_reason, sizeof c->fatal_reason, "%s", reason);
        c->fatal_same = 1;
    } else if (!repeated) {
        c->fatal_same = 0;
    }
    c->nfatal++;
    cworker *w = &c->w[i];
    send_text(c, i, PL_MSG_STOP, c->gen, 0, reason, 1);
    w->live = 0;
    add_cause(c, "failed %s (%.200s)", name, reason);
    if (!repeated && !w->leaving)
        node_failed(c, w->node);
    if (same_failure_everywhere(c)) {
        char why[700];
        snprintf(why, sizeof why, "every worker failed the same way (%d workers): %.400s; a bug "
                 "in the job or its data, not a node failure", c->nfatal, c->fatal_reason);
        set_failed(c, why);
        return PL_COORD_OK;
    }
    after_loss(c, &i, 1);
    reassign_duties(c);
    return PL_COORD_OK;
}

int pl_coord_peer_broken(pl_coord *c, const char *name, int64_t gen, const char *peer)
{
    int rc = PL_COORD_OK;
    int i = gen_check(c, name, gen, &rc);
    if (i < 0)
        return rc;
    int p = find(c, peer);
    if (p < 0 || p == i || !c->w[p].live)
        return PL_COORD_IGNORED;
    if (c->suspects_gen != gen)
        c->nsuspects = 0;
    if (c->nsuspects == c->capsuspects) {
        int cap = c->capsuspects ? 2 * c->capsuspects : 8;
        cpair *np = realloc(c->suspects, (size_t)cap * sizeof *np);
        if (!np)
            return fail_err(c, "out of memory");
        c->suspects = np;
        c->capsuspects = cap;
    }
    c->suspects[c->nsuspects++] = (cpair){i, p};
    c->suspects_gen = gen;
    if (c->judge_at < 0)
        c->judge_at = c->now + c->cfg.peer_judge_ms;
    if (c->cfg.peer_judge_ms <= 0)
        judge_peers(c);
    return PL_COORD_OK;
}

/* A worker's step failed with no loss known here (an NCCL error or deadline, a broken
 * link): nothing else would end that step, so it is aborted and the plan made again in
 * a new generation (new links, a new NCCL world). A loss behind the failure joins the
 * same plan (SETTLING); PL_COORD_STEP_ATTEMPTS and maxResets bound a failure that keeps
 * coming back. */
static int step_failed(pl_coord *c, const char *name, int64_t gen, int64_t step,
                       const char *reason)
{
    int rc = PL_COORD_OK;
    if (c->phase == PL_COORD_EVALUATING && c->eval_pending && step == c->eval_rec.step) {
        /* the evaluation of a committed step: a new plan, and the evaluation under it */
        int i = gen_check(c, name, gen, &rc);
        if (i < 0 || !in_pipes(c, i))
            return i < 0 ? rc : PL_COORD_IGNORED;
        char why[PL_PROTO_TEXT_MAX + 32];
        snprintf(why, sizeof why, "evaluation: %s", reason);
        step_attempt_failed(c, name, why, 0);
        return PL_COORD_OK;
    }
    if (step_check(c, name, gen, step, PL_COORD_RUNNING, &rc) < 0)
        return rc;
    step_attempt_failed(c, name, reason, 1);
    return PL_COORD_OK;
}

/* The plan's rank 0 (the first stage of pipeline 0) made the NCCL id of its
 * generation: every worker of the plan, the root too, gets it in nccl_init and
 * creates the plan's communicator from it. An id of a replaced plan is dropped. */
static int nccl_root(pl_coord *c, const char *name, int64_t gen, const char *id)
{
    if (gen != c->gen || !c->has_cur || c->transport != PL_TRANSPORT_NCCL)
        return PL_COORD_OK;
    if (c->cur.npipes < 1 || c->cur.p[0].nnodes < 1 || c->cur.p[0].w[0] != find(c, name))
        return fail_err(c, "worker \"%s\": nccl_root, but rank 0 of generation %lld is another",
                        name, (long long)gen);
    for (int q = 0; q < c->cur.npipes; q++)
        for (int j = 0; j < c->cur.p[q].nnodes; j++) {
            pl_msg *m = push(c, c->cur.p[q].w[j], PL_MSG_NCCL_INIT, c->gen);
            if (!m) {
                set_failed(c, "coordinator: out of memory");
                return PL_COORD_ERR;
            }
            snprintf(m->u.nccl_init.id, sizeof m->u.nccl_init.id, "%s", id);
        }
    return PL_COORD_OK;
}

int pl_coord_saved(pl_coord *c, const char *name, const pl_msg_saved *sv)
{
    c->err[0] = 0;
    if (!sv)
        return fail_err(c, "saved: NULL");
    if (find(c, name) < 0)
        return fail_err(c, "unknown worker \"%s\"", name ? name : "(null)");
    /* any generation: the state after step s is the same in every plan */
    if (c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED || sv->step <= c->ckpt_last ||
        sv->step > c->cfg.steps || sv->layer_end > c->nlayers)
        return PL_COORD_IGNORED;
    csaving *slot = saving_slot(c, sv->step);
    if (!slot && !(slot = new_saving_slot(c, sv->step)))
        return fail_err(c, "out of memory");
    if (slot->completing || slot->failed)
        return PL_COORD_IGNORED;
    if (sv->error[0]) {
        char why[PL_PROTO_TEXT_MAX + 64];
        snprintf(why, sizeof why, "%.400s (layers [%d, %d) on %s)", sv->error, sv->layer_begin,
                 sv->layer_end, name);
        checkpoint_failed(c, slot, why);
        return PL_COORD_OK;
    }
    cworker *w = &c->w[find(c, name)];
    if (w->writing == sv->step)
        w->writing = 0; /* reported */
    memset(slot->covered + sv->layer_begin, 1, (size_t)(sv->layer_end - sv->layer_begin));
    for (int l = 0; l < c->nlayers; l++)
        if (!slot->covered[l])
            return PL_COORD_OK;
    slot->completing = 1; /* every layer is written: one worker writes checkpoint.json */
    ask_completion(c, slot);
    return PL_COORD_OK;
}

/* A checkpoint slot emptied (its step 0: free). */
static void clear_slot(csaving *slot)
{
    free(slot->covered);
    memset(slot, 0, sizeof *slot);
}

/* A restart from the checkpoint of `step`: the attempts at later checkpoints, failed with
 * their writers or in flight, are void; those steps' checkpoints are written afresh when
 * their commits come again (a failed slot left would ignore the new attempt's `saved`). */
static void forget_saving_after(pl_coord *c, int64_t step)
{
    for (int k = 0; k < SAVING_SLOTS; k++)
        if (c->saving[k].step > step)
            clear_slot(&c->saving[k]);
    if (c->ckpt_writing > step)
        c->ckpt_writing = 0;
    c->ckpt_retry = 0;
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].writing > step)
            c->w[i].writing = 0;
}

/* Frees the slots of checkpoints up to `step` (complete, or given up). */
static void drop_saving(pl_coord *c, int64_t step)
{
    for (int k = 0; k < SAVING_SLOTS; k++)
        if (c->saving[k].step && c->saving[k].step <= step)
            clear_slot(&c->saving[k]);
}

int pl_coord_checkpoint_done(pl_coord *c, const char *name, int64_t step, const char *error)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0)
        return PL_COORD_ERR;
    csaving *slot = NULL;
    for (int k = 0; k < SAVING_SLOTS && !slot; k++)
        if (c->saving[k].step == step && c->saving[k].completing)
            slot = &c->saving[k];
    if (!slot || slot->asked != i)
        return PL_COORD_IGNORED; /* asked of another worker since, or complete already */
    if (error && error[0]) {
        char why[PL_PROTO_TEXT_MAX + 64];
        snprintf(why, sizeof why, "%.400s (on %s)", error, name);
        checkpoint_failed(c, slot, why);
        return PL_COORD_OK;
    }
    /* an older checkpoint completing after a newer one failed does not end the run of
     * failures in a row */
    if (step >= c->ckpt_fail_step)
        c->ckpt_failures = 0;
    if (step > c->ckpt_last)
        c->ckpt_last = step;
    drop_saving(c, c->ckpt_last);
    if (c->phase == PL_COORD_SAVING && c->ckpt_last >= c->cfg.steps)
        finish(c);
    return PL_COORD_OK;
}

/* The last checkpoint written again: pipeline 0's workers (every layer once) hold the
 * state after the last step, unchanged since; each writes its layers anew (save) and
 * answers saved. */
static void resave(pl_coord *c, csaving *slot)
{
    memset(slot->covered, 0, (size_t)c->nlayers);
    slot->failed = slot->completing = 0;
    slot->asked = -1;
    c->ckpt_writing = slot->step;
    for (int i = 0; i < c->nw; i++) {
        if (!c->w[i].live || !in_pipes(c, i) || c->w[i].pipe != 0)
            continue;
        pl_msg *m = push(c, i, PL_MSG_SAVE, c->gen);
        if (m)
            m->u.save.step = slot->step;
        note_writer(c, i, slot->step);
    }
}

/* A checkpoint attempt failed (a layer or its checkpoint.json not written): it is given up
 * and the next checkpoint retries, at the next commit, or for the last step's, written
 * again at once. PL_COORD_CHECKPOINT_ATTEMPTS in a row fail the job: a job whose
 * checkpoints cannot be written must not end as if it had them. */
static void checkpoint_failed(pl_coord *c, csaving *slot, const char *why)
{
    c->ckpt_fail_step = slot->step;
    snprintf(c->ckpt_fail, sizeof c->ckpt_fail, "%s", why);
    slot->failed = 1;
    slot->completing = 0;
    c->ckpt_failed_total++;
    if (++c->ckpt_failures >= PL_COORD_CHECKPOINT_ATTEMPTS) {
        char reason[700];
        snprintf(reason, sizeof reason, "checkpoints cannot be written: %d attempts in a row "
                 "failed, the last (step %lld): %.400s", c->ckpt_failures,
                 (long long)slot->step, why);
        set_failed(c, reason);
        return;
    }
    if (slot->step < c->cfg.steps)
        c->ckpt_retry = 1;
    else if (c->phase == PL_COORD_SAVING)
        resave(c, slot);
    /* else: the last step's commit is not through yet; SAVING writes it again */
}

/* A slot for the checkpoint of `step`, in place of the oldest one; NULL: out of memory. */
static csaving *new_saving_slot(pl_coord *c, int64_t step)
{
    csaving *slot = &c->saving[0];
    for (int k = 1; k < SAVING_SLOTS; k++)
        if (c->saving[k].step < slot->step)
            slot = &c->saving[k];
    clear_slot(slot);
    slot->asked = -1;
    if (!(slot->covered = calloc((size_t)c->nlayers, 1)))
        return NULL;
    slot->step = step;
    return slot;
}

/* The slot of the checkpoint of `step`, or NULL. */
static csaving *saving_slot(pl_coord *c, int64_t step)
{
    for (int k = 0; k < SAVING_SLOTS; k++)
        if (c->saving[k].step == step)
            return &c->saving[k];
    return NULL;
}

/* complete_checkpoint of the slot's step to a worker (none live: a later one is asked). */
static void ask_completion(pl_coord *c, csaving *slot)
{
    slot->asked = pick_worker(c);
    if (slot->asked < 0)
        return;
    pl_msg *m = push(c, slot->asked, PL_MSG_COMPLETE_CHECKPOINT, c->gen);
    if (m)
        m->u.complete_checkpoint.step = slot->step;
}

/* profile_request to a worker (none live: the next to register is asked). */
static void ask_profile(pl_coord *c)
{
    c->profiler = pick_worker(c);
    if (c->profiler < 0) {
        snprintf(c->reason, sizeof c->reason,
                 "waiting for a worker to measure the model (spec.profile: auto)");
        return;
    }
    pl_msg *m = push(c, c->profiler, PL_MSG_PROFILE_REQUEST, c->gen);
    if (m)
        m->u.profile_request.repeat = c->cfg.profile_repeat;
    snprintf(c->reason, sizeof c->reason, "measuring the model on %s (spec.profile: auto)",
             c->w[c->profiler].name);
}

/* Duties whose worker is gone (or that found no live worker) go to another one. */
static void reassign_duties(pl_coord *c)
{
    if (c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED)
        return;
    if (c->phase == PL_COORD_PROFILING && !c->profile_text &&
        (c->profiler < 0 || !c->w[c->profiler].live))
        ask_profile(c);
    for (int k = 0; k < SAVING_SLOTS; k++) {
        csaving *slot = &c->saving[k];
        if (!slot->completing || (slot->asked >= 0 && c->w[slot->asked].live))
            continue;
        ask_completion(c, slot);
        if (slot->asked < 0 && c->phase == PL_COORD_SAVING && slot->step >= c->cfg.steps) {
            snprintf(c->reason, sizeof c->reason, "the last checkpoint is incomplete: no worker "
                     "left to write its checkpoint.json");
            finish(c);
        }
    }
}

int pl_coord_profile_done(pl_coord *c, const char *name, const char *profile, const char *error)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0)
        return PL_COORD_ERR;
    if (c->phase != PL_COORD_PROFILING || i != c->profiler || c->profile_text)
        return PL_COORD_IGNORED;
    char why[700];
    if (!profile) {
        snprintf(why, sizeof why, "measuring the model on %s failed: %s", name,
                 error && error[0] ? error : "no profile");
        set_failed(c, why);
        return PL_COORD_OK;
    }
    if (!(c->profile_text = strdup(profile))) {
        set_failed(c, "coordinator: out of memory");
        return PL_COORD_ERR;
    }
    c->profiler = -1;
    snprintf(c->reason, sizeof c->reason, "the model was measured on %s: planning", name);
    return PL_COORD_OK;
}

int pl_coord_set_planner(pl_coord *c, const pl_profile *profile, const pl_template_set *ts,
                         const pl_coverage *coverage, int n_start)
{
    c->err[0] = 0;
    if (c->have_planner)
        return fail_err(c, "the planner is known already");
    if (c->phase != PL_COORD_PROFILING)
        return PL_COORD_IGNORED; /* the job ended meanwhile */
    char why[512];
    if (check_planner(&c->cfg, profile, ts, coverage, n_start, why, sizeof why)) {
        set_failed(c, why);
        return fail_err(c, "%s", why);
    }
    take_planner(c, profile, ts, coverage, n_start);
    c->phase = PL_COORD_WAITING_FOR_WORKERS;
    c->reason[0] = 0;
    c->wait_since = c->now;
    if (pl_coord_live_workers(c) >= n_start)
        replan(c);
    return PL_COORD_OK;
}

/* Every restored worker is back, or the wait is over: settle the step that was
 * in flight, then plan from the restored plan without the missing workers. */
static void resume_done(pl_coord *c)
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
            pl_msg *m = push(c, i, PL_MSG_COMMIT, c->gen);
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
    c->transport = plan_transport(c); /* a failover needs the shadows of TCP */
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
    if (find(c, name) >= 0)
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
    c->resume_at = -1;
    c->phase = PL_COORD_RESUMING;
    return PL_COORD_OK;
}

int pl_coord_hello_resume(pl_coord *c, const char *name, int64_t gen,
                          const pl_msg_hello_resume *h)
{
    c->err[0] = 0;
    int i = find_live(c, name);
    if (i < 0)
        return PL_COORD_ERR;
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

int pl_coord_set_zone(pl_coord *c, const char *name, const char *zone)
{
    c->err[0] = 0;
    int i = find(c, name);
    if (i < 0)
        return fail_err(c, "unknown worker \"%s\"", name ? name : "(null)");
    if (!zone || strlen(zone) > PL_PROTO_NAME_MAX)
        return fail_err(c, "bad zone for worker \"%s\"", name);
    snprintf(c->w[i].zone, sizeof c->w[i].zone, "%s", zone);
    return PL_COORD_OK;
}

int pl_coord_plan_pipeline(const pl_coord *c, int q, const char **names, int max,
                           int64_t *microbatches)
{
    if (!c->has_stable || q < 0 || q >= c->stable.npipes)
        return -1;
    const cpipe *p = &c->stable.p[q];
    if (microbatches)
        *microbatches = p->mb;
    for (int j = 0; j < p->nnodes && j < max; j++)
        names[j] = c->w[p->w[j]].name;
    return p->nnodes;
}

int pl_coord_plan_failover(const pl_coord *c, int q, int *layers, const char **names, int max)
{
    if (!c->has_stable || q < 0 || q >= c->stable.npipes)
        return -1;
    const cpipe *p = &c->stable.p[q];
    if (!p->layers)
        return 0;
    memcpy(layers, p->layers, ((size_t)p->nnodes + 1) * sizeof *layers);
    for (int j = 0; j < p->tn && j < max; j++)
        names[j] = c->w[p->tw[j]].name;
    return p->tn;
}

/* Step s (c->step) may be committed without its messages: nothing its commit or the
 * boundary after it does would differ from the steps before. */
/* The step after the current one may be committed without messages: not evaluated, not
 * the last, no joined worker to place, no checkpoint to retry. */
static int skippable(const pl_coord *c)
{
    int64_t next = c->step + 1;
    int every = c->cfg.eval_every;
    if (next >= c->cfg.steps || (every > 0 && next % every == 0) || c->ckpt_retry)
        return 0;
    int check = c->cfg.hosts_added_check_every > 1 ? c->cfg.hosts_added_check_every : 1;
    return !(c->join_pending && next % check == 0);
}

/* The checkpoint of step `step` to pipeline 0's workers, as a commit with save asks. */
static void save_to_pipeline0(pl_coord *c, int64_t step)
{
    for (int i = 0; i < c->nw; i++) {
        if (!c->w[i].live || !in_pipes(c, i) || c->w[i].pipe != 0)
            continue;
        pl_msg *m = push(c, i, PL_MSG_SAVE, c->gen);
        if (m)
            m->u.save.step = step;
    }
}

int64_t pl_coord_skip_steps(pl_coord *c, int64_t n, int quiet, int64_t step_ms)
{
    if (c->phase != PL_COORD_RUNNING || c->pending || n <= 0)
        return 0;
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].reported || c->w[i].reduced)
            return 0;
    int64_t done = 0;
    int saved = 0;
    while (done < n && !saved && skippable(c)) {
        pl_coord_step_rec x = {.step = c->step, .loss = NAN, .norm = NAN, .grad_scale = 1.0,
                               .val_loss = NAN, .generation = c->gen};
        x.lr = pl_lr_at(c->cfg.lr, c->cfg.lr_cosine, c->cfg.lr_warmup, c->cfg.lr_min_ratio,
                        (int)c->step, (int)c->cfg.steps);
        memcpy(x.pipelines, c->cur.desc, sizeof x.pipelines);
        if (log_step(c, &x)) {
            set_failed(c, "coordinator: out of memory");
            return done;
        }
        if (c->fail_step == c->step)
            c->fail_step = -1;
        c->step++;
        done++;
        c->step_ms[c->nstep_ms++ % PL_COORD_STEP_TIMES] = step_ms;
        c->step_t0 += step_ms;
        saved = pl_checkpoint_due(c->cfg.checkpoint_dir, c->cfg.checkpoint_every, c->cfg.steps,
                                  c->step);
        if (saved)
            save_to_pipeline0(c, c->step);
    }
    note_time(c, c->step_t0);
    if (done && quiet)
        reset_step_flags(c);
    else if (done)
        start_step(c);
    return done;
}

void pl_coord_fail(pl_coord *c, const char *why)
{
    if (c->phase != PL_COORD_DONE && c->phase != PL_COORD_FAILED)
        set_failed(c, why);
}

void pl_coord_end(pl_coord *c, const char *why)
{
    if (c->phase == PL_COORD_DONE || c->phase == PL_COORD_FAILED)
        return;
    c->reason[0] = 0;
    appendf(c->reason, sizeof c->reason, "%s", why);
    finish(c);
}

int64_t pl_coord_step_deadline(const pl_coord *c)
{
    if (c->cfg.step_timeout_ms)
        return c->cfg.step_timeout_ms > 0 ? c->cfg.step_timeout_ms : -1;
    const int64_t median = median_step_ms(c);
    if (median < 0)
        return -1;
    const int64_t floor_ms =
        (int64_t)PL_COORD_STEP_TIMEOUT_BEATS * c->misses * c->cfg.heartbeat_ms;
    const int64_t k = PL_COORD_STEP_TIMEOUT_FACTOR * median;
    return k > floor_ms ? k : floor_ms;
}

/* Takes plan worker i out as hung (its control thread may still heartbeat): lost, told to
 * exit, and silent, so that the front end ends its process. */
static void lose_hung(pl_coord *c, int i, const char *why, int *idx, int *n)
{
    cworker *w = &c->w[i];
    w->live = 0;
    w->silent = 1;
    add_cause(c, "lost %s (%s)", w->name, why);
    node_failed(c, w->node);
    stop_removed(c, i, why);
    idx[(*n)++] = i;
}

/* The running step passed its deadline (pl_coord_step_deadline). COMMITTING: applying a
 * commit waits on nobody, so the workers without `committed` are hung and lost. RUNNING:
 * a stuck compute thread blocks its stage neighbours and the all-reduce partners too, so
 * the step is aborted and planned again with the same workers; those whose compute thread
 * does not take the new plan (check_probe) are the hung ones. idx: room for every worker.
 * The count lost. */
static int check_step_deadline(pl_coord *c, int *idx)
{
    const int running = c->phase == PL_COORD_RUNNING;
    if (!running && c->phase != PL_COORD_COMMITTING)
        return 0;
    const int64_t limit = pl_coord_step_deadline(c);
    if (limit < 0 || c->now - c->step_t0 <= limit)
        return 0;
    char why[160];
    snprintf(why, sizeof why, "step %lld not %s within its deadline of %.1f s", (long long)c->step,
             running ? "reported" : "committed", (double)limit / 1000.0);
    int n = 0;
    if (running) {
        add_cause(c, "%s%s", why, ": aborted, planned again");
        to_pipeline_workers(c, PL_MSG_ABORT, why);
        c->probe_from = c->gen;
        c->probe_t0 = c->now + (c->cfg.settle_ms > 0 ? c->cfg.settle_ms : 0); /* replanned */
        c->probe_ms = limit;
        replan_soon(c);
        return 1;
    }
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && in_pipes(c, i) && !c->w[i].committed)
            lose_hung(c, i, why, idx, &n);
    if (n) {
        after_loss(c, idx, n);
        reassign_duties(c);
    }
    return n;
}

/* The plan made after a step deadline: the workers whose heartbeats still carry an older
 * generation probe_ms after it went out have a compute thread that never took it (the
 * others' aborted step let theirs go): lost as hung. The count lost. */
static int check_probe(pl_coord *c, int *idx)
{
    if (c->probe_from < 0 || c->gen <= c->probe_from)
        return 0;
    if (c->phase != PL_COORD_COPYING) {
        c->probe_from = -1; /* the plan went through */
        return 0;
    }
    if (c->now - c->probe_t0 <= c->probe_ms)
        return 0;
    char why[160];
    snprintf(why, sizeof why, "hung: plan %lld not taken within %.1f s of the step deadline",
             (long long)c->gen, (double)c->probe_ms / 1000.0);
    int n = 0;
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && c->w[i].got_plan && !c->w[i].copy_done && c->w[i].hb_gen < c->gen)
            lose_hung(c, i, why, idx, &n);
    c->probe_from = -1;
    if (n) {
        after_loss(c, idx, n);
        reassign_duties(c);
    }
    return n;
}

int pl_coord_tick(pl_coord *c, int64_t now_ms)
{
    c->err[0] = 0;
    note_time(c, now_ms);
    const int judged = c->judge_at >= 0 && now_ms >= c->judge_at;
    if (judged)
        judge_peers(c);
    if (c->phase == PL_COORD_SETTLING && now_ms >= c->replan_at)
        replan(c);
    if (c->phase == PL_COORD_WAITING_FOR_WORKERS && c->cfg.start_grace_ms > 0 &&
        c->wait_since >= 0 && now_ms - c->wait_since >= c->cfg.start_grace_ms &&
        pl_coord_live_workers(c) >= c->cfg.coverage->nodes_lo)
        replan(c); /* some Pods stay Pending: train on those that run */
    if (c->phase == PL_COORD_RESUMING) {
        if (c->resume_at < 0)
            c->resume_at = now_ms + c->resume_ms;
        else if (now_ms >= c->resume_at)
            resume_done(c);
    }
    if (c->phase == PL_COORD_WAITING_FOR_WORKERS || c->phase == PL_COORD_WAITING_FOR_NODES) {
        int64_t limit = c->cfg.wait_for_nodes_ms;
        if (limit > 0 && now_ms - c->wait_since > limit) {
            char why[700];
            snprintf(why, sizeof why, "waitForNodesTimeoutSeconds (%lld) passed: %d live workers%s%s",
                     (long long)(limit / 1000), pl_coord_live_workers(c),
                     c->reason[0] ? "; " : "", c->reason);
            set_failed(c, why);
            return PL_COORD_OK;
        }
    }
    int64_t limit = (int64_t)c->misses * c->cfg.heartbeat_ms;
    int *idx = malloc((size_t)(c->nw ? c->nw : 1) * sizeof *idx), n = 0;
    if (!idx)
        return fail_err(c, "out of memory");
    for (int i = 0; i < c->nw; i++)
        if (c->w[i].live && now_ms - c->w[i].last_heard > limit) {
            c->w[i].live = 0;
            c->w[i].silent = 1;
            add_cause(c, "lost %s (%s)", c->w[i].name, "missed heartbeats");
            if (!c->w[i].leaving)
                node_failed(c, c->w[i].node);
            stop_removed(c, i, "missed heartbeats");
            idx[n++] = i;
        }
    if (n) {
        after_loss(c, idx, n);
        reassign_duties(c);
    } else {
        n = check_step_deadline(c, idx);
        n = n ? n : check_probe(c, idx);
    }
    free(idx);
    return n || judged ? PL_COORD_OK : PL_COORD_IGNORED;
}

int pl_coord_on_msg(pl_coord *c, const char *name, const pl_msg *m, int64_t now_ms)
{
    c->err[0] = 0;
    if (!m)
        return fail_err(c, "NULL message");
    if (heard(c, name, now_ms) < 0 && m->type != PL_MSG_SAVED)
        return PL_COORD_ERR; /* a worker that left still reports the checkpoint it wrote */
    switch (m->type) {
    case PL_MSG_HEARTBEAT: {
        const int i = find_live(c, name);
        if (m->gen > c->w[i].hb_gen)
            c->w[i].hb_gen = m->gen;
        return PL_COORD_OK;
    }
    case PL_MSG_LEAVING:
        return pl_coord_leaving(c, name, m->u.leaving.reason, m->u.leaving.grace_ms);
    case PL_MSG_REPORT:
        return pl_coord_report(c, name, m->gen, &m->u.report);
    case PL_MSG_REDUCED:
        return pl_coord_reduced(c, name, m->gen, m->u.reduced.step);
    case PL_MSG_COMMITTED:
        return pl_coord_committed(c, name, m->gen, m->u.committed.step);
    case PL_MSG_COPY_DONE:
        return pl_coord_copy_done(c, name, m->gen, m->u.copy_done.bytes);
    case PL_MSG_PEER_BROKEN:
        return pl_coord_peer_broken(c, name, m->gen, m->u.peer_broken.peer);
    case PL_MSG_SAVED:
        return pl_coord_saved(c, name, &m->u.saved);
    case PL_MSG_HELLO_RESUME:
        return pl_coord_hello_resume(c, name, m->gen, &m->u.hello_resume);
    case PL_MSG_NCCL_ROOT:
        return nccl_root(c, name, m->gen, m->u.nccl_root.id);
    case PL_MSG_STEP_FAILED:
        return step_failed(c, name, m->gen, m->u.step_failed.step, m->u.step_failed.reason);
    case PL_MSG_CHECKPOINT_DONE:
        return pl_coord_checkpoint_done(c, name, m->u.checkpoint_done.step,
                                        m->u.checkpoint_done.error);
    case PL_MSG_PROFILE_DONE:
        return pl_coord_profile_done(c, name, m->u.profile_done.profile,
                                     m->u.profile_done.error);
    case PL_MSG_EVAL_DONE:
        return pl_coord_eval_done(c, name, m->gen, &m->u.eval_done);
    case PL_MSG_FATAL:
        return pl_coord_fatal(c, name, m->u.fatal.reason);
    default:
        return fail_err(c, "worker \"%s\": unexpected message %s", name,
                        pl_msg_type_name(m->type));
    }
}

int pl_coord_next(pl_coord *c, char *to, size_t tolen, pl_msg *out)
{
    if (c->headout >= c->nout) {
        c->headout = c->nout = 0;
        return 0;
    }
    outmsg *o = &c->out[c->headout++];
    if (to && tolen) {
        size_t n = strnlen(o->to, sizeof o->to);
        n = n < tolen - 1 ? n : tolen - 1;
        memcpy(to, o->to, n);
        to[n] = 0;
    }
    if (out)
        *out = o->m;
    else
        pl_msg_free(&o->m);
    return 1;
}

int pl_coord_pending(const pl_coord *c) { return c->nout - c->headout; }
pl_coord_phase_t pl_coord_phase(const pl_coord *c) { return c->phase; }

const char *pl_coord_phase_name(pl_coord_phase_t p)
{
    static const char *const names[] = {"waiting_for_workers", "copying", "running", "committing",
                                        "waiting_for_nodes", "saving", "settling", "resuming",
                                        "profiling", "evaluating", "done", "failed"};
    return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "?";
}

int pl_coord_tolerance(const pl_coord *c)
{
    return c->tolerance;
}

const char *pl_coord_reason(const pl_coord *c) { return c->reason; }
const char *pl_coord_error(const pl_coord *c) { return c->err; }
int64_t pl_coord_generation(const pl_coord *c) { return c->gen; }
int64_t pl_coord_step(const pl_coord *c) { return c->step; }

int pl_coord_rank(const pl_coord *c, const char *name)
{
    int i = find(c, name);
    return i < 0 ? -1 : c->w[i].rank;
}

int pl_coord_live_workers(const pl_coord *c)
{
    int n = 0;
    for (int i = 0; i < c->nw; i++)
        n += c->w[i].live;
    return n;
}

int pl_coord_worker_silent(const pl_coord *c, const char *name)
{
    int silent = 0;
    for (int i = 0; i < c->nw; i++) {
        if (strcmp(c->w[i].name, name))
            continue;
        if (c->w[i].live)
            return 0; /* registered again */
        silent |= c->w[i].silent;
    }
    return silent;
}

int pl_coord_nsteps(const pl_coord *c) { return c->nlog; }
int64_t pl_coord_last_checkpoint(const pl_coord *c) { return c->ckpt_last; }
int64_t pl_coord_resume_step(const pl_coord *c) { return c->resume_step; }
const char *pl_coord_resume_note(const pl_coord *c) { return c->resume_note; }
const char *pl_coord_profile_json(const pl_coord *c) { return c->profile_text; }

int64_t pl_coord_checkpoint_failed(const pl_coord *c, const char **why)
{
    if (why)
        *why = c->ckpt_fail;
    return c->ckpt_fail_step;
}

int pl_coord_checkpoint_failures(const pl_coord *c) { return c->ckpt_failed_total; }

const pl_coord_step_rec *pl_coord_step_log(const pl_coord *c, int i)
{
    return i >= 0 && i < c->nlog ? &c->log[i] : NULL;
}

int pl_coord_nreconfigs(const pl_coord *c) { return c->nrec; }

const pl_coord_reconfig_rec *pl_coord_reconfig(const pl_coord *c, int i)
{
    return i >= 0 && i < c->nrec ? &c->rec[i] : NULL;
}

int pl_coord_cooling_nodes(const pl_coord *c, int64_t now_ms, const char **names, int max)
{
    int n = 0;
    for (int k = 0; k < c->nnodes && n < max; k++)
        if (c->nodes[k].until > now_ms) names[n++] = c->nodes[k].name;
    return n;
}

int pl_coord_nworkers(const pl_coord *c) { return c->nw; }
int pl_coord_nlayers(const pl_coord *c) { return c->nlayers; }

int pl_coord_worker_view_at(const pl_coord *c, int i, pl_coord_worker_view *v)
{
    if (i < 0 || i >= c->nw)
        return -1;
    const cworker *w = &c->w[i];
    memset(v, 0, sizeof *v);
    v->name = w->name;
    v->zone = w->zone;
    v->device = w->device;
    v->live = w->live;
    v->leaving = w->leaving;
    v->departing = w->departing;
    v->pipeline = v->stage = -1;
    if (c->has_cur && w->pipe >= 0 && w->pipe < c->cur.npipes) {
        v->pipeline = w->pipe;
        v->stage = w->pos;
        pipe_layers(c, &c->cur.p[w->pipe], w->pos, &v->layer_begin, &v->layer_end);
        v->copying = c->phase == PL_COORD_COPYING && w->got_plan && !w->copy_done;
    }
    return 0;
}
