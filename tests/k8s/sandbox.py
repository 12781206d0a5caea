"""A Pod's container runtime: what runc (and tini) do, in one small program.

    nsenter --net=/run/netns/POD -- unshare --mount --uts --ipc --pid --fork --kill-child -- \\
        python3 -I sandbox.py SPEC.json

runs it as process 1 of a new PID namespace, in the Pod's network namespace, in
a mount namespace of its own. From SPEC (written by runtime.py, the kubelet's
side) it builds the container's file system and starts the container process:

- the root: a tmpfs at spec.root (writable, then read-only with
  readOnlyRootFilesystem), holding spec.dirs, spec.files (/etc/hosts,
  /etc/resolv.conf, /etc/passwd, ...) and spec.symlinks (bin -> usr/bin);
- spec.mounts in order: bind mounts of host paths (read-only ones remounted
  read-only), read-only overlays of host directories (the first layer wins),
  tmpfs mounts, /proc (this PID namespace's), /sys (read-only, this network
  namespace's), a minimal /dev (null, zero, full, random, urandom, tty, shm) and
  nothing else of the host;
- pivot_root into it, the old root detached;
- the hostname (spec.hostname) in its UTS namespace;
- the process: its own session, oom_score_adj, supplementary groups, gid and
  uid (runAsUser/runAsGroup/fsGroup), the capability bounding set and sets cut to
  spec.capabilities, no_new_privs when allowPrivilegeEscalation is false, the
  working directory, argv and environment (PATH lookup in that environment).

It stays as process 1 (with oom_score_adj -998, as the pause container has):
it forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the
container process, reaps orphans, and exits with the container's status (128 +
the signal's number when a signal ended it: 137 for SIGKILL, e.g. the OOM
killer). When process 1 ends, the kernel kills what is left in the namespace.
A container that cannot start (no such executable) exits 128 with the reason on
stderr, which is the container's log.

Standard library only; everything it needs is imported before pivot_root.
"""

import ctypes
import json
import os
import signal
import socket
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_CAP_V3 = 0x20080522
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

libc = ctypes.CDLL(None, use_errno=True)


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           "mount %s on %s" % (source or fstype, target))


def bind(source, target, read_only, recursive=False):
    mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))
    if read_only:
        mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _mountpoint(path, is_file):
    if is_file:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            open(path, "w").close()
    else:
        os.makedirs(path, exist_ok=True)


def build_root(spec):
    root = spec["root"]
    inside = lambda p: os.path.join(root, p.lstrip("/"))
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=%s" % spec.get("rootSize", "256m"))
    for d in spec.get("dirs", []):
        os.makedirs(inside(d["path"]), exist_ok=True)
        os.chmod(inside(d["path"]), d.get("mode", 0o755))
        if d.get("owner"):
            os.chown(inside(d["path"]), *d["owner"])
    for link, target in spec.get("symlinks", []):
        os.symlink(target, inside(link))
    for f in spec.get("files", []):
        path = inside(f["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as out:
            out.write(f["content"])
        os.chmod(path, f.get("mode", 0o644))
    for m in spec.get("mounts", []):
        target = inside(m["target"])
        kind = m.get("type", "bind")
        if kind == "bind":
            _mountpoint(target, os.path.isfile(m["source"]))
            bind(m["source"], target, m.get("readOnly", False), m.get("recursive", False))
        elif kind == "tmpfs":
            _mountpoint(target, False)
            mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, m.get("options", "mode=1777"))
        elif kind == "proc":
            _mountpoint(target, False)
            mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        elif kind == "sysfs":
            _mountpoint(target, False)
            mount("sysfs", target, "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
        elif kind == "dev":
            _make_dev(target)
        elif kind == "overlay":
            _mountpoint(target, False)
            try:
                mount("overlay", target, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV,
                      "lowerdir=" + ":".join(m["lower"]))
            except OSError:             # no overlayfs here: the first layer alone
                bind(m["lower"][0], target, True)
    _pivot(root)
    if spec.get("readOnlyRootFilesystem"):
        mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _make_dev(target):
    _mountpoint(target, False)
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            _mountpoint(os.path.join(target, name), True)
            bind("/dev/" + name, os.path.join(target, name), False)
    os.makedirs(os.path.join(target, "shm"))
    mount("tmpfs", os.path.join(target, "shm"), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=64m")
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                       ("stderr", "/proc/self/fd/2")):
        os.symlink(link, os.path.join(target, name))


def _pivot(root):
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        os.chroot(".")          # an architecture without the table's number: chroot
    else:
        _check(libc.syscall(number, b".", b"."), "pivot_root")
        _check(libc.umount2(b".", MNT_DETACH), "umount the old root")
    os.chdir("/")


def _drop_bounding(keep):
    """Cuts the capability bounding set to the numbers in keep."""
    last = 40
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except OSError:
        pass
    for cap in range(last + 1):
        if cap not in keep:
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


def _set_capabilities(keep):
    """The effective and permitted sets of a root container: keep's numbers."""
    words = [0, 0]
    for cap in keep:
        words[cap // 32] |= 1 << (cap % 32)
    data = (CapData * 2)(*[CapData(w, w, 0) for w in words])
    _check(libc.capset(ctypes.byref(CapHeader(_CAP_V3, 0)), data), "capset")


def _oom_score_adj(value):
    """Lowering it needs CAP_SYS_RESOURCE, which some machines' root lacks: then the
    container's (higher) score still makes the OOM killer choose it first."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(value))
    except PermissionError:
        pass


def exec_container(spec):
    """In the forked child: become the container process (never returns)."""
    try:
        os.setsid()
        _oom_score_adj(spec.get("oomScoreAdj", 0))
        keep = set(spec.get("capabilities", []))
        _drop_bounding(keep)
        user = spec.get("user", {})
        os.setgroups(user.get("groups", []))
        os.setgid(user.get("gid", 0))
        os.setuid(user.get("uid", 0))
        if user.get("uid", 0) == 0:
            _set_capabilities(keep)
        if spec.get("noNewPrivs"):
            _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        os.chdir(spec.get("cwd") or "/")
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as e:
        os.write(2, ("sandbox: cannot start %s: %s\n" % (spec["argv"][0], e.strerror or e)).encode())
    os._exit(128)


def supervise(child):
    """Process 1: forward signals to the child, reap everything, exit as it did."""
    def forward(sig, frame):
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass
    for sig in FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(128)
        if pid == child:
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    _oom_score_adj(-998)
    try:
        build_root(spec)
        socket.sethostname(spec.get("hostname", "pod"))
    except OSError as e:
        sys.stderr.write("sandbox: %s\n" % e)
        os._exit(128)
    child = os.fork()
    if child == 0:
        exec_container(spec)
    supervise(child)


if __name__ == "__main__":
    main()
