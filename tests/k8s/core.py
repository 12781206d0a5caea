"""The built-in resources and what the real apiserver's per-resource strategies do
to them: defaults, validation, immutable fields, Table columns, and the
conversion between core/v1 and events.k8s.io/v1 Events (one storage, as in
Kubernetes)."""

import base64
import copy
import itertools
import json

from registry import AGE, NAME, Resource, _col, age

# -- Table columns -------------------------------------------------------------------

def _pod_status(pod):
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = pod.get("status", {})
    for cs in status.get("containerStatuses", []):
        state = cs.get("state", {})
        if "waiting" in state and state["waiting"].get("reason"):
            return state["waiting"]["reason"]
        if "terminated" in state:
            t = state["terminated"]
            return t.get("reason") or ("Signal:%d" % t["signal"] if t.get("signal") else
                                       "ExitCode:%d" % t.get("exitCode", 0))
    return status.get("reason") or status.get("phase", "Pending")


def _pod_ready(pod):
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return "%d/%d" % (sum(1 for c in statuses if c.get("ready")), len(pod["spec"].get("containers", [])))


def _node_status(node):
    ready = next((c["status"] for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"),
                 "Unknown")
    text = "Ready" if ready == "True" else "NotReady"
    return text + (",SchedulingDisabled" if node.get("spec", {}).get("unschedulable") else "")


def _ports(svc):
    ports = ["%s/%s" % (p["port"], p.get("protocol", "TCP")) for p in svc["spec"].get("ports", [])]
    return ",".join(ports) or "<none>"


def _selector(svc):
    sel = svc["spec"].get("selector") or {}
    return ",".join("%s=%s" % kv for kv in sorted(sel.items())) or "<none>"


def _event_object(ev):
    ref = ev.get("involvedObject", {})
    return "%s/%s" % (ref.get("kind", "").lower(), ref.get("name", ""))


POD_COLUMNS = [NAME, _col("Ready", _pod_ready), _col("Status", _pod_status),
               _col("Restarts", lambda p: sum(c.get("restartCount", 0) for c in
                                             p.get("status", {}).get("containerStatuses", [])), "integer"),
               AGE, _col("IP", lambda p: p.get("status", {}).get("podIP", "<none>"), priority=1),
               _col("Node", lambda p: p["spec"].get("nodeName", "<none>"), priority=1)]
NODE_COLUMNS = [NAME, _col("Status", _node_status), _col("Roles", lambda n: "<none>"), AGE,
                _col("Version", lambda n: n.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", "")),
                _col("Zone", lambda n: n["metadata"].get("labels", {}).get("topology.kubernetes.io/zone", "<none>"),
                     priority=1)]
SERVICE_COLUMNS = [NAME, _col("Type", lambda s: s["spec"].get("type", "ClusterIP")),
                   _col("Cluster-IP", lambda s: s["spec"].get("clusterIP", "<none>")),
                   _col("External-IP", lambda s: "<none>"), _col("Port(s)", _ports), AGE,
                   _col("Selector", _selector, priority=1)]
EVENT_COLUMNS = [_col("Last Seen", lambda e: age(e.get("lastTimestamp") or e.get("eventTime"))),
                 _col("Type", lambda e: e.get("type", "")), _col("Reason", lambda e: e.get("reason", "")),
                 _col("Object", _event_object), _col("Message", lambda e: e.get("message", ""))]


def builtin_resources():
    pod_fields = ["spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                  "status.phase", "status.podIP", "status.nominatedNodeName"]
    return [
        Resource("", "v1", "namespaces", "Namespace", False, ["ns"], status=True,
                 columns=[NAME, _col("Status", lambda n: n.get("status", {}).get("phase", "")), AGE],
                 fields=["status.phase"], subresources=["finalize"]),
        Resource("", "v1", "pods", "Pod", True, ["po"], status=True, columns=POD_COLUMNS, fields=pod_fields,
                 subresources=["log", "binding", "eviction"], categories=["all"]),
        Resource("", "v1", "services", "Service", True, ["svc"], status=True, columns=SERVICE_COLUMNS,
                 categories=["all"]),
        Resource("", "v1", "secrets", "Secret", True, columns=[
            NAME, _col("Type", lambda s: s.get("type", "")),
            _col("Data", lambda s: len(s.get("data") or {}), "integer"), AGE], fields=["type"]),
        Resource("", "v1", "configmaps", "ConfigMap", True, ["cm"], columns=[
            NAME, _col("Data", lambda c: len(c.get("data") or {}) + len(c.get("binaryData") or {}), "integer"),
            AGE]),
        Resource("", "v1", "serviceaccounts", "ServiceAccount", True, ["sa"], subresources=["token"]),
        Resource("", "v1", "nodes", "Node", False, ["no"], status=True, columns=NODE_COLUMNS,
                 fields=["spec.unschedulable"]),
        Resource("", "v1", "events", "Event", True, ["ev"], columns=EVENT_COLUMNS, fields=None, rkey="events"),
        Resource("events.k8s.io", "v1", "events", "Event", True, ["ev"], columns=EVENT_COLUMNS, fields=None,
                 rkey="events"),
        Resource("coordination.k8s.io", "v1", "leases", "Lease", True, columns=[
            NAME, _col("Holder", lambda l: l.get("spec", {}).get("holderIdentity", "")), AGE]),
        Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
                 ["crd", "crds"], status=True, columns=CREATED_AT_COLUMNS),
    ] + cluster_resources()


CREATED_AT_COLUMNS = [NAME, _col("Created At", lambda o: o["metadata"].get("creationTimestamp"), "date")]


def _endpoints(ep):
    addrs = ["%s:%s" % (a["ip"], p["port"]) for s in ep.get("subsets") or [] for a in s.get("addresses") or []
             for p in s.get("ports") or [{"port": ""}]]
    return ",".join(addrs[:3]) + (" + %d more..." % (len(addrs) - 3) if len(addrs) > 3 else "") or "<none>"


def _replicas(kind):
    return lambda o: "%d/%d" % (o.get("status", {}).get(kind) or 0, o.get("spec", {}).get("replicas", 1))


def cluster_resources():
    """What the namespaced cluster (cluster.py) adds: workloads, RBAC, service discovery,
    claims, disruption budgets and network policies (stored and served; see the
    controllers that act on them)."""
    return [
        Resource("", "v1", "endpoints", "Endpoints", True, ["ep"], columns=[NAME, _col("Endpoints", _endpoints),
                                                                          AGE]),
        Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ["pvc"], status=True, columns=[
            NAME, _col("Status", lambda c: c.get("status", {}).get("phase", "")),
            _col("Volume", lambda c: c["spec"].get("volumeName", "")),
            _col("Capacity", lambda c: c.get("status", {}).get("capacity", {}).get("storage", "")),
            _col("Access Modes", lambda c: ",".join(c["spec"].get("accessModes", []))), AGE]),
        Resource("apps", "v1", "deployments", "Deployment", True, ["deploy"], status=True, columns=[
            NAME, _col("Ready", _replicas("readyReplicas")),
            _col("Up-to-date", lambda d: d.get("status", {}).get("updatedReplicas") or 0, "integer"),
            _col("Available", lambda d: d.get("status", {}).get("availableReplicas") or 0, "integer"), AGE],
                 categories=["all"]),
        Resource("apps", "v1", "replicasets", "ReplicaSet", True, ["rs"], status=True, columns=[
            NAME, _col("Desired", lambda r: r["spec"].get("replicas", 1), "integer"),
            _col("Current", lambda r: r.get("status", {}).get("replicas") or 0, "integer"),
            _col("Ready", lambda r: r.get("status", {}).get("readyReplicas") or 0, "integer"), AGE],
                 categories=["all"]),
        Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, columns=CREATED_AT_COLUMNS),
        Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, columns=[
            NAME, _col("Role", lambda b: "%s/%s" % (b["roleRef"]["kind"], b["roleRef"]["name"])), AGE]),
        Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", True, columns=CREATED_AT_COLUMNS),
        Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, columns=[
            NAME, _col("Role", lambda b: "%s/%s" % (b["roleRef"]["kind"], b["roleRef"]["name"])), AGE]),
        Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True, columns=[
            NAME, _col("AddressType", lambda s: s.get("addressType", "")),
            _col("Ports", lambda s: ",".join(str(p.get("port")) for p in s.get("ports") or []) or "<unset>"),
            _col("Endpoints", lambda s: ",".join(a for e in s.get("endpoints") or [] for a in e["addresses"])
                 or "<unset>"), AGE]),
        Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ["pdb"], status=True),
        Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, ["netpol"]),
        Resource("", "v1", "resourcequotas", "ResourceQuota", True, ["quota"], status=True),
    ]


# -- Events: one storage (core/v1 form), two versions -------------------------------------

_EVENT_RENAMES = [("regarding", "involvedObject"), ("note", "message"),
                  ("reportingController", "reportingComponent"), ("deprecatedSource", "source"),
                  ("deprecatedFirstTimestamp", "firstTimestamp"), ("deprecatedLastTimestamp", "lastTimestamp"),
                  ("deprecatedCount", "count")]


def event_to_storage(res, obj):
    if res.group != "events.k8s.io":
        return obj
    out = dict(obj)
    for new, old in _EVENT_RENAMES:
        if new in out:
            out[old] = out.pop(new)
    return out


def event_from_storage(res, obj):
    if res.group != "events.k8s.io":
        return obj
    out = dict(obj)
    for new, old in _EVENT_RENAMES:
        if old in out:
            out[new] = out.pop(old)
    return out


# -- Strategies: defaults on create, rules on update, validation -------------------------

_cluster_ips = itertools.count(10)


def _default_pod(pod, old):
    spec = pod.setdefault("spec", {})
    if old is None:
        _default_pod_spec(spec)
        pod["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}


def _default_pod_spec(spec):
    for key, value in [("restartPolicy", "Always"), ("terminationGracePeriodSeconds", 30),
                       ("dnsPolicy", "ClusterFirst"), ("schedulerName", "default-scheduler"),
                       ("serviceAccountName", "default"), ("priority", 0)]:
        spec.setdefault(key, value)
    for c in spec.get("containers", []):
        res = c.get("resources") or {}
        # Requests default to limits, which is how extended resources (GPUs) are given.
        if res.get("limits"):
            c["resources"] = dict(res, requests=dict(res["limits"], **(res.get("requests") or {})))


def qos_class(spec):
    """Guaranteed (every container's requests equal its cpu and memory limits),
    Burstable (some resources) or BestEffort (none)."""
    resources = [c.get("resources") or {} for c in spec.get("containers", [])]
    if resources and all(all(r.get("limits", {}).get(k) and r.get("limits", {}).get(k) ==
                                 r.get("requests", {}).get(k) for k in ("cpu", "memory")) for r in resources):
        return "Guaranteed"
    return "Burstable" if any(r.get("limits") or r.get("requests") for r in resources) else "BestEffort"


def _default_deployment(dep, old):
    spec = dep.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
    if strategy.get("type") == "RollingUpdate":
        strategy.setdefault("rollingUpdate", {"maxUnavailable": "25%", "maxSurge": "25%"})
    _default_pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))


def _validate_selected_template(obj, old):
    """Deployments and ReplicaSets: a selector that selects the template's labels."""
    spec = obj.get("spec", {})
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    labels = spec.get("template", {}).get("metadata", {}).get("labels") or {}
    if not spec.get("selector"):
        return [("FieldValueRequired", "spec.selector", "Required value")]
    if any(labels.get(k) != v for k, v in selector.items()):
        return [("FieldValueInvalid", "spec.template.metadata.labels", "Invalid value: %s: `selector` does not "
                 "match template `labels`" % _go_map(labels))]
    if old is not None and old["spec"].get("selector") != spec.get("selector"):
        return [("FieldValueInvalid", "spec.selector", "Invalid value: %s: field is immutable"
                 % _go_map(selector))]
    return []


def _go_map(labels):
    return "map[string]string{%s}" % ", ".join('"%s":"%s"' % kv for kv in sorted(labels.items()))


def _validate_binding(binding, old):
    ref = binding.get("roleRef") or {}
    kinds = ("ClusterRole",) if binding["kind"] == "ClusterRoleBinding" else ("Role", "ClusterRole")
    errs = []
    if ref.get("kind") not in kinds:
        errs.append(("FieldValueNotSupported", "roleRef.kind", 'Unsupported value: "%s": supported values: %s'
                     % (ref.get("kind", ""), ", ".join('"%s"' % k for k in kinds))))
    if not ref.get("name"):
        errs.append(("FieldValueRequired", "roleRef.name", "Required value"))
    if old is not None and old.get("roleRef") != ref:
        errs.append(("FieldValueInvalid", "roleRef", "Invalid value: %s: cannot change roleRef"
                     % json.dumps(ref, separators=(",", ":"))))
    return errs


def _default_claim(claim, old):
    """A provisioner that binds every claim at once (a host directory: ReadWriteMany)."""
    spec = claim.setdefault("spec", {})
    spec.setdefault("accessModes", ["ReadWriteMany"])
    spec.setdefault("volumeMode", "Filesystem")
    if old is None:
        spec.setdefault("volumeName", "pvc-" + claim["metadata"]["uid"])
    claim["status"] = {"phase": "Bound", "accessModes": spec["accessModes"],
                       "capacity": {"storage": spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")}}


def _validate_pod(pod, old):
    errs = []
    containers = pod.get("spec", {}).get("containers")
    if not containers:
        errs.append(("FieldValueRequired", "spec.containers", "Required value"))
    for i, c in enumerate(containers or []):
        for key in ("name", "image"):
            if not c.get(key):
                errs.append(("FieldValueRequired", "spec.containers[%d].%s" % (i, key), "Required value"))
    if old is not None and _mutable_pod_spec(pod["spec"]) != _mutable_pod_spec(old["spec"]):
        errs.append(("FieldValueForbidden", "spec", "Forbidden: pod updates may not change fields other than "
                     "`spec.containers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` "
                     "(only additions to existing tolerations)"))
    return errs


def _mutable_pod_spec(spec):
    """The pod spec without the fields an update may change."""
    spec = copy.deepcopy(spec)
    for key in ("activeDeadlineSeconds", "tolerations"):
        spec.pop(key, None)
    for c in spec.get("containers", []):
        c.pop("image", None)
    return spec


def _default_service(svc, old):
    spec = svc.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    for p in spec.get("ports", []):
        p.setdefault("protocol", "TCP")
        p.setdefault("targetPort", p.get("port"))
    if old is not None and old["spec"].get("clusterIP"):
        spec["clusterIP"] = old["spec"]["clusterIP"]       # immutable once allocated
    elif not spec.get("clusterIP"):
        n = next(_cluster_ips)
        spec["clusterIP"] = "10.96.%d.%d" % (n // 250, n % 250 + 1)
    spec["clusterIPs"] = [spec["clusterIP"]]


def _default_namespace(ns, old):
    ns.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    ns["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = ns["metadata"]["name"]
    if not ns["metadata"].get("deletionTimestamp"):
        ns["status"] = {"phase": "Active"}


def _default_secret(secret, old):
    if not secret.get("type"):
        secret["type"] = "Opaque"
    string_data = secret.pop("stringData", None) or {}
    data = secret.setdefault("data", {})
    for key, value in string_data.items():
        data[key] = base64.b64encode(value.encode()).decode()


def _validate_event(ev, old):
    errs = []
    if "reportingController" in ev or "eventTime" in ev:    # written through events.k8s.io/v1
        for field in ("eventTime", "reportingComponent", "reportingInstance", "action", "reason"):
            if not ev.get(field):
                name = "reportingController" if field == "reportingComponent" else field
                errs.append(("FieldValueRequired", name, "Required value"))
    if ev.get("type") not in (None, "", "Normal", "Warning"):
        errs.append(("FieldValueInvalid", "type", 'Invalid value: "%s": has invalid value' % ev["type"]))
    return errs


def _validate_crd(crd, old):
    errs = []
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    for field, value in [("spec.group", spec.get("group")), ("spec.names.plural", names.get("plural")),
                         ("spec.names.kind", names.get("kind"))]:
        if not value:
            errs.append(("FieldValueRequired", field, "Required value"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        errs.append(("FieldValueNotSupported", "spec.scope", 'Unsupported value: "%s": supported values: '
                     '"Cluster", "Namespaced"' % spec.get("scope", "")))
    versions = spec.get("versions") or []
    if sum(1 for v in versions if v.get("storage")) != 1:
        errs.append(("FieldValueInvalid", "spec.versions", "Invalid value: %s: must have exactly one version "
                     "marked as storage version" % len(versions)))
    expected = "%s.%s" % (names.get("plural"), spec.get("group"))
    if crd["metadata"]["name"] != expected:
        errs.append(("FieldValueInvalid", "metadata.name", 'Invalid value: "%s": must be spec.names.plural+"."'
                     '+spec.group' % crd["metadata"]["name"]))
    if old is not None and old["spec"].get("group") != spec.get("group"):
        errs.append(("FieldValueInvalid", "spec.group", "field is immutable"))
    return errs


def _default_crd(crd, old):
    names = crd.setdefault("spec", {}).setdefault("names", {})
    if names.get("kind"):
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
    crd["spec"].setdefault("conversion", {"strategy": "None"})
    # The apiextensions controllers accept names and establish the CRD at once here.
    crd["status"] = {
        "acceptedNames": names,
        "storedVersions": [v["name"] for v in crd["spec"].get("versions", []) if v.get("storage")],
        "conditions": [{"type": t, "status": "True", "reason": r, "message": m,
                        "lastTransitionTime": crd["metadata"].get("creationTimestamp")}
                       for t, r, m in [("NamesAccepted", "NoConflicts", "no conflicts found"),
                                       ("Established", "InitialNamesAccepted", "the initial names have been "
                                        "accepted")]],
    }


# rkey -> (defaults(obj, old), validate(obj, old) -> causes)
STRATEGIES = {
    "pods": (_default_pod, _validate_pod),
    "services": (_default_service, None),
    "namespaces": (_default_namespace, None),
    "secrets": (_default_secret, None),
    "events": (None, _validate_event),
    "apiextensions.k8s.io/customresourcedefinitions": (_default_crd, _validate_crd),
    "apps/deployments": (_default_deployment, _validate_selected_template),
    "apps/replicasets": (lambda rs, old: _default_pod_spec(rs.setdefault("spec", {}).setdefault(
        "template", {}).setdefault("spec", {})), _validate_selected_template),
    "rbac.authorization.k8s.io/rolebindings": (None, _validate_binding),
    "rbac.authorization.k8s.io/clusterrolebindings": (None, _validate_binding),
    "persistentvolumeclaims": (_default_claim, None),
}
