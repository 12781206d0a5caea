"""The fake nodes of --kubelet: a scheduler, kubelets that run Pods as local
processes, and the node lifecycle controller and Pod garbage collector for Pods
whose node is gone.

Nodes: node-0..N-1 (and those POST /_emulator/nodes adds), labelled
kubernetes.io/hostname and topology.kubernetes.io/zone (round-robin over the
zones), allocatable nvidia.com/gpu G (--gpus-per-node).

Scheduler: binds each Pending Pod (schedulerName default-scheduler) to a Ready,
schedulable node whose labels match its nodeSelector, whose NoSchedule/NoExecute
taints it tolerates, and with enough free nvidia.com/gpu (requests of the
non-terminated Pods bound there); among those, the node whose topology domains
hold the fewest Pods matching the Pod's topologySpreadConstraints selectors (a
preference: maxSkew and DoNotSchedule are not enforced), then the emptiest.
Affinity is not read. A Pod that fits nowhere
gets PodScheduled=False/Unschedulable and waits (e.g. for POST /_emulator/nodes).

Kubelet: a runtime (LocalRuntime here; runtime.py's SandboxRuntime with
--cluster, where Pods get namespaces, cgroups and the images' entrypoints) makes
each Pod's process. LocalRuntime, the default: it runs the first container's
command + args (with $(VAR) expansion) as
a process in its own process group, in the emulator's working directory (or
workingDir), stdout and stderr to a log file (GET pods/NAME/log). Images are
taken to have no ENTRYPOINT and an idle CMD: without `command` the args are the
command, and without either the container runs `sleep infinity`. Each Pod gets
its own podIP 127.0.0.X (processes should bind it). Environment: the emulator's
own (PATH etc.), KUBERNETES_SERVICE_HOST/PORT, HOSTNAME, PLIANT_POD_ROOT, then
the container's env (value, fieldRef metadata.name/namespace/uid/labels['k'],
spec.nodeName, status.podIP, status.hostIP; secretKeyRef, configMapKeyRef) and
envFrom. Volumes are materialised under PLIANT_POD_ROOT=<dir>: each volumeMount
at <dir><mountPath> (secret and configMap volumes as files, emptyDir as a
directory, hostPath as a symlink, a persistentVolumeClaim as a directory shared
by the Pods using that claim). Command, args and env values that start with a
mountPath are rewritten to <dir><mountPath>..., so unmodified commands find
their files. restartPolicy Always/OnFailure restarts the container (1 s back-off).
Status: phase Pending/Running/Succeeded/Failed, conditions (PodScheduled,
Initialized, ContainersReady, Ready; ready as soon as the process runs; with
--cluster the readiness and liveness probes run, probes.py), containerStatuses
with state (reason OOMKilled where the runtime says so), restartCount and exit
code. A container that cannot be made waits (ContainerCreating for a missing
Secret, ConfigMap or claim, CreateContainerConfigError).

Events (core/v1) as a real cluster records them: Scheduled and FailedScheduling
from default-scheduler, Started and Killing from the kubelet.

The service-account directory (token: the emulator's --token, ca.crt with --tls,
namespace) is mounted unless automountServiceAccountToken is false, so an
in-cluster client in a Pod reaches the emulator (over https: use --tls).

Deleting a running Pod: SIGTERM to its process group, SIGKILL after the grace
period, then the final status and the removal. Deleting a Node (or marking it
not ready): its processes are killed at once, their Pods become Failed with a
DisruptionTarget condition (DeletionByPodGC / DeletionByTaintManager) and are
removed, as the pod garbage collector and taint manager do. With --cluster a
not-ready node is left to nodelifecycle.py's taint manager instead, and a node
whose heartbeats do not get through (heartbeat.py) neither starts Pods nor
reports their status until they do (its Pods go on running, cut off); a node's
graceful shutdown (faults.py's preempt) ends its Pods Failed, reason Terminated.
"""

import base64
import ctypes
import os
import re
import shutil
import signal
import subprocess
import threading
import time

from api import condition_true, now, set_condition
from errors import ApiError
from probes import Prober
from selection import selects

GPU = "nvidia.com/gpu"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_prctl = ctypes.CDLL(None, use_errno=True).prctl    # resolved here, not in a forked child
_PR_SET_PDEATHSIG = 1


def _die_with_supervisor():
    """In the child: SIGKILL when the thread that started it ends, so no Pod process
    outlives a killed emulator (its supervising thread waits on it until it exits)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Kubelet:
    def __init__(self, api, work, zones, gpus, runtime=None, agents=None):
        self.api, self.store = api, api.store
        self.work = work
        self.zones = zones
        self.gpus = gpus
        self.node_res = api.registry.lookup("v1", "nodes")
        self.runners = {}          # pod uid -> Runner
        self.unschedulable = {}    # pod uid -> message last written
        self.url = None
        self.next_node = 0
        self.node_index = {}       # node name -> index (its place in the runtime's network)
        self.runtime = runtime or LocalRuntime()
        self.runtime.kubelet = self
        # the nodes' heartbeats (heartbeat.py), in the namespaced cluster: a node whose
        # kubelet cannot reach the API server neither starts nor reports its Pods;
        # without them a not-ready node's Pods are lost at once
        self.agents = agents
        self.probes = agents is not None   # readiness and liveness probes are run

    def start(self, url, nodes, token=None, ca_pem=None):
        """Adds the nodes and starts the loop; url, token and CA are what Pods get to
        reach the API (KUBERNETES_SERVICE_HOST/PORT and the service-account files)."""
        self.url = url
        self.runtime.start(url, token, ca_pem)
        for _ in range(nodes):
            self.add_node({})
        threading.Thread(target=self._loop, name="kubelet", daemon=True).start()

    def shutdown(self):
        with self.store.cond:
            for runner in self.runners.values():
                runner.kill()
        self.runtime.shutdown()

    # -- nodes ---------------------------------------------------------------------

    def add_node(self, spec):
        """Creates a Ready node (the cluster autoscaler's part)."""
        with self.store.cond:
            index = self.next_node
            self.next_node += 1
            name = spec.get("name") or "node-%d" % index
            if self.store.get("nodes", "", name) is not None:
                raise ApiError(409, "AlreadyExists", 'nodes "%s" already exists' % name)
        address, pod_cidr = self.runtime.add_node(index, name)     # the machine boots (slow: outside the lock)
        with self.store.cond:
            self.node_index[name] = index
            zone = spec.get("zone") or self.zones[index % len(self.zones)]
            gpus = str(spec.get("gpus", self.gpus))
            labels = {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone,
                      "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
            labels.update(spec.get("labels") or {})
            resources = {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: gpus}
            node = {"metadata": {"name": name, "labels": labels}, "spec": {"providerID": "emulator://" + name},
                    "status": {"capacity": resources, "allocatable": dict(resources),
                               "conditions": [_condition("Ready", "True", "KubeletReady",
                                                         "kubelet is posting ready status")],
                               "addresses": [{"type": "InternalIP", "address": address},
                                             {"type": "Hostname", "address": name}],
                               "nodeInfo": {"kubeletVersion": "v1.32.0-emulator", "operatingSystem": "linux",
                                            "architecture": "amd64"}}}
            if pod_cidr:
                node["spec"].update(podCIDR=pod_cidr, podCIDRs=[pod_cidr])
            return self.api.create(self.node_res, None, node)[0]

    def node_not_ready(self, name):
        """The node stops answering: Ready=Unknown and the unreachable taints."""
        def fail(node):
            node["status"]["conditions"] = [_condition("Ready", "Unknown", "NodeStatusUnknown",
                                                       "Kubelet stopped posting node status.")]
        with self.store.cond:
            if self.api.mutate(self.node_res, None, name, fail, sub="status") is None:
                raise ApiError(404, "NotFound", 'nodes "%s" not found' % name)
            return self.api.mutate(self.node_res, None, name, lambda n: n["spec"].__setitem__("taints", [
                {"key": "node.kubernetes.io/unreachable", "effect": effect, "timeAdded": now()}
                for effect in ("NoSchedule", "NoExecute")]))

    # -- the control loop ----------------------------------------------------------

    def _loop(self):
        self.store.run_on_changes(self.sync)

    def sync(self):
        nodes = {n["metadata"]["name"]: n for n in self.store.items("nodes")}
        pods = self.store.items("pods")
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if not node:
                if not pod["metadata"].get("deletionTimestamp"):
                    self._schedule(pod, nodes)
            elif node not in nodes:
                self._lose(pod, "DeletionByPodGC", "PodGC: node no longer exists")
            elif self.agents is None and not condition_true(nodes[node], "Ready"):
                self._lose(pod, "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")
            elif self.connected(node):
                self._run(pod)
        live = {p["metadata"]["uid"] for p in self.store.items("pods")}
        for uid in [u for u in self.runners if u not in live]:
            self.runners.pop(uid).kill()          # removed without a grace period (or finished)
        for uid in [u for u in self.unschedulable if u not in live]:
            del self.unschedulable[uid]
        for name in [n for n in self.node_index if n not in nodes]:
            self.runtime.remove_node(self.node_index.pop(name), name)     # the machine is gone

    def connected(self, node):
        """Whether the node's kubelet reaches the API server (its last heartbeat did)."""
        return self.agents is None or self.agents.connected(node)

    def _run(self, pod):
        uid = pod["metadata"]["uid"]
        runner = self.runners.get(uid)
        if runner:
            runner.flush(pod)
        if pod["metadata"].get("deletionTimestamp"):
            if runner and not runner.done:
                runner.terminate(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            else:
                self.api.finish_pod_deletion(pod["metadata"]["namespace"], pod["metadata"]["name"])
        elif runner is None and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            runner = Runner(self, pod)
            if runner.prepare():
                self.runners[uid] = runner
                runner.start()

    def _lose(self, pod, reason, message):
        """The pod GC / taint manager: the Pod's machine is gone, so is its process."""
        meta = pod["metadata"]
        runner = self.runners.pop(meta["uid"], None)
        if runner:
            runner.kill()

        def failed(p):
            if p["status"].get("phase") in ("Succeeded", "Failed"):
                return
            set_condition(p, "DisruptionTarget", "True", reason, message)
            set_condition(p, "Ready", "False", "", "")
            p["status"]["phase"] = "Failed"
            for cs in p["status"].get("containerStatuses", []):
                if "running" in cs.get("state", {}):
                    cs.update(ready=False, state={"terminated": {"exitCode": 137, "reason": "Error",
                                                                 "finishedAt": now()}})
        self.api.mutate(self.api.pod_res, meta["namespace"], meta["name"], failed, sub="status")
        self.api.finish_pod_deletion(meta["namespace"], meta["name"])

    # -- scheduling ----------------------------------------------------------------

    def _schedule(self, pod, nodes):
        if pod["spec"].get("schedulerName", "default-scheduler") != "default-scheduler":
            return
        pods = self.store.items("pods")       # with the bindings made earlier in this sync
        want = _gpus(pod)
        fits, why = [], {}
        for node in nodes.values():
            reason = self._unfit(pod, node, want, pods)
            if reason:
                why[reason] = why.get(reason, 0) + 1
            else:
                fits.append(node)
        meta = pod["metadata"]
        if not fits:
            message = "0/%d nodes are available: %s." % (len(nodes), ", ".join(
                "%d %s" % (n, r) for r, n in sorted(why.items())))
            if self.unschedulable.get(meta["uid"]) != message:
                self.unschedulable[meta["uid"]] = message
                self.api.mutate(self.api.pod_res, meta["namespace"], meta["name"], lambda p: set_condition(
                    p, "PodScheduled", "False", "Unschedulable", message), sub="status")
                self.event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
            return
        best = min(fits, key=lambda n: (_spread_score(pod, n, nodes, pods), _count_on(n, pods),
                                        n["metadata"]["name"]))
        self.unschedulable.pop(meta["uid"], None)
        self.api.bind(meta["namespace"], meta["name"], best["metadata"]["name"])
        self.event(pod, "Normal", "Scheduled", "Successfully assigned %s/%s to %s"
                   % (meta["namespace"], meta["name"], best["metadata"]["name"]), "default-scheduler")

    def event(self, pod, kind, reason, message, component):
        """A core/v1 Event about the Pod, as the scheduler and kubelet report them."""
        self.api.record_event(pod, kind, reason, message, component, pod["spec"].get("nodeName", ""))

    def _unfit(self, pod, node, want, pods):
        if not condition_true(node, "Ready") or node["spec"].get("unschedulable"):
            return "node(s) were unschedulable or not ready"
        labels = node["metadata"].get("labels", {})
        if any(labels.get(k) != v for k, v in (pod["spec"].get("nodeSelector") or {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        for taint in node["spec"].get("taints", []):
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(pod, taint):
                return "node(s) had untolerated taint {%s: %s}" % (taint["key"], taint.get("value", ""))
        if want:
            used = sum(_gpus(p) for p in pods if p["spec"].get("nodeName") == node["metadata"]["name"]
                       and p.get("status", {}).get("phase") not in ("Succeeded", "Failed"))
            if used + want > int(node["status"].get("allocatable", {}).get(GPU, "0")):
                return "Insufficient %s" % GPU
        return None

    # -- logs ----------------------------------------------------------------------

    def serve_log(self, handler, namespace, name, query):
        with self.store.cond:
            pod = self.store.get("pods", namespace, name)
            runner = self.runners.get(pod["metadata"]["uid"]) if pod else None
        if pod is None:
            raise ApiError(404, "NotFound", 'pods "%s" not found' % name)
        if runner is None:
            container = pod["spec"]["containers"][0]["name"]
            raise ApiError(400, "BadRequest", 'container "%s" in pod "%s" is waiting to start: ContainerCreating'
                           % (container, name))
        try:
            with open(runner.log_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:              # the Pod was removed meanwhile
            raise ApiError(404, "NotFound", 'pods "%s" not found' % name)
        if query.get("tailLines"):
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(query["tailLines"]):]) if int(query["tailLines"]) else b""
        if query.get("follow") not in ("1", "true"):
            return handler.send_text(200, data)
        handler.start_chunked("text/plain")
        with open(runner.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if data:
                handler.send_chunk(data)
            while not handler.client_gone():
                more = f.read()
                if more:
                    handler.send_chunk(more)
                elif not runner.running():
                    break
                else:
                    time.sleep(0.1)      # tail -f: the file gives no change notification
        handler.send_chunk(b"")


class Runner:
    """One Pod's container: its process, restarts, and the end of it."""

    def __init__(self, kubelet, pod):
        self.kubelet, self.api, self.runtime = kubelet, kubelet.api, kubelet.runtime
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = os.path.join(kubelet.work, "pods", "%s_%s_%s" % (self.namespace, self.name, self.uid[:8]))
        self.log_path = os.path.join(self.dir, "log")
        self.pod = pod
        self.ip = None
        self.proc = None
        self.stopping = False      # the Pod is being deleted
        self.abandoned = False     # its node is gone: nothing more is written
        self.done = False          # the supervising thread has ended
        self.restarts = 0
        self.last_state = None
        self.ready = not kubelet.probes    # probes.py sets it where probes run
        self.pending = []          # status changes made while the node was cut off
        self.node_shutdown = False # stopped by its node's shutdown, not by a deletion
        self.started = None        # when the running container started

    # Called with the store lock held.
    def prepare(self):
        """Volumes, environment and command (the runtime's part); False (and a waiting
        status) when something it needs does not exist yet, or cannot be."""
        try:
            os.makedirs(self.dir, exist_ok=True)
            self.runtime.prepare(self)
        except Waiting as e:
            self._write_status(lambda s: s.update(containerStatuses=[self._container_status(
                {"waiting": {"reason": e.reason, "message": str(e)}}, False)]))
            return False
        open(self.log_path, "ab").close()
        return True

    def start(self):
        threading.Thread(target=self._supervise, name="pod-" + self.name, daemon=True).start()

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, grace):
        if self.stopping:
            return
        self.stopping = True
        if self.running():
            self.kubelet.event(self.pod, "Normal", "Killing", "Stopping container %s"
                               % self.pod["spec"]["containers"][0]["name"], "kubelet")
        self._signal(signal.SIGTERM)
        timer = threading.Timer(grace, self._signal, (signal.SIGKILL,))
        timer.daemon = True
        timer.start()

    def shut_down(self, grace):
        """The node shuts down (a spot preemption): DisruptionTarget, SIGTERM, SIGKILL
        after grace; the Pod ends Failed (reason Terminated) and stays until its node goes."""
        self.node_shutdown = True
        self._write_status(lambda s: set_condition({"status": s}, "DisruptionTarget", "True", "TerminationByKubelet",
                                                   SHUTDOWN_MESSAGE))
        self.terminate(grace)

    def kill(self):
        """The Pod is gone: stop at once, write nothing more, drop its files."""
        self.abandoned = True
        self._signal(signal.SIGKILL)
        self.runtime.release(self)

    def _signal(self, sig):
        if self.running():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    # -- the supervising thread ----------------------------------------------------

    def _supervise(self):
        try:
            if self.runtime.setup(self):
                self._run_container()
        finally:
            self.done = True

    def _run_container(self):
        while True:
            started = now()
            with self.kubelet.store.cond:
                if self.abandoned:
                    return
                if self.stopping:
                    return self._finish(None, started)
                code = self._spawn()
                if code is None:
                    self._write_status(self._running_status(started))
                    self.kubelet.event(self.pod, "Normal", "Started", "Started container %s"
                                       % self.pod["spec"]["containers"][0]["name"], "kubelet")
            if code is None:
                prober = Prober(self, self.proc) if self.kubelet.probes else None
                code = self.proc.wait()
                if prober:
                    prober.stop()
            with self.kubelet.store.cond:
                if self.abandoned:
                    return
                policy = self.pod["spec"].get("restartPolicy", "Always")
                restart = policy == "Always" or policy == "OnFailure" and code != 0
                if self.stopping or not restart:
                    return self._finish(code, started)
                self.restarts += 1
                self.last_state = self._terminated(code, started)
                self._write_status(lambda s: s.update(containerStatuses=[self._container_status(
                    {"waiting": {"reason": "CrashLoopBackOff" if code else "Completed"}}, False)]))
            time.sleep(1.0)      # the kubelet's restart back-off (shortened)

    def _spawn(self):
        """Starts the process; None, or an exit code when it could not start."""
        argv, env, cwd, preexec = self.runtime.command(self)
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                             preexec_fn=preexec)
            return None
        except OSError as e:
            with open(self.log_path, "ab") as log:
                log.write(("fake kubelet: cannot start %s: %s\n" % (argv[0], e)).encode())
            return 128

    def _finish(self, code, started):
        """The container ended: terminal status, and the removal of a deleted Pod."""
        def final(status):
            phase = "Succeeded" if code == 0 and not self.node_shutdown else "Failed"
            state = self._terminated(code if code is not None else 137, started)
            status.update(phase=phase, containerStatuses=[self._container_status(state, False)])
            if self.node_shutdown:
                status.update(reason="Terminated", message=SHUTDOWN_MESSAGE)
            for kind in ("ContainersReady", "Ready"):
                set_condition({"status": status}, kind, "False", "PodCompleted" if code == 0 else
                              "ContainersNotReady", "")
        self._write_status(final)
        if self.stopping and not self.node_shutdown:
            self.api.finish_pod_deletion(self.namespace, self.name)

    def _running_status(self, started):
        def update(status):
            host = self.runtime.host_ip(self.pod["spec"]["nodeName"])
            status.update(phase="Running", podIP=self.ip, podIPs=[{"ip": self.ip}], hostIP=host,
                          hostIPs=[{"ip": host}], startTime=status.get("startTime") or started,
                          containerStatuses=[self._container_status({"running": {"startedAt": started}},
                                                                    self.ready)])
            for kind in ("PodReadyToStartContainers", "Initialized"):
                set_condition({"status": status}, kind, "True", "", "")
            for kind in ("ContainersReady", "Ready"):
                set_condition({"status": status}, kind, "True" if self.ready else "False",
                              "" if self.ready else "ContainersNotReady",
                              "" if self.ready else "containers with unready status: [%s]"
                              % self.pod["spec"]["containers"][0]["name"])
        self.started = started
        return update

    def set_ready(self, ready):
        """A readiness probe's verdict changed (probes.py)."""
        with self.kubelet.store.cond:
            self.ready = ready
            if not self.abandoned and not self.stopping and self.running():
                self._write_status(self._running_status(self.started))

    def liveness_failed(self):
        """probes.py: the container is killed, then restarted by its restartPolicy."""
        container = self.pod["spec"]["containers"][0]["name"]
        with self.kubelet.store.cond:
            if self.abandoned or self.stopping:
                return
            self.kubelet.event(self.pod, "Warning", "Unhealthy", "Liveness probe failed", "kubelet")
            self.kubelet.event(self.pod, "Normal", "Killing", "Container %s failed liveness probe, will be "
                               "restarted" % container, "kubelet")
        self._signal(signal.SIGKILL)

    def _terminated(self, code, started):
        state = _terminated(code, started)
        reason = self.runtime.exit_reason(self, code)
        if reason:
            state["terminated"]["reason"] = reason
        return state

    def _container_status(self, state, ready):
        container = self.pod["spec"]["containers"][0]
        cs = {"name": container["name"], "image": container.get("image", ""), "imageID": "",
              "ready": ready, "started": "running" in state, "restartCount": self.restarts, "state": state}
        if self.proc is not None:
            cs["containerID"] = "emulator://%d" % self.proc.pid
        if self.last_state:
            cs["lastState"] = self.last_state
        return cs

    def _write_status(self, fn):
        """Applies fn to the Pod's status; kept for later while its node is cut off."""
        if not self.kubelet.connected(self.pod["spec"]["nodeName"]):
            self.pending.append(fn)
            return
        for f in self.pending + [fn]:
            self.api.mutate(self.api.pod_res, self.namespace, self.name, lambda p: f(p.setdefault("status", {})),
                            sub="status")
        self.pending = []

    def flush(self, pod):
        """The node reaches the API server (again): what happened meanwhile is
        reported, and a Ready condition others changed is set right."""
        if self.abandoned:
            return
        if self.pending:
            self._write_status(lambda status: None)
        if self.running() and not self.stopping and self.started and condition_true(pod, "Ready") != self.ready:
            self._write_status(self._running_status(self.started))

    # -- what the container sees (shared by the runtimes) ---------------------------

    def source(self, rkey, name, optional):
        obj = self.kubelet.store.get(rkey, self.namespace, name)
        if obj is None and not optional:
            raise MissingSource('%s "%s" not found' % (rkey[:-1], name))
        return obj or {}

    def volume_files(self, volume):
        """{relative path: (bytes, mode or None)} of a secret, configMap or
        downwardAPI volume (items, defaultMode, mode as the kubelet writes them);
        None for other volumes."""
        if "secret" in volume:
            src = volume["secret"]
            data = self.source("secrets", src.get("secretName"), src.get("optional"))
            data = {k: base64.b64decode(v) for k, v in (data.get("data") or {}).items()}
        elif "configMap" in volume:
            src = volume["configMap"]
            data = self.source("configmaps", src.get("name"), src.get("optional"))
            data = {k: v.encode() for k, v in (data.get("data") or {}).items()}
        elif "downwardAPI" in volume:
            src = volume["downwardAPI"]
            data = {i["path"]: self.field(i["fieldRef"]["fieldPath"]).encode() for i in src.get("items") or []
                    if "fieldRef" in i}
        else:
            return None
        items = src.get("items") or [{"key": k, "path": k} for k in data]
        return {i["path"]: (data.get(i.get("key", i["path"]), b""), i.get("mode", src.get("defaultMode")))
                for i in items}

    def container_env(self, env, rewrite=lambda v: v):
        """env (the runtime's base) with the container's envFrom and env added."""
        container = self.pod["spec"]["containers"][0]
        for source in container.get("envFrom", []):
            env.update(self._env_from(source))
        for var in container.get("env", []):
            value = self._env_value(var, env)
            if value is not None:
                env[var["name"]] = rewrite(value)
        return env

    def container_argv(self, env, entrypoint=(), cmd=(), rewrite=lambda v: v):
        """command + args with $(VAR) expanded; the image's entrypoint and cmd fill in
        what the container leaves out; an image without either idles (sleep infinity)."""
        container = self.pod["spec"]["containers"][0]
        expand = lambda s: rewrite(re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), s))
        command = container.get("command") or list(entrypoint)
        args = container.get("args") if "args" in container or container.get("command") else list(cmd)
        return [expand(a) for a in command + (args or [])] or ["sleep", "infinity"]

    def _env_from(self, source):
        if "secretRef" in source:
            obj = self.source("secrets", source["secretRef"]["name"], source["secretRef"].get("optional"))
            data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        else:
            ref = source.get("configMapRef", {})
            data = dict(self.source("configmaps", ref.get("name"), ref.get("optional")).get("data") or {})
        return {source.get("prefix", "") + k: v for k, v in data.items()}

    def _env_value(self, var, env):
        if "value" in var:
            return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), var["value"])
        ref = var.get("valueFrom", {})
        if "fieldRef" in ref:
            return self.field(ref["fieldRef"]["fieldPath"])
        if "secretKeyRef" in ref:
            r = ref["secretKeyRef"]
            data = self.source("secrets", r["name"], r.get("optional")).get("data") or {}
            return base64.b64decode(data[r["key"]]).decode() if r["key"] in data else None
        if "configMapKeyRef" in ref:
            r = ref["configMapKeyRef"]
            return (self.source("configmaps", r["name"], r.get("optional")).get("data") or {}).get(r["key"])
        return None

    def field(self, path):
        meta = self.pod["metadata"]
        m = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
        if m:
            return (meta.get(m.group(1)) or {}).get(m.group(2), "")
        return {"metadata.name": self.name, "metadata.namespace": self.namespace, "metadata.uid": self.uid,
                "spec.nodeName": self.pod["spec"].get("nodeName", ""), "status.podIP": self.ip,
                "status.hostIP": self.runtime.host_ip(self.pod["spec"].get("nodeName", "")),
                "spec.serviceAccountName": self.pod["spec"].get("serviceAccountName", "")}.get(path, "")


class LocalRuntime:
    """Today's Pods: local processes of this machine, sharing its files, network and
    user. Each gets a 127.0.X.Y address; its volumes are materialised under
    PLIANT_POD_ROOT=<dir>, and command, args and env values that start with a
    mountPath are rewritten to <dir><mountPath>... so unmodified commands find them."""

    def __init__(self):
        self.kubelet = None        # set by Kubelet
        self.service_account = {}  # file name -> bytes of the mounted service-account directory
        self.url = None

    def start(self, url, token, ca_pem):
        self.url = url
        self.service_account = {"token": (token or "").encode()}
        if ca_pem:
            with open(ca_pem, "rb") as f:
                self.service_account["ca.crt"] = f.read()

    def shutdown(self):
        pass

    def add_node(self, index, name):
        return "127.0.0.1", None

    def remove_node(self, index, name):
        pass

    def host_ip(self, node):
        return "127.0.0.1"

    def prepare(self, runner):
        runner.root = os.path.join(runner.dir, "root")
        os.makedirs(runner.root, exist_ok=True)
        runner.ip = runner.ip or self._allocate_ip()
        runner.mounts = self._mount_volumes(runner)
        runner.argv, runner.env, runner.cwd = self._command(runner)

    def setup(self, runner):
        return True

    def command(self, runner):
        return runner.argv, runner.env, runner.cwd, _die_with_supervisor

    def exit_reason(self, runner, code):
        return None

    def release(self, runner):
        shutil.rmtree(runner.dir, ignore_errors=True)

    def _allocate_ip(self):
        """A free 127.0.X.Y (Y > 1): Linux routes all of 127/8 to the loopback device."""
        used = {r.ip for r in self.kubelet.runners.values()}
        for n in range(1, 254 * 255):
            ip = "127.0.%d.%d" % divmod(n, 254)
            if ip not in used and not ip.endswith(".0") and not ip.endswith(".1"):
                return ip
        raise RuntimeError("out of pod IPs")

    def _mount_volumes(self, runner):
        """Materialises the first container's volumeMounts; returns their mountPaths."""
        volumes = {v["name"]: v for v in runner.pod["spec"].get("volumes", [])}
        container = runner.pod["spec"]["containers"][0]
        paths = []
        for mount in container.get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})
            target = runner.root + "/" + mount["mountPath"].strip("/")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.islink(target):
                os.unlink(target)
            if "hostPath" in volume:
                if volume["hostPath"].get("type") == "DirectoryOrCreate":
                    os.makedirs(volume["hostPath"]["path"], exist_ok=True)
                os.symlink(volume["hostPath"]["path"], target)
            elif "persistentVolumeClaim" in volume:
                claim = os.path.join(self.kubelet.work, "pvc", runner.namespace,
                                     volume["persistentVolumeClaim"]["claimName"])
                os.makedirs(claim, exist_ok=True)
                os.symlink(claim, target)
            else:
                os.makedirs(target, exist_ok=True)
                write_files(runner.volume_files(volume) or {}, target)
            paths.append(mount["mountPath"].rstrip("/") or "/")
        if runner.pod["spec"].get("automountServiceAccountToken", True):
            target = runner.root + SERVICE_ACCOUNT_DIR
            files = dict(self.service_account, namespace=runner.namespace.encode())
            write_files({name: (data, None) for name, data in files.items()}, target)
            paths.append(SERVICE_ACCOUNT_DIR)
        return paths

    def _command(self, runner):
        rewrite = lambda value: _rewrite(runner, value)
        env = dict(os.environ)
        host, port = re.match(r"^\w+://([^:]+):(\d+)$", self.url).groups()
        env.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port, HOSTNAME=runner.name,
                   PLIANT_POD_ROOT=runner.root)
        env = runner.container_env(env, rewrite)
        # As for an image without ENTRYPOINT whose CMD idles: args alone are the command.
        argv = runner.container_argv(env, rewrite=rewrite)
        container = runner.pod["spec"]["containers"][0]
        cwd = rewrite(container["workingDir"]) if container.get("workingDir") else None
        return argv, env, cwd if cwd and os.path.isdir(cwd) else None


def _rewrite(runner, value):
    """A path under a volumeMount, seen from this machine."""
    for path in runner.mounts:
        if value == path or value.startswith(path + "/"):
            return runner.root + value
    return value


def write_files(files, target, uid=-1, gid=-1):
    """Writes {relative path: (bytes, mode or None)} under target (mode default 0644),
    owned by uid:gid where given."""
    for rel, (data, mode) in files.items():
        path = os.path.join(target, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o644 if mode is None else mode)
        if uid >= 0 or gid >= 0:
            os.chown(path, uid, gid)


class Waiting(Exception):
    """The container cannot be created yet: the reason of its waiting state
    (ContainerCreating, CreateContainerConfigError) and the message."""
    reason = "ContainerCreating"

    def __init__(self, message, reason=None):
        super().__init__(message)
        self.reason = reason or self.reason


class MissingSource(Waiting):
    """A Secret, ConfigMap or claim a Pod needs does not exist (yet)."""


def _condition(kind, status, reason, message):
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now(), "lastTransitionTime": now()}


def _terminated(code, started):
    state = {"exitCode": code if code >= 0 else 128 - code, "reason": "Completed" if code == 0 else "Error",
             "startedAt": started, "finishedAt": now()}
    if code < 0:
        state["signal"] = -code
    return {"terminated": state}


def _gpus(pod):
    return sum(int((c.get("resources") or {}).get("requests", {}).get(GPU, 0)) for c in pod["spec"]["containers"])


def _spread_score(pod, node, nodes, pods):
    """For the Pod's topologySpreadConstraints: the Pods their selectors match in
    node's domains (fewer is better; maxSkew and whenUnsatisfiable are not enforced)."""
    score = 0
    for tsc in pod["spec"].get("topologySpreadConstraints") or []:
        domain = node["metadata"].get("labels", {}).get(tsc.get("topologyKey"))
        for p in pods:
            where = nodes.get(p["spec"].get("nodeName"))
            if where and where["metadata"].get("labels", {}).get(tsc.get("topologyKey")) == domain and \
                    selects(tsc.get("labelSelector") or {}, p["metadata"].get("labels") or {}):
                score += 1
    return score


def _count_on(node, pods):
    return sum(1 for p in pods if p["spec"].get("nodeName") == node["metadata"]["name"])


def toleration_matches(t, taint):
    if t.get("effect") and t["effect"] != taint.get("effect"):
        return False
    return t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint["key"]) or \
        t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", "")


def _tolerates(pod, taint):
    return any(toleration_matches(t, taint) for t in pod["spec"].get("tolerations") or [])
