"""The admission plugins kube-apiserver runs on a new Pod, in its order:

- ServiceAccount: the Pod's ServiceAccount (default: `default`) must exist, else
  403 `pods "x" is forbidden: error looking up service account NS/NAME:
  serviceaccount "NAME" not found`.
- DefaultTolerationSeconds: a Pod without them gets the tolerations
  node.kubernetes.io/not-ready and node.kubernetes.io/unreachable (NoExecute,
  tolerationSeconds: --default-toleration-seconds, 300 in Kubernetes), which the
  taint manager (nodelifecycle.py) honours.
- PodSecurity: podsecurity.py, from the namespace's labels.
- ResourceQuota: the Pod count of the namespace's ResourceQuotas (spec.hard `pods`
  or `count/pods`: Pods not Succeeded or Failed), else 403 `pods "x" is forbidden:
  exceeded quota: NAME, requested: pods=1, used: pods=N, limited: pods=N` (no
  other resource is counted, and no controller writes the quota's status).

Admission(plugins) is called by Api.create for every new object (it acts on Pods
only) under the store's lock and returns the warnings to send.
"""

import podsecurity
from errors import ApiError

PLUGINS = ("ServiceAccount", "DefaultTolerationSeconds", "PodSecurity", "ResourceQuota")
UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"


class Admission:
    def __init__(self, store, plugins, toleration_seconds=300):
        unknown = [p for p in plugins if p not in PLUGINS]
        if unknown:
            raise ValueError("unknown admission plugin %s (known: %s)" % (unknown[0], ", ".join(PLUGINS)))
        self.store = store
        self.plugins = set(plugins)
        self.toleration_seconds = toleration_seconds

    def __call__(self, res, obj):
        if res.rkey != "pods":
            return []
        meta, spec = obj["metadata"], obj.setdefault("spec", {})
        if "ServiceAccount" in self.plugins:
            name = spec.setdefault("serviceAccountName", "default")
            if self.store.get("serviceaccounts", meta["namespace"], name) is None:
                raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: error looking up service account %s/%s: '
                               'serviceaccount "%s" not found' % (meta.get("name", ""), meta["namespace"], name, name),
                               {"name": meta.get("name", ""), "kind": "pods"})
        if "DefaultTolerationSeconds" in self.plugins:
            tolerations = spec.setdefault("tolerations", [])
            for key in (NOT_READY, UNREACHABLE):
                if not any(t.get("key") == key and t.get("effect") in (None, "", "NoExecute") or
                           t.get("operator") == "Exists" and not t.get("key") for t in tolerations):
                    tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                        "tolerationSeconds": self.toleration_seconds})
        warnings = []
        if "PodSecurity" in self.plugins:
            warnings = podsecurity.admit(self.store.get("namespaces", "", meta["namespace"]), obj)
        if "ResourceQuota" in self.plugins:
            self.pod_quota(meta)
        return warnings

    def pod_quota(self, meta):
        ns = meta["namespace"]
        used = sum(1 for p in self.store.items("pods", ns)
                   if p.get("status", {}).get("phase") not in ("Succeeded", "Failed"))
        for quota in self.store.items("resourcequotas", ns):
            hard = quota.get("spec", {}).get("hard") or {}
            key = "pods" if "pods" in hard else "count/pods" if "count/pods" in hard else None
            if key is None:
                continue
            limit = int(str(hard[key]))
            if used + 1 > limit:
                raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: exceeded quota: %s, requested: %s=1, '
                               'used: %s=%d, limited: %s=%d' % (meta.get("name", ""), quota["metadata"]["name"],
                                                                key, key, used, key, limit),
                               {"name": meta.get("name", ""), "kind": "pods"})
