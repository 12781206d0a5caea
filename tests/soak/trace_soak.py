#!/usr/bin/env python3
"""Randomized spot-trace soak of `pliant run --chaos trace:` (`make soak`, docs/faults.md).

For each seed and strategy (templates, redundant with redundantForward eager and lazy,
checkpoint) it draws a pipelined layout, belowMinimum and a trace of single losses, two losses
at once, losses and joins during a recovery (100 ms to 2 s after a loss), joins and drops below
(F + 1)·n0, replays it against a job of a fixed step count and checks that the run:

- exits 0 within a timeout proportional to its steps (no stall);
- commits every step with `pliant train`'s loss (relative 1e-6) and samples digest; a step is
  redone only after a restart from a checkpoint, and its last record counts;
- ends no worker but those the trace killed (an `exited with status` or `killed by signal`
  line of another worker fails the run, with what that worker logged: `stopped: ...`);
- never reports layers with `neither a local copy nor a source`.

A failing run keeps its trace, job, metrics and log under OUT/STRATEGY-sSEED/ (the job's
profile in OUT) and prints the commands that replay it. Standard library only; run from the
repository root:
    python3 tests/soak/trace_soak.py [--build build] [--seeds 1,2 | --runs N]
        [--strategies templates,redundant-eager,redundant-lazy,checkpoint] [--steps N]
        [--span SECONDS] [--timeout-step SECONDS] [--out DIR] [--keep]
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAKESPEARE = os.path.join(os.path.dirname(REPO), "shared", "data", "tinyshakespeare.txt")
STRATEGIES = ["templates", "redundant-eager", "redundant-lazy", "checkpoint"]
# Several pipelines add their gradients in the all-reduce's order, not one process's
# (docs/architecture.md): at lr 3e-3 that rounding grows past 1e-6 of train's loss within 300
# steps of a failure-free run; at 1e-3 it stays under 1e-7 for 600.

JOB = """\
apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata:
  name: soak
spec:
  model: {{layers: 4, channels: 32, heads: 2, vocabSize: 256, maxSeqLen: 64, seed: 7}}
  data: {{train: {data}_train.bin, order: shuffled, seed: 3}}
  batch: {{global: 32, micro: 2, seqLen: 32}}
  optimizer: {{lr: 1.0e-3, warmupSteps: 2, schedule: cosine, gradClip: 1.0}}
  steps: {steps}
  profile: {profile}
{extra}"""
FT = """\
  checkpoint: {{dir: {ckpt}, every: 10, resume: never}}
  faultTolerance: {{strategy: {strategy}, tolerate: 1, maxResets: 1000000, \
belowMinimum: {below}{forward}}}
  nodes: {{min: 1, max: 16}}
"""
# The planner's GPU memory: 4-layer model fits no node. "shallow": templates of n0 = 2 (2-3
# stages); "deep": n0 = 4 (4-5 stages, the ring's wrap); redundant layers double a stage's
# memory, so redundant at "shallow" memory is already n0 = 4.
MEMORY = {"shallow": 2000000, "deep": 1200000}
MAX_LIVE = 10


def pliant(tool, *args, timeout=120):
    p = subprocess.run([tool.pliant] + [str(a) for a in args], cwd=REPO, capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=timeout)
    if p.returncode != 0:
        sys.exit("pliant %s: status %d\n%s" % (args[0], p.returncode, p.stderr[-2000:]))
    return p.stdout


def shards(tool):
    """Byte shards of the first 100 kB of Tiny Shakespeare in OUT (made once)."""
    data = os.path.join(tool.out, "ts")
    if not os.path.exists(data + "_train.bin"):
        text = data + ".txt"
        with open(SHAKESPEARE, "rb") as src, open(text, "wb") as dst:
            dst.write(src.read(100000))
        pliant(tool, "tokenize", "--bytes", text, data)
    return data


def layout(tool, strategy, rng):
    """(profile path, memory name, minimum (F + 1)·n0) of a random layout for the strategy."""
    mem = "shallow" if strategy.startswith("redundant") else rng.choice(["shallow", "deep"])
    path = os.path.join(tool.out, "profile-%s.json" % mem)
    if not os.path.exists(path):
        job = os.path.join(tool.out, "profile-job.yaml")
        with open(job, "w") as f:
            f.write(JOB.format(data=shards(tool), steps=1, profile="synthetic", extra=""))
        pliant(tool, "profile", job, "--out", path, "--repeat", "3", "--threads", "1",
               "--gpu-memory", MEMORY[mem])
    extra = ["--redundant", strategy.split("-")[1]] if strategy.startswith("redundant") else []
    plan = json.loads(pliant(tool, "plan", "--profile", path, "--nodes", MAX_LIVE,
                             "--tolerate", 1, "--global-batch", 32, *extra))
    return path, mem, 2 * plan["n0"]


class Trace:
    """A spot trace being drawn: rows (ms, add|remove, node), the live nodes."""

    def __init__(self, rng, nodes):
        self.rng, self.rows = rng, [(0, "add", i) for i in range(nodes)]
        self.live, self.next = list(range(nodes)), nodes

    def remove(self, t, adjacent=False):
        if len(self.live) <= 2:
            return False
        k = self.rng.randrange(len(self.live) - (1 if adjacent else 0))
        self.rows.append((t, "remove", self.live.pop(k)))
        if adjacent:  # the next node registered, often the next stage
            self.rows.append((t, "remove", self.live.pop(k)))
        return True

    def add(self, t):
        if len(self.live) >= MAX_LIVE:
            return False
        self.rows.append((t, "add", self.next))
        self.live.append(self.next)
        self.next += 1
        return True

    def gap(self):
        """A loss or join during the recovery of the previous one: 100 ms-2 s, log-uniform,
        since a recovery of this small model takes tens of ms unloaded, seconds loaded."""
        return int(100 * 20 ** self.rng.random())


# A scenario's events: (remove, remove2 (the next node registered too, often the next stage),
# add), each at the scenario's time or a gap (100 ms-2 s: a recovery's) after the one before.
SCENARIOS = {
    "loss": [("remove", 0)],
    "two-at-once": [("remove", 0), ("remove", 0)],
    "two-adjacent-at-once": [("remove2", 0)],
    "loss-in-recovery": [("remove", 0), ("remove", 1)],
    "join": [("add", 0)],
    "two-joins": [("add", 0), ("add", 0)],
    "join-in-recovery": [("remove", 0), ("add", 1)],
}
KINDS = sorted(SCENARIOS) + ["below-minimum"]


def scenario(tr, t, kind, minimum):
    """Appends one scenario's events from t; the time it ends. Only below-minimum leaves
    fewer than the minimum live, and for a while: a scenario that would is a join."""
    if kind == "below-minimum":
        return below_minimum(tr, t, minimum)
    events = SCENARIOS[kind]
    if len(tr.live) - sum(2 if a == "remove2" else a == "remove" for a, _ in events) < minimum:
        events = SCENARIOS["join"]
    for action, gap in events:
        t += tr.gap() if gap else 0
        if not (tr.add(t) if action == "add" else tr.remove(t, adjacent=action == "remove2")):
            break
    return t


def below_minimum(tr, t, minimum):
    """Losses a recovery's gap apart until fewer than the minimum live, then joins back."""
    while len(tr.live) >= minimum and tr.remove(t):
        t += tr.gap()
    t += tr.rng.randint(1000, 2500)
    while len(tr.live) < minimum:
        tr.add(t)
    return t


def draw_trace(rng, minimum, span_ms):
    """Scenarios 0.3 to 1.5 s apart over span_ms, then joins back to the minimum so that a
    job that waits for workers can finish."""
    tr = Trace(rng, rng.randint(min(max(minimum + 1, 5), MAX_LIVE), MAX_LIVE))
    t = rng.randint(500, 1500)
    while t < span_ms:
        t = scenario(tr, t, rng.choice(KINDS), minimum) + rng.randint(300, 1500)
    while len(tr.live) < minimum:
        tr.add(t)
    return tr.rows, len(tr.rows) - len([r for r in tr.rows if r[0] == 0])


def reference(tool, steps):
    """`pliant train`'s per-step rows of the job (once per step count)."""
    if steps not in tool.refs:
        job = os.path.join(tool.out, "ref-%d.yaml" % steps)
        with open(job, "w") as f:
            f.write(JOB.format(data=shards(tool), steps=steps, profile="synthetic", extra=""))
        m = job + ".jsonl"
        pliant(tool, "train", job, "--metrics", m, "--threads", 1, timeout=600)
        tool.refs[steps] = [r for r in read_metrics(m) if "event" not in r]
    return tool.refs[steps]


def read_metrics(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by the kill of a stalled run
    return rows


def check_steps(rows, ref, steps):
    """The problems with the committed steps against train's: [] when exact."""
    steps_rows = [r for r in rows if "event" not in r]
    seen = [r["step"] for r in steps_rows]
    last = {r["step"]: r for r in steps_rows}
    if sorted(last) != list(range(steps)):
        missing = sorted(set(range(steps)) - set(last))
        return ["steps missing: %s" % missing[:20]]
    restarts = any(r.get("event") == "reconfigure" and r.get("from_checkpoint") for r in rows)
    bad = [] if restarts or len(seen) == steps else [
        "steps redone without a checkpoint restart: %s" % sorted(
            {s for s in seen if seen.count(s) > 1})[:20]]
    for s, b in enumerate(ref):
        a = last[s]
        if abs(a["loss"] - b["loss"]) > 1e-6 * abs(b["loss"]):
            bad.append("step %d: loss %.9g, train %.9g" % (s, a["loss"], b["loss"]))
        if a["samples_digest"] != b["samples_digest"]:
            bad.append("step %d: samples differ from train's" % s)
    return bad[:5]


def check_workers(out, err):
    """Workers that ended though the trace did not kill them, each with what it logged."""
    killed = set(re.findall(r"^chaos: [^:]*: kill (w\d+) \(SIGKILL\)", out, re.M))
    bad = []
    for name, how in re.findall(r"^pliant run: worker (w\d+) (exited with status \d+|killed by "
                                r"signal \d+)$", err, re.M):
        if name in killed:
            continue
        said = re.findall(r"^worker %s: (?:stopped: |plan generation \d+ given up: )?(.*(?:"
                          r"stopped|removed from the job|given up|error|failed).*)$" % name,
                          err, re.M)
        hung = "; hung, killed by pliant run" if re.search(
            r"^pliant run: worker %s was lost .*hung" % name, err, re.M) else ""
        bad.append("worker %s %s, not killed by the trace%s%s" % (
            name, how, hung, (": " + said[-1][:300]) if said else ""))
    return bad


def replay(tool, d, job, trace, steps):
    """(status or None when it stalled, stdout, stderr, seconds) of the replay."""
    cmd = [tool.pliant, "run", job, "--threads", "1", "--metrics",
           os.path.join(d, "metrics.jsonl"), "--chaos", "trace:%s:1" % trace]
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=tool.timeout_base + tool.timeout_step * steps)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # pliant run and its workers
        out, err = p.communicate()
        rc = None
    return rc, out, err, time.time() - t0


def one_run(tool, seed, strategy):
    """Draws, replays and checks one run: (ok, summary line)."""
    rng = random.Random("%d-%s" % (seed, strategy))
    profile, mem, minimum = layout(tool, strategy, rng)
    below = rng.choice(["wait", "degrade"])
    d = os.path.join(tool.out, "%s-s%d" % (strategy, seed))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    rows, events = draw_trace(rng, minimum, tool.span_ms)
    trace = os.path.join(d, "trace.csv")
    with open(trace, "w") as f:
        f.write("".join("%d,%s,node%d\n" % r for r in rows))
    name = strategy.split("-")
    forward = ", redundantForward: %s" % name[1] if len(name) > 1 else ""
    job = os.path.join(d, "job.yaml")
    with open(job, "w") as f:
        f.write(JOB.format(data=shards(tool), steps=tool.steps, profile=profile, extra=FT.format(
            ckpt=os.path.join(d, "ckpt"), strategy=name[0], below=below, forward=forward)))
    rc, out, err, secs = replay(tool, d, job, trace, tool.steps)
    with open(os.path.join(d, "run.log"), "w") as f:
        f.write(out + "\n--- stderr ---\n" + err)
    metrics = read_metrics(os.path.join(d, "metrics.jsonl"))
    bad = (["stalled: not done after %.0f s" % secs] if rc is None else
           ["exit status %d: %s" % (rc, err.strip().splitlines()[-1:])] if rc else [])
    if rc is not None:
        bad += check_steps(metrics, reference(tool, tool.steps), tool.steps)
    bad += check_workers(out, err)
    if "neither a local copy nor a source" in out + err:
        bad.append("layers with neither a local copy nor a source")
    rec = [r for r in metrics if r.get("event") == "reconfigure"]
    line = "%-15s seed %-4d %s, belowMinimum %s, minimum %d, %d workers, %d events: %d " \
           "reconfigurations (%d failovers, %d from a checkpoint), %.1f s" % (
               strategy, seed, mem, below, minimum, sum(r[0] == 0 for r in rows), events,
               len(rec), sum("failover" in r.get("cause", "") for r in rec),
               sum(bool(r.get("from_checkpoint")) for r in rec), secs)
    if not bad:
        if not tool.keep:
            shutil.rmtree(d)
        return True, line + ": ok"
    return False, line + ": FAILED\n    " + "\n    ".join(bad) + (
        "\n    kept in %s; replay: python3 %s --seeds %d --strategies %s --steps %d --span %g\n"
        "    or: %s run %s --threads 1 --metrics %s --chaos trace:%s:1" % (
            os.path.relpath(d, REPO), os.path.relpath(__file__, REPO), seed, strategy,
            tool.steps, tool.span_ms / 1000, tool.pliant, job, os.path.join(d, "metrics.jsonl"),
            trace))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--seeds", help="comma-separated seeds (default: 1..RUNS)")
    ap.add_argument("--runs", type=int, default=2, help="seeds 1..RUNS (default 2)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--steps", type=int, default=500, help="each job's steps (default 500)")
    ap.add_argument("--span", type=float, default=10, help="the traces' seconds (default 10)")
    ap.add_argument("--timeout-step", type=float, default=0.5,
                    help="seconds a step may take before the run counts as stalled, "
                    "beside 60 s for the start and the trace (default 0.5)")
    ap.add_argument("--keep", action="store_true", help="keep the runs that pass too")
    ap.add_argument("--out", help="where runs are made and failures kept (default BUILD/soak)")
    a = ap.parse_args()
    build = a.build if os.path.isabs(a.build) else os.path.join(REPO, a.build)
    seeds = [int(s) for s in a.seeds.split(",")] if a.seeds else list(range(1, a.runs + 1))
    strategies = a.strategies.split(",")
    for s in strategies:
        if s not in STRATEGIES:
            sys.exit("--strategies: unknown %r (one of %s)" % (s, ", ".join(STRATEGIES)))
    tool = argparse.Namespace(pliant=os.path.join(build, "bin", "pliant"), refs={},
                              out=os.path.abspath(a.out or os.path.join(build, "soak")),
                              steps=a.steps, span_ms=int(a.span * 1000), timeout_base=60,
                              timeout_step=a.timeout_step, keep=a.keep)
    os.makedirs(tool.out, exist_ok=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print("soak: seeds %s, strategies %s, %d steps, %.0f-second traces, load %s" % (
        ",".join(map(str, seeds)), ",".join(strategies), a.steps, a.span, load), flush=True)
    t0, failed = time.time(), 0
    for seed in seeds:
        for strategy in strategies:
            ok, line = one_run(tool, seed, strategy)
            failed += not ok
            print(line, flush=True)
    print("soak: %d of %d runs failed, %.0f s" % (failed, len(seeds) * len(strategies),
                                                   time.time() - t0))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
