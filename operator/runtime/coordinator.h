/* The coordinator's core (docs/runtime.md "One step", "Recovery"; docs/protocol.md):
 * membership, plan generations and the step state machine, as a PURE state
 * machine. No sockets, no threads, no clock: the caller feeds events (with the
 * time in milliseconds where it matters) and drains the outgoing messages with
 * pl_coord_next. Not thread-safe: one caller at a time.
 *
 * Choices (keep in mind when wiring it to the control server):
 * - Ranks are registration order (0, 1, ...; never reused). Workers are named;
 *   a name registered twice while live is refused (-1).
 * - Generation 1 is the first plan. Plans and stop go to every live worker
 *   (idle ones included, "you" = null); start_step, commit and abort go to the
 *   workers of the plan's pipelines. The coordinator waits for copy_done from
 *   every live worker that received the current plan.
 * - At start every worker initialises its own layers (no copies). Afterwards
 *   re-instantiation (pl_reinstantiate) starts from the last plan whose copies
 *   all completed (the "stable" plan): workers must keep the layers of that plan
 *   until the next start_step.
 * - A failure of a pipeline worker before commit: abort s to the surviving
 *   pipeline workers (envelope gen = the old generation), new generation, new
 *   plans, copy_done, start_step s again. A failure after commit s was sent:
 *   the commit stands (the step counts); the coordinator waits for committed
 *   from the live ones and reconfigures before s+1. A failure during the copy
 *   phase replans at once from the stable plan. A lost idle worker, a join and
 *   `leaving` are handled at the next step boundary; a `leaving` whose grace
 *   period that boundary and the copies would outlast aborts the step instead, and
 *   one from a worker of the plan during its copy phase replans at once. The
 *   leaving worker is a copy source of the new plan (TCP) until its copies are
 *   done, then gets stop {0}.
 * - peer_broken is treated as the loss of the named peer.
 * - Checkpoints: after committing step s with s+1 a checkpoint step (every
 *   checkpoint_every steps and the last), the workers of pipeline 0 (every
 *   layer exactly once) write their layers asynchronously and send `saved`;
 *   when `saved` messages cover every layer, ONE live worker (the lowest-ranked
 *   one not leaving) is asked to write its checkpoint.json (complete_checkpoint);
 *   its checkpoint_done makes the checkpoint of s+1 complete
 *   (pl_coord_last_checkpoint), or records why not (pl_coord_checkpoint_failed).
 *   A worker lost before answering: another is asked. The job is DONE when the
 *   last step's checkpoint is complete. A checkpoint that cannot be written (a
 *   `saved` with an error, a checkpoint_done with one) is given up and retried:
 *   the next commit writes one, and the last step's is written again (save to
 *   pipeline 0's workers); PL_COORD_CHECKPOINT_ATTEMPTS failures in a row: FAILED.
 * - Resume (resume_auto): every worker's register says which complete checkpoint
 *   it sees under the job's checkpoint directory (or why it cannot read it);
 *   before the first plan the coordinator takes the newest one a worker can read
 *   (pl_coord_resume_step; pl_coord_resume_note says when the workers disagree).
 *   No worker able to read it: FAILED. The last step's checkpoint: DONE at once
 *   (nothing to train).
 * - Profiling (profile_repeat > 0 without a profile): phase PROFILING; the first
 *   registered worker is asked to measure the model on its device
 *   (profile_request); another when it is lost first. Its profile_done gives the
 *   profile's JSON (pl_coord_profile_json): the caller computes templates and
 *   coverage from it and hands them over with pl_coord_set_planner, which leaves
 *   PROFILING for WAITING_FOR_WORKERS (or FAILED: pl_coord_fail).
 * - Evaluation (eval_every > 0): after committing step s with s+1 a multiple of
 *   eval_every or the last, phase EVALUATING: the pipeline workers run the
 *   validation batches of their pipeline forward (eval s) and answer eval_done;
 *   the step's record (pl_coord_step_log) is logged once every one did, its
 *   val_loss = Σ losses / Σ batches of the last stages. A pipeline worker lost
 *   meanwhile: a new plan, and the evaluation again under it (a plan restarting
 *   from a checkpoint logs the record without a validation loss).
 * - Fatal loss (a layer with no live holder): a fresh plan over the live workers
 *   that loads the newest complete checkpoint (step 0 without one: the initial
 *   state), rewinding the step; the data order makes the redone steps identical.
 *   Fewer than (F+1)·n0 live workers → WAITING_FOR_NODES; each registration
 *   retries; FAILED after wait_for_nodes_ms. strategy_checkpoint: every
 *   membership change restarts from the checkpoint (the benchmarks' baseline).
 * - maxResets bounds the reconfigurations; a node whose workers failed twice
 *   or more (losses, not `leaving`) is refused for cooldown_ms · 2^(failures−2)
 *   (at most 64×), Elastic Horovod's blacklist with a cooldown.
 * - A step attempt that fails with no loss to blame — a non-finite loss or
 *   gradient share in a report (never committed: abort at once), a non-finite
 *   global norm, a worker's step_failed — is redone under a new plan, at most
 *   PL_COORD_STEP_ATTEMPTS times in all; then FAILED (saying whether every
 *   attempt failed the same way).
 * - A worker's fatal error (fatal, e.g. bad data at load) is its loss; when every
 *   worker that registered failed with the same reason (at least min(n_start, 2)),
 *   the job is at fault, not its nodes: FAILED with that reason, no cooldown.
 * - Host/port of a worker's peer links are given at registration (the
 *   protocol's register has none); default host 127.0.0.1, port
 *   peer_port_base + rank. */
#ifndef PLIANT_COORDINATOR_H
#define PLIANT_COORDINATOR_H

#include <stddef.h>
#include <stdint.h>

#include "coverage.h"
#include "profile.h"
#include "protocol.h"
#include "templates.h"

typedef struct {
    /* planner inputs: not copied, must outlive the coordinator */
    const pl_profile *profile;
    const pl_template_set *templates;
    const pl_coverage *coverage;  /* for the maximum node count, same tolerate and batch */
    int tolerate;                 /* F: must equal coverage->tolerate */
    int64_t global_batch;         /* samples per step: must equal coverage->global_batch */
    int microbatch_size;          /* 0: the profile's; else must equal it */
    int seq_len;                  /* tokens per sample, ≥ 1 */
    int64_t steps;                /* total steps, ≥ 1 */
    /* learning rate (pl_lr_at) and clipping */
    float lr, lr_min_ratio;
    int lr_cosine, lr_warmup;
    double grad_clip;             /* 0: no clipping (grad_scale 1) */
    /* liveness */
    int heartbeat_ms;             /* 100..600000; sent in welcome */
    int heartbeat_misses;         /* 0: PL_PROTO_HEARTBEAT_MISSES (3) */
    int64_t step_timeout_ms;      /* a step's deadline, from start_step to the last report
                                     (RUNNING) or committed (COMMITTING): the plan's workers
                                     not done by then are lost (a compute thread hung while
                                     the heartbeats go on). 0: automatic (pl_coord_step_deadline);
                                     < 0: none */
    int n_start;                  /* workers to wait for before the first plan, ≥ (F+1)·n0 */
    int64_t start_grace_ms;       /* > 0: after this long, start with fewer (≥ (F+1)·n0) */
    const char *job;              /* job name for welcome (NULL: "job") */
    int token_ok;                 /* welcome.token_ok */
    int peer_port_base;           /* default peer port = base + rank; 0: 29500 */
    /* checkpoints and limits */
    const char *checkpoint_dir;   /* NULL or "": no checkpoints (a fallback restarts at step 0) */
    int checkpoint_every;         /* steps between checkpoints; 0: only after the last step */
    int64_t resume_step;          /* > 0: start from the complete checkpoint of that step */
    int strategy_checkpoint;      /* every membership change restarts from the checkpoint */
    int strategy_redundant;       /* the workers hold shadows (docs/redundant.md): losses that
                                     shadows cover fail over without copies (Bamboo §5.2),
                                     re-instantiation's copies use them as local sources */
    int max_resets;               /* reconfigurations allowed; 0: unlimited */
    int64_t wait_for_nodes_ms;    /* give up after waiting this long for workers; 0: never */
    int below_minimum_degrade;    /* fewer live workers than (F+1)·n0 after a loss: 0 waits
                                     (WAITING_FOR_NODES); 1 re-instantiates with the largest
                                     tolerance f < F the live workers allow, down to 0
                                     (degraded: pl_coord_tolerance), and returns to F when
                                     joined workers are placed */
    int64_t cooldown_ms;          /* first cooldown of a failing node; 0: 10 s */
    int hosts_added_check_every;  /* steps between placements of joined workers; ≤ 1: every */
    int settle_ms;                /* replan this long after the last of a burst of losses
                                     (pl_coord_tick); 0: at once */
    int peer_judge_ms;            /* peer_broken reports are weighed together this long
                                     after the first (pl_coord_tick): the worker whose links
                                     to the most others broke is the one lost; 0: at once */
    /* the workers' duties */
    int resume_auto;              /* the first plan's checkpoint is the newest complete one
                                     the workers report at register (resume_step unused) */
    int profile_repeat;           /* > 0 with profile, templates and coverage NULL: a worker
                                     measures the model (timed runs per layer), PROFILING */
    int eval_every;               /* > 0: validation loss after every eval_every-th step and
                                     the last (EVALUATING) */
    /* messages */
    int brief_plans;              /* plan messages for in-process workers that read only their
                                     own place (the simulator): pipelines holds the receiver's
                                     pipeline alone (npipelines 1, you_pipeline 0; idle: 0 and
                                     -1), no peers; copies and sends as usual. Never for real
                                     workers (they need every pipeline and peer). 0: full */
} pl_coord_config;

typedef enum {
    PL_COORD_WAITING_FOR_WORKERS = 0, /* before the first plan: fewer than n_start */
    PL_COORD_COPYING,                 /* plan sent, waiting for copy_done */
    PL_COORD_RUNNING,                 /* start_step sent, collecting report / reduced */
    PL_COORD_COMMITTING,              /* commit sent, collecting committed */
    PL_COORD_WAITING_FOR_NODES,       /* too few live workers to run a plan */
    PL_COORD_SAVING,                  /* every step committed, the last checkpoint pending */
    PL_COORD_SETTLING,                /* a loss: the new plan waits for settle_ms of quiet */
    PL_COORD_RESUMING,                /* restored: waiting for the plan's workers to reconnect */
    PL_COORD_PROFILING,               /* a worker measures the model; no plan before its profile */
    PL_COORD_EVALUATING,              /* a step committed, its validation loss pending */
    PL_COORD_DONE,                    /* every step committed, stop sent */
    PL_COORD_FAILED                   /* fatal: see pl_coord_reason */
} pl_coord_phase_t;

/* The automatic step deadline (step_timeout_ms 0): PL_COORD_STEP_TIMEOUT_FACTOR × the median
 * time of the last PL_COORD_STEP_TIMES committed steps, at least PL_COORD_STEP_TIMEOUT_BEATS ×
 * the heartbeat loss window (misses × heartbeat_ms); none before PL_COORD_STEP_TIMES_MIN steps
 * were timed (the first steps warm up: only the heartbeats watch them). */
#define PL_COORD_STEP_TIMEOUT_FACTOR 10
#define PL_COORD_STEP_TIMEOUT_BEATS 5
#define PL_COORD_STEP_TIMES 15
#define PL_COORD_STEP_TIMES_MIN 3

/* Attempts at one step that may fail (non-finite, step_failed) before the job fails. */
#define PL_COORD_STEP_ATTEMPTS 3
/* Checkpoint attempts in a row that may fail before the job fails. */
#define PL_COORD_CHECKPOINT_ATTEMPTS 3

/* Event results. */
#define PL_COORD_OK 0
#define PL_COORD_IGNORED 1  /* stale generation, other step, duplicate, nothing to do */
#define PL_COORD_ERR (-1)   /* unknown worker, bad argument: see pl_coord_error */

typedef struct {
    int64_t step;
    double loss;          /* Σ report.loss / microbatches of the step (NaN if none) */
    double norm;          /* √Σ grad_sumsq */
    double grad_scale;
    double lr;
    double val_loss;      /* validation loss after the step; NaN: not evaluated */
    int64_t generation;   /* plan generation that ran it */
    char pipelines[64];   /* "2x3+1x2": 2 pipelines of 3 nodes and 1 of 2 (largest first) */
} pl_coord_step_rec;

typedef struct {
    int64_t generation;   /* the new generation */
    int64_t step;         /* the step the new plan starts at */
    char cause[512];      /* "lost w3 (closed connection)", "leaving w2 (sigterm)", "joined w7" */
    char removed[512];    /* comma-separated names */
    char added[512];
    int64_t bytes_planned;   /* pl_reinstantiate's bytes_to_copy */
    int64_t bytes_copied;    /* Σ copy_done.bytes of this generation */
    int from_checkpoint;     /* the plan loads the checkpoint of `step` (0: initial state) */
    char pipelines[64];
    int tolerance;           /* the new plan's: F, or less when degraded */
} pl_coord_reconfig_rec;

typedef struct pl_coord pl_coord;

/* NULL with err on a bad configuration or out of memory. */
pl_coord *pl_coord_new(const pl_coord_config *cfg, char *err, size_t errlen);
void pl_coord_free(pl_coord *c);

/* Events. Each returns PL_COORD_OK, PL_COORD_IGNORED or PL_COORD_ERR (message in
 * pl_coord_error). `gen` is the message envelope's generation. */

/* A worker registered (token already checked). Answers welcome; may start the
 * first plan or a recovery. host NULL / port ≤ 0: defaults (see above).
 * node: the machine (NULL: the name), for the cooldown of failing nodes.
 * ERR: a live worker with that name exists, too many workers, job finished,
 * the node is cooling down. */
int pl_coord_worker_registered(pl_coord *c, const char *name, const char *node,
                               const char *host, int port, int64_t now_ms);
/* The same with everything the worker's register said: its zone (placement, as
 * pl_coord_set_zone), its GPU (UUID, "" for none) and whether it can run NCCL. A plan
 * whose workers all can, each on a GPU of its own, moves tensors with NCCL
 * (plan.transport); its rank 0 then sends nccl_root with the communicator's id, which
 * the coordinator passes to every worker of the plan in nccl_init. NULL strings: unknown. */
typedef struct {
    const char *name, *node, *host;
    int port;
    const char *zone, *device;
    int nccl;
    /* register.checkpoint: the newest complete checkpoint the worker sees (0: none), or
     * checkpoint_error (non-empty: it cannot read the directory); has_checkpoint 0: it
     * did not say */
    int has_checkpoint;
    int64_t checkpoint_step;
    const char *checkpoint_error;
} pl_coord_worker_info;
int pl_coord_worker_joined(pl_coord *c, const pl_coord_worker_info *wi, int64_t now_ms);
int pl_coord_heartbeat(pl_coord *c, const char *name, int64_t step, int64_t now_ms);
int pl_coord_report(pl_coord *c, const char *name, int64_t gen, const pl_msg_report *r);
int pl_coord_reduced(pl_coord *c, const char *name, int64_t gen, int64_t step);
int pl_coord_committed(pl_coord *c, const char *name, int64_t gen, int64_t step);
int pl_coord_copy_done(pl_coord *c, const char *name, int64_t gen, int64_t bytes);
/* grace_ms: how long the worker expects to live (0: unknown). When the running step's
 * expected end (its median time) and then the copies of the worker's layers (over the
 * profile's inter-node link; half of grace_ms without one) would outlast it, the step is
 * aborted at once and the plan made without the leaving workers (its copy sources while
 * they live). A notice from a stage or a copy source of a plan whose copies run replans at
 * once, whatever grace_ms. */
int pl_coord_leaving(pl_coord *c, const char *name, int reason /* pl_leave_reason */,
                     int64_t grace_ms);
int pl_coord_peer_broken(pl_coord *c, const char *name, int64_t gen, const char *peer);
int pl_coord_saved(pl_coord *c, const char *name, const pl_msg_saved *s);
/* The worker asked to complete the checkpoint of `step` answered: error NULL or "" when its
 * checkpoint.json is written. */
int pl_coord_checkpoint_done(pl_coord *c, const char *name, int64_t step, const char *error);
/* The worker asked to measure the model answered: the profile's JSON, or NULL and why not
 * (the job fails). */
int pl_coord_profile_done(pl_coord *c, const char *name, const char *profile,
                          const char *error);
/* A pipeline worker evaluated the step of `eval` (message generation gen). */
int pl_coord_eval_done(pl_coord *c, const char *name, int64_t gen, const pl_msg_eval_done *e);
/* The worker reported a fatal error (its fatal message; reason non-empty) and exits: stop
 * {reason, 1} to it and its loss, or FAILED when every worker failed the same way. */
int pl_coord_fatal(pl_coord *c, const char *name, const char *reason);
/* The connection closed / the process ended / anything fatal for that worker. */
int pl_coord_worker_lost(pl_coord *c, const char *name, const char *cause);
/* Declares lost every live worker silent for more than misses × heartbeat_ms, and every
 * plan worker that has not reported (or committed) the step when its deadline passed
 * (pl_coord_step_deadline); fails the job after wait_for_nodes_ms without enough workers. */
int pl_coord_tick(pl_coord *c, int64_t now_ms);

/* A pipeline of the stable plan, as a new coordinator takes it over (pl_coord_restore)
 * and as pl_coord_plan_pipeline and pl_coord_plan_failover read it. */
typedef struct {
    int nnodes;
    const char *const *nodes; /* worker names, stage order */
    int64_t microbatches;
    /* strategy redundant, a pipeline that failed over (docs/redundant.md): its stage
     * bounds (nnodes + 1) and its template's workers in the template's stage order, the
     * lost ones included (ntemplate > nnodes); layers NULL: a template pipeline */
    const int *layers;
    int ntemplate;
    const char *const *template_nodes;
} pl_coord_pipe;

/* A new coordinator (a new operator leader) takes over a running job
 * (docs/protocol.md "A restarted coordinator"): the last plan as the stable
 * one (workers named by pipeline, stage order; a failed-over pipeline with its bounds
 * and its template's workers), its generation, and a lower bound of the next step.
 * The plan's workers register again and send hello_resume; once all are back, or
 * resume_ms after the first call to pl_coord_tick, the coordinator settles the step
 * that was in flight (commit it where some worker committed it, abort it where nobody
 * did), then makes generation + 1 from the stable plan without the missing workers.
 * A lost worker of a failed-over pipeline's template that registers again is a new
 * worker joining. Only before any worker registered; a plan that the planner cannot
 * hold (a field out of range, a worker listed twice) is an error naming it. */
int pl_coord_restore(pl_coord *c, int64_t generation, int64_t step, const pl_coord_pipe *pipes,
                     int npipes, int64_t resume_ms);
/* A worker's hello_resume (its state: plan generation gen, the step it committed). Without
 * pl_coord_restore (a coordinator started afresh) a worker with state (gen > 0) is lost
 * and told to end (stop, exit code 1): its plans would be older than its own. */
int pl_coord_hello_resume(pl_coord *c, const char *name, int64_t gen,
                          const pl_msg_hello_resume *h);
/* The topology zone of a worker (its node's), for placement: fresh plans and the
 * workers a re-instantiation adds spread every layer's holders over zones and put
 * consecutive stages of a pipeline in different zones where they can (zone_place.h). */
int pl_coord_set_zone(pl_coord *c, const char *name, const char *zone);


/* The stable plan's pipeline q: its worker names in stage order (pointers into the
 * coordinator, valid until the next event) and its microbatches (may be NULL);
 * the count, or -1 past the last. */
int pl_coord_plan_pipeline(const pl_coord *c, int q, const char **names, int max,
                           int64_t *microbatches);
/* Strategy redundant: the stable plan's pipeline q after a failover, its stage bounds
 * (nnodes + 1 into layers) and its template's workers, lost ones included (up to max
 * names, pointers as above); the template's worker count, 0 for a template pipeline,
 * -1 past the last. */
int pl_coord_plan_failover(const pl_coord *c, int q, int *layers, const char **names, int max);

/* Fast-forward for a simulation (`pliant simulate`), where steps between disruptions
 * run alike: in RUNNING, before any report of the step, with no membership change
 * pending, commits up to n steps at once without step messages (each logged with loss
 * and norm NaN, grad_scale 1 and its learning rate), stopping before a step that is
 * evaluated, that is the last, that retries a failed checkpoint, or while a joined worker
 * waits to be placed, and after a step whose commit saves a checkpoint: that checkpoint's
 * `save` goes to pipeline 0's workers (what a commit with save asks of them; they answer
 * `saved`). Then the step reached starts: start_step to the plan's workers (the one sent
 * before is superseded: its step counts as committed), or with `quiet` no message at all
 * (the caller's workers go on with the step reached). step_ms: each step's time, as the
 * step times measured and the clock (the step reached starts done × step_ms after the
 * step skipped from). The number of steps committed (0: none could be). */
int64_t pl_coord_skip_steps(pl_coord *c, int64_t n, int quiet, int64_t step_ms);
/* The caller's clock (a simulation's), for the events whose calls carry no time. */
void pl_coord_clock(pl_coord *c, int64_t now_ms);

/* Ends the job now (a time limit): a step not committed yet is dropped, every
 * worker gets stop {0}, the phase is DONE with `why` as the reason. */
void pl_coord_end(pl_coord *c, const char *why);
/* Fails the job now (what the caller could not do for it): stop {1}, FAILED. */
void pl_coord_fail(pl_coord *c, const char *why);

/* PROFILING: the profile a worker measured (JSON text, owned by the coordinator), NULL
 * before. */
const char *pl_coord_profile_json(const pl_coord *c);
/* The planner made from it (borrowed, as in the configuration: they must outlive the
 * coordinator) and n_start (at least coverage->nodes_lo): PROFILING ends; the first plan
 * follows as for a coordinator configured with them. ERR (and FAILED) when they do not fit
 * the configuration. */
int pl_coord_set_planner(pl_coord *c, const pl_profile *profile, const pl_template_set *ts,
                         const pl_coverage *coverage, int n_start);

/* Dispatches a decoded worker → coordinator message (register excepted: use
 * pl_coord_worker_registered) after noting that the worker was heard at now_ms. */
int pl_coord_on_msg(pl_coord *c, const char *name, const pl_msg *m, int64_t now_ms);

/* Pops the oldest outgoing message: returns 1 and fills to (the worker's name)
 * and out (owned by the caller: pl_msg_free), or 0 when the outbox is empty. */
int pl_coord_next(pl_coord *c, char *to, size_t tolen, pl_msg *out);
int pl_coord_pending(const pl_coord *c); /* messages in the outbox */

pl_coord_phase_t pl_coord_phase(const pl_coord *c);
const char *pl_coord_phase_name(pl_coord_phase_t p);
/* The tolerance of the current plan: the configured F, or less while degraded
 * (below_minimum_degrade); F before the first plan. */
int pl_coord_tolerance(const pl_coord *c);
const char *pl_coord_reason(const pl_coord *c);  /* why WAITING_FOR_NODES / FAILED, else "" */
const char *pl_coord_error(const pl_coord *c);   /* the last event's error */
int64_t pl_coord_generation(const pl_coord *c);
int64_t pl_coord_step(const pl_coord *c);        /* the step running or to run next */
int pl_coord_rank(const pl_coord *c, const char *name); /* -1 if unknown */
int pl_coord_live_workers(const pl_coord *c);
/* The running step's deadline in ms from its start_step (step_timeout_ms, or the automatic
 * one from the steps timed so far); -1: none. */
int64_t pl_coord_step_deadline(const pl_coord *c);
/* 1 when worker `name` was declared lost for missed heartbeats or a missed step deadline
 * and has not registered again: its process may still be there, hung (SIGSTOP, a deadlock,
 * a compute thread stuck while its control thread heartbeats) or cut off, and the
 * front end should end it (`pliant run` kills it) so that it never comes back holding an
 * old plan's state; else 0. */
int pl_coord_worker_silent(const pl_coord *c, const char *name);
int64_t pl_coord_last_checkpoint(const pl_coord *c); /* newest complete checkpoint step, 0: none */
/* The checkpoint whose attempt failed last (a layer or its checkpoint.json not written;
 * 0: none) and why. */
int64_t pl_coord_checkpoint_failed(const pl_coord *c, const char **why);
/* Checkpoint attempts that failed since the start (each failure once). */
int pl_coord_checkpoint_failures(const pl_coord *c);
/* The checkpoint the job started from (0: the initial state); -1 while the workers' reports
 * are awaited (resume_auto, before the first plan). */
int64_t pl_coord_resume_step(const pl_coord *c);
/* How the workers' reports disagreed when the resume step was taken; "" when they agreed. */
const char *pl_coord_resume_note(const pl_coord *c);

int pl_coord_nsteps(const pl_coord *c); /* committed steps logged */
const pl_coord_step_rec *pl_coord_step_log(const pl_coord *c, int i);
int pl_coord_nreconfigs(const pl_coord *c); /* plans after the first */
const pl_coord_reconfig_rec *pl_coord_reconfig(const pl_coord *c, int i);
/* The nodes refused at now_ms because they are cooling down (their workers failed
 * twice or more): up to max names (pointers into the coordinator, valid until the next
 * event) into names; the count. */
int pl_coord_cooling_nodes(const pl_coord *c, int64_t now_ms, const char **names, int max);

/* One registered worker as a dashboard shows it (rank order, lost ones included). Strings
 * point into the coordinator and are valid until the next event. */
typedef struct {
    const char *name, *zone, *device; /* zone, device "": unknown, none */
    int live, leaving;
    int departing;    /* out of the plan under notice, still a copy source until stopped */
    int copying;      /* COPYING: it got the current plan and its copy_done has not come */
    int pipeline, stage; /* its place in the current plan; pipeline -1: none (idle, lost) */
    int layer_begin, layer_end; /* the layers it holds there, [begin, end); 0, 0: none */
} pl_coord_worker_view;
int pl_coord_nworkers(const pl_coord *c);
/* Worker i (0 ≤ i < pl_coord_nworkers) into *v: 0, or -1 when i is out of range. */
int pl_coord_worker_view_at(const pl_coord *c, int i, pl_coord_worker_view *v);
int pl_coord_nlayers(const pl_coord *c); /* the model's layers as planned; 0 before a planner */

#endif
