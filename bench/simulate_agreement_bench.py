#!/usr/bin/env python3
"""The simulator against a real replay: `make bench-simulate` (docs/simulate.md, "Against a
real replay").

`pliant simulate` against `pliant run --chaos trace:` on this machine, same pipelined job
(n0 = 2), profile and a 12-second trace with a loss or a join every second, for every
strategy: samples/s and the reconfiguration count, and whether they agree within 10 %. The
profile is measured by `pliant profile --threads 1 --pipeline-workers 9` just before the
replay: the layers as the workers compute them and the job's real failure-free step on the
trace's first nodes (pipeline_step), from which the simulator takes the one constant of this
machine it is not given on the command line, the latency a step waits for each message; what
the reconfigurations, copies, rollbacks and failovers cost is the simulator's. The machine is
shared, so its speed drifts between the profile and the replay: a strategy that disagrees is
measured and replayed again, at most three times in all, every attempt printed. Exits 1 when a
strategy disagrees in every attempt.

Standard library only. Run from the repository root (about 60 s on a quiet machine):
    python3 bench/simulate_agreement_bench.py [--build build] [--strategies templates,...]
"""

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile

from bench_data import shakespeare_shards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOB = """\
apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata:
  name: agree-{strategy}
spec:
  model: {{layers: 4, channels: 32, heads: 2, vocabSize: 256, maxSeqLen: 64, seed: 7}}
  data: {{train: {data}_train.bin, order: shuffled, seed: 3}}
  batch: {{global: 64, micro: 2, seqLen: 32}}
  steps: 1000000
  profile: {profile}
  checkpoint: {{dir: {ckpt}, every: 10, resume: never}}
  faultTolerance: {{strategy: {strategy}, tolerate: 1, maxResets: 1000000}}
  nodes: {{min: 1, max: 12}}
"""
NODES = 9          # at the trace's start: one more than redundant's (F + 1) n0 = 8
SECONDS = 12
GPU_MEMORY = 2000000  # the model fits no node: n0 = 2 (templates), 4 (redundant)
ATTEMPTS = 3          # a load that changed between the profile and the replay: again
# the simulator's costs of this machine beside the profile's: a plan's installation beyond
# its copies (engine, links), a started worker process until it registers (docs/simulate.md)
COSTS = ["--cores", "2", "--install-ms", "60", "--startup", "0.1", "--notice", "0"]


def pliant(bench, *args, timeout, stderr=False):
    """`pliant ARGS`: its stdout (and stderr after it); exits naming the command where it
    fails."""
    p = subprocess.run([bench.pliant] + [str(a) for a in args], cwd=REPO,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        sys.exit("pliant %s: status %d\n%s" % (args[0], p.returncode, p.stderr[-2000:]))
    return p.stdout + (p.stderr if stderr else "")


def trace(tmp):
    """Losses and joins of one node in turn, 0.75 to 1.3 s apart, from 1.2 s; a join at the
    end. The uneven gaps matter for the checkpoint strategy: a restart keeps whole checkpoint
    intervals, so with equal gaps the steps of a gap against a multiple of the interval would
    decide every restart alike, and a slightly faster or slower real run would differ in all
    of them at once."""
    rows = ["0,add,node%d" % i for i in range(NODES)]
    nxt, live = NODES, list(range(NODES))
    times = [1200, 2200, 3000, 4300, 5200, 6400, 7150, 8250, 9200, 10450, 11300]
    for k, t in enumerate(times):
        if k % 2 == 0:
            rows.append("%d,remove,node%d" % (t, live.pop((3 * k + 1) % len(live))))
        else:
            rows.append("%d,add,node%d" % (t, nxt))
            live.append(nxt)
            nxt += 1
    rows.append("%d,add,node%d" % (SECONDS * 1000, nxt))
    path = os.path.join(tmp, "agree.csv")
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")
    return path


def measured_profile(bench, job, path):
    """`pliant profile` of the job as the replay's workers run it (one thread each): its
    layers, the GPU memory lowered so that every template is a pipeline, and its real
    failure-free step on the trace's first nodes (pipeline_step); returns that step's ms."""
    pliant(bench, "profile", job, "--out", path, "--repeat", "21", "--threads", "1",
           "--gpu-memory", GPU_MEMORY, "--pipeline-workers", NODES, timeout=120)
    with open(path) as f:
        return json.load(f)["pipeline_step"]["ms"]


def real_replay(bench, job, trace_path, metrics):
    """(samples/s over the trace, reconfigurations, mean ms of a step that is not a plan's
    first) of `pliant run --chaos trace:`."""
    log = pliant(bench, "run", job, "--threads", "1", "--duration", SECONDS, "--metrics", metrics,
                 "--chaos", "trace:%s:1" % trace_path, timeout=120, stderr=True)
    with open(metrics + ".log", "w") as f:
        f.write(log)
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in rows if "event" not in r]
    steady = [64 * 32 / b["tokens_per_second"] * 1e3 for a, b in zip(steps, steps[1:])
              if a["plan_generation"] == b["plan_generation"]]
    progress = max(r["step"] for r in steps) + 1
    reconfigs = sum(1 for r in rows if r.get("event") == "reconfigure")
    return progress * 64 / SECONDS, reconfigs, sum(steady) / len(steady)


def simulated(bench, job, trace_path, strategy):
    """(samples/s, reconfigurations, the latency it took from the profile in us) of
    `pliant simulate` with this machine's costs."""
    out = pliant(bench, "simulate", job, "--trace", trace_path, "--strategy", strategy, *COSTS,
                 timeout=60)
    m = re.search(r"([0-9.]+) samples/s, .* (\d+) reconfigurations", out)
    lat = re.search(r"^latency: (\d+) us a message, from the profile's pipeline_step", out, re.M)
    if not (m and lat):
        sys.exit("pliant simulate printed no summary:\n%s" % out)
    return float(m.group(1)), int(m.group(2)), int(lat.group(1))


def agree_once(bench, strategy, job, trace_path, profile, attempt):
    """One measure, simulate and replay: the line printed, and whether both agree."""
    profile_ms = measured_profile(bench, job, profile)
    sim, sim_rec, lat = simulated(bench, job, trace_path, strategy)
    real, real_rec, step_ms = real_replay(
        bench, job, trace_path, os.path.join(bench.tmp, "agree-%s-%d.jsonl" % (strategy, attempt)))
    ok = abs(sim / real - 1) <= 0.10 and abs(sim_rec / real_rec - 1) <= 0.10
    print("| %s | %d | %.0f | %.0f (%+.1f %%) | %d | %d | %.1f ms, %.1f ms | %.1f ms | %s |"
          % (strategy, attempt + 1, real, sim, 100 * (sim / real - 1), real_rec, sim_rec,
             profile_ms, lat / 1e3, step_ms, "yes" if ok else "no"), flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--strategies", default="templates,redundant,checkpoint")
    ap.add_argument("--keep", metavar="DIR", help="write the jobs, profiles, traces and the "
                    "replays' metrics and logs into DIR and keep them")
    a = ap.parse_args()
    build = a.build if os.path.isabs(a.build) else os.path.join(REPO, a.build)
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
    with (contextlib.nullcontext(os.path.abspath(a.keep)) if a.keep else
          tempfile.TemporaryDirectory(prefix="pliant-agree-")) as tmp:
        bench = argparse.Namespace(pliant=os.path.join(build, "bin", "pliant"), tmp=tmp)
        data = shakespeare_shards(bench.pliant, tmp)
        trace_path = trace(tmp)
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
        print("load average %s; %d workers, a %d-second trace, at most %d attempts a strategy"
              % (load, NODES, SECONDS, ATTEMPTS))
        print("| strategy | attempt | real samples/s | simulated | real reconfigurations | "
              "simulated | profile's step, latency | replay's step | within 10 % |")
        print("|---|---|---|---|---|---|---|---|---|")
        missed = []
        for strategy in a.strategies.split(","):
            profile = os.path.join(tmp, "agree-%s-profile.json" % strategy)
            job = os.path.join(tmp, "agree-%s.yaml" % strategy)
            with open(job, "w") as f:
                f.write(JOB.format(strategy=strategy, data=data, profile=profile,
                                   ckpt=os.path.join(tmp, "agree-%s.ckpt" % strategy)))
            if not any(agree_once(bench, strategy, job, trace_path, profile, k)
                       for k in range(ATTEMPTS)):
                missed.append(strategy)
        print("agreement within 10 %%: %s" % ("every strategy" if not missed else
                                              "not for " + ", ".join(missed)))
        return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
