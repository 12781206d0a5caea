#!/usr/bin/env python3
"""Command-line tests of `pliant run` on a GPU ("make test-gpu"): worker
processes sharing one GPU train with the CUDA kernels and the TCP transport,
which stages tensors through page-locked host memory (NCCL cannot put two ranks
on one device). They use build/bin/pliant-cuda (`make cuda`) and skip, saying
why, where it is not built or sees no CUDA device.

  - a 2-stage pipeline of two workers equals `pliant train --backend cuda`;
  - 4 workers (2 pipelines of 2 stages), one SIGKILLed by --chaos at step 3: the
    survivors re-form and receive layers (parameters, AdamW m and v) from the
    surviving holders through host staging; every step is committed once with
    train's samples, and the losses stay within the GPU's tolerance of train's;
  - strategy redundant (eager FRC) on 4 workers (2 pipelines of 2 stages, each stage holding
    the other's layers), one SIGKILLed at step 3: its shadow holder runs the whole model
    without a copy, the FRC's state swapped to page-locked host memory;
  - on a machine with 2 or more GPUs, one per worker (--devices): the same on NCCL.

Run: python3 tests/cli/test_run_gpu.py --build build [-k SUBSTRING]
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import REPO, SHAKESPEARE, Skip, Suite, check  # noqa: E402

suite = Suite("run_gpu", needs=[SHAKESPEARE])
test = suite.test

# bf16 matmuls: the pipeline sums the tied embedding's two gradients in another
# order than one process, so losses agree to bf16 rounding, not bit for bit.
LOSS_TOL = 2e-2

JOB = """\
apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
spec:
  model: {{layers: 4, channels: 64, heads: 2, vocabSize: 256, maxSeqLen: 64, seed: 7}}
  data: {{train: {data}_train.bin, order: shuffled, seed: 3}}
  batch: {{global: {global_}, micro: 2, seqLen: 64}}
  optimizer: {{lr: 3.0e-3, warmupSteps: 2, schedule: cosine, gradClip: 1.0}}
  steps: {steps}
  profile: synthetic
  faultTolerance: {{tolerate: {tolerate}{extra}}}
"""

_gpu = {}


def pliant_cuda():
    """The pliant-cuda binary, or Skip with the reason it cannot run here."""
    if "exe" not in _gpu:
        exe = os.path.join(os.path.dirname(suite.pliant), "pliant-cuda")
        _gpu["exe"], _gpu["why"] = exe, None
        if not os.access(exe, os.X_OK):
            _gpu["why"] = "build/bin/pliant-cuda not built (make cuda)"
        else:
            job = write_job("probe", steps=1, global_=2)
            p = subprocess.run([exe, "train", job, "--backend", "cuda"], cwd=REPO,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=300)
            if p.returncode != 0:
                lines = [l for l in p.stderr.splitlines() if l.strip()]
                _gpu["why"] = lines[-1] if lines else "pliant-cuda train failed (%d)" % p.returncode
    if _gpu["why"]:
        raise Skip(_gpu["why"])
    return _gpu["exe"]


def write_job(name, steps, global_, tolerate=1, extra=""):
    """tolerate 0: one pipeline may hold every worker (F + 1 pipelines are planned); extra:
    more faultTolerance fields (", strategy: redundant")."""
    path = os.path.join(suite.tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(JOB.format(name=name, data=suite.shakespeare_shards(100000), steps=steps,
                           global_=global_, tolerate=tolerate, extra=extra))
    return path


def rows_of(path):
    with open(path) as f:
        return [r for r in (json.loads(l) for l in f if l.strip()) if "event" not in r]


def events_of(path, kind):
    with open(path) as f:
        return [r for r in (json.loads(l) for l in f if l.strip()) if r.get("event") == kind]


def gpu_run(exe, job, workers, chaos=None):
    m = job + ".run.jsonl"
    args = [exe, "run", job, "--workers", str(workers), "--backend", "cuda", "--metrics", m]
    if chaos:
        args += ["--chaos", chaos]
    p = subprocess.run(args, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=600)
    check(p.returncode == 0, "run failed (%d):\n%s\n%s", p.returncode, p.stdout[-2000:],
          p.stderr[-3000:])
    return m, p.stdout, p.stderr


def gpu_train(exe, job):
    m = job + ".train.jsonl"
    p = subprocess.run([exe, "train", job, "--backend", "cuda", "--metrics", m], cwd=REPO,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    check(p.returncode == 0, "train failed (%d): %s", p.returncode, p.stderr[-2000:])
    return rows_of(m)


def check_losses(rows, ref, steps):
    check([r["step"] for r in rows] == list(range(steps)), "steps %s",
          [r["step"] for r in rows][:40])
    for a, b in zip(rows, ref):
        check(abs(a["loss"] - b["loss"]) <= LOSS_TOL * abs(b["loss"]),
              "step %d: loss %.6f, train %.6f", a["step"], a["loss"], b["loss"])
        check(a["samples_digest"] == b["samples_digest"], "step %d: samples differ", a["step"])


@test
def two_stage_pipeline_on_one_gpu_matches_train():
    exe = pliant_cuda()
    steps = 10
    job = write_job("pipe", steps=steps, global_=2, tolerate=0)
    m, out, err = gpu_run(exe, job, 2)
    rows = rows_of(m)
    check(rows and rows[0]["pipelines"] == "1x2", "pipelines %s", rows[:1])
    check_losses(rows, gpu_train(exe, job), steps)


@test
def killed_gpu_worker_recovers_through_host_staging():
    exe = pliant_cuda()
    steps = 12
    job = write_job("gpukill", steps=steps, global_=4)
    m, out, err = gpu_run(exe, job, 4, chaos="kill:3@step=3")
    rec = events_of(m, "reconfigure")
    check(len(rec) == 1 and rec[0]["removed"] == ["w3"] and rec[0]["from_checkpoint"] is False
          and rec[0]["bytes_copied"] > 0, "reconfigure lines: %s", rec)
    rows = rows_of(m)
    check(rows[0]["pipelines"] == "2x2", "first step: %s", rows[0])
    check_losses(rows, gpu_train(exe, job), steps)


@test
def redundant_gpu_worker_fails_over_to_its_shadow():
    exe = pliant_cuda()
    steps = 12
    job = write_job("gpurc", steps=steps, global_=4,
                    extra=", strategy: redundant, redundantForward: eager")
    m, out, err = gpu_run(exe, job, 4, chaos="kill:3@step=3")
    rec = events_of(m, "reconfigure")
    check(len(rec) == 1 and rec[0]["removed"] == ["w3"] and rec[0]["bytes_copied"] == 0 and
          rec[0]["from_checkpoint"] is False and "failover" in rec[0]["cause"],
          "reconfigure lines: %s", rec)
    check("shadow of stage" in err and "microbatches in waits" in err,
          "no shadow or FRC lines:\n%s", err[-3000:])
    rows = rows_of(m)
    check(rows[0]["pipelines"] == "2x2", "first step: %s", rows[0])
    check_losses(rows, gpu_train(exe, job), steps)


def gpu_count():
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(l.startswith("GPU ") for l in p.stdout.splitlines()) if p.returncode == 0 else 0


@test
def a_gpu_per_worker_runs_on_nccl_and_survives_a_kill():
    """With 4 GPUs (--devices: one per worker) the plan's transport is NCCL: workers join
    its world, steps run on it; a SIGKILLed worker's survivors make a new world and receive
    its layers GPU to GPU; losses stay within the GPU tolerance of train's. With 2 or 3 GPUs,
    one pipeline of 2 stages without a kill."""
    exe = pliant_cuda()
    n = min(gpu_count(), 4)
    if n < 2:
        raise Skip("needs 2 or more GPUs (NCCL puts one rank on each), found %d" % n)
    steps = 12
    job = write_job("nccl", steps=steps, global_=4 if n == 4 else 2)
    devices = ",".join(str(i) for i in range(n if n == 4 else 2))
    m = job + ".run.jsonl"
    args = [exe, "run", job, "--workers", str(len(devices.split(","))), "--backend", "cuda",
            "--devices", devices, "--metrics", m]
    if n == 4:
        args += ["--chaos", "kill:3@step=3"]
    p = subprocess.run(args, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=600)
    check(p.returncode == 0, "run failed (%d):\n%s\n%s", p.returncode, p.stdout[-2000:],
          p.stderr[-3000:])
    check("joined the NCCL world" in p.stderr, "no worker joined an NCCL world:\n%s",
          p.stderr[-3000:])
    check_losses(rows_of(m), gpu_train(exe, job), steps)
    if n == 4:
        rec = events_of(m, "reconfigure")
        check(len(rec) == 1 and rec[0]["bytes_copied"] > 0 and not rec[0]["from_checkpoint"],
              "reconfigure lines: %s", rec)


if __name__ == "__main__":
    sys.exit(suite.main())
