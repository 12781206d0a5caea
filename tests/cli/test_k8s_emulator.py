#!/usr/bin/env python3
"""Tests of the Kubernetes API emulator (tests/k8s/apiserver.py) that the operator's
tests run against: through urllib, and through the real kubectl where installed.

Run: python3 tests/cli/test_k8s_emulator.py --build build [-k SUBSTRING]
Prints one line per test, "ok NAME", "FAIL NAME" or "skip NAME: why", as
tests/run_tests.py expects. Two emulators are started once: one with TLS and a
token (API semantics, kubectl; plain http where openssl is missing), one with
fake kubelets (Pods as local processes).
Standard library only.
"""

import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from clitest import REPO, Failure, Suite, check  # noqa: E402

APISERVER = os.path.join(REPO, "tests", "k8s", "apiserver.py")
KUBECTL = shutil.which("kubectl")
TOKEN = "emulator-test-token"
# The emulator makes its certificates with openssl; kubectl sends a token only over TLS.
TLS = ["--tls", "--token", TOKEN] if shutil.which("openssl") else []
GROUP = "test.pliant.dev"
WIDGETS = "/apis/%s/v1/namespaces/default/widgets" % GROUP

suite = Suite("k8s_emulator")
test = suite.test
_no_kubectl = []


def kubectl_test(fn):
    """A test that needs the kubectl binary: skipped where it is not installed."""
    if KUBECTL:
        return test(fn)
    _no_kubectl.append(fn.__name__)
    return fn

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets." + GROUP},
    "spec": {"group": GROUP, "scope": "Namespaced",
             "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
             "versions": [{
                 "name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                 "additionalPrinterColumns": [
                     {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                     {"name": "Micro", "type": "integer", "jsonPath": ".spec.batch.micro"},
                     {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
                 "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                     "spec": {"type": "object", "required": ["size"], "x-kubernetes-validations": [
                         {"rule": "self.color != 'blue' || self.size % 2 == 0",
                          "message": "spec.size: must be even for blue widgets"}], "properties": {
                         "size": {"type": "integer", "minimum": 1, "maximum": 10},
                         "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                         "batch": {"type": "object", "default": {}, "properties": {
                             "micro": {"type": "integer", "minimum": 1, "default": 4}}}}},
                     "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}}}]}}


# ---------------------------------------------------------------------------
# Running an emulator

class Emulator:
    """One apiserver.py process; JSON requests to it."""

    def __init__(self, *args):
        self.dir = os.path.join(suite.tmp, "emu-%d" % len(os.listdir(suite.tmp)))
        os.makedirs(self.dir)
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        self.proc = subprocess.Popen([sys.executable, APISERVER, "--port", "0", "--kubeconfig", self.kubeconfig,
                                      "--work-dir", self.dir] + list(args),
                                     stdout=subprocess.PIPE, stderr=open(os.path.join(self.dir, "stderr"), "wb"),
                                     stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline().decode()
        check(line.startswith("listening "), "apiserver.py printed %r, want 'listening URL'", line)
        self.url = line.split()[1]
        self.token = TOKEN if "--token" in args else None
        self.ssl = None
        if self.url.startswith("https"):
            self.ssl = ssl.create_default_context(cafile=os.path.join(self.dir, "ca.pem"))

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def request(self, method, path, body=None, content_type="application/json", headers=None, token=True):
        """(HTTP status, decoded JSON body, response headers)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token and token:
            req.add_header("Authorization", "Bearer " + self.token)
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, context=self.ssl, timeout=20) as resp:
                return resp.status, json.loads(resp.read() or b"null"), resp.headers
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null"), e.headers

    def ok(self, method, path, body=None, **kw):
        code, obj, _ = self.request(method, path, body, **kw)
        check(200 <= code < 300, "%s %s: %d %s", method, path, code, json.dumps(obj)[:400])
        return obj

    def watch(self, path):
        """A streaming GET; yields decoded lines (events) until the stream ends."""
        host, port = self.url.split("//")[1].split(":")
        conn = (http.client.HTTPSConnection(host, int(port), context=self.ssl, timeout=10) if self.ssl
                else http.client.HTTPConnection(host, int(port), timeout=10))
        conn.request("GET", path, headers={"Authorization": "Bearer %s" % self.token} if self.token else {})
        resp = conn.getresponse()
        check(resp.status == 200, "watch %s: %d", path, resp.status)
        check(resp.getheader("Transfer-Encoding") == "chunked", "watch is not chunked")
        try:
            for line in resp:
                yield json.loads(line)
        finally:
            conn.close()

    def kubectl(self, *args, expect=0, stdin=None):
        p = subprocess.run([KUBECTL, "--kubeconfig", self.kubeconfig, "--cache-dir", os.path.join(self.dir, "cache")]
                           + list(args), input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        out, err = p.stdout.decode(), p.stderr.decode()
        check(p.returncode == expect, "kubectl %s: exit %d (want %d): %s%s", " ".join(args), p.returncode, expect,
              out[:300], err[:500])
        return out + err


_emulators = {}


def api():
    """The emulator with TLS and a token (where openssl is installed), started once."""
    if "api" not in _emulators:
        _emulators["api"] = Emulator("--bookmark-seconds", "0.3", "--history", "200", *TLS)
    return _emulators["api"]


def cluster():
    """The emulator with fake kubelets: two nodes with one GPU each, in two zones."""
    if "cluster" not in _emulators:
        _emulators["cluster"] = Emulator("--kubelet", "--nodes", "2", "--zones", "za,zb")
    return _emulators["cluster"]


def wait_for(what, fn, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failure("timed out waiting for " + what)
        time.sleep(0.05)


def ensure_crd(emu):
    code, _, _ = emu.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets." + GROUP)
    if code == 404:
        emu.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)


def widget(name, **spec):
    return {"apiVersion": GROUP + "/v1", "kind": "Widget", "metadata": {"name": name},
            "spec": dict({"size": 1}, **spec)}


# ---------------------------------------------------------------------------
# API semantics

@test
def startup_tls_token_and_discovery():
    emu = api()
    check(emu.url.startswith("https://127.0.0.1:" if TLS else "http://127.0.0.1:"), "url %s", emu.url)
    code, obj, _ = emu.request("GET", "/api/v1/namespaces", token=False)
    check(code == 401 and obj["kind"] == "Status" and obj["reason"] == "Unauthorized" or not TLS,
          "no token: %d %s", code, obj)
    check(emu.ok("GET", "/version")["major"] == "1", "version")
    check(emu.ok("GET", "/api")["versions"] == ["v1"], "/api")
    core = {r["name"] for r in emu.ok("GET", "/api/v1")["resources"]}
    for name in ("pods", "pods/status", "pods/log", "services", "secrets", "configmaps", "nodes", "events",
                 "namespaces"):
        check(name in core, "/api/v1 lacks %s", name)
    groups = {g["name"] for g in emu.ok("GET", "/apis")["groups"]}
    for name in ("coordination.k8s.io", "events.k8s.io", "apiextensions.k8s.io"):
        check(name in groups, "/apis lacks %s", name)
    ensure_crd(emu)
    res = emu.ok("GET", "/apis/%s/v1" % GROUP)["resources"]
    widgets = next(r for r in res if r["name"] == "widgets")
    check(widgets["kind"] == "Widget" and widgets["shortNames"] == ["wd"] and widgets["namespaced"],
          "discovery of the CRD: %s", widgets)
    check(any(r["name"] == "widgets/status" for r in res), "no widgets/status in %s", res)
    with open(emu.kubeconfig) as f:
        text = f.read()
    for needle in ["current-context: emulator", emu.url] + \
            ["certificate-authority-data: ", "token: " + TOKEN] * bool(TLS):
        check(needle in text, "kubeconfig lacks %r:\n%s", needle, text)


@test
def defaults_validation_and_status_subresource():
    emu = api()
    ensure_crd(emu)
    w = emu.ok("POST", WIDGETS, dict(widget("defaults", size=2), status={"phase": "Ignored"}))
    check(w["spec"]["color"] == "red" and w["spec"]["batch"] == {"micro": 4}, "defaults: %s", w["spec"])
    check(w["metadata"]["generation"] == 1 and "status" not in w, "create: %s", w)
    check(w["metadata"]["uid"] and w["metadata"]["creationTimestamp"], "uid/creationTimestamp")
    code, obj, _ = emu.request("POST", WIDGETS, widget("bad", color="green", batch={"micro": 0}))
    check(code == 422 and obj["reason"] == "Invalid", "invalid widget: %d %s", code, obj)
    fields = {c["field"] for c in obj["details"]["causes"]}
    check(fields == {"spec.batch.micro", "spec.color"}, "causes %s", obj["details"]["causes"])
    check("spec.batch.micro: Invalid value: 0" in obj["message"], "message %s", obj["message"])
    code, obj, _ = emu.request("POST", WIDGETS, {"apiVersion": GROUP + "/v1", "kind": "Widget",
                                                 "metadata": {"name": "nosize"}, "spec": {}})
    check(code == 422 and obj["details"]["causes"][0]["field"] == "spec.size", "required: %s", obj)
    code, obj, _ = emu.request("POST", WIDGETS, widget("odd", color="blue", size=3))
    check(code == 422 and obj["details"]["causes"][0]["field"] == "spec" and
          "spec.size: must be even for blue widgets" in obj["message"], "CEL rule: %d %s", code, obj)
    emu.ok("POST", WIDGETS, widget("even", color="blue", size=4))
    # /status changes only status, without a new generation
    path = WIDGETS + "/defaults"
    s = emu.ok("PATCH", path + "/status", {"status": {"phase": "Running"}, "spec": {"size": 9}},
               content_type="application/merge-patch+json")
    check(s["status"]["phase"] == "Running" and s["spec"]["size"] == 2 and s["metadata"]["generation"] == 1,
          "status patch: %s", s)
    # the main endpoint changes spec (new generation) and ignores status
    m = emu.ok("PATCH", path, {"spec": {"size": 3}, "status": {"phase": "Nope"}},
               content_type="application/merge-patch+json")
    check(m["spec"]["size"] == 3 and m["status"]["phase"] == "Running" and m["metadata"]["generation"] == 2,
          "spec patch: %s", m)
    # a metadata-only change keeps the generation, a no-op writes nothing
    m2 = emu.ok("PATCH", path, [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}],
                content_type="application/json-patch+json")
    check(m2["metadata"]["generation"] == 2 and m2["metadata"]["labels"] == {"a": "b"}, "label patch: %s", m2)
    m3 = emu.ok("PATCH", path, {"metadata": {"labels": {"a": "b"}}}, content_type="application/merge-patch+json")
    check(m3["metadata"]["resourceVersion"] == m2["metadata"]["resourceVersion"], "no-op patch wrote")


@test
def conflicts_on_stale_resource_version():
    emu = api()
    ensure_crd(emu)
    w = emu.ok("POST", WIDGETS, widget("stale"))
    code, obj, _ = emu.request("POST", WIDGETS, widget("stale"))
    check(code == 409 and obj["reason"] == "AlreadyExists", "second create: %d %s", code, obj)
    fresh = emu.ok("PUT", WIDGETS + "/stale", dict(w, spec={"size": 5}))
    check(int(fresh["metadata"]["resourceVersion"]) > int(w["metadata"]["resourceVersion"]), "rv not bumped")
    code, obj, _ = emu.request("PUT", WIDGETS + "/stale", dict(w, spec={"size": 6}))
    check(code == 409 and obj["reason"] == "Conflict" and obj["kind"] == "Status", "stale PUT: %d %s", code, obj)
    code, obj, _ = emu.request("PATCH", WIDGETS + "/stale/status", {"metadata": {"resourceVersion": w["metadata"][
        "resourceVersion"]}, "status": {"phase": "X"}}, content_type="application/merge-patch+json")
    check(code == 409, "stale status PATCH: %d %s", code, obj)
    no_rv = dict(fresh, metadata=dict(fresh["metadata"], resourceVersion=None))
    code, obj, _ = emu.request("PUT", WIDGETS + "/stale", no_rv)
    check(code == 422, "custom resource PUT without resourceVersion: %d %s", code, obj)
    code, obj, _ = emu.request("GET", WIDGETS + "/missing")
    check(code == 404 and obj["reason"] == "NotFound", "missing: %d %s", code, obj)


@test
def lists_with_selectors_and_chunks():
    emu = api()
    emu.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "lists"}})
    for i in range(5):
        emu.ok("POST", "/api/v1/namespaces/lists/configmaps",
               {"metadata": {"name": "cm-%d" % i, "labels": {"tier": "ab"[i % 2], "n": str(i)}}})
    names = lambda lst: [o["metadata"]["name"] for o in lst["items"]]
    base = "/api/v1/namespaces/lists/configmaps"
    check(names(emu.ok("GET", base + "?labelSelector=tier%3Da")) == ["cm-0", "cm-2", "cm-4"], "tier=a")
    check(names(emu.ok("GET", base + "?labelSelector=tier!%3Da,n%20notin%20(1)")) == ["cm-3"], "!=, notin")
    check(names(emu.ok("GET", base + "?labelSelector=n%20in%20(0,4),tier")) == ["cm-0", "cm-4"], "in, exists")
    check(names(emu.ok("GET", base + "?labelSelector=!tier")) == [], "!exists")
    check(names(emu.ok("GET", base + "?fieldSelector=metadata.name%3Dcm-3")) == ["cm-3"], "fieldSelector")
    code, obj, _ = emu.request("GET", base + "?fieldSelector=data.x%3D1")
    check(code == 400, "unsupported field selector: %d", code)
    first = emu.ok("GET", base + "?limit=2")
    check(names(first) == ["cm-0", "cm-1"] and first["metadata"]["continue"], "page 1: %s", first["metadata"])
    emu.ok("DELETE", base + "/cm-2")          # pages come from the snapshot of the first one
    second = emu.ok("GET", base + "?limit=2&continue=" + first["metadata"]["continue"])
    check(names(second) == ["cm-2", "cm-3"], "page 2: %s", names(second))
    check(second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"], "page rv differs")
    emu.ok("POST", "/_emulator/compact")
    code, obj, _ = emu.request("GET", base + "?limit=2&continue=" + second["metadata"]["continue"])
    check(code == 410 and obj["reason"] == "Expired", "continue after compaction: %d %s", code, obj)
    check(emu.ok("GET", "/api/v1/pods")["metadata"]["resourceVersion"], "all-namespace list rv")


@test
def watch_events_bookmarks_and_gone():
    emu = api()
    base = "/api/v1/namespaces/default/configmaps"
    rv = emu.ok("GET", base)["metadata"]["resourceVersion"]
    stream = emu.watch(base + "?watch=1&allowWatchBookmarks=true&timeoutSeconds=5&labelSelector=w%3D1"
                       "&resourceVersion=" + rv)
    emu.ok("POST", base, {"metadata": {"name": "watched", "labels": {"w": "1"}}})
    emu.ok("POST", base, {"metadata": {"name": "unwatched"}})
    emu.ok("PATCH", base + "/watched", {"data": {"k": "v"}}, content_type="application/merge-patch+json")
    emu.ok("PATCH", base + "/watched", {"metadata": {"labels": {"w": "2"}}},
           content_type="application/merge-patch+json")
    seen = []
    for ev in stream:
        if ev["type"] == "BOOKMARK":
            check(int(ev["object"]["metadata"]["resourceVersion"]) > int(rv), "bookmark rv %s", ev)
            if "DELETED" in seen:
                seen.append("BOOKMARK")
                break
            continue
        seen.append(ev["type"])
        check(ev["object"]["metadata"]["name"] == "watched", "event for %s", ev["object"]["metadata"]["name"])
    stream.close()
    # leaving the selection reads as DELETED; a bookmark follows within the stream's 5 s
    check(seen == ["ADDED", "MODIFIED", "DELETED", "BOOKMARK"], "events %s (bookmarks not shown until the end)",
          seen)
    # an RV older than the compaction point: one ERROR event with a 410 Status, then the end
    emu.ok("POST", "/_emulator/compact")
    events = list(emu.watch(base + "?watch=1&resourceVersion=" + rv))
    check(len(events) == 1 and events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410,
          "watch from a compacted rv: %s", events)
    # a forced compaction can also end the open watches
    rv2 = emu.ok("GET", base)["metadata"]["resourceVersion"]
    stream = emu.watch(base + "?watch=1&timeoutSeconds=10&resourceVersion=" + rv2)
    emu.ok("POST", base, {"metadata": {"name": "before-end"}})
    check(next(stream)["type"] == "ADDED", "event before compaction")
    emu.ok("POST", "/_emulator/compact?endWatches=true")
    rest = list(stream)
    check([e["type"] for e in rest] == ["ERROR"] and rest[0]["object"]["reason"] == "Expired", "end: %s", rest)


@test
def garbage_collection_by_owner_uid():
    emu = api()
    base = "/api/v1/namespaces/default"
    owner = emu.ok("POST", base + "/configmaps", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"],
           "controller": True}
    emu.ok("POST", base + "/secrets", {"metadata": {"name": "owned", "ownerReferences": [ref]},
                                       "stringData": {"token": "t"}})
    emu.ok("POST", base + "/services", {"metadata": {"name": "owned-svc", "ownerReferences": [ref]},
                                        "spec": {"ports": [{"port": 80}]}})
    emu.ok("DELETE", base + "/configmaps/owner")
    wait_for("dependents deleted", lambda: emu.request("GET", base + "/secrets/owned")[0] == 404 and
             emu.request("GET", base + "/services/owned-svc")[0] == 404, 5)
    # Orphan: the dependent stays, without the reference
    owner = emu.ok("POST", base + "/configmaps", {"metadata": {"name": "owner2"}})
    ref = dict(ref, name="owner2", uid=owner["metadata"]["uid"])
    emu.ok("POST", base + "/secrets", {"metadata": {"name": "orphan", "ownerReferences": [ref]}})
    emu.ok("DELETE", base + "/configmaps/owner2", {"propagationPolicy": "Orphan"})
    time.sleep(0.3)
    s = emu.ok("GET", base + "/secrets/orphan")
    check(not s["metadata"].get("ownerReferences"), "orphan kept its reference: %s", s["metadata"])
    # finalizers hold a deletion until they are removed
    emu.ok("POST", base + "/configmaps", {"metadata": {"name": "held", "finalizers": ["test/hold"]}})
    code, obj, _ = emu.request("DELETE", base + "/configmaps/held")
    check(code == 202 and obj["metadata"]["deletionTimestamp"], "delete with finalizer: %d %s", code, obj)
    emu.ok("PATCH", base + "/configmaps/held", {"metadata": {"finalizers": None}},
           content_type="application/merge-patch+json")
    check(emu.request("GET", base + "/configmaps/held")[0] == 404, "finalizer removal did not delete")
    # Foreground: the owner waits, marked, until its dependents are gone
    owner = emu.ok("POST", base + "/configmaps", {"metadata": {"name": "owner3"}})
    ref = dict(ref, name="owner3", uid=owner["metadata"]["uid"])
    emu.ok("POST", base + "/secrets", {"metadata": {"name": "fg", "ownerReferences": [ref]}})
    code, obj, _ = emu.request("DELETE", base + "/configmaps/owner3", {"propagationPolicy": "Foreground"})
    check(code == 202 and "foregroundDeletion" in obj["metadata"]["finalizers"], "foreground: %d %s", code, obj)
    wait_for("foreground deletion", lambda: emu.request("GET", base + "/configmaps/owner3")[0] == 404 and
             emu.request("GET", base + "/secrets/fg")[0] == 404, 5)


@test
def namespace_deletion_empties_it():
    emu = api()
    emu.ok("POST", "/api/v1/namespaces", {"metadata": {"name": "doomed"}})
    emu.ok("POST", "/api/v1/namespaces/doomed/configmaps", {"metadata": {"name": "c"}})
    code, obj, _ = emu.request("DELETE", "/api/v1/namespaces/doomed")
    check(code == 202 and obj["status"]["phase"] == "Terminating", "delete namespace: %d %s", code, obj)
    wait_for("namespace removed", lambda: emu.request("GET", "/api/v1/namespaces/doomed")[0] == 404, 5)
    code, obj, _ = emu.request("GET", "/api/v1/namespaces/doomed/configmaps/c")
    check(code == 404, "configmap survived its namespace")
    code, obj, _ = emu.request("POST", "/api/v1/namespaces/nowhere/configmaps", {"metadata": {"name": "c"}})
    check(code == 404 and obj["details"]["kind"] == "namespaces", "create in a missing namespace: %d %s", code, obj)


@test
def events_leases_and_faults():
    emu = api()
    ev = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"},
          "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "pliant.dev/operator",
          "reportingInstance": "op-0", "action": "Reconfigure", "reason": "Reconfigured", "type": "Normal",
          "note": "2x4", "regarding": {"kind": "Widget", "name": "w", "namespace": "default"}}
    emu.ok("POST", "/apis/events.k8s.io/v1/namespaces/default/events", ev)
    core = emu.ok("GET", "/api/v1/namespaces/default/events/e1")
    check(core["message"] == "2x4" and core["involvedObject"]["name"] == "w", "core view of event: %s", core)
    code, obj, _ = emu.request("POST", "/apis/events.k8s.io/v1/namespaces/default/events",
                               dict(ev, metadata={"name": "e2"}, reportingController=None))
    check(code == 422, "event without reportingController: %d", code)
    lease = emu.ok("POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases",
                   {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}})
    emu.ok("POST", "/_emulator/faults", {"status": 500, "count": 1, "method": "PUT", "path_regex": "leases/leader$"})
    code, obj, _ = emu.request("PUT", "/apis/coordination.k8s.io/v1/namespaces/default/leases/leader", lease)
    check(code == 500 and obj["reason"] == "InternalError", "injected fault: %d %s", code, obj)
    emu.ok("PUT", "/apis/coordination.k8s.io/v1/namespaces/default/leases/leader", lease)
    log = emu.ok("GET", "/_emulator/requests")
    check(log["count"] > 0 and log["requests"][-1]["method"] == "PUT", "request log %s", log["requests"][-1:])


@kubectl_test
def kubectl_apply_get_delete():
    emu = api()
    crd = os.path.join(emu.dir, "crd.json")
    with open(crd, "w") as f:
        json.dump(dict(CRD, metadata={"name": "gadgets.test.pliant.dev"}, spec=dict(
            CRD["spec"], names={"plural": "gadgets", "kind": "Gadget", "shortNames": ["gd"]})), f)
    check("created" in emu.kubectl("apply", "-f", crd), "crd apply")
    doc = "apiVersion: test.pliant.dev/v1\nkind: Gadget\nmetadata:\n  name: g1\nspec:\n  size: %s\n"
    check("gadget.test.pliant.dev/g1 created" in emu.kubectl("apply", "-f", "-", stdin=(doc % 3).encode()),
          "apply g1")
    check("unchanged" in emu.kubectl("apply", "-f", "-", stdin=(doc % 3).encode()), "re-apply")
    check("configured" in emu.kubectl("apply", "-f", "-", stdin=(doc % 4).encode()), "apply change")
    out = emu.kubectl("get", "gd")
    lines = out.splitlines()
    check(lines[0].split() == ["NAME", "PHASE", "MICRO", "AGE"] and lines[1].split()[:2] == ["g1", "4"],
          "kubectl get gd:\n%s", out)
    one = emu.kubectl("get", "gadget", "g1").splitlines()
    check(one[0].split() == ["NAME", "PHASE", "MICRO", "AGE"], "kubectl get gadget g1:\n%s", "\n".join(one))
    got = json.loads(emu.kubectl("get", "gadget", "g1", "-o", "json"))
    check(got["spec"]["size"] == 4 and got["spec"]["color"] == "red", "get -o json: %s", got["spec"])
    out = emu.kubectl("apply", "-f", "-", stdin=(doc % 30).encode(), expect=1)
    check("spec.size" in out and "less than or equal to 10" in out, "invalid apply: %s", out)
    check('deleted' in emu.kubectl("delete", "gadget", "g1"), "delete")
    check("No resources found" in emu.kubectl("get", "gadgets"), "after delete")
    emu.kubectl("delete", "-f", crd)


# ---------------------------------------------------------------------------
# Fake kubelets

def pod(name, command, restart="Never", grace=30, gpus=0, **extra):
    container = {"name": "main", "image": "busybox", "command": command,
                 "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                         {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    container.update(extra.pop("container", {}))
    return {"metadata": {"name": name, "labels": {"app": name}},
            "spec": dict({"restartPolicy": restart, "terminationGracePeriodSeconds": grace,
                          "containers": [container]}, **extra)}


PODS = "/api/v1/namespaces/default/pods"


def pod_state(emu, name):
    code, obj, _ = emu.request("GET", PODS + "/" + name)
    return obj if code == 200 else None


def pid_of(p):
    return int(p["status"]["containerStatuses"][0]["containerID"].split("//")[1])


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open("/proc/%d/stat" % pid) as f:
        return f.read().split(")")[1].split()[0] != "Z"


@test
def kubelet_runs_a_pod_to_completion():
    emu = cluster()
    nodes = emu.ok("GET", "/api/v1/nodes")["items"]
    zones = sorted(n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes)
    check(zones == ["za", "zb"], "zones %s", zones)
    emu.ok("POST", "/api/v1/namespaces/default/secrets", {"metadata": {"name": "tok"}, "stringData": {"t": "s3cret"}})
    emu.ok("POST", PODS, pod("hello", ["sh", "-c", 'echo hi $POD_NAME $POD_IP; cat "$1"; echo; cat "$2"', "sh",
                                       "/etc/tok/t", "/var/run/secrets/kubernetes.io/serviceaccount/namespace"],
                             container={"volumeMounts": [{"name": "tok", "mountPath": "/etc/tok"}]},
                             volumes=[{"name": "tok", "secret": {"secretName": "tok"}}]))
    p = wait_for("hello to succeed", lambda: (pod_state(emu, "hello") or {}).get("status", {}).get("phase")
                 in ("Succeeded", "Failed") and pod_state(emu, "hello"))
    cs = p["status"]["containerStatuses"][0]
    check(p["status"]["phase"] == "Succeeded" and cs["state"]["terminated"]["exitCode"] == 0, "status %s", p["status"])
    ip = p["status"]["podIP"]
    check(ip.startswith("127.0.") and p["spec"]["nodeName"].startswith("node-"), "ip %s node %s", ip,
          p["spec"].get("nodeName"))
    host, port = emu.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", PODS + "/hello/log")
    log = conn.getresponse().read().decode()
    check(log == "hi hello %s\ns3cret\ndefault" % ip, "log %r", log)
    events = emu.ok("GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dhello")
    reasons = [e["reason"] for e in events["items"]]
    check("Scheduled" in reasons and "Started" in reasons, "events %s", reasons)
    emu.ok("DELETE", PODS + "/hello")


@test
def deleting_a_pod_kills_its_process():
    emu = cluster()
    emu.ok("POST", PODS, pod("sleeper", ["sleep", "30"], grace=5))
    p = wait_for("sleeper running", lambda: (pod_state(emu, "sleeper") or {}).get("status", {}).get("phase")
                 == "Running" and pod_state(emu, "sleeper"))
    ready = {c["type"]: c["status"] for c in p["status"]["conditions"]}
    check(ready.get("Ready") == "True" and ready.get("PodScheduled") == "True", "conditions %s", ready)
    pid = pid_of(p)
    check(alive(pid), "process %d not running", pid)
    code, obj, _ = emu.request("DELETE", PODS + "/sleeper")
    check(code in (200, 202), "delete: %d", code)
    wait_for("sleeper removed", lambda: pod_state(emu, "sleeper") is None, 5)
    check(not alive(pid), "process %d survived its Pod", pid)


@test
def eviction_marks_disruption_target():
    emu = cluster()
    emu.ok("POST", PODS, pod("evictee", ["sleep", "30"], grace=1))
    p = wait_for("evictee running", lambda: (pod_state(emu, "evictee") or {}).get("status", {}).get("phase")
                 == "Running" and pod_state(emu, "evictee"))
    stream = emu.watch(PODS + "?watch=1&timeoutSeconds=5&fieldSelector=metadata.name%3Devictee&resourceVersion="
                       + p["metadata"]["resourceVersion"])
    emu.ok("POST", PODS + "/evictee/eviction", {"apiVersion": "policy/v1", "kind": "Eviction",
                                                "metadata": {"name": "evictee"}})
    seen = []
    for ev in stream:
        seen.append(ev)
        if ev["type"] == "DELETED":
            break
    stream.close()
    conds = {c["type"]: c for c in seen[-1]["object"]["status"]["conditions"]}
    check(conds.get("DisruptionTarget", {}).get("reason") == "EvictionByEvictionAPI", "conditions %s", conds)
    check(any(e["object"]["metadata"].get("deletionTimestamp") for e in seen[:-1]), "no graceful phase")
    check(not alive(pid_of(p)), "evicted process still running")


@test
def topology_spread_prefers_emptier_zones():
    emu = cluster()
    filler = {"nodeSelector": {"kubernetes.io/hostname": "node-1"}}
    for name in ("filler-1", "filler-2"):
        emu.ok("POST", PODS, pod(name, ["sleep", "30"], grace=1, **filler))
    tsc = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchExpressions": [{"key": "job", "operator": "In", "values": ["spread"]}]}}]
    zones = []
    for name in ("spread-1", "spread-2"):
        spec = pod(name, ["sleep", "30"], grace=1, topologySpreadConstraints=tsc)
        spec["metadata"]["labels"]["job"] = "spread"
        emu.ok("POST", PODS, spec)
        node = wait_for(name + " bound", lambda: (pod_state(emu, name) or {}).get("spec", {}).get("nodeName"))
        zones.append(emu.ok("GET", "/api/v1/nodes/" + node)["metadata"]["labels"]["topology.kubernetes.io/zone"])
    check(sorted(zones) == ["za", "zb"], "spread pods in zones %s", zones)
    for name in ("filler-1", "filler-2", "spread-1", "spread-2"):
        emu.request("DELETE", PODS + "/" + name + "?gracePeriodSeconds=0")


@test
def pending_until_a_gpu_node_is_added():
    emu = cluster()
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        emu.ok("POST", PODS, pod(name, ["sleep", "30"], grace=1, gpus=1))
    wait_for("two GPU pods running", lambda: sum(
        (pod_state(emu, n) or {}).get("status", {}).get("phase") == "Running" for n in ("gpu-a", "gpu-b", "gpu-c"))
        == 2)
    pending = [n for n in ("gpu-a", "gpu-b", "gpu-c") if pod_state(emu, n)["status"]["phase"] == "Pending"]
    check(len(pending) == 1, "pending %s", pending)
    cond = {c["type"]: c for c in pod_state(emu, pending[0])["status"].get("conditions", [])}
    check(cond["PodScheduled"]["reason"] == "Unschedulable" and "nvidia.com/gpu" in cond["PodScheduled"]["message"],
          "unschedulable condition %s", cond)
    node = emu.ok("POST", "/_emulator/nodes", {"zone": "zc"})
    wait_for("third pod running", lambda: (pod_state(emu, pending[0]) or {}).get("status", {}).get("phase")
             == "Running")
    check(pod_state(emu, pending[0])["spec"]["nodeName"] == node["metadata"]["name"], "bound elsewhere")
    # losing a node: its pod is killed, marked Failed with DisruptionTarget, then removed
    victim = pod_state(emu, pending[0])
    pid = pid_of(victim)
    stream = emu.watch(PODS + "?watch=1&timeoutSeconds=5&fieldSelector=metadata.name%3D" + pending[0]
                       + "&resourceVersion=" + victim["metadata"]["resourceVersion"])
    emu.ok("DELETE", "/api/v1/nodes/" + node["metadata"]["name"])
    last = None
    for ev in stream:
        if ev["type"] == "DELETED":
            break
        last = ev["object"]
    stream.close()
    conds = {c["type"]: c for c in last["status"]["conditions"]}
    check(last["status"]["phase"] == "Failed" and conds["DisruptionTarget"]["status"] == "True",
          "lost pod status %s", last["status"])
    wait_for("process killed", lambda: not alive(pid), 3)
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        emu.request("DELETE", PODS + "/" + name + "?gracePeriodSeconds=0")


@test
def node_not_ready_evicts_its_pods():
    emu = cluster()
    emu.ok("POST", "/_emulator/nodes", {"name": "flaky", "labels": {"pool": "flaky"}, "gpus": 0})
    emu.ok("POST", PODS, pod("on-flaky", ["sleep", "30"], nodeSelector={"pool": "flaky"}))
    p = wait_for("on-flaky running", lambda: (pod_state(emu, "on-flaky") or {}).get("status", {}).get("phase")
                 == "Running" and pod_state(emu, "on-flaky"))
    check(p["spec"]["nodeName"] == "flaky", "nodeSelector ignored: %s", p["spec"]["nodeName"])
    stream = emu.watch(PODS + "?watch=1&timeoutSeconds=5&labelSelector=app%3Don-flaky&resourceVersion="
                       + p["metadata"]["resourceVersion"])
    node = emu.ok("POST", "/_emulator/nodes/flaky/notready")
    check({t["key"] for t in node["spec"]["taints"]} == {"node.kubernetes.io/unreachable"}, "taints %s",
          node["spec"].get("taints"))
    last = None
    for ev in stream:
        if ev["type"] == "DELETED":
            break
        last = ev["object"]
    stream.close()
    conds = {c["type"]: c for c in last["status"]["conditions"]}
    check(conds["DisruptionTarget"]["reason"] == "DeletionByTaintManager", "conditions %s", conds)
    wait_for("process killed", lambda: not alive(pid_of(p)), 3)
    emu.ok("DELETE", "/api/v1/nodes/flaky")


@kubectl_test
def kubectl_sees_pods_and_logs():
    emu = cluster()
    emu.ok("POST", PODS, pod("talker", ["sh", "-c", "echo ready; sleep 30"], grace=2))
    wait_for("talker running", lambda: (pod_state(emu, "talker") or {}).get("status", {}).get("phase") == "Running")
    out = emu.kubectl("get", "pods", "-o", "wide")
    row = next(l.split() for l in out.splitlines() if l.startswith("talker"))
    check(row[1:3] == ["1/1", "Running"] and row[5].startswith("127.0."), "kubectl get pods:\n%s", out)
    wait_for("log line", lambda: "ready" in emu.kubectl("logs", "talker"), 3)
    check('"talker" deleted' in emu.kubectl("delete", "pod", "talker"), "kubectl delete pod")
    check(pod_state(emu, "talker") is None, "kubectl delete returned before the Pod was gone")
    # typed commands send protobuf bodies
    emu.kubectl("create", "secret", "generic", "from-kubectl", "--from-literal=k=v")
    secret = emu.ok("GET", "/api/v1/namespaces/default/secrets/from-kubectl")
    check(secret["data"] == {"k": "dg=="} and secret["type"] == "Opaque", "kubectl create secret: %s", secret)
    emu.ok("POST", PODS, pod("drained", ["sleep", "30"], grace=1))
    node = wait_for("drained bound", lambda: (pod_state(emu, "drained") or {}).get("spec", {}).get("nodeName"))
    check("evicted" in emu.kubectl("drain", node, "--force", "--grace-period=1"), "kubectl drain")
    check(pod_state(emu, "drained") is None and emu.ok("GET", "/api/v1/nodes/" + node)["spec"]["unschedulable"],
          "after drain")
    emu.kubectl("uncordon", node)


def main():
    for name in _no_kubectl:
        print("skip %s.%s: kubectl not installed" % (suite.prefix, name))
    try:
        return suite.main()
    finally:
        for emu in _emulators.values():
            emu.stop()


if __name__ == "__main__":
    sys.exit(main())
