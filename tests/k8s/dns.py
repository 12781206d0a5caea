"""The cluster DNS (CoreDNS's kubernetes plugin, reduced), a UDP server on the
bridge's address that Pods' /etc/resolv.conf names:

  SVC.NS.svc.cluster.local, SVC.NS.svc   A records: the ready addresses of the
                                         Service's EndpointSlices (label
                                         kubernetes.io/service-name), as CoreDNS
                                         reads them: those the endpoints
                                         controller writes for a selector, or a
                                         selector-less Service's own; without a
                                         slice, its Endpoints (what the mirroring
                                         controller would copy into one). Nothing
                                         routes ClusterIPs here, so every Service
                                         answers as a headless one
  A-B-C-D.NS.pod.cluster.local           A record A.B.C.D
  kubernetes.default.svc...              the API server (its Endpoints)

A name of an existing Service without ready endpoints, or a query for another
type (AAAA, ...), gets an empty answer; any other name NXDOMAIN. TTL 5 s.
"""

import socket
import struct
import threading

DOMAIN = "cluster.local"
TTL = 5


def _read_name(data, pos):
    labels = []
    while True:
        length = data[pos]
        if length == 0:
            return ".".join(labels), pos + 1
        if length & 0xC0:
            raise ValueError("compressed names in a query")
        labels.append(data[pos + 1:pos + 1 + length].decode("ascii", "replace"))
        pos += 1 + length


class DnsServer(threading.Thread):
    def __init__(self, store, address, port=53):
        super().__init__(name="dns", daemon=True)
        self.store = store
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, port))

    def run(self):
        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            try:
                reply = self.answer(data)
            except (ValueError, IndexError, struct.error):
                continue
            try:
                self.sock.sendto(reply, peer)
            except OSError:
                pass

    def close(self):
        self.sock.close()

    def lookup(self, name):
        """(the name exists, [IPv4 addresses])."""
        name = name.lower().rstrip(".")
        if name.endswith("." + DOMAIN):
            name = name[:-len(DOMAIN) - 1]
        parts = name.split(".")
        if len(parts) == 3 and parts[2] == "svc":
            svc, ns = parts[0], parts[1]
            with self.store.cond:
                if self.store.get("services", ns, svc) is None:
                    return False, []
                return True, self._ready(ns, svc)
        if len(parts) == 3 and parts[2] == "pod":
            address = parts[0].replace("-", ".")
            try:
                socket.inet_aton(address)
            except OSError:
                return False, []
            return True, [address]
        return False, []

    def _ready(self, ns, svc):
        """The Service's ready addresses (under the store's lock)."""
        slices = [s for s in self.store.items("discovery.k8s.io/endpointslices", ns)
                  if (s["metadata"].get("labels") or {}).get("kubernetes.io/service-name") == svc]
        if slices:     # ready unset means ready (discovery.k8s.io/v1)
            return sorted({a for s in slices for e in s.get("endpoints") or []
                           if (e.get("conditions") or {}).get("ready", True) is not False
                           for a in e.get("addresses") or []})
        ep = self.store.get("endpoints", ns, svc) or {}
        return [a["ip"] for s in ep.get("subsets") or [] for a in s.get("addresses") or []]

    def answer(self, query):
        qid, flags, qdcount = struct.unpack("!HHH", query[:6])
        if qdcount != 1:
            raise ValueError("one question per query")
        name, pos = _read_name(query, 12)
        qtype, qclass = struct.unpack("!HH", query[pos:pos + 4])
        question = query[12:pos + 4]
        exists, addresses = self.lookup(name)
        answers = [struct.pack("!HHHIH", 0xC00C, 1, 1, TTL, 4) + socket.inet_aton(a)
                   for a in addresses] if qtype in (1, 255) and qclass == 1 else []
        answers = answers[:20]
        rcode = 0 if exists else 3
        header = struct.pack("!HHHHHH", qid, 0x8400 | (flags & 0x0100) | 0x0080 | rcode, 1, len(answers), 0, 0)
        return header + question + b"".join(answers)
