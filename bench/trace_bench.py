#!/usr/bin/env python3
"""Spot-trace replay benchmark: `make bench-trace`.

Replays a preemption trace (default ../shared/traces/p3-trace.csv, 11.4 h) time-compressed
by SPEEDUP against `pliant run` on a small model, once with faultTolerance.strategy
templates (re-instantiation and layer copies) and once with checkpoint (every membership
change restarts every worker from the newest checkpoint), and compares both with
failure-free runs on the same machine in the same session:

- effective throughput: the steps of progress (highest committed step + 1) per second of
  the replay, relative to a failure-free run with the trace's time-weighted mean node
  count (on a shared CPU box more workers add no compute, so this is the fair baseline;
  the ratio to a failure-free run with the trace's initial node count is printed too);
- time lost per failure: (failure-free steps - progress) / failure-free rate / removals;
- bytes copied per recovery and the recovery time (failure noticed to the next committed
  step, the reconfigure lines' duration_ms) against the bound one failure-free step time
  + bytes copied at the measured loopback bandwidth + 300 ms.

Standard library only. Run from the repository root:
    python3 bench/trace_bench.py [--build build] [--trace FILE] [--speedup 500]
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
  name: trace-{strategy}
spec:
  model: {{layers: 3, channels: 32, heads: 2, vocabSize: 256, maxSeqLen: 64, seed: 7}}
  data: {{train: {data}_train.bin, order: shuffled, seed: 3}}
  batch: {{global: 64, micro: 2, seqLen: 32}}
  optimizer: {{lr: 3.0e-3, warmupSteps: 10, schedule: cosine, gradClip: 1.0}}
  steps: 1000000
  checkpoint: {{dir: {ckpt}, every: {every}, resume: never}}
  faultTolerance: {{strategy: {strategy}, tolerate: 1, maxResets: 1000000}}
  nodes: {{min: 2, max: {max_nodes}}}
"""


def read_trace(path):
    """(initial nodes, peak, time-weighted mean nodes, duration ms, removal instants)."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                t, kind, _ = line.split(",")
                rows.append((int(t), kind))
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
    """send/recv bandwidth of one loopback TCP stream, from comm_bench."""
    out = subprocess.run([os.path.join(build, "bench", "comm_bench")], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600).stdout
    m = re.search(r"send/recv 1 stream\s+[\d.]+ ms\s+([\d.]+) GB/s", out)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--trace", default=os.path.join(SHARED, "traces", "p3-trace.csv"))
    ap.add_argument("--speedup", type=float, default=500.0)
    ap.add_argument("--baseline-seconds", type=int, default=30)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    a = ap.parse_args()
    pliant = os.path.join(a.build, "bin", "pliant")
    text = os.path.join(SHARED, "data", "tinyshakespeare.txt")
    for need in (pliant, a.trace, text):
        if not os.path.exists(need):
            sys.exit("trace_bench: %s is missing" % need)

    initial, peak, mean_nodes, duration_ms, removals = read_trace(a.trace)
    replay_s = max(1, round(duration_ms / a.speedup / 1000))
    mean_workers = round(mean_nodes)
    gbps = loopback_gbps(a.build)
    print("trace %s: %d nodes at start, peak %d, time-weighted mean %.1f, %.2f h, "
          "%d removal instants; speedup %g: replay %d s" %
          (os.path.basename(a.trace), initial, peak, mean_nodes, duration_ms / 3.6e6,
           removals, a.speedup, replay_s))
    print("loopback send/recv (comm_bench): %.2f GB/s" % gbps)

    with tempfile.TemporaryDirectory(prefix="pliant-trace-bench-") as tmp:
        data = os.path.join(tmp, "ts")
        sample = os.path.join(tmp, "ts.txt")
        with open(text, "rb") as src, open(sample, "wb") as dst:
            dst.write(src.read(1000000))
        subprocess.run([pliant, "tokenize", "--bytes", sample, data], check=True,
                       stdout=subprocess.DEVNULL)

        def job(strategy):
            path = os.path.join(tmp, strategy + ".yaml")
            with open(path, "w") as f:
                f.write(JOB.format(strategy=strategy, data=data,
                                   ckpt=os.path.join(tmp, strategy + ".ckpt"),
                                   every=a.checkpoint_every, max_nodes=peak))
            return path

        tj, cj = job("templates"), job("checkpoint")
        chaos = "trace:%s:%g" % (a.trace, a.speedup)
        base = {}
        for n in sorted({mean_workers, initial}):
            base[n] = pliant_run(pliant, tj, n, a.baseline_seconds,
                                 os.path.join(tmp, "ff%d.jsonl" % n))
        runs = {"templates": pliant_run(pliant, tj, initial, replay_s,
                                        os.path.join(tmp, "templates.jsonl"), chaos),
                "checkpoint": pliant_run(pliant, cj, initial, replay_s,
                                         os.path.join(tmp, "checkpoint.jsonl"), chaos)}

    rate = {n: b["progress"] / b["seconds"] for n, b in base.items()}
    step_ms = 1000.0 / rate[mean_workers]
    for n in sorted(rate):
        print("failure-free, %2d workers: %.2f steps/s (%.1f ms per step)" %
              (n, rate[n], 1000.0 / rate[n]))
    print()
    print("%-10s | %8s | %10s | %10s | %13s | %15s | %9s | %s" %
          ("strategy", "steps/s", "vs mean-ff", "vs start-ff", "lost/failure", "bytes/recovery",
           "reconfigs", "recovery ms: median / p90 / max (bound ok)"))
    results = {}
    for name, r in runs.items():
        eff = r["progress"] / r["seconds"]
        lost = max(0.0, rate[mean_workers] * r["seconds"] - r["progress"]) / rate[mean_workers]
        rec = [x for x in r["reconfigs"] if x["removed"] and x["duration_ms"] is not None]
        copied = [x["bytes_copied"] for x in rec]
        durs = sorted(x["duration_ms"] for x in rec)
        ok = sum(x["duration_ms"] <= step_ms + x["bytes_copied"] / (gbps * 1e6) + 300
                 for x in rec)
        results[name] = eff / rate[mean_workers]
        print("%-10s | %8.2f | %9.1f%% | %9.1f%% | %11.3f s | %15.0f | %9d | %s" %
              (name, eff, 100 * eff / rate[mean_workers], 100 * eff / rate[initial],
               lost / max(1, removals), statistics.mean(copied) if copied else 0,
               len(r["reconfigs"]),
               "%d / %d / %d (%d of %d)" % (durs[len(durs) // 2], durs[int(len(durs) * 0.9)],
                                            durs[-1], ok, len(durs)) if durs else "-"))
        slow = [x for x in rec if x["duration_ms"] > step_ms + x["bytes_copied"] / (gbps * 1e6) + 300]
        for x in slow[:5]:
            print("    over the bound (%s): %d ms, %d bytes, removed %s, added %s: %s" %
                  (name, x["duration_ms"], x["bytes_copied"], ",".join(x["removed"]),
                   ",".join(x["added"]), x["cause"][:160]))
    print()
    print("templates keeps %.1f%% of failure-free throughput (target >= 80%%): %s" %
          (100 * results["templates"], "PASS" if results["templates"] >= 0.8 else "FAIL"))
    print("templates vs checkpoint: %.2fx (target > 1): %s" %
          (results["templates"] / max(results["checkpoint"], 1e-9),
           "PASS" if results["templates"] > results["checkpoint"] else "FAIL"))


if __name__ == "__main__":
    main()
