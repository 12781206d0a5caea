#!/usr/bin/env python3
"""Spot-trace replay benchmark: `make bench-trace`.

Replays the EC2 p3 and g4dn spot traces (../shared/traces/, 11.4 h and 10.6 h), each
time-compressed by SPEEDUP, against `pliant run --chaos trace:` with a pipelined model:
a planner profile measured by `pliant profile`, with its GPU memory lowered to 2 MB, so
that the model fits no single node and every template is a pipeline of >= 2 nodes (n0 = 2:
a removal costs the survivors layer copies). Each trace runs once per fault-tolerance
strategy: templates (re-instantiation and layer copies), redundant (Bamboo's redundant
computation: the planner's shadows need pipelines of 4 here) and checkpoint (every
membership change restarts every worker from the newest checkpoint); all go in one table
beside a failure-free templates run with the trace's time-weighted mean node count (on a
shared CPU box more workers add no compute, so this is the fair baseline):

- effective throughput: the steps of progress (highest committed step + 1) per second of
  the replay, relative to the failure-free run;
- time lost per preemption instant: (failure-free steps - progress) / failure-free rate /
  instants;
- bytes copied per recovery and the recovery time (failure noticed to the next committed
  step, the reconfigure lines' duration_ms) against the bound one failure-free step time
  + bytes copied at the measured loopback bandwidth + 300 ms.

Standard library only. Run from the repository root:
    python3 bench/trace_bench.py [--build build] [--traces p3,g4dn] [--speedup 1000]
                                 [--strategies templates,redundant,checkpoint]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")

JOB = """\
apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata:
  name: trace-{name}
spec:
  model: {{layers: 4, channels: 32, heads: 2, vocabSize: 256, maxSeqLen: 64, seed: 7}}
  data: {{train: {data}_train.bin, order: shuffled, seed: 3}}
  batch: {{global: 64, micro: 2, seqLen: 32}}
  optimizer: {{lr: 3.0e-3, warmupSteps: 10, schedule: cosine, gradClip: 1.0}}
  steps: 1000000
  profile: {profile}
  checkpoint: {{dir: {ckpt}, every: {every}, resume: never}}
  faultTolerance: {{strategy: {strategy}, tolerate: 1, maxResets: 1000000}}
  nodes: {{min: 1, max: {max_nodes}}}
"""
STRATEGIES = ("templates", "redundant", "checkpoint")
GPU_MEMORY = 2000000  # bytes: the model fits no single node, templates need pipelines of 2


def trace_rows(path):
    """[(t_ms, "add" | "remove")] of an event trace."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                t, kind, _ = line.split(",")
                rows.append((int(t), kind))
    return rows


def read_trace(path):
    """(initial nodes, peak, time-weighted mean nodes, duration ms, removal instants)."""
    rows = trace_rows(path)
    t0 = rows[0][0]
    initial = sum(1 for t, _ in rows if t == t0)
    live = peak = 0
    area, last = 0, t0
    for t, kind in rows:
        area += live * (t - last)
        last = t
        live += 1 if kind == "add" else -1
        peak = max(peak, live)
    duration = rows[-1][0] - t0
    removals = len({t for t, kind in rows if kind == "remove"})
    return initial, peak, area / duration, duration, removals


def loopback_gbps(build):
    """send/recv bandwidth of one loopback TCP stream with the default frame protection
    (integrity), from comm_bench."""
    out = subprocess.run([os.path.join(build, "bench", "comm_bench")], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600).stdout
    m = re.search(r"send/recv 1 stream\s.*?integrity\s+[\d.]+ ms\s+([\d.]+) GB/s", out)
    if not m:
        sys.exit("trace_bench: no loopback figure in comm_bench's output:\n" + out)
    return float(m.group(1))


def pliant_run(pliant, job, workers, seconds, metrics, chaos=None):
    args = [pliant, "run", job, "--workers", str(workers), "--threads", "1",
            "--duration", str(seconds), "--metrics", metrics]
    if chaos:
        args += ["--chaos", chaos]
    p = subprocess.run(args, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=seconds + 300)
    if p.returncode != 0:
        sys.exit("trace_bench: pliant run failed (%d):\n%s\n%s" %
                 (p.returncode, p.stdout[-3000:], p.stderr[-3000:]))
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in rows if "event" not in r]
    summary = [r for r in rows if r.get("event") == "summary"][-1]
    return {
        "progress": (max(r["step"] for r in steps) + 1) if steps else 0,
        "committed": len(steps),
        "seconds": summary["seconds"],
        "reconfigs": [r for r in rows if r.get("event") == "reconfigure"],
    }


def make_profile(pliant, tmp, data):
    """The model's layers measured by `pliant profile` on one thread, as the workers
    (--threads 1) compute them, the GPU memory lowered to GPU_MEMORY: the planner's profile
    (spec.profile) of every run."""
    job = write_job(tmp, "profile", data, "synthetic", "templates", 0, 2)
    out = os.path.join(tmp, "measured.json")
    subprocess.run([pliant, "profile", job, "--out", out, "--repeat", "5", "--threads", "1"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        p = json.load(f)
    p["gpu_memory_bytes"] = GPU_MEMORY
    path = os.path.join(tmp, "profile.json")
    with open(path, "w") as f:
        json.dump(p, f)
    return path


def write_job(tmp, name, data, profile, strategy, every, max_nodes):
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(JOB.format(name=name, data=data, profile=profile, strategy=strategy,
                           ckpt=os.path.join(tmp, name + ".ckpt"), every=every,
                           max_nodes=max_nodes))
    return path


def n0_of(pliant, profile, nodes, strategy):
    """The planner's smallest pipeline for the strategy (`pliant plan`)."""
    args = [pliant, "plan", "--profile", profile, "--nodes", str(nodes), "--tolerate", "1",
            "--global-batch", "64"] + (["--redundant", "lazy"] if strategy == "redundant" else [])
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return json.loads(p.stdout)["n0"] if p.returncode == 0 else None


def replay_trace(a, pliant, tmp, data, profile, trace):
    """The failure-free run and one replay per strategy of one trace: its table rows."""
    initial, peak, mean_nodes, duration_ms, removals = read_trace(trace)
    replay_s = max(1, round(duration_ms / a.speedup / 1000))
    name = os.path.basename(trace).split("-")[0]
    print("trace %s: %d nodes at start, peak %d, time-weighted mean %.1f, %.2f h, "
          "%d removal instants; speedup %g: replay %d s" %
          (os.path.basename(trace), initial, peak, mean_nodes, duration_ms / 3.6e6,
           removals, a.speedup, replay_s), flush=True)
    mean_workers = round(mean_nodes)
    ff_job = write_job(tmp, name + "-ff", data, profile, "templates", a.checkpoint_every, peak)
    ff = pliant_run(pliant, ff_job, mean_workers, a.baseline_seconds,
                    os.path.join(tmp, name + "-ff.jsonl"))
    chaos = "trace:%s:%g" % (trace, a.speedup)
    runs = {}
    for strategy in a.strategies.split(","):
        job = write_job(tmp, "%s-%s" % (name, strategy), data, profile, strategy,
                        a.checkpoint_every, peak)
        runs[strategy] = pliant_run(pliant, job, initial, replay_s,
                                    os.path.join(tmp, "%s-%s.jsonl" % (name, strategy)), chaos)
        print("  %s done" % strategy, flush=True)
    return {"name": name, "mean": mean_workers, "removals": removals, "ff": ff, "runs": runs}


def print_rows(t, gbps, pliant, profile):
    """One trace's rows of the table; the effective throughput ratio per strategy."""
    rate = t["ff"]["progress"] / t["ff"]["seconds"]
    step_ms = 1000.0 / rate
    print("%-5s | %-10s | %2s | %8.2f | %9s | %11s | %15s | %9s | %s" %
          (t["name"], "ff (%d)" % t["mean"], n0_of(pliant, profile, t["mean"], "templates"),
           rate, "100.0%", "-", "-", "-", "-"))
    ratios = {}
    for name, r in t["runs"].items():
        eff = r["progress"] / r["seconds"]
        lost = max(0.0, rate * r["seconds"] - r["progress"]) / rate
        rec = [x for x in r["reconfigs"] if x["removed"] and x["duration_ms"] is not None]
        copied = [x["bytes_copied"] for x in rec]
        durs = sorted(x["duration_ms"] for x in rec)
        bound = [step_ms + x["bytes_copied"] / (gbps * 1e6) + 300 for x in rec]
        ok = sum(x["duration_ms"] <= b for x, b in zip(rec, bound))
        ratios[name] = eff / rate
        print("%-5s | %-10s | %2s | %8.2f | %8.1f%% | %9.3f s | %15.0f | %9d | %s" %
              (t["name"], name, n0_of(pliant, profile, t["mean"], name), eff, 100 * eff / rate,
               lost / max(1, t["removals"]), statistics.mean(copied) if copied else 0,
               len(r["reconfigs"]),
               "%d / %d / %d (%d of %d)" % (durs[len(durs) // 2], durs[int(len(durs) * 0.9)],
                                            durs[-1], ok, len(durs)) if durs else "-"))
    return ratios


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--traces", default="p3,g4dn",
                    help="names under ../shared/traces/ (NAME-trace.csv) or paths")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--speedup", type=float, default=1000.0)
    ap.add_argument("--baseline-seconds", type=int, default=20)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    a = ap.parse_args()
    pliant = os.path.join(a.build, "bin", "pliant")
    text = os.path.join(SHARED, "data", "tinyshakespeare.txt")
    traces = [t if os.sep in t else os.path.join(SHARED, "traces", t + "-trace.csv")
              for t in a.traces.split(",")]
    for need in [pliant, text] + traces:
        if not os.path.exists(need):
            sys.exit("trace_bench: %s is missing" % need)
    gbps = loopback_gbps(a.build)
    print("loopback send/recv, integrity frames (comm_bench): %.2f GB/s" % gbps)
    with tempfile.TemporaryDirectory(prefix="pliant-trace-bench-") as tmp:
        data = os.path.join(tmp, "ts")
        sample = os.path.join(tmp, "ts.txt")
        with open(text, "rb") as src, open(sample, "wb") as dst:
            dst.write(src.read(1000000))
        subprocess.run([pliant, "tokenize", "--bytes", sample, data], check=True,
                       stdout=subprocess.DEVNULL)
        profile = make_profile(pliant, tmp, data)
        results = [replay_trace(a, pliant, tmp, data, profile, t) for t in traces]
        print()
        print("%-5s | %-10s | %2s | %8s | %9s | %11s | %15s | %9s | %s" %
              ("trace", "strategy", "n0", "steps/s", "vs ff", "lost/instant", "bytes/recovery",
               "reconfigs", "recovery ms: median / p90 / max (within bound)"))
        ratios = {t["name"]: print_rows(t, gbps, pliant, profile) for t in results}
    print()
    for name, r in ratios.items():
        best = max(r, key=r.get)
        print("%s: best %s keeps %.1f%% of failure-free throughput (target >= 80%%): %s" %
              (name, best, 100 * r[best], "PASS" if r[best] >= 0.8 else "FAIL"))


if __name__ == "__main__":
    main()
