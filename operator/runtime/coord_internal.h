/* The coordinator's own header: private to the coordinator's files (coordinator.c,
 * coord_workers.c, coord_plans.c, coord_failover.c, coord_plan_msgs.c, coord_steps.c,
 * coord_checkpoints.c, coord_restore.c, coord_reserve.c), never included elsewhere; coordinator.h is the public contract. It holds
 * the coordinator's state (struct pl_coord and its parts) and the functions its files
 * share. The same rules as coordinator.h's hold for all of them: a pure state machine (no
 * sockets, no threads, no clock: the time comes with the events, c->now), not
 * thread-safe (one caller at a time); outgoing messages only through the outbox
 * (push_msg), drained by pl_coord_next; the planner's inputs in cfg are borrowed, not
 * owned; strings handed out point into the coordinator until the next event. A worker is
 * its index in c->w (its rank), never removed; c->w grows at a registration, so indices,
 * not pointers, are kept across one. */
#ifndef PLIANT_COORD_INTERNAL_H
#define PLIANT_COORD_INTERNAL_H

#include "coordinator.h"
#include "reinstantiate.h"

/* A registered worker, live or not: its index in c->w is its rank. */
typedef struct {
    pl_proto_name name, node, zone; /* zone "" : unknown */
    pl_proto_name device;           /* its GPU's UUID; "" : none */
    int nccl;                       /* it can run the NCCL transport */
    char host[PL_PROTO_HOST_MAX + 1];
    int port, rank;
    int live, leaving;
    int departing; /* left under notice, not yet stopped: a copy source of the plan it
                      left (Bamboo §3's grace period), stopped once those copies are done */
    int64_t last_heard;
    int got_plan, copy_done, reported, reduced, committed, is_source;
    int restored, resumed;      /* in the restored plan; reconnected with hello_resume */
    int ghost;     /* a restored failover's template names it, lost before this coordinator:
                      a name only, which a worker registering is free to take */
    int64_t r_committed, r_reduced;
    double r_scale, r_lr;
    int pipe, pos; /* place in the current plan; pipe -1: idle */
    int lb, le;    /* its layers [lb, le) there (0, 0: idle) */
    int has_ckpt;  /* register.checkpoint: ckpt_step, or ckpt_err when it cannot read it */
    int64_t ckpt_step;
    char ckpt_err[256];
    int evaluated; /* EVALUATING: its eval_done came */
    int64_t hb_gen; /* the newest plan generation its heartbeats carried: the one its compute
                       thread installed */
    int silent;    /* lost for missed heartbeats or a missed step deadline: hung or cut
                      off, maybe still running */
    int64_t writing;    /* the checkpoint it was asked to write its layers of, 0: none or */
    int write_b, write_e; /* its `saved` came; those layers [write_b, write_e) */
    int64_t reserve; /* bytes it would receive, at most, after one loss from the current
                        plan (coord_reserve.c); 0: none or not worked out */
} cworker;

/* A pipeline of a plan. */
typedef struct {
    int nnodes;
    int *w; /* worker indices, stage order */
    int64_t mb, first;
    /* strategy redundant, after a failover (rc_failover): the merged stage bounds
     * (nnodes + 1; NULL: the template's), and the template's workers, lost ones
     * included (tn of them), which re-instantiation starts from */
    int *layers;
    int tn, *tw;
} cpipe;

/* A plan: its pipelines, and their shape as text ("2x3+1x2", cplan_describe). */
typedef struct {
    int npipes;
    cpipe *p;
    char desc[64];
} cplan;

/* A layer (or part of one) that a plan copies from worker src to worker dest. */
typedef struct {
    int dest, src, layer;
    int part, parts;      /* pl_layer_copy's: part of parts (0 of 1: the whole layer) */
    int64_t bytes;
} ccopy;

/* A message in the outbox, for the worker named `to`. */
typedef struct {
    pl_proto_name to;
    pl_msg m;
} outmsg;

/* A link between two workers that one of them reported broken (peer_broken). */
typedef struct {
    int reporter, peer;
} cpair;

/* A machine whose workers failed: kept out until `until` (Horovod's blacklist). */
typedef struct {
    pl_proto_name name;
    int failures;
    int64_t until;
} cnode;

/* A checkpoint being written: which layers' `saved` arrived; once all, the worker asked
 * to write its checkpoint.json. */
#define SAVING_SLOTS 4
typedef struct {
    int64_t step; /* 0: free */
    unsigned char *covered;
    int completing; /* every layer saved: checkpoint.json asked of worker `asked` */
    int asked;      /* -1: nobody yet (no live worker) */
    int failed;     /* a layer or checkpoint.json could not be written: given up */
} csaving;

struct pl_coord {
    pl_coord_config cfg;
    char job[PL_PROTO_NAME_MAX + 1];
    int micro, misses, nlayers;
    cworker *w;
    int nw, capw;
    int *index;            /* worker names → indices: open addressing, -1 empty */
    /* the step's waits resume here: every worker below is done with the step or not
     * part of it (flags are only set within a step; reset_step_flags restarts them) */
    int scan_reduced, scan_committed;
    int scan_copy;         /* the same for copy_done within a plan (install_plan restarts it) */
    int index_cap;         /* a power of two ≥ 2·nw, or 0 */
    outmsg *out;
    int nout, capout, headout;
    pl_coord_phase_t phase;
    char reason[512], err[512];
    int64_t gen, step;
    int transport;         /* pl_transport of the current plan */
    cplan cur, stable;
    int has_cur, has_stable;
    int pending;           /* a membership change waits for the step boundary */
    int join_pending;      /* a worker joined: replan at the next check step */
    char cause[512];       /* causes since the last plan */
    double sumsq, loss_sum;
    int nloss;
    double norm, grad_scale, lr;
    pl_coord_step_rec *log;
    int nlog, caplog;
    pl_coord_reconfig_rec *rec;
    int nrec, caprec;
    int64_t now;           /* the latest time an event brought */
    int64_t wait_since;    /* when waiting for workers began; -1: not waiting */
    int tolerance;         /* the current plan's (cfg.tolerate, or less: degraded) */
    int plan_tolerance;    /* the one of the plan next_plan made */
    int64_t replan_at;     /* SETTLING: when to make the new plan */
    int64_t resume_ms, resume_at; /* RESUMING: how long to wait, and until when (-1: unset) */
    int took_over;         /* pl_coord_restore made it: it knows the job's running plan */
    int64_t ckpt_last;     /* newest complete checkpoint; 0: none (the initial state) */
    int64_t plan_ckpt;     /* the current plan loads this checkpoint; -1: none */
    int need_ckpt;         /* a fatal loss: the next plan restarts from the checkpoint */
    csaving saving[SAVING_SLOTS];
    int64_t ckpt_fail_step; /* the newest checkpoint that could not be written; 0: none */
    char ckpt_fail[512];
    int ckpt_failures;     /* checkpoint attempts failed since the last complete one */
    int ckpt_failed_total; /* and since the start */
    int ckpt_retry;        /* the next commit writes a checkpoint (one failed) */
    int commit_save;       /* the commit being sent asks pipeline 0 to save */
    int64_t ckpt_writing;  /* the newest checkpoint pipeline 0 was asked to write; 0: none */
    /* a step whose attempts fail without a loss to blame (non-finite, step_failed) */
    int64_t fail_step;     /* the step they are of; -1: none */
    int fail_attempts, fail_same; /* how many; all for one reason */
    char fail_reason[512];
    /* workers that reported a fatal error: how many, the first reason, all the same */
    int nfatal, fatal_same;
    char fatal_reason[512];
    cnode *nodes;
    int nnodes, capnodes;
    /* the workers' duties */
    int have_planner;      /* profile, templates and coverage are known */
    char *profile_text;    /* PROFILING: the measured profile's JSON */
    int profiler;          /* PROFILING: the worker asked to measure; -1: none */
    int64_t resume_step;   /* the first plan's checkpoint; -1: not decided yet */
    char resume_note[512];
    cpair *suspects;       /* peer_broken reports of generation suspects_gen, not judged yet */
    int nsuspects, capsuspects;
    int64_t suspects_gen;
    int64_t judge_at;      /* when to judge them; -1: no report pending */
    cpair forgiven;        /* the last link found broken alone, judged without a loss */
    int64_t forgiven_gen;  /* its generation; -1: none */
    int eval_pending;      /* the step of eval_rec waits for its validation loss */
    pl_coord_step_rec eval_rec;
    double val_sum;
    int64_t val_batches;
    int64_t step_t0;       /* when start_step went out */
    int64_t step_ms[PL_COORD_STEP_TIMES]; /* the last committed steps' times, a ring */
    int nstep_ms;          /* steps timed (all time) */
    int64_t probe_from;    /* a step of this generation passed its deadline: the next plan
                              finds whose compute thread is hung; -1: none */
    int64_t probe_t0, probe_ms; /* when that plan goes out, the grace after it */
};

/* coordinator.c: errors, the outbox, the job's end, time and the workers' duties */
int fail_err(pl_coord *c, const char *fmt, ...);
void appendf(char *buf, size_t len, const char *fmt, ...);
void add_cause(pl_coord *c, const char *fmt, const char *a, const char *b);
pl_msg *push_msg(pl_coord *c, int widx, int type, int64_t gen);
void send_text(pl_coord *c, int widx, int type, int64_t gen, int64_t step, const char *why,
               int code);
void stop_all(pl_coord *c, const char *why, int code);
void set_failed(pl_coord *c, const char *why);
void finish_job(pl_coord *c);
void note_time(pl_coord *c, int64_t now_ms);
void reassign_duties(pl_coord *c);

/* coord_workers.c: the registry, joins, notices, losses and liveness */
int worker_index(const pl_coord *c, const char *name);
int find_live(pl_coord *c, const char *name);
int pick_worker(const pl_coord *c);
int note_heard(pl_coord *c, const char *name, int64_t now_ms);
void judge_peers(pl_coord *c);
int check_heartbeats(pl_coord *c, int64_t now_ms, int *idx);
int check_step_deadline(pl_coord *c, int *idx);
int check_probe(pl_coord *c, int *idx);

/* coord_plans.c: plans, their places and layers, and replanning */
void cplan_free(cplan *p);
int cplan_copy(cplan *dst, const cplan *src);
void cplan_describe(cplan *p);
void node_layers(const pl_coord *c, int n, int pos, int *begin, int *end);
void pipe_layers(const pl_coord *c, const cpipe *cq, int pos, int *begin, int *end);
void set_place(pl_coord *c, int i, int q, int j);
int plan_transport(const pl_coord *c);
void stop_departed(pl_coord *c, int keep_sources);
/* What changed since a plan. */
typedef struct {
    const char **rm, **ad; /* its workers no longer live; live workers not in it */
    int nrm, nad;
    char removed[512], added[512]; /* the same as text */
} cchange;
void find_change(const pl_coord *c, const cplan *from, char *mark, cchange *ch);
int plan_reinstantiate(const pl_coord *c, const cplan *from, int f, const char **rm, int nrm,
                       const char **ad, int nad, pl_reinstantiation *r, char *err,
                       size_t errlen);
void replan(pl_coord *c);
void replan_soon(pl_coord *c);

/* coord_reserve.c: what each worker would receive after one loss */
void plan_reserves(pl_coord *c);

/* coord_failover.c: strategy redundant */
int rc_failover(pl_coord *c, int nremoved, int nadded, cplan *np);
int rc_local_copies(pl_coord *c, const cplan *np, ccopy *cp, int *ncp,
                    int64_t *bytes_planned);

/* coord_plan_msgs.c: a plan as each worker's message */
void send_plans(pl_coord *c, const ccopy *cp, int ncp);
int nccl_root(pl_coord *c, const char *name, int64_t gen, const char *id);

/* coord_steps.c: the step, its evaluation and its failures */
int in_pipes(const pl_coord *c, int i);
void to_pipeline_workers(pl_coord *c, int type, const char *why);
void flush_eval(pl_coord *c);
void check_copy_complete(pl_coord *c);
int leaving_held(const pl_coord *c);
void check_reduced_complete(pl_coord *c);
void check_committed_complete(pl_coord *c);
void check_eval_complete(pl_coord *c);
int gen_check(pl_coord *c, const char *name, int64_t gen, int *rc);
int step_failed(pl_coord *c, const char *name, int64_t gen, int64_t step,
                const char *reason);
int64_t median_step_ms(const pl_coord *c);

/* coord_checkpoints.c: checkpoints written, completed, given up; the resume point */
void note_writer(pl_coord *c, int i, int64_t step);
void writer_lost(pl_coord *c, int i);
void writer_gone_after_leaving(pl_coord *c, int i);
void forget_saving_after(pl_coord *c, int64_t step);
void resave(pl_coord *c, csaving *slot);
csaving *saving_slot(pl_coord *c, int64_t step);
void ask_completion(pl_coord *c, csaving *slot);
void save_to_pipeline0(pl_coord *c, int64_t step, int note_writers);
int64_t newest_reported(const pl_coord *c, int *nread, int *nerr, int *differ);
int decide_resume(pl_coord *c);

/* coord_restore.c: a running plan taken over by a new coordinator */
void resume_done(pl_coord *c);

#endif
