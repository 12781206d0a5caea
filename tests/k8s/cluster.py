#!/usr/bin/env python3
"""A test cluster with the boundaries a real Kubernetes cluster has, on this
machine (root, Linux network namespaces and cgroups): the front end of
`apiserver.py --cluster` (clustermode.py says what that is).

  cluster.py up [--nodes 4] [--zones a,b] [--kubeconfig FILE] [--state DIR]
                [--name pl] [--subnet 10.244.0.0/16] [--port 6443] [--build DIR]
                [--node-monitor-grace-period 40] [--default-toleration-seconds 300]
                [--no-operator] [--timeout 180] [--foreground]
      Starts the API server (nodes, kubelets, controllers, DNS), creates the
      namespace `pliant` (Pod Security restricted), installs the Helm chart
      charts/pliant there as `helm install pliant` would (its CRD, its
      ServiceAccount and RBAC, its Deployment of 2 operator replicas running
      build/bin/pliant-operator), waits for the operator and prints one line:
        ready: API https://10.244.0.1:6443, 4 nodes, operator 2/2, kubeconfig FILE
      then stays in the background (or in the foreground with --foreground:
      Ctrl-C stops it). Exits 2, saying what is missing, where this machine cannot
      make namespaces or cgroups.
  cluster.py down [--state DIR]
      Stops it: every Pod, namespace, link, cgroup and process it made.
  cluster.py node NAME preempt|lose|partition-from-peers|partition-from-coordinator|restore
                  [--address IP] [--state DIR]
      Breaks a node as clouds do (faults.py) or restores it.
  cluster.py status [--state DIR]

The state directory (default /tmp/pliant-cluster) holds cluster.json, the
kubeconfig (unless --kubeconfig says elsewhere), the logs (supervisor.log,
apiserver.log) and the Pods' files (work/; work/pvc/NS/CLAIM are the claims'
directories). Standard library only.
"""

import argparse
import atexit
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cgroups  # noqa: E402
import chart  # noqa: E402
import clustermode  # noqa: E402
import netns  # noqa: E402
from client import ApiClient, E2EFailure  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_STATE = "/tmp/pliant-cluster"
NAMESPACE = "pliant"
RELEASE = "pliant"
# Helm's install order (releaseutil.InstallOrder) for the kinds the chart has
INSTALL_ORDER = ["Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
                 "PodDisruptionBudget", "ServiceAccount", "Secret", "ConfigMap", "CustomResourceDefinition",
                 "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment"]


class ClusterError(Exception):
    pass


def _state(args):
    return os.path.abspath(args.state or DEFAULT_STATE)


def _read_info(state):
    try:
        with open(os.path.join(state, "cluster.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def running(pid):
    """Whether pid is a live process (a zombie waiting for its reaper is not)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def client(info):
    return ApiClient(info["url"], info["token"], info["ca"], info["kubeconfig"], workdir=info["state"])


# -- installing the chart -------------------------------------------------------------------

class Installer:
    """Creates objects of any kind through the API, as `helm install` and `kubectl
    create` do (discovery finds each kind's resource)."""

    def __init__(self, api):
        self.api = api
        self.kinds = {}

    def _resource(self, api_version, kind):
        if (api_version, kind) not in self.kinds:
            base = "/api/v1" if api_version == "v1" else "/apis/" + api_version
            for r in self.api.ok("GET", base)["resources"]:
                if "/" not in r["name"]:
                    self.kinds[(api_version, r["kind"])] = (base, r["name"], r["namespaced"])
        if (api_version, kind) not in self.kinds:
            raise ClusterError("the API serves no %s %s" % (api_version, kind))
        return self.kinds[(api_version, kind)]

    def create(self, obj, namespace=None):
        base, plural, namespaced = self._resource(obj["apiVersion"], obj["kind"])
        ns = obj["metadata"].get("namespace") or namespace
        path = "%s/namespaces/%s/%s" % (base, ns, plural) if namespaced else "%s/%s" % (base, plural)
        code, out = self.api.request("POST", path, obj)
        if code not in (200, 201, 409):
            raise ClusterError("creating %s %s: %d %s" % (obj["kind"], obj["metadata"]["name"], code,
                                                           (out or {}).get("message", out)))

    def wait_served(self, api_version, plural, timeout=20):
        deadline = time.monotonic() + timeout
        while self.api.request("GET", "/apis/%s/%s" % (api_version, plural))[0] != 200:
            if time.monotonic() > deadline:
                raise ClusterError("%s/%s is not served" % (api_version, plural))
            time.sleep(0.2)


def install_chart(api):
    """The namespace (Pod Security restricted), the chart's CRDs, then its objects."""
    inst = Installer(api)
    inst.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}}})
    for crd in chart.crds():
        inst.create(crd)
        versions = [v["name"] for v in crd["spec"]["versions"] if v.get("served", True)]
        inst.wait_served("%s/%s" % (crd["spec"]["group"], versions[0]), crd["spec"]["names"]["plural"])
    objects = [o for _, o in chart.render(release=RELEASE, namespace=NAMESPACE)]
    rank = lambda o: INSTALL_ORDER.index(o["kind"]) if o["kind"] in INSTALL_ORDER else len(INSTALL_ORDER)
    for obj in sorted(objects, key=rank):
        inst.create(obj, NAMESPACE)
    return next(o["metadata"]["name"] for o in objects if o["kind"] == "Deployment")


def wait_for_operator(api, deployment, timeout, apiserver):
    path = "/apis/apps/v1/namespaces/%s/deployments/%s" % (NAMESPACE, deployment)
    deadline = time.monotonic() + timeout
    while True:
        dep = api.get(path) or {}
        want = dep.get("spec", {}).get("replicas", 0)
        ready = dep.get("status", {}).get("readyReplicas", 0)
        if want and ready >= want:
            return ready, want
        if apiserver.poll() is not None:
            raise ClusterError("the API server exited (see apiserver.log)")
        if time.monotonic() > deadline:
            pods = api.ok("GET", "/api/v1/namespaces/%s/pods" % NAMESPACE)["items"]
            why = "; ".join("%s %s %s" % (p["metadata"]["name"], p["status"].get("phase"), json.dumps(
                p["status"].get("containerStatuses", [{}])[0].get("state", {}))) for p in pods)
            raise ClusterError("the operator is %d/%d ready after %d s: %s" % (ready, want, timeout,
                                                                              why or "no Pods"))
        time.sleep(0.5)


# -- up ---------------------------------------------------------------------------------------

def up(args):
    state = _state(args)
    info = _read_info(state)
    if info and running(info.get("pid", 0)):
        print("cluster.py up: a cluster is already up (state %s, API %s); `cluster.py down --state %s` first"
              % (state, info["url"], state), file=sys.stderr)
        return 1
    why = clustermode.missing(args.name)
    if why:
        print("cluster.py up: this machine cannot run the cluster: %s" % why, file=sys.stderr)
        return 2
    left = netns.namespaces(args.name) + netns.links(args.name)
    if left:
        print("cluster.py up: a cluster named %s has namespaces or links here (%s): another `cluster.py up`, or "
              "left by a crash (`cluster.py down --name %s --state DIR` removes them); or choose --name"
              % (args.name, ", ".join(left[:4]), args.name), file=sys.stderr)
        return 1
    used = netns.conflicts(args.subnet)
    if used:
        print("cluster.py up: %s is in use on this machine (%s): choose another --subnet"
              % (args.subnet, used[0]), file=sys.stderr)
        return 1
    operator = os.path.join(os.path.abspath(args.build), "bin", "pliant-operator")
    if not args.no_operator and not os.access(operator, os.X_OK):
        print("cluster.py up: %s is not built (make all)" % operator, file=sys.stderr)
        return 2
    os.makedirs(state, exist_ok=True)
    if args.foreground:
        return serve(args, state)
    ready_path = os.path.join(state, "ready")
    if os.path.exists(ready_path):
        os.remove(ready_path)
    log = open(os.path.join(state, "supervisor.log"), "ab")
    argv = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + ["--foreground"]
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    while not os.path.exists(ready_path):
        if child.poll() is not None:
            print("cluster.py up: it did not come up (exit %d); %s/supervisor.log ends:\n%s" % (
                child.returncode, state, _tail(os.path.join(state, "supervisor.log"))), file=sys.stderr)
            return 1
        time.sleep(0.2)
    with open(ready_path) as f:
        print(f.read().strip())
    return 0


def _tail(path, n=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def serve(args, state):
    """The supervisor: the API server as a child, the chart, the ready line, then
    waiting for a signal (or the API server's end), and the clean-up."""
    kubeconfig = os.path.abspath(args.kubeconfig or os.path.join(state, "kubeconfig"))
    work = os.path.join(state, "work")
    os.makedirs(work, exist_ok=True)
    token = os.urandom(16).hex()
    cmd = [sys.executable, os.path.join(HERE, "apiserver.py"), "--cluster", "--name", args.name, "--subnet",
           args.subnet, "--port", str(args.port), "--nodes", str(args.nodes), "--zones", args.zones,
           "--token", token, "--kubeconfig", kubeconfig, "--work-dir", work, "--build-bin",
           os.path.join(os.path.abspath(args.build), "bin"), "--node-monitor-grace-period",
           str(args.node_monitor_grace_period), "--default-toleration-seconds", str(args.default_toleration_seconds)]
    stopping = []

    def stop(signum, frame):
        stopping.append(signum)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    apiserver = None
    try:
        with open(os.path.join(state, "apiserver.log"), "ab") as err:
            apiserver = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                         preexec_fn=_term_with_parent)
        atexit.register(shutdown, apiserver, args.name, state)
        line = apiserver.stdout.readline().decode()
        if not line.startswith("listening "):
            raise ClusterError("the API server did not start:\n" + _tail(os.path.join(state, "apiserver.log")))
        url = line.split()[1]
        info = {"state": state, "name": args.name, "subnet": args.subnet, "url": url, "token": token,
                "ca": os.path.join(work, "ca.pem"), "kubeconfig": kubeconfig, "pid": os.getpid(),
                "apiserver_pid": apiserver.pid}
        with open(os.path.join(state, "cluster.json"), "w") as f:
            json.dump(info, f, indent=1)
        api = client(info)
        operator = "not installed"
        if not args.no_operator:
            deployment = install_chart(api)
            operator = "%d/%d" % wait_for_operator(api, deployment, args.timeout, apiserver)
        nodes = len(api.ok("GET", "/api/v1/nodes")["items"])
        ready = "ready: API %s, %d nodes, operator %s, kubeconfig %s" % (url, nodes, operator, kubeconfig)
        with open(os.path.join(state, "ready.tmp"), "w") as f:
            f.write(ready + "\n")
        os.replace(os.path.join(state, "ready.tmp"), os.path.join(state, "ready"))
        print(ready, flush=True)
        apiserver.wait()
        print("cluster.py: the API server exited with status %s" % apiserver.returncode, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except (ClusterError, E2EFailure, OSError) as e:
        print("cluster.py up: %s" % e, file=sys.stderr)
        return 1
    finally:
        shutdown(apiserver, args.name, state)


_shut_down = set()


def _term_with_parent():
    """In the API server's process: SIGTERM (so it cleans up) when the supervisor dies."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG


def shutdown(apiserver, name, state):
    """The API server stops its Pods and removes its namespaces; what a crash left is
    swept (once: at the end of serve() or at exit)."""
    if state in _shut_down:
        return
    _shut_down.add(state)
    if apiserver is not None and apiserver.poll() is None:
        apiserver.terminate()
        try:
            apiserver.wait(60)
        except subprocess.TimeoutExpired:
            apiserver.kill()
            apiserver.wait()
    left = sweep(name)
    if left:
        print("cluster.py: removed what the API server left: %s" % ", ".join(left), file=sys.stderr)
    for f in ("ready", "cluster.json"):
        try:
            os.remove(os.path.join(state, f))
        except FileNotFoundError:
            pass


def sweep(name):
    return netns.sweep(name) + cgroups.sweep(name)


# -- down, node, status -----------------------------------------------------------------------------

def down(args):
    state = _state(args)
    info = _read_info(state) or {}
    pids = [p for p in (info.get("pid"), info.get("apiserver_pid")) if p]
    if pids and running(pids[0]):
        os.kill(pids[0], signal.SIGTERM)
        deadline = time.monotonic() + 90
        while running(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.2)
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
    left = sweep(info.get("name") or args.name)
    if info.get("state"):
        for f in ("ready", "cluster.json"):
            try:
                os.remove(os.path.join(state, f))
            except FileNotFoundError:
                pass
    print("down: %s%s" % ("stopped the cluster" if pids else "no cluster was up",
                          "; removed leftovers: " + ", ".join(left) if left else ""))
    return 0


def node(args):
    info = _read_info(_state(args))
    if not info:
        print("cluster.py node: no cluster is up (state %s)" % _state(args), file=sys.stderr)
        return 1
    body = {"address": args.address} if args.address else {}
    code, out = client(info).request("POST", "/_emulator/nodes/%s/%s" % (args.name_, args.action), body)
    print(json.dumps(out))
    return 0 if code == 200 else 1


def status(args):
    info = _read_info(_state(args))
    if not info or not running(info.get("pid", 0)):
        print("no cluster is up (state %s)" % _state(args))
        return 1
    api = client(info)
    print("API %s, kubeconfig %s" % (info["url"], info["kubeconfig"]))
    for n in api.ok("GET", "/api/v1/nodes")["items"]:
        ready = next((c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready"), "?")
        print("node %s zone %s Ready=%s %s" % (n["metadata"]["name"], n["metadata"]["labels"].get(
            "topology.kubernetes.io/zone"), ready, n["status"]["addresses"][0]["address"]))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description="A test cluster with a real cluster's boundaries")
    sub = ap.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up")
    p_up.add_argument("--nodes", type=int, default=4)
    p_up.add_argument("--zones", default="a,b")
    p_up.add_argument("--kubeconfig")
    p_up.add_argument("--name", default="pl", help="prefix of its namespaces, links and cgroups (1-6 letters)")
    p_up.add_argument("--subnet", default="10.244.0.0/16")
    p_up.add_argument("--port", type=int, default=6443)
    p_up.add_argument("--build", default=os.path.join(REPO, "build"))
    p_up.add_argument("--node-monitor-grace-period", type=float, default=40.0)
    p_up.add_argument("--default-toleration-seconds", type=int, default=300)
    p_up.add_argument("--no-operator", action="store_true", help="do not install the chart")
    p_up.add_argument("--timeout", type=int, default=180, help="seconds to wait for the operator")
    p_up.add_argument("--foreground", action="store_true")
    p_down = sub.add_parser("down")
    p_down.add_argument("--name", default="pl", help="what to sweep when the state is gone")
    p_node = sub.add_parser("node")
    p_node.add_argument("name_", metavar="NAME")
    p_node.add_argument("action", choices=["preempt", "lose", "partition-from-peers", "partition-from-coordinator",
                                           "restore"])
    p_node.add_argument("--address", help="partition-from-coordinator: the address cut off; partition-from-peers: "
                                          "the address still reached (default: the leading operator Pod's)")
    p_status = sub.add_parser("status")
    for p in (p_up, p_down, p_node, p_status):
        p.add_argument("--state", help="state directory (default %s)" % DEFAULT_STATE)
    args = ap.parse_args(argv)
    return {"up": up, "down": down, "node": node, "status": status}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
