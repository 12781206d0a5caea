#!/usr/bin/env python3
"""Tests of the namespaced test cluster (tests/k8s/cluster.py, apiserver.py
--cluster): one cluster is brought up with `cluster.py up` (3 nodes in zones
a,b, the chart's operator, a node-monitor grace period of 4 s and default
tolerations of 4 s) and brought down by the last test. Workloads are tiny
python3 and sleep Pods.

  up_runs_the_operator_from_the_chart       the ready line, the Deployment 2/2 as its ServiceAccount
  pods_are_isolated                         files, /work, PID namespace, Secret modes, shared PVC,
                                            read-only root, runAsUser, the mounted token
  memory_limit_oom_kills                    OOMKilled, exit code 137
  rbac_allows_and_denies                    Roles, resourceNames, subresources, verbs, kube-apiserver's wording
  pod_security_restricted                   a root Pod refused with PSA's wording, a compliant one runs
  services_select_their_namespace_and_resolve  Endpoints/EndpointSlices, readiness, DNS from a Pod
  preemption_terminates_gracefully_then_deletes_the_node
  silent_loss_not_ready_then_eviction       link down: timeouts, NotReady, eviction, restore
  partitions_and_restore                    from peers, from the coordinator's address
  operator_smoke_trainingjob                a TrainingJob in the operator's namespace to Succeeded
  down_leaves_nothing                       no namespace, link, cgroup or process left

Where this machine cannot make namespaces or cgroups (not root, no iproute2, a
container without CAP_SYS_ADMIN), every test is skipped with what is missing.

Run: python3 tests/cli/test_cluster.py --build build [-k SUBSTRING]
Standard library only.
"""

import http.client
import json
import os
import re
import sys
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "k8s"))

from clitest import REPO, SHAKESPEARE, Failure, Skip, Suite, check  # noqa: E402
import cgroups  # noqa: E402
import cluster as cluster_py  # noqa: E402
import clusterfixture  # noqa: E402
import netns  # noqa: E402
import e2e  # noqa: E402
import yamlmini  # noqa: E402
from client import ApiClient, E2EFailure  # noqa: E402

suite = Suite("cluster")
test = suite.test
GRACE, TOLERATION = 4, 4
fx = clusterfixture.Fixture("pt", nodes=3, zones="a,b", grace=GRACE, toleration=TOLERATION)
NAME = fx.name
state = {}
suite.at_end(fx.down)         # a test failed before the last one


# ---------------------------------------------------------------------------
# The cluster

def cluster():
    """The cluster's ApiClient (brought up by the first test that needs it)."""
    try:
        return fx.up(suite.tmp, suite.build)
    except clusterfixture.Unavailable as e:
        raise Skip(str(e))
    except E2EFailure as e:
        raise Failure(str(e))


def api_ok(method, path, body=None):
    try:
        return cluster().ok(method, path, body)
    except E2EFailure as e:
        raise Failure(str(e))


def wait_for(what, fn, timeout=30.0, interval=0.2):
    try:
        return e2e.wait_for(what, fn, timeout, interval)
    except E2EFailure as e:
        raise Failure(str(e))


def namespace(name, labels=None):
    cluster()
    fx.namespace(name, labels)


def python_pod(name, script, node=None, restart="Never", labels=None, sc=None, pod_sc=None, **extra):
    """A Pod running `python3 -c script` (the image name matters only to the Pliant images)."""
    container = {"name": "main", "image": "python:3", "command": ["python3", "-c", script]}
    if sc:
        container["securityContext"] = sc
    container.update(extra.pop("container", {}))
    spec = {"containers": [container], "restartPolicy": restart, "terminationGracePeriodSeconds": 5}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if pod_sc:
        spec["securityContext"] = pod_sc
    spec.update(extra)
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def create(ns, obj, plural="pods", base="/api/v1"):
    return api_ok("POST", "%s/namespaces/%s/%s" % (base, ns, plural), obj)


def pod_get(ns, name):
    return cluster().get("/api/v1/namespaces/%s/pods/%s" % (ns, name))


def wait_phase(ns, name, phases=("Succeeded",), timeout=30):
    try:
        return fx.wait_phase(ns, name, phases, timeout)
    except E2EFailure as e:
        raise Failure(str(e))


def wait_ready(ns, name, timeout=30):
    try:
        return fx.wait_ready(ns, name, timeout)
    except E2EFailure as e:
        raise Failure(str(e))


def log(ns, name):
    return fx.log(ns, name)


def result(ns, name, timeout=30):
    """The JSON a finished Pod printed last."""
    wait_phase(ns, name, timeout=timeout)
    lines = [l for l in log(ns, name).splitlines() if l.startswith("{")]
    check(lines, "pod %s/%s printed no JSON:\n%s", ns, name, log(ns, name))
    return json.loads(lines[-1])


def node_action(node, action, *extra):
    try:
        return fx.node_action(node, action, *extra)
    except E2EFailure as e:
        raise Failure(str(e))


def node_ready(node):
    return fx.node_ready(node)


def add_node(name, zone="b"):
    cluster()
    fx.add_node(name, zone)


# A server Pod: says its name to whoever connects (port 8000)
ECHO_SCRIPT = ("import os, socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('0.0.0.0', 8000)); s.listen()\nwhile True:\n    c, _ = s.accept(); c.sendall(os.environ['HOSTNAME']"
        ".encode()); c.close()\n")


def echo_pod(name, node=None, labels=None, ready_port=8000):
    """A server Pod saying its name on port 8000 ("echo"), ready once a TCP probe of
    ready_port succeeds."""
    return python_pod(name, ECHO_SCRIPT, node=node, restart="Always", labels=labels, container={
        "ports": [{"name": "echo", "containerPort": 8000}],
        "readinessProbe": {"tcpSocket": {"port": ready_port}, "periodSeconds": 1, "failureThreshold": 1}})


# The prober Pod: GET /connect?host=H&port=P (what a connect does from it) and /resolve?name=N
PROBER = r"""
import http.server, json, socket, urllib.parse
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        u = urllib.parse.urlsplit(self.path); q = dict(urllib.parse.parse_qsl(u.query))
        if u.path == "/resolve":
            try: out = sorted(socket.gethostbyname_ex(q["name"])[2])
            except OSError as e: out = "error: %s" % e
        else:
            s = socket.socket(); s.settimeout(float(q.get("t", "2")))
            try: s.connect((q["host"], int(q["port"]))); out = s.recv(200).decode() or "connected"
            except socket.timeout: out = "timeout"
            except OSError as e: out = "error: %s" % (e.strerror or e)
            s.close()
        body = json.dumps(out).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""


def prober():
    """The prober Pod on node-0 (started once); its IP."""
    if "prober" not in state:
        create("default", python_pod("prober", PROBER, node="node-0", restart="Always",
                                     container={"readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}))
        state["prober"] = wait_ready("default", "prober")["status"]["podIP"]
    return state["prober"]


def ask(path, **query):
    """What the prober Pod says (it runs in node-0's network)."""
    conn = http.client.HTTPConnection(prober(), 8080, timeout=15)
    conn.request("GET", "%s?%s" % (path, urllib.parse.urlencode(query)))
    return json.loads(conn.getresponse().read())


def connect(host, port=8000, t=2):
    return ask("/connect", host=host, port=port, t=t)


# ---------------------------------------------------------------------------
# Tests

@test
def up_runs_the_operator_from_the_chart():
    api = cluster()
    line = fx.up_proc.stdout.strip()
    check(re.match(r"^ready: API https://10\.\d+\.0\.1:\d+, 3 nodes, operator 2/2, kubeconfig \S+$", line),
          "ready line %r", line)
    dep = api_ok("GET", "/apis/apps/v1/namespaces/pliant/deployments/pliant-operator")
    check(dep["status"].get("readyReplicas") == 2, "deployment status %r", dep["status"])
    pods = api_ok("GET", "/api/v1/namespaces/pliant/pods?labelSelector=app.kubernetes.io/name%3Dpliant-operator")
    check(len(pods["items"]) == 2, "operator pods: %d", len(pods["items"]))
    for p in pods["items"]:
        check(p["spec"]["serviceAccountName"] == "pliant-operator", "serviceAccountName %r",
              p["spec"]["serviceAccountName"])
        check(p["status"]["podIP"].startswith(fx.subnet.rsplit(".", 2)[0] + "."), "podIP %s",
              p["status"]["podIP"])
    check(len({p["spec"]["nodeName"] for p in pods["items"]}) == 2, "both replicas on one node")
    users = {r["user"] for r in api_ok("GET", "/_emulator/requests")["requests"]}
    check("system:serviceaccount:pliant:pliant-operator" in users, "the operator's requests: users %s", users)
    leases = api_ok("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")["items"]
    check(len(leases) == 3, "node leases %d", len(leases))


ISOLATION = r"""
import json, os
out = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()), "host_work": os.path.exists("/work"),
       "hostname": open("/etc/hostname").read().strip(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
       "pliant": os.access("/usr/local/bin/pliant", os.X_OK), "bin_writable": os.access("/usr/local/bin", os.W_OK),
       "secret": {f: [oct(os.stat("/secret/" + f).st_mode & 0o777), os.stat("/secret/" + f).st_gid,
                      open("/secret/" + f).read()] for f in sorted(os.listdir("/secret"))},
       "token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token")}
for path in ("/root-file", "/shared/from-a"):
    try:
        open(path, "w").write(os.environ["HOSTNAME"]); out[path] = "written"
    except OSError as e:
        out[path] = e.strerror
open("/scratch/marker-a", "w").write("a")
print(json.dumps(out))
"""

READER = r"""
import json, os
out = {"shared": open("/shared/from-a").read(), "host_work": os.path.exists("/work"), "token": os.path.exists(
       "/var/run/secrets/kubernetes.io/serviceaccount/token"), "pids": len([p for p in os.listdir("/proc") if p.isdigit()]),
       "marker": [p for p in (os.environ["MARKER"], "/scratch/marker-a") if os.path.exists(p)]}
print(json.dumps(out))
"""


@test
def pods_are_isolated():
    cluster()
    namespace("iso")
    api_ok("POST", "/api/v1/namespaces/iso/secrets", {"metadata": {"name": "creds"}, "stringData": {
        "user": "alice", "password": "s3cret", "unused": "x"}})
    api_ok("POST", "/api/v1/namespaces/iso/persistentvolumeclaims", {"metadata": {"name": "shared"}, "spec": {
        "accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}})
    volumes = [{"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o444, "items": [
        {"key": "user", "path": "user"}, {"key": "password", "path": "pw", "mode": 0o400}]}},
        {"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}, {"name": "scratch", "emptyDir": {}}]
    mounts = [{"name": "creds", "mountPath": "/secret"}, {"name": "shared", "mountPath": "/shared"},
              {"name": "scratch", "mountPath": "/scratch"}]
    create("iso", python_pod("writer", ISOLATION, node="node-0", volumes=volumes, automountServiceAccountToken=False,
                             sc={"runAsUser": 1000, "runAsGroup": 3000, "readOnlyRootFilesystem": True},
                             pod_sc={"fsGroup": 2000}, container={"volumeMounts": mounts}))
    a = result("iso", "writer")
    check(a["uid"] == 1000 and a["gid"] == 3000 and a["groups"] == [2000, 3000], "runAsUser/runAsGroup/fsGroup: "
          "uid %s gid %s groups %s", a["uid"], a["gid"], a["groups"])
    # item mode 0400 and defaultMode 0444, made group-readable for the fsGroup as the kubelet does
    check(a["secret"] == {"pw": ["0o440", 2000, "s3cret"], "user": ["0o444", 2000, "alice"]},
          "the Secret's items (mode, group, text): %s", a["secret"])
    check(a["/root-file"] == "Read-only file system", "the read-only root: %s", a["/root-file"])
    check(a["/shared/from-a"] == "written", "the claim: %s", a["/shared/from-a"])
    check(not a["host_work"], "the Pod sees the host's /work")
    check(a["hostname"] == "writer" and not a["token"], "hostname %r, token mounted %s", a["hostname"], a["token"])
    check(a["pids"] == [1, 2], "PIDs seen (want the sandbox's init and itself): %s", a["pids"])
    check(a["pliant"] and not a["bin_writable"], "/usr/local/bin/pliant: executable %s, writable %s", a["pliant"],
          a["bin_writable"])
    writer = pod_get("iso", "writer")
    marker = os.path.join(fx.dir, "work", "pods", "iso_writer_" + writer["metadata"]["uid"][:8], "volumes",
                          "scratch", "marker-a")
    check(os.path.exists(marker), "the writer's emptyDir is not at %s", marker)
    create("iso", python_pod("reader", READER, node="node-1", volumes=volumes[1:], container={
        "volumeMounts": mounts[1:], "env": [{"name": "MARKER", "value": marker}]}))
    b = result("iso", "reader")
    check(b["shared"] == "writer", "the claim on another node reads %r", b["shared"])
    check(b["marker"] == [] and not b["host_work"], "another Pod's files are visible: %s", b["marker"])
    check(b["token"] and b["pids"] <= 3, "token %s, %d PIDs", b["token"], b["pids"])
    reader = pod_get("iso", "reader")
    check(writer["spec"]["nodeName"] != reader["spec"]["nodeName"], "both on %s", writer["spec"]["nodeName"])


@test
def memory_limit_oom_kills():
    cluster()
    create("default", python_pod("hog", "x = []\nwhile True: x.append(bytearray(1 << 20))",
                                 container={"resources": {"limits": {"memory": "48Mi"}}}))
    pod = wait_phase("default", "hog", ("Failed",))
    state_ = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    check(state_["reason"] == "OOMKilled" and state_["exitCode"] == 137, "terminated %s", state_)
    create("default", python_pod("modest", "x = bytearray(8 << 20); print('{}')",
                                 container={"resources": {"limits": {"memory": "64Mi"}}}))
    wait_phase("default", "modest")


def forbidden(api, method, path, body=None):
    code, out = api.request(method, path, body)
    check(code == 403, "%s %s: %d, want 403: %s", method, path, code, out)
    return out["message"]


@test
def rbac_allows_and_denies():
    admin = cluster()
    namespace("team-a")
    api_ok("POST", "/api/v1/namespaces/team-a/serviceaccounts", {"metadata": {"name": "robot"}})
    api_ok("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles", {"metadata": {"name": "reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]},
                  {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["open"]},
                  {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]})
    api_ok("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings", {
        "metadata": {"name": "robot-reads"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                         "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": "team-a"}]})
    for name in ("open", "closed"):
        api_ok("POST", "/api/v1/namespaces/team-a/configmaps", {"metadata": {"name": name}, "data": {"k": "v"}})
    token = api_ok("POST", "/api/v1/namespaces/team-a/serviceaccounts/robot/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})["status"]["token"]
    robot = ApiClient(admin.url, token, fx.info["ca"])
    user = "system:serviceaccount:team-a:robot"
    check(robot.request("GET", "/api/v1/namespaces/team-a/pods")[0] == 200, "robot cannot list its pods")
    check(robot.request("GET", "/api/v1/namespaces/team-a/configmaps/open")[0] == 200, "resourceNames: open")
    check(robot.request("GET", "/api")[0] == 200, "discovery is denied")
    cases = [
        ("POST", "/api/v1/namespaces/team-a/pods", python_pod("x", "pass"),
         'pods is forbidden: User "%s" cannot create resource "pods" in API group "" in the namespace "team-a"'),
        ("GET", "/api/v1/namespaces/team-a/configmaps/closed", None,
         'configmaps "closed" is forbidden: User "%s" cannot get resource "configmaps" in API group "" in the '
         'namespace "team-a"'),
        ("GET", "/api/v1/namespaces/default/pods", None,
         'pods is forbidden: User "%s" cannot list resource "pods" in API group "" in the namespace "default"'),
        ("GET", "/api/v1/namespaces/team-a/pods?watch=1", None,
         'pods is forbidden: User "%s" cannot watch resource "pods" in API group "" in the namespace "team-a"'),
        ("PATCH", "/api/v1/namespaces/team-a/pods/x/status", {},
         'pods "x" is forbidden: User "%s" cannot patch resource "pods/status" in API group "" in the namespace '
         '"team-a"'),
        ("DELETE", "/api/v1/namespaces/team-a/pods", None,
         'pods is forbidden: User "%s" cannot deletecollection resource "pods" in API group "" in the namespace '
         '"team-a"'),
        ("GET", "/api/v1/nodes", None,
         'nodes is forbidden: User "%s" cannot list resource "nodes" in API group "" at the cluster scope'),
        ("GET", "/apis/apps/v1/namespaces/team-a/deployments/web", None,
         'deployments.apps "web" is forbidden: User "%s" cannot get resource "deployments" in API group "apps" in '
         'the namespace "team-a"'),
    ]
    for method, path, body, want in cases:
        got = forbidden(robot, method, path, body)
        check(got == want % user, "%s %s:\n  got  %s\n  want %s", method, path, got, want % user)
    log_ = api_ok("GET", "/_emulator/requests")["requests"]
    check(any(r["user"] == user and r["status"] == 403 and r["path"] == "/api/v1/nodes" for r in log_),
          "the request log does not record the denial with the user")
    # The token the kubelet mounts is the Pod's ServiceAccount's
    create("team-a", python_pod("in-pod", IN_POD_CLIENT, serviceAccountName="robot"))
    out = result("team-a", "in-pod")
    check(out == {"pods": 200, "secrets": 403}, "with the mounted token: %s", out)


IN_POD_CLIENT = r"""
import json, os, ssl, urllib.error, urllib.request
d = "/var/run/secrets/kubernetes.io/serviceaccount/"
ctx = ssl.create_default_context(cafile=d + "ca.crt")
ns = open(d + "namespace").read()
out = {}
for what in ("pods", "secrets"):
    url = "https://%s:%s/api/v1/namespaces/%s/%s" % (os.environ["KUBERNETES_SERVICE_HOST"],
                                                     os.environ["KUBERNETES_SERVICE_PORT"], ns, what)
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + open(d + "token").read()})
    try:
        out[what] = urllib.request.urlopen(req, context=ctx).status
    except urllib.error.HTTPError as e:
        out[what] = e.code
print(json.dumps(out))
"""


@test
def pod_security_restricted():
    api = cluster()
    namespace("secure", {"pod-security.kubernetes.io/enforce": "restricted"})
    code, out = api.request("POST", "/api/v1/namespaces/secure/pods", {"metadata": {"name": "x"}, "spec": {
        "containers": [{"name": "w", "image": "python:3", "command": ["true"]}]}})
    want = ('pods "x" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
            '(container "w" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
            '(container "w" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or '
            'container "w" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "w" must '
            'set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
    check(code == 403 and out["message"] == want, "a root Pod: %d\n  got  %s\n  want %s", code,
          out.get("message"), want)
    create("secure", python_pod(
        "compliant", "import json, os; print(json.dumps({'uid': os.getuid()}))",
        pod_sc={"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
        sc={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}))
    check(result("secure", "compliant") == {"uid": 65532}, "the compliant Pod")


@test
def services_select_their_namespace_and_resolve():
    cluster()
    for ns in ("svc-a", "svc-b"):
        namespace(ns)
        create(ns, echo_pod("web-1", labels={"app": "web"}))
    create("svc-a", echo_pod("web-unready", labels={"app": "web"}, ready_port=9))
    create("svc-a", {"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [
        {"name": "echo", "port": 8000, "targetPort": "echo"}]}}, "services")
    a1 = wait_ready("svc-a", "web-1")["status"]["podIP"]
    b1 = wait_ready("svc-b", "web-1")["status"]["podIP"]
    unready = wait_for("web-unready's address", lambda: (pod_get("svc-a", "web-unready").get("status") or {}).get(
        "podIP"))

    def subsets():
        ep = cluster().get("/api/v1/namespaces/svc-a/endpoints/web") or {}
        s = (ep.get("subsets") or [{}])[0]
        return s if [a["ip"] for a in s.get("addresses", [])] == [a1] and s.get("notReadyAddresses") else None
    s = wait_for("the Endpoints of svc-a/web", subsets, 20)
    check([a["ip"] for a in s["notReadyAddresses"]] == [unready] and s["ports"][0]["port"] == 8000,
          "Endpoints %s", s)
    slices = api_ok("GET", "/apis/discovery.k8s.io/v1/namespaces/svc-a/endpointslices?labelSelector="
                           "kubernetes.io/service-name%3Dweb")["items"]
    check(len(slices) == 1 and {e["addresses"][0]: e["conditions"]["ready"] for e in slices[0]["endpoints"]} ==
          {a1: True, unready: False}, "EndpointSlices %s", slices)
    check(b1 not in json.dumps(slices), "svc-b's Pod is in svc-a's Service")
    for name in ("web.svc-a.svc", "web.svc-a.svc.cluster.local"):
        check(ask("/resolve", name=name) == [a1], "%s resolves to %s, want [%s]", name,
              ask("/resolve", name=name), a1)
    check(str(ask("/resolve", name="web.nowhere.svc")).startswith("error"), "an unknown Service resolves")
    check(connect("web.svc-a.svc") == "web-1", "connecting to web.svc-a.svc: %s", connect("web.svc-a.svc"))
    check(ask("/resolve", name="kubernetes.default.svc") == [fx.info["url"].split("//")[1].split(":")[0]],
          "kubernetes.default.svc resolves to %s", ask("/resolve", name="kubernetes.default.svc"))


GRACEFUL = ("import signal, sys, time\ndef term(*a):\n    print('got SIGTERM', flush=True); time.sleep(1); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, term)\nprint('up', flush=True)\nwhile True: time.sleep(1)\n")


def condition(pod, kind):
    return next((c for c in pod.get("status", {}).get("conditions", []) if c["type"] == kind), None)


@test
def preemption_terminates_gracefully_then_deletes_the_node():
    cluster()
    add_node("spot-1")
    create("default", python_pod("victim", GRACEFUL, node="spot-1", restart="Always", terminationGracePeriodSeconds=5))
    wait_ready("default", "victim")
    out = node_action("spot-1", "preempt")
    check(out["pods"] == ["victim"], "preempt: %s", out)
    pod = wait_for("victim Failed", lambda: (lambda p: p if p and p["status"].get("phase") == "Failed" else None)(
        pod_get("default", "victim")), 40)
    cond = condition(pod, "DisruptionTarget")
    check(cond and cond["reason"] == "TerminationByKubelet", "DisruptionTarget %s", cond)
    check(pod["status"].get("reason") == "Terminated", "status reason %s", pod["status"].get("reason"))
    check("got SIGTERM" in log("default", "victim"), "the Pod did not get SIGTERM: %s", log("default", "victim"))
    wait_for("node spot-1 deleted", lambda: cluster().get("/api/v1/nodes/spot-1") is None, 30)
    wait_for("victim removed", lambda: pod_get("default", "victim") is None, 10)
    check(NAME + "-node-3" not in netns.namespaces(NAME), "spot-1's namespace (the 4th node's) is left: %s",
          netns.namespaces(NAME))


@test
def silent_loss_not_ready_then_eviction():
    cluster()
    add_node("spot-2")
    create("default", echo_pod("lost", node="spot-2"))
    ip = wait_ready("default", "lost")["status"]["podIP"]
    check(connect(ip) == "lost", "before: %s", connect(ip))
    tolerations = pod_get("default", "lost")["spec"]["tolerations"]
    check({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
           "tolerationSeconds": TOLERATION} in tolerations, "default tolerations %s", tolerations)
    t0 = time.monotonic()
    node_action("spot-2", "lose")
    check(connect(ip) == "timeout", "a connection to a lost node's Pod: %s (want a timeout: no RST)", connect(ip))
    wait_for("spot-2 NotReady", lambda: node_ready("spot-2") == "Unknown", GRACE + 10)
    taints = cluster().get("/api/v1/nodes/spot-2")["spec"].get("taints", [])
    check({t["key"] for t in taints} == {"node.kubernetes.io/unreachable"}, "taints %s", taints)
    pod = wait_for("lost evicted", lambda: (lambda p: p if p["metadata"].get("deletionTimestamp") else None)(
        pod_get("default", "lost")), GRACE + TOLERATION + 10)
    elapsed = time.monotonic() - t0
    check(elapsed >= TOLERATION, "evicted after %.1f s, before its tolerationSeconds", elapsed)
    cond = condition(pod, "DisruptionTarget")
    check(cond and cond["reason"] == "DeletionByTaintManager", "DisruptionTarget %s", cond)
    time.sleep(1)
    check(pod_get("default", "lost") is not None, "the Pod of an unreachable node went without its kubelet")
    node_action("spot-2", "restore")
    wait_for("spot-2 Ready again", lambda: node_ready("spot-2") == "True", 15)
    wait_for("lost removed once its kubelet is back", lambda: pod_get("default", "lost") is None, 15)


@test
def partitions_and_restore():
    cluster()
    create("default", echo_pod("island", node="node-2"))
    ip = wait_ready("default", "island")["status"]["podIP"]
    check(connect(ip) == "island", "before: %s", connect(ip))
    node_action("node-2", "partition-from-peers")
    check(connect(ip) == "timeout", "from a peer node: %s", connect(ip))
    time.sleep(GRACE + 1)
    check(node_ready("node-2") == "True", "partitioned from its peers only, node-2 is %s", node_ready("node-2"))
    node_action("node-2", "restore")
    check(connect(ip) == "island", "after restore: %s", connect(ip))
    api_ip = fx.info["url"].split("//")[1].split(":")[0]
    out = node_action("node-2", "partition-from-coordinator", "--address", api_ip)
    check(out["addresses"] == [api_ip], "partition: %s", out)
    check(connect(ip) == "island", "peers are cut off from node-2: %s", connect(ip))
    wait_for("node-2 NotReady (no heartbeats reach %s)" % api_ip, lambda: node_ready("node-2") == "Unknown", GRACE + 10)
    node_action("node-2", "restore")
    wait_for("node-2 Ready again", lambda: node_ready("node-2") == "True", 15)
    check(connect(ip) == "island", "after restore: %s", connect(ip))


SMOKE_JOB = """apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata: {name: smoke, namespace: pliant}
spec:
  model: {layers: 3, channels: 32, heads: 2, vocabSize: 256, maxSeqLen: 64, seed: 7}
  data: {train: /data/ts_train.bin, order: shuffled, seed: 3}
  batch: {global: 8, micro: 2, seqLen: 32}
  optimizer: {lr: 3.0e-3, warmupSteps: 2}
  steps: 20
  evalEvery: 0
  profile: synthetic
  nodes: {min: 1, max: 2}
  faultTolerance: {tolerate: 0}
  worker:
    terminationGracePeriodSeconds: 5
    env: [{name: PLIANT_THREADS, value: "1"}]
    volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
    volumeMounts: [{name: data, mountPath: /data}]
"""


@test
def operator_smoke_trainingjob():
    """A TrainingJob in the operator's own namespace (Pod Security restricted), data on
    a claim: its worker Pods are admitted, dial the job's Service by name and train to
    Succeeded; the API server refused the operator's ServiceAccount nothing."""
    cluster()
    if not os.path.exists(SHAKESPEARE):
        raise Skip("%s not found" % SHAKESPEARE)
    prefix = suite.shakespeare_shards(100000)
    fx.claim("pliant", "data", [prefix + "_train.bin"])
    _, since = fx.requests()
    api_ok("POST", "/apis/pliant.dev/v1alpha1/namespaces/pliant/trainingjobs", yamlmini.load(SMOKE_JOB))
    try:
        fx.wait_status("pliant", "smoke", "phase Succeeded", clusterfixture.phase_is("Succeeded"), 60)
    except E2EFailure as e:
        raise Failure("%s\n%s" % (e, fx.operator_logs()))
    denied = [r for r in fx.requests(since)[0]
              if r["status"] == 403 and r["user"] == "system:serviceaccount:pliant:pliant-operator"]
    check(not denied, "the API server refused the operator: %s", [(r["path"], r.get("message")) for r in denied])


@test
def down_leaves_nothing():
    cluster()
    info = fx.info
    pids = [info["pid"], info["apiserver_pid"]]
    pod_pids = [pid for path, _, _ in os.walk(cgroups.Cgroups(NAME).mount) if "pliant-" + NAME in path
                for pid in cgroups._procs(path)]
    check(pod_pids, "no Pod processes found in the cluster's cgroups")
    p = fx.down()
    check(p.returncode == 0, "cluster.py down: %s %s", p.stdout, p.stderr)
    check(p.stdout.startswith("down: stopped the cluster") and "leftovers" not in p.stdout, "down says %r",
          p.stdout)
    deadline = time.monotonic() + 5          # the kernel ends a PID namespace's processes asynchronously
    while [pid for pid in pids + pod_pids if cluster_py.running(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in pids + pod_pids if cluster_py.running(pid)]
    check(not alive, "processes left: %s", alive)
    check(not netns.namespaces(NAME) and not netns.links(NAME), "left: %s %s", netns.namespaces(NAME),
          netns.links(NAME))
    left = [path for path, _, _ in os.walk(cgroups.Cgroups(NAME).mount) if "pliant-" + NAME in path]
    check(not left, "cgroups left: %s", left)


if __name__ == "__main__":
    sys.exit(suite.main())
