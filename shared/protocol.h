/* The control protocol between the coordinator and its workers (docs/protocol.md):
 * one JSON object per WebSocket text frame, {"v": 1, "type": "...", "gen": G, ...}.
 * Typed encode and decode. Decoding is strict: every field is checked (type,
 * range, length, character set, array size), unknown and duplicate fields are
 * rejected, and an error names the field path ("pipelines[1].nodes[0]: ...").
 * A malformed message never crashes or leaks. No global state: thread-safe. */
#ifndef PLIANT_PROTOCOL_H
#define PLIANT_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#define PL_PROTO_VERSION 1
#define PL_PROTO_SUBPROTOCOL "pliant.v1"  /* WebSocket subprotocol name */
#define PL_PROTO_MAX_BYTES (1u << 20)     /* larger messages are rejected unparsed */

/* Limits (characters, not counting the NUL). */
#define PL_PROTO_NAME_MAX 253       /* job, worker, node, zone names: [A-Za-z0-9._-] */
#define PL_PROTO_HOST_MAX 253       /* host name or IP literal: also ':' '[' ']' '%' */
#define PL_PROTO_TEXT_MAX 1023      /* free text (reasons): UTF-8, no control characters but \t \n */
#define PL_PROTO_PATH_MAX 4095      /* checkpoint directory: UTF-8, no control characters */
#define PL_PROTO_NONCE_MIN 32       /* challenge nonce: even number of hex digits */
#define PL_PROTO_NONCE_MAX 128
#define PL_PROTO_PROOF_LEN 64       /* token_proof: hex HMAC-SHA256, exactly 64 digits */
#define PL_PROTO_MAX_NODES 4096     /* workers in a plan, pipelines, peers */
#define PL_PROTO_MAX_RANK 1073741823 /* welcome.rank: ranks are never reused over a long job */
#define PL_PROTO_MAX_LAYERS 4096    /* partitionable layers (L blocks + embedding + head) */
#define PL_PROTO_MAX_SENDS 65536    /* entries of a plan's "sends" */
#define PL_PROTO_MAX_PARTS 8        /* a copy's "parts" (PL_COPY_MAX_PARTS) */
#define PL_PROTO_MAX_COPIES (PL_PROTO_MAX_LAYERS * PL_PROTO_MAX_PARTS) /* a plan's "copies" */
#define PL_PROTO_MAX_MICRO (1 << 20)       /* plan.micro: samples per microbatch */
#define PL_PROTO_MAX_SEQ_LEN (1 << 24)
#define PL_PROTO_MAX_MICROBATCHES (1LL << 40) /* per pipeline */
#define PL_PROTO_INT_MAX 9007199254740991LL /* 2^53 - 1: integers JSON carries exactly */
#define PL_PROTO_PROFILE_MAX (PL_PROTO_MAX_BYTES / 2) /* profile_done.profile: bytes of JSON text */
#define PL_PROTO_PROFILE_REPEAT_MAX 1000 /* profile_request.repeat */

/* Timing (milliseconds), see docs/protocol.md "Liveness". The heartbeat
 * interval is the job's heartbeatSeconds, sent in welcome.heartbeat_ms. */
#define PL_PROTO_REGISTER_TIMEOUT_MS 10000   /* connection → register */
#define PL_PROTO_HEARTBEAT_MS 1000           /* default interval */
#define PL_PROTO_HEARTBEAT_MIN_MS 100
#define PL_PROTO_HEARTBEAT_MAX_MS 600000
#define PL_PROTO_HEARTBEAT_MISSES 3          /* intervals of silence: the peer is dead */
#define PL_PROTO_RECONNECT_WINDOW_MS 120000  /* a worker retries this long, then exits */

typedef enum {
    PL_MSG_NONE = 0,
    /* worker → coordinator */
    PL_MSG_REGISTER,
    PL_MSG_HEARTBEAT,
    PL_MSG_LEAVING,
    PL_MSG_REPORT,
    PL_MSG_REDUCED,
    PL_MSG_COMMITTED,
    PL_MSG_PEER_BROKEN,
    PL_MSG_COPY_DONE,
    PL_MSG_HELLO_RESUME,
    PL_MSG_SAVED,
    PL_MSG_NCCL_ROOT,
    PL_MSG_STEP_FAILED,
    PL_MSG_CHECKPOINT_DONE,
    PL_MSG_PROFILE_DONE,
    PL_MSG_EVAL_DONE,
    PL_MSG_FATAL,
    /* coordinator → worker */
    PL_MSG_CHALLENGE,
    PL_MSG_WELCOME,
    PL_MSG_PLAN,
    PL_MSG_START_STEP,
    PL_MSG_COMMIT,
    PL_MSG_ABORT,
    PL_MSG_STOP,
    PL_MSG_REFUSE,
    PL_MSG_NCCL_INIT,
    PL_MSG_COMPLETE_CHECKPOINT,
    PL_MSG_PROFILE_REQUEST,
    PL_MSG_EVAL,
    PL_MSG_SAVE,
    PL_MSG_COUNT
} pl_msg_type;

typedef enum {
    PL_LEAVE_SIGTERM = 0, /* "sigterm": preemption notice / Pod deletion */
    PL_LEAVE_SHUTDOWN,    /* "shutdown": asked to exit locally (SIGINT, operator) */
    PL_LEAVE_ERROR,       /* "error": a local fatal error; it exits */
    PL_LEAVE_COUNT
} pl_leave_reason;

typedef char pl_proto_name[PL_PROTO_NAME_MAX + 1];

typedef struct {
    pl_proto_name job, name, node, zone; /* zone may be "" (unknown) */
    char host[PL_PROTO_HOST_MAX + 1];    /* where peers reach this worker's TCP links */
    int port;                            /* 1..65535 */
    int gpus;                            /* 0..1024; 0 = CPU worker */
    pl_proto_name device;                /* its GPU's UUID ("GPU-…"); "" for a CPU worker */
    int nccl;                            /* it can run the NCCL transport */
    int64_t pid;                         /* 1..2^31-1 */
    char token_proof[PL_PROTO_PROOF_LEN + 1];
    /* optional "checkpoint": what the worker sees under the job's checkpoint directory,
     * for the coordinator's resume point; absent (0) when it does not look (no directory,
     * spec.checkpoint.resume never) */
    int has_checkpoint;
    int64_t checkpoint_step;             /* the newest complete checkpoint's step; 0: none */
    char checkpoint_error[PL_PROTO_TEXT_MAX + 1]; /* "" or why the directory could not be
                                                     read (checkpoint_step is then 0) */
} pl_msg_register;

typedef struct { int64_t step; } pl_msg_step; /* heartbeat, reduced, committed, start_step */

typedef struct {
    int reason;       /* pl_leave_reason */
    int64_t grace_ms; /* time until the worker expects to be killed; 0 = unknown */
} pl_msg_leaving;

typedef struct {
    int64_t step;
    int has_loss;           /* 0: this rank computes no loss (not a last stage) */
    double loss;            /* may be NaN or ±inf */
    int64_t tokens;         /* tokens this rank processed in the step */
    double ms;              /* compute time, finite, ≥ 0 */
    double grad_sumsq;      /* ≥ 0, or NaN / +inf */
    uint64_t samples_digest;
} pl_msg_report;

typedef struct {
    pl_proto_name peer;
    char reason[PL_PROTO_TEXT_MAX + 1];
} pl_msg_peer_broken;

typedef struct { int64_t bytes; } pl_msg_copy_done;

/* A checkpoint shard written: layers [layer_begin, layer_end) of the state after
 * `step` committed steps, in the plan's checkpoint directory; or, with error, why
 * they could not be written (bytes is then 0). */
typedef struct {
    int64_t step;           /* ≥ 1 */
    int layer_begin, layer_end;
    int64_t bytes;
    char error[PL_PROTO_TEXT_MAX + 1]; /* "" when written */
} pl_msg_saved;

/* fatal (worker → coordinator): this worker cannot take part in the job and exits, e.g.
 * its data holds a token id outside the vocabulary; reason non-empty. */
typedef struct { char reason[PL_PROTO_TEXT_MAX + 1]; } pl_msg_fatal;

/* save (coordinator → worker): write this worker's layers, as they are now (the state
 * after `step` committed steps), as the checkpoint of `step` and answer saved: a
 * checkpoint written again after a failed attempt. */
typedef struct { int64_t step; } pl_msg_save; /* ≥ 1 */

typedef struct {
    int64_t committed_step; /* -1: none */
    double grad_scale, lr;  /* of that commit (0 when none) */
    int64_t reduced_step;   /* step reduced but neither committed nor aborted; -1: none */
} pl_msg_hello_resume;

typedef struct { char nonce[PL_PROTO_NONCE_MAX + 1]; } pl_msg_challenge;

typedef struct {
    int rank;               /* 0..PL_PROTO_MAX_RANK, stable: oldest worker first */
    pl_proto_name job;
    int token_ok;           /* 0: the coordinator runs without authentication (local, insecure) */
    int heartbeat_ms;       /* PL_PROTO_HEARTBEAT_MIN_MS..PL_PROTO_HEARTBEAT_MAX_MS */
} pl_msg_welcome;

typedef struct {
    int nnodes;
    pl_proto_name *nodes;   /* malloc'd; worker names in stage order */
    int template_nodes;     /* == nnodes */
    int *layers;            /* malloc'd, nnodes + 1 stage bounds: node j runs layers
                               [layers[j], layers[j+1]); 0 first, increasing */
    int64_t microbatches;   /* ≥ 1 */
    int64_t first_microbatch;
} pl_msg_pipeline;

typedef struct {
    pl_proto_name name;
    char host[PL_PROTO_HOST_MAX + 1];
    int port;
} pl_msg_peer;

/* parts > 1: part `part` of the layer (reinstantiate.h: pl_layer_copy); 0 or 1: all of it */
typedef struct {
    int layer;
    int part, parts;
    pl_proto_name source;
    int64_t bytes;
} pl_msg_copy;

typedef struct {
    int layer;
    pl_proto_name dest;
} pl_msg_send;

typedef struct {
    int64_t generation;     /* == the message's gen */
    int64_t step;           /* the next step to run */
    int64_t global_batch;   /* == micro × Σ microbatches */
    int micro, seq_len;
    int npipelines;         /* 1..PL_PROTO_MAX_NODES */
    pl_msg_pipeline *pipelines;
    int you_pipeline;       /* -1: this worker is idle ("you": null); the rest is then 0 */
    int you_stage, you_layer_begin, you_layer_end; /* layers [begin, end) */
    int npeers;
    pl_msg_peer *peers;
    int ncopies;            /* layers (or parts of layers) this worker receives */
    pl_msg_copy *copies;
    int nsends;             /* layers this worker sends */
    pl_msg_send *sends;
    int has_checkpoint;
    char checkpoint_dir[PL_PROTO_PATH_MAX + 1];
    int64_t checkpoint_step;
    int transport;          /* pl_transport: how the plan's workers move tensors */
    int64_t reserve_bytes;  /* bytes of layers (params, m, v) this worker would receive, at
                               most, if one worker of this plan were lost: memory it may
                               hold ready (0: none) */
} pl_msg_plan;

/* The plan's worker-to-worker transport: TCP (host memory; GPU workers stage
 * through page-locked buffers), or NCCL between GPUs, one per worker, whose
 * communicator is made from the id the plan's rank 0 sends in nccl_root and
 * the coordinator passes on in nccl_init. */
typedef enum { PL_TRANSPORT_TCP = 0, PL_TRANSPORT_NCCL, PL_TRANSPORT_COUNT } pl_transport;

#define PL_PROTO_NCCL_ID_HEX 256 /* an ncclUniqueId (128 bytes) in hex */

typedef struct { char id[PL_PROTO_NCCL_ID_HEX + 1]; } pl_msg_nccl_id; /* nccl_root, nccl_init */

typedef struct {
    int64_t step;
    char reason[PL_PROTO_TEXT_MAX + 1];
} pl_msg_step_failed;

typedef struct {
    int64_t step;
    double grad_scale;      /* finite, > 0: the clip factor min(1, max_norm / norm) */
    double lr;              /* finite, ≥ 0 */
    int save;               /* write this worker's layers as the checkpoint of step + 1 */
} pl_msg_commit;

typedef struct {
    int64_t step;
    char reason[PL_PROTO_TEXT_MAX + 1];
} pl_msg_abort;

typedef struct {
    char reason[PL_PROTO_TEXT_MAX + 1];
    int exit_code;          /* 0..255 */
} pl_msg_stop;

typedef struct { char reason[PL_PROTO_TEXT_MAX + 1]; } pl_msg_refuse;

/* complete_checkpoint (coordinator → one worker): every layer of the checkpoint of `step`
 * is saved, write its checkpoint.json; checkpoint_done (the answer): error "" when
 * written, else why not. */
typedef struct { int64_t step; } pl_msg_complete_checkpoint; /* ≥ 1 */
typedef struct {
    int64_t step;                        /* ≥ 1 */
    char error[PL_PROTO_TEXT_MAX + 1];
} pl_msg_checkpoint_done;

/* profile_request (coordinator → one worker): measure the job's model on this worker's
 * device, `repeat` timed runs per layer. profile_done (the answer): the planner's profile
 * JSON (shared/profile.h; malloc'd, owned by the message, at most PL_PROTO_PROFILE_MAX
 * bytes) with error "", or NULL with why not. */
typedef struct { int repeat; } pl_msg_profile_request; /* 1..PL_PROTO_PROFILE_REPEAT_MAX */
typedef struct {
    char *profile;
    char error[PL_PROTO_TEXT_MAX + 1];
} pl_msg_profile_done;

/* eval (coordinator → the plan's pipeline workers): with the state after step `step`
 * committed, run the validation batches of this worker's pipeline forward; eval_done (the
 * answer of each): on the stage with the head, the sum of its batches' mean losses and
 * their number; elsewhere has_loss 0 (loss null) and the batches it forwarded. */
typedef struct { int64_t step; } pl_msg_eval;
typedef struct {
    int64_t step;
    int has_loss;
    double loss;            /* may be NaN or ±inf */
    int64_t batches;        /* ≥ 0 */
} pl_msg_eval_done;

typedef struct {
    int type;               /* pl_msg_type */
    int64_t gen;            /* plan generation, 0..PL_PROTO_INT_MAX */
    union {
        pl_msg_register reg;
        pl_msg_step heartbeat, reduced, committed, start_step;
        pl_msg_leaving leaving;
        pl_msg_report report;
        pl_msg_peer_broken peer_broken;
        pl_msg_copy_done copy_done;
        pl_msg_hello_resume hello_resume;
        pl_msg_saved saved;
        pl_msg_nccl_id nccl_root, nccl_init;
        pl_msg_step_failed step_failed;
        pl_msg_challenge challenge;
        pl_msg_welcome welcome;
        pl_msg_plan plan;
        pl_msg_commit commit;
        pl_msg_abort abort_;
        pl_msg_stop stop;
        pl_msg_refuse refuse;
        pl_msg_complete_checkpoint complete_checkpoint;
        pl_msg_checkpoint_done checkpoint_done;
        pl_msg_profile_request profile_request;
        pl_msg_profile_done profile_done;
        pl_msg_eval eval;
        pl_msg_eval_done eval_done;
        pl_msg_fatal fatal;
        pl_msg_save save;
    } u;
} pl_msg;

/* Zeroes m and sets its type and generation. */
void pl_msg_init(pl_msg *m, int type, int64_t gen);

/* Decodes one message of len bytes (text need not be NUL-terminated). On
 * success returns 0 and fills out (free with pl_msg_free); on error returns -1,
 * leaves out zeroed (nothing to free) and writes "path: reason" into err. */
int pl_msg_decode(const char *text, size_t len, pl_msg *out, char *err, size_t errlen);

/* Compact JSON (malloc'd, NUL-terminated), or NULL when m is not a valid
 * message or memory ran out. Whatever encode returns, decode accepts. */
char *pl_msg_encode(const pl_msg *m);
/* The same, with the reason for NULL in err. */
char *pl_msg_encode_err(const pl_msg *m, char *err, size_t errlen);

/* Frees a plan's arrays and a profile_done's text (with free()) and zeroes m; safe on any
 * decoded or zeroed message. Callers building either allocate with malloc. */
void pl_msg_free(pl_msg *m);

/* A deep copy of m into out, owning its own arrays and text (free with pl_msg_free), so that it
 * outlives m: e.g. queued for another thread. -1 when memory runs out (out is then
 * zeroed). */
int pl_msg_dup(const pl_msg *m, pl_msg *out);

/* The entry of the plan's peers named name, or NULL. */
const pl_msg_peer *pl_msg_plan_peer(const pl_msg_plan *p, const char *name);

/* "register", "plan", ...; "?" for an unknown type. */
const char *pl_msg_type_name(int type);
/* The type for a name, or PL_MSG_NONE. */
int pl_msg_type_from_name(const char *name);
/* 1 for worker → coordinator types, 0 for coordinator → worker, -1 unknown. */
int pl_msg_from_worker(int type);
/* "sigterm", "shutdown", "error"; "?" otherwise. */
const char *pl_leave_reason_name(int reason);
/* "tcp", "nccl"; "?" otherwise. */
const char *pl_transport_name(int transport);

#endif
