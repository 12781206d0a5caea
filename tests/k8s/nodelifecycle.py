"""The node lifecycle controller and its taint manager (kube-controller-manager),
for the namespaced cluster:

- A node whose Lease (kube-node-lease/NAME) has not been renewed for
  --node-monitor-grace-period seconds (40 in Kubernetes) becomes
  Ready=Unknown (NodeStatusUnknown, "Kubelet stopped posting node status.") with
  the taints node.kubernetes.io/unreachable NoSchedule and NoExecute, and the
  Ready condition of its Pods goes False. When the Lease is renewed again the
  node is Ready and the taints go.
- Taint manager: a Pod on a node with a NoExecute taint it does not tolerate is
  deleted at once; one that tolerates it for tolerationSeconds (the
  DefaultTolerationSeconds admission plugin gives every Pod 300 s for
  unreachable and not-ready) is deleted that long after the taint's timeAdded.
  Deleting sets the DisruptionTarget condition (DeletionByTaintManager); the Pod
  stays Terminating until its node's kubelet can stop it (or the node is
  deleted: the Pod garbage collector in kubelet.py removes it).
"""

import calendar
import time

from api import now, set_condition
from controller import Controller
from kubelet import toleration_matches

UNREACHABLE = "node.kubernetes.io/unreachable"


def _seconds(stamp):
    if not stamp:
        return None
    base = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    frac = stamp[19:].rstrip("Z")
    return base + (float(frac) if frac.startswith(".") else 0.0)


def _ready(node):
    return next((c["status"] for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"),
                "Unknown")


def toleration_seconds(pod, taint):
    """How long the Pod tolerates the taint: 0 (not at all), seconds, or None (for ever)."""
    best = 0
    for t in pod["spec"].get("tolerations") or []:
        if toleration_matches(t, taint):
            if t.get("tolerationSeconds") is None:
                return None
            best = max(best, int(t["tolerationSeconds"]))
    return best


class NodeLifecycle(Controller):
    def __init__(self, api, grace):
        super().__init__(api, "node-lifecycle")
        self.grace = grace
        self.resync = min(1.0, grace / 4)
        self.node_res = api.registry.lookup("v1", "nodes")

    def sync(self):
        wall = time.time()
        for node in self.store.items("nodes"):
            name = node["metadata"]["name"]
            lease = self.store.get("coordination.k8s.io/leases", "kube-node-lease", name)
            renewed = _seconds(lease["spec"].get("renewTime")) if lease else None
            renewed = renewed or _seconds(node["metadata"].get("creationTimestamp"))
            fresh = wall - renewed <= self.grace
            if not fresh and _ready(node) == "True":
                self._unreachable(node)
            elif fresh and _ready(node) == "Unknown":
                self._reachable(node)
        self._taint_manager(wall)

    def _unreachable(self, node):
        name = node["metadata"]["name"]

        def status(n):
            for c in n["status"].get("conditions", []):
                c.update(status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting node status.",
                         lastTransitionTime=now())
        self.api.mutate(self.node_res, None, name, status, sub="status")
        self.api.mutate(self.node_res, None, name, lambda n: n["spec"].__setitem__("taints", [
            t for t in n["spec"].get("taints", []) if t["key"] != UNREACHABLE] + [
            {"key": UNREACHABLE, "effect": effect, "timeAdded": now()} for effect in ("NoSchedule", "NoExecute")]))
        for pod in self.store.items("pods"):
            if pod["spec"].get("nodeName") == name and pod.get("status", {}).get("phase") == "Running":
                self.api.mutate(self.api.pod_res, pod["metadata"]["namespace"], pod["metadata"]["name"],
                                lambda p: set_condition(p, "Ready", "False", "NodeNotReady", ""), sub="status")
        self.api.record_event(node, "Normal", "NodeNotReady", "Node %s status is now: NodeNotReady" % name,
                              "node-controller")

    def _reachable(self, node):
        name = node["metadata"]["name"]

        def status(n):
            for c in n["status"].get("conditions", []):
                if c["type"] == "Ready":
                    c.update(status="True", reason="KubeletReady", message="kubelet is posting ready status",
                             lastTransitionTime=now())
        self.api.mutate(self.node_res, None, name, status, sub="status")
        self.api.mutate(self.node_res, None, name, lambda n: n["spec"].__setitem__("taints", [
            t for t in n["spec"].get("taints", []) if t["key"] != UNREACHABLE]))
        self.api.record_event(node, "Normal", "NodeReady", "Node %s status is now: NodeReady" % name,
                              "node-controller")

    def _taint_manager(self, wall):
        nodes = {n["metadata"]["name"]: n for n in self.store.items("nodes")}
        for pod in self.store.items("pods"):
            node = nodes.get(pod["spec"].get("nodeName"))
            if node is None or pod["metadata"].get("deletionTimestamp") or \
                    pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            due = None
            for taint in node["spec"].get("taints") or []:
                if taint.get("effect") != "NoExecute":
                    continue
                seconds = toleration_seconds(pod, taint)
                if seconds is not None:
                    at = (_seconds(taint.get("timeAdded")) or wall) + seconds
                    due = at if due is None else min(due, at)
            if due is not None and wall >= due:
                meta = pod["metadata"]
                self.api.mutate(self.api.pod_res, meta["namespace"], meta["name"], lambda p: set_condition(
                    p, "DisruptionTarget", "True", "DeletionByTaintManager",
                    "Taint manager: deleting due to NoExecute taint"), sub="status")
                self.api.delete(self.api.pod_res, meta["namespace"], meta["name"], {})
                self.api.record_event(pod, "Normal", "TaintManagerEviction", "Marking for deletion Pod %s/%s"
                                      % (meta["namespace"], meta["name"]), "taint-eviction-controller")
