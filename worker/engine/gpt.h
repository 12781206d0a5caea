/* GPT-2 model definition as layers (ARCHITECTURE.md: "layers are the unit of
 * everything"): layer 0 is the embedding (wte, wpe), layers 1..L the
 * transformer blocks, layer L+1 the head (final LayerNorm; the LM head's
 * weight is wte, tied). Tensor names are stable across partitionings:
 * "layer.<i>.<name>" with llm.c's names. */
#ifndef PLIANT_GPT_H
#define PLIANT_GPT_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int L;    /* transformer blocks */
    int C;    /* channels */
    int NH;   /* heads */
    int V;    /* vocabulary */
    int Vp;   /* vocabulary padded to a multiple of 128 */
    int maxT; /* max sequence length (rows of wpe) */
} pl_gpt_config;

/* Fills Vp from V; −1 with err if the sizes are invalid. */
int pl_gpt_config_init(pl_gpt_config *c, int L, int C, int NH, int V, int maxT, char *err,
                       size_t errlen);

static inline int pl_gpt_nlayers(const pl_gpt_config *c)
{
    return c->L + 2;
}

typedef enum { PL_LAYER_EMBEDDING, PL_LAYER_BLOCK, PL_LAYER_HEAD } pl_layer_kind;
pl_layer_kind pl_gpt_layer_kind(const pl_gpt_config *c, int layer);

/* One parameter tensor of a layer. */
typedef struct {
    const char *name; /* llm.c's name: wte, wpe, ln1w, ..., lnfw, lnfb */
    int ndim;
    int dims[2];
    size_t numel;
    int decay;        /* weight decay applies (2-D weights only) */
    float init_std;   /* normal(0, std); 0 with init_value for LayerNorm/bias */
    float init_value;
} pl_tensor_spec;

/* Tensors of a layer, in storage order (the head lists only lnfw, lnfb: its
 * tied wte belongs to layer 0). Returns the count; specs[] holds at most 12. */
#define PL_MAX_LAYER_TENSORS 12
int pl_gpt_layer_tensors(const pl_gpt_config *c, int layer, pl_tensor_spec *specs);

/* Parameters of one layer / of the whole model (wte counted once). */
size_t pl_gpt_layer_params(const pl_gpt_config *c, int layer);
size_t pl_gpt_total_params(const pl_gpt_config *c);

/* GPT-2 initialisation of one tensor, identical whatever range holds it:
 * the random stream is keyed by (seed, layer, tensor index). Padded vocabulary
 * rows of wte are zero. */
void pl_gpt_init_tensor(const pl_gpt_config *c, uint64_t seed, int layer, int tensor_index,
                        float *out);

/* ---- llm.c checkpoint files (gpt2_124M.bin: magic 20240326, version 3 = fp32
 * with padded vocabulary). Parameters are stored tensor-major there
 * (all layers' ln1w, then all ln1b, ...); these helpers convert. */

typedef struct {
    pl_gpt_config cfg;
    float *params; /* llm.c order, pl_gpt_total_params floats */
} pl_llmc_model;

int pl_llmc_read(const char *path, pl_llmc_model *out, char *err, size_t errlen);
void pl_llmc_free(pl_llmc_model *m);
/* Pointer to the llm.c storage of (layer, tensor index), with its row stride
 * semantics identical to ours (each tensor is contiguous there too). */
const float *pl_llmc_tensor(const pl_llmc_model *m, int layer, int tensor_index);
/* Writes an llm.c file from a getter that returns each (layer, tensor) of ours. */
typedef const float *(*pl_tensor_getter)(void *ctx, int layer, int tensor_index);
int pl_llmc_write(const char *path, const pl_gpt_config *c, pl_tensor_getter get, void *ctx,
                  char *err, size_t errlen);

#endif
