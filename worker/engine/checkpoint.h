/* Checkpoints (ARCHITECTURE.md, "Formats users already have"):
 *   DIR/step-<8 digits>/layers-<begin>-<end>.safetensors  parameters and AdamW
 *       state of a layer range: tensors "layer.<i>.<name>" (loadable by
 *       PyTorch / Hugging Face tools) and "layer.<i>.<name>.exp_avg",
 *       "layer.<i>.<name>.exp_avg_sq" (PyTorch's AdamW state names);
 *   DIR/step-<8 digits>/checkpoint.json  step, data order, model and optimizer
 *       configuration; written last, so its presence marks a complete
 *       checkpoint. Names do not depend on the partitioning: any range can
 *       load from any set of files that covers it. */
#ifndef PLIANT_CHECKPOINT_H
#define PLIANT_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* Permissions: checkpoint files are created 0640 and step directories 0750, each less
 * the process's umask (open(2) and mkdir(2) apply it): the owner writes, the group reads
 * (on Kubernetes the volume's fsGroup, so that other tools of the team can load them),
 * others get nothing. A umask of 077 makes them 0600 and 0700. */
#define PL_CHECKPOINT_FILE_MODE 0640
#define PL_CHECKPOINT_DIR_MODE 0750

/* Writes the engine's range into DIR/step-<step>/ and, when `info_json` is
 * not NULL, checkpoint.json with that content (a JSON object text; the
 * caller puts step, config and data order in it). Files are written to
 * temporary names and renamed, so a crash never leaves a partial file under
 * the final name. */
int pl_checkpoint_save(const pl_engine *e, const char *dir, int64_t step, const char *info_json,
                       char *err, size_t errlen);

/* The same without checkpoint.json, from host copies of params, m and v laid
 * out as e's (e gives the range and tensors only): for background writers. */
int pl_checkpoint_save_host(const pl_engine *e, const float *const host[3], const char *dir,
                            int64_t step, char *err, size_t errlen);

/* Marks DIR/step-<step>/ complete: writes its checkpoint.json (atomically).
 * For writers that save ranges separately (the workers of `pliant run`). */
int pl_checkpoint_complete(const char *dir, int64_t step, const char *info_json, char *err,
                           size_t errlen);

/* The newest complete checkpoint under dir: writes its step directory to
 * out. Returns 1 if found, 0 if none, −1 on error. A directory that itself
 * holds checkpoint.json is returned as is. */
int pl_checkpoint_latest(const char *dir, char *out, size_t outlen, char *err, size_t errlen);

/* Retention: deletes the complete checkpoints under dir but the newest `keep` (keep ≤ 0:
 * none deleted). Each goes checkpoint.json first, so that a deletion cut short leaves an
 * incomplete checkpoint, never a complete one with files missing. Incomplete ones are left
 * alone (a write may be in flight). The number deleted, or -1 and err. */
int pl_checkpoint_prune(const char *dir, int keep, char *err, size_t errlen);

/* Removes the temporary files ("NAME.tmp.XXXXXX", util.h) that writers which died
 * mid-write left in dir and in its step directories of steps ≤ upto (INT64_MAX: all).
 * Call it where no write into those directories can be in flight: after a checkpoint
 * completed (its files and older ones are written), or before the single writer starts.
 * The number removed, or −1 and err naming the file. */
int pl_checkpoint_sweep(const char *dir, int64_t upto, char *err, size_t errlen);

/* Loads every tensor of the engine's range (and, with optimizer, its AdamW
 * state) from the safetensors files of step_dir. Errors name the tensor that
 * is missing or has the wrong shape. */
int pl_checkpoint_load(pl_engine *e, const char *step_dir, int optimizer, char *err,
                       size_t errlen);

/* checkpoint.json of step_dir, its text (caller frees), or NULL with err. */
char *pl_checkpoint_info(const char *step_dir, char *err, size_t errlen);

/* What a checkpoint.json records that loading needs (checkpoint_info.c). */
typedef struct {
    int64_t step;       /* "step": steps done, 0..INT_MAX */
    pl_gpt_config cfg;  /* "model": layers, channels, heads, vocab_size, max_seq_len */
    int seq_len;        /* "data"."seq_len": trained sequence length, 0 when absent */
} pl_checkpoint_meta;

/* Parses checkpoint.json text; `what` names it in errors ("DIR/checkpoint.json:
 * model.layers: must be an integer in [1, 2147483647] (got 4294967298)"). Every
 * number is checked: integral and in range. */
int pl_checkpoint_meta_parse(const char *text, const char *what, pl_checkpoint_meta *out,
                             char *err, size_t errlen);

/* step_dir/checkpoint.json, read and parsed. */
int pl_checkpoint_meta_load(const char *step_dir, pl_checkpoint_meta *out, char *err,
                            size_t errlen);

/* The model configuration and step recorded in step_dir/checkpoint.json. */
int pl_checkpoint_config(const char *step_dir, pl_gpt_config *cfg, int64_t *step, char *err,
                         size_t errlen);

/* A whole-model engine for microbatches of B×T holding the parameters of the
 * newest checkpoint in dir. T = 0 means the sequence length the checkpoint was
 * trained with (positions beyond it have untrained embeddings), or the
 * model's maximum when the checkpoint does not say. */
int pl_engine_from_checkpoint(pl_engine *e, kn_ctx *k, const char *dir, int B, int T, char *err,
                              size_t errlen);

#endif
