#!/usr/bin/env python3
"""Command-line tests of `pliant plan` (the planner's contract).

Run: python3 tests/cli/test_plan_cli.py --build build [-k SUBSTRING]
Prints one line per test, "ok NAME", "FAIL NAME" (after indented detail lines) or
"skip NAME: why", as tests/run_tests.py expects; exits 1 if any test failed.

The checks recompute the cost model of README.md independently, in integer
nanoseconds, from the profile: stage times W_k, communication C_k, memory, T(Nb).
On the tiny profile (6 layers, 2 GPUs a node) the templates are checked against
exhaustive search, and on every profile the coverage table is checked against an
enumeration of all template combinations with an exact batch distribution.
Times printed in milliseconds must carry nanosecond precision (6 decimals).
Standard library only.
"""

import itertools
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from clitest import REPO, Failure, Suite, check  # noqa: E402

PROFILES = os.path.join(REPO, "examples", "profiles")
TINY = os.path.join(PROFILES, "tiny.json")
GPT2 = os.path.join(PROFILES, "gpt2-124m-a100.json")
GPT3 = os.path.join(PROFILES, "gpt3-2.7b-8gpu.json")

TOL_MS = 2e-6          # printed ms values are compared to exact ns values within this
suite = Suite("plan_cli")
test = suite.test


def close(a, b, tol=TOL_MS, rel=1e-12):
    return abs(a - b) <= tol + rel * max(abs(a), abs(b))


# ---------------------------------------------------------------------------
# Running the command

_cache = {}


def plan(*args):
    """Runs `pliant plan ARGS`; returns (status, stdout, stderr). Results are cached."""
    args = tuple(str(a) for a in args)
    if args not in _cache:
        p = subprocess.run([suite.pliant, "plan"] + list(args), cwd=REPO, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        _cache[args] = (p.returncode, p.stdout.decode("utf-8", "replace"),
                        p.stderr.decode("utf-8", "replace"))
    return _cache[args]


def plan_json(*args):
    rc, out, err = plan(*args)
    check(rc == 0, "pliant plan %s: exit status %d, stderr: %s", " ".join(map(str, args)), rc,
          err.strip()[:500])
    try:
        return json.loads(out)
    except ValueError as e:
        raise Failure("pliant plan %s: stdout is not JSON (%s): %r"
                      % (" ".join(map(str, args)), e, out[:300]))


def expect_usage_error(args, *must_name):
    """Bad input: exit status 2, nothing on stdout, one stderr line 'pliant plan: ...'
    (optionally followed by a usage synopsis) that contains one of the strings in each
    of must_name (a str, or a tuple of alternatives; () checks nothing)."""
    rc, out, err = plan(*args)
    cmd = "pliant plan " + " ".join(map(str, args))
    check(rc == 2, "%s: exit status %d, want 2 (stderr: %s)", cmd, rc, err.strip()[:300])
    check(out == "", "%s: stdout should be empty on error, got %r", cmd, out[:200])
    lines = [l for l in err.splitlines() if l.strip()]
    check(lines, "%s: nothing on stderr", cmd)
    check(lines[0].startswith("pliant plan: "), "%s: stderr %r does not start with 'pliant plan: '",
          cmd, lines[0])
    # one error line; a usage synopsis may follow it
    rest = lines[1:]
    check(not rest or (rest[0].startswith("usage:") and all(l[:1].isspace() for l in rest[1:])),
          "%s: want one error line (and at most a usage synopsis), got %r", cmd, err[:500])
    for want in must_name:
        alts = (want,) if isinstance(want, str) else want
        if not alts:
            continue
        check(any(a in lines[0] for a in alts), "%s: error %r does not name %s", cmd, lines[0],
              " or ".join(repr(a) for a in alts))


def tmpfile(name, content):
    path = os.path.join(suite.tmp, name)
    with open(path, "w") as f:
        f.write(content if isinstance(content, str) else json.dumps(content))
    return path


def load(path):
    with open(path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------
# The cost model (README.md, "Profiles"), in integer nanoseconds

class Model:
    def __init__(self, prof):
        self.p = prof
        self.M = prof["gpus_per_node"]
        self.L = len(prof["layers"])
        self.mbs = prof["microbatch_size"]
        self.mem = prof["gpu_memory_bytes"]
        self.keys = sorted(int(k) for k in prof["layers"][0]["forward_ms"])
        self.fwd = [{int(k): round(v * 1e6) for k, v in l["forward_ms"].items()} for l in prof["layers"]]
        self.bwd = [{int(k): round(v * 1e6) for k, v in l["backward_ms"].items()} for l in prof["layers"]]
        self.param = [l["param_bytes"] for l in prof["layers"]]
        self.act = [l["activation_bytes"] for l in prof["layers"]]
        self.out = [l["output_bytes"] for l in prof["layers"]]

    def transfer_ns(self, nbytes, GBps):
        return round(nbytes / GBps)          # GB = 1e9 bytes: bytes / (GBps * 1e9) s

    def stage_ns(self, a, b, d):
        return sum(self.fwd[i][d] + self.bwd[i][d] for i in range(a, b))

    def stage_mem_num(self, a, b, k, S):
        """Numerator of the memory formula; the stage fits if num <= mem * d."""
        return 4 * sum(self.param[a:b]) + (S - k) * sum(self.act[a:b])

    def evaluate(self, stages):
        """stages: [(begin, end, node, gpus)]. Returns the template's cost fields
        (ns and bytes) or None if it does not fit in memory."""
        S = len(stages)
        W = [self.stage_ns(a, b, d) for a, b, _, d in stages]
        C = []
        for k in range(S - 1):
            same = stages[k][2] == stages[k + 1][2]
            bw = self.p["intra_node_GBps"] if same else self.p["inter_node_GBps"]
            C.append(self.transfer_ns(self.out[stages[k][1] - 1], bw))
        peak = 0
        for k, (a, b, _, d) in enumerate(stages):
            num = self.stage_mem_num(a, b, k, S)
            if num > self.mem * d:
                return None
            peak = max(peak, num / d)
        sum_w, comm, max_w = sum(W), 2 * sum(C), max(W)
        return {"sum": sum_w, "comm": comm, "max": max_w,
                "iter": sum_w + comm + (4 * S - 1) * max_w, "peak": peak, "S": S}

    def node_splits(self):
        """Ordered ways to split one node's M GPUs into stages (each a profile key)."""
        res = []

        def rec(left, acc):
            if left == 0:
                res.append(tuple(acc))
                return
            for d in self.keys:
                if d <= left:
                    rec(left - d, acc + [d])
        rec(self.M, [])
        return res

    def exhaustive_template(self, n):
        """The exact optimum T(4S) over every layout of n nodes, by enumeration."""
        best = None
        splits = self.node_splits()
        for layout in itertools.product(splits, repeat=n):
            gpus = [(node, d) for node, sp in enumerate(layout) for d in sp]
            S = len(gpus)
            if S > self.L:
                continue
            for cuts in itertools.combinations(range(1, self.L), S - 1):
                bounds = (0,) + cuts + (self.L,)
                stages = [(bounds[k], bounds[k + 1], gpus[k][0], gpus[k][1]) for k in range(S)]
                r = self.evaluate(stages)
                if r and (best is None or r["iter"] < best["iter"]):
                    best = r
        return best


def template_time(t, nb):
    """T(nb) in ns from a template's printed sum/comm/max (ms)."""
    return round(t["sum_stage_ms"] * 1e6) + round(t["comm_ms"] * 1e6) + \
        (nb - 1) * round(t["max_stage_ms"] * 1e6)


def distribute(costs, mb):
    """Exact min over integer nb_j >= 1, sum = mb, of max_j first_j + (nb_j - 1) per_j.
    costs: [(first, per)] in ns. Returns the makespan in ns (None if mb < len)."""
    if mb < len(costs):
        return None
    lo = max(f for f, _ in costs)
    hi = lo + mb * max(p for _, p in costs)

    def cap(t):
        return sum(1 + (t - f) // p if p > 0 else mb for f, p in costs)
    while lo < hi:
        mid = (lo + hi) // 2
        if cap(mid) >= mb:
            hi = mid
        else:
            lo = mid + 1
    return lo


def combinations_for(sizes, total, min_count):
    """Every multiset of template sizes (descending) summing to total, at least min_count items."""
    sizes = sorted(sizes, reverse=True)
    res = []

    def rec(i, left, acc):
        if left == 0:
            if len(acc) >= min_count:
                res.append(tuple(acc))
            return
        if i == len(sizes):
            return
        s = sizes[i]
        for c in range(left // s, -1, -1):
            rec(i + 1, left - c * s, acc + [s] * c)
    rec(0, total, [])
    return res


# ---------------------------------------------------------------------------
# Structural checks of one plan

REQUIRED_TOP = ("n0", "tolerate", "microbatches", "templates", "coverage", "uncovered",
                "infeasible_template_nodes")
REQUIRED_TEMPLATE = ("nodes", "iteration_ms", "sum_stage_ms", "comm_ms", "max_stage_ms",
                     "peak_memory_bytes", "stages")
REQUIRED_STAGE = ("layer_begin", "layer_end", "node", "gpus")
REQUIRED_COVERAGE = ("nodes", "iteration_ms", "samples_per_second", "pipelines")
REQUIRED_PIPELINE = ("template_nodes", "microbatches", "iteration_ms")


def uncovered_nodes(plan_out):
    res = []
    for u in plan_out["uncovered"]:
        res.append(u["nodes"] if isinstance(u, dict) else u)
    return res


def feasible_templates(plan_out):
    return [t for t in plan_out["templates"] if t.get("feasible", True)]


def check_plan(prof_path, N, F, B):
    """Runs the plan and checks every property of the contract that holds for any
    profile. Returns (output, Model, {nodes: template})."""
    out = plan_json("--profile", prof_path, "--nodes", N, "--tolerate", F, "--global-batch", B)
    m = Model(load(prof_path))
    for k in REQUIRED_TOP:
        check(k in out, "output lacks key %r (has %s)", k, sorted(out))
    check(out["tolerate"] == F, "tolerate %r, want %d", out["tolerate"], F)
    mb = B // m.mbs
    check(out["microbatches"] == mb, "microbatches %r, want %d", out["microbatches"], mb)
    n0 = out["n0"]
    check(isinstance(n0, int) and n0 >= 1, "n0 %r", n0)
    n_hi = N - F * n0

    temps = {}
    for t in feasible_templates(out):
        for k in REQUIRED_TEMPLATE:
            check(k in t, "template %r lacks key %r", t.get("nodes"), k)
        n = t["nodes"]
        check(n not in temps, "template for %d nodes listed twice", n)
        temps[n] = t
        st = t["stages"]
        check(len(st) >= n, "template %d: %d stages, fewer than its nodes", n, len(st))
        for s in st:
            for k in REQUIRED_STAGE:
                check(k in s, "template %d: stage lacks key %r", n, k)
        # contiguous, non-empty, covering every layer
        check(st[0]["layer_begin"] == 0, "template %d: first stage begins at layer %d", n,
              st[0]["layer_begin"])
        check(st[-1]["layer_end"] == m.L, "template %d: last stage ends at %d, want %d layers", n,
              st[-1]["layer_end"], m.L)
        for i, s in enumerate(st):
            check(s["layer_begin"] < s["layer_end"], "template %d: stage %d is empty", n, i)
            if i:
                check(s["layer_begin"] == st[i - 1]["layer_end"],
                      "template %d: stage %d begins at %d, previous ended at %d", n, i,
                      s["layer_begin"], st[i - 1]["layer_end"])
            check(s["gpus"] in m.keys, "template %d: stage %d uses %r GPUs, not a profile key",
                  n, i, s["gpus"])
        # nodes in order 0..n-1, each exactly M GPUs
        nodes = [s["node"] for s in st]
        check(nodes[0] == 0 and nodes[-1] == n - 1 and
              all(b - a in (0, 1) for a, b in zip(nodes, nodes[1:])),
              "template %d: stage nodes %r are not 0..%d in order", n, nodes, n - 1)
        for node in range(n):
            g = sum(s["gpus"] for s in st if s["node"] == node)
            check(g == m.M, "template %d: node %d uses %d GPUs, want %d", n, node, g, m.M)
        # the printed costs are the cost model's
        r = m.evaluate([(s["layer_begin"], s["layer_end"], s["node"], s["gpus"]) for s in st])
        check(r is not None, "template %d does not fit in gpu_memory_bytes", n)
        for key, name in (("sum", "sum_stage_ms"), ("comm", "comm_ms"), ("max", "max_stage_ms"),
                          ("iter", "iteration_ms")):
            check(close(t[name], r[key] / 1e6), "template %d: %s = %r, cost model gives %.6f",
                  n, name, t[name], r[key] / 1e6)
        check(abs(t["peak_memory_bytes"] - r["peak"]) <= 1,
              "template %d: peak_memory_bytes = %r, cost model gives %.1f", n,
              t["peak_memory_bytes"], r["peak"])
        check(t["peak_memory_bytes"] <= m.mem, "template %d: peak memory above gpu_memory_bytes", n)

    check(n0 in temps, "no template for n0 = %d", n0)
    infeasible = out["infeasible_template_nodes"]
    check(sorted(set(temps) | set(infeasible)) == list(range(n0, n_hi + 1)),
          "templates %s + infeasible %s should be exactly n0..N-F*n0 = %d..%d",
          sorted(temps), infeasible, n0, n_hi)
    check(not (set(temps) & set(infeasible)), "nodes both feasible and infeasible: %s",
          sorted(set(temps) & set(infeasible)))

    # coverage: N' from N down to (F+1) n0
    lo = (F + 1) * n0
    cov = out["coverage"]
    cov_nodes = [c["nodes"] for c in cov]
    check(all(a > b for a, b in zip(cov_nodes, cov_nodes[1:])), "coverage nodes not descending: %s",
          cov_nodes)
    unc = uncovered_nodes(out)
    check(sorted(set(cov_nodes) | set(unc), reverse=True) == list(range(N, lo - 1, -1)),
          "coverage %s + uncovered %s should be exactly N..(F+1)n0 = %d..%d", cov_nodes, unc, N, lo)
    if cov:
        check(cov[0]["nodes"] == N or N in unc, "coverage does not start at N = %d", N)
    for c in cov:
        if c.get("covered", True) is False or not c["pipelines"]:
            check(c["nodes"] in unc, "coverage entry %d has no pipelines but is not uncovered",
                  c["nodes"])
            continue
        for k in REQUIRED_COVERAGE:
            check(k in c, "coverage %d lacks key %r", c["nodes"], k)
        pl = c["pipelines"]
        for p in pl:
            for k in REQUIRED_PIPELINE:
                check(k in p, "coverage %d: pipeline lacks key %r", c["nodes"], k)
            check(p["template_nodes"] in temps, "coverage %d: pipeline of %r nodes has no template",
                  c["nodes"], p["template_nodes"])
            check(p["microbatches"] >= 1, "coverage %d: pipeline with %r microbatches", c["nodes"],
                  p["microbatches"])
            want = template_time(temps[p["template_nodes"]], p["microbatches"])
            check(close(p["iteration_ms"], want / 1e6),
                  "coverage %d: pipeline (%d nodes, %d microbatches) iteration_ms %r, want %.6f",
                  c["nodes"], p["template_nodes"], p["microbatches"], p["iteration_ms"], want / 1e6)
        check(len(pl) >= F + 1, "coverage %d: %d pipelines, fewer than F+1 = %d", c["nodes"],
              len(pl), F + 1)
        used = sum(p["template_nodes"] for p in pl)
        check(used == c["nodes"], "coverage %d: pipelines use %d nodes", c["nodes"], used)
        total = sum(p["microbatches"] for p in pl)
        check(total == mb, "coverage %d: microbatches sum to %d, want B/microbatch_size = %d",
              c["nodes"], total, mb)
        sizes = [p["template_nodes"] for p in pl]
        check(sizes == sorted(sizes, reverse=True), "coverage %d: pipelines %s not largest first",
              c["nodes"], sizes)
        check(close(c["iteration_ms"], max(p["iteration_ms"] for p in pl)),
              "coverage %d: iteration_ms %r is not its slowest pipeline's", c["nodes"],
              c["iteration_ms"])
        sps = B / (c["iteration_ms"] / 1e3)
        check(abs(c["samples_per_second"] - sps) <= 1e-6 * sps + 1e-6,
              "coverage %d: samples_per_second %r, want B / iteration = %.6f", c["nodes"],
              c["samples_per_second"], sps)
    return out, m, temps


def check_coverage_optimal(out, temps, N, F, B, m):
    """Every coverage entry is the best combination of templates (exhaustive), with an
    exact batch distribution; ties go to more pipelines; uncovered N' are exactly
    those with no combination."""
    mb = B // m.mbs
    n0 = out["n0"]
    cov = {c["nodes"]: c for c in out["coverage"] if c["pipelines"]}
    unc = set(uncovered_nodes(out))
    for Np in range(N, (F + 1) * n0 - 1, -1):
        best = None
        for combo in combinations_for(list(temps), Np, F + 1):
            costs = [(template_time(temps[s], 1), round(temps[s]["max_stage_ms"] * 1e6))
                     for s in combo]
            t = distribute(costs, mb)
            if t is None:
                continue
            key = (t, -len(combo))
            if best is None or key < best[0]:
                best = (key, combo)
        if best is None:
            check(Np in unc and Np not in cov, "%d nodes: no combination exists but not uncovered", Np)
            continue
        check(Np in cov, "%d nodes: combination %s exists but the entry is not covered", Np,
              best[1])
        c = cov[Np]
        got = round(c["iteration_ms"] * 1e6)
        check(abs(got - best[0][0]) <= 2, "%d nodes: iteration %.6f ms, exhaustive optimum %.6f ms "
              "with pipelines %s", Np, c["iteration_ms"], best[0][0] / 1e6, best[1])
        # the printed distribution of its own pipelines is exact too
        costs = [(template_time(temps[p["template_nodes"]], 1),
                  round(temps[p["template_nodes"]]["max_stage_ms"] * 1e6)) for p in c["pipelines"]]
        check(abs(distribute(costs, mb) - got) <= 2,
              "%d nodes: batch distribution %s is not the exact optimum (%.6f ms)", Np,
              [p["microbatches"] for p in c["pipelines"]], distribute(costs, mb) / 1e6)
        check(len(c["pipelines"]) == -best[0][1],
              "%d nodes: %d pipelines, but an equally fast plan %s has more", Np,
              len(c["pipelines"]), best[1])


# ---------------------------------------------------------------------------
# Tests

TINY_ARGS = ("--profile", TINY, "--nodes", 8, "--tolerate", 1, "--global-batch", 64)


@test
def tiny_plan_structure():
    check_plan(TINY, 8, 1, 64)


@test
def tiny_templates_exact_against_exhaustive_search():
    out, m, temps = check_plan(TINY, 8, 1, 64)
    n_hi = 8 - out["n0"]
    # n0 is the smallest n with a feasible layout
    for n in range(1, out["n0"]):
        check(m.exhaustive_template(n) is None,
              "n0 = %d but %d node(s) have a feasible layout", out["n0"], n)
    for n in range(out["n0"], min(n_hi, 4) + 1):
        ex = m.exhaustive_template(n)
        if ex is None:
            check(n in out["infeasible_template_nodes"], "%d nodes: no layout fits, but not "
                  "listed infeasible", n)
            continue
        check(n in temps, "%d nodes: a layout fits (T = %.6f ms) but no template", n,
              ex["iter"] / 1e6)
        check(close(temps[n]["iteration_ms"], ex["iter"] / 1e6),
              "%d nodes: template T(4S) = %r ms, exhaustive optimum %.6f ms", n,
              temps[n]["iteration_ms"], ex["iter"] / 1e6)


@test
def tiny_needs_two_nodes():
    out = plan_json(*TINY_ARGS)
    check(out["n0"] == 2, "tiny.json is sized so that n0 = 2, got %r", out["n0"])


@test
def tiny_coverage_exact():
    out, m, temps = check_plan(TINY, 8, 1, 64)
    check_coverage_optimal(out, temps, 8, 1, 64, m)


@test
def tiny_coverage_tolerate_2():
    out, m, temps = check_plan(TINY, 12, 2, 96)
    check_coverage_optimal(out, temps, 12, 2, 96, m)


@test
def gpt2_plan_structure_and_coverage():
    out, m, temps = check_plan(GPT2, 12, 2, 512)
    check(out["n0"] == 1, "GPT-2 124M fits on one 4 x 40 GB node, n0 = %r", out["n0"])
    check_coverage_optimal(out, temps, 12, 2, 512, m)


@test
def gpt3_plan_structure_and_coverage():
    out, m, temps = check_plan(GPT3, 10, 1, 256)
    check_coverage_optimal(out, temps, 10, 1, 256, m)


@test
def templates_do_not_depend_on_cluster_size():
    # A template for n nodes is the same whatever N is.
    a = plan_json("--profile", TINY, "--nodes", 8, "--tolerate", 1, "--global-batch", 64)
    b = plan_json("--profile", TINY, "--nodes", 9, "--tolerate", 1, "--global-batch", 64)
    ta = {t["nodes"]: t["iteration_ms"] for t in feasible_templates(a)}
    tb = {t["nodes"]: t["iteration_ms"] for t in feasible_templates(b)}
    for n in ta:
        check(n in tb and close(ta[n], tb[n]), "template %d differs between N=8 and N=9", n)


@test
def deterministic_output():
    for args in (TINY_ARGS,
                 ("--profile", GPT2, "--nodes", 16, "--tolerate", 2, "--global-batch", 1024),
                 ("--profile", GPT3, "--nodes", 12, "--tolerate", 1, "--global-batch", 512)):
        runs = []
        for _ in range(2):
            p = subprocess.run([suite.pliant, "plan"] + [str(a) for a in args], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
            check(p.returncode == 0, "exit status %d: %s", p.returncode, p.stderr.decode()[:300])
            runs.append(p.stdout)
        check(runs[0] == runs[1], "two runs of pliant plan %s differ", " ".join(map(str, args)))


@test
def flags_in_any_order():
    a = plan(*TINY_ARGS)
    b = plan("--global-batch", 64, "--tolerate", 1, "--nodes", 8, "--profile", TINY)
    check(a == b, "the same flags in another order give another output")


@test
def large_cluster_is_fast_enough():
    # 1,000 nodes of the GPT-2 profile: the coverage table must stay exact and fast.
    import time
    t0 = time.monotonic()
    plan("--profile", GPT2, "--nodes", 1000, "--tolerate", 2, "--global-batch", 8192)
    dt = time.monotonic() - t0
    check(dt < 30, "pliant plan for 1,000 nodes took %.1f s", dt)
    out, _, _ = check_plan(GPT2, 1000, 2, 8192)
    check(out["coverage"] and out["coverage"][0]["nodes"] == 1000, "no coverage entry for 1000")
    # 14 layers: at most 14 stages, so templates above 14 nodes cannot exist
    check(max(t["nodes"] for t in feasible_templates(out)) <= 14, "a template of more nodes "
          "than the model has layers")


# -- bad input ---------------------------------------------------------------

def profile_variant(name, mutate):
    prof = load(TINY)
    mutate(prof)
    return tmpfile(name, prof)


def bad_profile_args(path, nodes=8, tolerate=1, batch=64):
    return ("--profile", path, "--nodes", nodes, "--tolerate", tolerate, "--global-batch", batch)


@test
def error_missing_top_level_key():
    for key in ("microbatch_size", "gpus_per_node", "gpu_memory_bytes", "intra_node_GBps",
                "inter_node_GBps", "layers"):
        path = profile_variant("missing-%s.json" % key, lambda p: p.pop(key))
        expect_usage_error(bad_profile_args(path), key)


@test
def error_missing_layer_key():
    for key in ("forward_ms", "backward_ms", "param_bytes", "activation_bytes", "output_bytes"):
        path = profile_variant("layer-missing-%s.json" % key, lambda p: p["layers"][2].pop(key))
        expect_usage_error(bad_profile_args(path), key, "layers[2]")


@test
def error_negative_time():
    path = profile_variant("negative-forward.json",
                           lambda p: p["layers"][3]["forward_ms"].__setitem__("1", -0.5))
    expect_usage_error(bad_profile_args(path), "layers[3]", "forward_ms")
    path = profile_variant("negative-backward.json",
                           lambda p: p["layers"][1]["backward_ms"].__setitem__("2", -1))
    expect_usage_error(bad_profile_args(path), "layers[1]", "backward_ms")


@test
def error_negative_bytes():
    path = profile_variant("negative-params.json",
                           lambda p: p["layers"][0].__setitem__("param_bytes", -4))
    expect_usage_error(bad_profile_args(path), "layers[0]", "param_bytes")


@test
def error_inconsistent_gpu_keys():
    # every layer has the same keys, "1" among them, none above gpus_per_node
    path = profile_variant("key-missing.json",
                           lambda p: p["layers"][4]["forward_ms"].pop("2"))
    expect_usage_error(bad_profile_args(path), "layers[4]")

    def no_one(p):
        for l in p["layers"]:
            l["forward_ms"].pop("1")
            l["backward_ms"].pop("1")
    expect_usage_error(bad_profile_args(profile_variant("no-key-1.json", no_one)), "forward_ms")

    def above_m(p):
        for l in p["layers"]:
            l["forward_ms"]["4"] = 0.1
            l["backward_ms"]["4"] = 0.2
    expect_usage_error(bad_profile_args(profile_variant("key-above-m.json", above_m)),
                       ("gpus_per_node", "forward_ms"))


@test
def error_wrong_types():
    path = profile_variant("string-mbs.json", lambda p: p.__setitem__("microbatch_size", "four"))
    expect_usage_error(bad_profile_args(path), "microbatch_size")
    path = profile_variant("empty-layers.json", lambda p: p.__setitem__("layers", []))
    expect_usage_error(bad_profile_args(path), "layers")
    path = profile_variant("zero-gpus.json", lambda p: p.__setitem__("gpus_per_node", 0))
    expect_usage_error(bad_profile_args(path), "gpus_per_node")


@test
def error_malformed_json():
    with open(TINY) as f:
        text = f.read()
    for i, bad in enumerate((text[: len(text) // 2], "", "[1, 2, 3]", "{\"model\": }")):
        expect_usage_error(bad_profile_args(tmpfile("malformed-%d.json" % i, bad)), ())


@test
def error_profile_not_found():
    expect_usage_error(bad_profile_args(os.path.join(suite.tmp, "no-such-profile.json")),
                       "no-such-profile.json")


@test
def error_batch_not_divisible():
    # microbatch_size 4: 62 is not a multiple; the nearest valid sizes are 60 and 64
    expect_usage_error(bad_profile_args(TINY, batch=62), ("global-batch", "global_batch"), "60", "64")
    expect_usage_error(bad_profile_args(TINY, batch=0), ("global-batch", "global_batch"))
    expect_usage_error(bad_profile_args(TINY, batch=-8), ("global-batch", "global_batch"))


@test
def error_too_few_microbatches_for_tolerance():
    # F = 1 needs at least 2 pipelines, so at least 2 microbatches: B = 4 gives 1
    expect_usage_error(bad_profile_args(TINY, batch=4), ("global-batch", "global_batch"))


@test
def error_tolerate_too_large():
    # n0 = 2 on tiny: F = 1 needs (F+1) n0 = 4 nodes
    expect_usage_error(bad_profile_args(TINY, nodes=3, tolerate=1), "tolerate")
    expect_usage_error(bad_profile_args(TINY, nodes=8, tolerate=4), "tolerate")
    expect_usage_error(bad_profile_args(TINY, nodes=8, tolerate=-1), "tolerate")


@test
def error_bad_numbers():
    expect_usage_error(bad_profile_args(TINY, nodes="eight"), "--nodes")
    expect_usage_error(bad_profile_args(TINY, nodes=0), "--nodes")
    expect_usage_error(bad_profile_args(TINY, nodes="8x"), "--nodes")
    expect_usage_error(bad_profile_args(TINY, batch="1e3"), "--global-batch")


@test
def error_unknown_flag():
    expect_usage_error(TINY_ARGS + ("--frobnicate", 3), "--frobnicate")
    expect_usage_error(TINY_ARGS + ("extra",), "extra")


@test
def error_missing_required_flag():
    pairs = [TINY_ARGS[i:i + 2] for i in range(0, len(TINY_ARGS), 2)]
    for i, (flag, _) in enumerate(pairs):
        args = tuple(a for j, p in enumerate(pairs) if j != i for a in p)
        expect_usage_error(args, flag)
    expect_usage_error(TINY_ARGS[:-1], "--global-batch")     # flag without its value


# -- re-instantiation ----------------------------------------------------------

def current_from_plan(out, nodes):
    """A CURRENT.json laid out as the coverage plan for `nodes`, nodes named node-00..."""
    entry = [c for c in out["coverage"] if c["nodes"] == nodes][0]
    pipes, i = [], 0
    for p in entry["pipelines"]:
        pipes.append({"nodes": ["node-%02d" % (i + j) for j in range(p["template_nodes"])]})
        i += p["template_nodes"]
    return {"pipelines": pipes}


def holders(out, current):
    """layer -> set of nodes of CURRENT that hold it (by the templates of their pipelines)."""
    temps = {t["nodes"]: t for t in feasible_templates(out)}
    res = {}
    for p in current["pipelines"]:
        for s in temps[len(p["nodes"])]["stages"]:
            for layer in range(s["layer_begin"], s["layer_end"]):
                res.setdefault(layer, set()).add(p["nodes"][s["node"]])
    return res


def reinstantiate(current_path, remove=(), add=(), base=TINY_ARGS):
    args = base + ("--current", current_path)
    if remove:
        args += ("--remove", ",".join(remove))
    if add:
        args += ("--add", ",".join(add))
    out = plan_json(*args)
    check("reinstantiation" in out, "--current given but no 'reinstantiation' in the output")
    return out, out["reinstantiation"]


def check_reinstantiation(base_out, current, removed, added, r, F, mb):
    old = [n for p in current["pipelines"] for n in p["nodes"]]
    alive = [n for n in old if n not in removed] + list(added)
    lost = sorted(l for l, h in holders(base_out, current).items() if not (h - set(removed)))
    n0 = base_out["n0"]
    check(bool(r.get("fatal")) == bool(lost), "fatal = %r, but the layers without a live holder "
          "are %s", r.get("fatal"), lost)
    insufficient = len(alive) < (F + 1) * n0
    check(bool(r.get("insufficient_nodes")) == insufficient,
          "insufficient_nodes = %r with %d nodes left, (F+1) n0 = %d",
          r.get("insufficient_nodes"), len(alive), (F + 1) * n0)
    if lost or insufficient:
        return
    temps = {t["nodes"] for t in feasible_templates(base_out)}
    pipes = r["pipelines"]
    check(len(pipes) >= F + 1, "%d pipelines after removing %s, fewer than F+1", len(pipes),
          removed)
    used = [n for p in pipes for n in p["nodes"]]
    check(len(used) == len(set(used)), "a node is in two pipelines: %s", used)
    check(sorted(used) == sorted(alive), "pipelines use %s, the live nodes are %s", sorted(used),
          sorted(alive))
    for p in pipes:
        check(len(p["nodes"]) in temps, "a pipeline of %d nodes has no template", len(p["nodes"]))
        check(p["microbatches"] >= 1, "a pipeline with %r microbatches", p["microbatches"])
    check(sum(p["microbatches"] for p in pipes) == mb, "microbatches sum to %d, want %d",
          sum(p["microbatches"] for p in pipes), mb)
    copies = json.dumps(r.get("copies", []))
    for n in removed:
        check('"%s"' % n not in copies, "the copy plan names removed node %s: %s", n, copies[:400])
    # where the copy plan's entries say {"layer": L, "from": NODE} (or "source"/"src"),
    # NODE must be a live node that held layer L
    held = holders(base_out, current)
    for d in walk_dicts(r.get("copies", [])):
        src = d.get("from", d.get("source", d.get("src")))
        if isinstance(d.get("layer"), int) and isinstance(src, str):
            check(src in held.get(d["layer"], ()) and src not in removed,
                  "copy of layer %d from %s, which did not hold it or is gone", d["layer"], src)


def walk_dicts(x):
    if isinstance(x, dict):
        yield x
        for v in x.values():
            yield from walk_dicts(v)
    elif isinstance(x, list):
        for v in x:
            yield from walk_dicts(v)


def copy_bytes(r):
    return sum(d["bytes"] for d in walk_dicts(r.get("copies", []))
               if isinstance(d.get("bytes"), int) and "layer" in d) or \
        sum(d["bytes"] for d in walk_dicts(r.get("copies", [])) if isinstance(d.get("bytes"), int))


@test
def reinstantiate_no_change():
    out = plan_json(*TINY_ARGS)
    cur = current_from_plan(out, 8)
    path = tmpfile("current-8.json", cur)
    _, r = reinstantiate(path)
    check_reinstantiation(out, cur, [], [], r, 1, 16)
    check(copy_bytes(r) == 0, "nothing changed, yet copies are planned: %s",
          json.dumps(r.get("copies"))[:400])


@test
def reinstantiate_every_single_failure():
    out = plan_json(*TINY_ARGS)
    cur = current_from_plan(out, 8)
    path = tmpfile("current-8.json", cur)
    for node in [n for p in cur["pipelines"] for n in p["nodes"]]:
        _, r = reinstantiate(path, remove=[node])
        try:
            check_reinstantiation(out, cur, [node], [], r, 1, 16)
        except Failure as e:
            raise Failure("removing %s: %s" % (node, e))


@test
def reinstantiate_every_double_failure():
    # A 4-pipeline example: 8 tiny nodes as four 2-node pipelines, F = 1.
    out = plan_json(*TINY_ARGS)
    cur = {"pipelines": [{"nodes": ["node-%02d" % (2 * i), "node-%02d" % (2 * i + 1)]}
                         for i in range(4)]}
    path = tmpfile("current-4x2.json", cur)
    names = [n for p in cur["pipelines"] for n in p["nodes"]]
    for pair in itertools.combinations(names, 2):
        _, r = reinstantiate(path, remove=list(pair))
        try:
            check_reinstantiation(out, cur, list(pair), [], r, 1, 16)
        except Failure as e:
            raise Failure("removing %s: %s" % (",".join(pair), e))


@test
def reinstantiate_fatal_when_a_layer_is_lost():
    out = plan_json(*TINY_ARGS)
    cur = {"pipelines": [{"nodes": ["node-%02d" % (2 * i), "node-%02d" % (2 * i + 1)]}
                         for i in range(4)]}
    path = tmpfile("current-4x2.json", cur)
    firsts = [p["nodes"][0] for p in cur["pipelines"]]    # every holder of layer 0
    _, r = reinstantiate(path, remove=firsts)
    check(r.get("fatal") is True, "all holders of layer 0 removed but fatal = %r", r.get("fatal"))


@test
def reinstantiate_insufficient_nodes():
    out = plan_json(*TINY_ARGS)
    cur = current_from_plan(out, 8)
    path = tmpfile("current-8.json", cur)
    names = [n for p in cur["pipelines"] for n in p["nodes"]]
    # keep one node of each of two pipelines' ... simply keep 3 nodes < (F+1) n0 = 4
    _, r = reinstantiate(path, remove=names[3:])
    check(r.get("insufficient_nodes") is True, "3 nodes left of (F+1) n0 = 4, "
          "insufficient_nodes = %r", r.get("insufficient_nodes"))


@test
def reinstantiate_add_nodes():
    out = plan_json(*TINY_ARGS)
    base = ("--profile", TINY, "--nodes", 10, "--tolerate", 1, "--global-batch", 64)
    out10 = plan_json(*base)
    cur = current_from_plan(out, 8)
    path = tmpfile("current-8.json", cur)
    _, r = reinstantiate(path, add=["node-new-a", "node-new-b"], base=base)
    check_reinstantiation(out10, cur, [], ["node-new-a", "node-new-b"], r, 1, 16)
    _, r = reinstantiate(path, remove=["node-00"], add=["node-new-a"], base=base)
    check_reinstantiation(out10, cur, ["node-00"], ["node-new-a"], r, 1, 16)


@test
def reinstantiate_deterministic():
    out = plan_json(*TINY_ARGS)
    path = tmpfile("current-8.json", current_from_plan(out, 8))
    args = [suite.pliant, "plan"] + [str(a) for a in TINY_ARGS] + ["--current", path, "--remove",
                                                             "node-01,node-05"]
    a = subprocess.run(args, cwd=REPO, stdout=subprocess.PIPE, timeout=120).stdout
    b = subprocess.run(args, cwd=REPO, stdout=subprocess.PIPE, timeout=120).stdout
    check(a == b and a, "two runs with --current/--remove differ (or print nothing)")


@test
def error_remove_unknown_node():
    out = plan_json(*TINY_ARGS)
    path = tmpfile("current-8.json", current_from_plan(out, 8))
    expect_usage_error(TINY_ARGS + ("--current", path, "--remove", "node-99"), "node-99")


@test
def error_bad_current():
    expect_usage_error(TINY_ARGS + ("--current", tmpfile("current-bad.json", "{\"pipelines\": [")),
                       ())
    expect_usage_error(TINY_ARGS + ("--current", tmpfile("current-nop.json", {"pipes": []})),
                       "pipelines")
    dup = {"pipelines": [{"nodes": ["a", "b"]}, {"nodes": ["b", "c"]}]}
    expect_usage_error(TINY_ARGS + ("--current", tmpfile("current-dup.json", dup)), "b")


@test
def error_remove_without_current():
    expect_usage_error(TINY_ARGS + ("--remove", "node-00"), ("--current", "--remove"))


# ---------------------------------------------------------------------------

if __name__ == "__main__":
    sys.exit(suite.main())
