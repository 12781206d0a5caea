"""The Deployment and ReplicaSet controllers (apps/v1) of kube-controller-manager,
reduced to what running an operator needs.

Deployment: one ReplicaSet per Pod template, named NAME-HASH and labelled
pod-template-hash=HASH (the template's hash), owned by the Deployment. The
current template's ReplicaSet is scaled to spec.replicas and older ones to 0
once it is fully ready (a rollout; maxSurge/maxUnavailable are not followed
exactly). Status: observedGeneration, replicas, updatedReplicas, readyReplicas,
availableReplicas (minReadySeconds is not read), unavailableReplicas and the
Available and Progressing conditions.

ReplicaSet: keeps spec.replicas active Pods (not terminating, not Succeeded or
Failed) named RS-xxxxx with the template and an ownerReference; deletes extra
ones (not-ready ones first). A refused Pod (admission, e.g. Pod Security) gives
a FailedCreate Warning Event with the apiserver's message and the
ReplicaFailure condition, and is retried after a back-off, as in Kubernetes.
"""

import copy
import hashlib
import json
import time

from api import condition_true, now, set_condition
from controller import Controller
from errors import ApiError

_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def template_hash(template):
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest[:10])


def _owned_by(obj, owner):
    return any(r.get("uid") == owner["metadata"]["uid"] and r.get("controller")
               for r in obj["metadata"].get("ownerReferences") or [])


def _owner_ref(owner, kind):
    return {"apiVersion": "apps/v1", "kind": kind, "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def _active(pod):
    return not pod["metadata"].get("deletionTimestamp") and pod.get("status", {}).get("phase") not in (
        "Succeeded", "Failed")


class DeploymentController(Controller):
    resync = BACKOFF = 5.0      # seconds before a refused Pod is tried again

    def __init__(self, api):
        super().__init__(api, "deployments")
        self.deploy_res = api.registry.lookup("apps/v1", "deployments")
        self.rs_res = api.registry.lookup("apps/v1", "replicasets")
        self.failed = {}        # ReplicaSet uid -> monotonic time of the last refused create

    def sync(self):
        for dep in self.store.items("apps/deployments"):
            if not dep["metadata"].get("deletionTimestamp"):
                self._deployment(dep)
        for rs in self.store.items("apps/replicasets"):
            if not rs["metadata"].get("deletionTimestamp"):
                self._replicaset(rs)

    # -- Deployments ---------------------------------------------------------------

    def _deployment(self, dep):
        meta, spec = dep["metadata"], dep["spec"]
        ns = meta["namespace"]
        owned = [rs for rs in self.store.items("apps/replicasets", ns) if _owned_by(rs, dep)]
        digest = template_hash(spec["template"])
        name = "%s-%s" % (meta["name"], digest)
        current = next((rs for rs in owned if rs["metadata"]["name"] == name), None)
        if current is None:
            template = copy.deepcopy(spec["template"])
            template.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = digest
            selector = copy.deepcopy(spec["selector"])
            selector.setdefault("matchLabels", {})["pod-template-hash"] = digest
            current = self.api.create(self.rs_res, ns, {
                "metadata": {"name": name, "labels": dict(template["metadata"]["labels"]),
                             "ownerReferences": [_owner_ref(dep, "Deployment")]},
                "spec": {"replicas": spec["replicas"], "selector": selector, "template": template}})[0]
            owned.append(current)
        elif current["spec"]["replicas"] != spec["replicas"]:
            self._scale(current, spec["replicas"])
        current_ready = (current.get("status") or {}).get("readyReplicas", 0) >= spec["replicas"]
        for rs in owned:
            if rs is not current and rs["spec"]["replicas"] and current_ready:
                self._scale(rs, 0)
        self._deployment_status(dep, owned, current)

    def _scale(self, rs, replicas):
        self.api.mutate(self.rs_res, rs["metadata"]["namespace"], rs["metadata"]["name"],
                        lambda r: r["spec"].__setitem__("replicas", replicas))

    def _deployment_status(self, dep, owned, current):
        total = lambda key, sets: sum((rs.get("status") or {}).get(key, 0) for rs in sets)
        replicas, ready = total("replicas", owned), total("readyReplicas", owned)
        want = dep["spec"]["replicas"]
        status = {"observedGeneration": dep["metadata"].get("generation", 1), "replicas": replicas,
                  "updatedReplicas": total("replicas", [current]), "readyReplicas": ready,
                  "availableReplicas": ready}
        if replicas > ready:
            status["unavailableReplicas"] = replicas - ready
        status = {k: v for k, v in status.items() if v or k == "observedGeneration"}
        old = dep.get("status") or {}
        new = {"status": dict(status, conditions=copy.deepcopy(old.get("conditions", [])))}
        available = ready >= max(want - _max_unavailable(dep), 0)
        set_condition(new, "Available", "True" if available else "False",
                      "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                      "Deployment has minimum availability." if available else
                      "Deployment does not have minimum availability.")
        done = ready >= want and total("replicas", [current]) == replicas
        set_condition(new, "Progressing", "True", "NewReplicaSetAvailable" if done else "ReplicaSetUpdated",
                      'ReplicaSet "%s" has %s progressed.' % (current["metadata"]["name"],
                                                              "successfully" if done else "is being"))
        if new["status"] != old:
            self.api.mutate(self.deploy_res, dep["metadata"]["namespace"], dep["metadata"]["name"],
                            lambda d: d.__setitem__("status", new["status"]), sub="status")

    # -- ReplicaSets ---------------------------------------------------------------

    def _replicaset(self, rs):
        meta, spec = rs["metadata"], rs["spec"]
        ns = meta["namespace"]
        pods = [p for p in self.store.items("pods", ns) if _owned_by(p, rs)]
        active = [p for p in pods if _active(p)]
        want = spec.get("replicas", 1)
        failure = None
        if len(active) < want and time.monotonic() - self.failed.get(meta["uid"], -1e9) >= self.BACKOFF:
            for _ in range(want - len(active)):
                try:
                    active.append(self._create_pod(rs))
                except ApiError as e:
                    failure = e.message
                    self.failed[meta["uid"]] = time.monotonic()
                    self._event(rs, "Warning", "FailedCreate", "Error creating: " + failure)
                    break
        if len(active) > want:
            for pod in sorted(active, key=lambda p: (condition_true(p, "Ready"), p["metadata"]["creationTimestamp"]))[:len(active) - want]:
                self.api.delete(self.api.pod_res, ns, pod["metadata"]["name"], {})
                active.remove(pod)
        status = {"replicas": len(active), "fullyLabeledReplicas": len(active),
                  "readyReplicas": sum(1 for p in active if condition_true(p, "Ready")),
                  "availableReplicas": sum(1 for p in active if condition_true(p, "Ready")),
                  "observedGeneration": meta.get("generation", 1)}
        status = {k: v for k, v in status.items() if v or k in ("replicas", "observedGeneration")}
        old = rs.get("status") or {}
        conditions = old.get("conditions", [])
        if failure:
            conditions = [c for c in conditions if c["type"] != "ReplicaFailure"] + [{
                "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": failure,
                "lastTransitionTime": now()}]
        elif len(active) >= want:       # the failure is over
            conditions = [c for c in conditions if c["type"] != "ReplicaFailure"]
        if conditions:
            status["conditions"] = conditions
        if status != old:
            self.api.mutate(self.rs_res, ns, meta["name"], lambda r: r.__setitem__("status", status), sub="status")

    def _create_pod(self, rs):
        template = copy.deepcopy(rs["spec"]["template"])
        meta = template.get("metadata") or {}
        meta.update(generateName=rs["metadata"]["name"] + "-", ownerReferences=[_owner_ref(rs, "ReplicaSet")])
        meta.pop("name", None)
        pod, _ = self.api.create(self.api.pod_res, rs["metadata"]["namespace"], {"metadata": meta,
                                                                                   "spec": template["spec"]})
        self._event(rs, "Normal", "SuccessfulCreate", "Created pod: " + pod["metadata"]["name"])
        return pod

    def _event(self, rs, kind, reason, message):
        self.api.record_event(rs, kind, reason, message, "replicaset-controller")


def _max_unavailable(dep):
    rolling = (dep["spec"].get("strategy") or {}).get("rollingUpdate") or {}
    value = rolling.get("maxUnavailable", "25%")
    if isinstance(value, str) and value.endswith("%"):
        return int(dep["spec"]["replicas"] * int(value[:-1]) / 100)
    return int(value)
