"""NetworkPolicy enforcement for --cluster (a CNI's policy agent, reduced), without
iptables or nftables: policy routing rules in the node's network namespace through
which every packet to the node's Pods is forwarded (netns.py).

A Pod selected by the podSelector of an Ingress policy of its namespace (policyTypes
with Ingress, or no policyTypes) admits only what one of those policies' rules
admits: a rule without `from` admits every Pod, else its peers do — a podSelector
(Pods of the policy's namespace), a namespaceSelector (every Pod of the namespaces
it selects), both (those Pods of those namespaces); with `ports`, only those
(a number, a range to endPort, or a name of the selected Pod's container ports;
TCP unless protocol says UDP). Every other Pod's packets to it are dropped
silently, as a real cluster's are:

  ip rule add from SRC to DST ipproto tcp dport P[-E] lookup main pref 100   (a port admitted)
  ip rule add from SRC to DST blackhole pref 101                             (the rest)

in DST's node's namespace, for each Pod address SRC not admitted on every port.
Not restricted: what does not come from a Pod (the nodes, this machine: probes,
the tests), egress (policyTypes Egress is ignored), peers by ipBlock (they admit
nothing here). The rules follow every change of Pods, NetworkPolicies and
Namespaces; a rule's Pod address is that of a Pod not finished.
"""

import threading

import netns
from selection import selects

ALLOW_PREF, DROP_PREF = 100, 101


class PolicyAgent(threading.Thread):
    def __init__(self, store, kubelet, network):
        super().__init__(name="netpol", daemon=True)
        self.store, self.kubelet, self.network = store, kubelet, network
        self.rules = set()           # (node netns, rule text) in place
        self.stopped = False

    def run(self):
        seen = None
        while not self.stopped:
            with self.store.cond:
                while self.store.rv == seen and not self.stopped:
                    self.store.cond.wait(1.0)
                seen = self.store.rv
                want = self.desired()
            self.apply(want)

    def stop(self):
        self.stopped = True

    def desired(self):
        """The rules the policies want now (under the store's lock)."""
        pods = [p for p in self.store.items("pods") if (p.get("status") or {}).get("podIP") and
                p["status"].get("phase") not in ("Succeeded", "Failed") and p["spec"].get("nodeName")]
        policies = [p for p in self.store.items("networking.k8s.io/networkpolicies")
                    if "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])]
        if not policies:
            return set()
        labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in self.store.items("namespaces")}
        out = set()
        for dst in pods:
            ns = dst["metadata"]["namespace"]
            mine = [p for p in policies if p["metadata"]["namespace"] == ns and
                    selects(p["spec"].get("podSelector") or {}, dst["metadata"].get("labels") or {})]
            node = self.kubelet.node_index.get(dst["spec"]["nodeName"])
            if not mine or node is None or node not in self.network.nodes:
                continue
            where, to = self.network.node_ns(node), dst["status"]["podIP"]
            for src in pods:
                if src is dst:
                    continue
                ports = admitted(mine, src, labels, dst)
                if ports is True:
                    continue
                frm = src["status"]["podIP"]
                for proto, lo, hi in ports:
                    out.add((where, "from %s to %s ipproto %s dport %s lookup main pref %d" % (
                        frm, to, proto, lo if lo == hi else "%d-%d" % (lo, hi), ALLOW_PREF)))
                out.add((where, "from %s to %s blackhole pref %d" % (frm, to, DROP_PREF)))
        return out

    def apply(self, want):
        by_ns = {}
        for ns, rule in self.rules - want:
            by_ns.setdefault(ns, []).append("rule del " + rule)
        for ns, rule in want - self.rules:
            by_ns.setdefault(ns, []).append("rule add " + rule)
        for ns, lines in by_ns.items():
            try:
                netns.ip_batch(lines, ns=ns, force=True)
            except netns.NetError:
                pass                  # a node gone meanwhile: its rules went with it
        self.rules = set(want)


def admitted(policies, src, ns_labels, dst):
    """True when src may reach dst on every port, else the [(proto, lo, hi)] it may."""
    ports = []
    src_ns = src["metadata"]["namespace"]
    for pol in policies:
        for rule in pol["spec"].get("ingress") or []:
            if not any(peer_admits(peer, pol, src, ns_labels.get(src_ns, {})) for peer in rule.get("from") or []) \
                    and rule.get("from"):
                continue
            if not rule.get("ports"):
                return True
            ports += [r for p in rule["ports"] for r in port_range(p, dst)]
    return ports


def peer_admits(peer, pol, src, src_ns_labels):
    if "podSelector" not in peer and "namespaceSelector" not in peer:
        return False                                   # ipBlock
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], src_ns_labels):
            return False
    elif src["metadata"]["namespace"] != pol["metadata"]["namespace"]:
        return False
    return selects(peer.get("podSelector") or {}, src["metadata"].get("labels") or {})


def port_range(port, dst):
    """[(proto, lo, hi)] of a NetworkPolicyPort on the Pod dst ([] for a name it lacks)."""
    proto = (port.get("protocol") or "TCP").lower()
    number = port.get("port")
    if number is None:
        return [(proto, 1, 65535)]
    if not isinstance(number, int) and not str(number).isdigit():
        found = [p["containerPort"] for c in dst["spec"].get("containers", []) for p in c.get("ports") or []
                 if p.get("name") == number]
        return [(proto, found[0], found[0])] if found else []
    return [(proto, int(number), int(port.get("endPort") or number))]
