/* Redundant layers: the shadow's range, its gradients from the owner, the check
 * (shadow.h). */
#include "shadow.h"

#include <stdlib.h>
#include <string.h>

#include "syncgroups.h"
#include "util.h"

int pl_shadow_successor(pl_rc_layout rc, int stage, int nstages)
{
    if (rc == PL_RC_NONE || nstages < 2 || stage < 0 || stage >= nstages) return -1;
    return (stage + 1) % nstages;
}

int pl_shadow_holder(pl_rc_layout rc, int stage, int nstages)
{
    if (rc == PL_RC_NONE || nstages < 2 || stage < 0 || stage >= nstages) return -1;
    return (stage + nstages - 1) % nstages;
}

int pl_shadow_create(pl_engine *shadow, kn_ctx *k, const pl_gpt_config *cfg, int begin,
                     int end, int B, int T, char *err, size_t errlen)
{
    return pl_engine_create(shadow, k, cfg, begin, end, B, T, 1, err, errlen);
}

static int on_host(const pl_engine *e)
{
    return strcmp(kn_backend(e->k), "cpu") == 0;
}

int pl_shadow_grad_tag(int L, int key, int run)
{
    return PL_SHADOW_GRAD_TAG0 + pl_sync_key_order(L, key) * PL_MAX_LAYER_TENSORS + run;
}

int pl_shadow_grad_messages(int L)
{
    return (L + 3) * PL_MAX_LAYER_TENSORS; /* keys 0 .. L+1 and wte, a run per tensor */
}

/* The contiguous run of refs starting at *i (its first float and length); advances *i. */
static float *next_run(const pl_tensor_ref *refs, int n, int *i, size_t *len)
{
    float *run = refs[*i].data;
    *len = 0;
    for (; *i < n && refs[*i].data == run + *len; (*i)++) *len += refs[*i].count;
    return run;
}

int pl_shadow_send_group(const pl_stage_link *link, int holder, int L, int key,
                         const pl_tensor_ref *refs, int n, char *err, size_t errlen)
{
    char msg[400];
    for (int i = 0, run = 0; i < n; run++) {
        size_t len;
        const float *x = next_run(refs, n, &i, &len);
        if (link->send(link->ctx, holder, PL_LINK_SHADOW, pl_shadow_grad_tag(L, key, run), x,
                       len, msg, sizeof msg))
            return pl_errf(err, errlen, "shadow: sending the gradients to stage %d: %s", holder,
                           msg);
    }
    return 0;
}

int pl_shadow_recv_group(pl_engine *shadow, const pl_stage_link *link, int successor, int key,
                         const pl_tensor_ref *refs, int n, char *err, size_t errlen)
{
    const int L = shadow->cfg.L;
    char msg[400];
    for (int i = 0, run = 0; i < n; run++) {
        size_t len;
        float *x = next_run(refs, n, &i, &len), *buf = x;
        if (!on_host(shadow) && !(buf = pl_engine_io_buffer(shadow, PL_IO_RECV, len)))
            return pl_errf(err, errlen, "shadow: out of memory");
        if (link->recv(link->ctx, successor, PL_LINK_SHADOW, pl_shadow_grad_tag(L, key, run), buf,
                       len, msg, sizeof msg))
            return pl_errf(err, errlen, "shadow: receiving stage %d's gradients: %s", successor,
                           msg);
        if (buf != x) kn_to_device(shadow->k, x, buf, len * sizeof(float));
    }
    return 0;
}

/* a and b's n floats at src_a, src_b (backend memory) byte-identical. */
static int same_bytes(const pl_engine *a, const float *xa, const pl_engine *b, const float *xb,
                      size_t n)
{
    if (on_host(a) && on_host(b)) return memcmp(xa, xb, n * sizeof(float)) == 0;
    float *ha = malloc(n * sizeof *ha), *hb = malloc(n * sizeof *hb);
    int same = 0;
    if (ha && hb) {
        kn_to_host(a->k, ha, xa, n * sizeof(float));
        kn_to_host(b->k, hb, xb, n * sizeof(float));
        same = memcmp(ha, hb, n * sizeof(float)) == 0;
    }
    free(ha);
    free(hb);
    return same;
}

int pl_shadow_identical(const pl_engine *a, const pl_engine *b)
{
    if (a->begin != b->begin || a->end != b->end || a->nparams != b->nparams) return 0;
    return same_bytes(a, a->params, b, b->params, a->nparams) &&
           same_bytes(a, a->m, b, b->m, a->nparams) && same_bytes(a, a->v, b, b->v, a->nparams);
}
