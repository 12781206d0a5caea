#!/usr/bin/env python3
"""Command-line tests of `pliant run` and `pliant worker` (the
distributed runtime, failure-free path): N local worker processes under the
coordinator train the job with the same per-step losses and samples as
`pliant train`, with one pipeline per worker, a two-stage pipeline beside
single-node ones, two heterogeneous pipelines (3 + 2 stages) and two of 3 stages;
a killed worker of a data-parallel plan (recovery without layer copies),
killed pipeline workers whose recovery moves layers between workers, and
`--chaos` kill/add events with their reconfigure and summary metrics lines;
checkpoints written during training and the restart from them after a fatal
loss and with strategy checkpoint; too few workers, then workers back; two
simultaneous kills with F = 2; a worker with a wrong token and malformed or
oversized control messages refused without harm to the job; the validation loss
the workers compute (evalEvery) equal to train's with one and two pipelines;
spec.profile auto measured by a worker; a job resumed from the checkpoint its
workers report; spec.cost's dollars and samples per dollar in the summaries.

Run: python3 tests/cli/test_run_cli.py --build build [-k SUBSTRING]
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import REPO, SHAKESPEARE, Suite, WebSocket, check  # noqa: E402

suite = Suite("run_cli", needs=[SHAKESPEARE])
test = suite.test

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
{extra}"""


def run(*args, timeout=120):
    return suite.run(*args, timeout=timeout)


def data_prefix():
    """Byte shards of the first 100 kB of Tiny Shakespeare (made once)."""
    return suite.shakespeare_shards(100000)


def write_job(name, steps=8, global_=8, extra=""):
    """extra: more lines of spec (indented by two spaces)."""
    path = os.path.join(suite.tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(JOB.format(name=name, data=data_prefix(), steps=steps, global_=global_,
                           extra=extra))
    return path


def ckpt_dir(name):
    return os.path.join(suite.tmp, name + ".ckpt")


def reference_job(name, steps, global_=8):
    """The same job without checkpoints or fault-tolerance settings: train's reference."""
    return write_job(name + "-ref", steps=steps, global_=global_)


def metrics_all(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def metrics(path):
    """The per-step rows (lines without an "event")."""
    return [r for r in metrics_all(path) if "event" not in r]


def events(path, kind):
    return [r for r in metrics_all(path) if r.get("event") == kind]


_reference = {}


def reference(job):
    """`pliant train`'s metrics for a job (computed once per job)."""
    if job not in _reference:
        m = job + ".train.jsonl"
        rc, _, err = run("train", job, "--metrics", m, "--threads", 1)
        check(rc == 0, "train failed (%d): %s", rc, err)
        _reference[job] = metrics(m)
    return _reference[job]


def run_and_compare(job, workers, steps):
    m = "%s.run%d.jsonl" % (job, workers)
    rc, out, err = run("run", job, "--workers", workers, "--metrics", m, "--threads", 1)
    check(rc == 0, "run --workers %d failed (%d):\n%s\n%s", workers, rc, out[-2000:],
          err[-2000:])
    check(sum(l.startswith("step ") for l in out.splitlines()) == steps,
          "expected a line per step:\n%s", out[-1500:])
    rows = metrics(m)
    ref = reference(job)
    check(len(rows) == steps and len(ref) == steps, "%d run rows, %d train rows", len(rows),
          len(ref))
    for key in ("step", "loss", "tokens_per_second", "plan_generation", "pipelines", "workers",
                "samples_digest"):
        check(all(key in r for r in rows), "metrics lack %s", key)
    for a, b in zip(rows, ref):
        check(a["step"] == b["step"], "step %s vs %s", a["step"], b["step"])
        check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]),
              "step %d: loss %.9g, train %.9g", a["step"], a["loss"], b["loss"])
        check(a["samples_digest"] == b["samples_digest"], "step %d: samples %s, train %s",
              a["step"], a["samples_digest"], b["samples_digest"])
        check(a["workers"] == workers and a["plan_generation"] == 1,
              "step %d: %d workers, generation %d", a["step"], a["workers"],
              a["plan_generation"])
    return rows


def nodes_in(pipelines):
    """'1x2+3x1' -> total nodes 5."""
    total = 0
    for part in pipelines.split("+"):
        count, size = part.split("x")
        total += int(count) * int(size)
    return total


@test
def two_workers_match_train():
    rows = run_and_compare(write_job("two"), 2, 8)
    check(rows[0]["pipelines"] == "2x1", "pipelines %s", rows[0]["pipelines"])


@test
def three_workers_match_train():
    rows = run_and_compare(write_job("three"), 3, 8)
    check(nodes_in(rows[0]["pipelines"]) == 3, "pipelines %s", rows[0]["pipelines"])


@test
def five_workers_with_a_two_stage_pipeline_match_train():
    rows = run_and_compare(write_job("five"), 5, 8)
    p = rows[0]["pipelines"]
    check(nodes_in(p) == 5 and "+" in p, "pipelines %s", p)


@test
def heterogeneous_pipelines_match_train():
    """global 4 = 2 microbatches: 5 workers make 2 pipelines, of 3 and 2
    stages; 20 steps within 1e-4 of train's losses."""
    rows = run_and_compare(write_job("hetero20", steps=20, global_=4), 5, 20)
    check(rows[0]["pipelines"] == "1x3+1x2", "pipelines %s", rows[0]["pipelines"])


@test
def two_three_stage_pipelines_match_train():
    rows = run_and_compare(write_job("hetero", steps=6, global_=4), 6, 6)
    check(rows[0]["pipelines"] == "2x3", "pipelines %s", rows[0]["pipelines"])


@test
def redundant_matches_train_and_templates():
    """strategy redundant (docs/redundant.md): 5 workers make 1x3 + 1x2; every stage also
    holds its successor's layers, the last stage of each pipeline the first's (Bamboo's
    ring: the 3-stage one over the stage link's wrap), updated from the owners' reduced
    gradients. With lazy FRC and with eager FRC (each stage also runs its successor's
    forward every step, the last stage on the tokens: one `frc:` line per stage, every
    microbatch of every step) the losses equal the templates run's exactly (neither the
    shadows nor the FRC change a sum) and train's within 1e-6."""
    plain = run_and_compare(write_job("rc-plain", steps=6, global_=4), 5, 6)
    ref = reference(write_job("rc-ref", steps=6, global_=4))
    for mode in ("lazy", "eager"):
        job = write_job("rc-" + mode, steps=6, global_=4,
                        extra="  faultTolerance: {strategy: redundant, redundantForward: %s}\n"
                        % mode)
        m = job + ".run5.jsonl"
        rc, out, err = run("run", job, "--workers", 5, "--metrics", m, "--threads", 1)
        check(rc == 0, "%s run failed (%d):\n%s\n%s", mode, rc, out[-2000:], err[-2000:])
        rows = metrics(m)
        check(len(rows) == 6 and rows[0]["pipelines"] == "1x3+1x2", "rows %s", rows[:1])
        shadows = re.findall(r"shadow of stage (\d+)", err)
        check(sorted(shadows) == ["0", "0", "1", "1", "2"], "shadow lines %s:\n%s", shadows,
              err[-2000:])
        frc = re.findall(r"frc: (\d+) steps, (\d+) microbatches in waits .*, (\d+) exposed", err)
        if mode == "lazy":
            check(not frc, "lazy FRC ran: %s", frc)
        else:
            check(len(frc) == 5 and all(int(n) == 6 for n, _, _ in frc), "frc lines %s:\n%s",
                  frc, err[-2000:])
            # global 4 = 2 microbatches, one per pipeline: each holder's FRC runs once a step
            check(sum(int(a) + int(b) for _, a, b in frc) == 5 * 6, "frc lines %s", frc)
        for a, p, b in zip(rows, plain, ref):
            check(a["loss"] == p["loss"], "%s step %d: loss %.9g, templates %.9g", mode,
                  a["step"], a["loss"], p["loss"])
            check(abs(a["loss"] - b["loss"]) <= 1e-6 * abs(b["loss"]),
                  "%s step %d: loss %.9g, train %.9g", mode, a["step"], a["loss"], b["loss"])
            check(a["samples_digest"] == b["samples_digest"], "step %d: samples differ", a["step"])


def write_eval_job(name, steps, global_, every, extra=""):
    """A job with validation data (PREFIX_val.bin) evaluated every `every` steps."""
    path = write_job(name, steps=steps, global_=global_, extra="  evalEvery: %d\n%s" % (every, extra))
    with open(path) as f:
        text = f.read()
    text = text.replace("_train.bin,", "_train.bin, val: %s_val.bin," % data_prefix(), 1)
    with open(path, "w") as f:
        f.write(text)
    return path


def check_val_losses(job, workers, steps, every, pipelines):
    """The run's val_loss after steps every-1, 2·every-1, ... and the last equals train's
    within 1e-4 relative (none elsewhere); its step lines say it too."""
    m = "%s.run%d.jsonl" % (job, workers)
    rc, out, err = run("run", job, "--workers", workers, "--metrics", m, "--threads", 1)
    check(rc == 0, "run failed (%d):\n%s\n%s", rc, out[-2000:], err[-2000:])
    rows, ref = metrics(m), reference(job)
    check(len(rows) == steps and rows[0]["pipelines"] == pipelines, "rows %d, pipelines %s",
          len(rows), rows[0]["pipelines"] if rows else None)
    want = [s_ for s_ in range(steps) if (s_ + 1) % every == 0 or s_ == steps - 1]
    check([r["step"] for r in rows if "val_loss" in r] == want, "val_loss at %s, want %s",
          [r["step"] for r in rows if "val_loss" in r], want)
    check([r["step"] for r in ref if "val_loss" in r] == want, "train's val_loss at %s",
          [r["step"] for r in ref if "val_loss" in r])
    for a, b in zip(rows, ref):
        check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]), "step %d: loss %.9g, train %.9g",
              a["step"], a["loss"], b["loss"])
        if "val_loss" in b:
            check(abs(a["val_loss"] - b["val_loss"]) <= 1e-4 * abs(b["val_loss"]),
                  "step %d: val_loss %.9g, train %.9g", a["step"], a["val_loss"], b["val_loss"])
    lines = [l for l in out.splitlines() if l.startswith("step ") and "| val " in l]
    check(len(lines) == len(want), "step lines with a validation loss:\n%s", out[-1500:])


@test
def validation_loss_matches_train_with_one_pipeline():
    """evalEvery 2 over 5 steps, one pipeline of 3 stages (F = 0, one microbatch): the
    workers' validation loss after steps 1, 3 and 4 (the last) equals train's."""
    job = write_eval_job("eval1", steps=5, global_=2, every=2,
                         extra="  faultTolerance: {tolerate: 0}\n")
    check_val_losses(job, 3, 5, 2, "1x3")


@test
def validation_loss_matches_train_with_two_pipelines():
    """evalEvery 3 over 7 steps, pipelines of 3 and 2 stages sharing the validation
    batches: the loss summed by the coordinator equals train's after steps 2, 5 and 6."""
    job = write_eval_job("eval2", steps=7, global_=4, every=3)
    check_val_losses(job, 5, 7, 3, "1x3+1x2")


@test
def profile_auto_is_measured_by_a_worker():
    """spec.profile auto: the first worker to register measures the model on its device
    before the first plan ("profiling: ..." lines); the job then trains as train does."""
    job = write_job("profiled", steps=4)
    with open(job) as f:
        text = f.read()
    with open(job, "w") as f:
        f.write(text.replace("profile: synthetic", "profile: auto"))
    m = job + ".run.jsonl"
    rc, out, err = run("run", job, "--workers", 2, "--metrics", m, "--threads", 1)
    check(rc == 0, "run failed (%d):\n%s\n%s", rc, out[-2000:], err[-2000:])
    check(re.search(r"profiling: measuring the model on w[01]", out) and
          "profiling: done" in out and "measured the model on cpu" in err,
          "no profiling by a worker:\n%s\n%s", out[-1500:], err[-1500:])
    check(out.index("profiling: done") < out.index("step "), "a step before the profile")
    check_steps_match(metrics(m), reference(job), 4)


@test
def a_run_resumes_from_the_checkpoint_its_workers_report():
    """A job checkpointed at step 4, run again for 8 steps: the workers report the
    checkpoint of step 4, the run starts there and steps 4..7 equal train's resuming from a
    copy of the same checkpoint."""
    ck, ck2 = ckpt_dir("resumed"), ckpt_dir("resumed-train")
    job = write_job("resumed", steps=8, extra="  checkpoint: {dir: %s, every: 4}\n" % ck)
    rc, out, err = run("run", job, "--workers", 2, "--steps", 4, "--threads", 1)
    check(rc == 0 and "checkpoint: step 4 saved" in out, "first run (%d):\n%s\n%s", rc,
          out[-1500:], err[-1500:])
    shutil.rmtree(ck2, ignore_errors=True)
    shutil.copytree(ck, ck2)
    m = job + ".run.jsonl"
    rc, out, err = run("run", job, "--workers", 2, "--metrics", m, "--threads", 1)
    check(rc == 0 and "run: resuming from the checkpoint of step 4" in out,
          "second run (%d):\n%s\n%s", rc, out[-1500:], err[-1500:])
    rows = metrics(m)
    check([r["step"] for r in rows] == [4, 5, 6, 7], "steps %s", [r["step"] for r in rows])
    tjob = write_job("resumed-train", steps=8, extra="  checkpoint: {dir: %s, every: 4}\n" % ck2)
    ref = reference(tjob)
    check([r["step"] for r in ref] == [4, 5, 6, 7], "train's steps %s", [r["step"] for r in ref])
    for a, b in zip(rows, ref):
        check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]) and
              a["samples_digest"] == b["samples_digest"], "step %d: loss %.9g, train %.9g",
              a["step"], a["loss"], b["loss"])


def children(pid):
    """Process ids whose parent is pid (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return sorted(out)


def run_watching(args, on_line, timeout):
    """`pliant ARGS` with on_line(line, pid) called on each line of its stdout as it comes
    (to kill a worker at a step, look at the workers, ...): (status, stdout, stderr). The
    run is killed if the test fails meanwhile."""
    p = subprocess.Popen([suite.pliant] + [str(a) for a in args], cwd=REPO,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out = []
    try:
        for line in p.stdout:
            out.append(line)
            on_line(line, p.pid)
        err = p.stderr.read()
        p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, "".join(out), err


@test
def killed_data_parallel_worker_recovers_and_matches_train():
    """SIGKILL one of 3 single-node pipelines after step 10: the coordinator
    aborts the step, replans for the 2 survivors (same layers, no copies) and
    the run ends with every step committed once, losses equal to train's."""
    steps = 100
    job = write_job("killed", steps=steps)
    m = job + ".run.jsonl"
    killed = []

    def kill_at_step_10(line, pid):
        if not killed and line.startswith("step ") and int(line.split()[1].split("/")[0]) >= 10:
            kids = children(pid)
            check(len(kids) == 3, "run has %d children", len(kids))
            killed.append(kids[-1])
            os.kill(kids[-1], signal.SIGKILL)

    rc, text, err = run_watching(["run", job, "--workers", 3, "--metrics", m, "--threads", 1],
                                 kill_at_step_10, 120)
    check(killed, "no step 10 seen:\n%s", text[-1500:])
    check(rc == 0, "run failed (%d):\n%s\n%s", rc, text[-2000:], err[-2000:])
    check("reconfigure: generation 2" in text, "no reconfiguration:\n%s", text[-1500:])
    rows = metrics(m)
    ref = reference(job)
    check([r["step"] for r in rows] == list(range(steps)), "steps %s",
          [r["step"] for r in rows][:20])
    for a, b in zip(rows, ref):
        check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]),
              "step %d: loss %.9g, train %.9g", a["step"], a["loss"], b["loss"])
        check(a["samples_digest"] == b["samples_digest"], "step %d: samples differ", a["step"])
    check(rows[-1]["plan_generation"] == 2 and rows[-1]["workers"] == 2 and
          rows[-1]["pipelines"] == "2x1", "last step: %s", rows[-1])


@test
def killed_pipeline_workers_move_layers_and_match_train():
    """2 pipelines of 3 stages; SIGKILL a worker after step 3, another after
    step 8: each time the survivors re-form pipelines with other stage ranges
    (1x3 + 1x2, then 2x2), so workers receive layers (parameters and AdamW m, v;
    a new head-only stage also the tied wte) from the surviving holders; every
    step is committed once, with losses and samples equal to train's."""
    steps = 16
    job = write_job("moved", steps=steps, global_=4)
    m = job + ".run.jsonl"
    kids = []
    kills = [(3, 5), (8, 4)]  # (after step, child index)

    def kill_at_steps(line, pid):
        if kills and line.startswith("step ") and \
                int(line.split()[1].split("/")[0]) >= kills[0][0]:
            if not kids:
                kids.extend(children(pid))
                check(len(kids) == 6, "run has %d children", len(kids))
            os.kill(kids[kills.pop(0)[1]], signal.SIGKILL)

    rc, text, err = run_watching(["run", job, "--workers", 6, "--metrics", m, "--threads", 1],
                                 kill_at_steps, 180)
    check(not kills, "not every kill happened:\n%s", text[-1500:])
    check(rc == 0, "run failed (%d):\n%s\n%s", rc, text[-2000:],
          err[-3000:])
    check("reconfigure: generation 2" in text and "reconfigure: generation 3" in text,
          "no reconfiguration:\n%s", text[-1500:])
    received = [l for l in err.splitlines() if " received " in l and " received 0 " not in l]
    check(received, "no layer was copied:\n%s", err[-3000:])
    rows = metrics(m)
    ref = reference(job)
    check([r["step"] for r in rows] == list(range(steps)), "steps %s",
          [r["step"] for r in rows][:20])
    for a, b in zip(rows, ref):
        check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]),
              "step %d: loss %.9g, train %.9g", a["step"], a["loss"], b["loss"])
        check(a["samples_digest"] == b["samples_digest"], "step %d: samples differ", a["step"])
    check(rows[0]["pipelines"] == "2x3", "first step: %s", rows[0])
    check(rows[-1]["plan_generation"] == 3 and rows[-1]["workers"] == 4, "last step: %s",
          rows[-1])


@test
def chaos_kill_and_add_reconfigure_and_match_train():
    """--chaos kill:1@step=3,add:1@step=6 with 3 workers: w1 is SIGKILLed when step 3
    begins (survivors 2x1), w3 is started when step 6 begins and joins at a step
    boundary (3x1, receiving every layer). Two reconfigure lines with cause, removed,
    added, a duration and the bytes copied; a summary line; every step committed once
    with train's losses."""
    steps = 60
    job = write_job("chaos", steps=steps)
    m = job + ".run.jsonl"
    rc, out, err = run("run", job, "--workers", 3, "--metrics", m, "--threads", 1,
                       "--chaos", "kill:1@step=3,add:1@step=6")
    check(rc == 0, "run failed (%d):\n%s\n%s", rc, out[-2000:], err[-2000:])
    check("chaos: step 3: kill w1" in out and "chaos: step 6: started 1 worker" in out,
          "no chaos lines:\n%s", out[-1500:])
    rows = metrics(m)
    ref = reference(job)
    check([r["step"] for r in rows] == list(range(steps)), "steps %s",
          [r["step"] for r in rows][:40])
    for a, b in zip(rows, ref):
        check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]),
              "step %d: loss %.9g, train %.9g", a["step"], a["loss"], b["loss"])
        check(a["samples_digest"] == b["samples_digest"], "step %d: samples differ", a["step"])
    rec = events(m, "reconfigure")
    check(len(rec) == 2, "reconfigure lines: %s", rec)
    for key in ("cause", "removed", "added", "duration_ms", "bytes_copied", "from_checkpoint",
                "plan_generation", "pipelines"):
        check(all(key in r for r in rec), "reconfigure lines lack %s: %s", key, rec)
    lost, joined = rec
    check("w1" in lost["cause"] and lost["removed"] == ["w1"] and lost["added"] == [] and
          lost["plan_generation"] == 2 and lost["pipelines"] == "2x1", "first: %s", lost)
    check("joined w3" in joined["cause"] and joined["removed"] == [] and
          joined["added"] == ["w3"] and joined["plan_generation"] == 3 and
          joined["pipelines"] == "3x1" and joined["bytes_copied"] > 0, "second: %s", joined)
    for r in rec:
        check(r["from_checkpoint"] is False and isinstance(r["duration_ms"], int) and
              0 <= r["duration_ms"] < 20000, "reconfigure: %s", r)
    check(rows[3]["plan_generation"] == 2 and rows[-1]["plan_generation"] == 3 and
          rows[-1]["workers"] == 3, "generations: %s / %s", rows[3], rows[-1])
    summary = events(m, "summary")
    check(len(summary) == 1 and summary[0]["steps"] == steps and
          summary[0]["reconfigurations"] == 2 and
          abs(summary[0]["final_loss"] - ref[-1]["loss"]) <= 1e-4 * abs(ref[-1]["loss"]) and
          summary[0]["seconds"] > 0 and summary[0]["tokens_per_second"] > 0,
          "summary: %s", summary)
    check(any(l.startswith("summary: %d steps, 2 reconfigurations" % steps)
              for l in out.splitlines()), "no summary line:\n%s", out[-1000:])


@test
def sigterm_notice_moves_the_worker_out_at_a_step_boundary():
    """--chaos term:1@step=3: w1 gets SIGTERM (the preemption notice), tells the
    coordinator it is leaving, finishes the step, and is stopped with exit 0 before the
    next one; no step is aborted or lost and the losses equal train's."""
    steps = 12
    job = write_job("sigterm", steps=steps)
    m = job + ".run.jsonl"
    rc, out, err = run("run", job, "--workers", 3, "--metrics", m, "--threads", 1,
                       "--chaos", "term:1@step=3")
    check(rc == 0, "run failed (%d):\n%s\n%s", rc, out[-2000:], err[-2000:])
    rows = metrics(m)
    ref = reference(job)
    check([r["step"] for r in rows] == list(range(steps)), "steps %s", [r["step"] for r in rows])
    for a, b in zip(rows, ref):
        check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]),
              "step %d: loss %.9g, train %.9g", a["step"], a["loss"], b["loss"])
    rec = events(m, "reconfigure")
    check(len(rec) == 1 and rec[0]["removed"] == ["w1"] and "leav" in rec[0]["cause"],
          "reconfigure lines: %s", rec)
    check("killed by signal" not in out + err, "w1 was killed, not stopped:\n%s", out[-1500:])


def pipelined_notice_job(name, steps, global_):
    """A pipelined job for 8 workers: the GPU memory of a measured profile lowered, n0 = 2,
    F = 1. Returns the job, train's reference of the same steps and batch, and the
    template sizes of the plan for 8 workers."""
    job = write_job(name, steps=steps, global_=global_)
    prof_path = os.path.join(suite.tmp, name + "-profile.json")
    rc, _, err = run("profile", job, "--out", prof_path, "--repeat", "3", "--threads", 1,
                     "--gpu-memory", 1500000)  # n0 = 2
    check(rc == 0, "profile: %s", err)
    with open(job) as f:
        text = f.read().replace("profile: synthetic", "profile: " + prof_path)
    with open(job, "w") as f:
        f.write(text + "  faultTolerance: {tolerate: 1, maxResets: 0}\n")
    rc, out, err = run("plan", "--profile", prof_path, "--nodes", 8, "--tolerate", 1,
                       "--global-batch", global_)
    check(rc == 0 and json.loads(out)["n0"] == 2, "the profile's templates: %s %s",
          out[-500:], err[-500:])
    sizes = [p["template_nodes"] for e in json.loads(out)["coverage"] if e["nodes"] == 8
             for p in e["pipelines"]]
    return job, reference(reference_job(name, steps, global_=global_)), sizes


def check_notice_kept_sources(job, ref, steps, sizes, at, *args):
    """8 workers, --chaos term: the last stage of every pipeline (sizes: their nodes) when
    step `at` begins (a zone preempted with notice); args: more options. The layers no
    survivor holds come from the leaving workers before they go: one reconfiguration, no
    checkpoint read, every step once, the losses equal train's. Returns the output."""
    m = job + ".run.jsonl"
    chaos = ",".join("term:p%d.%d@step=%d" % (q, n - 1, at) for q, n in enumerate(sizes))
    rc, out, err = run("run", job, "--workers", 8, "--metrics", m, "--threads", 1,
                       "--chaos", chaos, *args, timeout=180)
    check(rc == 0, "run failed (%d):\n%s\n%s", rc, out[-2000:], err[-2000:])
    rows = metrics(m)
    check([r["step"] for r in rows] == list(range(steps)), "steps %s\n%s", [r["step"] for r in rows],
          out[-2000:])
    for a, b in zip(rows, ref):
        check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]),
              "step %d: loss %.9g, train %.9g", a["step"], a["loss"], b["loss"])
    rec = events(m, "reconfigure")
    check(len(rec) == 1 and len(rec[0]["removed"]) == len(sizes) and
          not rec[0]["from_checkpoint"] and rec[0]["bytes_copied"] > 0,
          "reconfigure lines: %s\n%s", rec, out[-3000:])
    return out + err


@test
def notice_keeps_leaving_workers_as_copy_sources():
    """4 pipelines of 2. Lost without notice the last stages' layers would be gone (a
    restart from a checkpoint); with it (no grace period: the workers live until stopped)
    the leaving workers are stopped, not killed, once they sent them."""
    steps = 10
    job, ref, sizes = pipelined_notice_job("notice-src", steps, 16)
    check(sizes == [2, 2, 2, 2], "the plan for 8 workers: %s", sizes)
    out = check_notice_kept_sources(job, ref, steps, sizes, 3)
    check("killed by signal" not in out, "a worker was killed, not stopped:\n%s", out[-1500:])


@test
def a_grace_shorter_than_a_step_still_keeps_the_sources():
    """--grace-seconds 0.25 (SIGKILL follows each notice after 0.25 s), steps of 4,096
    samples: where they take longer than the grace period (their median, known by step 4),
    the coordinator aborts the step at the notice rather than wait for its end and plans at
    once, and the leaving workers send their layers within their grace period."""
    steps, grace, global_ = 6, 0.25, 4096
    job, ref, sizes = pipelined_notice_job("notice-grace", steps, global_)
    out = check_notice_kept_sources(job, ref, steps, sizes, 4, "--grace-seconds", grace)
    rows = metrics(job + ".run.jsonl")
    step_s = sorted(global_ * 32 / r["tokens_per_second"] for r in rows[1:4])[1]
    check(step_s < 2 * grace or "step 4 aborted" in out, "steps of %.2f s, no abort:\n%s",
          step_s, out[-2000:])


@test
def spec_cost_gives_dollars_in_the_summary():
    """spec.cost: the summary line and the metrics' summary give node-hours (the workers'
    live time), dollars spot and on demand and samples per dollar."""
    steps = 6
    job = write_job("cost", steps=steps, extra="  cost: {spot: 2.0, onDemand: 5.0}\n")
    m = job + ".metrics.jsonl"
    rc, out, err = run("run", job, "--workers", 2, "--metrics", m, "--threads", 1)
    check(rc == 0, "run failed (%d): %s", rc, err[-1500:])
    s = events(m, "summary")[0]
    hours = s["node_hours"]
    check(0 < hours <= 2 * s["seconds"] / 3600 * 1.2, "node-hours %s", s)
    check(abs(s["usd"] - 2.0 * hours) < 1e-6 and abs(s["usd_on_demand"] - 5.0 * hours) < 1e-6,
          "dollars %s", s)
    check(abs(s["samples_per_usd"] - 8 * steps / s["usd"]) < 1e-3 * s["samples_per_usd"] and
          abs(s["samples_per_usd_on_demand"] - 8 * steps / s["usd_on_demand"]) <
          1e-3 * s["samples_per_usd_on_demand"], "samples per $ %s", s)
    line = [l for l in out.splitlines() if l.startswith("summary: ")]
    mm = line and re.search(r", ([\d.]+) node-hours, \$([\d.]+) spent, ([\d.]+) samples per \$ "
                            r"\(\$([\d.]+) on demand, ([\d.]+) samples per \$\)$", line[0])
    check(mm and abs(float(mm.group(2)) - s["usd"]) < 1e-4, "summary line %s", line)
    plain = write_job("nocost", steps=2)
    rc, out, err = run("run", plain, "--workers", 2, "--metrics", plain + ".m", "--threads", 1)
    check(rc == 0 and "spent" not in out and "usd" not in events(plain + ".m", "summary")[0],
          "no spec.cost, yet dollars (%d): %s %s", rc, out[-500:], err[-500:])


@test
def chaos_errors():
    job = write_job("usage", steps=2)
    rc, _, err = run("run", job, "--workers", 2, "--chaos", "kill:1@step=1,kill:x@step=3")
    check(rc == 2 and "event 2" in err and "kill:x@step=3" in err, "status %d: %s", rc, err)
    rc, _, err = run("run", job, "--workers", 2, "--chaos", "explode:1@step=1")
    check(rc == 2 and "explode:1@step=1" in err, "status %d: %s", rc, err)


@test
def usage_errors():
    job = write_job("usage", steps=2)
    rc, _, err = run("run", job)
    check(rc == 2 and "--workers" in err, "status %d: %s", rc, err)
    rc, _, err = run("run", job, "--workers", 0)
    check(rc == 2 and "--workers" in err, "status %d: %s", rc, err)
    rc, _, err = run("run", "/nonexistent.yaml", "--workers", 2)
    check(rc == 2 and "/nonexistent.yaml" in err, "status %d: %s", rc, err)
    rc, _, err = run("worker", job)
    check(rc == 2 and "PLIANT_COORDINATOR" in err, "status %d: %s", rc, err)
    rc, _, err = run("run", job, "--workers", 2, "--backend", "tpu")
    check(rc == 2 and "--backend" in err and "tpu" in err, "status %d: %s", rc, err)
    rc, _, err = run("worker", job, "--backend", "gpu")
    check(rc == 2 and "--backend" in err and "gpu" in err, "status %d: %s", rc, err)
    rc, _, err = run("run", job, "--workers", 2, "--grace-seconds", "-1")
    check(rc == 2 and "--grace-seconds" in err, "status %d: %s", rc, err)


def worker_env(job, *args, **env):
    """`pliant worker JOB ARGS` with a coordinator and name and the variables env (a bad
    PLIANT_PEER_PORT, checked after the certificate, ends it before any connection)."""
    e = {k: v for k, v in os.environ.items() if k not in ("PLIANT_CA", "PLIANT_INSECURE")}
    e.update(PLIANT_COORDINATOR="127.0.0.1:9", PLIANT_WORKER_NAME="w0", PLIANT_PEER_PORT="x")
    e.update(env)
    p = subprocess.run([suite.pliant, "worker", job] + list(args), cwd=REPO, env=e,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    return p.returncode, p.stderr


@test
def worker_requires_the_coordinator_certificate():
    """A worker without PLIANT_CA refuses to start, naming the variable, unless told
    --insecure or PLIANT_INSECURE=1, which it warns about; a bad PLIANT_COPY_RESERVE is
    named too."""
    job = write_job("worker-ca", steps=2)
    rc, err = worker_env(job)
    check(rc == 2 and "PLIANT_CA: not set" in err and "PLIANT_INSECURE=1" in err,
          "no PLIANT_CA: status %d: %s", rc, err)
    rc, err = worker_env(job, PLIANT_INSECURE="yes")
    check(rc == 2 and "PLIANT_INSECURE" in err, "PLIANT_INSECURE=yes: status %d: %s", rc, err)
    for args, env, how in (([], {"PLIANT_INSECURE": "1"}, "PLIANT_INSECURE=1"),
                           (["--insecure"], {}, "--insecure")):
        rc, err = worker_env(job, *args, **env)
        check(rc == 2 and "warning: %s: the coordinator's certificate is not checked" % how in err
              and "PLIANT_PEER_PORT" in err and "PLIANT_CA" not in err, "%s: status %d: %s", how, rc, err)
    rc, err = worker_env(job, PLIANT_CA="/some/ca.crt")
    check(rc == 2 and "warning" not in err and "PLIANT_PEER_PORT" in err, "with PLIANT_CA: %d: %s", rc, err)
    rc, err = worker_env(job, PLIANT_CA="/some/ca.crt", PLIANT_PEER_PORT="0", PLIANT_COPY_RESERVE="some")
    check(rc == 2 and 'PLIANT_COPY_RESERVE: "some" is not auto or off' in err, "PLIANT_COPY_RESERVE: %d: %s",
          rc, err)


@test
def devices_give_each_worker_its_own_gpu():
    """--devices 4,7 with 3 workers: worker i sees CUDA_VISIBLE_DEVICES = 4, 7, 4 (one GPU
    each, so NCCL could join them); the job is unaffected on CPU workers."""
    job = write_job("devices", steps=60)
    seen = []

    def look_at_workers(line, pid):
        if not seen and line.startswith("step "):
            for kid in children(pid):
                with open("/proc/%d/environ" % kid, "rb") as f:
                    env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
                seen.append((env.get(b"PLIANT_WORKER_NAME", b"").decode(),
                             env.get(b"CUDA_VISIBLE_DEVICES", b"").decode()))

    rc, _, err = run_watching(["run", job, "--workers", 3, "--threads", 1, "--devices", "4,7"],
                              look_at_workers, 120)
    check(rc == 0, "run failed (%d): %s", rc, err[-1500:])
    check(sorted(seen) == [("w0", "4"), ("w1", "7"), ("w2", "4")], "workers saw %s", seen)
    rc, _, err = run("run", job, "--workers", 2, "--devices", "0,x")
    check(rc == 2 and "--devices" in err, "status %d: %s", rc, err)


@test
def a_backend_the_build_lacks_fails_the_job_naming_it():
    """--backend cuda in the CPU build: every worker says why, the run fails (no hang)."""
    job = write_job("nocuda", steps=2)
    rc, out, err = run("run", job, "--workers", 2, "--threads", 1, "--backend", "cuda",
                       timeout=60)
    check(rc != 0 and "kernel backend cuda" in err and "make cuda" in err, "status %d: %s", rc,
          err[-1500:])


def run_env(*args, env=None, timeout=120):
    """pliant ARGS with extra environment: (status, stdout, stderr)."""
    p = subprocess.run([suite.pliant] + [str(a) for a in args], cwd=REPO,
                       env=dict(os.environ, **(env or {})), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def bad_shard(name, bad_at, bad_id=0xFFFF):
    """A copy of the training shard with token bad_at replaced by bad_id."""
    with open(data_prefix() + "_train.bin", "rb") as f:
        raw = bytearray(f.read())
    off = 1024 + 2 * bad_at
    raw[off:off + 2] = bad_id.to_bytes(2, "little")
    path = os.path.join(suite.tmp, name + ".bin")
    with open(path, "wb") as f:
        f.write(raw)
    return path, off


def checkpoint_steps(d):
    """Steps of the complete checkpoints (step-N holding checkpoint.json) under d."""
    if not os.path.isdir(d):
        return []
    return sorted(int(n[5:]) for n in os.listdir(d) if n.startswith("step-") and
                  os.path.exists(os.path.join(d, n, "checkpoint.json")))


@test
def a_token_beyond_the_vocabulary_is_refused_naming_the_file():
    """A training shard holding token 65535 (vocabulary 256): pliant run fails at once
    (status 1) naming the file, the token and its byte offset, as pliant train does;
    no worker runs a step, nothing is committed, no checkpoint is written."""
    shard, off = bad_shard("badtok_train", 4321)
    name = "badtok"
    path = os.path.join(suite.tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(JOB.format(name=name, data=data_prefix(), steps=6, global_=8, extra="")
                .replace(data_prefix() + "_train.bin", shard) +
                "  checkpoint: {dir: %s, every: 2}\n" % ckpt_dir(name))
    m = path + ".jsonl"
    rc, out, err = run("run", path, "--workers", 2, "--threads", 1, "--metrics", m, timeout=60)
    want = "%s: token 65535 at index 4321 (byte offset %d) is out of range for vocabulary " \
           "size 256" % (shard, off)
    check(rc == 1 and want in err, "status %d:\n%s\n%s", rc, out[-1500:], err[-1500:])
    check("step " not in out and (not os.path.exists(m) or not metrics(m)), "steps ran:\n%s",
          out)
    check(not os.path.exists(ckpt_dir(name)), "a checkpoint directory was written")
    rc, out, err = run("train", path, "--threads", 1, timeout=60)
    check(rc == 1 and want in err, "train: status %d: %s", rc, err[-800:])


@test
def bad_validation_data_fails_every_worker_the_same_way():
    """The validation shard holds a token beyond the vocabulary (the workers read it,
    pliant run does not): each worker refuses it at load and tells the coordinator
    (fatal), which fails the job at once as the job's failure, not a node's: status 1,
    the file, token and offset in the reason, no step committed, no checkpoint."""
    shard, off = bad_shard("badval_val", 77, 300)
    name = "badval"
    job = write_job(name, steps=6, extra="  evalEvery: 2\n  checkpoint: {dir: %s, every: 2}\n"
                    % ckpt_dir(name))
    with open(job) as f:
        text = f.read()
    with open(job, "w") as f:
        f.write(text.replace("order: shuffled", "val: %s, order: shuffled" % shard))
    m = job + ".jsonl"
    rc, out, err = run("run", job, "--workers", 2, "--threads", 1, "--metrics", m, timeout=60)
    check(rc == 1, "status %d:\n%s\n%s", rc, out[-1500:], err[-1500:])
    check("job failed: every worker failed the same way (2 workers): data: %s: token 300 at "
          "index 77 (byte offset %d)" % (shard, off) in err, "reason:\n%s", err[-2000:])
    check("not a node failure" in err and "killed by signal" not in err, "stderr:\n%s",
          err[-2000:])
    check(not metrics(m), "steps were committed: %s", metrics(m))
    check(not checkpoint_steps(ckpt_dir(name)), "a checkpoint was written")


@test
def a_bad_token_mid_run_is_never_committed():
    """PLIANT_FAULT_w0=badtoken:3 gives step 3 an id beyond the vocabulary, as bad data
    the loader could not see would: the encoder's bound check (no crash) makes the
    step's loss and norm NaN, the coordinator aborts it on every attempt and fails the
    job (status 1) after PL_COORD_STEP_ATTEMPTS, saying so; steps 0-2 are committed
    with train's losses, no NaN anywhere, no checkpoint after step 2."""
    name = "badmid"
    job = write_job(name, steps=8, extra="  checkpoint: {dir: %s, every: 2}\n" % ckpt_dir(name))
    m = job + ".jsonl"
    rc, out, err = run_env("run", job, "--workers", 2, "--threads", 1, "--metrics", m,
                           env={"PLIANT_FAULT_w0": "badtoken:3"}, timeout=120)
    check(rc == 1, "status %d:\n%s\n%s", rc, out[-1500:], err[-1500:])
    check("job failed: step 3 failed 3 times, every time the same way" in err and
          "non-finite" in err and "signal" not in err, "stderr:\n%s", err[-2000:])
    rows = metrics(m)
    check([r["step"] for r in rows] == [0, 1, 2], "committed: %s", [r["step"] for r in rows])
    check(not [l for l in out.splitlines() if l.startswith(("step ", "summary")) and
               "nan" in l], "a NaN was committed:\n%s", out)
    ref = reference(reference_job(name, 8))
    for a, b in zip(rows, ref):
        check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]), "step %d: loss %r, train %r",
              a["step"], a["loss"], b["loss"])
    check(checkpoint_steps(ckpt_dir(name)) == [2], "checkpoints %s",
          checkpoint_steps(ckpt_dir(name)))
    check(os.listdir(ckpt_dir(name)) == ["step-00000002"], "files %s", os.listdir(ckpt_dir(name)))


def failing_checkpoint_job(name, ckpt, steps=4):
    return write_job(name, steps=steps,
                     extra="  checkpoint: {dir: %s, every: 2, resume: never}\n" % ckpt)


@test
def an_unwritable_checkpoint_directory_fails_the_job():
    """spec.checkpoint.dir cannot be created (a path through a regular file; and, as a
    user root does not override, a read-only directory): every attempt's `saved` says
    why, the checkpoint is retried at the next commit and written again at the end, and
    the job fails (status 1) with the reason instead of waiting for it forever."""
    blocker = os.path.join(suite.tmp, "blocker")
    with open(blocker, "w") as f:
        f.write("a file, not a directory\n")
    cases = [(os.path.join(blocker, "ckpt"), blocker + ": exists and is not a directory")]
    if os.geteuid() != 0:
        ro = os.path.join(suite.tmp, "ro-ckpt")
        os.makedirs(ro, exist_ok=True)
        os.chmod(ro, 0o555)
        cases.append((ro, "Permission denied"))
    for i, (ckpt, why) in enumerate(cases):
        job = failing_checkpoint_job("unwritable%d" % i, ckpt)
        rc, out, err = run("run", job, "--workers", 2, "--threads", 1, timeout=90)
        check(rc == 1, "%s: status %d:\n%s\n%s", ckpt, rc, out[-1500:], err[-1500:])
        check("job failed: checkpoints cannot be written: 3 attempts in a row failed" in err and
              why in err, "%s: stderr:\n%s", ckpt, err[-2000:])
        check("run: done" not in out, "the run says it is done:\n%s", out)


@test
def a_checkpoint_step_that_is_a_file_fails_the_job():
    """step-00000004 exists as a regular file: the checkpoint of step 2 is written, the
    last one (4) cannot be; it is written again twice, then the job fails (status 1)
    naming the path, without hanging and without reporting success."""
    name = "stepfile"
    d = ckpt_dir(name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "step-00000004"), "w") as f:
        f.write("in the way\n")
    job = failing_checkpoint_job(name, d)
    rc, out, err = run("run", job, "--workers", 2, "--threads", 1, timeout=90)
    check(rc == 1, "status %d:\n%s\n%s", rc, out[-1500:], err[-1500:])
    check("step-00000004: exists and is not a directory" in err and
          "job failed: checkpoints cannot be written" in err, "stderr:\n%s", err[-2000:])
    check(err.count("pliant run: checkpoint of step 4:") == 3, "attempts:\n%s", err[-2000:])
    check(checkpoint_steps(d) == [2] and "checkpoint: step 2 saved" in out, "checkpoints %s",
          checkpoint_steps(d))
    check("run: done" not in out, "the run says it is done:\n%s", out)


@test
def checkpoint_keep_two_keeps_the_newest_two():
    """spec.checkpoint.keep 2, a checkpoint every step: the newest two complete
    checkpoints remain (the worker completing each deletes the older ones), under
    pliant run and pliant train alike, and the job resumes from the newest."""
    for cmd in ("run", "train"):
        name = "keep-" + cmd
        job = write_job(name, steps=5, extra="  checkpoint: {dir: %s, every: 1, keep: 2}\n"
                        % ckpt_dir(name))
        args = ["run", job, "--workers", 2] if cmd == "run" else ["train", job]
        rc, out, err = run(*args, "--threads", 1, timeout=120)
        check(rc == 0, "%s: status %d:\n%s\n%s", cmd, rc, out[-1500:], err[-1500:])
        check(out.count("checkpoint: step") == 5, "%s: checkpoints:\n%s", cmd, out)
        check(sorted(os.listdir(ckpt_dir(name))) == ["step-00000004", "step-00000005"],
              "%s: left %s", cmd, sorted(os.listdir(ckpt_dir(name))))
        check(checkpoint_steps(ckpt_dir(name)) == [4, 5], "%s: complete %s", cmd,
              checkpoint_steps(ckpt_dir(name)))


def run_chaos(job, workers, chaos, timeout=180, env=None):
    """pliant run with --chaos; env: extra environment (PLIANT_FAULT_<worker>)."""
    m = job + ".run.jsonl"
    p = subprocess.run([suite.pliant, "run", job, "--workers", str(workers), "--metrics", m,
                        "--threads", "1", "--chaos", chaos], cwd=REPO,
                       env=dict(os.environ, **(env or {})), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    rc, out, err = p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(
        errors="replace")
    check(rc == 0, "run failed (%d):\n%s\n%s", rc, out[-2500:], err[-2500:])
    return m, out, err


def check_steps_match(rows, ref, steps, once=True):
    """Every step committed (exactly once unless a checkpoint restart redid some) with
    train's loss and samples; with redone steps, the last record of each counts."""
    seen = [r["step"] for r in rows]
    if once:
        check(seen == list(range(steps)), "steps %s", seen[:40])
    last = {r["step"]: r for r in rows}
    check(sorted(last) == list(range(steps)), "steps %s", seen[:40])
    for s_, b in zip(range(steps), ref):
        a = last[s_]
        check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]),
              "step %d: loss %.9g, train %.9g", s_, a["loss"], b["loss"])
        check(a["samples_digest"] == b["samples_digest"], "step %d: samples differ", s_)


@test
def six_workers_one_kill_recovers_without_a_checkpoint():
    """6 workers (F = 1, 2x3), one SIGKILLed at step 5: one
    reconfigure line with the bytes copied and its duration, no checkpoint read, the
    receivers' pages from their reserves, every step committed once, final loss within 1%
    of the failure-free run (it is equal)."""
    steps = 14
    job = write_job("six", steps=steps, global_=4)
    m, out, err = run_chaos(job, 6, "kill:4@step=5")
    rec = events(m, "reconfigure")
    check(len(rec) == 1 and rec[0]["from_checkpoint"] is False and rec[0]["removed"] == ["w4"]
          and rec[0]["bytes_copied"] > 0 and rec[0]["duration_ms"] >= 0,
          "reconfigure lines: %s", rec)
    check(not events(m, "checkpoint") and "loaded from" not in err, "a checkpoint was used")
    # the receivers' pages came from the reserves the coordinator sized (copy_reserve.h)
    # and the new engines worked in present pages (pl_engine_share_work)
    made = re.findall(r"generation 2: engine made in [0-9.]+ ms \((\d+) bytes from the reserve\), "
                      r".* \((\d+) bytes of work memory were present\)", err)
    taken, kept = [int(x) for x, _ in made], [int(y) for _, y in made]
    check(taken and max(taken) > 0, "no receiver took pages from its reserve: %s", taken)
    check(kept and min(kept) > 0, "a new engine found none of its work memory present: %s", kept)
    rows = metrics(m)
    ref = reference(job)
    check_steps_match(rows, ref, steps)
    check(abs(rows[-1]["loss"] - ref[-1]["loss"]) <= 0.01 * abs(ref[-1]["loss"]),
          "final loss %.6f vs %.6f", rows[-1]["loss"], ref[-1]["loss"])


@test
def two_kills_and_an_add_keep_the_exact_sample_order():
    """6 workers, kills at steps 3 and 7, one worker added at step 10:
    the per-step sample digests (and losses) equal the failure-free run's, every step once."""
    steps = 40  # the added worker needs time to start: the run must outlast it
    job = write_job("exact", steps=steps, global_=4)
    m, out, err = run_chaos(job, 6, "kill:1@step=3,kill:4@step=7,add:1@step=10")
    rec = events(m, "reconfigure")
    check(len(rec) == 3 and [r["from_checkpoint"] for r in rec] == [False] * 3,
          "reconfigure lines: %s", rec)
    check_steps_match(metrics(m), reference(job), steps)


@test
def two_simultaneous_kills_with_tolerate_two():
    """F = 2: two workers of 6 SIGKILLed when the same step begins; recovered from
    the survivors' layers (no checkpoint), every step once with train's losses."""
    steps = 12
    job = write_job("f2", steps=steps, extra="  faultTolerance: {tolerate: 2}\n")
    m, out, err = run_chaos(job, 6, "kill:2@step=4,kill:3@step=4")
    rec = events(m, "reconfigure")
    check(rec and all(r["from_checkpoint"] is False for r in rec), "reconfigure: %s", rec)
    removed = sorted(set(n for r in rec for n in r["removed"]))  # relative to the stable plan
    check(removed == ["w2", "w3"], "removed %s", removed)
    check_steps_match(metrics(m), reference(reference_job("f2", steps)), steps)


@test
def fatal_loss_restarts_from_the_checkpoint():
    """Both workers (2x1, every layer on each) SIGKILLed once the checkpoint of step 4 is
    complete (written during training by pipeline 0, completed by checkpoint.json) and two
    new ones started: no live holder of any layer, so the job restarts from that checkpoint;
    steps committed after it are redone with the same samples and every loss equals
    train's."""
    steps = 12
    ck = ckpt_dir("fatal")
    job = write_job("fatal", steps=steps, extra="  checkpoint: {dir: %s, every: 4}\n" % ck)
    # both killed once the checkpoint of step 4 (written in the background) is complete
    m, out, err = run_chaos(job, 2, "kill:0@checkpoint=4,kill:1@checkpoint=4,add:2@checkpoint=4")
    # the two deaths usually make one plan; on a loaded machine the first may be noticed
    # (and replanned) alone: the last reconfiguration is the fatal one either way
    rec = events(m, "reconfigure")
    check(rec and rec[-1]["from_checkpoint"] is True and rec[-1]["step"] in (4, 8) and
          "fatal: no live holder of layer" in rec[-1]["cause"] and
          not any(r["from_checkpoint"] for r in rec[:-1]), "reconfigure: %s", rec)
    check([e["step"] for e in events(m, "checkpoint")] == [4, 8, 12], "checkpoints: %s",
          events(m, "checkpoint"))
    for step in (4, 8, 12):
        check(os.path.exists(os.path.join(ck, "step-%08d" % step, "checkpoint.json")),
              "no checkpoint.json for step %d", step)
    check("loaded from" in err, "no worker loaded the checkpoint:\n%s", err[-1500:])
    rows = metrics(m)
    check_steps_match(rows, reference(reference_job("fatal", steps)), steps, once=False)
    # the finished job's checkpoint is complete: a second run has nothing to do
    rc, out2, err2 = run("run", job, "--workers", 2)
    check(rc == 0 and "nothing to do" in out2, "rerun (%d): %s %s", rc, out2, err2)


@test
def strategy_checkpoint_restarts_every_worker_from_the_checkpoint():
    """strategy: checkpoint (the benchmark's baseline): a lost worker makes every
    worker reload the newest checkpoint (step 3) instead of copying layers."""
    steps = 10
    ck = ckpt_dir("strategy")
    job = write_job("strategy", steps=steps,
                    extra="  checkpoint: {dir: %s, every: 3}\n"
                          "  faultTolerance: {strategy: checkpoint}\n" % ck)
    # once the checkpoint of step 3 (written in the background) is complete
    m, out, err = run_chaos(job, 3, "kill:1@checkpoint=3")
    rec = events(m, "reconfigure")
    # the newest complete checkpoint when the loss is handled: 3, or a later one on a
    # loaded machine
    check(len(rec) == 1 and rec[0]["from_checkpoint"] is True and rec[0]["step"] in (3, 6, 9)
          and rec[0]["bytes_copied"] == 0, "reconfigure: %s", rec)
    check_steps_match(metrics(m), reference(reference_job("strategy", steps)), steps,
                      once=False)


RC_EXTRA = "  faultTolerance: {strategy: redundant, redundantForward: lazy}\n"


def rc_chaos(name, chaos, steps, workers=5, env=None):
    """A redundant job (5 workers: 1x3 w0-w2 + 1x2 w3-w4) under --chaos: its metrics rows,
    reconfigure events and stderr, after checking every step's loss and samples
    against pliant train's."""
    job = write_job(name, steps=steps, global_=4, extra=RC_EXTRA)
    m, out, err = run_chaos(job, workers, chaos, env=env)
    check_steps_match(metrics(m), reference(reference_job(name, steps, global_=4)), steps)
    return metrics(m), events(m, "reconfigure"), err


@test
def redundant_failover_takes_over_without_copies():
    """strategy redundant, 5 workers (1x3 + 1x2): stage 1 of the 3-stage pipeline SIGKILLed
    when step 3 begins; its predecessor holds its layers as its shadow and runs both
    ranges (Bamboo §5.2): no byte copied, no checkpoint, the pipelines 2x2, every step
    once with train's losses and samples. Then stage 1 of the 2-stage ring at step 6:
    stage 0 runs the whole model, 1x2+1x1."""
    rows, rec, err = rc_chaos("rc-failover", "kill:p0.1@step=3,kill:p1.1@step=6", 10)
    check(len(rec) == 2, "reconfigure lines: %s", rec)
    for r, pipes in zip(rec, ("2x2", "1x2+1x1")):
        check(len(r["removed"]) == 1 and r["bytes_copied"] == 0 and
              r["from_checkpoint"] is False and "failover" in r["cause"] and
              r["pipelines"] == pipes, "reconfigure: %s", r)
    check("loaded from" not in err, "a checkpoint was read")
    check(rows[-1]["pipelines"] == "1x2+1x1", "pipelines %s", rows[-1]["pipelines"])


@test
def redundant_pure_data_parallel_loses_a_replica_without_copies():
    """strategy redundant (eager) on one-stage pipelines, 3 workers (3x1): every worker's
    whole model is the replica of its peers' (Bamboo §4, "Support for Pure Data
    Parallelism"), so no shadow is held; SIGKILL of w1 at step 3 gives its microbatches to
    the two survivors (2x1, over-batching): no byte copied, no checkpoint, every step once
    with train's losses and samples."""
    job = write_job("rc-dp", steps=8, global_=6,
                    extra="  faultTolerance: {strategy: redundant, redundantForward: eager}\n")
    m, out, err = run_chaos(job, 3, "kill:1@step=3")
    rows = metrics(m)
    check_steps_match(rows, reference(reference_job("rc-dp", 8, global_=6)), 8)
    rec = events(m, "reconfigure")
    check(len(rec) == 1 and rec[0]["bytes_copied"] == 0 and rec[0]["from_checkpoint"] is False and
          rec[0]["pipelines"] == "2x1", "reconfigure: %s", rec)
    check(rows[0]["pipelines"] == "3x1", "pipelines %s", rows[0]["pipelines"])
    check("shadow of stage" not in err and "loaded from" not in err, "a shadow or a checkpoint: %s",
          err[-2000:])


def shadow_lines(err, gen):
    """{worker: (stage, begin, end, kept)} of the shadow lines of plan generation gen."""
    return {w: (int(s_), int(b), int(e), how == "kept")
            for w, s_, b, e, how in re.findall(r"worker (\S+): generation %d: shadow of stage "
                                               r"(\d+), layers \[(\d+), (\d+)\), (kept|refilled)"
                                               % gen, err)}


@test
def redundant_unaffected_pipeline_keeps_its_shadows():
    """Stage 1 of the 3-stage pipeline killed at step 3: its survivors fail over to a 2-stage
    ring whose ranges changed, so both refill their shadows; the 2-stage pipeline's ranges
    did not change, so its two stages keep theirs (0 bytes). Then stage 0 of that pipeline
    is killed at step 6: its holder runs the whole model from the kept shadow, and the
    3-stage pipeline's survivors, whose ranges stay, keep theirs. Every step once with
    train's losses and samples: the kept shadows were their owners' bytes."""
    rows, rec, err = rc_chaos("rc-keep", "kill:p0.1@step=3,kill:p1.0@step=6", 10)
    check(len(rec) == 2 and all(r["bytes_copied"] == 0 and "failover" in r["cause"]
                                for r in rec), "reconfigure lines: %s", rec)
    fo, fo2 = rec
    first = shadow_lines(err, fo["plan_generation"])
    kept = sorted(w for w, v in first.items() if v[3])
    refilled = sorted(w for w, v in first.items() if not v[3])
    check(len(kept) == 2 and len(refilled) == 2, "generation %d's shadows: %s",
          fo["plan_generation"], first)
    check(re.search(r"failover: (\S+) runs", fo["cause"]).group(1) in refilled,
          "the failover holder kept its shadow: %s %s", fo["cause"], first)
    check(re.search(r"(%s): generation %d: .*, kept at step 3, 0 bytes" %
                    ("|".join(kept), fo["plan_generation"]), err), "no kept line")
    check(fo2["removed"][0] in kept and
          re.search(r"failover: (\S+) runs", fo2["cause"]).group(1) in kept,
          "second failover %s: not from a kept shadow %s", fo2, kept)
    second = shadow_lines(err, fo2["plan_generation"])
    check(sorted(second) == refilled and all(v[3] for v in second.values()),
          "generation %d's shadows: %s", fo2["plan_generation"], second)
    check("loaded from" not in err, "a checkpoint was read")


@test
def redundant_shadows_kept_over_the_wrap_take_over():
    """Stage 1 of the 2-stage ring killed at step 3: its holder runs the whole model alone,
    and the 3-stage pipeline's three stages keep their shadows (the first stage's on the
    last, over the wrap). Then stage 0 of that pipeline is killed at step 6: the last stage
    and stage 1 take over from the kept shadows (Bamboo §5.2). Every step once with train's
    losses and samples."""
    rows, rec, err = rc_chaos("rc-wrap", "kill:p1.1@step=3,kill:p0.0@step=6", 10)
    check(len(rec) == 2 and all(r["bytes_copied"] == 0 and "failover" in r["cause"]
                                for r in rec), "reconfigure lines: %s", rec)
    first = shadow_lines(err, rec[0]["plan_generation"])
    check(len(first) == 3 and all(v[3] for v in first.values()) and
          sorted(v[0] for v in first.values()) == [0, 1, 2],
          "generation %d's shadows: %s", rec[0]["plan_generation"], first)
    takers = re.findall(r"failover: (\S+) runs", rec[1]["cause"])
    check(len(takers) == 2 and set(takers) <= set(first), "second failover %s, kept %s",
          rec[1], first)


@test
def redundant_first_stage_fails_over_over_the_ring():
    """Stage 0 of the 3-stage pipeline SIGKILLed when step 3 begins: its layers' shadow is
    on the last stage (Bamboo's ring, over the stage link's wrap), which becomes the first
    stage and runs them; stage 1 runs its own layers and the last stage's from its shadow
    (rc_plan.h: a worker runs one contiguous range). No byte copied, no checkpoint, the
    pipelines 2x2. Then a worker joins at step 4 and the template layout is back (1x3+1x2,
    copies, no checkpoint). Every step once with train's losses and samples."""
    rows, rec, err = rc_chaos("rc-first", "kill:p0.0@step=3,add:1@step=4", 40)
    check(len(rec) == 2, "reconfigure lines: %s", rec)
    r, join = rec
    check(join["added"] and join["from_checkpoint"] is False and
          join["pipelines"] == "1x3+1x2", "join: %s", join)
    check(len(r["removed"]) == 1 and r["bytes_copied"] == 0 and r["from_checkpoint"] is False
          and r["pipelines"] == "2x2", "reconfigure: %s", r)
    fo = [(w, int(b), int(e)) for w, b, e in
          re.findall(r"failover: (\S+) runs layers \[(\d+), (\d+)\) without a copy", r["cause"])]
    check(len(fo) == 2 and fo[0][1] == 0 and fo[1][1] == fo[0][2], "cause: %s", r["cause"])
    # the first held stage 0's layers as its shadow, the second the last stage's
    (first, _, b1), (merged, _, end) = fo
    shadow = r"worker %s: generation 1: shadow of stage %d, layers \[%s, %d\)"
    check(re.search(shadow % (first, 0, "0", b1), err) and
          re.search(shadow % (merged, 2, r"\d+", end), err),
          "shadow lines:\n%s", "\n".join(re.findall(r".*shadow of.*", err)))
    check("loaded from" not in err, "a checkpoint was read")


@test
def redundant_fails_over_from_a_fault_in_every_phase():
    """A stage of the 3-stage pipeline SIGKILLs itself at step 4 in the forward, the
    backward, between two all-reduces (plan rank 2, the last stage: stage 1 holds one
    layer, one all-reduce) and on the commit (others may have applied it: its shadow
    holder applies the shadow's AdamW after `committed`, before any new plan); plan rank 1
    but for the all-reduce. Then stage 0 (plan rank 0) in each phase: its shadow is on the
    last stage, over the ring's wrap. Each time the shadow's holder takes over, no byte
    copied, no checkpoint, every step once with train's losses and samples."""
    phases = (("forward", "the forward"), ("backward", "the backward"),
              ("sync", "the gradient all-reduce"), ("commit", "the commit"))
    for (phase, words), rank in [(p, 2 if p[0] == "sync" else 1) for p in phases] + \
                                [(p, 0) for p in phases]:
        rows, rec, err = rc_chaos("rc-%s-%d" % (phase, rank), "kill:0@step=99", 8,
                                  env={"PLIANT_FAULT": "%s:4:kill@%d" % (phase, rank)})
        check("SIGKILL during " + words in err, "%s: no fault:\n%s", phase, err[-1500:])
        check(len(rec) == 1 and rec[0]["bytes_copied"] == 0 and "failover" in rec[0]["cause"]
              and rec[0]["from_checkpoint"] is False, "%s: reconfigure %s", phase, rec)
        check(rank or re.search(r"failover: \S+ runs layers \[0, ", rec[0]["cause"]),
              "%s: stage 0's layers not taken over: %s", phase, rec[0]["cause"])


@test
def redundant_loss_during_a_shadow_refill_costs_that_worker_only():
    """Stage 1 of the 3-stage pipeline SIGKILLed in the first plan's shadow refill, right
    after it sent its weights to its holder, stage 0: the holder's refill fails on the
    stage link, and it gives the plan up and reports the peer instead of ending, so the
    coordinator replans for one loss, not two (from step 0: no step ran). Every step once
    with train's losses and samples."""
    rows, rec, err = rc_chaos("rc-refill", "kill:0@step=99", 8,
                              env={"PLIANT_FAULT": "shadow:1:kill@1"})
    check("SIGKILL during a shadow's refill" in err, "no fault:\n%s", err[-1500:])
    # before any step the new plan starts again from step 0
    check(len(rec) == 1 and len(re.findall(r"\blost w\d+", rec[0]["cause"])) == 1 and
          rec[0]["step"] == 0, "reconfigure: %s\n%s", rec, err[-2000:])
    check(re.search(r"plan generation 1 given up: shadow layers: stage link", err),
          "the holder did not give the plan up:\n%s", err[-2000:])


@test
def redundant_two_consecutive_losses_copy_from_survivors():
    """Stages 0 and 1 of the 3-stage pipeline SIGKILLed at once: stage 1's shadow holder,
    stage 0, is lost too, so no failover: the templates path copies layers from the
    survivors, no checkpoint, every step with train's losses."""
    rows, rec, err = rc_chaos("rc-two", "kill:p0.0@step=3,kill:p0.1@step=3", 8)
    check(rec and all(r["from_checkpoint"] is False for r in rec), "reconfigure: %s", rec)
    check(any(r["bytes_copied"] > 0 for r in rec), "no copy: %s", rec)
    check(not any("failover" in r["cause"] for r in rec), "a failover: %s", rec)


@test
def redundant_join_restores_redundancy_then_survives_a_second_loss():
    """Stage 1 of the 3-stage pipeline killed at step 3 (failover to stage 0), one worker
    added at step 4: it takes the lost one's place, receiving its layers from stage 0 (the
    shadow holder that ran them), and the shadows are set up again; stage 2 killed at
    step 30 (its holder is the new worker): a failover again, no copy. Every step once
    with train's losses and samples."""
    rows, rec, err = rc_chaos("rc-join", "kill:p0.1@step=3,add:1@step=4,kill:p0.2@step=30", 40)
    check(len(rec) == 3, "reconfigure lines: %s", rec)
    fo, join, fo2 = rec
    check(fo["bytes_copied"] == 0 and "failover" in fo["cause"], "first: %s", fo)
    check(join["added"] and join["bytes_copied"] > 0 and join["from_checkpoint"] is False and
          join["pipelines"] == "1x3+1x2", "join: %s", join)
    holder = re.search(r"failover: (\S+) runs", fo["cause"]).group(1)
    check(re.search(r"worker %s: generation %d: .* sent [1-9]" % (holder, join["plan_generation"]),
                    err), "the shadow holder %s sent nothing:\n%s", holder, err[-2000:])
    check(len(fo2["removed"]) == 1 and fo2["bytes_copied"] == 0 and "failover" in fo2["cause"]
          and fo2["from_checkpoint"] is False, "second loss: %s", fo2)


@test
def below_minimum_degrade_trains_on_then_restores_tolerance():
    """belowMinimum: degrade. 4 single-node pipelines (F = 1: at least 2 needed); 3 are
    killed at step 4: the survivor trains on alone with tolerance 0 (no wait, no
    checkpoint), a worker started at step 8 joins and the plan is back to tolerance 1 (2x1,
    the new worker receiving the survivor's layers); every step once, train's samples."""
    steps = 80  # room for the new worker to start and join while steps take milliseconds
    job = write_job("degrade", steps=steps,
                    extra="  faultTolerance: {belowMinimum: degrade, hostsAddedCheckEvery: 1}\n")
    m, out, err = run_chaos(job, 4, "kill:1@step=4,kill:2@step=4,kill:3@step=4,add:1@step=8")
    check("waiting:" not in out, "waited:\n%s", out[-2000:])
    check("degraded: tolerance 0 of 1" in out and "tolerance restored: 1" in out,
          "no degraded / restored lines:\n%s", out[-2500:])
    rec = events(m, "reconfigure")
    check(len(rec) == 2 and all(r["from_checkpoint"] is False for r in rec), "reconfigure: %s",
          rec)
    check(rec[0]["tolerance"] == 0 and rec[0]["pipelines"] == "1x1", "degraded: %s", rec[0])
    check(rec[1]["tolerance"] == 1 and rec[1]["added"] and rec[1]["pipelines"] == "2x1" and
          rec[1]["bytes_copied"] > 0, "restored: %s", rec[1])
    check_steps_match(metrics(m), reference(job), steps)


@test
def too_few_workers_wait_then_continue_with_the_returning_ones():
    """4 single-node pipelines (F = 1: at least 2 needed); 3 are killed at step 4; the
    job waits with one survivor, 2 new workers start (add@waiting), it re-instantiates with the
    new workers receiving the survivor's layers (no checkpoint), every step once."""
    steps = 12
    job = write_job("few", steps=steps)
    m, out, err = run_chaos(job, 4, "kill:1@step=4,kill:2@step=4,kill:3@step=4,add:2@waiting")
    check("waiting: 1 live workers, at least (F+1)*n0 = 2 needed" in out,
          "no waiting line:\n%s", out[-2000:])
    rec = events(m, "reconfigure")
    check(rec and all(r["from_checkpoint"] is False for r in rec), "reconfigure: %s", rec)
    check(rec[-1]["added"] and rec[-1]["bytes_copied"] > 0, "last reconfigure: %s", rec[-1])
    check_steps_match(metrics(m), reference(job), steps)


@test
def worker_killed_during_the_gradient_all_reduce():
    """w1 of 3 SIGKILLs itself between two layer all-reduces of step 4
    (PLIANT_FAULT_w1=sync:4): its peers' rings fail, the step is aborted and redone by
    the survivors, every step once with train's losses."""
    steps = 10
    job = write_job("sync", steps=steps)
    m, out, err = run_chaos(job, 3, "kill:0@step=99", env={"PLIANT_FAULT_w1": "sync:4"})
    check("SIGKILL during the gradient all-reduce" in err, "no fault:\n%s", err[-1500:])
    rec = events(m, "reconfigure")
    check(len(rec) == 1 and rec[0]["removed"] == ["w1"] and rec[0]["step"] == 4,
          "reconfigure: %s", rec)
    check_steps_match(metrics(m), reference(job), steps)


@test
def copy_source_killed_during_the_layer_copy():
    """w1 is killed at step 3; w3 joins at step 5 and receives every layer from the
    survivors w0 and w2, but w2 SIGKILLs itself after sending its first tensor
    (PLIANT_FAULT_w2=copy:3): the coordinator replans from the stable plan and w0
    sends everything; every step once with train's losses."""
    steps = 40
    job = write_job("copykill", steps=steps)
    m, out, err = run_chaos(job, 3, "kill:1@step=3,add:1@step=5",
                            env={"PLIANT_FAULT_w2": "copy:3"})
    check("SIGKILL during a layer copy" in err, "no fault:\n%s", err[-2000:])
    rec = events(m, "reconfigure")
    check(len(rec) == 3 and rec[2]["removed"] == ["w2"] and rec[2]["added"] == ["w3"],
          "reconfigure: %s", rec)
    check_steps_match(metrics(m), reference(job), steps)


@test
def intruders_are_refused_and_the_job_is_unaffected():
    """While a job trains, a worker with a wrong token (named like a real one) is refused
    and exits non-zero; connections sending malformed JSON, a message of another type
    than register, and a frame announcing more than 1 MiB are closed; the job still
    commits every step with train's losses."""
    steps = 300
    job = write_job("intruders", steps=steps)
    m = job + ".run.jsonl"
    p = subprocess.Popen([suite.pliant, "run", job, "--workers", "2", "--metrics", m,
                          "--threads", "1"], cwd=REPO, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    try:
        first = p.stdout.readline()
        out.append(first)
        hit = re.search(r"control on 127\.0\.0\.1:(\d+) \(CA (\S+)\), planner profile (\S+)",
                        first)
        check(hit, "no control address: %s", first)
        port, ca = int(hit.group(1)), hit.group(2)
        # a worker with the wrong token
        env = dict(os.environ, PLIANT_COORDINATOR="127.0.0.1:%d" % port, PLIANT_TOKEN="0" * 64,
                   PLIANT_CA=ca, PLIANT_WORKER_NAME="w1")
        w = subprocess.run([suite.pliant, "worker", job, "--threads", "1"], cwd=REPO, env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        werr = w.stderr.decode(errors="replace")
        check(w.returncode != 0 and "bad token proof" in werr, "wrong token (%d): %s",
              w.returncode, werr)
        # malformed JSON, a non-register first message, an oversized frame
        for payload, declared in ((b"{not json", None),
                                  (b'{"v":1,"type":"heartbeat","gen":0,"step":0}', None),
                                  (b"x" * 1024, 2 << 20)):
            ws = WebSocket(port, ca)
            f = ws.recv()
            check(f and json.loads(f[1])["type"] == "challenge", "no challenge: %r", f)
            ws.send(payload, declared)
            texts = ws.closed_after()  # returns only once the server closed it
            check(all(t["type"] == "refuse" for t in texts), "answers: %s", texts)
        for line in p.stdout:
            out.append(line)
        err = p.stderr.read()
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = "".join(out)
    check(p.returncode == 0, "run failed (%d):\n%s\n%s", p.returncode, text[-2000:], err[-2000:])
    check(not events(m, "reconfigure"), "the job reconfigured: %s", events(m, "reconfigure"))
    check_steps_match(metrics(m), reference(job), steps)


if __name__ == "__main__":
    sys.exit(suite.main())
