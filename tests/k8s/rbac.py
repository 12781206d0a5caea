"""RBAC authorization (rbac.authorization.k8s.io/v1) as kube-apiserver does it.

A request's attributes come from its URL as k8s.io/apiserver's RequestInfoFactory
reads them (request_info): verb (get, list, watch, create, update, patch,
delete, deletecollection; a GET without a name is list or watch, and a
fieldSelector metadata.name=X names X), API group, resource, subresource
(pods/status, pods/log, pods/eviction, trainingjobs/status, ...), namespace and
name; other paths are non-resource requests (verb: the method in lower case).

Authorizer.check allows a request when a rule of a Role or ClusterRole bound to
the user (a RoleBinding in the request's namespace, or a ClusterRoleBinding)
matches it: verbs, apiGroups, resources ("*", "pods/status", "*/status"),
resourceNames (only for requests that name an object) and, for ClusterRoles
bound cluster-wide, nonResourceURLs ("/apis/*"). Subjects: User, Group,
ServiceAccount. A denied request is a 403 worded as kube-apiserver words it, with
"RBAC: ... not found" appended for bindings whose role is missing.

bootstrap_policy(): cluster-admin (bound to system:masters), system:discovery
and system:public-info-viewer (discovery for every authenticated user), and
system:node bound to system:nodes (the kubelets; kube-apiserver has a Node
authorizer instead). Role escalation checks (escalate/bind) are not made.
"""

import collections
import urllib.parse

from errors import ApiError

GROUP = "rbac.authorization.k8s.io"
Info = collections.namedtuple("Info", "verb path resource_request api_group api_version resource subresource "
                                      "namespace name")
_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def request_info(method, path, query):
    """The request's attributes (RequestInfoFactory.NewRequestInfo)."""
    parts = [p for p in path.strip("/").split("/") if p]
    nonresource = Info(method.lower(), path, False, "", "", "", "", "", "")
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return nonresource
    rest = parts[1:]
    group = ""
    if parts[0] == "apis":
        if len(rest) < 3:
            return nonresource
        group, rest = rest[0], rest[1:]
    version, rest = rest[0], rest[1:]
    verb = _VERBS.get(method, method.lower())
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in ("status", "finalize"):
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch") in ("1", "true") else "list"
        for term in urllib.parse.unquote(query.get("fieldSelector", "")).split(","):
            key, _, value = term.partition("=")
            if key.strip() == "metadata.name" and value and not value.startswith("="):
                name = value.strip()
    if not name and verb == "delete":
        verb = "deletecollection"
    return Info(verb, path, True, group, version, resource, sub, namespace, name)


def _has(values, wanted):
    return "*" in values or wanted in values


def rule_allows(rule, info):
    if not _has(rule.get("verbs") or [], info.verb):
        return False
    if not info.resource_request:
        for url in rule.get("nonResourceURLs") or []:
            if url in ("*", info.path) or url.endswith("*") and info.path.startswith(url.rstrip("*")):
                return True
        return False
    if not _has(rule.get("apiGroups") or [], info.api_group):
        return False
    combined = info.resource + ("/" + info.subresource if info.subresource else "")
    resources = rule.get("resources") or []
    if not any(r in ("*", combined) or info.subresource and r == "*/" + info.subresource for r in resources):
        return False
    names = rule.get("resourceNames") or []
    return not names or info.name in names


def _applies(subjects, user, binding_namespace):
    for s in subjects or []:
        kind = s.get("kind")
        if kind == "User" and s.get("name") == user.name or kind == "Group" and s.get("name") in user.groups:
            return True
        if kind == "ServiceAccount":
            ns = s.get("namespace") or binding_namespace
            if user.name == "system:serviceaccount:%s:%s" % (ns, s.get("name")):
                return True
    return False


class Authorizer:
    def __init__(self, store):
        self.store = store

    def _rules(self, binding, errors):
        ref = binding.get("roleRef") or {}
        ns = binding["metadata"].get("namespace", "")
        if ref.get("kind") == "ClusterRole":
            role, what = self.store.get(GROUP + "/clusterroles", "", ref.get("name")), "clusterrole"
        else:
            role, what = self.store.get(GROUP + "/roles", ns, ref.get("name")), "role"
        if role is None:
            errors.append('%s.%s "%s" not found' % (what, GROUP, ref.get("name")))
            return []
        return role.get("rules") or []

    def check(self, user, info):
        """None when RBAC allows the request, else the reason text ('' or 'RBAC: ...')."""
        errors = []
        with self.store.cond:
            for crb in self.store.items(GROUP + "/clusterrolebindings"):
                if _applies(crb.get("subjects"), user, "") and \
                        any(rule_allows(r, info) for r in self._rules(crb, errors)):
                    return None
            if info.namespace and info.resource_request:       # Roles grant no non-resource URLs
                for rb in self.store.items(GROUP + "/rolebindings", info.namespace):
                    if _applies(rb.get("subjects"), user, info.namespace) and \
                            any(rule_allows(r, info) for r in self._rules(rb, errors)):
                        return None
        return "RBAC: " + ", ".join(errors) if errors else ""

    def authorize(self, user, info):
        """Raises the 403 kube-apiserver answers when RBAC does not allow the request."""
        reason = self.check(user, info)
        if reason is not None:
            raise forbidden(user, info, reason)


def forbidden(user, info, reason=""):
    """responsewriters.Forbidden: the message and the Status details."""
    if not info.resource_request:
        text = 'User "%s" cannot %s path "%s"' % (user.name, info.verb, info.path)
    else:
        resource = info.resource + ("/" + info.subresource if info.subresource else "")
        text = 'User "%s" cannot %s resource "%s" in API group "%s"' % (user.name, info.verb, resource,
                                                                         info.api_group)
        text += ' in the namespace "%s"' % info.namespace if info.namespace else " at the cluster scope"
    if reason:
        text += ": " + reason
    if not info.resource:
        return ApiError(403, "Forbidden", "forbidden: " + text)
    qualified = info.resource + ("." + info.api_group if info.api_group else "")
    what = '%s "%s"' % (qualified, info.name) if info.name else qualified
    details = {"name": info.name, "group": info.api_group, "kind": info.resource}
    return ApiError(403, "Forbidden", "%s is forbidden: %s" % (what, text),
                    {k: v for k, v in details.items() if v})


# -- the bootstrap policy ------------------------------------------------------------------

_DISCOVERY = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz",
              "/version", "/version/"]
_PUBLIC = ["/healthz", "/livez", "/readyz", "/version", "/version/"]


def _cluster_role(name, rules):
    return {"apiVersion": GROUP + "/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                         "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
            "rules": rules}


def _cluster_binding(name, groups):
    return {"apiVersion": GROUP + "/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                         "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": g} for g in groups]}


def bootstrap_policy():
    """[(plural, object)] of the ClusterRoles and ClusterRoleBindings made at start-up."""
    roles = [
        ("cluster-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                           {"nonResourceURLs": ["*"], "verbs": ["*"]}], ["system:masters"]),
        ("system:discovery", [{"nonResourceURLs": _DISCOVERY, "verbs": ["get"]}], ["system:authenticated"]),
        ("system:public-info-viewer", [{"nonResourceURLs": _PUBLIC, "verbs": ["get"]}],
         ["system:authenticated", "system:unauthenticated"]),
        ("system:node", [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "verbs": ["get", "create", "update", "patch"]},
            {"apiGroups": [""], "resources": ["nodes", "nodes/status", "pods", "pods/status", "events"],
             "verbs": ["get", "list", "watch", "create", "update", "patch"]}], ["system:nodes"]),
    ]
    out = []
    for name, rules, groups in roles:
        out += [("clusterroles", _cluster_role(name, rules)), ("clusterrolebindings", _cluster_binding(name, groups))]
    return out
