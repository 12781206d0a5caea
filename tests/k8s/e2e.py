"""Process and API helpers for the operator's end-to-end tests
(tests/cli/test_operator_e2e.py), standard library only.

- Emulator: one tests/k8s/apiserver.py process (TLS + token where openssl is
  installed, fake kubelets), JSON requests to it, kubectl against its kubeconfig,
  the admin endpoints (/_emulator/faults, /_emulator/nodes, /_emulator/compact),
  and its --state-log (every object ever written).
- Operator: one build/bin/pliant-operator process, its stderr in a file, its
  /healthz, /readyz, /metrics and its jobs' dashboard pages.
- Recorder: a background list + watch of one resource (re-watch at the last
  resourceVersion, re-list on 410) that keeps every event it saw, so a test
  can look at the history of a job's status or of its Pods after the fact.
- Processes are stopped by pid (SIGTERM, then SIGKILL); stop_all() stops every
  process started here, operators first.
"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from client import ApiClient, E2EFailure, fail  # noqa: F401 (E2EFailure: for the test files)

HERE = os.path.dirname(os.path.abspath(__file__))
APISERVER = os.path.join(HERE, "apiserver.py")

_procs = []          # every Emulator / Operator started, for stop_all()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, n=40):
    """The last n lines of a file ('' when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def stop_pid(proc, grace=10.0):
    """SIGTERM the process (by pid), SIGKILL after grace seconds; its exit status."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
    return proc.returncode


def stop_all():
    """Operators first (so they do not see the API vanish), then emulators."""
    for p in [p for p in _procs if isinstance(p, Operator)] + [p for p in _procs if isinstance(p, Emulator)]:
        try:
            p.stop()
        except Exception as e:  # noqa: BLE001 -- cleanup must go on
            print("# cleanup of %s: %s" % (p, e), file=sys.stderr)
    del _procs[:]


def wait_for(what, fn, timeout=30.0, interval=0.1, alive=None):
    """fn() until it returns something true; E2EFailure after timeout seconds.
    alive: a function returning an error string when waiting is pointless (a
    process died), checked every round."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if alive:
            why = alive()
            if why:
                fail("while waiting for %s: %s", what, why)
        if time.monotonic() > deadline:
            fail("timed out after %.0f s waiting for %s", timeout, what)
        time.sleep(interval)


# ---------------------------------------------------------------------------

class Emulator(ApiClient):
    """apiserver.py --kubelet; args are extra flags (e.g. --nodes 4)."""

    def __init__(self, workdir, args=(), kubectl="kubectl", token="e2e-token", tls=True):
        self.dir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.kubeconfig = os.path.join(workdir, "kubeconfig")
        self.state_log = os.path.join(workdir, "state.jsonl")
        self.stderr_path = os.path.join(workdir, "apiserver.stderr")
        self.token = token if tls else None
        cmd = [sys.executable, APISERVER, "--port", "0", "--kubeconfig", self.kubeconfig, "--work-dir", workdir,
               "--state-log", self.state_log] + list(args)
        if tls:
            cmd += ["--tls", "--token", token]
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._err, stdin=subprocess.DEVNULL)
        _procs.append(self)
        line = self._readline(30)
        if not line.startswith("listening "):
            self.stop()
            fail("apiserver.py printed %r, want 'listening URL'\n%s", line, tail(self.stderr_path))
        ApiClient.__init__(self, line.split()[1], self.token, os.path.join(workdir, "ca.pem") if tls else None,
                           self.kubeconfig, kubectl, workdir)

    def __repr__(self):
        return "emulator pid %d" % self.proc.pid

    def _readline(self, timeout):
        out = []

        def read():
            out.append(self.proc.stdout.readline().decode(errors="replace"))
        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        return out[0] if out else ""

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        rc = stop_pid(self.proc)
        self._err.close()
        return rc

    def stderr_tail(self, n=30):
        return tail(self.stderr_path, n)

    # -- admin endpoints

    def faults(self, method="GET", body=None):
        return self.ok(method, "/_emulator/faults", body)["faults"]

    def states(self):
        """Every write so far: the --state-log records."""
        out = []
        try:
            with open(self.state_log) as f:
                for line in f:
                    if line.strip():
                        try:
                            out.append(json.loads(line))
                        except ValueError:
                            pass    # a line being written
        except OSError:
            pass
        return out


# ---------------------------------------------------------------------------

class Operator:
    """build/bin/pliant-operator with --metrics-addr / --health-addr / --dashboard-addr on
    free ports."""

    def __init__(self, binary, emulator, workdir, name="operator", args=()):
        self.binary, self.name = binary, name
        os.makedirs(workdir, exist_ok=True)
        self.stderr_path = os.path.join(workdir, name + ".stderr")
        self.metrics_port, self.health_port, self.dashboard_port = free_port(), free_port(), free_port()
        self.cmd = [binary, "--kubeconfig", emulator.kubeconfig, "--metrics-addr",
                    "127.0.0.1:%d" % self.metrics_port, "--health-addr", "127.0.0.1:%d" % self.health_port,
                    "--dashboard-addr", "127.0.0.1:%d" % self.dashboard_port, "--log-level", "debug"] + list(args)
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self._err, stderr=self._err,
                                     cwd=workdir)
        self.killed = False      # killed or stopped on purpose: dead() does not complain
        _procs.append(self)

    def __repr__(self):
        return "%s pid %d" % (self.name, self.proc.pid)

    def dead(self):
        """None while it runs, else why it is not running (for wait_for's alive)."""
        rc = self.proc.poll()
        if rc is None or self.killed:
            return None
        return "%s exited with status %s; its stderr ends:\n%s" % (self.name, rc, self.stderr_tail(25))

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        """SIGKILL (leader failover)."""
        self.killed = True
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self):
        self.killed = True
        rc = stop_pid(self.proc)
        self._err.close()
        return rc

    def stderr_tail(self, n=30):
        return tail(self.stderr_path, n)

    def http(self, port, path, timeout=5):
        """(status, body text), (0, error) when nothing answers."""
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read().decode(errors="replace")
            conn.close()
            return resp.status, body
        except (OSError, http.client.HTTPException) as e:
            return 0, str(e)

    def health(self, path):
        return self.http(self.health_port, path)

    def dashboard(self, path):
        return self.http(self.dashboard_port, path)

    def metrics(self):
        """{(name, frozenset(labels.items())): value} of the Prometheus text at /metrics."""
        code, body = self.http(self.metrics_port, "/metrics")
        if code != 200:
            fail("%s /metrics: %s %s", self.name, code, body[:300])
        return parse_prometheus(body), body


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text):
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            fail("/metrics: not a Prometheus sample line: %r", line)
        labels = frozenset(_LABEL.findall(m.group(2) or ""))
        try:
            value = float(m.group(3))
        except ValueError:
            fail("/metrics: bad value in %r", line)
        out[(m.group(1), labels)] = value
    return out


def metric_sum(samples, name, **labels):
    """Sum of the samples of one metric whose labels include the given ones (None if none)."""
    vals = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    return sum(vals) if vals else None


def worker_pod_problems(pod):
    """What makes a worker Pod fail Pod Security "restricted" or mount more than a worker
    reads (the Secret's token, ca.crt and job.yaml, an emptyDir at /tmp): [] when nothing."""
    spec = pod["spec"]
    c = spec["containers"][0]
    psc, sc = spec.get("securityContext") or {}, c.get("securityContext") or {}
    out = []
    if not (psc.get("runAsNonRoot") is True and psc.get("runAsUser") == 65532 and
            psc.get("seccompProfile") == {"type": "RuntimeDefault"}):
        out.append("Pod securityContext %s" % psc)
    if not (sc.get("allowPrivilegeEscalation") is False and sc.get("capabilities") == {"drop": ["ALL"]} and
            sc.get("readOnlyRootFilesystem") is True):
        out.append("container securityContext %s" % sc)
    if spec.get("automountServiceAccountToken") is not False:
        out.append("automountServiceAccountToken %s" % spec.get("automountServiceAccountToken"))
    vols = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    secret = vols[mounts["/etc/pliant"]["name"]]["secret"] if "/etc/pliant" in mounts else {}
    if sorted(i["key"] for i in secret.get("items") or []) != ["ca.crt", "job.yaml", "token"] or \
            secret.get("defaultMode") not in (0o400, 0o440):
        out.append("Secret volume %s (want token, ca.crt, job.yaml only)" % secret)
    if "/tmp" not in mounts or "emptyDir" not in vols[mounts["/tmp"]["name"]]:
        out.append("no emptyDir at /tmp: %s" % mounts)
    return out


# ---------------------------------------------------------------------------

class Recorder:
    """Lists then watches PATH (a collection URL, e.g. /api/v1/pods) in a thread and
    keeps every (monotonic time, type, object); re-watches from the last
    resourceVersion when a stream ends, re-lists after a 410."""

    def __init__(self, emulator, path):
        self.emu, self.path = emulator, path
        self.events = []
        self.lock = threading.Lock()
        self.stopped = False
        self.errors = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def stop(self):
        self.stopped = True

    def _record(self, typ, obj):
        with self.lock:
            self.events.append((time.monotonic(), typ, obj))

    def _run(self):
        rv = None
        while not self.stopped and self.emu.alive():
            try:
                if rv is None:
                    code, lst = self.emu.request("GET", self.path)
                    if code != 200:
                        raise OSError("list: %d" % code)
                    for obj in lst.get("items", []):
                        self._record("LISTED", obj)
                    rv = lst["metadata"]["resourceVersion"]
                rv = self._watch(rv)
            except (OSError, ValueError, KeyError, http.client.HTTPException):
                self.errors += 1
                time.sleep(0.2)

    def _watch(self, rv):
        conn = self.emu.connection(timeout=30)
        sep = "&" if "?" in self.path else "?"
        conn.request("GET", self.path + sep + "watch=1&allowWatchBookmarks=true&timeoutSeconds=20&resourceVersion="
                     + rv, headers={"Authorization": "Bearer " + self.emu.token} if self.emu.token else {})
        resp = conn.getresponse()
        if resp.status == 410:
            conn.close()
            return None
        if resp.status != 200:
            conn.close()
            raise OSError("watch: %d" % resp.status)
        try:
            for line in resp:
                if self.stopped:
                    break
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev["type"] == "ERROR":
                    return None                       # 410 Expired: re-list
                rv = ev["object"]["metadata"]["resourceVersion"]
                if ev["type"] != "BOOKMARK":
                    self._record(ev["type"], ev["object"])
        finally:
            conn.close()
        return rv

    def objects(self, pred=lambda o: True):
        """[(t, type, object)] seen so far whose object matches pred."""
        with self.lock:
            return [e for e in self.events if pred(e[2])]

    def names(self, pred=lambda o: True):
        """Names of the objects seen, in order of first appearance."""
        seen = []
        for _, _, o in self.objects(pred):
            if o["metadata"]["name"] not in seen:
                seen.append(o["metadata"]["name"])
        return seen
