/* Fault injection for the recovery tests: PLIANT_FAULT_<worker> (fault.h). */
#include "fault.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol.h"
#include "util.h"

int pl_fault_parse(pl_fault *f, const char *worker, char *err, size_t errlen)
{
    *f = (pl_fault){.kind = PL_FAULT_NONE, .worker = worker};
    char var[PL_PROTO_NAME_MAX + 16];
    snprintf(var, sizeof var, "PLIANT_FAULT_%s", worker);
    const char *v = getenv(var);
    if (!v) return 0;
    char *end = NULL;
    size_t skip = 5;
    if (!strncmp(v, "sync:", 5)) f->kind = PL_FAULT_SYNC;
    else if (!strncmp(v, "copy:", 5)) f->kind = PL_FAULT_COPY;
    else if (!strncmp(v, "badtoken:", 9)) f->kind = PL_FAULT_BADTOKEN, skip = 9;
    if (f->kind != PL_FAULT_NONE) f->at = strtoll(v + skip, &end, 10);
    if (f->kind == PL_FAULT_NONE || !end || end == v + skip || *end || f->at < 0)
        return pl_errf(err, errlen,
                       "%s: expected sync:STEP, copy:GENERATION or badtoken:STEP, got '%s'", var,
                       v);
    return 0;
}

void pl_fault_set_plan(pl_fault *f, int64_t gen)
{
    f->gen = gen;
}

static void die(const pl_fault *f, const char *where)
{
    fprintf(stderr, "worker %s: PLIANT_FAULT: SIGKILL during %s\n", f->worker, where);
    raise(SIGKILL);
}

static void before_reduce(void *ctx, int key)
{
    pl_fault *f = ctx;
    (void)key;
    if (++f->groups == 2) die(f, "the gradient all-reduce");
}

pl_fault_reduce_hook *pl_fault_step_hook(pl_fault *f, int64_t step)
{
    return f->kind == PL_FAULT_SYNC && step == f->at ? before_reduce : NULL;
}

void pl_fault_after_copy_send(void *ctx)
{
    const pl_fault *f = ctx;
    if (f->kind == PL_FAULT_COPY && f->gen == f->at) die(f, "a layer copy");
}

int pl_fault_bad_tokens(const pl_fault *f, int64_t step, int32_t *tokens, size_t n)
{
    if (f->kind != PL_FAULT_BADTOKEN || step != f->at || n == 0) return 0;
    tokens[0] = 65535;
    fprintf(stderr, "worker %s: PLIANT_FAULT: a token id outside the vocabulary in step %lld\n",
            f->worker, (long long)step);
    return 1;
}
