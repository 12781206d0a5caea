#!/usr/bin/env python3
"""Command-line tests of `pliant run` and `pliant worker` (issue 4: the
distributed runtime, failure-free path): N local worker processes under the
coordinator train the job with the same per-step losses and samples as
`pliant train`, with one pipeline per worker, a two-stage pipeline beside
single-node ones, two heterogeneous pipelines (3 + 2 stages) and two of 3 stages;
a killed worker of a data-parallel plan (recovery without layer copies),
killed pipeline workers whose recovery moves layers between workers, and
`--chaos` kill/add events with their reconfigure and summary metrics lines.

Run: python3 tests/cli/test_run_cli.py --build build [-k SUBSTRING]
"""

import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import REPO, SHAKESPEARE, Suite, check  # noqa: E402

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
"""


def run(*args, timeout=120):
    return suite.run(*args, timeout=timeout)


def data_prefix():
    """Byte shards of the first 100 kB of Tiny Shakespeare (made once)."""
    return suite.shakespeare_shards(100000)


def write_job(name, steps=8, global_=8):
    path = os.path.join(suite.tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(JOB.format(name=name, data=data_prefix(), steps=steps, global_=global_))
    return path


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
    """global 4 = 2 microbatches: 5 workers make 2 pipelines, of 3 and 2 stages."""
    rows = run_and_compare(write_job("hetero", steps=6, global_=4), 5, 6)
    check(rows[0]["pipelines"] == "1x3+1x2", "pipelines %s", rows[0]["pipelines"])


@test
def two_three_stage_pipelines_match_train():
    rows = run_and_compare(write_job("hetero", steps=6, global_=4), 6, 6)
    check(rows[0]["pipelines"] == "2x3", "pipelines %s", rows[0]["pipelines"])


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


@test
def killed_data_parallel_worker_recovers_and_matches_train():
    """SIGKILL one of 3 single-node pipelines after step 10: the coordinator
    aborts the step, replans for the 2 survivors (same layers, no copies) and
    the run ends with every step committed once, losses equal to train's."""
    steps = 100
    job = write_job("killed", steps=steps)
    m = job + ".run.jsonl"
    p = subprocess.Popen([suite.pliant, "run", job, "--workers", "3", "--metrics", m,
                          "--threads", "1"], cwd=REPO, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    out = []
    try:
        for line in p.stdout:
            out.append(line)
            if killed is None and line.startswith("step ") and \
                    int(line.split()[1].split("/")[0]) >= 10:
                kids = children(p.pid)
                check(len(kids) == 3, "run has %d children", len(kids))
                killed = kids[-1]
                os.kill(killed, signal.SIGKILL)
        err = p.stderr.read()
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = "".join(out)
    check(killed is not None, "no step 10 seen:\n%s", text[-1500:])
    check(p.returncode == 0, "run failed (%d):\n%s\n%s", p.returncode, text[-2000:], err[-2000:])
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
    p = subprocess.Popen([suite.pliant, "run", job, "--workers", "6", "--metrics", m,
                          "--threads", "1"], cwd=REPO, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kids = None
    kills = [(3, 5), (8, 4)]  # (after step, child index)
    out = []
    try:
        for line in p.stdout:
            out.append(line)
            if kills and line.startswith("step ") and \
                    int(line.split()[1].split("/")[0]) >= kills[0][0]:
                if kids is None:
                    kids = children(p.pid)
                    check(len(kids) == 6, "run has %d children", len(kids))
                os.kill(kids[kills.pop(0)[1]], signal.SIGKILL)
        err = p.stderr.read()
        p.wait(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = "".join(out)
    check(not kills, "not every kill happened:\n%s", text[-1500:])
    check(p.returncode == 0, "run failed (%d):\n%s\n%s", p.returncode, text[-2000:],
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


if __name__ == "__main__":
    sys.exit(suite.main())
