"""What `apiserver.py --cluster` adds to the emulator: a cluster with the
boundaries a real one has (cluster.py is its front end).

- Nodes are network namespaces on a bridge, Pods run in their own network, mount,
  PID, UTS and IPC namespaces with memory cgroups (netns.py, cgroups.py,
  runtime.py, sandbox.py); the kubelets heartbeat over that network
  (heartbeat.py), the node lifecycle controller and taint manager act on it
  (nodelifecycle.py), and faults.py breaks it as clouds do.
- The API server listens on the bridge's address with TLS, enforces RBAC
  (rbac.py) and runs the admission plugins ServiceAccount,
  DefaultTolerationSeconds, PodSecurity and ResourceQuota (Pod counts); the
  controllers run (endpoints, Deployments, ServiceAccounts); a DNS server answers
  for Services (dns.py); NetworkPolicies' ingress rules hold (netpol.py).

missing(name) says what this machine lacks for it (root, ip/nsenter/unshare,
network namespaces, a cgroup memory controller), or None. Cluster.shutdown()
stops every Pod and removes every namespace, link and cgroup it made.
"""

import atexit
import os
import sys

import cgroups
import netns
from dns import DnsServer
from faults import Faults
from heartbeat import NodeAgents
from kubelet import Kubelet
from netpol import PolicyAgent
from nodelifecycle import NodeLifecycle
from runtime import ClaimProvisioner, SandboxRuntime

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def missing(name):
    why = netns.missing()
    if why:
        return why
    why = cgroups.Cgroups(name + "probe").missing()
    return "cgroups: " + why if why else None


def add_options(ap):
    ap.add_argument("--cluster", action="store_true",
                    help="Nodes as network namespaces, Pods in namespaces and cgroups, RBAC, admission, DNS "
                         "(needs root; implies --kubelet --tls and every controller)")
    ap.add_argument("--name", default="pl", help="--cluster: the prefix of its namespaces, links and cgroups")
    ap.add_argument("--subnet", default="10.244.0.0/16", help="--cluster: the bridge's /16")
    ap.add_argument("--build-bin", default=os.path.join(REPO, "build", "bin"),
                    help="--cluster: the programs Pods see at /usr/local/bin")
    ap.add_argument("--node-monitor-grace-period", type=float, default=40.0,
                    help="--cluster: seconds without a heartbeat before a node is NotReady")


def apply_options(opts):
    """--cluster's implications on the other options."""
    if not opts.cluster:
        return
    if len(opts.name) > 6 or not opts.name.isalnum():
        raise SystemExit("apiserver.py: --name must be 1 to 6 letters or digits (it prefixes link names)")
    opts.kubelet = opts.tls = True
    opts.authorization_mode = "RBAC"
    opts.admission_plugins = ["ServiceAccount", "DefaultTolerationSeconds", "PodSecurity", "ResourceQuota"]
    opts.controller_names = ("endpoints", "deployments", "serviceaccounts")
    opts.token = opts.token or os.urandom(16).hex()


class Cluster:
    def __init__(self, opts, api, authenticator, work):
        self.api = api
        self.network = netns.Network(opts.name, opts.subnet)
        self.cgroups = cgroups.Cgroups(opts.name)
        atexit.register(self.shutdown)
        self.network.setup()
        try:
            self.cgroups.setup()
            opts.host = self.network.host_ip
            self.agents = NodeAgents(authenticator, max(0.5, min(10.0, opts.node_monitor_grace_period / 4)))
            runtime = SandboxRuntime(work, self.network, self.cgroups, authenticator, self.agents,
                                     os.path.abspath(opts.build_bin), self.network.host_ip)
            self.kubelet = Kubelet(api, work, zones=opts.zones.split(","), gpus=opts.gpus_per_node,
                                   runtime=runtime, agents=self.agents)
            self.faults = Faults(api, self.kubelet, self.network)
            self.dns = DnsServer(api.store, self.network.host_ip)
            self.lifecycle = NodeLifecycle(api, opts.node_monitor_grace_period)
            self.provisioner = ClaimProvisioner(api, work)
            self.policies = PolicyAgent(api.store, self.kubelet, self.network)
        except BaseException:
            self.shutdown()
            raise
        self.admin_hosts = {"127.0.0.1", self.network.host_ip}

    def start(self, url, ca_pem):
        self.agents.start(url, ca_pem)
        self.dns.start()
        self.lifecycle.start()
        self.provisioner.start()
        self.policies.start()

    def shutdown(self):
        """Stops every Pod; removes the namespaces, links and cgroups (once; also at exit)."""
        if getattr(self, "down", False):
            return
        self.down = True
        if getattr(self, "policies", None):
            self.policies.stop()
        if getattr(self, "agents", None):
            self.agents.stop()
        if getattr(self, "dns", None):
            self.dns.close()
        if getattr(self, "kubelet", None):
            self.kubelet.shutdown()
        self.network.teardown()
        try:
            cgroups.sweep(self.cgroups.name)
        except OSError as e:
            sys.stderr.write("apiserver: removing cgroups: %s\n" % e)
