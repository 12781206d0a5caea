"""The namespaced cluster's container runtime, the kubelet's side of it (what the
CRI and containerd do): it turns a Pod into a sandbox.py spec and starts it in
the Pod's own network namespace (netns.py) and memory cgroup (cgroups.py).

What a container sees:
- program files, read-only: this machine's /usr (and /bin, /lib* as they are
  here), the pieces of /etc programs need (ld.so.cache, nsswitch.conf, ssl, ...)
  and the build's bin/ at /usr/local/bin, where Dockerfile.operator and
  Dockerfile.worker put pliant-operator and pliant (over this machine's
  /usr/local/bin, whose programs, python3 on some machines, stay visible);
- a writable tmpfs root (read-only with readOnlyRootFilesystem) with /tmp, its
  own /proc, /sys and /dev, and /etc/hosts, /etc/resolv.conf (the cluster DNS,
  search NS.svc.cluster.local svc.cluster.local cluster.local, ndots 5),
  /etc/hostname, /etc/passwd and /etc/group;
- its declared volumes at their mountPaths (subPath and readOnly honoured):
  emptyDir (a directory of the Pod, mode 0777; medium Memory: a tmpfs),
  persistentVolumeClaim (WORK/pvc/NS/CLAIM, one directory shared by every node:
  ReadWriteMany, mode 0777, made when the claim is (ClaimProvisioner); the claim
  must exist), secret, configMap and downwardAPI (files
  with items, defaultMode and mode; read-only; group fsGroup and group-readable
  when the Pod has an fsGroup), projected (their sources), hostPath;
- the ServiceAccount's token (issued for this Pod by auth.py), ca.crt and
  namespace at /var/run/secrets/kubernetes.io/serviceaccount unless
  automountServiceAccountToken is false (the Pod's or its ServiceAccount's).

The process: uid and gid from runAsUser/runAsGroup (the container's, else the
Pod's, else the image's USER, else 0), supplementalGroups and fsGroup;
runAsNonRoot with uid 0 fails as CreateContainerConfigError; capabilities:
containerd's default set for root, with capabilities.add/drop (ALL) and
privileged; allowPrivilegeEscalation false sets no_new_privs; seccomp profiles
are not applied. Environment: PATH, HOSTNAME, HOME, the image's, the API
server's KUBERNETES_SERVICE_HOST/PORT (and KUBERNETES_PORT*), then envFrom and
env. Command: command/args, else the image's entrypoint/cmd (IMAGES: the two
Pliant images as their Dockerfiles build them; any other image has no
entrypoint and idles). The memory limit (resources.limits.memory) is the Pod
cgroup's; a container killed there is OOMKilled (exit code 137).
"""

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading

import netns
from controller import Controller
from kubelet import SERVICE_ACCOUNT_DIR, MissingSource, Waiting, _die_with_supervisor, write_files

HERE = os.path.dirname(os.path.abspath(__file__))
SANDBOX = os.path.join(HERE, "sandbox.py")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ETC = ["ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "host.conf", "gai.conf", "localtime", "ssl",
       "ca-certificates", "alternatives", "protocols", "services", "mime.types", "python3*"]
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"
CAPS = ["CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
        "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
        "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
        "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
        "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
        "CHECKPOINT_RESTORE"]
DEFAULT_CAPS = ["CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
                "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"]
# (image name pattern, its config): what Dockerfile.operator and Dockerfile.worker build
IMAGES = [
    (re.compile(r"(^|/)pliant-operator([:@]|$)"), {
        "entrypoint": ["/usr/local/bin/pliant-operator"],
        "cmd": ["--leader-elect", "--metrics-addr=:8080", "--health-addr=:8081"],
        "user": (65532, 65532), "workingDir": "/tmp", "env": {"HOME": "/tmp"}}),
    (re.compile(r"(^|/)pliant-worker([:@]|$)"), {
        "entrypoint": ["/usr/local/bin/pliant", "worker"], "user": (65532, 65532), "workingDir": "/home/nonroot",
        "home": (65532, 65532), "env": {"HOME": "/home/nonroot", "NVIDIA_VISIBLE_DEVICES": "all",
                                        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}}),
]
_UNITS = {"": 1, "k": 1000, "M": 1000 ** 2, "G": 1000 ** 3, "T": 1000 ** 4, "Ki": 1024, "Mi": 1024 ** 2,
          "Gi": 1024 ** 3, "Ti": 1024 ** 4, "m": 0.001}


def quantity(text):
    """A resource quantity ("512Mi", "1G", "1e9", "100m") as a number."""
    m = re.match(r"^([0-9.]+(?:[eE][-+]?[0-9]+)?)([A-Za-z]*)$", str(text).strip())
    if not m or m.group(2) not in _UNITS:
        raise ValueError("bad quantity %r" % text)
    return float(m.group(1)) * _UNITS[m.group(2)]


def image_config(image):
    for pattern, config in IMAGES:
        if pattern.search(image or ""):
            return config
    return {}


def claim_path(work, namespace, name):
    return os.path.join(work, "pvc", namespace, name)


def provision(path):
    """A claim's volume: a directory every node shares, writable by any user (mode 0777)."""
    if not os.path.isdir(path):
        os.makedirs(path)
        os.chmod(path, 0o777)


class ClaimProvisioner(Controller):
    """The dynamic provisioner: each claim's directory exists once the claim does
    (so its data can be put there before a Pod mounts it)."""

    def __init__(self, api, work):
        super().__init__(api, "provisioner")
        self.work = work
        self.done = set()

    def sync(self):
        for claim in self.store.items("persistentvolumeclaims"):
            key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
            if key not in self.done:
                provision(claim_path(self.work, *key))
                self.done.add(key)


class SandboxRuntime:
    def __init__(self, kubelet_work, network, cgroups, authenticator, agents, build_bin, dns_ip):
        self.work = kubelet_work
        self.network, self.cgroups, self.auth, self.agents = network, cgroups, authenticator, agents
        self.build_bin = build_bin
        self.dns_ip = dns_ip
        self.kubelet = None        # set by Kubelet
        self.url = None
        self.ca = b""
        self.janitors = []

    def start(self, url, token, ca_pem):
        self.url = url
        if ca_pem:
            with open(ca_pem, "rb") as f:
                self.ca = f.read()

    def shutdown(self):
        for t in list(self.janitors):
            t.join(15)

    # -- nodes ---------------------------------------------------------------------

    def add_node(self, index, name):
        self.agents.add(name, self.network.add_node(index))
        return self.network.node_ip(index), self.network.pod_cidr(index)

    def remove_node(self, index, name):
        self.agents.remove(name)
        self.network.remove_node(index)

    def host_ip(self, node):
        index = self.kubelet.node_index.get(node)
        return self.network.node_ip(index) if index is not None else ""

    def socket(self, runner):
        """A TCP socket in the Pod's node (for probes)."""
        with netns.in_namespace(self.network.node_ns(runner.node_index)):
            return socket.socket()

    # -- a Pod's life --------------------------------------------------------------

    def prepare(self, runner):
        """Under the store's lock: the address and the sandbox spec (files written here)."""
        pod, container = runner.pod, runner.pod["spec"]["containers"][0]
        runner.node_index = self.kubelet.node_index[pod["spec"]["nodeName"]]
        host_network = pod["spec"].get("hostNetwork")
        runner.ip = runner.ip or (self.network.node_ip(runner.node_index) if host_network else self._allocate_ip(
            runner.node_index))
        image = image_config(container.get("image"))
        user = self._user(runner, image)
        mounts = self._system_mounts() + self._volume_mounts(runner, user)
        env = {"PATH": PATH, "HOSTNAME": runner.name}
        env.update(image.get("env", {}))
        env.setdefault("HOME", "/root" if user["uid"] == 0 else "/")
        host, port = re.match(r"^\w+://([^:]+):(\d+)$", self.url).groups()
        env.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port, KUBERNETES_SERVICE_PORT_HTTPS=port,
                   KUBERNETES_PORT="tcp://%s:%s" % (host, port))
        env.update({"KUBERNETES_PORT_%s_TCP%s" % (port, k): v for k, v in
                    (("", "tcp://%s:%s" % (host, port)), ("_PROTO", "tcp"), ("_PORT", port), ("_ADDR", host))})
        env = runner.container_env(env)
        sc = container.get("securityContext") or {}
        dirs = [{"path": p} for p in ("/etc", "/usr", "/root", "/home", "/var", "/run")] + [
            {"path": "/tmp", "mode": 0o1777}, {"path": "/var/tmp", "mode": 0o1777}]
        if image.get("home"):
            dirs.append({"path": image["workingDir"], "owner": list(image["home"])})
        runner.sandbox = {
            "root": os.path.join(runner.dir, "root"), "hostname": runner.name,
            "readOnlyRootFilesystem": bool(sc.get("readOnlyRootFilesystem")),
            "dirs": dirs, "symlinks": self._symlinks(), "files": self._etc_files(runner), "mounts": mounts,
            "user": user, "capabilities": self._capabilities(sc), "noNewPrivs": sc.get("allowPrivilegeEscalation")
            is False, "oomScoreAdj": self._oom_score_adj(pod), "env": env,
            "argv": runner.container_argv(env, image.get("entrypoint", ()), image.get("cmd", ())),
            "cwd": container.get("workingDir") or image.get("workingDir") or "/"}
        limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        runner.memory_limit = int(quantity(limit)) if limit else None
        runner.netns = self.network.node_ns(runner.node_index) if host_network else None

    def setup(self, runner):
        """Outside the lock: the Pod's cgroup and network namespace (once per Pod)."""
        if getattr(runner, "procs_file", None):
            return True
        try:
            os.makedirs(runner.sandbox["root"], exist_ok=True)
            runner.procs_file = self.cgroups.pod(runner.uid, runner.memory_limit)
            if runner.netns is None:
                runner.netns = self.network.add_pod(runner.node_index, runner.uid, runner.ip)
            runner.spec_path = os.path.join(runner.dir, "sandbox.json")
            with open(runner.spec_path, "w") as f:
                json.dump(runner.sandbox, f)
            return True
        except (OSError, netns.NetError) as e:
            with open(runner.log_path, "ab") as log:
                log.write(("kubelet: cannot create the Pod's sandbox: %s\n" % e).encode())
            return False

    def command(self, runner):
        runner.oom_kills = self.cgroups.oom_kills(runner.uid)
        procs = runner.procs_file

        def preexec():
            _die_with_supervisor()
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        argv = ["nsenter", "--net=" + os.path.join(netns.NETNS_DIR, runner.netns), "--", "unshare", "--mount",
                "--uts", "--ipc", "--pid", "--fork", "--kill-child", "--", sys.executable, "-I", SANDBOX,
                runner.spec_path]
        return argv, {"PATH": os.environ.get("PATH", PATH)}, None, preexec

    def exit_reason(self, runner, code):
        if code in (137, -9) and self.cgroups.oom_kills(runner.uid) > getattr(runner, "oom_kills", 0):
            return "OOMKilled"
        return None

    def release(self, runner):
        """The Pod is gone: its processes, cgroup, network namespace and files (in the background)."""
        def clean():
            if getattr(runner, "proc", None) is not None:
                try:
                    runner.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            try:
                self.cgroups.remove(runner.uid)
            except OSError as e:
                sys.stderr.write("kubelet: removing the cgroup of %s: %s\n" % (runner.name, e))
            if runner.netns == self.network.pod_ns(runner.uid):
                self.network.remove_pod(runner.uid)
            shutil.rmtree(runner.dir, ignore_errors=True)
            self.janitors.remove(t)
        t = threading.Thread(target=clean, name="release-" + runner.name, daemon=True)
        self.janitors.append(t)
        t.start()

    # -- the pieces of the spec --------------------------------------------------------

    def _allocate_ip(self, k):
        used = {r.ip for r in self.kubelet.runners.values() if getattr(r, "node_index", None) == k}
        for n in range(2, 255):
            if self.network.pod_ip(k, n) not in used:
                return self.network.pod_ip(k, n)
        raise Waiting("node %d has no free Pod address" % k)

    def _user(self, runner, image):
        spec = runner.pod["spec"]
        pod_sc = spec.get("securityContext") or {}
        sc = spec["containers"][0].get("securityContext") or {}
        image_user = image.get("user", (None, None))
        uid = next((v for v in (sc.get("runAsUser"), pod_sc.get("runAsUser"), image_user[0]) if v is not None), 0)
        gid = next((v for v in (sc.get("runAsGroup"), pod_sc.get("runAsGroup"), image_user[1]) if v is not None), 0)
        if uid == 0 and (sc.get("runAsNonRoot") if "runAsNonRoot" in sc else pod_sc.get("runAsNonRoot")):
            raise Waiting('container has runAsNonRoot and image will run as root (pod: "%s_%s(%s)", container: %s)'
                          % (runner.name, runner.namespace, runner.uid, spec["containers"][0]["name"]),
                          "CreateContainerConfigError")
        groups = [gid] + list(pod_sc.get("supplementalGroups") or [])
        if pod_sc.get("fsGroup") is not None:
            groups.append(pod_sc["fsGroup"])
        return {"uid": uid, "gid": gid, "groups": sorted(set(groups)), "fsGroup": pod_sc.get("fsGroup")}

    def _capabilities(self, sc):
        if sc.get("privileged"):
            return list(range(len(CAPS)))
        caps = sc.get("capabilities") or {}
        names = lambda key: {c.upper().replace("CAP_", "") for c in caps.get(key) or []}
        keep = set() if "ALL" in names("drop") else set(DEFAULT_CAPS) - names("drop")
        keep |= {c for c in CAPS if "ALL" in names("add")} | names("add")
        return sorted(CAPS.index(c) for c in keep if c in CAPS)

    def _oom_score_adj(self, pod):
        """The kubelet's: BestEffort 1000, Guaranteed -997, Burstable by its memory request."""
        qos = pod.get("status", {}).get("qosClass", "BestEffort")
        if qos != "Burstable":
            return 1000 if qos == "BestEffort" else -997
        request = ((pod["spec"]["containers"][0].get("resources") or {}).get("requests") or {}).get("memory")
        share = quantity(request) / quantity("64Gi") if request else 0
        return int(min(999, max(2, 1000 - 1000 * share)))

    def _symlinks(self):
        """/bin, /lib, ... as they are on this machine, when they are links into /usr."""
        return [[d, os.readlink("/" + d)] for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
                if os.path.islink("/" + d)]

    def _system_mounts(self):
        mounts = [{"source": "/usr", "target": "/usr", "readOnly": True}]
        mounts += [{"source": "/" + d, "target": "/" + d, "readOnly": True}
                   for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
                   if os.path.isdir("/" + d) and not os.path.islink("/" + d)]
        for pattern in ETC:
            mounts += [{"source": p, "target": p, "readOnly": True} for p in sorted(glob.glob("/etc/" + pattern))]
        if os.path.isdir("/usr/local/bin") and os.path.isdir(self.build_bin):
            mounts.append({"type": "overlay", "target": "/usr/local/bin", "lower": [self.build_bin, "/usr/local/bin"]})
        return mounts + [{"type": "proc", "target": "/proc"}, {"type": "sysfs", "target": "/sys"},
                         {"type": "dev", "target": "/dev"}]

    def _etc_files(self, runner):
        ns = runner.namespace
        hosts = ("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost "
                 "ip6-loopback\n%s\t%s\n" % (runner.ip, runner.name))
        resolv = "search %s.svc.cluster.local svc.cluster.local cluster.local\nnameserver %s\noptions ndots:5\n" % (
            ns, self.dns_ip)
        return [{"path": "/etc/hosts", "content": hosts}, {"path": "/etc/resolv.conf", "content": resolv},
                {"path": "/etc/hostname", "content": runner.name + "\n"}, {"path": "/etc/passwd", "content": PASSWD},
                {"path": "/etc/group", "content": GROUP}]

    def _volume_mounts(self, runner, user):
        spec = runner.pod["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts, targets = [], set()
        for mount in spec["containers"][0].get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise Waiting('volume "%s" not found in the Pod\'s volumes' % mount["name"],
                              "CreateContainerConfigError")
            source, read_only, tmpfs = self._volume_source(runner, volume, user)
            target = mount["mountPath"]
            targets.add(target.rstrip("/"))
            if tmpfs is not None:
                mounts.append({"type": "tmpfs", "target": target, "options": tmpfs})
                continue
            if mount.get("subPath"):
                source = os.path.join(source, mount["subPath"])
                if not os.path.exists(source):
                    os.makedirs(source, 0o777)
            mounts.append({"source": source, "target": target, "readOnly": read_only or bool(mount.get("readOnly"))})
        if self._automount(runner) and SERVICE_ACCOUNT_DIR not in targets:
            path = os.path.join(runner.dir, "serviceaccount")
            write_files(self._service_account_files(runner), path, -1, user["fsGroup"] if user["fsGroup"] is not None
                        else -1)
            mounts.append({"source": path, "target": SERVICE_ACCOUNT_DIR, "readOnly": True})
        return mounts

    def _volume_source(self, runner, volume, user):
        """(host path, read-only, tmpfs options or None) of a volume."""
        path = os.path.join(runner.dir, "volumes", volume["name"])
        if "emptyDir" in volume:
            empty = volume["emptyDir"] or {}
            if empty.get("medium") == "Memory":
                size = empty.get("sizeLimit")
                return None, False, "mode=1777" + (",size=%d" % quantity(size) if size else "")
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o777)
            return path, False, None
        if "persistentVolumeClaim" in volume:
            name = volume["persistentVolumeClaim"]["claimName"]
            if runner.source("persistentvolumeclaims", name, False).get("status", {}).get("phase") != "Bound":
                raise MissingSource('persistentvolumeclaim "%s" is not bound' % name)
            path = claim_path(self.work, runner.namespace, name)
            provision(path)
            return path, bool(volume["persistentVolumeClaim"].get("readOnly")), None
        if "hostPath" in volume:
            if volume["hostPath"].get("type") == "DirectoryOrCreate":
                os.makedirs(volume["hostPath"]["path"], exist_ok=True)
            return volume["hostPath"]["path"], False, None
        if "projected" in volume:
            files = {}
            for src in volume["projected"].get("sources") or []:
                if "serviceAccountToken" in src:
                    token = self._service_account_files(runner)["token"]
                    files[src["serviceAccountToken"].get("path", "token")] = token
                else:
                    kind = next(iter(src))
                    sub = dict(src[kind], defaultMode=volume["projected"].get("defaultMode"))
                    if kind == "secret":
                        sub["secretName"] = sub.pop("name", None)
                    files.update(runner.volume_files({kind: sub}) or {})
        else:
            files = runner.volume_files(volume)
            if files is None:
                raise Waiting("volume %s: this cluster has no such volume type" % volume["name"],
                              "CreateContainerConfigError")
        fs_group = user["fsGroup"]
        if fs_group is not None:
            files = {k: (data, (0o644 if mode is None else mode) | 0o440) for k, (data, mode) in files.items()}
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        write_files(files, path, -1, fs_group if fs_group is not None else -1)
        return path, True, None

    def _automount(self, runner):
        spec = runner.pod["spec"]
        if "automountServiceAccountToken" in spec:
            return spec["automountServiceAccountToken"]
        sa = self.kubelet.store.get("serviceaccounts", runner.namespace, spec.get("serviceAccountName", "default"))
        return (sa or {}).get("automountServiceAccountToken", True) is not False

    def _service_account_files(self, runner):
        name = runner.pod["spec"].get("serviceAccountName", "default")
        sa = runner.source("serviceaccounts", name, False)
        token, _ = self.auth.service_account_token(sa, runner.pod)
        return {"token": (token.encode(), None), "ca.crt": (self.ca, None), "namespace": (runner.namespace.encode(),
                                                                                          None)}
