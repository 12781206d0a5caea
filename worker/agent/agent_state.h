/* The worker's state, shared by agent.c (its two threads: the control loop and the
 * compute thread's messages and steps) and plan_install.c (installing a plan: engine,
 * layer copies, peer connections). Internal to worker/agent.
 *
 * Threads: the compute thread owns every field but those marked "under mu" (also read or
 * written by the control thread, with mu held), the atomics, and cli (replaced by the
 * control thread under cli_mu). Ownership: pl_agent_run makes the state and frees it and
 * everything it holds when the worker ends. */
#ifndef PLIANT_AGENT_STATE_H
#define PLIANT_AGENT_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "agent.h"
#include "checkpoint_writer.h"
#include "control_client.h"
#include "engine.h"
#include "fault.h"
#include "frc.h"
#include "jobspec.h"
#include "layer_copy.h"
#include "mesh.h"
#include "msg_queue.h"
#include "nccl_plan.h"
#include "protocol.h"
#include "sampler.h"
#include "schedule.h"
#include "shadow.h"
#include "stage_link.h"
#include "syncgroups.h"
#include "tokens.h"
#include "worker_step.h"

/* A peer that makes no progress for this long has failed (dials, the step's links). */
#define PEER_TIMEOUT_MS 60000
#define SUPERSEDED_MSG "superseded by a newer plan"
/* After telling the coordinator of a fatal error, how long the worker waits for its stop. */
#define FATAL_WAIT_MS 5000

typedef struct {
    const pl_agent_options *o;
    pl_job job;
    int have_job;
    pl_gpt_config cfg;
    pl_tokens train, val;
    int have_train, have_val; /* val: spec.data.val with spec.evalEvery */
    char data_err[PL_PROTO_TEXT_MAX + 1]; /* why the data is unusable ("": it is fine) */
    pl_sampler smp;
    pl_ctl_client *cli;   /* replaced on reconnection under cli_mu (posts come from any thread) */
    pthread_mutex_t cli_mu;
    pl_ctl_client_config cc;
    char coordinator_host[PL_PROTO_HOST_MAX + 1]; /* cc.host */
    atomic_int disconnected; /* the control connection closed: reconnect (a new coordinator) */
    double lost_since;       /* control thread: when the connection was lost; -1: connected */
    int reconnects;
    pl_checkpoint_writer *ckw;  /* checkpoints of this worker's layers, in the background */
    pl_fault fault;
    pl_proto_name broken; /* the peer whose link or copy failed the plan being installed */
    pl_proto_name link_peer[3]; /* the stage link's workers: stage − 1, stage + 1, the ring's
                                   other end (agent_wrap_stage) ("": none) */
    int link_stage[3];          /* their stages */
    pl_msg_queue *queue;  /* the control thread's messages for the compute thread */

    pthread_mutex_t mu;   /* the fields marked "under mu" */
    pthread_cond_t cv;    /* nccl_init arrived */
    atomic_int done;      /* the control loop ends */
    atomic_int exit_code;
    atomic_int fatal_sent; /* the coordinator was told of a fatal error (fatal) */
    atomic_int stopped;    /* the coordinator's stop arrived */
    atomic_llong newest_plan; /* the newest plan generation received (control thread) */

    /* compute thread state */
    kn_ctx *k;
    pl_engine e;
    int have_engine;
    pl_engine src;   /* the engine of the last plan before this one: copy source until */
    int have_src;    /* the next start_step (the coordinator's stable plan) */
    pl_reserve reserve;   /* memory ready for a later loss's copies (copy_reserve.h) */
    int64_t reserve_bytes; /* the current plan's pl_msg_plan.reserve_bytes */
    int reserve_told;     /* its being present is in the log */
    pl_engine shadow;     /* strategy redundant: the successor's layers (shadow.h) */
    int have_shadow;
    int64_t shadow_step;  /* the committed steps in its state; −1: unknown (never kept) */
    int64_t shadow_refill_bytes; /* received in the shadows' refills so far (the log) */
    pl_rc_layout rc;      /* the plan's redundant layout (PL_RC_NONE without shadows) */
    pl_engine shadow_src; /* the shadow of the plan before this one, kept like src until the
                             next start_step: a failover's local source (Bamboo §5.2), and
                             the plan's shadow again where the owner says so */
    int have_shadow_src;
    int64_t shadow_src_step; /* its shadow_step */
    struct {              /* the shadow's costs so far, logged when the shadow goes */
        int steps;        /* steps with a shadow */
        double recv_ms;   /* its gradients received after the stage (worker_step.h) */
        double apply_ms;  /* its AdamW after `committed` */
        pl_frc_stats frc; /* eager FRC (frc.h) */
        int frc_steps;
    } rc_stats;
    pl_schedule sched;
    int have_sched;
    pl_listener *lst;
    pl_mesh *mesh;   /* the peer connections over lst */
    int nranks;
    pl_conn **conns; /* ring connections by plan rank */
    pl_tcp_link *link;
    pl_nccl_plan *ncp;    /* under mu: the NCCL world of a plan whose transport is nccl */
    pl_layer_copy_stop *copy_stop; /* under mu: the stop of the TCP layer copies running
                                      (NULL: none) */
    char nccl_id[PL_PROTO_NCCL_ID_HEX + 1]; /* under mu: the id of nccl_init for nccl_gen */
    int64_t nccl_gen;
    pl_syncgroups g;
    int have_groups;
    int64_t gen;
    int64_t timed_gen; /* the newest generation whose first step is timed (the log) */
    /* under mu: the step running (its links may be interrupted from the control thread)
     * and the newest step the coordinator aborted */
    int stepping;
    int64_t aborted_gen, aborted_step;
    /* the running step was aborted: its engine skips the layers left (pl_engine.stop), so
     * that the worker gets to the next plan's copies and step at once; cleared (under mu)
     * when a step begins */
    atomic_int step_stop;
    double abort_ms;      /* under mu: when the running step's abort arrived (the log) */
    double plan_ms;       /* under mu: when the newest plan arrived (the log) */
    /* under mu: what hello_resume tells a new coordinator */
    int64_t last_committed, reduced_step;
    double last_scale, last_lr;
    int rank, pipe, npipes, stage, nstages;
    int first_mb, nmb, global_micro;
    int32_t *tok, *tgt;
    size_t tokcap;
    int32_t *etok, *etgt; /* the evaluation's batches */
    size_t evalcap;
    pl_ar_pack pack;      /* the step's comm thread's all-reduce pack buffer */
} agent;

/* agent.c */

/* One line on stderr: "worker NAME: ...". Any thread. */
void agent_log(agent *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Sends m to the coordinator from any thread (a message posted while disconnected is
 * lost) and frees it. 0, or -1. */
int agent_post(agent *a, pl_msg *m);
/* What heartbeats carry: the plan generation and the step (step < 0: unchanged). */
void agent_tell_client(agent *a, int64_t gen, int64_t step);
/* A newer plan is waiting (or the worker ends): the one being installed can be given up.
 * Read by the compute thread and the threads it waits for (copy senders, NCCL's), never
 * while a->gen moves. */
int agent_superseded(agent *a);

/* plan_install.c: compute thread */

/* Installs plan message m (generation m->gen): this worker's place, its engine and layer
 * copies, its checkpoint when the plan restarts from one, its peer connections on the
 * plan's transport. *bytes_in: bytes received in copies. 0, or -1 with err; a->broken then
 * names the peer whose copy or dial failed, if one did. */
int agent_install_plan(agent *a, const pl_msg *m, int64_t *bytes_in, char *err, size_t errlen);
/* Closes the plan's links, NCCL world and connections and frees its groups and schedule. */
void agent_teardown_links(agent *a);

/* shadow_install.c: compute thread */

/* Strategy redundant on the TCP transport (docs/redundant.md): after the plan's links are
 * up, the shadow engine of the successor's layers: shadow_src kept when it holds the
 * successor's range at the plan's step (the successor answers a request over the stage
 * link), else a new one filled with the successor's parameters and AdamW m, v, so that the
 * shadow starts byte-identical to its owner. Sets a->rc; nothing without strategy
 * redundant, off the TCP transport or with one stage. 0, or -1 with err. */
int agent_install_shadow(agent *a, const pl_msg_plan *p, char *err, size_t errlen);
/* The stage at the other end of this stage's ring wrap (Bamboo §5.1: the last stage holds
 * the first's layers), or −1: strategy redundant with ≥ 3 stages, the first and the last
 * stage only (2 stages are neighbours already). */
int agent_wrap_stage(const agent *a);
/* Drops the shadow (the end), logging its costs (the `rc:` and `frc:` lines). */
void agent_drop_shadow(agent *a);
/* Adds a step's shadow costs (nothing without a shadow). */
void agent_count_rc(agent *a, const pl_worker_step_result *r);
/* A new plan: the shadow becomes shadow_src (the stable plan's, which a failover takes
 * over locally), unless shadow_src is still the one of a plan before (no step ran since):
 * then the shadow is dropped, as retire_engine does with engines. */
void agent_retire_shadow(agent *a);
/* Drops shadow_src (a step began: the plan is stable; a checkpoint restart; the end). */
void agent_drop_shadow_src(agent *a);

/* duties.c: what the coordinator asks besides training */

/* register's checkpoint: the newest complete checkpoint under the job's checkpoint
 * directory, or why it cannot be read; nothing without a directory or with resume never.
 * Control thread. */
void agent_checkpoint_report(agent *a, pl_msg_register *reg);
/* complete_checkpoint: writes the checkpoint's checkpoint.json and answers checkpoint_done
 * (with the error, if any), then deletes the complete checkpoints spec.checkpoint.keep
 * does not keep. Control thread (a small file, a few unlinks: heartbeats go on). */
void agent_complete_checkpoint(agent *a, const pl_msg *m);
/* profile_request: measures the model on this worker's kernels and answers profile_done.
 * Compute thread (before any plan). */
void agent_profile(agent *a, const pl_msg *m);
/* eval: this pipeline's share of the validation batches forward through this stage over
 * the plan's links, then eval_done. 0, or -1 with err (the caller reports step_failed).
 * Compute thread. */
int agent_eval(agent *a, int64_t step, char *err, size_t errlen);

#endif
