"""The namespaced cluster's network: Linux network namespaces, veth pairs and a
bridge, made with iproute2's `ip` (no iptables or nftables: partitions are
blackhole routes). With the subnet A.B.0.0/16 and the name NAME:

  control plane  the host, on the bridge NAMEbr0 as A.B.0.1/24: the API server and DNS
  node k         netns NAME-node-k; eth0 A.B.0.(10+k)/24 on the bridge (the host's
                 end is NAMEnK); forwards packets; routes A.B.(k+1).0/24 (its Pods'
                 range, the Node's spec.podCIDR) to their veths and every other
                 node's range to that node
  Pod            netns NAME-p-UID; eth0 A.B.(k+1).N/32 with the default route via
                 169.254.1.1, the node's end of the veth (a fixed neighbour entry), so
                 a Pod's packets cross its node and the bridge
  host           routes each node's Pod range to the node

Neighbours on the bridge are permanent (fixed MAC addresses), as a cloud network
has no ARP to fail: a lost link drops packets silently.

Failures (faults.py drives them):
  set_link(node, False)  the node's end on the bridge goes down: no carrier, no
                         RST, no FIN; packets to and from it vanish
  isolate(node, peers)   blackhole routes, both ways: in the node for each
                         address or range, and on the other side for the node's
                         address and Pod range (two /25 halves, more specific than
                         the /24 routes, so restoring is deleting them)
  heal(node)             deletes every route isolate added for the node

in_namespace(name) switches the calling thread into a network namespace (for a
socket made there: the kubelet's heartbeats and probes leave from their node).
sweep(NAME) deletes every namespace and link of a cluster.
"""

import contextlib
import ctypes
import ipaddress
import os
import subprocess
import threading

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
_libc = ctypes.CDLL(None, use_errno=True)
GATEWAY = "169.254.1.1"


class NetError(Exception):
    pass


def ip(*args, ns=None, check=True):
    """Runs `ip [-n NS] ARGS`; NetError with its message on failure."""
    cmd = ["ip"] + (["-n", ns] if ns else []) + [str(a) for a in args]
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if check and p.returncode != 0:
        raise NetError("%s: %s" % (" ".join(cmd), p.stderr.decode().strip()))
    return p.stdout.decode()


def ip_batch(lines, ns=None, force=False):
    """Several `ip` commands in one process (ip -batch; with force, past failed ones)."""
    cmd = ["ip"] + (["-n", ns] if ns else []) + (["-force"] if force else []) + ["-batch", "-"]
    p = subprocess.run(cmd, input="\n".join(lines).encode(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        raise NetError("ip -batch (%s): %s" % ("; ".join(lines), p.stderr.decode().strip()))



@contextlib.contextmanager
def in_namespace(name):
    """Runs the block with this thread in netns name (None: stay where it is)."""
    if name is None:
        yield
        return
    with open("/proc/thread-self/ns/net") as home, open(os.path.join(NETNS_DIR, name)) as there:
        if _libc.setns(there.fileno(), CLONE_NEWNET) != 0:
            raise NetError("setns %s: %s" % (name, os.strerror(ctypes.get_errno())))
        try:
            yield
        finally:
            _libc.setns(home.fileno(), CLONE_NEWNET)


def sysctl(name, key, value):
    with in_namespace(name):
        with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
            f.write(str(value))


def _mac(*numbers):
    return "02:" + ":".join("%02x" % (n & 0xFF) for n in numbers)


class Network:
    def __init__(self, name, subnet="10.244.0.0/16"):
        net = ipaddress.ip_network(subnet)
        if net.prefixlen != 16:
            raise ValueError("the cluster subnet must be a /16, not %s" % subnet)
        self.name = name
        self.base = str(net.network_address).rsplit(".", 2)[0]      # "10.244"
        self.bridge = name + "br0"
        self.host_ip = self.base + ".0.1"
        self.tag = sum(name.encode()) & 0xFF
        self.nodes = {}         # index -> netns name
        self.isolations = {}    # node index -> [(netns or None, destination)]
        self.lock = threading.Lock()

    # -- addresses -----------------------------------------------------------------

    def node_ip(self, k):
        return "%s.0.%d" % (self.base, 10 + k)

    def pod_cidr(self, k):
        return "%s.%d.0/24" % (self.base, k + 1)

    def pod_ip(self, k, n):
        return "%s.%d.%d" % (self.base, k + 1, n)

    def node_of(self, address):
        """The node index whose address or Pod range holds address, else None."""
        parts = address.split(".")
        if ".".join(parts[:2]) != self.base:
            return None
        k = int(parts[3]) - 10 if parts[2] == "0" else int(parts[2]) - 1
        return k if k in self.nodes else None

    def node_ns(self, k):
        return "%s-node-%d" % (self.name, k)

    def pod_ns(self, uid):
        return "%s-p-%s" % (self.name, uid[:8])

    # -- the bridge and the nodes ------------------------------------------------------

    def setup(self):
        ip("link", "add", self.bridge, "address", _mac(self.tag, 0, 0, 0, 1), "type", "bridge")
        ip_batch(["addr add %s/24 dev %s" % (self.host_ip, self.bridge), "link set %s up" % self.bridge])

    def add_node(self, k):
        ns, host_end = self.node_ns(k), "%sn%d" % (self.name, k)
        ip("netns", "add", ns)
        ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "address", _mac(self.tag, 1, 0, 0, k),
           "netns", ns)
        ip_batch(["link set %s master %s" % (host_end, self.bridge), "link set %s up" % host_end,
                  "route add %s via %s" % (self.pod_cidr(k), self.node_ip(k)),
                  "neigh replace %s lladdr %s nud permanent dev %s" % (self.node_ip(k), _mac(self.tag, 1, 0, 0, k),
                                                                     self.bridge)])
        lines = ["link set lo up", "addr add %s/24 dev eth0" % self.node_ip(k), "link set eth0 up",
                 "neigh replace %s lladdr %s nud permanent dev eth0" % (self.host_ip, _mac(self.tag, 0, 0, 0, 1))]
        with self.lock:
            peers = dict(self.nodes)
            self.nodes[k] = ns
        for j, peer in peers.items():
            lines += ["route add %s via %s" % (self.pod_cidr(j), self.node_ip(j)),
                      "neigh replace %s lladdr %s nud permanent dev eth0" % (self.node_ip(j),
                                                                           _mac(self.tag, 1, 0, 0, j))]
            ip_batch(["route add %s via %s" % (self.pod_cidr(k), self.node_ip(k)),
                      "neigh replace %s lladdr %s nud permanent dev eth0" % (self.node_ip(k),
                                                                           _mac(self.tag, 1, 0, 0, k))], ns=peer)
        ip_batch(lines, ns=ns)
        sysctl(ns, "net.ipv4.ip_forward", 1)
        return ns

    def remove_node(self, k):
        """The machine is gone: its namespace (its Pods' veths with it) and routes to it."""
        with self.lock:
            ns = self.nodes.pop(k, None)
            self.isolations.pop(k, None)
            peers = dict(self.nodes)
        if ns is None:
            return
        ip("netns", "del", ns, check=False)
        ip("route", "del", self.pod_cidr(k), check=False)
        for peer in peers.values():
            ip("route", "del", self.pod_cidr(k), ns=peer, check=False)

    # -- Pods ----------------------------------------------------------------------

    def add_pod(self, k, uid, address):
        """The Pod's namespace with its address, linked to node k; returns the netns name."""
        ns, node_end = self.pod_ns(uid), "pv" + uid[:8]
        n = [int(x) for x in address.split(".")[2:]]
        node_mac, pod_mac = _mac(self.tag, 2, n[0], n[1], 1), _mac(self.tag, 2, n[0], n[1], 2)
        ip("netns", "add", ns)
        ip("link", "add", node_end, "address", node_mac, "type", "veth", "peer", "name", "eth0", "address", pod_mac,
           "netns", ns, ns=self.node_ns(k))
        ip_batch(["link set lo up", "addr add %s/32 dev eth0" % address, "link set eth0 up",
                  "route add %s dev eth0 scope link" % GATEWAY, "route add default via %s dev eth0" % GATEWAY,
                  "neigh replace %s lladdr %s nud permanent dev eth0" % (GATEWAY, node_mac)], ns=ns)
        ip_batch(["link set %s up" % node_end, "route replace %s/32 dev %s" % (address, node_end),
                  "neigh replace %s lladdr %s nud permanent dev %s" % (address, pod_mac, node_end)],
                 ns=self.node_ns(k))
        return ns

    def remove_pod(self, uid):
        ip("netns", "del", self.pod_ns(uid), check=False)

    # -- failures ------------------------------------------------------------------

    def set_link(self, k, up):
        ip("link", "set", "%sn%d" % (self.name, k), "up" if up else "down")

    def _ranges(self, address):
        """What a blackhole for address covers: a node's address and Pod range (as
        two /25s), or the address alone."""
        k = self.node_of(address)
        if k is None or address != self.node_ip(k):
            return [address + "/32"]
        cidr = ipaddress.ip_network(self.pod_cidr(k))
        return [address + "/32"] + [str(half) for half in cidr.subnets(1)]

    def isolate(self, k, addresses, pod_namespaces=None, spare=None):
        """Blackholes between node k and each address (a node's, a Pod's or the host's),
        both ways. pod_namespaces maps a Pod address to its netns (its side of the cut).
        spare: a Pod address on one of those nodes that node k still reaches (the
        coordinator's): a route of its own overrides node k's blackholes, and that node
        keeps no blackholes (node k's replies to its other Pods are dropped at node k)."""
        mine = self._ranges(self.node_ip(k))
        spare_node = self.node_of(spare) if spare else None
        added = []
        for address in addresses:
            for dest in self._ranges(address):
                added.append((self.nodes[k], ["blackhole", dest]))
            j = self.node_of(address)
            if address == self.host_ip:
                side = None
            elif j is not None and address == self.node_ip(j):
                side = self.nodes[j]
                if j == spare_node and spare != address:
                    added.append((self.nodes[k], [spare + "/32", "via", address, "dev", "eth0", "onlink"]))
                    continue
            else:
                side = (pod_namespaces or {}).get(address)
                if side is None:
                    continue
            added += [(side, ["blackhole", dest]) for dest in mine]
        for ns, route in added:
            ip("route", "add", *route, ns=ns, check=False)
        with self.lock:
            self.isolations.setdefault(k, []).extend(added)

    def heal(self, k):
        with self.lock:
            routes = self.isolations.pop(k, [])
        for ns, route in routes:
            ip("route", "del", *route, ns=ns, check=False)

    def teardown(self):
        for k in list(self.nodes):
            self.remove_node(k)
        sweep(self.name)


def namespaces(name):
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(name + "-"))
    except FileNotFoundError:
        return []


def links(name):
    out = []
    for line in ip("-o", "link", "show", check=False).splitlines():
        link = line.split(":")[1].strip().split("@")[0]
        if link == name + "br0" or link.startswith(name + "n") and link[len(name) + 1:].isdigit():
            out.append(link)
    return out


def sweep(name):
    """Deletes every network namespace and link of cluster NAME; returns what it found."""
    found = namespaces(name) + links(name)
    for ns in namespaces(name):
        ip("netns", "del", ns, check=False)
    for link in links(name):
        ip("link", "del", link, check=False)
    return found


def conflicts(subnet):
    """This machine's addresses and routes inside subnet (another network's)."""
    base = str(ipaddress.ip_network(subnet).network_address).rsplit(".", 2)[0] + "."
    lines = ip("-4", "-o", "addr", "show", check=False).splitlines() + ip("-4", "route", "show", "table", "all",
                                                                           check=False).splitlines()
    return [l.strip() for l in lines if base in l]


def missing():
    """Why namespaces and bridges cannot be made here, or None (tries one of each)."""
    probe = "plprobe%d" % (os.getpid() % 100000)
    if os.geteuid() != 0:
        return "not root (network namespaces, mounts and cgroups need root)"
    for tool in ("ip", "nsenter", "unshare"):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in os.environ.get("PATH", "").split(":")):
            return "the %s command is missing (iproute2 / util-linux)" % tool
    try:
        ip("netns", "add", probe)
        ip("netns", "del", probe)
        ip("link", "add", probe, "type", "bridge")
        ip("link", "del", probe)
    except NetError as e:
        return "cannot make network namespaces or bridges: %s" % e
    return None
