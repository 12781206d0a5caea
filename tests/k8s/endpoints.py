"""The endpoints and EndpointSlice controllers (kube-controller-manager): for every
Service with a selector, the Pods of the Service's namespace (only) whose labels
it selects and that have a podIP:

- Endpoints NAME: ready Pods under `addresses`, the others (not terminating)
  under `notReadyAddresses`, with nodeName and targetRef; ports resolved per Pod
  (a named targetPort is looked up in the Pod's container ports), one subset per
  set of resolved ports.
- EndpointSlice NAME-xxxxx (discovery.k8s.io/v1, addressType IPv4, labels
  kubernetes.io/service-name and endpointslice.kubernetes.io/managed-by, owned by
  the Service): every such Pod, terminating ones too, with conditions ready,
  serving and terminating.

Services without a selector are left alone, as `kubernetes` in `default` is: with
api_endpoint=(ip, port) the controller makes that Service (443 -> the API
server) with its Endpoints and EndpointSlice at start, as kube-apiserver does.
"""

import hashlib

from api import condition_true
from controller import Controller
from selection import parse_labels

MANAGED_BY = "endpointslice-controller.k8s.io"


def _target_port(pod, port):
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for c in pod["spec"].get("containers", []):
        for p in c.get("ports") or []:
            if p.get("name") == target:
                return p["containerPort"]
    return None


def _resolved_ports(svc, pod):
    out = []
    for port in svc["spec"].get("ports") or []:
        number = _target_port(pod, port)
        if number is not None:
            entry = {"port": number, "protocol": port.get("protocol", "TCP")}
            if port.get("name"):
                entry["name"] = port["name"]
            out.append(entry)
    return out


def _address(pod):
    meta = pod["metadata"]
    return {"ip": pod["status"]["podIP"], "nodeName": pod["spec"].get("nodeName", ""),
            "targetRef": {"kind": "Pod", "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}}


def selected_pods(store, svc):
    """The Pods of the Service's namespace it selects that have an address."""
    selector = svc["spec"].get("selector")
    if not selector:
        return []
    match = parse_labels(",".join("%s=%s" % kv for kv in sorted(selector.items())))
    return [p for p in store.items("pods", svc["metadata"]["namespace"])
            if match(p["metadata"].get("labels")) and p.get("status", {}).get("podIP")
            and p["status"].get("phase") not in ("Succeeded", "Failed")]


def endpoints_subsets(svc, pods):
    groups = {}
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        ports = _resolved_ports(svc, pod)
        key = repr(ports)
        subset = groups.setdefault(key, {"ports": ports})
        subset.setdefault("addresses" if condition_true(pod, "Ready") else "notReadyAddresses", []).append(_address(pod))
    subsets = [groups[k] for k in sorted(groups)]
    for subset in subsets:
        for key in ("addresses", "notReadyAddresses"):
            if key in subset:
                subset[key].sort(key=lambda a: [int(x) for x in a["ip"].split(".")])
        if not subset["ports"]:
            del subset["ports"]
    return subsets


def slice_endpoints(pods):
    out = []
    for pod in sorted(pods, key=lambda p: p["status"]["podIP"]):
        address = _address(pod)
        terminating = bool(pod["metadata"].get("deletionTimestamp"))
        ready = condition_true(pod, "Ready")
        out.append({"addresses": [address["ip"]], "nodeName": address["nodeName"],
                    "targetRef": address["targetRef"],
                    "conditions": {"ready": ready and not terminating, "serving": ready, "terminating": terminating}})
    return out


class EndpointsController(Controller):
    def __init__(self, api, api_endpoint=None):
        super().__init__(api, "endpoints")
        self.ep_res = api.registry.lookup("v1", "endpoints")
        self.slice_res = api.registry.lookup("discovery.k8s.io/v1", "endpointslices")
        if api_endpoint:
            self._kubernetes_service(*api_endpoint)

    def _kubernetes_service(self, ip, port):
        with self.store.cond:
            svc_res = self.api.registry.lookup("v1", "services")
            svc = self.api.create(svc_res, "default", {"metadata": {"name": "kubernetes", "labels": {
                "component": "apiserver", "provider": "kubernetes"}}, "spec": {
                "clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "targetPort": port}]}})[0]
            ports = [{"name": "https", "port": port, "protocol": "TCP"}]
            self.api.create(self.ep_res, "default", {"metadata": {"name": "kubernetes"}, "subsets": [
                {"addresses": [{"ip": ip}], "ports": ports}]})
            self._write_slice(svc, "kubernetes", [{"addresses": [ip], "conditions": {"ready": True}}], ports)

    def sync(self):
        services = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in self.store.items("services")}
        for key, svc in services.items():
            if svc["spec"].get("selector"):
                pods = selected_pods(self.store, svc)
                self._write_endpoints(svc, endpoints_subsets(svc, pods))
                ports = _resolved_ports(svc, pods[0]) if pods else [
                    dict({"port": p.get("port"), "protocol": p.get("protocol", "TCP")},
                         **({"name": p["name"]} if p.get("name") else {})) for p in svc["spec"].get("ports") or []]
                self._write_slice(svc, _slice_name(svc), slice_endpoints(pods), ports)
        for ep in self.store.items("endpoints"):
            key = (ep["metadata"]["namespace"], ep["metadata"]["name"])
            if key not in services:
                self.api.remove_now(self.ep_res, ep)

    def _write_endpoints(self, svc, subsets):
        meta = svc["metadata"]
        labels = dict(meta.get("labels") or {})
        current = self.store.get("endpoints", meta["namespace"], meta["name"])
        if current is None:
            self.api.create(self.ep_res, meta["namespace"], {"metadata": {"name": meta["name"], "labels": labels},
                                                            "subsets": subsets})
        elif current.get("subsets", []) != subsets or current["metadata"].get("labels", {}) != labels:
            self.api.mutate(self.ep_res, meta["namespace"], meta["name"], lambda e: (
                e.__setitem__("subsets", subsets), e["metadata"].__setitem__("labels", labels)))

    def _write_slice(self, svc, name, endpoints, ports):
        meta = svc["metadata"]
        body = {"metadata": {"name": name, "labels": {"kubernetes.io/service-name": meta["name"],
                                                      "endpointslice.kubernetes.io/managed-by": MANAGED_BY},
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": meta["name"],
                                                  "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "addressType": "IPv4", "endpoints": endpoints, "ports": ports}
        current = self.store.get("discovery.k8s.io/endpointslices", meta["namespace"], name)
        if current is None:
            self.api.create(self.slice_res, meta["namespace"], body)
        elif any(current.get(k) != body[k] for k in ("endpoints", "ports")):
            self.api.mutate(self.slice_res, meta["namespace"], name, lambda s: s.update(
                endpoints=endpoints, ports=ports))


def _slice_name(svc):
    return "%s-%s" % (svc["metadata"]["name"][:57], hashlib.sha256(svc["metadata"]["uid"].encode()).hexdigest()[:5])
