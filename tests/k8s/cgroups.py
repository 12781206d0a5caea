"""Pod memory limits with Linux control groups, v1 (the memory controller's own
hierarchy, /sys/fs/cgroup/memory) or v2 (the unified hierarchy with the memory
controller), as the kubelet's cgroup manager sets them.

The cluster's cgroups live below the cgroup this process is in (so whatever
contains it still contains its Pods): BASE/pliant-NAME/pod-UID, one per Pod,
with its memory limit (v1 memory.limit_in_bytes, v2 memory.max with
memory.swap.max 0). Over the limit the kernel's OOM killer kills a process of
the Pod; oom_kills() reads the cgroup's count of those (v1 memory.oom_control,
v2 memory.events), which is how the kubelet tells OOMKilled from other deaths.

missing() says why this machine cannot do it (no memory controller, not
writable), or None. sweep(NAME) kills what is left in a cluster's cgroups and
removes them (cluster.py down).
"""

import os
import signal
import time

MOUNTS = "/proc/self/mounts"


def _mounts():
    with open(MOUNTS) as f:
        return [line.split()[:4] for line in f]


def _own_path(version):
    """This process's cgroup path in the v1 memory hierarchy or in v2's."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if version == 1 and "memory" in controllers.split(",") or version == 2 and controllers == "":
                return path
    return "/"


def detect():
    """(version, mount point of the hierarchy with the memory controller) or (None, reason)."""
    for _, target, fstype, options in _mounts():
        if fstype == "cgroup" and "memory" in options.split(","):
            return 1, target
    for _, target, fstype, _ in _mounts():
        if fstype == "cgroup2":
            try:
                with open(os.path.join(target, "cgroup.controllers")) as f:
                    if "memory" in f.read().split():
                        return 2, target
            except OSError:
                pass
    return None, "no cgroup memory controller is mounted (neither cgroup v1 'memory' nor cgroup2 with 'memory')"


def _write(path, value):
    with open(path, "w") as f:
        f.write(value)


def _read(path):
    with open(path) as f:
        return f.read()


class Cgroups:
    def __init__(self, name):
        self.version, self.mount = detect()
        self.name = name
        self.root = None            # BASE/pliant-NAME once set up

    def missing(self):
        """Why Pod cgroups cannot be made here, or None (tries making one)."""
        if self.version is None:
            return self.mount
        try:
            self.setup()
            self.pod("probe", 64 << 20)
            _kill_and_remove(self.root, 5.0)
            self.root = None
            return None
        except OSError as e:
            return "cgroup v%d at %s: %s" % (self.version, self.mount, e)

    def setup(self):
        """Makes BASE/pliant-NAME. On v2 the memory controller must be enabled below
        BASE, which a cgroup holding processes refuses (no internal processes):
        then the hierarchy's root is BASE."""
        if self.root:
            return
        bases = [os.path.join(self.mount, _own_path(self.version).lstrip("/"))]
        if self.version == 2:
            bases.append(self.mount)
        errors = []
        for base in dict.fromkeys(bases):
            root = os.path.join(base, "pliant-" + self.name)
            try:
                os.makedirs(root, exist_ok=True)
                if self.version == 2:
                    for parent in (base, root):
                        if "memory" not in _read(os.path.join(parent, "cgroup.subtree_control")).split():
                            _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
                self.root = root
                return
            except OSError as e:
                errors.append("%s: %s" % (root, e.strerror or e))
                try:
                    os.rmdir(root)
                except OSError:
                    pass
        raise OSError("; ".join(errors))

    def path(self, uid):
        return os.path.join(self.root, "pod-" + uid)

    def pod(self, uid, limit_bytes):
        """Makes the Pod's cgroup with its memory limit (None: unlimited); returns the
        cgroup.procs file a process joins by writing its pid."""
        path = self.path(uid)
        os.makedirs(path, exist_ok=True)
        if limit_bytes:
            if self.version == 1:
                _write(os.path.join(path, "memory.limit_in_bytes"), str(limit_bytes))
            else:
                _write(os.path.join(path, "memory.max"), str(limit_bytes))
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    _write(os.path.join(path, "memory.swap.max"), "0")
        return os.path.join(path, "cgroup.procs")

    def oom_kills(self, uid):
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            for line in _read(os.path.join(self.path(uid), name)).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def usage(self, uid):
        """(bytes in use, the most ever in use) by the Pod's cgroup (v1
        memory.usage_in_bytes and memory.max_usage_in_bytes, v2 memory.current and
        memory.peak); (None, None) when it cannot be read."""
        names = ("memory.usage_in_bytes", "memory.max_usage_in_bytes") if self.version == 1 else \
            ("memory.current", "memory.peak")
        try:
            return tuple(int(_read(os.path.join(self.path(uid), n))) for n in names)
        except (OSError, ValueError):
            return None, None

    def remove(self, uid, timeout=10.0):
        _kill_and_remove(self.path(uid), timeout)


def _procs(path):
    try:
        return [int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()]
    except OSError:
        return []


def _kill_and_remove(path, timeout):
    """SIGKILLs every process in the cgroup tree at path, then removes it (deepest first)."""
    if not os.path.isdir(path):
        return
    deadline = time.monotonic() + timeout
    for dirpath, dirnames, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
        while True:
            pids = _procs(dirpath)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def _roots(name):
    """Every directory pliant-NAME in the hierarchy (wherever its creator sat)."""
    version, mount = detect()
    found = []
    if version is None:
        return found
    for dirpath, dirnames, _ in os.walk(mount):
        for d in list(dirnames):
            if d == "pliant-" + name:
                found.append(os.path.join(dirpath, d))
                dirnames.remove(d)
    return found


def locate(name):
    """The Cgroups of a running cluster NAME (made by another process), or None."""
    roots = _roots(name)
    if not roots:
        return None
    cg = Cgroups(name)
    cg.root = roots[0]
    return cg


def sweep(name):
    """Kills and removes every cgroup of cluster NAME (wherever its creator sat); returns their paths."""
    found = _roots(name)
    for path in found:
        _kill_and_remove(path, 10.0)
    return found
