#!/usr/bin/env python3
"""Recovery time of one loss under the three strategies (docs/redundant.md).

The same pipelined job (5 local workers; the planner makes pipelines 1x2 + 3x1
for every strategy) runs under `pliant run` with strategy redundant, templates
and checkpoint; stage 1 of pipeline 0 (the 2-stage one) is SIGKILLed when step
KILL begins (--chaos kill:p0.1@step=KILL).
From each run's reconfigure event: duration_ms (the kill to the new plan's first
committed step), bytes_copied, from_checkpoint and the step the new plan starts
at (a checkpoint restart redoes the steps since its checkpoint), beside the
median step time before the loss (step_ms). Standard
library only. Usage: bench/recovery_bench.py [--repeat N] [--build DIR]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from bench_data import shakespeare_shards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = """\
apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata:
  name: rb-{strategy}
spec:
  model: {{layers: 6, channels: 128, heads: 4, vocabSize: 256, maxSeqLen: 64, seed: 7}}
  data: {{train: {data}_train.bin, order: shuffled, seed: 3}}
  batch: {{global: 8, micro: 2, seqLen: 64}}
  optimizer: {{lr: 1.0e-3, warmupSteps: 2, schedule: cosine, gradClip: 1.0}}
  steps: {steps}
  profile: synthetic
  checkpoint: {{dir: {ckpt}, every: 4}}
  faultTolerance: {{strategy: {strategy}}}
"""


def one(pliant, tmp, data, strategy, steps, kill, rep):
    job = os.path.join(tmp, "%s-%d.yaml" % (strategy, rep))
    with open(job, "w") as f:
        f.write(JOB.format(strategy=strategy, data=data, steps=steps,
                           ckpt=os.path.join(tmp, "ck-%s-%d" % (strategy, rep))))
    m = job + ".jsonl"
    p = subprocess.run([pliant, "run", job, "--workers", "5", "--threads", "1", "--metrics", m,
                        "--chaos", "kill:p0.1@step=%d" % kill], capture_output=True, text=True,
                       timeout=600)
    if p.returncode:
        sys.exit("%s failed:\n%s" % (strategy, p.stderr[-2000:]))
    rows = [json.loads(l) for l in open(m) if l.strip()]
    rec = [r for r in rows if r.get("event") == "reconfigure"]
    steps = [r for r in rows if "event" not in r]
    before = sorted(512e3 / r["tokens_per_second"] for r in steps[1:kill])  # global 8 × 64
    return rec[0], steps[0]["pipelines"], before[len(before) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--kill", type=int, default=7)
    a = ap.parse_args()
    pliant = os.path.join(a.build, "bin", "pliant")
    tmp = tempfile.mkdtemp(prefix="pliant-recovery-")
    data = shakespeare_shards(pliant, tmp, 200000)
    print("%-10s %4s %9s %8s %12s %13s %10s %11s" % (
        "strategy", "run", "pipelines", "step_ms", "duration_ms", "bytes_copied", "restart_at",
        "checkpoint"))
    for rep in range(a.repeat):
        for strategy in ("redundant", "templates", "checkpoint"):
            r, pipes, step_ms = one(pliant, tmp, data, strategy, a.steps, a.kill, rep)
            print("%-10s %4d %9s %8.1f %12s %13d %10d %11s" % (
                strategy, rep, pipes, step_ms, r["duration_ms"], r["bytes_copied"], r["step"],
                r["from_checkpoint"]))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
