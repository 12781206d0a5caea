#!/usr/bin/env python3
"""Command-line tests of `pliant tokenize`, `train`, `sample`, `export` and
`profile` (the training engine), on a small model and a slice of
Tiny Shakespeare so that the whole file runs in well under a minute.

Run: python3 tests/cli/test_train_cli.py --build build [-k SUBSTRING]
"""

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import REPO, SHAKESPEARE, Suite, check  # noqa: E402

suite = Suite("train_cli", needs=[SHAKESPEARE])
test = suite.test

JOB = """\
apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
spec:
  model: {{layers: 2, channels: 32, heads: 2, vocabSize: 256, maxSeqLen: 64, seed: 7}}
  data: {{train: {data}_train.bin, val: {data}_val.bin, order: {order}, seed: 3}}
  batch: {{global: 8, micro: 4, seqLen: 32}}
  optimizer: {{lr: 3.0e-3, warmupSteps: 2, schedule: cosine}}
  steps: {steps}
  evalEvery: {eval_every}
  evalBatches: 2
  checkpoint: {{dir: {ckpt}, every: {every}}}
"""


def run(*args, timeout=300):
    return suite.run(*args, timeout=timeout)


def data_prefix():
    """Byte shards of the first 200 kB of Tiny Shakespeare (made once)."""
    return suite.shakespeare_shards(200000)


def write_job(name, steps=12, every=0, order="shuffled", eval_every=0):
    path = os.path.join(suite.tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(JOB.format(name=name, data=data_prefix(), ckpt=os.path.join(suite.tmp, name),
                           steps=steps, every=every, order=order, eval_every=eval_every))
    return path


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def shard(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        return header, f.read()


@test
def tokenize_bytes_splits_ninety_ten():
    prefix = data_prefix()
    (h_train, train), (h_val, val) = shard(prefix + "_train.bin"), shard(prefix + "_val.bin")
    check(h_train[0] == 20240520 and h_train[1] == 1, "bad header %s", h_train[:3])
    check(h_train[2] == 180000 and h_val[2] == 20000, "split %d/%d", h_train[2], h_val[2])
    with open(SHAKESPEARE, "rb") as f:
        text = f.read(200000)
    tokens = struct.unpack("<%dH" % h_train[2], train)
    check(bytes(tokens[:1000]) == text[:1000], "tokens are not the bytes")


@test
def tokenize_usage_errors():
    rc, _, err = run("tokenize", "--words", "a", "b")
    check(rc == 2 and "--bytes" in err, "status %d: %s", rc, err)
    rc, _, err = run("tokenize", "--bytes", "/nonexistent.txt", os.path.join(suite.tmp, "x"))
    check(rc == 1 and "/nonexistent.txt" in err, "status %d: %s", rc, err)


@test
def train_prints_steps_and_metrics_and_learns():
    job = write_job("learns", steps=30, eval_every=10)
    m = os.path.join(suite.tmp, "learns.jsonl")
    rc, out, err = run("train", job, "--metrics", m)
    check(rc == 0, "train failed (%d): %s", rc, err)
    check(sum(l.startswith("step ") for l in out.splitlines()) == 30,
          "expected a line per step:\n%s", out[-500:])
    rows = metrics(m)
    check(len(rows) == 30, "%d metric rows", len(rows))
    for key in ("step", "loss", "lr", "ms", "tokens_per_second"):
        check(all(key in r for r in rows), "metrics lack %s", key)
    check(sum("val_loss" in r for r in rows) == 3, "val_loss on steps 9, 19, 29")
    first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-5:]) / 5
    check(abs(first - 5.545) < 0.1, "initial loss %.3f is not ln(256)", first)
    check(last < first - 1.0, "loss did not fall: %.3f -> %.3f", first, last)
    check(rows[-1]["lr"] < rows[5]["lr"], "cosine schedule did not decay")


@test
def steps_flag_overrides_spec():
    job = write_job("override", steps=50)
    rc, out, err = run("train", job, "--steps", 3)
    steps = [l for l in out.splitlines() if l.startswith("step ")]
    check(rc == 0 and len(steps) == 3, "status %d\n%s%s", rc, out, err)


@test
def resume_after_kill_is_bit_identical():
    """Kill a run (SIGKILL) after its step-4 checkpoint; the rerun resumes and
    its steps 4..7 equal an uninterrupted run's, digit for digit."""
    whole = write_job("whole", steps=8, every=4)
    mw = os.path.join(suite.tmp, "whole.jsonl")
    rc, _, err = run("train", whole, "--metrics", mw, "--threads", 1)
    check(rc == 0, "uninterrupted run failed: %s", err)

    job = write_job("killed", steps=8, every=4)
    mk = os.path.join(suite.tmp, "killed.jsonl")
    p = subprocess.Popen([suite.pliant, "train", job, "--metrics", mk, "--threads", "1"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("checkpoint: step 4"):
            p.send_signal(signal.SIGKILL)
            break
    p.wait()
    check(p.returncode == -signal.SIGKILL, "the first run was not killed (%s)", p.returncode)
    rc, out, err = run("train", job, "--metrics", mk, "--threads", 1)
    check(rc == 0 and "resumed at step 4" in out, "resume failed (%d): %s%s", rc, out, err)
    a = {r["step"]: r for r in metrics(mw)}
    b = {r["step"]: r for r in metrics(mk)}
    check(sorted(b) == [4, 5, 6, 7], "resumed run ran steps %s", sorted(b))
    for s in range(4, 8):
        check(a[s]["loss"] == b[s]["loss"] and a[s]["samples_digest"] == b[s]["samples_digest"],
              "step %d: %s vs %s", s, a[s], b[s])


@test
def sequential_order_follows_llmc_loader():
    """Batch i of the sequential order is tokens [i·B·T, (i+1)·B·T + 1): the
    digests of two runs with different seeds agree, and differ from shuffled."""
    j1 = write_job("seq1", steps=2, order="sequential")
    rows = []
    for name, job in (("seq1", j1),):
        m = os.path.join(suite.tmp, name + ".jsonl")
        rc, _, err = run("train", job, "--metrics", m)
        check(rc == 0, "train failed: %s", err)
        rows = metrics(m)
    j2 = write_job("shuf", steps=2, order="shuffled")
    m2 = os.path.join(suite.tmp, "shuf.jsonl")
    rc, _, err = run("train", j2, "--metrics", m2)
    check(rc == 0, "train failed: %s", err)
    check(rows[0]["samples_digest"] != metrics(m2)[0]["samples_digest"],
          "sequential and shuffled orders drew the same samples")


@test
def bad_job_exits_2_naming_the_field():
    path = os.path.join(suite.tmp, "bad.yaml")
    with open(write_job("badbase")) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("micro: 4", "micro: 3"))
    rc, out, err = run("train", path)
    check(rc == 2 and "spec.batch.micro" in err, "status %d: %s", rc, err)
    with open(path, "w") as f:
        f.write(text.replace("steps: 12", "stepz: 12"))
    rc, out, err = run("train", path)
    check(rc == 2 and "stepz" in err, "status %d: %s", rc, err)
    rc, out, err = run("train")
    check(rc == 2, "no job: status %d", rc)


@test
def missing_data_is_a_clear_error():
    path = os.path.join(suite.tmp, "nodata.yaml")
    with open(write_job("nodata")) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("_train.bin", "_nothing*.bin"))
    rc, out, err = run("train", path)
    check(rc != 0 and "_nothing" in err, "status %d: %s", rc, err)


@test
def sample_and_export_from_a_checkpoint():
    job = write_job("ckpt", steps=4, every=2)
    rc, _, err = run("train", job)
    check(rc == 0, "train failed: %s", err)
    ckpt = os.path.join(suite.tmp, "ckpt")
    check(sorted(os.listdir(ckpt)) == ["step-00000002", "step-00000004"], "%s", os.listdir(ckpt))
    files = sorted(os.listdir(os.path.join(ckpt, "step-00000004")))
    check(files == ["checkpoint.json", "layers-0-4.safetensors"], "%s", files)
    rc, out, err = run("sample", ckpt, "--tokens", 40, "--prompt", "ROMEO:")
    check(rc == 0 and out.startswith("ROMEO:") and len(out) >= 40, "sample: %d %r %s", rc, out, err)
    llmc = os.path.join(suite.tmp, "model.bin")
    rc, out, err = run("export", ckpt, "--llmc", llmc)
    check(rc == 0, "export failed: %s", err)
    with open(llmc, "rb") as f:
        h = struct.unpack("<256i", f.read(1024))
    # L=2, C=32, maxT=64, Vp=256: wte+wpe+blocks+lnf
    C, L = 32, 2
    n = 256 * C + 64 * C + L * (12 * C * C + 13 * C) + 2 * C
    check(h[:8] == (20240326, 3, 64, 256, 2, 2, 32, 256), "header %s", h[:8])
    check(os.path.getsize(llmc) == 1024 + 4 * n, "size %d", os.path.getsize(llmc))
    # the exported file initialises a new job to the same parameters
    path = os.path.join(suite.tmp, "fromllmc.yaml")
    with open(write_job("fromllmc", steps=1)) as f:
        text = f.read().replace("seed: 7", "seed: 7, init: 'llmc:%s'" % llmc)
    with open(path, "w") as f:
        f.write(text)
    rc, out, err = run("train", path)
    check(rc == 0, "llmc init failed: %s", err)


@test
def checkpoint_files_modes_leftovers_and_checked_numbers():
    """Checkpoint files are 0640 and step directories 0750 under umask 022 (0600 / 0700 under
    077); temporary files a crashed writer left are removed when `pliant train` starts; a
    checkpoint.json whose step is 1e300 or whose layers is 2^32 + 2 is refused naming the field."""
    ckpt = os.path.join(suite.tmp, "modes")
    os.makedirs(os.path.join(ckpt, "step-00000001"))
    leftovers = [os.path.join(ckpt, "step-00000001", "layers-0-4.safetensors.tmp.a1b2c3"),
                 os.path.join(ckpt, "checkpoint.json.tmp.ZZZZZZ")]
    for path in leftovers:
        with open(path, "w") as f:
            f.write("half")
    for mask, fmode, dmode in ((0o022, 0o640, 0o750), (0o077, 0o600, 0o700)):
        shutil.rmtree(os.path.join(ckpt, "step-00000002"), ignore_errors=True)
        old = os.umask(mask)
        try:
            rc, _, err = run("train", write_job("modes", steps=2, every=2))
        finally:
            os.umask(old)
        check(rc == 0, "train failed: %s", err)
        left = [p for p in leftovers if os.path.exists(p)]
        check(not left, "temporary files not removed: %s", left)
        sdir = os.path.join(ckpt, "step-00000002")
        got = {name: os.stat(os.path.join(sdir, name)).st_mode & 0o777 for name in os.listdir(sdir)}
        check(got == {"checkpoint.json": fmode, "layers-0-4.safetensors": fmode},
              "umask %o: file modes %s", mask, {k: oct(v) for k, v in got.items()})
        check(os.stat(sdir).st_mode & 0o777 == dmode, "umask %o: directory mode %o", mask,
              os.stat(sdir).st_mode & 0o777)
    info = os.path.join(ckpt, "step-00000002", "checkpoint.json")
    with open(info) as f:
        good = f.read()
    for field, edit in (("step", lambda t: re.sub(r'"step": \d+', '"step": 1e300', t)),
                        ("model.layers", lambda t: t.replace('"layers": 2', '"layers": 4294967298'))):
        bad = edit(good)
        check(bad != good, "%s: checkpoint.json unchanged", field)
        with open(info, "w") as f:
            f.write(bad)
        rc, out, err = run("train", write_job("modes", steps=4, every=2))
        check(rc != 0 and "checkpoint.json: %s: must be an integer" % field in err,
              "%s out of range: status %d: %s%s", field, rc, out, err)
    with open(info, "w") as f:
        f.write(good)


@test
def profile_feeds_the_planner():
    job = write_job("prof")
    prof = os.path.join(suite.tmp, "profile.json")
    rc, _, err = run("profile", job, "--out", prof, "--repeat", 2)
    check(rc == 0, "profile failed: %s", err)
    with open(prof) as f:
        p = json.load(f)
    check(len(p["layers"]) == 4 and p["microbatch_size"] == 4, "%s", p)
    check(all(list(l["forward_ms"]) == ["1"] for l in p["layers"]), "GPU keys")
    rc, out, err = run("plan", "--profile", prof, "--nodes", 4, "--tolerate", 1,
                       "--global-batch", 8)
    check(rc == 0 and json.loads(out)["n0"] == 1, "plan on the profile: %s", err)
    # one compute thread, as `pliant run --threads 1` gives each worker
    rc, _, err = run("profile", job, "--out", prof, "--repeat", 1, "--threads", 1,
                     "--gpu-memory", 123456)
    check(rc == 0, "profile --threads 1 failed: %s", err)
    with open(prof) as f:
        check(json.load(f)["gpu_memory_bytes"] == 123456, "--gpu-memory not written")
    for flag in ("--gpu-memory", "--pipeline-workers"):
        rc, _, err = run("profile", job, flag, 0)
        check(rc == 2 and flag in err, "%s 0: status %d, %s", flag, rc, err)
    rc, _, err = run("profile", job, "--pipeline-workers", 2, "--pipeline-steps", 1)
    check(rc == 2 and "--pipeline-steps" in err, "--pipeline-steps 1: status %d, %s", rc, err)
    rc, _, err = run("profile", job, "--threads", 0)
    check(rc == 2 and "--threads" in err, "--threads 0: status %d, %s", rc, err)


if __name__ == "__main__":
    sys.exit(suite.main())
