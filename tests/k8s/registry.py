"""The resources the emulator serves: built-in ones and those CRDs register,
their discovery documents and their Table (kubectl get) columns."""

import base64
import json
import hashlib
import threading
import time

from selection import jsonpath

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


class Resource:
    """One served resource of one group/version. `rkey` names its storage, shared by
    every version of it (and by core/v1 and events.k8s.io/v1 Events)."""

    def __init__(self, group, version, plural, kind, namespaced=True, short_names=(), status=False,
                 columns=None, fields=(), subresources=(), rkey=None, crd=None, schema=None,
                 categories=()):
        self.group, self.version, self.plural, self.kind = group, version, plural, kind
        self.namespaced = namespaced
        self.short_names = list(short_names)
        self.categories = list(categories)
        self.status = status                  # has a status subresource
        self.columns = columns or AGE_COLUMNS
        self.fields = None if fields is None else {"metadata.name", "metadata.namespace"} | set(fields)
        self.subresources = list(subresources) + (["status"] if status else [])
        self.rkey = rkey or (group + "/" + plural if group else plural)
        self.crd = crd                        # the CRD's name for custom resources
        self.schema = schema                  # openAPIV3Schema of custom resources

    @property
    def api_version(self):
        return self.group + "/" + self.version if self.group else self.version

    @property
    def singular(self):
        return self.kind.lower()

    def discovery(self):
        """APIResource entries: the resource and its subresources."""
        out = [{"name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
                "kind": self.kind, "verbs": VERBS,
                "storageVersionHash": base64.b64encode(hashlib.sha256(self.rkey.encode()).digest()[:8]).decode()}]
        if self.short_names:
            out[0]["shortNames"] = self.short_names
        if self.categories:
            out[0]["categories"] = self.categories
        for sub in self.subresources:
            verbs = {"log": ["get"], "binding": ["create"], "eviction": ["create"], "token": ["create"]}.get(
                sub, ["get", "patch", "update"])
            kind = {"binding": "Binding", "eviction": "Eviction", "token": "TokenRequest"}.get(sub, self.kind)
            entry = {"name": self.plural + "/" + sub, "singularName": "", "namespaced": self.namespaced,
                     "kind": kind, "verbs": verbs}
            if sub == "eviction":       # kubectl drain evicts only where discovery says policy/v1
                entry.update(group="policy", version="v1")
            if sub == "token":          # kubectl create token
                entry.update(group="authentication.k8s.io", version="v1")
            out.append(entry)
        return out


class Registry:
    """Resources by group/version and plural, thread-safe (CRDs change it at run time)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_gv = {}     # "group/version" ("v1" for core) -> {plural: Resource}

    def add(self, res):
        with self.lock:
            self.by_gv.setdefault(res.api_version, {})[res.plural] = res

    def remove_crd(self, crd_name):
        with self.lock:
            for gv in list(self.by_gv):
                table = self.by_gv[gv]
                for plural in [p for p, r in table.items() if r.crd == crd_name]:
                    del table[plural]
                if not table:
                    del self.by_gv[gv]

    def lookup(self, api_version, plural):
        with self.lock:
            return self.by_gv.get(api_version, {}).get(plural)

    def groups(self):
        """{group: [versions]} of the named groups, in registration order."""
        with self.lock:
            out = {}
            for gv in self.by_gv:
                if "/" in gv:
                    group, version = gv.split("/")
                    out.setdefault(group, []).append(version)
            return out

    def resource_list(self, api_version):
        with self.lock:
            table = self.by_gv.get(api_version)
            if table is None:
                return None
            resources = [e for r in table.values() for e in r.discovery()]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version,
                "resources": resources}


def group_document(group, versions):
    gvs = [{"groupVersion": group + "/" + v, "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": gvs,
            "preferredVersion": gvs[0]}


# -- Tables -------------------------------------------------------------------------------

def human_duration(seconds):
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    s = int(seconds)
    if s < 0:
        return "0s"
    if s < 120:
        return "%ds" % s
    m = s // 60
    if m < 10:
        return "%dm%ds" % (m, s % 60) if s % 60 else "%dm" % m
    if m < 180:
        return "%dm" % m
    h = m // 60
    if h < 8:
        return "%dh%dm" % (h, m % 60) if m % 60 else "%dh" % h
    if h < 48:
        return "%dh" % h
    if h < 24 * 8:
        return "%dd%dh" % (h // 24, h % 24) if h % 24 else "%dd" % (h // 24)
    return "%dd" % (h // 24)


def age(timestamp):
    if not timestamp:
        return "<unknown>"
    then = time.mktime(time.strptime(timestamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    return human_duration(time.time() - then)


def _col(name, fn, kind="string", priority=0, fmt=""):
    return {"name": name, "type": kind, "format": fmt, "priority": priority, "fn": fn}


NAME = _col("Name", lambda o: o["metadata"]["name"], fmt="name")
AGE = _col("Age", lambda o: age(o["metadata"].get("creationTimestamp")), kind="date")
AGE_COLUMNS = [NAME, AGE]


def printer_columns(apcs):
    """Columns of a CRD version's additionalPrinterColumns (after Name)."""
    if not apcs:
        return AGE_COLUMNS
    return [NAME] + [_col(c["name"], _apc_cell(c), c.get("type", "string"), c.get("priority", 0),
                          c.get("format", "")) for c in apcs]


def _apc_cell(column):
    def cell(obj):
        found = jsonpath(obj, column["jsonPath"])
        if not found or found[0] is None:
            return None
        value = found[0]
        if column.get("type") == "date":
            return age(value) if isinstance(value, str) else "<invalid>"
        if column.get("type") == "string" and not isinstance(value, str):
            return _go_string(value)
        return value
    return cell


def _go_string(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(res, objects, list_meta, include="Metadata"):
    """A meta.k8s.io/v1 Table of objects, as `kubectl get` asks for it."""
    cols = res.columns
    rows = []
    for obj in objects:
        row = {"cells": [c["fn"](obj) for c in cols]}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}
        rows.append(row)
    defs = [{"name": c["name"], "type": c["type"], "format": c["format"], "description": c["name"],
             "priority": c["priority"]} for c in cols]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
            "columnDefinitions": defs, "rows": rows}
