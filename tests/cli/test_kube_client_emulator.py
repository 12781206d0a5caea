#!/usr/bin/env python3
"""The operator's Kubernetes client (operator/k8s/kube_*.c) against the API emulator
(tests/k8s/apiserver.py) over TLS with a bearer token: `build/tests/test_kube_client
--kubeconfig KUBECONFIG` runs its emulator tests (CRUD, AlreadyExists and Conflict
Statuses, the 409 retry under injected conflicts, merge and JSON patches, the
/status subresource, Events, a 503 fault with Retry-After waited out, and a watch thread through bookmarks,
an expiring watch and a forced compaction's 410 until it is stopped). Each run gets
a fresh emulator; the sanitized build is run too when it exists. The C program's
result lines are passed on, prefixed with "kube_client_emulator." (and "asan/").

Run: python3 tests/cli/test_kube_client_emulator.py --build build
"""

import argparse
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EMULATOR = os.path.join(REPO, "tests", "k8s", "apiserver.py")
PREFIX = "kube_client_emulator."
RESULT_RE = re.compile(r"^(ok|FAIL|skip) (\S+?):?(?: (.*))?$")
ASAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}


def start_emulator(tmp):
    """A fresh emulator writing tmp/kubeconfig; (process, None) or (None, why)."""
    kubeconfig = os.path.join(tmp, "kubeconfig")
    argv = [sys.executable, EMULATOR, "--port", "0", "--kubeconfig", kubeconfig,
            "--token", "test-token", "--bookmark-seconds", "0.3"]
    if shutil.which("openssl"):
        argv.append("--tls")
    log = open(os.path.join(tmp, "emulator.log"), "wb")
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=log)
    log.close()
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline().decode(errors="replace") if ready else ""
    if not line.startswith("listening "):
        stop_emulator(proc)
        with open(os.path.join(tmp, "emulator.log"), errors="replace") as f:
            return None, "the emulator did not start: %r %s" % (line, f.read()[-400:])
    return proc, None


def stop_emulator(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stdout.close()


def run_binary(binary, label, env):
    """Runs binary against a fresh emulator, printing its result lines; failures."""
    with tempfile.TemporaryDirectory(prefix="pliant-kube-client-") as tmp:
        proc, why = start_emulator(tmp)
        if not proc:
            print("    " + why)
            print("FAIL %s%semulator" % (PREFIX, label))
            return 1
        try:
            p = subprocess.run([binary, "--kubeconfig", os.path.join(tmp, "kubeconfig")],
                               cwd=REPO, env=dict(os.environ, **env), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
            out, rc = p.stdout.decode(errors="replace"), p.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = (e.output or b"").decode(errors="replace") + "\n(timed out)", None
        finally:
            stop_emulator(proc)
    failures, results = 0, 0
    for line in out.splitlines():
        m = RESULT_RE.match(line)
        if not m:
            print(line if line.startswith("    ") else "    " + line)
            continue
        results += 1
        failures += m.group(1) == "FAIL"
        print("%s %s%s%s%s" % (m.group(1), PREFIX, label, m.group(2),
                               ": " + m.group(3) if m.group(3) else ""))
    if rc != 0 and not failures or not results:
        print("    %s exited with %s" % (binary, rc))
        print("FAIL %s%srun" % (PREFIX, label))
        failures += 1
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    build = args.build if os.path.isabs(args.build) else os.path.join(REPO, args.build)
    failures = 0
    for sub, label, env in (("tests", "", {}), (os.path.join("asan", "tests"), "asan/", ASAN_ENV)):
        binary = os.path.join(build, sub, "test_kube_client")
        if not os.access(binary, os.X_OK):
            print("skip %s%sall: %s not built" % (PREFIX, label, binary))
        elif not os.path.exists(EMULATOR):
            print("skip %s%sall: %s not found" % (PREFIX, label, EMULATOR))
        else:
            failures += run_binary(binary, label, env)
        sys.stdout.flush()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
