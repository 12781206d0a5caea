/* The GPT engine: runs a contiguous layer range [begin, end) of the model as a
 * pipeline stage, forward and backward, one activation set per in-flight
 * microbatch ("slot"), and applies AdamW. All compute goes through kernels/.
 *
 * Gradients accumulate over microbatches until pl_engine_zero_grads. The
 * tied wte is held by the embedding and by the head: a range with the head but
 * not the embedding keeps its own copy of wte and accumulates its gradient
 * there; combining the holders' gradients is the distributed runtime's job.
 * A range with both keeps the head's share apart until the step's last backward
 * (pl_engine_backward_last), so that every split of the model computes the same
 * floats as the whole: each holder's sum is the same sequence of operations, and
 * the two are added once at the end, whatever sgemm kernel the machine picks. */
#ifndef PLIANT_ENGINE_H
#define PLIANT_ENGINE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "gpt.h"
#include "kernels.h"

typedef struct {
    char name[48];   /* "layer.<i>.<name>" */
    int layer;       /* 0..L+1; the head's wte copy is layer 0's tensor */
    int index;       /* index in pl_gpt_layer_tensors(layer) */
    size_t offset;   /* in floats, into params/grads/m/v */
    pl_tensor_spec spec;
} pl_engine_tensor;

typedef struct pl_slot pl_slot; /* activations of one microbatch */

/* The transports' buffers an engine keeps between steps (pl_engine_io_buffer). */
typedef enum {
    PL_IO_RECV,      /* host: a stage link's received activation or gradient */
    PL_IO_SEND,      /* host: what a stage link sends, staged off the CPU */
    PL_IO_GRADS,     /* host: gradients staged for the TCP all-reduce, off the CPU */
    PL_IO_DEV_GRAD,  /* backend memory: a gradient received over an ordered transport */
    PL_IO_FRC,       /* host: forward redundant computations swapped out (frc.h) */
    PL_IO_FRC_IN,    /* host: the forward redundant computations' inputs (frc.h) */
    PL_IO_COUNT
} pl_engine_io;

/* Layout of params, grads, m and v: tensors in layer order (a head-only range's copy of
 * wte first), each layer's tensors contiguous, each layer (and that wte) starting at a
 * multiple of PL_ENGINE_LAYER_ALIGN floats, a page (KN_SHARE_ALIGN), zeros between; nparams
 * is rounded up too. So a layer takes the same whole pages in every engine that holds it,
 * and a worker that keeps it maps it into its new engine (kn_share) instead of copying. */
#define PL_ENGINE_LAYER_ALIGN ((size_t)KN_SHARE_ALIGN / sizeof(float))
size_t pl_engine_align_layer(size_t floats);

typedef struct {
    pl_gpt_config cfg;
    int begin, end;  /* layer range */
    int B, T;        /* microbatch shape */
    int nslots;
    kn_ctx *k;
    size_t nparams;  /* floats of each of params, grads, m, v (the layout's padding included) */
    float *params, *grads, *m, *v;
    void *params_lp; /* params' low-precision mirror (kn_lowp_mirror), made at the first forward */
    int ntensors;
    pl_engine_tensor *tensors;
    int wte_tensor;  /* index in tensors of wte, or −1 */
    float *head_dwte;/* with both ends: the head's share of wte's gradient (pl_engine_backward) */
    int head_pending;/* head_dwte holds a share not yet added (a backward_last is missing) */
    int keep_probs;  /* pl_engine_keep_probs */
    pl_slot *slots;
    float *bw;       /* backward scratch, shared by all slots */
    size_t act_bytes;/* activation memory, for reports */
    float *io[PL_IO_COUNT];    /* pl_engine_io_buffer, allocated on first use */
    size_t io_floats[PL_IO_COUNT];
    /* Set by the runtime around a step (NULL: never): once *stop is non-zero, forward and
     * backward skip their remaining layers and report no more layers done, so that an
     * aborted step ends at the next layer rather than after the whole microbatch. What
     * they leave is meaningless: the step must be dropped (nothing but AdamW changes
     * parameters, and the next step zeroes the gradients). Any thread may set it. */
    const atomic_int *stop;
} pl_engine;

/* A stage for layers [begin, end) with microbatches of B×T tokens and nslots
 * activation sets. Parameters are zero until initialised or loaded. */
int pl_engine_create(pl_engine *e, kn_ctx *k, const pl_gpt_config *cfg, int begin, int end,
                     int B, int T, int nslots, char *err, size_t errlen);
void pl_engine_destroy(pl_engine *e);

static inline int pl_engine_has_embedding(const pl_engine *e)
{
    return e->begin == 0;
}
static inline int pl_engine_has_head(const pl_engine *e)
{
    return e->end == e->cfg.L + 2;
}
/* The step running on e was aborted (pl_engine.stop). */
static inline int pl_engine_stopped(const pl_engine *e)
{
    return e->stop && atomic_load_explicit(e->stop, memory_order_relaxed);
}

/* Makes the memory a step works in present (kn_populate: gradients, activations, scratch)
 * without changing it, so that the first step of a new engine after layer copies takes no
 * page faults (on the CPU its pages are faulted in one by one where first touched, about
 * twice the cost of faulting them in at once). Params, m and v are not walked: the copies
 * leave them present (received into populated pages, kept layers' pages moved by
 * kn_share). */
void pl_engine_populate_work(pl_engine *e);
/* Maps present memory over [block + off, + bytes) of a block of the engine's backend, as
 * much of it from the start as it has: the bytes mapped (a KN_SHARE_ALIGN multiple, 0
 * when it has none). */
typedef size_t (*pl_work_source)(void *ctx, void *block, size_t off, size_t bytes);
/* Maps src's work memory (scratch, activations: nothing in it outlives a step; src may be
 * NULL) over as much of dst's as it covers (kn_share, same backend; the gradients are not
 * touched), then, where it runs out, what `more` (if not NULL) gives, region by region:
 * pages already present serve the new engine, which then populates only the rest. The two
 * engines must not run steps at once. Bytes mapped (0 where the backend cannot). */
size_t pl_engine_share_work(pl_engine *dst, const pl_engine *src, pl_work_source more,
                            void *ctx);

/* GPT-2 random initialisation (same values for a layer in any range). */
void pl_engine_init_random(pl_engine *e, uint64_t seed);
/* Loads the range's tensors from an llm.c model of the same configuration. */
int pl_engine_load_llmc(pl_engine *e, const pl_llmc_model *m, char *err, size_t errlen);

/* Forward of one microbatch in `slot`. With the embedding, `tokens` [B·T] are
 * the inputs, else `in` [B,T,C] is the previous stage's output (copied in).
 * With the head, `targets` [B·T] give the returned loss, the mean over the B·T
 * positions (a target of −1 masks its position: it adds 0); without the head
 * the output activation is pl_engine_output() and the return value is 0. */
float pl_engine_forward(pl_engine *e, int slot, const int32_t *tokens, const float *in,
                        const int32_t *targets);
const float *pl_engine_output(const pl_engine *e, int slot);
/* With the head: the softmax probabilities [B·T, Vp] of the last forward in
 * slot (backend memory), until that slot's backward; only after
 * pl_engine_keep_probs(e, 1). By default the forward keeps the logits and two
 * floats per row (kn_crossentropy_forward), which backward turns into the
 * logits' gradient in one pass: the probabilities are never written. */
void pl_engine_keep_probs(pl_engine *e, int on);
const float *pl_engine_probs(const pl_engine *e, int slot);

/* Backward of the microbatch in `slot`. With the head, the loss gradient is
 * dloss_scale per position (1/(tokens of the whole step) for a mean loss);
 * without it `dout` [B,T,C] is the next stage's input gradient. Without the
 * embedding, the gradient w.r.t. this stage's input is pl_engine_input_grad()
 * until the next backward. Frees the slot for the next forward.
 *
 * The step's LAST backward must be pl_engine_backward_last: with both ends of the
 * model, the LM head's share of the tied wte gradient is kept apart (head_dwte)
 * until then and added to the embedding's once, as a pipeline's two wte holders
 * are added by their all-reduce. So one range sums exactly what any split sums. */
void pl_engine_backward(pl_engine *e, int slot, const float *dout, float dloss_scale);

/* The step's last backward: completes the gradients, and calls done(ctx, l) (when
 * not NULL) as soon as layer l's gradients are final, for every layer of the range
 * from high to low: the head (L+1, with the head's wte copy), the blocks, then
 * layer 0 (with the embedding's wte, the head's share added). The runtime uses it
 * to sync finished layers while lower ones still run (Oobleck §6.1). */
typedef void (*pl_layer_done_fn)(void *ctx, int layer);
void pl_engine_backward_last(pl_engine *e, int slot, const float *dout, float dloss_scale,
                             pl_layer_done_fn done, void *ctx);
const float *pl_engine_input_grad(const pl_engine *e);

/* The same with the stage input `in` / output gradient `dout` already in BACKEND
 * memory (a receive of an ordered transport, xport.h): copied within the backend
 * (kn_copy), or not at all when `in` is pl_engine_input_buffer(e, slot). Tokens and
 * targets stay host memory. */
float pl_engine_forward_dev(pl_engine *e, int slot, const int32_t *tokens, const float *in,
                            const int32_t *targets);
/* pl_engine_forward in parts, for a caller that interleaves it with other work (the
 * eager FRC, frc.h): part 0 the input (the embedding of tokens, or `in`, host memory),
 * 1 .. n the blocks, then the head (its part returns the mean loss; the others 0). Parts
 * 0 .. pl_engine_forward_parts − 1 in order compute what pl_engine_forward computes, bit
 * for bit. */
int pl_engine_forward_parts(const pl_engine *e);
float pl_engine_forward_part(pl_engine *e, int slot, int part, const int32_t *tokens,
                             const float *in, const int32_t *targets);
void pl_engine_backward_dev(pl_engine *e, int slot, const float *dout, float dloss_scale);
void pl_engine_backward_last_dev(pl_engine *e, int slot, const float *dout, float dloss_scale,
                                 pl_layer_done_fn done, void *ctx);
/* Backend memory [B,T,C] that slot's next forward reads as its input (without the
 * embedding): a transport may receive into it once the slot's previous microbatch is
 * through its backward. */
float *pl_engine_input_buffer(pl_engine *e, int slot);

void pl_engine_zero_grads(pl_engine *e);

/* The bytes of one slot's activations (everything its backward reads, a multiple of
 * 64), and their copy to host memory (kn_to_host: a memcpy on the CPU). What a forward
 * redundant computation swaps out of backend memory (frc.h; Bamboo §5). */
size_t pl_engine_slot_bytes(const pl_engine *e);
void pl_engine_slot_to_host(const pl_engine *e, int slot, void *host);
/* The reverse (swap-in): host, pl_engine_slot_bytes of an engine of the same range
 * and shape, becomes the slot's activations, as if that slot had run the forward. */
void pl_engine_slot_from_host(pl_engine *e, int slot, const void *host);

/* The buffer `which` with room for nfloats, kept until the engine is destroyed (grown,
 * contents lost, when a step needs more), so that steps allocate nothing: host memory
 * (page-locked off the CPU: kn_host_alloc) but PL_IO_DEV_GRAD, backend memory. NULL when
 * memory runs out. Not counted in act_bytes (the planner's activation figure). */
float *pl_engine_io_buffer(pl_engine *e, pl_engine_io which, size_t nfloats);

/* Σ grad² over the range's tensors, the tied wte counted only where the
 * embedding is (so per-range sums add up to the global norm²). */
double pl_engine_grad_sumsq(pl_engine *e);

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
} pl_adamw;

/* One AdamW step t (1-based) on every tensor; grads are multiplied by
 * grad_scale first (gradient clipping). Weight decay only on 2-D weights. */
void pl_engine_adamw(pl_engine *e, const pl_adamw *o, float grad_scale, int t);

/* The tensor of (layer, index), or NULL if the range does not hold it. */
const pl_engine_tensor *pl_engine_find(const pl_engine *e, int layer, int index);

#endif
