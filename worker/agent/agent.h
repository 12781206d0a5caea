/* The worker process of `pliant run` (docs/runtime.md "Processes"): a control
 * thread (the WebSocket client of control_client.h: register, heartbeats, the
 * coordinator's messages, reconnection with hello_resume) and a compute thread that
 * installs plans (engine for its layer range, all-reduce connections to its sync-group
 * peers, stage-link connections to its pipeline neighbours, or the plan's NCCL world),
 * runs steps with pl_worker_step and applies commits, writing its layers of a
 * checkpoint in the background when a commit (or a save, the last checkpoint written
 * again) asks (checkpoint_writer.h) and telling the coordinator in saved, error
 * included. The control
 * thread hands the compute thread decoded copies of the messages (msg_queue.h). agent.c
 * holds the two threads' loops, plan_install.c the installation of a plan, agent_state.h
 * the state they share.
 *
 * Layer copies (layer_copy.h): on a plan that changes this worker's layers, the engine
 * of the previous plan is kept as the copy source (until the next start_step, the
 * coordinator's stable plan), a new engine is made for the new range, layers still held
 * are copied locally, and each layer of the plan's `copies` is received from its source
 * (params, AdamW m and v of every tensor; a head-only range's tied wte comes with the
 * head) while the plan's `sends` are served, over TCP or the plan's NCCL world.
 * copy_done carries the bytes received. A newer plan arriving while one is installed
 * gives that one up (no copy_done for it); a peer whose copy or dial failed is reported
 * in peer_broken.
 *
 * Peer TCP (mesh.h): the worker listens on peer_port for every kind of connection and
 * registers that address; a connection's handshake names its purpose (ring, stage link,
 * layer copy) and carries the plan rank. The higher plan rank dials the lower one; a
 * copy's source dials its destination. Plan ranks are positions in the plan's pipelines
 * flattened in order; every pipeline's stage layout comes in the plan
 * (pipelines[].layers), peers' addresses in its peers.
 *
 * Failures: its token shards are checked against the vocabulary at load; bad data, a
 * plan it cannot install, any fatal error is told to the coordinator (fatal), whose
 * stop it waits for (FATAL_WAIT_MS) before exiting with status 1: a worker with bad data
 * registers only to say so.
 *
 * Duties (duties.c): register says which complete checkpoint the worker sees under the
 * job's checkpoint directory; complete_checkpoint has it write a checkpoint's
 * checkpoint.json, then delete what spec.checkpoint.keep does not keep (control thread);
 * profile_request has it measure the model on its kernels
 * and eval run its pipeline's share of the validation batches forward (compute thread; a
 * newer plan interrupts an evaluation's links).
 *
 * Threads and ownership: pl_agent_run owns everything it makes and returns when the
 * worker ends; the options must outlive it. */
#ifndef PLIANT_AGENT_H
#define PLIANT_AGENT_H

#include <stdint.h>

typedef struct {
    const char *job_path;     /* the TrainingJob */
    const char *coordinator;  /* HOST:PORT */
    const char *token;        /* job token (its bytes are the key) */
    const char *ca_path;      /* coordinator certificate (or CA) to trust; NULL needs insecure */
    int insecure;             /* 1 with ca_path NULL: no certificate check (asked for explicitly) */
    const char *name;         /* worker name */
    const char *node;         /* the machine it runs on (NULL: the host name) */
    const char *zone;         /* its topology zone (NULL: unknown) */
    const char *host;         /* address the peer links listen on (NULL: 127.0.0.1) */
    const char *advertise;    /* address peers dial, sent at registration (NULL: host) */
    int peer_port;            /* TCP port for peer links (0: any free one) */
    int peer_protection;      /* pl_frame_protection of peer frames (worker/comm/tcp.h);
                                 0: the default */
    const char *checkpoint_dir; /* overrides spec.checkpoint.dir (NULL: the job's) */
    int64_t grace_ms;         /* from SIGTERM to the kill (the Pod's grace period; 0: unknown),
                                 told the coordinator in `leaving` */
    int threads;              /* compute threads (≤ 0: all cores) */
    const char *backend;      /* kernels: "cpu", "cuda", "auto" or NULL (CUDA if there is a
                                 device and this build has it, else the CPU) */
    int no_copy_reserve;      /* 1: hold no memory ready for a loss's copies
                                 (worker/engine/copy_reserve.h) */
} pl_agent_options;

/* Runs the worker until `stop` (returns its exit code) or a failure (1). */
int pl_agent_run(const pl_agent_options *o);

#endif
