"""The kubelets' heartbeats in the namespaced cluster: each node renews its Lease
kube-node-lease/NAME (coordination.k8s.io/v1, holderIdentity NAME, renewTime)
every `interval` seconds over HTTPS, as user system:node:NAME, from a socket in
the node's network namespace: so a node whose link is down, or that is
partitioned from the API server's address, stops heartbeating, as a real one
does. connected(NAME) is what the node's kubelet knows: whether its last
heartbeat got through (a kubelet that cannot reach the API server neither starts
Pods nor reports their status; kubelet.py holds the reports back)."""

import http.client
import json
import socket
import ssl
import threading
import time

import netns

LEASE_NS = "kube-node-lease"


def micro_now():
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%06dZ" % int((t % 1) * 1e6)


class NodeConnection(http.client.HTTPSConnection):
    """HTTPS whose socket is made in a network namespace."""

    def __init__(self, namespace, host, port, context, timeout):
        super().__init__(host, port, context=context, timeout=timeout)
        self.namespace = namespace

    def connect(self):
        with netns.in_namespace(self.namespace):
            sock = socket.socket()
        sock.settimeout(self.timeout)
        try:
            sock.connect((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class Heartbeat(threading.Thread):
    def __init__(self, agents, node, namespace):
        super().__init__(name="heartbeat-" + node, daemon=True)
        self.agents, self.node, self.namespace = agents, node, namespace
        self.token = agents.auth.node_token(node)
        self.ok_at = time.monotonic()       # a new node starts connected
        self.stopped = threading.Event()
        self.conn = None
        self.rv = None

    def connected(self):
        return time.monotonic() - self.ok_at < 2 * self.agents.interval + self.agents.timeout

    def run(self):
        while not self.stopped.wait(self.agents.interval):
            try:
                self._renew()
                self.ok_at = time.monotonic()
            except (OSError, http.client.HTTPException, ValueError):
                if self.conn:
                    self.conn.close()
                self.conn = None

    def _request(self, method, path, body=None):
        if self.conn is None:
            self.conn = NodeConnection(self.namespace, self.agents.host, self.agents.port, self.agents.context,
                                       self.agents.timeout)
        self.conn.request(method, path, body=json.dumps(body) if body is not None else None, headers={
            "Authorization": "Bearer " + self.token, "Content-Type": "application/json",
            "User-Agent": "kubelet/v1.32.0 (linux/amd64) pliant-emulator"})
        resp = self.conn.getresponse()
        data = json.loads(resp.read() or b"null")
        return resp.status, data

    def _renew(self):
        path = "/apis/coordination.k8s.io/v1/namespaces/%s/leases" % LEASE_NS
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": self.node, "namespace": LEASE_NS},
                 "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": micro_now()}}
        if self.rv:
            lease["metadata"]["resourceVersion"] = self.rv
            code, obj = self._request("PUT", "%s/%s" % (path, self.node), lease)
        else:
            code, obj = self._request("POST", path, lease)
        if code in (404, 409):          # made elsewhere, or changed: read it and go on
            self.rv = None
            code, obj = self._request("GET", "%s/%s" % (path, self.node))
            if code == 200:
                self.rv = obj["metadata"]["resourceVersion"]
            raise ValueError("lease conflict")
        if code not in (200, 201):
            raise ValueError("lease: HTTP %d" % code)
        self.rv = obj["metadata"]["resourceVersion"]


class NodeAgents:
    """One Heartbeat per node; interval and timeout in seconds."""

    def __init__(self, authenticator, interval):
        self.auth = authenticator
        self.interval = interval
        self.timeout = max(1.0, interval)
        self.beats = {}
        self.host = self.port = self.context = None

    def start(self, url, ca_pem):
        self.host, port = url.split("://")[1].rsplit(":", 1)
        self.port = int(port)
        self.context = ssl.create_default_context(cafile=ca_pem)

    def add(self, node, namespace):
        beat = Heartbeat(self, node, namespace)
        self.beats[node] = beat
        beat.start()

    def remove(self, node):
        beat = self.beats.pop(node, None)
        if beat:
            beat.stopped.set()

    def connected(self, node):
        beat = self.beats.get(node)
        return beat is None or beat.connected()

    def stop(self):
        for node in list(self.beats):
            self.remove(node)
