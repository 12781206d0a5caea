/* Fault injection for the recovery tests: PLIANT_FAULT_<worker> (fault.h). */
#include "fault.h"

#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol.h"
#include "util.h"

static const char *const PHASES[] = {
    [PL_FAULT_FORWARD] = "forward",   [PL_FAULT_BACKWARD] = "backward",
    [PL_FAULT_SYNC] = "sync",         [PL_FAULT_COPY] = "copy",
    [PL_FAULT_SHADOW] = "shadow",
    [PL_FAULT_COMMIT] = "commit",     [PL_FAULT_CHECKPOINT] = "checkpoint",
    [PL_FAULT_BADTOKEN] = "badtoken",
};
static const char *const ACTIONS[] = {[PL_FAULT_KILL] = "kill", [PL_FAULT_STOP] = "stop",
                                      [PL_FAULT_TERM] = "term", [PL_FAULT_CUT] = "cut",
                                      [PL_FAULT_STALL] = "stall"};

/* The phase named by v up to its first ':', and where its number starts. */
static pl_fault_phase parse_phase(const char *v, const char **num)
{
    for (int k = PL_FAULT_FORWARD; k <= PL_FAULT_BADTOKEN; k++) {
        size_t n = strlen(PHASES[k]);
        if (!strncmp(v, PHASES[k], n) && v[n] == ':') {
            *num = v + n + 1;
            return (pl_fault_phase)k;
        }
    }
    return PL_FAULT_NONE;
}

/* The action after the number: "" (kill) or ":ACTION"; -1 when it is none. */
static int parse_action(const char *s, pl_fault_action *out)
{
    *out = PL_FAULT_KILL;
    if (!*s) return 0;
    if (*s != ':') return -1;
    for (int k = PL_FAULT_KILL; k <= PL_FAULT_STALL; k++)
        if (!strcmp(s + 1, ACTIONS[k])) {
            *out = (pl_fault_action)k;
            return 0;
        }
    return -1;
}

/* The ranks after '@': "R[,R...]" as bits; -1 when malformed. */
static int parse_ranks(const char *s, uint64_t *out)
{
    *out = 0;
    do {
        char *end = NULL;
        long r = strtol(s, &end, 10);
        if (end == s || r < 0 || r > 63) return -1;
        *out |= (uint64_t)1 << r;
        s = end;
    } while (*s++ == ',');
    return s[-1] ? -1 : 0;
}

/* One fault "PHASE:AT[:ACTION][@RANKS]" (len chars of v); -1 when malformed. */
static int parse_one(const char *v, size_t len, pl_fault_spec *f)
{
    char buf[256];
    if (len >= sizeof buf) return -1;
    memcpy(buf, v, len);
    buf[len] = 0;
    char *at = strchr(buf, '@');
    if (at) {
        *at = 0;
        if (parse_ranks(at + 1, &f->ranks)) return -1;
    }
    const char *num = NULL;
    char *end = NULL;
    f->kind = parse_phase(buf, &num);
    if (f->kind == PL_FAULT_NONE) return -1;
    f->at = strtoll(num, &end, 10);
    if (end == num || f->at < 0 || parse_action(end, &f->action)) return -1;
    return f->kind == PL_FAULT_BADTOKEN && (*end || f->ranks) ? -1 : 0;
}

int pl_fault_parse(pl_fault *f, const char *worker, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->worker = worker;
    char var[PL_PROTO_NAME_MAX + 16];
    snprintf(var, sizeof var, "PLIANT_FAULT_%s", worker);
    const char *v = getenv(var);
    if (!v && (v = getenv("PLIANT_FAULT"))) snprintf(var, sizeof var, "PLIANT_FAULT");
    for (const char *p = v; p && *p;) {
        const size_t len = strcspn(p, ";");
        if (f->n == PL_FAULT_MAX || parse_one(p, len, &f->f[f->n]))
            return pl_errf(err, errlen,
                           "%s: expected at most %d of PHASE:N[:kill|stop|term|cut][@RANK,...] "
                           "separated by ';' (PHASE forward, backward, sync, copy, commit or "
                           "checkpoint) or badtoken:STEP, got '%s'",
                           var, PL_FAULT_MAX, v);
        f->n++;
        p += len + (p[len] == ';');
    }
    return 0;
}

void pl_fault_set_plan(pl_fault *f, int64_t gen, int rank)
{
    f->gen = gen;
    f->rank = rank;
}

void pl_fault_begin_step(pl_fault *f, int64_t step, int nmb)
{
    f->step = step;
    f->last_mb = nmb - 1;
    f->groups = 0;
}

/* Blocks the calling thread for good (until the process is killed); the others go on. */
static void stall(void)
{
    for (;;)
        pause();
}

/* Does the action of each fault of phase `phase` at `at` for this worker's rank, once. */
static void fire(pl_fault *f, pl_fault_phase phase, int64_t at, const char *where)
{
    static const char *const what[] = {[PL_FAULT_KILL] = "SIGKILL", [PL_FAULT_STOP] = "SIGSTOP",
                                       [PL_FAULT_TERM] = "SIGTERM",
                                       [PL_FAULT_CUT] = "control connection cut",
                                       [PL_FAULT_STALL] = "a stall"};
    for (int i = 0; i < f->n; i++) {
        pl_fault_spec *x = &f->f[i];
        if (x->kind != phase || at != x->at) continue;
        const int in_plan = phase == PL_FAULT_COPY || phase == PL_FAULT_SHADOW;
        if (x->ranks && (f->gen != (in_plan ? x->at : 1) || f->rank < 0 ||
                         f->rank > 63 || !(x->ranks >> f->rank & 1)))
            continue; /* ranks of the first plan: a redone step must not fire it again */
        if (atomic_exchange(&x->fired, 1)) continue;
        fprintf(stderr, "worker %s: PLIANT_FAULT: %s during %s (plan rank %d)\n", f->worker,
                what[x->action], where, f->rank);
        fflush(stderr);
        if (x->action == PL_FAULT_KILL) raise(SIGKILL);
        else if (x->action == PL_FAULT_STOP) raise(SIGSTOP); /* until someone SIGKILLs it */
        else if (x->action == PL_FAULT_TERM) raise(SIGTERM);  /* the worker's own handler */
        else if (x->action == PL_FAULT_STALL) stall();
        else atomic_store(&f->cut, 1);
    }
}

void pl_fault_before_op(void *ctx, int backward, int mb)
{
    pl_fault *f = ctx;
    if (mb != f->last_mb) return;
    if (backward) fire(f, PL_FAULT_BACKWARD, f->step, "the backward");
    else fire(f, PL_FAULT_FORWARD, f->step, "the forward");
}

static void before_reduce(void *ctx, int key)
{
    pl_fault *f = ctx;
    (void)key;
    if (++f->groups == 2) fire(f, PL_FAULT_SYNC, f->step, "the gradient all-reduce");
}

pl_fault_reduce_hook *pl_fault_step_hook(pl_fault *f, int64_t step)
{
    for (int i = 0; i < f->n; i++)
        if (f->f[i].kind == PL_FAULT_SYNC && f->f[i].at == step) return before_reduce;
    return NULL;
}

void pl_fault_after_copy_send(void *ctx)
{
    pl_fault *f = ctx;
    fire(f, PL_FAULT_COPY, f->gen, "a layer copy");
}

void pl_fault_after_shadow_send(pl_fault *f)
{
    fire(f, PL_FAULT_SHADOW, f->gen, "a shadow's refill");
}

void pl_fault_on_commit(pl_fault *f, int64_t step)
{
    fire(f, PL_FAULT_COMMIT, step, "the commit");
}

void pl_fault_on_saved(pl_fault *f, int64_t step)
{
    fire(f, PL_FAULT_CHECKPOINT, step, "the checkpoint write");
}

int pl_fault_take_cut(pl_fault *f)
{
    return atomic_exchange(&f->cut, 0);
}

int pl_fault_bad_tokens(const pl_fault *f, int64_t step, int32_t *tokens, size_t n)
{
    int bad = 0;
    for (int i = 0; i < f->n; i++) bad |= f->f[i].kind == PL_FAULT_BADTOKEN && f->f[i].at == step;
    if (!bad || n == 0) return 0;
    tokens[0] = 65535;
    fprintf(stderr, "worker %s: PLIANT_FAULT: a token id outside the vocabulary in step %lld\n",
            f->worker, (long long)step);
    return 1;
}
