#!/usr/bin/env python3
"""Runs the fuzz targets of tests/fuzz/ and reports in the test runner's line protocol.

    python3 tests/fuzz/run_fuzz.py --build build [--seconds S] [--long] [--replay] [TARGET...]

TARGET is a target's name (fuzz_protocol, ...); none means every tests/fuzz/fuzz_*.c.
For each target it prints "ok TARGET" or "FAIL TARGET: why" (after indented detail lines),
or "skip TARGET: why" when neither of its binaries is built:

  - with the libFuzzer build (BUILD/fuzz/bin/TARGET), it fuzzes for S seconds
    (-max_total_time) starting from the committed corpus tests/fuzz/corpus/TARGET/ and the
    dictionary tests/fuzz/TARGET.dict when there is one. New inputs go to a temporary
    directory that is deleted afterwards, or, with --long (`make fuzz`), to
    BUILD/fuzz/corpus/TARGET/, which is kept and read again by the next --long run.
    A crash, leak, timeout or out-of-memory input is written to BUILD/fuzz/crashes/TARGET/
    and the FAIL line names that reproducer;
  - otherwise (no clang, or --replay) the replayer BUILD/fuzz/replay/TARGET runs every
    corpus input once under ASan + UBSan; the FAIL line names the input it crashed on.

Exit status 1 when a target failed. Standard library only.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUZZ_DIR = os.path.join(REPO, "tests", "fuzz")
CORPUS = os.path.join(FUZZ_DIR, "corpus")

# Targets that start from another target's seeds as well as their own.
SHARED_SEEDS = {"fuzz_protocol_roundtrip": ["fuzz_protocol"]}

ARTIFACT_RE = re.compile(r"Test unit written to (\S+)")
RUNNING_RE = re.compile(r"^running: (.+)$")
STATS_RE = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+)")
SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
TAIL = 30


def targets():
    return sorted(n[:-2] for n in os.listdir(FUZZ_DIR) if n.startswith("fuzz_") and n.endswith(".c"))


def seed_dirs(name):
    dirs = [os.path.join(CORPUS, d) for d in [name] + SHARED_SEEDS.get(name, [])]
    return [d for d in dirs if os.path.isdir(d)]


def run(argv, timeout):
    env = dict(os.environ)
    env.update(SAN_ENV)
    try:
        p = subprocess.run(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace").splitlines()
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace").splitlines()
        return None, out + ["(killed after %d s)" % timeout]


def fail(name, why, lines):
    for line in lines[-TAIL:]:
        print("    | " + line)
    print("FAIL %s: %s" % (name, why))


def libfuzzer(name, binary, build, seconds, long_run):
    crashes = os.path.join(build, "fuzz", "crashes", name)
    os.makedirs(crashes, exist_ok=True)
    if long_run:
        work = os.path.join(build, "fuzz", "corpus", name)
        os.makedirs(work, exist_ok=True)
    else:
        work = tempfile.mkdtemp(prefix=name + ".", dir=os.path.join(build, "fuzz"))
    argv = [binary, "-max_total_time=%d" % seconds, "-timeout=10", "-rss_limit_mb=2048",
            "-max_len=8192", "-print_final_stats=1", "-artifact_prefix=%s/" % crashes]
    dictionary = os.path.join(FUZZ_DIR, name + ".dict")
    if os.path.isfile(dictionary):
        argv.append("-dict=" + dictionary)
    before = len(os.listdir(work))
    try:
        rc, lines = run(argv + [work] + seed_dirs(name), seconds + 120)
        added = len(os.listdir(work)) - before
    finally:
        if not long_run:
            shutil.rmtree(work, ignore_errors=True)
    artifacts = [m.group(1) for m in map(ARTIFACT_RE.search, lines) if m]
    if rc == 0:
        runs = [m for m in map(STATS_RE.search, lines) if m]
        execs = [l for l in lines if l.startswith("stat::number_of_executed_units")]
        print("    %s: %s executions in %d s%s%s" % (
            name, execs[-1].split(":")[-1].strip() if execs else "?", seconds,
            ", coverage %s" % runs[-1].group(2) if runs else "",
            ", %d new inputs in %s" % (added, os.path.relpath(work, REPO)) if long_run else ""))
        print("ok " + name)
        return True
    why = "exit status %s" % rc if rc is not None else "did not finish"
    if artifacts:
        why = "crash, reproducer %s (replay: %s %s)" % (
            os.path.relpath(artifacts[-1], REPO), os.path.relpath(binary, REPO),
            os.path.relpath(artifacts[-1], REPO))
    fail(name, why, lines)
    return False


def replay(name, binary):
    dirs = seed_dirs(name)
    if not dirs:
        print("skip %s: no corpus in %s" % (name, os.path.relpath(CORPUS, REPO)))
        return True
    rc, lines = run([binary] + dirs, 300)
    if rc == 0:
        print("    " + (lines[-1] if lines else name))
        print("ok " + name)
        return True
    inputs = [m.group(1) for m in map(RUNNING_RE.match, lines) if m]
    why = "exit status %s" % rc if rc is not None else "did not finish"
    if inputs:
        why = "crash on %s" % os.path.relpath(inputs[-1], REPO)
    fail(name, why, lines)
    return False


def main():
    ap = argparse.ArgumentParser(description="Run Pliant's fuzz targets.")
    ap.add_argument("--build", default="build", help="build directory (default: build)")
    ap.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_TEST_SECONDS", 4)),
                    help="fuzzing time per target (default: $FUZZ_TEST_SECONDS or 4)")
    ap.add_argument("--long", action="store_true",
                    help="keep new inputs in BUILD/fuzz/corpus/TARGET/ (make fuzz)")
    ap.add_argument("--replay", action="store_true",
                    help="only replay the corpus, even where the libFuzzer build exists")
    ap.add_argument("targets", nargs="*", help="targets to run (default: all)")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    names = args.targets or targets()
    ok = True
    for name in names:
        fuzzer = os.path.join(build, "fuzz", "bin", name)
        replayer = os.path.join(build, "fuzz", "replay", name)
        if os.access(fuzzer, os.X_OK) and not args.replay:
            ok &= libfuzzer(name, fuzzer, build, args.seconds, args.long)
        elif os.access(replayer, os.X_OK):
            ok &= replay(name, replayer)
        else:
            print("skip %s: not built (make fuzz-targets)" % name)
        sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
