"""Failures as clouds make them, for the namespaced cluster (POST
/_emulator/nodes/NAME/ACTION, `cluster.py node NAME ACTION`):

  preempt                    a spot reclaim: the node's kubelet shuts down
                             gracefully (Ready=False "node is shutting down"); each
                             Pod gets DisruptionTarget (TerminationByKubelet),
                             SIGTERM, its terminationGracePeriodSeconds, SIGKILL and
                             ends Failed (reason Terminated); then the machine and,
                             POWER_OFF_S later, its Node are deleted (the Pod garbage
                             collector removes the Pods)
  lose                       the node's link goes down: no RST, no FIN; its
                             heartbeats stop, so it becomes NotReady after the
                             node-monitor grace period and its Pods are evicted
                             after their tolerationSeconds (nodelifecycle.py)
  partition-from-peers       blackholes between the node and every other node
                             and its Pods, except the coordinator's Pod (body
                             {"address": IP}; default: the leading operator Pod's
                             address, below), which the node still reaches
  partition-from-coordinator blackholes between the node and one address
                             (body {"address": IP}; default: the leading operator
                             Pod's address — the Pod a Lease outside kube-node-lease
                             names as its holder, as leader election writes it —
                             else the API server's)
  restore                    the partitions go and the link comes up
"""

import threading
import time

from api import now
from errors import ApiError

POWER_OFF_S = 2.0  # from the Pods stopping to the Node deleted (_delete_after)
ACTIONS = ("preempt", "lose", "partition-from-peers", "partition-from-coordinator", "restore")


class Faults:
    def __init__(self, api, kubelet, network):
        self.api, self.store, self.kubelet, self.network = api, api.store, kubelet, network

    def act(self, name, action, body):
        if action not in ACTIONS:
            raise ApiError(404, "NotFound", "unknown node action %r (one of %s)" % (action, ", ".join(ACTIONS)))
        with self.store.cond:
            if self.store.get("nodes", "", name) is None or name not in self.kubelet.node_index:
                raise ApiError(404, "NotFound", 'nodes "%s" not found' % name)
            k = self.kubelet.node_index[name]
        if action == "preempt":
            return self._preempt(name)
        if action == "lose":
            self.network.set_link(k, False)
            return {"node": name, "action": action, "link": "down"}
        if action == "partition-from-peers":
            peers = [self.network.node_ip(j) for j in self.network.nodes if j != k]
            spare = (body or {}).get("address") or self._leader()
            self.network.isolate(k, peers, spare=spare)
            out = {"node": name, "action": action, "addresses": peers}
            if spare:
                out["spared"] = spare
            return out
        if action == "partition-from-coordinator":
            address = (body or {}).get("address") or self._coordinator()
            self.network.isolate(k, [address], self._pod_namespaces())
            out = {"node": name, "action": action, "addresses": [address]}
            if self.network.node_of(address) == k:
                out["note"] = "%s is on %s itself: nothing is cut" % (address, name)
            return out
        self.network.heal(k)
        self.network.set_link(k, True)
        return {"node": name, "action": action}

    def _coordinator(self):
        return self._leader() or self.network.host_ip

    def _leader(self):
        """The address of the Pod a Lease names as its holder (leader election's
        identity is the Pod's name), or None."""
        with self.store.cond:
            for lease in self.store.items("coordination.k8s.io/leases"):
                ns = lease["metadata"]["namespace"]
                holder = (lease.get("spec") or {}).get("holderIdentity")
                pod = self.store.get("pods", ns, holder) if holder and ns != "kube-node-lease" else None
                if pod and pod.get("status", {}).get("podIP"):
                    return pod["status"]["podIP"]
        return None

    def _pod_namespaces(self):
        with self.store.cond:
            return {r.ip: r.netns for r in self.kubelet.runners.values() if getattr(r, "netns", None)}

    def _preempt(self, name):
        node_res = self.api.registry.lookup("v1", "nodes")
        with self.store.cond:
            def shutting_down(node):
                for c in node["status"].get("conditions", []):
                    if c["type"] == "Ready":
                        c.update(status="False", reason="KubeletNotReady", message="node is shutting down",
                                 lastTransitionTime=now())
            self.api.mutate(node_res, None, name, shutting_down, sub="status")
            runners = [r for r in self.kubelet.runners.values() if r.pod["spec"].get("nodeName") == name
                       and not r.done and not r.abandoned]
            grace = 0
            for r in runners:
                seconds = r.pod["spec"].get("terminationGracePeriodSeconds", 30)
                grace = max(grace, seconds)
                r.shut_down(seconds)
        threading.Thread(target=self._delete_after, args=(name, runners, grace), daemon=True,
                         name="preempt-" + name).start()
        return {"node": name, "action": "preempt", "pods": [r.name for r in runners], "graceSeconds": grace}

    def _delete_after(self, name, runners, grace):
        """The machine powers off once its Pods stopped (or their grace ran out), and the
        cloud's node controller deletes its Node a moment later (POWER_OFF_S): until then
        the Pods show their final status (Failed, Terminated), as on a real cluster, where
        the Pod garbage collector also waits before removing a gone node's Pods."""
        deadline = time.monotonic() + grace + 2
        while time.monotonic() < deadline and not all(r.done for r in runners):
            time.sleep(0.1)
        time.sleep(POWER_OFF_S)
        with self.store.cond:
            if self.store.get("nodes", "", name) is not None:
                self.api.delete(self.api.registry.lookup("v1", "nodes"), None, name, {})
