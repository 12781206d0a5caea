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

Kubelet: runs the first container's command + args (with $(VAR) expansion) as
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
Initialized, ContainersReady, Ready; ready as soon as the process runs, probes
are not run), containerStatuses with state, restartCount and exit code.

Events (core/v1) as a real cluster records them: Scheduled and FailedScheduling
from default-scheduler, Started and Killing from the kubelet.

The service-account directory (token: the emulator's --token, ca.crt with --tls,
namespace) is mounted unless automountServiceAccountToken is false, so an
in-cluster client in a Pod reaches the emulator (over https: use --tls).

Deleting a running Pod: SIGTERM to its process group, SIGKILL after the grace
period, then the final status and the removal. Deleting a Node (or marking it
not ready): its processes are killed at once, their Pods become Failed with a
DisruptionTarget condition (DeletionByPodGC / DeletionByTaintManager) and are
removed, as the pod garbage collector and taint manager do.
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

from api import now, set_condition
from errors import ApiError

GPU = "nvidia.com/gpu"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_prctl = ctypes.CDLL(None, use_errno=True).prctl    # resolved here, not in a forked child
_PR_SET_PDEATHSIG = 1


def _die_with_supervisor():
    """In the child: SIGKILL when the thread that started it ends, so no Pod process
    outlives a killed emulator (its supervising thread waits on it until it exits)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Kubelet:
    def __init__(self, api, work, zones, gpus):
        self.api, self.store = api, api.store
        self.work = work
        self.zones = zones
        self.gpus = gpus
        self.node_res = api.registry.lookup("v1", "nodes")
        self.runners = {}          # pod uid -> Runner
        self.unschedulable = {}    # pod uid -> message last written
        self.url = None
        self.service_account = {}  # file name -> bytes of the mounted service-account directory
        self.next_node = 0

    def start(self, url, nodes, token=None, ca_pem=None):
        """Adds the nodes and starts the loop; url, token and CA are what Pods get to
        reach the API (KUBERNETES_SERVICE_HOST/PORT and the service-account files)."""
        self.url = url
        self.service_account = {"token": (token or "").encode()}
        if ca_pem:
            with open(ca_pem, "rb") as f:
                self.service_account["ca.crt"] = f.read()
        for _ in range(nodes):
            self.add_node({})
        threading.Thread(target=self._loop, name="kubelet", daemon=True).start()

    def shutdown(self):
        with self.store.cond:
            for runner in self.runners.values():
                runner.kill()

    # -- nodes ---------------------------------------------------------------------

    def add_node(self, spec):
        """Creates a Ready node (the cluster autoscaler's part)."""
        with self.store.cond:
            index = self.next_node
            self.next_node += 1
            name = spec.get("name") or "node-%d" % index
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
                               "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                             {"type": "Hostname", "address": name}],
                               "nodeInfo": {"kubeletVersion": "v1.32.0-emulator", "operatingSystem": "linux",
                                            "architecture": "amd64"}}}
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
            elif not _ready(nodes[node]):
                self._lose(pod, "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")
            else:
                self._run(pod)
        live = {p["metadata"]["uid"] for p in self.store.items("pods")}
        for uid in [u for u in self.runners if u not in live]:
            self.runners.pop(uid).kill()          # removed without a grace period (or finished)
        for uid in [u for u in self.unschedulable if u not in live]:
            del self.unschedulable[uid]

    def _run(self, pod):
        uid = pod["metadata"]["uid"]
        runner = self.runners.get(uid)
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
        if not _ready(node) or node["spec"].get("unschedulable"):
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
        self.kubelet, self.api = kubelet, kubelet.api
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = os.path.join(kubelet.work, "pods", "%s_%s_%s" % (self.namespace, self.name, self.uid[:8]))
        self.root = os.path.join(self.dir, "root")
        self.log_path = os.path.join(self.dir, "log")
        self.pod = pod
        self.ip = None
        self.proc = None
        self.stopping = False      # the Pod is being deleted
        self.abandoned = False     # its node is gone: nothing more is written
        self.done = False          # the supervising thread has ended
        self.restarts = 0
        self.last_state = None

    # Called with the store lock held.
    def prepare(self):
        """Volumes, environment and command; False (and a waiting status) when a
        Secret or ConfigMap it needs does not exist yet."""
        try:
            os.makedirs(self.root, exist_ok=True)
            self.ip = self.ip or self._allocate_ip()
            self.mounts = self._mount_volumes()
            self.argv, self.env, self.cwd = self._command()
        except MissingSource as e:
            self._write_status(lambda s: s.update(containerStatuses=[self._container_status(
                {"waiting": {"reason": "ContainerCreating", "message": str(e)}}, False)]))
            return False
        open(self.log_path, "ab").close()
        return True

    def _allocate_ip(self):
        """A free 127.0.X.Y (Y > 1): Linux routes all of 127/8 to the loopback device."""
        used = {r.ip for r in self.kubelet.runners.values()}
        for n in range(1, 254 * 255):
            ip = "127.0.%d.%d" % divmod(n, 254)
            if ip not in used and not ip.endswith(".0") and not ip.endswith(".1"):
                return ip
        raise RuntimeError("out of pod IPs")

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

    def kill(self):
        """The Pod is gone: stop at once, write nothing more, drop its files."""
        self.abandoned = True
        self._signal(signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _signal(self, sig):
        if self.running():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    # -- the supervising thread ----------------------------------------------------

    def _supervise(self):
        try:
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
                code = self.proc.wait()
            with self.kubelet.store.cond:
                if self.abandoned:
                    return
                policy = self.pod["spec"].get("restartPolicy", "Always")
                restart = policy == "Always" or policy == "OnFailure" and code != 0
                if self.stopping or not restart:
                    return self._finish(code, started)
                self.restarts += 1
                self.last_state = _terminated(code, started)
                self._write_status(lambda s: s.update(containerStatuses=[self._container_status(
                    {"waiting": {"reason": "CrashLoopBackOff" if code else "Completed"}}, False)]))
            time.sleep(1.0)      # the kubelet's restart back-off (shortened)

    def _spawn(self):
        """Starts the process; None, or an exit code when it could not start."""
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                             preexec_fn=_die_with_supervisor)
            return None
        except OSError as e:
            with open(self.log_path, "ab") as log:
                log.write(("fake kubelet: cannot start %s: %s\n" % (self.argv[0], e)).encode())
            return 128

    def _finish(self, code, started):
        """The container ended: terminal status, and the removal of a deleted Pod."""
        def final(status):
            phase = "Succeeded" if code == 0 else "Failed"
            state = _terminated(code if code is not None else 137, started)
            status.update(phase=phase, containerStatuses=[self._container_status(state, False)])
            for kind in ("ContainersReady", "Ready"):
                set_condition({"status": status}, kind, "False", "PodCompleted" if code == 0 else
                              "ContainersNotReady", "")
        self._write_status(final)
        if self.stopping:
            self.api.finish_pod_deletion(self.namespace, self.name)

    def _running_status(self, started):
        def update(status):
            status.update(phase="Running", podIP=self.ip, podIPs=[{"ip": self.ip}], hostIP="127.0.0.1",
                          startTime=status.get("startTime") or started,
                          containerStatuses=[self._container_status({"running": {"startedAt": started}}, True)])
            for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"):
                set_condition({"status": status}, kind, "True", "", "")
        return update

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
        self.api.mutate(self.api.pod_res, self.namespace, self.name, lambda p: fn(p.setdefault("status", {})),
                        sub="status")

    # -- what the container sees ---------------------------------------------------

    def _mount_volumes(self):
        """Materialises the first container's volumeMounts; returns their mountPaths."""
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes", [])}
        container = self.pod["spec"]["containers"][0]
        paths = []
        for mount in container.get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})
            target = self.root + "/" + mount["mountPath"].strip("/")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.islink(target):
                os.unlink(target)
            if "hostPath" in volume:
                if volume["hostPath"].get("type") == "DirectoryOrCreate":
                    os.makedirs(volume["hostPath"]["path"], exist_ok=True)
                os.symlink(volume["hostPath"]["path"], target)
            elif "persistentVolumeClaim" in volume:
                claim = os.path.join(self.kubelet.work, "pvc", self.namespace,
                                     volume["persistentVolumeClaim"]["claimName"])
                os.makedirs(claim, exist_ok=True)
                os.symlink(claim, target)
            else:
                os.makedirs(target, exist_ok=True)
                self._write_files(volume, target)
            paths.append(mount["mountPath"].rstrip("/") or "/")
        if self.pod["spec"].get("automountServiceAccountToken", True):
            target = self.root + SERVICE_ACCOUNT_DIR
            os.makedirs(target, exist_ok=True)
            files = dict(self.kubelet.service_account, namespace=self.namespace.encode())
            for name, data in files.items():
                with open(os.path.join(target, name), "wb") as f:
                    f.write(data)
            paths.append(SERVICE_ACCOUNT_DIR)
        return paths

    def _write_files(self, volume, target):
        if "secret" in volume:
            src = volume["secret"]
            data = self._source("secrets", src.get("secretName"), src.get("optional"))
            data = {k: base64.b64decode(v) for k, v in (data.get("data") or {}).items()}
        elif "configMap" in volume:
            src = volume["configMap"]
            data = self._source("configmaps", src.get("name"), src.get("optional"))
            data = {k: v.encode() for k, v in (data.get("data") or {}).items()}
        else:
            return                                  # emptyDir and anything else: an empty directory
        items = src.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            path = os.path.join(target, item["path"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data.get(item["key"], b""))

    def _source(self, rkey, name, optional):
        obj = self.kubelet.store.get(rkey, self.namespace, name)
        if obj is None and not optional:
            raise MissingSource('%s "%s" not found' % (rkey[:-1], name))
        return obj or {}

    def _rewrite(self, value):
        """A path under a volumeMount, seen from this machine."""
        for path in self.mounts:
            if value == path or value.startswith(path + "/"):
                return self.root + value
        return value

    def _command(self):
        container = self.pod["spec"]["containers"][0]
        env = dict(os.environ)
        host, port = re.match(r"^\w+://([^:]+):(\d+)$", self.kubelet.url).groups()
        env.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port, HOSTNAME=self.name,
                   PLIANT_POD_ROOT=self.root)
        for source in container.get("envFrom", []):
            env.update(self._env_from(source))
        for var in container.get("env", []):
            value = self._env_value(var, env)
            if value is not None:
                env[var["name"]] = self._rewrite(value)
        expand = lambda s: self._rewrite(re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), s))
        # As for an image without ENTRYPOINT whose CMD idles: args alone are the command.
        argv = [expand(a) for a in container.get("command", []) + container.get("args", [])] or \
            ["sleep", "infinity"]
        cwd = self._rewrite(container["workingDir"]) if container.get("workingDir") else None
        return argv, env, cwd if cwd and os.path.isdir(cwd) else None

    def _env_from(self, source):
        if "secretRef" in source:
            obj = self._source("secrets", source["secretRef"]["name"], source["secretRef"].get("optional"))
            data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        else:
            ref = source.get("configMapRef", {})
            data = dict(self._source("configmaps", ref.get("name"), ref.get("optional")).get("data") or {})
        return {source.get("prefix", "") + k: v for k, v in data.items()}

    def _env_value(self, var, env):
        if "value" in var:
            return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), var["value"])
        ref = var.get("valueFrom", {})
        if "fieldRef" in ref:
            return self._field(ref["fieldRef"]["fieldPath"])
        if "secretKeyRef" in ref:
            r = ref["secretKeyRef"]
            data = self._source("secrets", r["name"], r.get("optional")).get("data") or {}
            return base64.b64decode(data[r["key"]]).decode() if r["key"] in data else None
        if "configMapKeyRef" in ref:
            r = ref["configMapKeyRef"]
            return (self._source("configmaps", r["name"], r.get("optional")).get("data") or {}).get(r["key"])
        return None

    def _field(self, path):
        meta = self.pod["metadata"]
        m = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
        if m:
            return (meta.get(m.group(1)) or {}).get(m.group(2), "")
        return {"metadata.name": self.name, "metadata.namespace": self.namespace, "metadata.uid": self.uid,
                "spec.nodeName": self.pod["spec"].get("nodeName", ""), "status.podIP": self.ip,
                "status.hostIP": "127.0.0.1", "spec.serviceAccountName":
                    self.pod["spec"].get("serviceAccountName", "")}.get(path, "")


class MissingSource(Exception):
    """A Secret or ConfigMap a Pod needs does not exist (yet)."""


def _condition(kind, status, reason, message):
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now(), "lastTransitionTime": now()}


def _terminated(code, started):
    state = {"exitCode": code if code >= 0 else 128 - code, "reason": "Completed" if code == 0 else "Error",
             "startedAt": started, "finishedAt": now()}
    if code < 0:
        state["signal"] = -code
    return {"terminated": state}


def _ready(node):
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))


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
                    _selects(tsc.get("labelSelector") or {}, p["metadata"].get("labels") or {}):
                score += 1
    return score


def _selects(selector, labels):
    """metav1.LabelSelector matching (matchLabels, matchExpressions)."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values or op == "NotIn" and labels.get(key) in values or \
                op == "Exists" and key not in labels or op == "DoesNotExist" and key in labels:
            return False
    return True


def _count_on(node, pods):
    return sum(1 for p in pods if p["spec"].get("nodeName") == node["metadata"]["name"])


def _tolerates(pod, taint):
    for t in pod["spec"].get("tolerations") or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint["key"]):
            return True
        if t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False
