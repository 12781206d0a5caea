#!/usr/bin/env python3
"""Command-line tests of `pliant simulate`: a small job (the tiny example profile) on a
trace written here, in both trace formats, every strategy: the summary lines, the
timeline's JSON lines, the report (the dashboard's page with each strategy's run built in:
its events, the charts' elements, no external reference),
--scale, spec.cost as the default prices and --price over it, --sweep's table and
recommendation, --below-minimum's wait against degrade on a trace that drops below the
minimum, bad input refused naming the flag or field. Each run takes well under a second.

The simulator against a real replay on this machine is a benchmark, not a test:
`make bench-simulate` (bench/simulate_agreement_bench.py).

Run: python3 tests/cli/test_simulate.py --build build [-k SUBSTRING]
"""

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import REPO, Suite, check, sim_job  # noqa: E402

suite = Suite("simulate")
test = suite.test

PROFILE = os.path.join(REPO, "examples", "profiles", "tiny.json")

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
    return write("job.yaml", sim_job(micro, PROFILE))


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
    check(set(s) == {"templates", "redundant", "checkpoint"}, "summary lines: %s", out)
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
    check({r["strategy"] for r in rows} == {"templates", "redundant", "checkpoint"},
          "strategies in the timeline")
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
    check(set(runs) == {"templates", "redundant", "checkpoint"}, "runs in the report: %s",
          list(runs))
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
def sweep_prints_each_choice_and_recommends_one():
    trace = write("events.csv", EVENTS)
    rc, out, err = suite.run("simulate", job(), "--trace", trace, "--sweep", "tolerate=0,1",
                             "nodes=4,6", timeout=60)
    check(rc == 0, "status %d: %s", rc, err)
    rows, choices = {}, re.findall(r"^tolerate \d+, nodes \d+, \w+: ", out, re.M)
    for line in out.splitlines():
        m = re.match(r"tolerate (\d+), nodes (\d+), (\w+): ([0-9.]+) samples/s, ([0-9.]+) samples "
                     r"per \$, ([0-9.]+) node-hours, \d+ reconfigurations \(\d+ from a "
                     r"checkpoint\), (\w+)", line)
        if m:
            rows[(int(m.group(1)), int(m.group(2)), m.group(3))] = (
                float(m.group(4)), float(m.group(5)), float(m.group(6)), m.group(7))
    check(len(choices) == 12, "2 x 2 choices x 3 strategies expected: %s", out)
    # redundant's n0 is 3 here: F = 1 needs 6 nodes
    check("tolerate 1, nodes 4, redundant: cannot plan: --strategy redundant:" in out,
          "a choice the planner refuses: %s", out)
    # 4 nodes asked for: always 4 held (a preempted one replaced from the market), 1 h
    check(all(abs(v[2] - 4.0) < 0.01 for k, v in rows.items() if k[1] == 4),
          "node-hours with 4 nodes: %s", out)
    ok = {k: v for k, v in rows.items() if v[3] != "failed"}
    best = max(ok, key=lambda k: (ok[k][1], ok[k][0]))
    m = re.search(r"recommended: tolerate (\d+), nodes (\d+), (\w+): ([0-9.]+) samples per \$", out)
    check(m and ok[(int(m.group(1)), int(m.group(2)), m.group(3))][1] == ok[best][1],
          "recommendation is not the most samples per $ (%s): %s", best, out)
    rc, out, err = suite.run("simulate", job(), "--trace", trace, "--sweep", "zones=3", timeout=30)
    check(rc == 2 and "--sweep" in err, "status %d, %s", rc, err)
    rc, out, err = suite.run("simulate", job(), "--trace", trace, "--sweep", "nodes=0", timeout=30)
    check(rc == 2 and "--sweep" in err, "status %d, %s", rc, err)


@test
def bad_input_refused():
    trace = write("events.csv", EVENTS)
    for args, want in [(["--strategy", "nope"], "--strategy"), (["--scale", "0"], "--scale"),
                       (["--price", "spot=x"], "--price"), ([], "--trace")]:
        full = ["simulate", job()] + (["--trace", trace] if want != "--trace" else []) + args
        rc, out, err = suite.run(*full, timeout=30)
        check(rc == 2 and want in err, "%s: status %d, %s", args, rc, err)
    bad = write("bad.yaml", sim_job(1, PROFILE).replace(
        "spot: 2.0", "spot: -1"))
    rc, out, err = suite.run("simulate", bad, "--trace", trace, timeout=30)
    check(rc == 2 and "spec.cost.spot" in err, "status %d, %s", rc, err)
    rc, out, err = suite.run("simulate", job(), "--trace", write("broken.csv", "0,add,node0\nx\n"),
                             timeout=30)
    check(rc == 2 and "broken.csv" in err, "status %d, %s", rc, err)


# 7 nodes; 4 of them preempted at 10 min leave 3, below (F + 1) n0 (4 for templates and
# checkpoint, 6 for redundant) but enough for F = 0; 3 join at 18 min and register a minute
# later (--startup 60), back above the minimum. The notices (30 s) come at 9.5 min.
BELOW = "".join("0,add,node%d\n" % i for i in range(7)) + \
    "".join("600000,remove,node%d\n" % i for i in range(1, 5)) + \
    "".join("1080000,add,node%d\n" % i for i in range(7, 10)) + "3600000,remove,node0\n"


def below_rows(out):
    """{(strategy, belowMinimum): (steps, minutes waiting, minutes degraded)}."""
    rows = {}
    for m in re.finditer(r"^(\w+), (wait|degrade): [0-9.]+ samples/s, [0-9.]+ samples per \$, "
                         r"(\d+) steps, .*\n.*\n  below the minimum: waiting ([0-9.]+) min "
                         r"\([0-9.]+ %\), degraded ([0-9.]+) min", out, re.M):
        rows[(m.group(1), m.group(2))] = (int(m.group(3)), float(m.group(4)), float(m.group(5)))
    return rows


@test
def below_minimum_wait_against_degrade():
    """--below-minimum wait,degrade: a row per strategy and belowMinimum. Waiting, the job
    idles from the losses until the joins register (9 min: the leaving workers train on
    until they go, there being too few without them); degraded, it trains on from the
    notices on a plan of F = 0 (9.5 min) and trains more. Without the flag, the job's own
    belowMinimum: its rows are the same simulation."""
    trace = write("below.csv", BELOW)
    html, tl = os.path.join(suite.tmp, "below.html"), os.path.join(suite.tmp, "below.jsonl")
    rc, out, err = suite.run("simulate", job(), "--trace", trace, "--below-minimum",
                             "wait,degrade", "--report", html, "--out", tl, timeout=60)
    check(rc == 0, "status %d: %s", rc, err)
    rows = below_rows(out)
    strategies = ("templates", "redundant", "checkpoint")
    check(set(rows) == {(s, b) for s in strategies for b in ("wait", "degrade")}, "rows: %s", out)
    for s in strategies:
        wait, degrade = rows[(s, "wait")], rows[(s, "degrade")]
        check(degrade[0] > wait[0], "%s: degrade should train more: %s", s, out)
        check(abs(wait[1] - 9.0) < 0.05 and wait[2] == 0, "%s, wait: %s", s, wait)
        check(abs(degrade[2] - 9.5) < 0.05 and degrade[1] == 0, "%s, degrade: %s", s, degrade)
    _, runs = report_runs(html)
    check(list(runs) == ["%s, %s" % (s, b) for s in strategies for b in ("wait", "degrade")],
          "runs in the report: %s", list(runs))
    with open(tl) as f:
        lines = [json.loads(line) for line in f]
    check({(r["below_minimum"], r["tolerance"]) for r in lines if r["event"] == "reconfigure"}
          == {("wait", 1), ("degrade", 0), ("degrade", 1)}, "the plans' tolerances: %s", tl)
    with open(job()) as f:
        own = write("degrade.yaml", f.read().replace("maxResets: 0",
                                                     "maxResets: 0, belowMinimum: degrade"))
    rc, out, err = suite.run("simulate", own, "--trace", trace, "--strategy", "templates",
                             timeout=60)
    check(rc == 0, "status %d: %s", rc, err)
    check(summary(out)["templates"][2] == rows[("templates", "degrade")][0],
          "the job's belowMinimum: degrade not simulated: %s", out)


@test
def below_minimum_bad_values_refused():
    trace = write("events.csv", EVENTS)
    for args, want in [(["--below-minimum", "later"], "--below-minimum: unknown value later"),
                       (["--below-minimum", "wait,wait"], "--below-minimum: wait given twice"),
                       (["--below-minimum", ","], "--below-minimum: expected"),
                       (["--below-minimum", "all", "--sweep", "tolerate=1"],
                        "--below-minimum: one value with --sweep")]:
        rc, out, err = suite.run("simulate", job(), "--trace", trace, *args, timeout=30)
        check(rc == 2 and want in err, "%s: status %d, %s", args, rc, err)


def stepped_profile(name, workers):
    """The tiny profile with a pipeline_step of `workers` workers at 250 ms a step."""
    with open(PROFILE) as f:
        p = json.load(f)
    p["pipeline_step"] = {"strategy": "templates", "workers": workers, "threads": 1, "steps": 10,
                          "ms": 250}
    return write(name, json.dumps(p))


@test
def latency_from_the_profiles_pipeline_step():
    """Without --latency-us, the latency at which the failure-free job on pipeline_step's
    workers steps in its ms: a trace of those workers alone trains global / ms samples a
    second. More workers than the job plans for are refused, naming the field."""
    with open(PROFILE) as f:
        micro = json.load(f)["microbatch_size"]
    ff = write("ff.csv", "".join("0,add,node%d\n" % i for i in range(4)) + "3600000,add,node4\n")
    rc, out, err = suite.run("simulate", job(), "--trace", ff, "--strategy", "templates",
                             "--startup", "0", "--profile", stepped_profile("stepped.json", 4),
                             timeout=30)
    check(rc == 0, "status %d: %s", rc, err)
    check(re.search(r"^latency: [1-9]\d* us a message, from the profile's pipeline_step \(templates, "
                    r"4 workers of 1 threads: 250.00 ms a step\)$", out, re.M), "%s", out)
    got, want = summary(out)["templates"][0], 16 * micro / 0.25
    check(abs(got / want - 1) < 0.005, "%.2f samples/s, expected %.2f: %s", got, want, out)
    rc, out, err = suite.run("simulate", job(), "--trace", ff, "--strategy", "templates",
                             "--profile", stepped_profile("far.json", 99), timeout=30)
    check(rc == 2 and "pipeline_step.workers: 99, more than the" in err,
          "status %d, %s", rc, err)


if __name__ == "__main__":
    sys.exit(suite.main())
