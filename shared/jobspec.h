/* The TrainingJob manifest (../shared/TRAININGJOB.md): one format for
 * `pliant train`, `pliant run` and the operator. Parsing fills every default;
 * validation errors name the field by its path and the reason, e.g.
 * "spec.batch.micro: must divide spec.batch.global (64)". */
#ifndef PLIANT_JOBSPEC_H
#define PLIANT_JOBSPEC_H

#include <stddef.h>
#include <stdint.h>

#define PL_PATH_MAX 1024
#define PL_NAME_MAX 254

typedef enum { PL_INIT_RANDOM, PL_INIT_LLMC, PL_INIT_CHECKPOINT } pl_init_kind;
typedef enum { PL_ORDER_SHUFFLED, PL_ORDER_SEQUENTIAL } pl_data_order;
typedef enum { PL_SCHEDULE_COSINE, PL_SCHEDULE_CONSTANT } pl_lr_schedule;
typedef enum { PL_RESUME_AUTO, PL_RESUME_NEVER } pl_resume;
typedef enum { PL_STRATEGY_TEMPLATES, PL_STRATEGY_CHECKPOINT, PL_STRATEGY_REDUNDANT } pl_ft_strategy;
/* With strategy redundant (Bamboo, docs/redundant.md): when the forward redundant
 * computation (FRC) of the successor's layers runs. Eager: every step, in the 1F1B
 * bubbles (Bamboo §5.2); lazy: only after a loss. */
typedef enum { PL_FRC_EAGER, PL_FRC_LAZY } pl_frc_mode;
/* spec.faultTolerance.belowMinimum: what a job does when a loss leaves fewer than (F+1)·n0
 * workers: wait for workers (waitForNodesTimeoutSeconds), or train on the pipelines the
 * remaining workers form with a lower tolerance until workers join. */
typedef enum { PL_BELOW_MIN_WAIT, PL_BELOW_MIN_DEGRADE } pl_below_minimum;

typedef struct {
    char preset[32];      /* gpt2-tiny | gpt2-d6 | gpt2-124m | gpt2-350m | gpt2-774m | gpt2-1558m */
    int layers;           /* L */
    int channels;         /* C */
    int heads;            /* NH */
    int vocab_size;       /* V (padded internally to a multiple of 128) */
    int max_seq_len;      /* maxT */
    pl_init_kind init;
    char init_path[PL_PATH_MAX]; /* for llmc:PATH and checkpoint:DIR */
    uint64_t seed;
} pl_model_spec;

typedef struct {
    char train[PL_PATH_MAX]; /* glob of llm.c token shards (required) */
    char val[PL_PATH_MAX];   /* glob; empty = no validation data */
    pl_data_order order;
    uint64_t seed;
} pl_data_spec;

typedef struct {
    int global;  /* sequences per optimizer step */
    int micro;   /* sequences per microbatch */
    int seq_len; /* tokens per sequence */
} pl_batch_spec;

typedef struct {
    double lr;
    pl_lr_schedule schedule;
    int warmup_steps;
    double min_lr_ratio;
    double beta1, beta2, eps;
    double weight_decay;
    double grad_clip; /* 0 = off */
} pl_optimizer_spec;

typedef struct {
    char dir[PL_PATH_MAX]; /* empty = no checkpoints */
    int every;             /* steps; 0 = only at the end */
    pl_resume resume;
    int keep;              /* the newest complete checkpoints kept; 0 = all */
} pl_checkpoint_spec;

typedef struct {
    pl_ft_strategy strategy;
    pl_frc_mode redundant_forward; /* spec.faultTolerance.redundantForward (redundant only) */
    int tolerate;
    int max_resets;
    int hosts_added_check_every;
    double heartbeat_seconds;
    double step_timeout_seconds; /* a step's deadline; 0 = automatic (docs/runtime.md) */
    double wait_for_nodes_timeout_seconds;
    pl_below_minimum below_minimum;
} pl_fault_tolerance_spec;

/* spec.cost: what a node costs, dollars per node-hour (`pliant simulate`'s default prices). */
typedef struct {
    double spot;           /* a spot (preemptible) node; 0 = unset */
    double on_demand;      /* the same node on demand; 0 = unset */
} pl_cost_spec;

typedef struct {
    int min, max;          /* max 0 = unset (pliant run: --workers) */
    int gpus_per_node;
} pl_nodes_spec;

typedef struct {
    char name[PL_NAME_MAX];      /* metadata.name */
    char namespace_[PL_NAME_MAX];/* metadata.namespace ("" = default) */
    pl_model_spec model;
    pl_data_spec data;
    pl_batch_spec batch;
    pl_optimizer_spec optimizer;
    int steps;
    int eval_every;              /* 0 = off */
    int eval_batches;
    pl_checkpoint_spec checkpoint;
    pl_fault_tolerance_spec fault_tolerance;
    pl_nodes_spec nodes;
    pl_cost_spec cost;
    char profile[PL_PATH_MAX];   /* "auto" or a path to a planner profile */
    char *worker_json;           /* spec.worker as JSON text (operator only), NULL if absent */
    char *run_policy_json;       /* spec.runPolicy as JSON text, NULL if absent */
} pl_job;

/* Parses a TrainingJob manifest (YAML or JSON text). Relative paths in the data,
 * init and checkpoint fields are resolved against base_dir when base_dir is not
 * NULL. Returns 0, or −1 with "field.path: reason" in err. */
int pl_job_parse(const char *text, const char *base_dir, pl_job *job, char *err, size_t errlen);
int pl_job_load(const char *path, pl_job *job, char *err, size_t errlen);
void pl_job_free(pl_job *job);
/* spec.faultTolerance.strategy's word for s ("templates", "checkpoint", "redundant"). */
const char *pl_ft_strategy_name(pl_ft_strategy s);
/* The strategy a word names: 0, or -1 for none. */
int pl_ft_strategy_from_name(const char *name, pl_ft_strategy *out);
/* spec.faultTolerance.belowMinimum's word for b ("wait", "degrade"). */
const char *pl_below_minimum_name(pl_below_minimum b);
/* The belowMinimum a word names: 0, or -1 for none. */
int pl_below_minimum_from_name(const char *name, pl_below_minimum *out);

/* Fills the model sizes of a preset name; −1 if unknown. */
int pl_model_preset(const char *name, pl_model_spec *m);

#endif
