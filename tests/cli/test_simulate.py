#!/usr/bin/env python3
"""Command-line tests of `pliant simulate`: a small job (the tiny example profile) on a
trace written here, in both trace formats, every strategy: the summary lines, the
timeline's JSON lines, the report (the dashboard's page with each strategy's run built in:
its events, the charts' elements, no external reference),
--scale, spec.cost as the default prices and --price over it, bad input refused naming
the flag or field. Each run takes well under a second.

Run: python3 tests/cli/test_simulate.py --build build [-k SUBSTRING]
"""

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import REPO, Suite, check  # noqa: E402

suite = Suite("simulate")
test = suite.test

PROFILE = os.path.join(REPO, "examples", "profiles", "tiny.json")

JOB = """\
apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata:
  name: simjob
spec:
  model: {{layers: 4, channels: 64, heads: 2, vocabSize: 256, maxSeqLen: 64}}
  data: {{train: /nowhere/x_*.bin}}
  batch: {{global: {global_}, micro: {micro}, seqLen: 32}}
  steps: 100
  checkpoint: {{dir: /nowhere/ckpt, every: 10}}
  faultTolerance: {{tolerate: 1, maxResets: 0}}
  cost: {{spot: 2.0, onDemand: 5.0}}
  profile: {profile}
"""

EVENTS = "0,add,node0\n0,add,node1\n0,add,node2\n0,add,node3\n0,add,node4\n0,add,node5\n" \
         "600000,remove,node2\n900000,remove,node4\n960000,add,node6\n1800000,add,node7\n" \
         "3600000,remove,node0\n"

COUNTS = "2021-12-11, 11:00:00, 6\r\n2021-12-11, 11:10:00, 6\r\n2021-12-11, 11:15:00, 4\r\n" \
         "2021-12-11, 11:30:00, 6\r\n2021-12-11, 12:00:00, 5\r\n"


def write(name, text):
    path = os.path.join(suite.tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def job():
    with open(PROFILE) as f:
        micro = json.load(f)["microbatch_size"]
    return write("job.yaml", JOB.format(global_=16 * micro, micro=micro, profile=PROFILE))


def summary(out):
    lines = {}
    for line in out.splitlines():
        m = re.match(r"(\w+): ([0-9.]+) samples/s, ([0-9.]+) samples per \$, (\d+) steps, "
                     r"([0-9.]+) node-hours, \$([0-9.]+) spent", line)
        if m:
            lines[m.group(1)] = [float(x) for x in m.groups()[1:]]
    return lines


@test
def all_strategies_summary_timeline_report():
    trace = write("events.csv", EVENTS)
    tl, html = os.path.join(suite.tmp, "tl.jsonl"), os.path.join(suite.tmp, "r.html")
    rc, out, err = suite.run("simulate", job(), "--trace", trace, "--out", tl, "--report", html,
                             timeout=60)
    check(rc == 0, "status %d: %s", rc, err)
    s = summary(out)
    check(set(s) == {"templates", "checkpoint"}, "summary lines: %s", out)
    check(s["templates"][0] > 0 and s["templates"][0] >= s["checkpoint"][0],
          "templates should train at least as fast: %s", out)
    # node time: 6 nodes for 10 min, 5 nodes 5 min, 4 nodes 1 min, 5 nodes 14 min, 6 for 30 min
    hours = (6 * 10 + 5 * 5 + 4 * 1 + 5 * 14 + 6 * 30) / 60.0
    check(abs(s["templates"][3] - hours) < 0.05, "node-hours %s, expected %.2f", s["templates"], hours)
    check(abs(s["templates"][4] - 2.0 * s["templates"][3]) < 0.02, "spec.cost.spot not used: %s", out)
    check("time: computing" in out and "redoing" in out, "no time split: %s", out)
    with open(tl) as f:
        rows = [json.loads(line) for line in f]
    kinds = {r["event"] for r in rows}
    check({"add", "remove", "reconfigure", "end"} <= kinds, "timeline events %s", kinds)
    check({r["strategy"] for r in rows} == {"templates", "checkpoint"}, "strategies in the timeline")
    check_report(html, s)


def report_runs(path):
    """The page's text and the runs built into it ({name: [events]})."""
    with open(path) as f:
        page = f.read()
    m = re.search(r'<script id="pliant-history" type="application/json">(.*?)</script>', page, re.S)
    check(m, "no history in the report")
    return page, {r["name"]: r["events"] for r in json.loads(m.group(1))["runs"]}


def check_report(path, s):
    page, runs = report_runs(path)
    check(set(runs) == {"templates", "checkpoint"}, "runs in the report: %s", list(runs))
    for el in ('id="loss-chart"', 'id="tps-chart"', 'id="map"', 'id="timeline"', 'id="runs"',
               "PliantDashboard"):
        check(el in page, "the report lacks the dashboard's %s", el)
    check(not re.search(r"(src|href)=\"(https?:)?//", page), "the report references the network")
    for name, evs in runs.items():
        types = [e["type"] for e in evs]
        check(types[0] == "hello" and evs[0]["strategy"] == name, "%s: first %s", name, evs[0])
        check({"step", "reconfig", "recovered", "notice", "phase"} <= set(types), "%s: %s", name,
              set(types))
        steps = [e for e in evs if e["type"] == "step"]
        check(all(e["tokens_per_second"] >= 0 for e in steps), "%s: tokens/s", name)
        last = steps[-1]
        check(abs(last["usd"] - s[name][4]) < 0.05 and last["usd_on_demand"] > last["usd"],
              "%s: $ %s, summary %s", name, last, s[name])
        check(abs(last["node_hours"] - s[name][3]) < 0.05, "%s: node-hours %s", name, last)
        check(last["samples_per_usd"] > 0, "%s: samples per $ %s", name, last)
        times = [e["t"] for e in evs]
        check(times == sorted(times), "%s: events out of time order", name)


@test
def count_format_scale_and_price():
    trace = write("counts.csv", COUNTS)
    rc, out, err = suite.run("simulate", job(), "--trace", trace, "--strategy", "templates",
                             "--scale", "3", "--price", "spot=1,ondemand=4", timeout=60)
    check(rc == 0, "status %d: %s", rc, err)
    s = summary(out)["templates"]
    hours = 3 * (6 * 15 + 4 * 15 + 6 * 30) / 60.0
    check(abs(s[3] - hours) < 0.05, "node-hours %.2f, expected %.2f", s[3], hours)
    check(abs(s[4] - s[3]) < 0.02, "--price spot=1 not used: %s", out)


@test
def bad_input_refused():
    trace = write("events.csv", EVENTS)
    for args, want in [(["--strategy", "nope"], "--strategy"), (["--scale", "0"], "--scale"),
                       (["--price", "spot=x"], "--price"), ([], "--trace")]:
        full = ["simulate", job()] + (["--trace", trace] if want != "--trace" else []) + args
        rc, out, err = suite.run(*full, timeout=30)
        check(rc == 2 and want in err, "%s: status %d, %s", args, rc, err)
    bad = write("bad.yaml", JOB.format(global_=16, micro=1, profile=PROFILE).replace(
        "spot: 2.0", "spot: -1"))
    rc, out, err = suite.run("simulate", bad, "--trace", trace, timeout=30)
    check(rc == 2 and "spec.cost.spot" in err, "status %d, %s", rc, err)
    rc, out, err = suite.run("simulate", job(), "--trace", write("broken.csv", "0,add,node0\nx\n"),
                             timeout=30)
    check(rc == 2 and "broken.csv" in err, "status %d, %s", rc, err)


if __name__ == "__main__":
    sys.exit(suite.main())
