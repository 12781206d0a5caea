#!/usr/bin/env python3
"""The fault matrix of `pliant run` (docs/faults.md): a worker is killed (SIGKILL), hung
(SIGSTOP) or preempted (SIGTERM) at each phase of the training — forward, backward,
gradient all-reduce, layer copy, commit, checkpoint write — and its control connection is
cut; two workers fail at once, survivably and fatally; a worker dies while another's
control connection is cut. The faults fire at exact points through the workers' test hook
(PLIANT_FAULT, worker/agent/fault.h), targeted by plan rank, not by timing.

Every cell must end with the job done (status 0), every step committed with the
failure-free run's samples (per-step samples_digest) and its loss (final loss within 1 %;
it is equal), each step once unless the cell forces a restart from a checkpoint (no live
holder of some layer), which must say so. A hung worker must be found by its missed
heartbeats and killed, not wait for the end of the job.

The default matrix: 4 workers in two pipelines of two stages (2x2), heartbeats every
0.2 s, a checkpoint every 4 steps. PLIANT_FAULT_MATRIX=big (`make test-faults`): 6 workers
(2x3) and the cut action at every phase as well. PLIANT_FAULT_MATRIX_TABLE=FILE writes the
table of outcomes (markdown rows) there.

Run: python3 tests/cli/test_fault_matrix.py --build build [-k SUBSTRING]
"""

import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import REPO, SHAKESPEARE, Suite, check  # noqa: E402

suite = Suite("fault_matrix", needs=[SHAKESPEARE])
BIG = os.environ.get("PLIANT_FAULT_MATRIX") == "big"
WORKERS, GLOBAL = (6, 4) if BIG else (4, 4)  # 2x3 or 2x2
STEPS, COPY_STEPS = 12, 30  # the copy cells wait for a worker to start and join
HEARTBEAT_S = 0.2

JOB = """\
apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
spec:
  model: {{layers: 3, channels: 32, heads: 2, vocabSize: 256, maxSeqLen: 64, seed: 7}}
  data: {{train: {data}_train.bin, order: shuffled, seed: 3}}
  batch: {{global: {global_}, micro: 2, seqLen: 32}}
  optimizer: {{lr: 3.0e-3, warmupSteps: 2, schedule: cosine, gradClip: 1.0}}
  steps: {steps}
  profile: synthetic
  checkpoint: {{dir: {ckpt}, every: 4}}
  faultTolerance: {{heartbeatSeconds: {hb}}}
"""

SIGNAL_WORD = {"kill": "SIGKILL", "stop": "SIGSTOP", "term": "SIGTERM",
               "cut": "control connection cut", "stall": "a stall"}
PHASE_WORDS = {"forward": "the forward", "backward": "the backward",
               "sync": "the gradient all-reduce", "copy": "a layer copy",
               "commit": "the commit", "checkpoint": "the checkpoint write"}
# where each phase's fault fires: (PLIANT_FAULT's N, the ranks, chaos that makes it happen);
# rank 1 is stage 1 of pipeline 0, a checkpoint writer; rank 0 (stage 0: the embedding and
# layer 0 at least) has several all-reduces. The copy phase: a worker joins at step 3 and
# receives layers in plan 2; the faulty worker is its source.
PHASES = {"forward": ("5", "@1", None), "backward": ("5", "@1", None),
          "sync": ("5", "@0", None), "commit": ("5", "@1", None),
          "checkpoint": ("4", "@1", None), "copy": ("2", "", "add:1@step=3")}

_table = []
_reference = {}


def write_job(name, steps):
    path = os.path.join(suite.tmp, name + ".yaml")
    ckpt = os.path.join(suite.tmp, name + ".ckpt")
    with open(path, "w") as f:
        f.write(JOB.format(name=name.replace("_", "-"), data=suite.shakespeare_shards(100000), global_=GLOBAL,
                           steps=steps, ckpt=ckpt, hb=HEARTBEAT_S))
    return path


def run_job(name, steps, fault=None, chaos=None, timeout=120):
    """pliant run of a fresh job: (status, stdout, stderr, metrics rows, seconds)."""
    job = write_job(name, steps)
    m = os.path.join(suite.tmp, name + ".jsonl")
    argv = [suite.pliant, "run", job, "--workers", str(WORKERS), "--threads", "1",
            "--metrics", m]
    if chaos:
        argv += ["--chaos", chaos]
    env = dict(os.environ)
    env.pop("PLIANT_FAULT", None)
    if fault:
        env["PLIANT_FAULT"] = fault
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    secs = time.monotonic() - t0
    rows = []
    if os.path.exists(m):
        with open(m) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return (p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"),
            rows, secs)


def reference(steps):
    """The failure-free run's per-step rows (once per length)."""
    if steps not in _reference:
        rc, out, err, rows, _ = run_job("ref%d" % steps, steps)
        check(rc == 0, "the failure-free run failed (%d):\n%s\n%s", rc, out[-1500:],
              err[-1500:])
        _reference[steps] = [r for r in rows if "event" not in r]
    return _reference[steps]


def check_training(rows, steps, restart):
    """The failure-free run's samples and losses for every step (the last record of each:
    a restart from a checkpoint redoes some); each step once unless restart. Returns
    (the steps redone, final loss, its relative difference)."""
    ref = reference(steps)
    seen = [r["step"] for r in rows if "event" not in r]
    last = {r["step"]: r for r in rows if "event" not in r}
    check(sorted(last) == list(range(steps)), "steps committed: %s", seen)
    if not restart:
        check(seen == list(range(steps)), "a step lost or repeated: %s", seen)
    for s, b in enumerate(ref):
        a = last[s]
        check(a["samples_digest"] == b["samples_digest"], "step %d: other samples", s)
        check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]),
              "step %d: loss %.9g, failure-free %.9g", s, a["loss"], b["loss"])
    final, want = last[steps - 1]["loss"], ref[-1]["loss"]
    rel = abs(final - want) / abs(want)
    check(rel <= 0.01, "final loss %.6f, failure-free %.6f", final, want)
    return len(seen) - steps, final, rel


def fired(err, action, phase):
    """Workers whose fault fired, from their PLIANT_FAULT lines."""
    pat = r"worker (\S+): PLIANT_FAULT: %s during %s" % (re.escape(SIGNAL_WORD[action]),
                                                        re.escape(PHASE_WORDS[phase]))
    return re.findall(pat, err)


def cell(name, faults, chaos=None, steps=STEPS, restart=False, expect_fired=1):
    """Runs one cell: faults = [(phase, action, PLIANT_FAULT spec)]; checks and records."""
    spec = ";".join(f for _, _, f in faults)
    rc, out, err, rows, secs = run_job(name, steps, spec, chaos)
    check(rc == 0, "pliant run failed (%d):\n%s\n%s", rc, out[-2000:], err[-2500:])
    n = sum(len(fired(err, a, p)) for p, a, _ in faults)
    check(n >= expect_fired, "%d faults fired, %d expected:\n%s", n, expect_fired, err[-2000:])
    rec = [r for r in rows if r.get("event") == "reconfigure"]
    check(rec, "no reconfiguration:\n%s", out[-1500:])
    redone, final, rel = check_training(rows, steps, restart)
    if restart:
        check(any(r["from_checkpoint"] for r in rec), "no restart from a checkpoint: %s", rec)
    else:
        check(not any(r["from_checkpoint"] for r in rec), "a checkpoint was loaded: %s", rec)
    actions = {a for _, a, _ in faults}
    causes = " ".join(r["cause"] for r in rec)
    if "stop" in actions:
        check("missed heartbeats" in causes, "the hung worker was not found by its heartbeats: "
              "%s", causes)
        check("(hung): killed" in err, "the hung worker was not killed:\n%s", err[-1500:])
    if "stall" in actions:
        check("within its deadline" in causes, "the stalled worker was not found by the step "
              "deadline: %s", causes)
        check("(hung): killed" in err, "the stalled worker was not killed:\n%s", err[-1500:])
    if actions == {"term"}:
        check("leaving" in causes and not redone, "not a clean leave: %s", causes)
    if "cut" in actions:
        check("connection closed" in causes, "the cut was not seen: %s", causes)
    # every due checkpoint is written, or one soon after when a writer was lost (and for a
    # restart, from where the job went back to); the last always. A fault in the checkpoint
    # write fires when the background write ends, which on a loaded machine may be after the
    # next checkpoint was asked for: that one's writer is then lost too, and the one after
    # the loss follows it (4 given up, 8 given up, 9)
    ckpts = [r["step"] for r in rows if r.get("event") == "checkpoint"]
    check(ckpts and ckpts[-1] == steps, "the last checkpoint was not written: %s", ckpts)
    late = 8 if any(p == "checkpoint" for p, _, _ in faults) else 4
    for due in range(4, steps + 1, 4):
        check(restart or any(due <= c <= due + late for c in ckpts) or due == steps,
              "no checkpoint for step %d or soon after: %s", due, ckpts)
    if actions == {"term"}:
        due = sorted(set(range(4, steps + 1, 4)) | {steps})
        check(ckpts == due, "a clean leave lost a checkpoint: %s", ckpts)
    durations = [r["duration_ms"] for r in rec if r["duration_ms"] is not None]
    _table.append((name, causes, redone, final, rel, durations, secs, ckpts))


def one_worker(phase, action):
    n, ranks, chaos = PHASES[phase]
    steps = COPY_STEPS if phase == "copy" else STEPS
    cell("%s_%s" % (phase, action), [(phase, action, "%s:%s:%s%s" % (phase, n, action, ranks))],
         chaos=chaos, steps=steps)


def make_tests():
    actions = ("kill", "stop", "term", "cut") if BIG else ("kill", "stop", "term")
    for phase in PHASES:
        for action in actions:
            def t(phase=phase, action=action):
                one_worker(phase, action)
            t.__name__ = "%s_%s" % (phase, action)
            suite.test(t)


make_tests()


def backward_cut():
    """Stage 1 of pipeline 0 loses its control connection in the backward: the coordinator
    counts it lost and replans; the worker connects again (a join, or refused once the job
    is done)."""
    one_worker("backward", "cut")


if not BIG:  # the big matrix cuts at every phase
    suite.test(backward_cut)


@suite.test
def backward_stall():
    """Stage 1 of pipeline 0's compute thread blocks for good in the backward while its
    control thread goes on heartbeating: the automatic step deadline (here its floor, 5
    heartbeat windows: 3 s) finds it, the step is redone under a new plan and pliant run
    kills the hung process."""
    one_worker("backward", "stall")


@suite.test
def two_workers_at_once():
    """Stage 1 of pipeline 0 and stage 0 of pipeline 1 killed on the same commit (a point
    both reach whatever the other does; in a backward the first loss aborts the step before
    the other gets there): every layer keeps a holder, one plan (SETTLING) recovers both, no
    checkpoint."""
    cell("two_at_once", [("commit", "kill", "commit:5:kill@1,%d" % (WORKERS // 2))],
         expect_fired=2)


@suite.test
def two_workers_fatal():
    """Both holders of stage 0 (rank 0 of each pipeline) killed on the same commit: no live
    holder of layers 0-1, so the job restarts from the newest complete checkpoint (step 4, or
    the initial state when that checkpoint was not complete yet) and redoes the steps since
    with the same samples."""
    cell("two_fatal", [("commit", "kill", "commit:5:kill@0,%d" % (WORKERS // 2))],
         restart=True, expect_fired=2)


@suite.test
def worker_and_control_connection():
    """Stage 1 of pipeline 0 killed while stage 0 of pipeline 1 loses its control
    connection, on the same commit."""
    cell("kill_and_cut", [("commit", "kill", "commit:5:kill@1"),
                          ("commit", "cut", "commit:5:cut@%d" % (WORKERS // 2))],
         expect_fired=2)


def write_table():
    path = os.environ.get("PLIANT_FAULT_MATRIX_TABLE")
    if not path or not _table:
        return
    with open(path, "w") as f:
        for name, causes, redone, final, rel, durations, secs, ckpts in _table:
            f.write("| %s | %s | %d | %.6f (%.1e) | %s | %.2f | %s |\n" % (
                name, causes.replace("|", "/"), redone, final, rel,
                ", ".join(str(d) for d in durations), secs,
                ", ".join(str(c) for c in ckpts)))


if __name__ == "__main__":
    rc = suite.main()
    write_table()
    sys.exit(rc)
