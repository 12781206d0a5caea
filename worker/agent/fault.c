/* Fault injection for the recovery tests: PLIANT_FAULT_<worker> (fault.h). */
#include "fault.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol.h"
#include "util.h"

static const char *const PHASES[] = {
    [PL_FAULT_FORWARD] = "forward",   [PL_FAULT_BACKWARD] = "backward",
    [PL_FAULT_SYNC] = "sync",         [PL_FAULT_COPY] = "copy",
    [PL_FAULT_COMMIT] = "commit",     [PL_FAULT_CHECKPOINT] = "checkpoint",
    [PL_FAULT_BADTOKEN] = "badtoken",
};
static const char *const ACTIONS[] = {[PL_FAULT_KILL] = "kill", [PL_FAULT_STOP] = "stop",
                                      [PL_FAULT_TERM] = "term", [PL_FAULT_CUT] = "cut"};

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
    for (int k = PL_FAULT_KILL; k <= PL_FAULT_CUT; k++)
        if (!strcmp(s + 1, ACTIONS[k])) {
            *out = (pl_fault_action)k;
            return 0;
        }
    return -1;
}

int pl_fault_parse(pl_fault *f, const char *worker, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    f->kind = PL_FAULT_NONE;
    f->worker = worker;
    char var[PL_PROTO_NAME_MAX + 16];
    snprintf(var, sizeof var, "PLIANT_FAULT_%s", worker);
    const char *v = getenv(var);
    if (!v) return 0;
    const char *num = NULL;
    char *end = NULL;
    f->kind = parse_phase(v, &num);
    if (f->kind != PL_FAULT_NONE) f->at = strtoll(num, &end, 10);
    if (f->kind == PL_FAULT_NONE || !end || end == num || f->at < 0 ||
        parse_action(end, &f->action) || (f->kind == PL_FAULT_BADTOKEN && *end))
        return pl_errf(err, errlen,
                       "%s: expected PHASE:N[:kill|stop|term|cut] with PHASE forward, backward, "
                       "sync, copy, commit or checkpoint, or badtoken:STEP, got '%s'",
                       var, v);
    return 0;
}

void pl_fault_set_plan(pl_fault *f, int64_t gen)
{
    f->gen = gen;
}

void pl_fault_begin_step(pl_fault *f, int64_t step, int nmb)
{
    f->step = step;
    f->last_mb = nmb - 1;
}

/* Does the fault's action, once, if it is of phase `phase` at `at`. */
static void fire(pl_fault *f, pl_fault_phase phase, int64_t at, const char *where)
{
    if (f->kind != phase || at != f->at || atomic_exchange(&f->fired, 1)) return;
    static const char *const what[] = {[PL_FAULT_KILL] = "SIGKILL", [PL_FAULT_STOP] = "SIGSTOP",
                                       [PL_FAULT_TERM] = "SIGTERM",
                                       [PL_FAULT_CUT] = "control connection cut"};
    fprintf(stderr, "worker %s: PLIANT_FAULT: %s during %s\n", f->worker, what[f->action],
            where);
    fflush(stderr);
    if (f->action == PL_FAULT_KILL) raise(SIGKILL);
    else if (f->action == PL_FAULT_STOP) raise(SIGSTOP); /* until someone SIGKILLs it */
    else if (f->action == PL_FAULT_TERM) raise(SIGTERM);  /* the worker's own handler */
    else atomic_store(&f->cut, 1);
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
    if (++f->groups == 2) fire(f, PL_FAULT_SYNC, f->at, "the gradient all-reduce");
}

pl_fault_reduce_hook *pl_fault_step_hook(pl_fault *f, int64_t step)
{
    return f->kind == PL_FAULT_SYNC && step == f->at ? before_reduce : NULL;
}

void pl_fault_after_copy_send(void *ctx)
{
    pl_fault *f = ctx;
    fire(f, PL_FAULT_COPY, f->gen, "a layer copy");
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
    if (f->kind != PL_FAULT_BADTOKEN || step != f->at || n == 0) return 0;
    tokens[0] = 65535;
    fprintf(stderr, "worker %s: PLIANT_FAULT: a token id outside the vocabulary in step %lld\n",
            f->worker, (long long)step);
    return 1;
}
