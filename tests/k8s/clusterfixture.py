"""The test cluster (cluster.py) as the fixture of a test file
(tests/cli/test_cluster.py, tests/cli/test_cluster_e2e.py), standard library only.

- Fixture(prefix, tmp, build, ...): one cluster per file, brought up by the first
  test that asks for it (`cluster.py up` with a name from the pid and a free
  10.X.0.0/16) in the file's temporary directory, and brought down by down(),
  which the file calls before that directory goes. The chart's operator is
  installed unless operator=False.
- Requests the tests repeat: namespaces, objects, Pods, their phases and logs,
  nodes added and broken (`cluster.py node`), a Pod's processes and the files it
  sees (its sandbox's mount namespace), a Pod's memory cgroup, and its memory
  exhausted (oom_kill: the kernel OOM-kills the container).
- TrainingJobs: a Recorder of every job's status, the history of one job's
  status, wait_status (fails early on Failed, a stuck step or a dead operator),
  Events, and the operator Pods' logs.

Errors are E2EFailure; up() raises Unavailable (a subclass) where the machine
cannot make the cluster, which a test file reports as a skip.
"""

import json
import os
import re
import subprocess
import sys
import time

import cgroups
import clustermode
import e2e
import netns
from client import ApiClient, E2EFailure, fail

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER_PY = os.path.join(HERE, "cluster.py")
TJ = "/apis/pliant.dev/v1alpha1"
OPERATOR_NS = "pliant"
OPERATOR_SELECTOR = "app.kubernetes.io/name%3Dpliant-operator"


class Unavailable(E2EFailure):
    """This machine cannot make the cluster (the reason is the message)."""


def free_subnet():
    """A 10.X.0.0/16 no address or route of this machine touches."""
    for x in range(200, 250):
        if not netns.conflicts("10.%d.0.0/16" % x):
            return "10.%d.0.0/16" % x
    raise Unavailable("no free 10.X.0.0/16 for the cluster's bridge")


class Fixture:
    def __init__(self, prefix, nodes=3, zones="a,b", grace=4, toleration=4, operator=True):
        self.name = "%s%d" % (prefix, os.getpid() % 10000)
        self.nodes, self.zones, self.grace, self.toleration = nodes, zones, grace, toleration
        self.operator = operator
        self.api = self.info = self.dir = self.up_proc = None
        self.broken = self.skip = None
        self.jobs = None          # a Recorder of every TrainingJob, once up

    # -- up and down

    def up(self, tmp, build):
        """The cluster's ApiClient, bringing it up the first time."""
        if self.skip:
            raise Unavailable(self.skip)
        if self.broken:
            fail("%s", self.broken)
        if self.api:
            return self.api
        why = clustermode.missing(self.name)
        if why:
            self.skip = "this machine cannot make the cluster: " + why
            raise Unavailable(self.skip)
        self.dir = os.path.join(tmp, "state")
        self.subnet = free_subnet()
        args = ["up", "--name", self.name, "--subnet", self.subnet, "--nodes", self.nodes, "--zones", self.zones,
                "--state", self.dir, "--node-monitor-grace-period", self.grace, "--default-toleration-seconds",
                self.toleration, "--timeout", 90, "--build", build]
        p = self.run(*(args + ([] if self.operator else ["--no-operator"])), timeout=150)
        if p.returncode == 2:
            self.skip = p.stderr.strip()
            raise Unavailable(self.skip)
        self.up_proc = p
        if p.returncode != 0:
            self.broken = "cluster.py up: exit %d\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
            fail("%s", self.broken)
        with open(os.path.join(self.dir, "cluster.json")) as f:
            self.info = json.load(f)
        self.api = ApiClient(self.info["url"], self.info["token"], self.info["ca"], self.info["kubeconfig"],
                             workdir=self.dir)
        if self.operator:
            self.jobs = e2e.Recorder(self.api, TJ + "/trainingjobs")
        return self.api

    def down(self):
        """cluster.py down (once; also when a test failed before the last one)."""
        if self.jobs:
            self.jobs.stop()
        if self.dir and os.path.exists(os.path.join(self.dir, "cluster.json")):
            p = self.run("down", "--state", self.dir, timeout=120)
            self.api, self.skip = None, "the cluster is down"
            return p
        return None

    def run(self, *args, timeout=120):
        return subprocess.run([sys.executable, CLUSTER_PY] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, text=True)

    # -- requests

    def ok(self, method, path, body=None, **kw):
        return self.api.ok(method, path, body, **kw)

    def namespace(self, name, labels=None):
        code, _ = self.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}})
        if code not in (201, 409):
            fail("namespace %s: %d", name, code)
        e2e.wait_for("the default ServiceAccount of " + name,
                     lambda: self.api.get("/api/v1/namespaces/%s/serviceaccounts/default" % name), 30, 0.2)

    def create(self, ns, obj, plural="pods", base="/api/v1"):
        return self.ok("POST", "%s/namespaces/%s/%s" % (base, ns, plural), obj)

    def claim(self, ns, name, files=()):
        """A PersistentVolumeClaim; its directory on this machine once it exists, with
        files (paths) copied in."""
        self.create(ns, {"metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteMany"], "resources": {
            "requests": {"storage": "1Gi"}}}}, "persistentvolumeclaims")
        path = self.claim_dir(ns, name)
        e2e.wait_for("the claim %s/%s's directory" % (ns, name), lambda: os.path.isdir(path), 10, 0.1)
        for src in files:
            with open(src, "rb") as f, open(os.path.join(path, os.path.basename(src)), "wb") as g:
                g.write(f.read())
        return path

    def claim_dir(self, ns, name):
        return os.path.join(self.dir, "work", "pvc", ns, name)

    def pod(self, ns, name):
        return self.api.get("/api/v1/namespaces/%s/pods/%s" % (ns, name))

    def pods(self, ns, selector=""):
        q = "?labelSelector=" + selector.replace("=", "%3D") if selector else ""
        return self.ok("GET", "/api/v1/namespaces/%s/pods%s" % (ns, q))["items"]

    def wait_phase(self, ns, name, phases=("Succeeded",), timeout=30):
        def done():
            p = self.pod(ns, name)
            return p if p and p.get("status", {}).get("phase") in phases + ("Failed",) else None
        pod = e2e.wait_for("pod %s/%s %s" % (ns, name, "/".join(phases)), done, timeout, 0.2)
        if pod["status"]["phase"] not in phases:
            fail("pod %s/%s is %s: %s\n%s", ns, name, pod["status"]["phase"],
                 json.dumps(pod["status"].get("containerStatuses")), self.log(ns, name))
        return pod

    def wait_ready(self, ns, name, timeout=30):
        return e2e.wait_for("pod %s/%s ready" % (ns, name), lambda: (lambda p: p if p and any(
            c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))
            else None)(self.pod(ns, name)), timeout, 0.2)

    def log(self, ns, name):
        return self.api.text("/api/v1/namespaces/%s/pods/%s/log" % (ns, name))

    def node_action(self, node, action, *extra):
        p = self.run("node", node, action, "--state", self.dir, *extra)
        if p.returncode != 0:
            fail("cluster.py node %s %s: %s %s", node, action, p.stdout, p.stderr)
        return json.loads(p.stdout)

    def node_ready(self, node):
        n = self.api.get("/api/v1/nodes/" + node)
        return next((c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready"), None) if n else None

    def add_node(self, name, zone="b", labels=None):
        self.ok("POST", "/_emulator/nodes", {"name": name, "zone": zone, "labels": labels or {}})
        e2e.wait_for("node %s Ready" % name, lambda: self.node_ready(name) == "True", 30, 0.2)

    def requests(self, since=0):
        """The API server's request log since index `since`: (records, count)."""
        out = self.ok("GET", "/_emulator/requests?since=%d" % since)
        return out["requests"], out["count"]

    # -- a Pod from this machine's side

    def pod_pids(self, ns, name):
        """The processes of the Pod's container, its init first (the sandbox's PID 1)."""
        pod = self.pod(ns, name) or {}
        cid = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("containerID", "")
        if "//" not in cid:
            fail("pod %s/%s has no process: %r", ns, name, cid)
        out, todo = [], [int(cid.split("//")[1])]
        while todo:
            pid = todo.pop(0)
            out.append(pid)
            try:
                with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
        return out[1:]                           # the first is unshare, outside the namespaces

    def in_pod(self, ns, name, *cmd):
        """Runs cmd in the Pod's mount, PID and network namespaces (as its sandbox sees
        them): (exit status, output)."""
        pid = self.pod_pids(ns, name)[0]
        p = subprocess.run(["nsenter", "-t", str(pid), "-m", "-n", "-p", "-u", "--"] + list(cmd),
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
        return p.returncode, p.stdout.decode(errors="replace")

    def memory(self, ns, name):
        """(usage, peak) bytes of the Pod's memory cgroup."""
        pod = self.pod(ns, name)
        if not pod:
            fail("no pod %s/%s", ns, name)
        cg = cgroups.locate(self.name)
        return cg.usage(pod["metadata"]["uid"]) if cg else (None, None)

    def oom_kill(self, ns, name, timeout=30):
        """Exhausts the Pod's memory as a spike of its own would: a process joins the Pod's
        cgroup and allocates until the kernel OOM-kills a process of the Pod (the
        container, whose oom_score_adj the kubelet set high: the kubelet then reports it
        OOMKilled), then exits, freeing its memory for the restart."""
        pod = self.pod(ns, name)
        cg = cgroups.locate(self.name)
        limit = ((pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}).get("memory")
        if not cg or not limit:
            fail("pod %s/%s: no memory cgroup (%s) or no memory limit (%s)", ns, name, cg, limit)
        restarts = self._restarts(ns, name)
        for _ in range(3):
            p = subprocess.run([sys.executable, "-c", HOG, cg.path(pod["metadata"]["uid"]), str(cg.version)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=timeout)
            if p.returncode == 0 and b"killed" in p.stdout:
                return
            # the kernel may take this process too (or instead): done once the container
            # restarted, else once more
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if self._restarts(ns, name) > restarts:
                    return
                time.sleep(0.1)
        fail("pod %s/%s: exhausting its memory: exit %d, %s", ns, name, p.returncode, p.stdout.decode()[-1500:])

    def _restarts(self, ns, name):
        statuses = (self.pod(ns, name).get("status") or {}).get("containerStatuses") or []
        return sum(cs.get("restartCount", 0) for cs in statuses)

    # -- the operator and TrainingJobs

    def operator_pods(self):
        return self.pods(OPERATOR_NS, OPERATOR_SELECTOR.replace("%3D", "="))

    def leader(self):
        """The name of the operator Pod holding the Lease (None while none does)."""
        names = {p["metadata"]["name"] for p in self.operator_pods() if not p["metadata"].get("deletionTimestamp")}
        for lease in self.ok("GET", "/apis/coordination.k8s.io/v1/namespaces/%s/leases" % OPERATOR_NS)["items"]:
            holder = (lease.get("spec") or {}).get("holderIdentity")
            if holder in names:
                return holder
        return None

    def operator_logs(self):
        return "\n".join("--- %s:\n%s" % (p["metadata"]["name"], "\n".join(
            self.log(OPERATOR_NS, p["metadata"]["name"]).splitlines()[-15:])) for p in self.operator_pods())

    def tj(self, ns, name):
        return self.api.get("%s/namespaces/%s/trainingjobs/%s" % (TJ, ns, name))

    def status(self, ns, name):
        """The job's status as the Recorder last saw it ({} once deleted)."""
        seen = self.jobs.objects(lambda o: o["metadata"]["name"] == name and o["metadata"].get("namespace") == ns)
        if seen:
            return {} if seen[-1][1] == "DELETED" else (seen[-1][2].get("status") or {})
        return (self.tj(ns, name) or {}).get("status") or {}

    def history(self, ns, name, since=0.0):
        """[(monotonic time, status)] the Recorder saw for the job after `since`."""
        return [(t, o.get("status") or {}) for t, typ, o in self.jobs.objects(
            lambda o: o["metadata"]["name"] == name and o["metadata"].get("namespace") == ns)
            if typ != "DELETED" and t >= since]

    def wait_status(self, ns, name, what, pred, timeout, stall=30.0):
        """Polls the job until pred(status); fails early when it Failed (unless pred
        wants that), when status.step stood still `stall` seconds while Running, or
        when no operator Pod runs."""
        last = {"step": None, "since": time.monotonic()}

        def poll():
            st = self.status(ns, name)
            if pred(st):
                return st or True
            if st.get("phase") == "Failed":
                fail("job %s/%s Failed while waiting for %s: %s", ns, name, what, json.dumps(st)[:1500])
            if st.get("step") != last["step"]:
                last["step"], last["since"] = st.get("step"), time.monotonic()
            elif st.get("phase") == "Running" and time.monotonic() - last["since"] > stall:
                fail("job %s/%s: status.step stuck at %s for %.0f s waiting for %s: %s", ns, name, st.get("step"),
                     stall, what, json.dumps(st)[:1500])
            return None
        return e2e.wait_for("%s (job %s/%s)" % (what, ns, name), poll, timeout, 0.05)

    def job_pods(self, ns, name):
        return [p for p in self.pods(ns, "pliant.dev/job=" + name)]

    def events(self, ns, name):
        """events.k8s.io/v1 Events regarding the TrainingJob, oldest first."""
        lst = self.ok("GET", "/apis/events.k8s.io/v1/namespaces/%s/events" % ns)["items"]
        return [ev for ev in lst if (ev.get("regarding") or {}).get("name") == name and
                (ev.get("regarding") or {}).get("kind") == "TrainingJob"]


# oom_kill()'s process: argv the Pod's cgroup directory and the cgroup version. It
# allocates until the cgroup's OOM kill count grows; the OOM killer takes a process of
# the Pod, not this one, whose score is its size, below the container's (oom_score_adj
# near 1000 for the operator's Burstable Pod, i.e. almost the whole limit).
HOG = r"""
import os, sys
cg, version = sys.argv[1], int(sys.argv[2])
events = os.path.join(cg, "memory.oom_control" if version == 1 else "memory.events")
def kills():
    with open(events) as f:
        return next((int(l.split()[1]) for l in f.read().splitlines() if l.startswith("oom_kill ")), 0)
with open(os.path.join(cg, "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
held, start = [], kills()
while kills() == start:
    held.append(b"x" * (1 << 20))
print("killed", flush=True)
"""


def step_at_least(n):
    return lambda st: (st.get("step") or 0) >= n


def phase_is(*phases):
    return lambda st: st.get("phase") in phases


def condition(obj, kind):
    """The condition of that type of an object's status (or of a status), or None."""
    conds = (obj.get("status") or obj).get("conditions") or []
    return next((c for c in conds if c.get("type") == kind), None)


def table(out):
    """kubectl's table output as (header names, [{COLUMN: value}]) (columns cut at the
    header's offsets, so empty cells stay empty)."""
    lines = [l for l in out.splitlines() if l.strip()]
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [len(line) + 1])]
        rows.append(dict(zip(names, cells)))
    return names, rows
