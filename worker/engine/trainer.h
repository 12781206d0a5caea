/* `pliant train`: the whole model in one process, a TrainingJob's model,
 * data, batch, optimizer, evaluation and checkpoint parts. */
#ifndef PLIANT_TRAINER_H
#define PLIANT_TRAINER_H

#include <stdio.h>

#include "engine.h"
#include "jobspec.h"
#include "sampler.h"
#include "tokens.h"

typedef struct {
    int steps;                /* > 0 overrides spec.steps */
    const char *metrics_path; /* JSON lines, or NULL */
    int threads;              /* ≤ 0: all cores */
    const char *backend;      /* kernel backend ("cpu", "cuda"); NULL: "cpu" */
    FILE *out;                /* one progress line per step */
} pl_train_options;

/* Trains to the end (resuming from the newest checkpoint when
 * spec.checkpoint.resume is auto). Returns 0, or −1 with err. */
int pl_train(const pl_job *job, const pl_train_options *o, char *err, size_t errlen);

/* Model configuration of a job (preset and overrides already merged). */
int pl_job_gpt_config(const pl_job *job, pl_gpt_config *cfg, char *err, size_t errlen);

/* Initialises a whole-model or partial engine as spec.model.init says:
 * random (seeded), llmc:PATH, or checkpoint:DIR (parameters only). */
int pl_engine_init_from_job(pl_engine *e, const pl_job *job, char *err, size_t errlen);

/* checkpoint.json for the state after `step` steps (malloc'd, NULL when out of
 * memory): job, step, model, data order, optimizer; in `pliant run` and on
 * Kubernetes one worker writes the same file once every layer file is there. */
char *pl_checkpoint_info_json(const pl_job *job, const pl_gpt_config *cfg, int64_t step);

/* Every layer of the checkpoint of `step` is in spec.checkpoint.dir: writes its
 * checkpoint.json, which marks it complete (a worker, when the coordinator asks). */
int pl_job_complete_checkpoint(const pl_job *job, int64_t step, char *err, size_t errlen);

/* After a checkpoint was completed: removes the temporary files crashed writers left in
 * spec.checkpoint.dir up to the newest complete checkpoint (pl_checkpoint_sweep), then,
 * for spec.checkpoint.keep, deletes the complete checkpoints but the newest keep ones
 * (pl_checkpoint_prune). The number of checkpoints deleted (0 with keep 0: all are
 * kept), or -1 and err. */
int pl_job_prune_checkpoints(const pl_job *job, char *err, size_t errlen);

/* The step of the newest complete checkpoint under spec.checkpoint.dir (0: none), what
 * a job resumes from with spec.checkpoint.resume auto. 0, or -1 and err (unreadable). */
int pl_job_checkpoint_step(const pl_job *job, int64_t *step, char *err, size_t errlen);

/* The validation stream's sampler and the number of evaluation batches (evalBatches of
 * micro samples, in the val stream's order): the batches `pliant train` evaluates and the
 * pipelines of `pliant run` share. */
int pl_job_eval_sampler(const pl_job *job, const pl_tokens *val, pl_sampler *vs,
                        int64_t *nbatches, char *err, size_t errlen);

#endif
