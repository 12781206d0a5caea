/* Eager forward redundant computation in the stage's waits (frc.h). */
#include "frc.h"

#include <string.h>

#include "util.h"

int pl_frc_begin(pl_frc *f, pl_engine *shadow, const pl_engine *stage, const pl_schedule *s,
                 const int32_t *tokens, const int32_t *targets, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    if (pl_engine_has_embedding(shadow) && !tokens)
        return pl_errf(err, errlen, "frc: the shadow has the embedding and needs tokens");
    if (pl_engine_has_head(shadow) && !targets)
        return pl_errf(err, errlen, "frc: the shadow has the head and needs targets");
    f->slot_bytes = pl_engine_slot_bytes(shadow);
    const size_t floats = (size_t)s->nmicro * f->slot_bytes / sizeof(float);
    f->host = (char *)pl_engine_io_buffer(shadow, PL_IO_FRC, floats);
    if (!f->host) return pl_errf(err, errlen, "frc: out of host memory for %d microbatches",
                                 s->nmicro);
    if (!pl_engine_has_embedding(shadow)) {
        const size_t n = (size_t)s->nmicro * (size_t)shadow->B * (size_t)shadow->T *
                         (size_t)shadow->cfg.C;
        if (!(f->inputs = pl_engine_io_buffer(shadow, PL_IO_FRC_IN, n)))
            return pl_errf(err, errlen, "frc: out of host memory for %d microbatches' inputs",
                           s->nmicro);
    }
    f->shadow = shadow;
    f->stage = stage;
    f->tokens = tokens;
    f->targets = targets;
    f->nmicro = s->nmicro;
    f->nslots = s->nslots;
    /* on the tokens every input exists from the start */
    f->avail = pl_engine_has_embedding(shadow) ? s->nmicro : 0;
    return 0;
}

/* One microbatch's input: B·T·C floats. */
static size_t input_floats(const pl_frc *f)
{
    return (size_t)f->shadow->B * (size_t)f->shadow->T * (size_t)f->shadow->cfg.C;
}

void pl_frc_input_ready(pl_frc *f, int mb)
{
    if (!f->inputs) return; /* on the tokens: every input exists from the start */
    const size_t n = input_floats(f);
    kn_to_host(f->shadow->k, f->inputs + (size_t)mb * n,
               pl_engine_output(f->stage, mb % f->nslots), n * sizeof(float));
    if (mb + 1 > f->avail) f->avail = mb + 1;
}

/* Runs the next part (pl_engine_forward_part: the input, a block, the head) of
 * microbatch f->next's FRC, so that a message arriving during a wait waits for one
 * layer, not the whole range; after the last part the slot goes to host memory. */
static void run_part(pl_frc *f, int bubble)
{
    const int i = f->next;
    const size_t BT = (size_t)f->shadow->B * (size_t)f->shadow->T;
    const double t0 = pl_now_ms();
    const int32_t *tok = pl_engine_has_embedding(f->shadow) ? f->tokens + i * BT : NULL;
    const int32_t *tgt = pl_engine_has_head(f->shadow) ? f->targets + i * BT : NULL;
    const float *in = tok ? NULL : f->inputs + (size_t)i * input_floats(f);
    pl_engine_forward_part(f->shadow, 0, f->part, tok, in, tgt);
    const int done = ++f->part == pl_engine_forward_parts(f->shadow);
    if (done) {
        pl_engine_slot_to_host(f->shadow, 0, f->host + (size_t)i * f->slot_bytes);
        f->part = 0;
        f->next++;
    }
    const double ms = pl_now_ms() - t0;
    if (bubble) {
        f->stats.bubble += done;
        f->stats.bubble_ms += ms;
    } else {
        f->stats.forced += done;
        f->stats.forced_ms += ms;
    }
}

/* An FRC whose input exists is left, and the step is not aborted: an abort
 * (pl_engine.stop, set on the stage's engine) ends a fill within the part running. */
static int pending(const pl_frc *f)
{
    return f->next < f->avail && !pl_engine_stopped(f->stage);
}

void pl_frc_fill_wait(pl_frc *f, const pl_stage_link *link, int peer, pl_link_kind kind, int mb)
{
    while (pending(f) && !(link->ready && link->ready(link->ctx, peer, kind, mb))) run_part(f, 1);
}

void pl_frc_fill_while(pl_frc *f, int (*waiting)(void *ctx), void *ctx)
{
    while (pending(f) && waiting(ctx)) run_part(f, 1);
}

void pl_frc_finish(pl_frc *f)
{
    while (pending(f)) run_part(f, 0);
}

const void *pl_frc_result(const pl_frc *f, int mb)
{
    return mb >= 0 && mb < f->next ? f->host + (size_t)mb * f->slot_bytes : NULL;
}
