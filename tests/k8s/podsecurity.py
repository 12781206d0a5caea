"""Pod Security admission (k8s.io/pod-security-admission) for Pods, as kube-apiserver
applies it from namespace labels:

  pod-security.kubernetes.io/enforce: privileged | baseline | restricted
      a Pod that violates the level is refused: 403 `pods "x" is forbidden:
      violates PodSecurity "restricted:latest": REASON (DETAIL), ...`
  pod-security.kubernetes.io/warn: LEVEL
      the same text as a Warning: `would violate PodSecurity "restricted:latest": ...`
  pod-security.kubernetes.io/enforce-version, warn-version (default latest).

The checks are the policy package's, in its order and wording: baseline (host
namespaces, privileged, non-default capabilities, hostPath volumes, hostPorts,
procMount, seccompProfile Unconfined) and restricted (those, with restricted
volume types replacing hostPath volumes, allowPrivilegeEscalation != false,
unrestricted capabilities replacing non-default capabilities, runAsNonRoot !=
true, runAsUser=0, seccompProfile RuntimeDefault/Localhost). AppArmor, SELinux,
sysctls and Windows options are not checked.
"""

from errors import ApiError

LEVELS = ("privileged", "baseline", "restricted")
LABEL = "pod-security.kubernetes.io/"
_BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                  "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}
_VOLUME_TYPES = _RESTRICTED_VOLUMES | {"hostPath", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "nfs",
                                       "iscsi", "glusterfs", "rbd", "flexVolume", "cinder", "cephfs", "flocker", "fc",
                                       "azureFile", "vsphereVolume", "quobyte", "azureDisk", "portworxVolume",
                                       "photonPersistentDisk", "scaleIO", "storageos"}


def _quote(names):
    return ", ".join('"%s"' % n for n in names)


def _plural(one, many, n):
    return one if n == 1 else many


def _containers(pod):
    spec = pod.get("spec", {})
    return [c for key in ("initContainers", "containers", "ephemeralContainers") for c in spec.get(key) or []]


def _sc(c):
    return c.get("securityContext") or {}


def _who(names):
    return "%s %s" % (_plural("container", "containers", len(names)), _quote(names))


# -- the checks: each returns (reason, detail) or None --------------------------------------

def _allow_privilege_escalation(pod):
    bad = [c["name"] for c in _containers(pod) if _sc(c).get("allowPrivilegeEscalation") is not False]
    if bad:
        return "allowPrivilegeEscalation != false", \
            "%s must set securityContext.allowPrivilegeEscalation=false" % _who(bad)


def _capabilities_baseline(pod):
    bad, caps = [], set()
    for c in _containers(pod):
        added = [a for a in (_sc(c).get("capabilities") or {}).get("add") or [] if a not in _BASELINE_CAPS]
        if added:
            bad.append(c["name"])
            caps.update(added)
    if bad:
        return "non-default capabilities", "%s must not include %s in securityContext.capabilities.add" % (
            _who(bad), _quote(sorted(caps)))


def _capabilities_restricted(pod):
    missing, adding, caps = [], [], set()
    for c in _containers(pod):
        cap = _sc(c).get("capabilities")
        if cap is None:
            missing.append(c["name"])
            continue
        if "ALL" not in (cap.get("drop") or []):
            missing.append(c["name"])
        added = [a for a in cap.get("add") or [] if a != "NET_BIND_SERVICE"]
        if added:
            adding.append(c["name"])
            caps.update(added)
    details = []
    if missing:
        details.append('%s must set securityContext.capabilities.drop=["ALL"]' % _who(missing))
    if adding:
        details.append("%s must not include %s in securityContext.capabilities.add" % (_who(adding),
                                                                                       _quote(sorted(caps))))
    if details:
        return "unrestricted capabilities", "; ".join(details)


def _host_namespaces(pod):
    spec = pod.get("spec", {})
    used = ["%s=true" % k for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if used:
        return "host namespaces", ", ".join(used)


def _host_path_volumes(pod):
    bad = [v["name"] for v in pod.get("spec", {}).get("volumes") or [] if "hostPath" in v]
    if bad:
        return "hostPath volumes", "%s %s" % (_plural("volume", "volumes", len(bad)), _quote(bad))


def _host_ports(pod):
    bad, ports = [], []
    for c in _containers(pod):
        used = [str(p["hostPort"]) for p in c.get("ports") or [] if p.get("hostPort")]
        if used:
            bad.append(c["name"])
            ports += used
    if bad:
        return "hostPort", "%s %s %s %s" % (_who(bad), _plural("uses", "use", len(bad)),
                                            _plural("hostPort", "hostPorts", len(ports)), ", ".join(ports))


def _privileged(pod):
    bad = [c["name"] for c in _containers(pod) if _sc(c).get("privileged")]
    if bad:
        return "privileged", "%s must not set securityContext.privileged=true" % _who(bad)


def _proc_mount(pod):
    bad = [c for c in _containers(pod) if _sc(c).get("procMount", "Default") != "Default"]
    if bad:
        return "procMount", "%s must not set securityContext.procMount to %s" % (
            _who([c["name"] for c in bad]), _quote(sorted({_sc(c)["procMount"] for c in bad})))


def _restricted_volumes(pod):
    bad, kinds = [], set()
    for v in pod.get("spec", {}).get("volumes") or []:
        kind = next((k for k in v if k != "name" and k in _VOLUME_TYPES), None)
        if kind and kind not in _RESTRICTED_VOLUMES:
            bad.append(v["name"])
            kinds.add(kind)
    if bad:
        return "restricted volume types", "%s %s %s %s %s" % (
            _plural("volume", "volumes", len(bad)), _quote(bad), _plural("uses", "use", len(bad)),
            _plural("restricted volume type", "restricted volume types", len(kinds)), _quote(sorted(kinds)))


def _explicit_and_implicit(pod, field, bad_value, pod_ok, show=str):
    """For runAsNonRoot and seccompProfile: (explicit bad setters, their values as
    show() prints them, containers that set nothing and are not covered by the pod)."""
    setters, values = [], set()
    pod_value = (pod.get("spec", {}).get("securityContext") or {}).get(field)
    if pod_value is not None and bad_value(pod_value):
        setters.append("pod")
        values.add(show(pod_value))
    explicit, implicit = [], []
    for c in _containers(pod):
        value = _sc(c).get(field)
        if value is not None:
            if bad_value(value):
                explicit.append(c["name"])
                values.add(show(value))
        elif not pod_ok(pod_value):
            implicit.append(c["name"])
    if explicit:
        setters.append(_who(explicit))
    return setters, values, implicit


def _run_as_non_root(pod):
    setters, _, implicit = _explicit_and_implicit(pod, "runAsNonRoot", lambda v: v is False, lambda v: v is True)
    if setters:
        return "runAsNonRoot != true", "%s must not set securityContext.runAsNonRoot=false" % " and ".join(setters)
    if implicit:
        return "runAsNonRoot != true", "pod or %s must set securityContext.runAsNonRoot=true" % _who(implicit)


def _run_as_user(pod):
    setters = ["pod"] if (pod.get("spec", {}).get("securityContext") or {}).get("runAsUser") == 0 else []
    bad = [c["name"] for c in _containers(pod) if _sc(c).get("runAsUser") == 0]
    if bad:
        setters.append(_who(bad))
    if setters:
        return "runAsUser=0", "%s must not set runAsUser=0" % " and ".join(setters)


def _seccomp_type(profile):
    return (profile or {}).get("type", "")


def _seccomp_baseline(pod):
    setters, values, _ = _explicit_and_implicit(
        pod, "seccompProfile", lambda v: _seccomp_type(v) == "Unconfined", lambda v: True)
    if setters:
        return "seccompProfile", "%s must not set securityContext.seccompProfile.type to %s" % (
            " and ".join(setters), _quote(["Unconfined"]))


def _seccomp_restricted(pod):
    valid = ("RuntimeDefault", "Localhost")
    setters, values, implicit = _explicit_and_implicit(
        pod, "seccompProfile", lambda v: _seccomp_type(v) not in valid,
        lambda v: v is not None and _seccomp_type(v) in valid, _seccomp_type)
    if setters:
        return "seccompProfile", "%s must not set securityContext.seccompProfile.type to %s" % (
            " and ".join(setters), _quote(sorted(values)))
    if implicit:
        return "seccompProfile", 'pod or %s must set securityContext.seccompProfile.type to "RuntimeDefault" ' \
                                 'or "Localhost"' % _who(implicit)


# (check, levels it belongs to), in the policy package's order; at restricted, restricted volume
# types, unrestricted capabilities and seccompProfile (restricted) replace their baseline checks
CHECKS = [
    (_allow_privilege_escalation, ("restricted",)),
    (_capabilities_baseline, ("baseline",)),
    (_capabilities_restricted, ("restricted",)),
    (_host_namespaces, ("baseline", "restricted")),
    (_host_path_volumes, ("baseline",)),
    (_host_ports, ("baseline", "restricted")),
    (_privileged, ("baseline", "restricted")),
    (_proc_mount, ("baseline", "restricted")),
    (_restricted_volumes, ("restricted",)),
    (_run_as_non_root, ("restricted",)),
    (_run_as_user, ("restricted",)),
    (_seccomp_baseline, ("baseline",)),
    (_seccomp_restricted, ("restricted",)),
]


def violations(pod, level):
    """'REASON (DETAIL), ...' of the checks pod fails at level, or ''."""
    found = [check(pod) for check, levels in CHECKS if level in levels]
    return ", ".join("%s (%s)" % r if r[1] else r[0] for r in found if r)


def _policy(labels, mode):
    level = labels.get(LABEL + mode)
    if level not in LEVELS or level == "privileged":
        return None
    return "%s:%s" % (level, labels.get(LABEL + mode + "-version", "latest"))


def admit(namespace_obj, pod):
    """Checks a new Pod against its namespace's labels: raises the 403 for enforce,
    returns the warnings for warn."""
    labels = (namespace_obj or {}).get("metadata", {}).get("labels") or {}
    warnings = []
    for mode in ("enforce", "warn"):
        policy = _policy(labels, mode)
        text = policy and violations(pod, policy.split(":")[0])
        if not text:
            continue
        if mode == "warn":
            warnings.append('would violate PodSecurity "%s": %s' % (policy, text))
            continue
        name = pod["metadata"].get("name", "")
        raise ApiError(403, "Forbidden", '%s is forbidden: violates PodSecurity "%s": %s'
                       % ('pods "%s"' % name if name else "pods", policy, text), {"name": name, "kind": "pods"})
    return warnings
