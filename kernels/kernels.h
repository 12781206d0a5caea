/* The compute kernels of the GPT engine, behind one interface for every
 * backend (kernels/cpu/; kernels/cuda/, built in by `make cuda`). kernels.c
 * dispatches each call to the context's backend. The engine calls only these
 * functions, never BLAS or CUDA directly.
 *
 * Layouts follow llm.c's train_gpt2.c: activations are row-major [B, T, C]
 * (B sequences of T tokens, C channels); a weight of a linear layer mapping C
 * to OC channels is [OC, C] (out = inp · Wᵀ + bias). Tensors are fp32, but for
 * the low-precision copies CUDA's bf16 mode hands between kernels (below) and
 * the scratch some functions keep in the backend's format (the MLP's
 * pre-activation, the LM head's logits); all live in memory from kn_alloc (host
 * memory on the CPU backend, device memory on the GPU backend). Backward kernels ACCUMULATE (+=) into parameter
 * gradients and into input gradients unless a function says otherwise, so that
 * microbatches and the tied embedding add up naturally. */
#ifndef PLIANT_KERNELS_H
#define PLIANT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kn_ctx kn_ctx;

/* Creates a backend context: "cpu" (threads ≤ 0 means all available cores) or
 * "cuda" (the current CUDA device, one stream; threads is ignored; NULL with
 * the reason in err when this build has no CUDA backend or there is no
 * device, or when PLIANT_PRECISION is not one of bf16, fp32, tf32). On CUDA the
 * environment picks the precision of the matmuls (kn_precision). "cpu-lowp" is
 * the CPU with the bf16 copies of CUDA's bf16 mode emulated (kernels/cpu/lowp.c):
 * for tests of the code that hands them around. */
kn_ctx *kn_create(const char *backend, int threads, char *err, size_t errlen);
void kn_destroy(kn_ctx *k);
const char *kn_backend(const kn_ctx *k);

/* OpenBLAS chooses its CPU kernels once, as the program loads, by CPU model; on a
 * model newer than the library it falls back to its oldest, SSE3 ones (Debian
 * bookworm's 0.3.21 on Sapphire and Emerald Rapids: a tenth of the sgemm speed).
 * When OpenBLAS runs kernels without AVX2 on a CPU that has AVX2 and FMA: the best
 * kernel set the CPU can run, as an OPENBLAS_CORETYPE value; else NULL. A program
 * sets OPENBLAS_CORETYPE to it and executes itself again (pliant's main does). */
const char *kn_cpu_blas_better_core(void);
/* The above, done: called first thing in main (nothing to undo yet), it executes the
 * program again with OPENBLAS_CORETYPE set when that helps and the user did not set it;
 * it returns only when it does nothing or the exec fails (then the slow kernels stay). */
void kn_cpu_use_fast_blas(char **argv);
int kn_threads(const kn_ctx *k);

/* Memory of the backend, 64-byte aligned, zero-filled. NULL on failure. kn_free releases
 * the memory of the block that no other live block maps (kn_share); memory another block
 * still maps stays until that block is freed too. */
void *kn_alloc(kn_ctx *k, size_t bytes);
void kn_free(kn_ctx *k, void *p);
void kn_zero(kn_ctx *k, void *p, size_t bytes);
/* Copies between backend memory and host memory (plain memcpy on the CPU). */
void kn_to_device(kn_ctx *k, void *dst, const void *src, size_t bytes);
void kn_to_host(kn_ctx *k, void *dst, const void *src, size_t bytes);
/* Waits for queued work (a no-op on the CPU). */
void kn_sync(kn_ctx *k);
/* Copies within backend memory (device to device on CUDA; queued, no wait). */
void kn_copy(kn_ctx *k, void *dst, const void *src, size_t bytes);
/* Makes [dst_block + dst_off, + bytes) the same memory as [src_block + src_off, + bytes)
 * rather than a copy of it: both blocks from kn_alloc, offsets and bytes multiples of
 * KN_SHARE_ALIGN, within the blocks. Afterwards a write through either range is seen
 * through both, so the caller writes neither while both blocks live (the layer copies: a
 * layer a worker keeps, shared by its old and new engines until the old one is freed).
 * Freeing either block leaves the other whole; it releases what no other live block maps
 * (the source freed first: all but the shared range, which stays as long as a block maps
 * it, one it was shared on to included). On the CPU the source's pages that are present
 * move to the destination with their page tables: present there at once (no faults,
 * nothing for kn_populate to do), and the source's range finds them again on its next
 * touch. 0 when done; −1 when the backend or these blocks cannot (nothing changed:
 * copy instead). */
#define KN_SHARE_ALIGN 4096
int kn_share(kn_ctx *k, void *dst_block, size_t dst_off, const void *src_block, size_t src_off,
             size_t bytes);
/* Makes the memory of [p, p + bytes) (backend memory from kn_alloc) present and writable
 * without changing what it holds, so that later writes take no page faults: on the CPU a
 * block's pages come from the kernel on first touch, one fault each (layer copies
 * receiving into a new engine). Any thread, also while another writes the range. 0, or −1
 * where the backend or the system cannot (nothing changed: the pages come when touched). */
int kn_populate(kn_ctx *k, void *p, size_t bytes);
/* Host memory for staging transfers to and from backend memory: page-locked on
 * CUDA (so copies run at full speed), plain aligned memory on the CPU; zero-filled. */
void *kn_host_alloc(kn_ctx *k, size_t bytes);
void kn_host_free(kn_ctx *k, void *p);

/* The arithmetic of the matmuls: "fp32" (the CPU; CUDA with PLIANT_PRECISION=fp32),
 * "tf32" (fp32 tensors, TF32 tensor-core products; PLIANT_PRECISION=tf32, or
 * PLIANT_TF32=1 when PLIANT_PRECISION is unset) or "bf16" (CUDA's default,
 * PLIANT_PRECISION=bf16: bf16 copies of the operands, fp32 accumulation and
 * fp32 results). Read once, at kn_create. Parameters, optimizer state and
 * every other kernel stay fp32. */
const char *kn_precision(const kn_ctx *k);

/* The device's identity for the runtime: its UUID as nvidia-smi prints it
 * ("GPU-8-4-4-4-12 hex digits"), "" on the CPU. Two workers with the same id share
 * a GPU (then NCCL cannot join them). */
const char *kn_device_id(const kn_ctx *k);
/* Bytes of memory the backend computes in: the GPU's (CUDA), the machine's RAM on the CPU
 * (and for k NULL). */
size_t kn_device_memory(const kn_ctx *k);
/* The cudaStream_t that every kernel and copy of the context is queued on (for a
 * transport that orders its own stream against it with events); NULL on the CPU. */
void *kn_stream_handle(kn_ctx *k);

/* ---- forward / backward kernels ------------------------------------------ */

/* out[b,t,:] = wte[inp[b,t],:] + wpe[t,:], for wte of V rows. A token id outside
 * [0, V) is bad data (the loader refuses such shards: shared/tokens.h): nothing is read
 * or written out of bounds; its row of out is NaN, so the loss and the gradient norm of
 * the step turn non-finite and the runtime never commits it (as the cross-entropy does
 * with a target ≥ V). */
void kn_encoder_forward(kn_ctx *k, float *out, const int32_t *inp, const float *wte,
                        const float *wpe, int B, int T, int C, int V);
/* dwte[inp[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]. A position whose id is
 * outside [0, V) adds nothing to dwte (its dwpe row still gets dout). */
void kn_encoder_backward(kn_ctx *k, float *dwte, float *dwpe, const float *dout,
                         const int32_t *inp, int B, int T, int C, int V);

/* LayerNorm over C with eps 1e-5; saves mean[B·T] and rstd[B·T] for backward. out_lp
 * (NULL or kn_lowp_bytes(k, B·T·C)) receives out's low-precision copy; then out itself
 * may be left unwritten: the matmuls read out through out_lp (the backward reads inp). */
void kn_layernorm_forward(kn_ctx *k, float *out, void *out_lp, float *mean, float *rstd,
                          const float *inp, const float *weight, const float *bias, int B, int T,
                          int C);
/* dinp += the gradient w.r.t. inp; dweight += Σ dout·norm; dbias += Σ dout. dinp_lp
 * (NULL or kn_lowp_bytes(k, B·T·C); only with dinp) receives the low-precision copy of
 * dinp's value after this call's accumulation (the engine's residual gradient, which
 * matmul backwards then read as their dout_lp). dinp itself is still written in fp32: it
 * goes on accumulating. dout_lp: dout's low-precision copy (below) or NULL; with it dout
 * is not read (CUDA's bf16 mode: the matmul backward that made dout wrote only the copy,
 * kn_matmul_backward_set's dinp_lp). */
void kn_layernorm_backward(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight, float *dbias,
                           const float *dout, const void *dout_lp, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int B,
                           int T, int C);

/* Low-precision copies of matmul inputs. In CUDA's bf16 mode a matmul multiplies
 * bf16 copies of its fp32 operands; an input that the forward and the backward
 * (dweight) both read can be converted once and kept. kn_lowp_bytes is the size
 * of such a copy of n values: 0 where the backend multiplies the fp32 values
 * themselves (the CPU; CUDA in fp32 and tf32), and then every `_lp` argument
 * (the layernorms' above too) is NULL. kn_to_lowp makes the copy (the backend's
 * memory, 16-byte aligned); kn_layernorm_forward, kn_attention_forward,
 * kn_matmul_forward and kn_matmul_gelu_forward can write one of their output as
 * they go (then leaving the fp32 output unwritten), and
 * kn_layernorm_backward, kn_attention_backward, kn_matmul_backward_gelu and
 * kn_matmul_backward_set one of their input gradient. An `inp_lp` or `dout_lp`
 * given to a matmul (or a layernorm backward) must hold the copy of its tensor's
 * current values: it is read instead of converting the tensor (a stale copy gives
 * wrong results, silently). */
size_t kn_lowp_bytes(kn_ctx *k, size_t n);
void kn_to_lowp(kn_ctx *k, void *lp, const float *src, size_t n);
/* A weights mirror: makes lp (kn_lowp_bytes(k, n), the caller's memory) the
 * low-precision copy of src[0, n) as src is now (kn_to_lowp), and registers it for
 * src in k: from then on a matmul or LM head whose weight lies within [src, src + n)
 * reads the copy at the same offset instead of converting the weight at each call
 * (CUDA's bf16 mode: once a step instead of at every forward and backward). The
 * copy is NOT updated by later writes to src: the caller must call this again after
 * any write to src[0, n) before the next matmul on those weights, or those matmuls
 * compute with the old weights, silently. n = 0 (or lp NULL) drops src's
 * registration (then the matmuls convert again); the caller drops it before freeing
 * src or lp. A no-op where kn_lowp_bytes is 0 (the CPU; CUDA's fp32 and tf32).
 * One registration per src, KN_MIRRORS (8) per context; past that, none is made and
 * the matmuls convert. Like every call on k: one thread at a time, queued after the
 * kernels before it. */
void kn_lowp_mirror(kn_ctx *k, void *lp, const float *src, size_t n);

/* out[B·T, OC] = inp[B·T, C] · weight[OC, C]ᵀ + bias[OC] (bias may be NULL). Overwrites out.
 * inp_lp: inp's low-precision copy (above) or NULL. out_lp (NULL or kn_lowp_bytes(k,
 * BT·OC)) receives out's low-precision copy; then out itself may be left unwritten
 * (CUDA's bf16 mode writes only the copy, from the GEMM). */
void kn_matmul_forward(kn_ctx *k, float *out, void *out_lp, const float *inp,
                       const void *inp_lp, const float *weight, const float *bias, int BT,
                       int C, int OC);
/* out = res + inp · weightᵀ + bias: a projection that closes a residual branch
 * with its residual add, res [BT, OC] not overlapping out. On CUDA one GEMM that
 * reads res as its C matrix, so the projection's output is never stored apart;
 * elsewhere bit for bit kn_matmul_forward into out, then kn_residual_forward(out,
 * res, out). */
void kn_matmul_residual_forward(kn_ctx *k, float *out, const float *res, const float *inp,
                                const void *inp_lp, const float *weight, const float *bias, int BT,
                                int C, int OC);
/* dinp += dout · weight; dweight += doutᵀ · inp; dbias += Σ rows of dout (dbias may be NULL).
 * dout_lp, inp_lp: dout's and inp's low-precision copies (above) or NULL; with dout_lp
 * dout is not read (dbias too is summed from the copy). */
void kn_matmul_backward(kn_ctx *k, float *dinp, float *dweight, float *dbias, const float *dout,
                        const void *dout_lp, const float *inp, const void *inp_lp,
                        const float *weight, int BT, int C, int OC);

/* kn_matmul_backward with dinp OVERWRITTEN (dinp = dout · weight): what the
 * engine used to get by zeroing dinp first, without the memset and, on CUDA,
 * without the GEMM reading dinp back (beta 0). The CPU zeroes and accumulates,
 * bit for bit the zero-then-kn_matmul_backward it replaces. dinp_lp (NULL or
 * kn_lowp_bytes(k, BT·C); only with dinp) receives dinp's low-precision copy (the
 * layernorm backward's dout_lp); then dinp itself may be left unwritten (CUDA's bf16
 * mode: the dinp GEMM writes only the copy). Only this overwriting variant has one:
 * kn_matmul_backward's dinp accumulates. */
void kn_matmul_backward_set(kn_ctx *k, float *dinp, void *dinp_lp, float *dweight, float *dbias,
                            const float *dout, const void *dout_lp, const float *inp,
                            const void *inp_lp, const float *weight, int BT, int C, int OC);

/* Causal multi-head self-attention. qkv is [B, T, 3C] (q, k, v, each C = NH·hs
 * channels); out is [B, T, C] (overwritten); att, of kn_attention_state_floats
 * floats, is what the backend keeps for backward: the CPU saves the softmax
 * probabilities [B, NH, T, T] (row t uses columns 0..t); CUDA runs a fused
 * (flash) attention that keeps each row's log-sum-exp [B, NH, T] (and, in
 * bf16 mode, room for packed bf16 q, k, v where its kernels cannot read qkv_lp
 * in place), so no T×T matrix reaches memory. qkv_lp set: every call with this
 * state will be given qkv's low-precision copy, 16-byte aligned (CUDA then
 * keeps no packing room where the sizes let its kernels read that copy in
 * place); 0: it may be NULL. Scale 1/sqrt(hs). out_lp (NULL or kn_lowp_bytes(k, B·T·C)) receives
 * out's low-precision copy; then out itself may be left unwritten (CUDA's bf16
 * mode writes only the copy: the projection's matmuls and, as its out_lp, the
 * backward read that). qkv_lp: qkv's low-precision copy (its matmul's out_lp) or
 * NULL; given, it is read instead of qkv, by the backward too (the same one). */
size_t kn_attention_state_floats(kn_ctx *k, int B, int T, int C, int NH, int qkv_lp);
void kn_attention_forward(kn_ctx *k, float *out, void *out_lp, float *att, const float *qkv,
                          const void *qkv_lp, int B, int T, int C, int NH);
/* dqkv = gradient of the attention w.r.t. qkv (overwritten). out is the forward's output
 * [B, T, C] for these qkv (CUDA uses it for rowsum(dout ∘ out); the CPU
 * ignores it). dqkv_lp (NULL or kn_lowp_bytes(k, B·T·3C)) receives dqkv's
 * low-precision copy, [B, T, 3C] as dqkv, the qkv matmul's dout_lp; then dqkv
 * itself may be left unwritten. dout_lp, out_lp: dout's and out's low-precision
 * copies (dout's from the projection's kn_matmul_backward_set dinp_lp, out's the
 * forward's out_lp) or NULL; given, each is read instead of its tensor (which may
 * then hold anything), and CUDA sums rowsum(dout ∘ out) over the bf16 values (in
 * fp32). */
void kn_attention_backward(kn_ctx *k, float *dqkv, void *dqkv_lp, const float *dout,
                           const void *dout_lp, const float *qkv, const void *qkv_lp,
                           const float *att, const float *out, const void *out_lp, int B, int T,
                           int C, int NH);

/* out = gelu(pre), pre = inp · weightᵀ + bias (both overwritten): the MLP's first
 * matmul with its GELU. pre is the scratch kn_matmul_backward_gelu reads, in the
 * backend's format: fp32 values where kn_lowp_bytes is 0; bf16 where it is not, the
 * buffer then only kn_lowp_bytes(k, BT·OC) long (CUDA's bf16 mode: the GEMM writes pre
 * in bf16 and the GELU pass reads it, llm.c's choice), and out is then gelu of those
 * values.
 * out_lp (NULL or kn_lowp_bytes(k, BT·OC)) receives out's low-precision copy; then
 * out itself may be left unwritten: every later matmul reads out through out_lp. */
void kn_matmul_gelu_forward(kn_ctx *k, float *out, void *out_lp, float *pre, const float *inp,
                            const void *inp_lp, const float *weight, const float *bias, int BT,
                            int C, int OC);
/* Backward of out = gelu(pre) · weightᵀ + bias for the MLP's second matmul (inp =
 * gelu(pre), [BT, C]; pre as kn_matmul_gelu_forward left it, in the backend's
 * format): dpre = (dout · weight) ⊙ gelu'(pre), OVERWRITTEN (with dpre_lp in
 * CUDA's bf16 mode the product is rounded to bf16 first);
 * dweight += doutᵀ · inp; dbias += Σ rows of dout. dpre_lp (NULL or
 * kn_lowp_bytes(k, BT·C)) receives dpre's low-precision copy, the next
 * matmul's dout_lp; then dpre itself may be left unwritten. dout_lp, inp_lp:
 * as kn_matmul_backward's (with dout_lp dout is not read, dbias too is summed
 * from the copy). */
void kn_matmul_backward_gelu(kn_ctx *k, float *dpre, void *dpre_lp, float *dweight, float *dbias,
                             const float *dout, const void *dout_lp, const float *inp,
                             const void *inp_lp, const float *weight, const float *pre, int BT,
                             int C, int OC);

/* GELU, tanh approximation (GPT-2). out overwritten; dinp += dout·gelu'(inp). */
void kn_gelu_forward(kn_ctx *k, float *out, const float *inp, size_t n);
void kn_gelu_backward(kn_ctx *k, float *dinp, const float *inp, const float *dout, size_t n);

/* out = a + b (out overwritten; may alias a or b). */
void kn_residual_forward(kn_ctx *k, float *out, const float *a, const float *b, size_t n);
/* dst += src */
void kn_accumulate(kn_ctx *k, float *dst, const float *src, size_t n);

/* Softmax over the first V of Vp logits per row and cross-entropy against
 * targets: probs[B·T, Vp] (padded columns 0), losses[B·T] = −log p[target].
 * A target < 0 masks the position (loss 0). probs may alias logits (in place). */
void kn_softmax_crossentropy_forward(kn_ctx *k, float *losses, float *probs, const float *logits,
                                     const int32_t *targets, int BT, int V, int Vp);
/* dlogits = (probs − onehot(target)) · dloss_scale, overwritten; padded columns 0.
 * dloss_scale is the weight of each position in the loss (1/(B·T) for a mean).
 * dlogits may alias probs (in place); masked positions (target < 0) get 0. */
void kn_crossentropy_softmax_backward(kn_ctx *k, float *dlogits, const float *probs,
                                      const int32_t *targets, float dloss_scale, int BT, int V,
                                      int Vp);

/* The same loss and gradient without materializing the probabilities (the
 * training path: llm.c's fused_classifier idea, split at the forward/backward
 * boundary because the loss weight is only known at backward). Forward:
 * losses[B·T] as kn_softmax_crossentropy_forward, stats[2·B·T] = per row
 * (max, Σ e^(logit − max)) over the first V logits; logits are left unchanged.
 * Backward: dlogits = (softmax − onehot(target)) · dloss_scale from logits and
 * stats, overwritten, padded columns 0, masked rows 0; dlogits may alias logits
 * (in place). Same rounding as the pair above on the CPU (bit for bit): each
 * probability is e^(logit − max) · (1/sum). On CUDA the forward reads the logits
 * once (online max and sum) and the backward reads and writes them once. */
void kn_crossentropy_forward(kn_ctx *k, float *losses, float *stats, const float *logits,
                             const int32_t *targets, int BT, int V, int Vp);
void kn_crossentropy_backward(kn_ctx *k, float *dlogits, const float *logits, const float *stats,
                              const int32_t *targets, float dloss_scale, int BT, int V, int Vp);
/* The LM head's forward for training: logits = inp · weightᵀ ([BT, Vp], no bias;
 * inp_lp as kn_matmul_forward), then losses and stats as kn_crossentropy_forward.
 * logits is the scratch that kn_lm_head_backward reads, in the backend's format:
 * fp32 rows on the CPU (bit for bit kn_matmul_forward then
 * kn_crossentropy_forward); in CUDA's bf16 mode bf16 over the first half of each
 * row (llm.c's choice: half the bytes written by the matmul and read by the loss
 * and its gradient), and where a row fits one block's shared memory (Vp ≤ 57344)
 * already the gradient without the loss weight, made in the pass that reads the
 * logits for the loss (llm.c's fused classifier; the backward's GEMMs apply the
 * weight). */
void kn_lm_head_forward(kn_ctx *k, float *losses, float *stats, float *logits, const float *inp,
                        const void *inp_lp, const float *weight, const int32_t *targets, int BT,
                        int C, int V, int Vp);
/* The LM head's backward from the logits and stats kn_lm_head_forward left:
 * dlogits as kn_crossentropy_backward, then dinp = dlogits · weight
 * (overwritten, [BT, C]) and dweight += dlogitsᵀ · inp ([Vp, C]), as
 * kn_matmul_backward_set without a bias. logits is the scratch the dlogits are
 * made in: its contents are undefined afterwards. The CPU makes the fp32 dlogits
 * in place; CUDA in bf16 mode writes them as bf16 over the bf16 logits (or finds
 * them there, unscaled), which the matmul reads directly (half the bytes, no
 * conversion). */
void kn_lm_head_backward(kn_ctx *k, float *dinp, float *dweight, float *logits,
                         const float *stats, const int32_t *targets, float dloss_scale,
                         const float *inp, const void *inp_lp, const float *weight, int BT, int C,
                         int V, int Vp);

/* ---- optimizer and reductions -------------------------------------------- */

/* AdamW step t (1-based) with bias correction, on n parameters:
 *   g = grads·grad_scale; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
 *   p −= lr·( (m/(1−β1^t)) / (sqrt(v/(1−β2^t)) + eps) + weight_decay·p ) */
void kn_adamw_update(kn_ctx *k, float *params, const float *grads, float *m, float *v, size_t n,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     float grad_scale, int t);

/* One span of kn_adamw_update_spans: n parameters from offset, with or
 * without weight decay. */
typedef struct {
    size_t offset, n;
    int decay;
} kn_adamw_span;
/* kn_adamw_update on every span of params, grads, m and v (the same offsets in
 * all four), weight_decay where decay is set and 0 elsewhere: the same results
 * as one kn_adamw_update per span, in fewer launches on CUDA (one per
 * KN_ADAMW_SPANS spans; the engine's tensors are ~150 launches otherwise, most
 * of them biases smaller than a launch's cost). Spans must not overlap. */
#define KN_ADAMW_SPANS 160
void kn_adamw_update_spans(kn_ctx *k, float *params, const float *grads, float *m, float *v,
                           const kn_adamw_span *spans, int nspans, float lr, float beta1,
                           float beta2, float eps, float weight_decay, float grad_scale, int t);

/* Σ x² in double (for the global gradient norm). */
double kn_sum_squares(kn_ctx *k, const float *x, size_t n);

/* Σ x in double (losses). */
double kn_sum(kn_ctx *k, const float *x, size_t n);

/* ---- kernel-level timing and memory figures (benchmarks, reports) -------- */

/* Timing of every kernel call above (and kn_zero; not allocation or copies):
 * per kernel, the number of calls and the total time it ran. The CPU measures
 * each call with the clock (its kernels are synchronous); CUDA records a pair of
 * events around each call on the stream, so a kernel's time is the device's and
 * host gaps between kernels go to no kernel. Off by default; while off each
 * call pays one predictable branch. On CUDA, timing adds two event records per
 * call and a wait for the stream when its event pool fills. kn_profile_enable
 * returns 0, or −1 (out of memory: timing stays off). */
typedef struct {
    const char *name; /* the kernels.h function without "kn_": "matmul_forward", ... */
    long long calls;
    double ms;        /* total */
} kn_profile_entry;
int kn_profile_enable(kn_ctx *k, int on);
/* Waits for queued work, then writes up to max entries (kernels called at least
 * once since the last reset, longest total first) and returns how many there are. */
int kn_profile_report(kn_ctx *k, kn_profile_entry *out, int max);
/* Forgets what was recorded (waits for queued work first). */
void kn_profile_reset(kn_ctx *k);

/* Backend memory from kn_alloc (CUDA: the context's arena of cudaMalloc'ed
 * chunks, workspace included; see kernels/cuda/arena.cu). Returns 0, or −1 where
 * the backend does not track its memory (the CPU). */
typedef struct {
    size_t reserved; /* taken from the device */
    size_t in_use;   /* handed out by kn_alloc and the workspace */
    size_t peak;     /* largest in_use so far */
    int chunks;      /* cudaMalloc calls behind `reserved` */
} kn_mem_stats;
int kn_memory_stats(kn_ctx *k, kn_mem_stats *out);

#ifdef __cplusplus
}
#endif

#endif
