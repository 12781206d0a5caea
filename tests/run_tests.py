#!/usr/bin/env python3
"""Pliant's test runner: `make test` calls `python3 tests/run_tests.py --build build`.

It runs, in this order:
  1. every unit-test binary BUILD/tests/test_*,
  2. the exactness tests (EXACTNESS_TESTS: splits of the model equal the whole model bit
     for bit, kernels against references) again under every OpenBLAS kernel set this
     CPU can execute (OPENBLAS_CORETYPE; names prefixed "openblas-<core>/"): OpenBLAS
     picks different sgemm kernels, with different blockings, on different machines,
     and the exactness must hold for each,
  3. the unit tests built under AddressSanitizer + UBSan, BUILD/asan/tests/test_*
     (their test names are prefixed with "asan/"),
  4. every fuzz target of tests/fuzz/ that is built (BUILD/fuzz/bin/ with libFuzzer, else its
     corpus replayer BUILD/fuzz/replay/), through tests/fuzz/run_fuzz.py: a few seconds of
     fuzzing from the committed corpus each, or one pass over the corpus (names "fuzz/..."),
  5. every command-line test script tests/cli/test_*.py, as `python3 FILE --build BUILD`.

Every program speaks one line protocol on its output (tests/unit/check.h):
  "ok NAME"              a test passed
  "FAIL NAME" or "FAIL NAME: why"
                         a test failed; the indented lines printed before it (since
                         the previous result line) are its details
  "skip NAME: why"       a test was skipped (e.g. it needs something not built yet)
Any other line is context. A program that crashes, times out, or exits non-zero
without printing a FAIL line counts as one failed test named after the program; the
tail of its output is shown. A program that prints no result line at all also fails.

The last line printed is exactly "N passed, N failed" (with ", N skipped" when some
were skipped); the exit status is 1 when anything failed, else 0. Standard library only.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ASAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}

# The unit tests whose assertions are bit-exact comparisons between code paths that
# multiply matrices with OpenBLAS.
EXACTNESS_TESTS = ("test_kernels_cpu", "test_engine", "test_stage", "test_stage_eval",
                   "test_stage_link", "test_worker_step", "test_xport_step", "test_layer_copy",
                   "test_llmc_parity")

# OpenBLAS 0.3.21's x86-64 kernel sets and the CPU flags (/proc/cpuinfo) each needs.
OPENBLAS_CORES = (
    ("Prescott", {"pni"}),
    ("Sandybridge", {"avx"}),
    ("Haswell", {"avx2", "fma"}),
    ("Zen", {"avx2", "fma"}),
    ("SkylakeX", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}),
    ("Cooperlake", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}),
)
CORE_RE = re.compile(r"^Core: (\S+)")

# Programs that need more than --timeout when the machine is busy: the test cluster's
# end-to-end file trains and breaks jobs for about 3 minutes on 2 idle cores.
LONG_PROGRAMS = {"cli/test_cluster_e2e": 600}

RESULT_RE = re.compile(r"^(ok|FAIL|skip)\s+(\S+?):?(?:\s+(.*))?$")
TAIL_LINES = 40


class Program:
    """One test program and what its run produced."""

    def __init__(self, label, argv, prefix="", env=None, core=None):
        self.label = label          # shown in progress lines and synthetic failure names
        self.argv = argv
        self.prefix = prefix        # prepended to every test name it reports
        self.env = env or {}
        self.core = core            # the OpenBLAS kernel set it must run with, or None
        self.passed = []            # names
        self.failed = []            # (name, [detail lines])
        self.skipped = []           # (name, reason)
        self.seconds = 0.0


def signal_name(rc):
    try:
        return signal.Signals(-rc).name
    except (ValueError, AttributeError):
        return "signal %d" % -rc


def tail(lines, n=TAIL_LINES):
    lines = [l for l in lines]
    if len(lines) > n:
        return ["... (%d earlier lines)" % (len(lines) - n)] + lines[-n:]
    return lines


def run_program(prog, timeout):
    env = dict(os.environ)
    env.update(prog.env)
    start = time.monotonic()
    timed_out = False
    try:
        # Own session, so that a timed-out program is ended with everything it started.
        proc = subprocess.Popen(prog.argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            raw, _ = proc.communicate(timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            raw, _ = proc.communicate()
            rc, timed_out = None, True
    except OSError as e:
        raw, rc = ("cannot run %s: %s\n" % (prog.argv[0], e)).encode(), 127
    prog.seconds = time.monotonic() - start

    lines = raw.decode("utf-8", errors="replace").splitlines()
    if prog.core:
        cores = [m.group(1) for m in map(CORE_RE.match, lines) if m]
        if cores[:1] != [prog.core]:
            # this OpenBLAS lacks the kernel set and chose another one: nothing new to test
            prog.skipped.append((prog.label, "OpenBLAS ran %s kernels, not %s"
                                 % (cores[0] if cores else "unknown", prog.core)))
            return prog
    context = []   # non-result lines since the previous result line
    for line in lines:
        m = RESULT_RE.match(line.rstrip())
        if not m:
            context.append(line)
            continue
        kind, name, rest = m.group(1), prog.prefix + m.group(2), m.group(3) or ""
        if kind == "ok":
            prog.passed.append(name)
        elif kind == "FAIL":
            detail = [l for l in context if l.strip()]
            if rest:
                detail.append("    " + rest)
            prog.failed.append((name, detail))
        else:
            prog.skipped.append((name, rest))
        context = []

    # Failures of the program itself, beyond what its FAIL lines report.
    why = None
    if timed_out:
        why = "timed out after %d s" % timeout
    elif rc is not None and rc < 0:
        why = "killed by %s" % signal_name(rc)
    elif rc not in (0, None) and not prog.failed:
        why = "exited with status %d without a FAIL line" % rc
    elif rc == 0 and not (prog.passed or prog.failed or prog.skipped):
        why = "printed no test result"
    if why:
        shown = ["    | " + l for l in tail(lines)] or ["    | (no output)"]
        prog.failed.append((prog.label, ["    %s; last output:" % why] + shown))
    return prog


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def openblas_cores():
    """The OpenBLAS kernel sets this CPU can execute (none off x86-64)."""
    flags = cpu_flags()
    return [name for name, need in OPENBLAS_CORES if need <= flags]


def unit_programs(d, prefix, env):
    progs = []
    if not os.path.isdir(d):
        return progs
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        if (name.startswith("test_") and os.path.isfile(path) and os.access(path, os.X_OK)
                and "." not in name):
            progs.append(Program(prefix + name, [os.path.abspath(path)], prefix, env))
    return progs


def fuzz_programs(build):
    """One program per fuzz target with a binary built (tests/fuzz/run_fuzz.py picks it)."""
    fuzz = os.path.join(REPO, "tests", "fuzz")
    if not os.path.isdir(fuzz):
        return []
    progs = []
    for name in sorted(os.listdir(fuzz)):
        target = name[:-2]
        if not (name.startswith("fuzz_") and name.endswith(".c")):
            continue
        if any(os.access(os.path.join(build, "fuzz", kind, target), os.X_OK)
               for kind in ("bin", "replay")):
            progs.append(Program("fuzz/" + target,
                                 [sys.executable, os.path.join(fuzz, "run_fuzz.py"),
                                  "--build", build, target]))
    return progs


def discover(build, pattern_filter):
    progs = unit_programs(os.path.join(build, "tests"), "", {})
    for core in openblas_cores():
        prefix = "openblas-%s/" % core
        env = {"OPENBLAS_CORETYPE": core, "OPENBLAS_VERBOSE": "2"}
        progs += [Program(prefix + p.label, p.argv, prefix, env, core)
                  for p in progs if p.label in EXACTNESS_TESTS]
    progs += unit_programs(os.path.join(build, "asan", "tests"), "asan/", ASAN_ENV)
    progs += fuzz_programs(build)
    cli = os.path.join(REPO, "tests", "cli")
    if os.path.isdir(cli):
        for name in sorted(os.listdir(cli)):
            if name.startswith("test_") and name.endswith(".py"):
                progs.append(Program("cli/" + name[:-3],
                                     [sys.executable, os.path.join(cli, name), "--build", build]))
    if pattern_filter:
        progs = [p for p in progs if any(f in p.label for f in pattern_filter)]
    return progs


def main():
    ap = argparse.ArgumentParser(description="Run Pliant's unit, sanitizer and CLI tests.")
    ap.add_argument("--build", default="build", help="build directory (default: build)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per program (default: 300)")
    ap.add_argument("-k", "--filter", action="append", default=[],
                    help="run only programs whose label contains this text (repeatable)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every test's result line")
    args = ap.parse_args()

    build = os.path.abspath(args.build)
    progs = discover(build, args.filter)
    if not progs:
        print("run_tests: no test programs found under %s/tests, %s/asan/tests or tests/cli"
              % (build, build))

    passed = failed = skipped = 0
    failures = []
    for prog in progs:
        run_program(prog, max(args.timeout, LONG_PROGRAMS.get(prog.label, 0)))
        passed += len(prog.passed)
        failed += len(prog.failed)
        skipped += len(prog.skipped)
        failures.extend((n if n == prog.label else "%s (%s)" % (n, prog.label), d)
                        for n, d in prog.failed)
        status = "FAIL" if prog.failed else "ok"
        extra = ", %d skipped" % len(prog.skipped) if prog.skipped else ""
        print("%-4s %-40s %3d passed, %d failed%s  (%.1f s)"
              % (status, prog.label, len(prog.passed), len(prog.failed), extra, prog.seconds))
        if args.verbose:
            for n in prog.passed:
                print("       ok " + n)
            for n, why in prog.skipped:
                print("       skip %s: %s" % (n, why))
        sys.stdout.flush()

    skips = [("%s (%s)" % (n, p.label), why) for p in progs for n, why in p.skipped]
    if skips:
        print("\nskipped:")
        for n, why in skips:
            print("  %s: %s" % (n, why))
    if failures:
        print("\nfailures:")
        for n, detail in failures:
            print("FAIL " + n)
            for line in detail:
                print(line if line.startswith(" ") else "    " + line)
    print()
    line = "%d passed, %d failed" % (passed, failed)
    if skipped:
        line += ", %d skipped" % skipped
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
