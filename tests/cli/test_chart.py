#!/usr/bin/env python3
"""Tests of the Helm chart charts/pliant (packaging).

`helm` is not installed where the tests run: tests/k8s/chart.py renders the
subset of Helm's template language the chart keeps to (strictly: anything
outside it is an error).

Every template is rendered with the default values and with two other value
sets; each must give valid YAML documents (tests/yamlmini.py) of the expected
kinds, security settings, RBAC verbs, replicas, probes, ports and selectors.
Where kubectl is installed, it decodes the rendered objects offline too.

Run: python3 tests/cli/test_chart.py --build build [-k SUBSTRING]
"""

import json
import os
import re
import shutil
import subprocess
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)
sys.path.insert(0, os.path.join(TESTS, "k8s"))
from clitest import REPO, Suite, check  # noqa: E402
import yamlmini  # noqa: E402
from chart import (CHART, Renderer, TemplateError, _Parser, _split_template, default_values,  # noqa: E402
                   merge_values, render)

suite = Suite("chart")
test = suite.test


def by_kind(objs, kind):
    return [o for _, o in objs if o.get("kind") == kind]


def one(objs, kind):
    found = by_kind(objs, kind)
    check(len(found) == 1, "expected one %s, found %d", kind, len(found))
    return found[0]


# The second and third value sets.
CUSTOM = {
    "fullnameOverride": "tj-controller",
    "operator": {
        "replicas": 3,
        "image": {"repository": "registry.example.com/pliant-operator", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}},
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"example.com/team": "ml"},
        "podLabels": {"team": "ml"},
        "env": [{"name": "TZ", "value": "UTC"}],
    },
    "worker": {"image": {"repository": "registry.example.com/pliant-worker", "tag": "1.2.3-cuda12"}},
    "logLevel": "debug",
    "watchNamespace": "team-a",
    "metrics": {"port": 9090, "service": {"port": 9090, "annotations": {"prometheus.io/scrape": "true"}},
                "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "health": {"port": 9091},
    "dashboard": {"port": 9092, "host": "0.0.0.0"},
    "coordinator": {"port": 9443},
    "serviceAccount": {"name": "pliant-sa", "annotations": {"example.com/role": "x"}},
    "networkPolicy": {"workerNamespaces": ["team-a", "team-b"], "perJob": False,
                      "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
                      "healthFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                      "dashboardFrom": [{"namespaceSelector": {"matchLabels": {"name": "ml-tools"}}}]},
}

MINIMAL = {
    "operator": {"replicas": 1},
    "leaderElection": {"enabled": False},
    "serviceAccount": {"create": False, "name": "existing-sa"},
    "rbac": {"create": False},
    "networkPolicy": {"enabled": False},
}


# --------------------------------------------------------------------------
# Tests


@test
def chart_metadata():
    with open(os.path.join(CHART, "Chart.yaml")) as f:
        chart = yamlmini.load(f.read())
    check(chart["apiVersion"] == "v2" and chart["name"] == "pliant" and chart["type"] == "application",
          "Chart.yaml: %r", chart)
    check(re.match(r"^\d+\.\d+\.\d+$", chart["version"]), "version %r", chart["version"])
    check(isinstance(chart["appVersion"], str) and chart["appVersion"], "appVersion %r", chart.get("appVersion"))
    v = default_values()
    check(v["operator"]["replicas"] == 2, "replicas %r", v["operator"]["replicas"])
    check(v["leaderElection"]["enabled"] is True, "leader election off by default")
    check(v["metrics"]["serviceMonitor"]["enabled"] is False, "serviceMonitor on by default")
    for part in ("operator", "worker"):
        img = v[part]["image"]
        check(set(img) == {"repository", "tag", "pullPolicy"}, "%s.image %r", part, img)


@test
def chart_crd_is_the_crd():
    """charts/pliant/crds/trainingjob.yaml is a byte-identical copy of crds/trainingjob.yaml
    (a copy, not a symlink: helm package and some Git clients do not keep symlinks)."""
    chart_crd = os.path.join(CHART, "crds", "trainingjob.yaml")
    check(not os.path.islink(chart_crd), "%s is a symlink", chart_crd)
    with open(os.path.join(REPO, "crds", "trainingjob.yaml"), "rb") as a, open(chart_crd, "rb") as b:
        check(a.read() == b.read(), "charts/pliant/crds/trainingjob.yaml differs from crds/trainingjob.yaml: "
              "cp crds/trainingjob.yaml charts/pliant/crds/")
    check(sorted(os.listdir(os.path.join(CHART, "crds"))) == ["trainingjob.yaml"], "extra files in the chart's crds/")


@test
def renders_default_values():
    objs = render()
    kinds = sorted(o["kind"] for _, o in objs)
    # one NetworkPolicy: the operator's (the workers' are per job, written by the operator)
    check(kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding",
                           "ClusterRoleBinding", "Role", "RoleBinding", "Deployment", "Service",
                           "NetworkPolicy", "PodDisruptionBudget"]),
          "kinds %r", kinds)
    names = set()
    for tmpl, o in objs:
        md = o["metadata"]
        key = (o["kind"], md.get("namespace"), md["name"])
        check(key not in names, "two objects %r", key)
        names.add(key)
        check(re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", md["name"]) and len(md["name"]) <= 63,
              "%s: bad name %r", tmpl, md["name"])
        labels = md.get("labels", {})
        check(labels.get("app.kubernetes.io/managed-by") == "Helm" and labels.get("app.kubernetes.io/part-of") == "pliant",
              "%s: %s labels %r", tmpl, o["kind"], labels)
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            check(md.get("namespace"), "%s: %s without a namespace", tmpl, o["kind"])
    check(one(objs, "Deployment")["metadata"]["name"] == "pliant-operator", "default name")


def _container(dep):
    cs = dep["spec"]["template"]["spec"]["containers"]
    check(len(cs) == 1, "containers: %d", len(cs))
    return cs[0]


@test
def deployment_defaults():
    objs = render()
    dep = one(objs, "Deployment")
    check(dep["apiVersion"] == "apps/v1", "apiVersion %r", dep["apiVersion"])
    spec = dep["spec"]
    check(spec["replicas"] == 2, "replicas %r", spec["replicas"])
    tmpl_labels = spec["template"]["metadata"]["labels"]
    sel = spec["selector"]["matchLabels"]
    check(sel == {"app.kubernetes.io/name": "pliant-operator", "app.kubernetes.io/instance": "pliant"},
          "selector %r", sel)
    check(all(tmpl_labels.get(k) == v for k, v in sel.items()), "template labels %r do not match %r", tmpl_labels, sel)
    pod = spec["template"]["spec"]
    sa = one(objs, "ServiceAccount")
    check(pod["serviceAccountName"] == sa["metadata"]["name"], "serviceAccountName %r", pod["serviceAccountName"])
    psc = pod["securityContext"]
    check(psc.get("runAsNonRoot") is True and psc.get("runAsUser") == 65532 and
          psc.get("seccompProfile") == {"type": "RuntimeDefault"}, "pod securityContext %r", psc)
    c = _container(dep)
    check(c["image"] == "ghcr.io/pliant-dev/pliant-operator:0.1.0", "image %r", c["image"])
    check(c["command"] == ["/usr/local/bin/pliant-operator"], "command %r", c["command"])
    check(c["args"] == ["--leader-elect", "--metrics-addr=:8080", "--health-addr=:8081",
                        "--dashboard-addr=127.0.0.1:8090", "--log-level=info", "--job-network-policy"],
          "args %r", c["args"])
    env = {e["name"]: e for e in c["env"]}
    check(env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, "POD_NAME %r", env["POD_NAME"])
    check(env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}},
          "POD_NAMESPACE %r", env["POD_NAMESPACE"])
    check(env["PLIANT_WORKER_IMAGE"]["value"] == "ghcr.io/pliant-dev/pliant-worker:0.1.0", "worker image %r",
          env["PLIANT_WORKER_IMAGE"])
    check(env["PLIANT_COORDINATOR_PORT"]["value"] == "8443", "coordinator port env %r", env["PLIANT_COORDINATOR_PORT"])
    check(env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}},
          "POD_IP (the jobs' EndpointSlices' address) %r", env.get("POD_IP"))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports == {"metrics": 8080, "health": 8081, "coordinator": 8443, "dashboard": 8090}, "ports %r", ports)
    check(c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}, "liveness %r", c["livenessProbe"])
    check(c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}, "readiness %r", c["readinessProbe"])
    sc = c["securityContext"]
    check(sc.get("readOnlyRootFilesystem") is True and sc.get("allowPrivilegeEscalation") is False and
          sc.get("runAsNonRoot") is True and sc.get("capabilities") == {"drop": ["ALL"]} and
          sc.get("seccompProfile") == {"type": "RuntimeDefault"} and sc.get("privileged") is False,
          "container securityContext %r", sc)
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    check(mounts.get("/tmp") in vols and "emptyDir" in vols[mounts["/tmp"]], "/tmp must be a writable emptyDir")
    check(c["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}, "resources %r", c["resources"])
    aff = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    check(aff["podAffinityTerm"]["labelSelector"]["matchLabels"] == sel, "anti-affinity %r", aff)
    check("nodeSelector" not in pod and "tolerations" not in pod and "priorityClassName" not in pod,
          "empty scheduling values rendered: %r", sorted(pod))
    pdb = one(objs, "PodDisruptionBudget")
    check(pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": sel}}, "PDB %r", pdb["spec"])


def _rules(role):
    rules = {}
    for r in role["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                check((g, res) not in rules, "%s/%s in two rules", g, res)
                check("*" not in r["verbs"] and g != "*" and res != "*", "wildcard in %r", r)
                rules[(g, res)] = sorted(r["verbs"])
    return rules


OPERATOR_RULES = {
    ("pliant.dev", "trainingjobs"): ["delete", "list", "watch"],
    ("pliant.dev", "trainingjobs/status"): ["patch"],
    ("pliant.dev", "trainingjobs/finalizers"): ["update"],
    ("", "pods"): ["create", "delete", "list", "watch"],
    ("", "services"): ["create", "get"],
    ("", "secrets"): ["create", "get"],
    ("discovery.k8s.io", "endpointslices"): ["create", "patch"],
    ("events.k8s.io", "events"): ["create"],
    ("networking.k8s.io", "networkpolicies"): ["create"],
}


def _binding(objs, kind, name):
    found = [o for o in by_kind(objs, kind) if o["metadata"]["name"] == name]
    check(len(found) == 1, "expected one %s %s, found %d", kind, name, len(found))
    return found[0]


@test
def rbac_least_privilege():
    objs = render()
    roles = {o["metadata"]["name"]: o for o in by_kind(objs, "ClusterRole")}
    check(set(roles) == {"pliant-operator", "pliant-operator-nodes"}, "ClusterRoles %r", sorted(roles))
    got = _rules(roles["pliant-operator"])
    check(got == OPERATOR_RULES, "ClusterRole rules:\n  got  %r\n  want %r", got, OPERATOR_RULES)
    got = _rules(roles["pliant-operator-nodes"])
    check(got == {("", "nodes"): ["get"]}, "nodes ClusterRole %r", got)
    lease = one(objs, "Role")
    check(lease["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "create", "update"]}], "lease Role %r", lease["rules"])
    check(lease["metadata"]["namespace"] == "pliant-system", "lease Role namespace")
    sa = one(objs, "ServiceAccount")["metadata"]
    subjects = [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]
    for kind, name, role_obj in (("ClusterRoleBinding", "pliant-operator", roles["pliant-operator"]),
                                 ("ClusterRoleBinding", "pliant-operator-nodes", roles["pliant-operator-nodes"]),
                                 ("RoleBinding", "pliant-operator-leader-election", lease)):
        b = _binding(objs, kind, name)
        check(b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_obj["kind"],
                               "name": role_obj["metadata"]["name"]}, "%s roleRef %r", kind, b["roleRef"])
        check(b["subjects"] == subjects, "%s subjects %r", kind, b["subjects"])


REQUESTS_H = os.path.join(REPO, "operator", "k8s", "kube_requests.h")
K8S_DIR = os.path.join(REPO, "operator", "k8s")
# The client's calls and the RBAC verbs they need; the client and watch themselves,
# and the table, are not call sites.
CALL_VERBS = {"pl_kube_get": "get", "pl_kube_create": "create", "pl_kube_event_create": "create",
              "pl_kube_replace": "update", "pl_kube_update_retry": "update", "pl_kube_patch": "patch",
              "pl_kube_patch_status": "patch", "pl_kube_delete": "delete", "pl_watch_run": "watch",
              "pl_kube_request": None, "pl_kube_stream": None}
NOT_CALL_SITES = {"kube_client.c", "kube_watch.c", "kube_requests.c"}
# The controller's wrappers that take the request's id as an argument, and their verb.
WRAPPERS = {"create_owned": "create", "delete_obj": "delete"}


def request_table():
    """{ID: (group, resource, verb)} of operator/k8s/kube_requests.h."""
    with open(REQUESTS_H) as f:
        rows = re.findall(r'X\((\w+), "([^"]*)", "([^"]*)", "([^"]*)"\)', f.read())
    return {r[0]: r[1:] for r in rows}


def operator_sources():
    out = {}
    for name in sorted(os.listdir(K8S_DIR)):
        if name.endswith(".c") and name not in NOT_CALL_SITES:
            with open(os.path.join(K8S_DIR, name)) as f:
                out[name] = f.read()
    return out


def call_site_requests():
    """[(where, ID, verb the call needs)] of every API request in operator/k8s, and the
    problems found: a call that names no row of the table, or one whose row's verb
    does not fit it."""
    table, found, problems = request_table(), [], []
    call_re = re.compile(r"\b(%s)\s*\(" % "|".join(CALL_VERBS))
    for name, src in operator_sources().items():
        for no, line in enumerate(src.splitlines(), 1):
            where = "%s:%d" % (name, no)
            for m in call_re.finditer(line):
                fn = m.group(1)
                tag = re.search(r"\b(?:API\(c, |PL_REQ\()(\w+),", line[:m.start()])
                if tag:
                    found.append((where, tag.group(1), CALL_VERBS[fn], fn))
                elif "API_ID(" in line[:m.start()]:
                    owner = [w for w in WRAPPERS if re.search(r"^(?:static )?int %s\(" % w, src, re.M)]
                    if not owner:
                        problems.append("%s: %s through API_ID outside the wrappers %s" % (where, fn, sorted(WRAPPERS)))
                else:
                    problems.append("%s: %s names no request of kube_requests.h (API(c, ID, ...) or PL_REQ(ID, ...))"
                                    % (where, fn))
        for w, verb in WRAPPERS.items():
            for m in re.finditer(r"\b%s\(([^;]*?)[,)]" % w, src):
                line = src[:m.start()].count("\n") + 1
                if re.match(r"pl_controller \*c", m.group(1)):
                    continue            # the definition
                tag = re.search(r"\b%s\(c, j, PL_REQ_(\w+)," % w, src[m.start():m.start() + 200])
                if not tag:
                    problems.append("%s:%d: %s without a PL_REQ_ row" % (name, line, w))
                else:
                    found.append(("%s:%d" % (name, line), tag.group(1), verb, w))
    for where, rid, verb, fn in found:
        if rid not in table:
            problems.append("%s: %s names %s, which is not a row of kube_requests.h" % (where, fn, rid))
        elif verb and table[rid][2] != verb:
            problems.append("%s: %s makes a %s request but names %s (%s)" % (where, fn, verb, rid, table[rid][2]))
        elif fn == "pl_kube_patch_status" and not table[rid][1].endswith("/status"):
            problems.append("%s: a status patch names %s (%s)" % (where, rid, table[rid][1]))
    return found, problems


@test
def rbac_grants_every_request_the_operator_makes():
    """RBAC audit: every Kubernetes API call in operator/k8s names its row of the request
    table (kube_requests.h) with the verb the call needs; every row is used; the rendered
    ClusterRoles (operator, nodes) and the leader-election Role grant exactly the rows."""
    table = request_table()
    check(len(table) >= 15, "only %d rows read from %s", len(table), REQUESTS_H)
    found, problems = call_site_requests()
    check(len(found) >= 15, "only %d call sites found", len(found))
    check(not problems, "call sites:\n%s", "\n".join(problems))
    text = "\n".join(operator_sources().values())
    used = lambda rid: re.search(r"\b(PL_REQ_%s\b|API\(c, %s,|PL_REQ\(%s,)" % (rid, rid, rid), text)
    for rid, (group, resource, verb) in table.items():
        # an informer (pl_watch_run, tagged with the watch row) lists before it watches
        watch = [w for w, row in table.items() if row == (group, resource, "watch")]
        check(used(rid) or (verb == "list" and watch and used(watch[0])),
              "row %s (%s %s/%s) is used nowhere in operator/k8s", rid, verb, group, resource)
        if verb == "watch":
            check((group, resource, "list") in table.values(),
                  "%s: a watch (an informer) lists %s first: no list row", rid, resource)
    objs = render()
    granted = {}
    for role in by_kind(objs, "ClusterRole") + by_kind(objs, "Role"):
        for (g, res), verbs in _rules(role).items():
            granted.setdefault((g, res), set()).update(verbs)
    want = {}
    for rid, (group, resource, verb) in table.items():
        check(verb in granted.get((group, resource), set()), "the chart's RBAC does not grant %s on %s/%s (%s)",
              verb, group or "core", resource, rid)
        want.setdefault((group, resource), set()).add(verb)
    extra = {k: sorted(v - want.get(k, set())) for k, v in granted.items() if v - want.get(k, set())}
    check(not extra, "the chart grants what the operator never requests: %s", extra)


@test
def rbac_one_namespace():
    """With watchNamespace, the namespaced rules are bound in that namespace only."""
    objs = render(CUSTOM, release="ml", namespace="ml-ops")
    crbs = sorted(o["metadata"]["name"] for o in by_kind(objs, "ClusterRoleBinding"))
    check(crbs == ["tj-controller-nodes"], "ClusterRoleBindings %r", crbs)
    b = _binding(objs, "RoleBinding", "tj-controller")
    check(b["metadata"]["namespace"] == "team-a" and b["roleRef"]["kind"] == "ClusterRole" and
          b["roleRef"]["name"] == "tj-controller", "RoleBinding %r", b)
    check(b["subjects"] == [{"kind": "ServiceAccount", "name": "pliant-sa", "namespace": "ml-ops"}],
          "subjects %r", b["subjects"])
    roles = {o["metadata"]["name"]: o for o in by_kind(objs, "ClusterRole")}
    want = {k: v for k, v in OPERATOR_RULES.items() if k[0] != "networking.k8s.io"}  # perJob off
    check(_rules(roles["tj-controller"]) == want, "rules %r", _rules(roles["tj-controller"]))


@test
def service_and_network_policies():
    objs = render({"networkPolicy": {"perJob": False}})
    dep = one(objs, "Deployment")
    sel = dep["spec"]["selector"]["matchLabels"]
    svc = one(objs, "Service")
    check(svc["spec"]["selector"] == sel, "Service selector %r", svc["spec"]["selector"])
    check(svc["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}],
          "Service ports %r", svc["spec"]["ports"])
    nps = {o["metadata"]["name"]: o for o in by_kind(objs, "NetworkPolicy")}
    op = nps["pliant-operator"]["spec"]
    check(op["podSelector"] == {"matchLabels": sel} and op["policyTypes"] == ["Ingress"], "operator policy %r", op)
    coord = op["ingress"][0]
    check(coord["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "pliant-worker"}}}] and coord["ports"] == [{"protocol": "TCP", "port": 8443, "endPort": 8698}],
          "coordinator ingress %r", coord)
    check([r["ports"][0]["port"] for r in op["ingress"]] == [8443, 8080], "operator ports %r", op["ingress"])
    # nothing open to everyone: /metrics from Prometheus Pods only, the health port from the
    # Pod's node only (the kubelet, which NetworkPolicy never blocks: no rule names it)
    check(all(r.get("from") for r in op["ingress"]), "an ingress rule without from: %r", op["ingress"])
    check(op["ingress"][1]["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "prometheus"}}}], "metrics ingress %r", op["ingress"][1])
    # the dashboard: no rule by default (loopback; kubectl port-forward connects inside the
    # Pod), none while it is off even with dashboardFrom
    peers = [{"podSelector": {"matchLabels": {"app": "grafana"}}}]
    for values, want in (({}, []),
                         ({"networkPolicy": {"dashboardFrom": peers}},
                          [{"from": peers, "ports": [{"protocol": "TCP", "port": 8090}]}]),
                         ({"dashboard": {"enabled": False}, "networkPolicy": {"dashboardFrom": peers}}, [])):
        pol = {o["metadata"]["name"]: o for o in by_kind(render(values), "NetworkPolicy")}["pliant-operator"]["spec"]
        got = [r for r in pol["ingress"] if r["ports"][0]["port"] == 8090]
        check(got == want, "dashboard ingress with %r: %r", values, got)
    closed = render({"networkPolicy": {"metricsFrom": []}})
    op2 = {o["metadata"]["name"]: o for o in by_kind(closed, "NetworkPolicy")}["pliant-operator"]["spec"]
    check([r["ports"][0]["port"] for r in op2["ingress"]] == [8443], "metricsFrom [] ports %r", op2["ingress"])
    w = nps["pliant-operator-workers"]
    check(w["metadata"]["namespace"] == "pliant-system", "worker policy namespace %r", w["metadata"])
    ws = w["spec"]
    check(ws["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "pliant-worker"}}, "worker selector %r",
          ws["podSelector"])
    check(ws["ingress"][0] == {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "pliant-worker"}}}]},
          "worker-to-worker ingress %r", ws["ingress"][0])
    check("pliant-operator-workers" not in {o["metadata"]["name"] for o in by_kind(render(), "NetworkPolicy")},
          "the namespace-wide worker policy is rendered with perJob (it would widen the per-job ones)")
    opeer = ws["ingress"][1]["from"][0]
    check(opeer["podSelector"]["matchLabels"] == sel and
          opeer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "pliant-system"},
          "operator-to-worker ingress %r", opeer)


@test
def renders_custom_values():
    objs = render(CUSTOM, release="ml", namespace="ml-ops")
    kinds = sorted(o["kind"] for _, o in objs)
    check(kinds.count("NetworkPolicy") == 3 and "ServiceMonitor" in kinds, "kinds %r", kinds)
    dep = one(objs, "Deployment")
    check(dep["metadata"]["name"] == "tj-controller" and dep["metadata"]["namespace"] == "ml-ops",
          "metadata %r", dep["metadata"])
    check(dep["spec"]["replicas"] == 3, "replicas %r", dep["spec"]["replicas"])
    pod = dep["spec"]["template"]["spec"]
    c = _container(dep)
    check(c["image"] == "registry.example.com/pliant-operator:1.2.3" and c["imagePullPolicy"] == "Always",
          "image %r %r", c["image"], c["imagePullPolicy"])
    check(c["args"] == ["--leader-elect", "--metrics-addr=:9090", "--health-addr=:9091",
                        "--dashboard-addr=0.0.0.0:9092", "--log-level=debug", "--namespace=team-a"],
          "args %r", c["args"])
    env = {e["name"]: e.get("value") for e in c["env"]}
    check(env["PLIANT_WORKER_IMAGE"] == "registry.example.com/pliant-worker:1.2.3-cuda12" and env["TZ"] == "UTC",
          "env %r", env)
    check(c["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "512Mi"}},
          "resources (merged with the defaults) %r", c["resources"])
    check(pod["nodeSelector"] == {"pool": "system"} and pod["tolerations"] == CUSTOM["operator"]["tolerations"] and
          pod["affinity"] == CUSTOM["operator"]["affinity"] and pod["priorityClassName"] == "system-cluster-critical"
          and pod["imagePullSecrets"] == [{"name": "regcred"}], "scheduling %r", pod)
    check(pod["serviceAccountName"] == "pliant-sa", "serviceAccountName %r", pod["serviceAccountName"])
    check(dep["spec"]["template"]["metadata"]["labels"]["team"] == "ml" and
          dep["spec"]["template"]["metadata"]["annotations"] == {"example.com/team": "ml"}, "pod metadata %r",
          dep["spec"]["template"]["metadata"])
    sm = one(objs, "ServiceMonitor")
    check(sm["metadata"]["labels"]["release"] == "prom" and sm["spec"]["endpoints"][0]["port"] == "metrics" and
          sm["spec"]["namespaceSelector"] == {"matchNames": ["ml-ops"]}, "ServiceMonitor %r", sm)
    nps = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in by_kind(objs, "NetworkPolicy")}
    check(set(nps) == {("ml-ops", "tj-controller"), ("team-a", "tj-controller-workers"),
                       ("team-b", "tj-controller-workers")}, "policies %r", sorted(nps))
    op = nps[("ml-ops", "tj-controller")]["spec"]
    check(op["ingress"][1]["from"] == CUSTOM["networkPolicy"]["metricsFrom"], "metricsFrom %r", op["ingress"][1])
    check(op["ingress"][1]["ports"] == [{"protocol": "TCP", "port": 9090}], "metrics port %r", op["ingress"][1])
    check(op["ingress"][2] == {"from": CUSTOM["networkPolicy"]["healthFrom"],
                               "ports": [{"protocol": "TCP", "port": 9091}]}, "healthFrom %r", op["ingress"][2:])
    check(op["ingress"][3:] == [{"from": CUSTOM["networkPolicy"]["dashboardFrom"],
                                 "ports": [{"protocol": "TCP", "port": 9092}]}], "dashboardFrom %r", op["ingress"][3:])
    check(by_kind(objs, "ServiceAccount") == [] or
          one(objs, "ServiceAccount")["metadata"]["name"] == "pliant-sa", "ServiceAccount name")
    svc = one(objs, "Service")
    check(svc["metadata"]["annotations"] == {"prometheus.io/scrape": "true"} and svc["spec"]["ports"][0]["port"] == 9090,
          "Service %r", svc)


@test
def renders_minimal_values():
    objs = render(MINIMAL)
    kinds = sorted(o["kind"] for _, o in objs)
    check(kinds == ["Deployment", "Service"], "kinds %r", kinds)
    dep = one(objs, "Deployment")
    c = _container(dep)
    check("--leader-elect" not in c["args"] and dep["spec"]["replicas"] == 1, "args %r", c["args"])
    off = _container(one(render({"dashboard": {"enabled": False}}), "Deployment"))
    check(not any(a.startswith("--dashboard-addr") for a in off["args"]) and
          "dashboard" not in {p["name"] for p in off["ports"]}, "dashboard.enabled false: %r %r", off["args"],
          off["ports"])
    check(dep["spec"]["template"]["spec"]["serviceAccountName"] == "existing-sa", "serviceAccountName")


@test
def templates_read_only_declared_values():
    """Every .Values path a template reads is declared in values.yaml (a typo would print "")."""
    defaults = default_values()
    for over in (None, CUSTOM, MINIMAL):
        r = Renderer(merge_values(defaults, over or {}))
        r.render_all()
        check(len(r.values_read) > 20, "only %d values read", len(r.values_read))
        for path in sorted(r.values_read):
            d = defaults
            for part in path:
                check(isinstance(d, dict) and part in d, ".Values.%s is not in values.yaml", ".".join(path))
                d = d[part]


@test
def renderer_rejects_outside_subset():
    """The renderer is strict: a function or action outside the subset is an error."""
    for src in ('{{ .Values.x | upper }}', '{{ template "x" . }}', '{{ if .Values.x }}a'):
        nodes = None
        try:
            r = Renderer(default_values())
            nodes, _, _ = _Parser(_split_template(src, "t"), r.defines).parse()
            r.exec(nodes, r.root, {"$": r.root})
        except TemplateError:
            continue
        raise AssertionError("accepted %r" % src)
    r = Renderer(default_values())
    nodes, _, _ = _Parser(_split_template(
        'a {{- " b " -}} c\n{{ range $k, $v := .Values.podSecurityContext.seccompProfile }}{{ $k }}={{ $v }}{{ end }}'
        '{{ if eq 1 2 }}x{{ else if not false }}y{{ end }}{{ printf "%s-%d" "n" 3 | quote }}', "t"),
        r.defines).parse()
    out = r.exec(nodes, r.root, {"$": r.root})
    check(out == 'a b c\ntype=RuntimeDefaulty"n-3"', "renderer output %r", out)


@test
def kubectl_decodes_rendered_objects():
    """Where kubectl is installed, it decodes every rendered object offline (typed for built-in kinds)."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("skip chart.kubectl_decodes_rendered_objects.kubectl: kubectl not installed")
        return
    for label, over in (("default", None), ("custom", CUSTOM)):
        objs = [o for _, o in render(over) if o["kind"] != "ServiceMonitor"]
        path = os.path.join(suite.tmp, "rendered-%s.json" % label)
        with open(path, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "List", "items": objs}, f)
        p = subprocess.run([kubectl, "annotate", "--local", "-f", path, "pliant.dev/test=x", "-o", "json"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        check(p.returncode == 0, "kubectl rejects the %s rendering: %s", label, p.stderr.decode()[-1500:])
        text, items, dec, i = p.stdout.decode(), [], json.JSONDecoder(), 0
        while i < len(text):
            if text[i].isspace():
                i += 1
                continue
            obj, i = dec.raw_decode(text, i)
            items += obj["items"] if obj.get("kind") == "List" else [obj]
        check(len(items) == len(objs), "kubectl returned %d objects of %d", len(items), len(objs))


if __name__ == "__main__":
    sys.exit(suite.main())
