#!/usr/bin/env python3
"""Per-step overhead of strategy redundant against templates, failure-free
(docs/redundant.md, bench/README.md "Redundant computation's overhead").

The same pipelined model (GPT 6 layers x 128 channels, 64 tokens a sequence)
runs under `pliant run` on local workers, one thread each, with strategy
templates, redundant with lazy FRC and redundant with eager FRC, in turn,
--repeat times, in each configuration (--config, all by default):
  3stage: 3 workers, 8 microbatches of 2 sequences a step. A planner profile with uniform blocks
    (forward 1, backward 2) and 32 MB of "GPU" memory makes every strategy plan
    the same single 3-stage pipeline [0,3) [3,5) [5,8): the model does not fit
    one node, and with its shadows (Bamboo's ring: stage k also holds
    (k+1) mod 3's layers) it needs 3. Three stages share the machine's 2 cores.
  2stage: 2 workers, a core per stage: the 2-stage ring. With memory for the
    ring (40 MB) one node fits too, and two 1-node pipelines beat one 2-stage
    pipeline for any microbatch count but 1: the step is one microbatch, so that
    every strategy plans the one 2-stage pipeline [0,4) [4,8).
  2stage-wide: the same with one microbatch of 16 sequences (200 MB): Bamboo's
    setting, a device per stage idle in the bubbles, and a step long enough for
    the shadow's fixed costs (gradients, AdamW) to weigh as on a real model.

Printed per run: the median step time (steps after the first two), the overhead
against the templates run of the same round, for eager FRC the workers' `frc:`
lines summed: the FRC's compute time and the part run while the stage waited
(hidden by the bubbles) against the part run after every wait (exposed), and
from the holders' `rc:` lines the largest shadow costs a step: receiving the
successor's gradients after the stage (sh_recv, the transfer's unhidden part) and
the shadow's AdamW after `committed` (sh_adamw, off the step's path). Last, what shared/rc_plan predicts for the
same profile (`pliant plan --redundant`). Standard library only.
Usage: bench/rc_overhead_bench.py [--repeat N] [--steps N] [--config 3stage|2stage|2stage-wide]
                                  [--build DIR]
"""

import argparse
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
  name: rco-{name}
spec:
  model: {{layers: 6, channels: 128, heads: 4, vocabSize: 256, maxSeqLen: 64, seed: 7}}
  data: {{train: {data}_train.bin, order: shuffled, seed: 3}}
  batch: {{global: {global_}, micro: {micro}, seqLen: 64}}
  optimizer: {{lr: 1.0e-3, warmupSteps: 2, schedule: cosine, gradClip: 1.0}}
  steps: {steps}
  profile: {profile}
  faultTolerance: {{tolerate: 0{ft}}}
"""
RUNS = (("templates", ""), ("lazy", ", strategy: redundant, redundantForward: lazy"),
        ("eager", ", strategy: redundant, redundantForward: eager"))
FRC = re.compile(r"frc: (\d+) steps, (\d+) microbatches in waits \(([\d.]+) ms\), "
                 r"(\d+) exposed \(([\d.]+) ms\)")
# name: (workers, sequences a step, sequences a microbatch, planner memory bytes)
CONFIGS = {"3stage": (3, 16, 2, 32e6), "2stage": (2, 2, 2, 40e6), "2stage-wide": (2, 16, 16, 200e6)}
RC = re.compile(r"rc: \d+ steps, shadow gradients received after the stage ([\d.]+) ms a step, "
                r"shadow AdamW after the commit ([\d.]+) ms a step")


def write_job(tmp, name, data, steps, profile, ft, global_, micro):
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(JOB.format(name=name, data=data, steps=steps, profile=profile, ft=ft, micro=micro,
                           global_=global_))
    return path


def make_profile(pliant, tmp, data, memory, micro):
    """The layers' sizes measured by `pliant profile`, their times made uniform and the
    memory set to `memory` bytes, so that the three strategies plan the same pipeline."""
    job = write_job(tmp, "profile", data, 1, "synthetic", "", 2 * micro, micro)
    out = os.path.join(tmp, "measured.json")
    subprocess.run([pliant, "profile", job, "--out", out, "--repeat", "1"], check=True,
                   capture_output=True)
    with open(out) as f:
        p = json.load(f)
    for layer in p["layers"]:
        block = layer["name"].startswith("block")
        layer["forward_ms"] = {"1": 1.0 if block else 0.1}
        layer["backward_ms"] = {"1": 2.0 if block else 0.2}
    p["gpu_memory_bytes"] = memory
    path = os.path.join(tmp, "profile-%d-%d.json" % (memory, micro))
    with open(path, "w") as f:
        json.dump(p, f)
    return path


def one(pliant, job, workers, global_):
    """Median and fastest step ms (after the first two steps), the pipelines, the FRC sums
    (microbatches and ms in waits, exposed), and the holders' largest shadow costs a step
    (gradients received after the stage, AdamW after the commit)."""
    m = job + ".jsonl"
    p = subprocess.run([pliant, "run", job, "--workers", str(workers), "--threads", "1",
                        "--metrics", m], capture_output=True, text=True, timeout=900)
    if p.returncode:
        sys.exit("%s failed:\n%s" % (job, p.stderr[-2000:]))
    rows = [json.loads(l) for l in open(m) if l.strip()]
    rows = [r for r in rows if "event" not in r]
    tokens = global_ * 64
    ms = sorted(1e3 * tokens / r["tokens_per_second"] for r in rows[2:])
    frc = [0, 0.0, 0, 0.0]
    for g in FRC.finditer(p.stderr):
        frc[0] += int(g.group(2))
        frc[1] += float(g.group(3))
        frc[2] += int(g.group(4))
        frc[3] += float(g.group(5))
    shadow = [max([float(g.group(i)) for g in RC.finditer(p.stderr)] or [0.0]) for i in (1, 2)]
    return ms[len(ms) // 2], ms[0], rows[0]["pipelines"], frc, shadow


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def summary(seen, steps):
    """Over the rounds: the median of the runs' medians and the fastest step of all, each
    against templates' (on a loaded machine the fastest step is the least disturbed), and
    the median of the rounds' own overheads (each run against the templates run just
    before it: the load of the moment cancels out more)."""
    base_med = median([m for m, _, _ in seen["templates"]])
    base_min = min(f for _, f, _ in seen["templates"])
    for name, _ in RUNS:
        paired = median([100.0 * (m / b - 1) for (m, _, _), (b, _, _) in
                         zip(seen[name], seen["templates"])])
        med = median([m for m, _, _ in seen[name]])
        low = min(f for _, f, _ in seen[name])
        waits = sum(f[1] for _, _, f in seen[name])
        exposed = sum(f[3] for _, _, f in seen[name])
        hidden = " , FRC %.1f ms a step, %.0f%% of it in waits" % (
            (waits + exposed) / steps / len(seen[name]), 100.0 * waits / (waits + exposed)) \
            if waits + exposed else ""
        print("%-9s median %7.1f ms (%+5.1f%%), fastest %7.1f ms (%+5.1f%%), rounds' median "
              "%+5.1f%%%s" % (name, med, 100.0 * (med / base_med - 1), low,
                              100.0 * (low / base_min - 1), paired, hidden))


def predicted(pliant, profile, workers, global_):
    out = {}
    for mode in ("lazy", "eager"):
        p = subprocess.run([pliant, "plan", "--profile", profile, "--nodes", str(workers),
                            "--tolerate", "0", "--global-batch", str(global_), "--redundant", mode],
                           capture_output=True, text=True, check=True)
        out[mode] = json.loads(p.stdout)["redundant"]["templates"][-1]
    return out


def bench(pliant, tmp, data, config, a):
    """The rounds of one configuration, their summary and the planner's prediction."""
    workers, global_, micro, memory = CONFIGS[config]
    profile = make_profile(pliant, tmp, data, memory, micro)
    print("== %s: %d workers, %d microbatches of %d sequences a step" % (
        config, workers, global_ // micro, micro))
    print("%-9s %4s %9s %8s %8s %9s %12s %12s %8s %9s %9s" % (
        "run", "rep", "pipelines", "median", "fastest", "overhead", "frc_ms/step",
        "exposed/step", "hidden", "sh_recv", "sh_adamw"))
    seen = {name: [] for name, _ in RUNS}
    for rep in range(a.repeat):
        base = None
        for name, ft in RUNS:
            job = write_job(tmp, "%s-%s-%d" % (config, name, rep), data, a.steps, profile, ft,
                            global_, micro)
            ms, fastest, pipes, frc, shadow = one(pliant, job, workers, global_)
            base = ms if base is None else base
            total = frc[1] + frc[3]
            seen[name].append((ms, fastest, frc))
            print("%-9s %4d %9s %8.1f %8.1f %8.1f%% %12s %12s %8s %9.2f %9.2f" % (
                name, rep, pipes, ms, fastest, 100.0 * (ms / base - 1),
                "%.1f" % (total / a.steps) if total else "-",
                "%.1f" % (frc[3] / a.steps) if total else "-",
                "%.0f%%" % (100.0 * frc[1] / total) if total else "-", shadow[0], shadow[1]))
            sys.stdout.flush()
    summary(seen, a.steps)
    pred = predicted(pliant, profile, workers, global_)
    for mode in ("lazy", "eager"):
        t = pred[mode]
        print("planner (%s, at 4 microbatches a stage): iteration %.1f ms vs templates %.1f ms "
              "(+%.1f%%), FRC %.1f ms, exposed %.1f ms (hidden %.0f%%), shadow gradients %.1f ms"
              % (mode, t["iteration_ms"], t["templates_iteration_ms"],
                  100.0 * (t["iteration_ms"] / t["templates_iteration_ms"] - 1), t["frc_ms"],
                  t["exposed_frc_ms"],
                  100.0 * (1 - t["exposed_frc_ms"] / t["frc_ms"]) if t["frc_ms"] else 0,
                  t["shadow_sync_ms"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--config", choices=sorted(CONFIGS), action="append",
                    help="a configuration to run (repeatable; default: all)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    a = ap.parse_args()
    pliant = os.path.join(a.build, "bin", "pliant")
    tmp = tempfile.mkdtemp(prefix="pliant-rcoverhead-")
    data = shakespeare_shards(pliant, tmp, 200000)
    for config in a.config or sorted(CONFIGS, reverse=True):
        bench(pliant, tmp, data, config, a)


if __name__ == "__main__":
    main()
