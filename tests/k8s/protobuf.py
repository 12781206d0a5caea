"""Decoding the few protobuf request bodies kubectl's typed commands send: `kubectl
create namespace|configmap|secret|serviceaccount|token|role|clusterrole|rolebinding|
clusterrolebinding` and the Evictions and DeleteOptions of `kubectl drain`. A body
is "k8s\\0" + runtime.Unknown{typeMeta{apiVersion, kind}, raw}; raw is the object,
read here with the field numbers of k8s.io/api's generated.proto. Anything else
is 415 (answers are always JSON, which these clients accept)."""

import base64

from errors import ApiError

MAGIC = b"k8s\x00"
KINDS = ("Namespace", "ConfigMap", "Secret", "ServiceAccount", "Eviction", "DeleteOptions", "TokenRequest", "Role",
         "ClusterRole", "RoleBinding", "ClusterRoleBinding")


def _fields(data):
    """(field number, value) pairs of one message: ints for varints, bytes otherwise."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos:pos + size], pos + size
        else:
            raise ValueError("wire type %d" % wire)
        out.append((field, value))
    return out


def _varint(data, pos):
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _map(entries, decode_value):
    out = {}
    for entry in entries:
        kv = dict(_fields(entry))
        out[kv.get(1, b"").decode()] = decode_value(kv.get(2, b""))
    return out


def _meta(data):
    fields = _fields(data)
    meta = {}
    for number, key in ((1, "name"), (2, "generateName"), (3, "namespace")):
        values = [v for f, v in fields if f == number]
        if values and values[-1]:
            meta[key] = values[-1].decode()
    for number, key in ((11, "labels"), (12, "annotations")):
        entries = [v for f, v in fields if f == number]
        if entries:
            meta[key] = _map(entries, bytes.decode)
    finalizers = [v.decode() for f, v in fields if f == 14]
    if finalizers:
        meta["finalizers"] = finalizers
    return meta


def _delete_options(data):
    fields = dict(_fields(data))
    options = {}
    if 1 in fields:
        options["gracePeriodSeconds"] = fields[1] - (1 << 64 if fields[1] >= 1 << 63 else 0)
    if 4 in fields:
        options["propagationPolicy"] = fields[4].decode()
    return options


def _object(kind, raw):
    fields = _fields(raw)
    first = {f: v for f, v in reversed(fields)}
    obj = {"metadata": _meta(first.get(1, b""))}
    if kind == "ConfigMap":
        obj["data"] = _map([v for f, v in fields if f == 2], bytes.decode)
        obj["binaryData"] = _map([v for f, v in fields if f == 3], lambda b: base64.b64encode(b).decode())
    elif kind == "Secret":
        obj["data"] = _map([v for f, v in fields if f == 2], lambda b: base64.b64encode(b).decode())
        obj["stringData"] = _map([v for f, v in fields if f == 4], bytes.decode)
        if 3 in first:
            obj["type"] = first[3].decode()
    elif kind == "Eviction":
        obj["deleteOptions"] = _delete_options(first.get(2, b""))
    elif kind == "DeleteOptions":
        return _delete_options(raw)
    elif kind == "TokenRequest":
        spec = _fields(first.get(2, b""))
        obj["spec"] = {"audiences": [v.decode() for f, v in spec if f == 1]}
        obj["spec"].update({"expirationSeconds": v for f, v in spec if f == 4})
    elif kind in ("Role", "ClusterRole"):
        obj["rules"] = [_strings(rule, _RULE_FIELDS) for f, rule in fields if f == 2]
    elif kind in ("RoleBinding", "ClusterRoleBinding"):
        obj["subjects"] = [_strings(s, _SUBJECT_FIELDS, single=True) for f, s in fields if f == 2]
        obj["roleRef"] = _strings(first.get(3, b""), _ROLE_REF_FIELDS, single=True)
    return {k: v for k, v in obj.items() if v != {}}


_RULE_FIELDS = {1: "verbs", 2: "apiGroups", 3: "resources", 4: "resourceNames", 5: "nonResourceURLs"}
_SUBJECT_FIELDS = {1: "kind", 2: "apiGroup", 3: "name", 4: "namespace"}
_ROLE_REF_FIELDS = {1: "apiGroup", 2: "kind", 3: "name"}


def _strings(data, names, single=False):
    """A message of string fields: lists of the repeated ones, or single values."""
    out = {}
    for number, value in _fields(data):
        key = names.get(number)
        if key is None:
            continue
        if single:
            if value:
                out[key] = value.decode()
        else:
            out.setdefault(key, []).append(value.decode())
    return out


def decode(body):
    """The JSON form of a protobuf request body."""
    try:
        if not body.startswith(MAGIC):
            raise ValueError("no k8s magic")
        unknown = dict(_fields(body[len(MAGIC):]))
        type_meta = dict(_fields(unknown.get(1, b"")))
        api_version, kind = type_meta.get(1, b"").decode(), type_meta.get(2, b"").decode()
        if kind not in KINDS:
            raise ApiError(415, "UnsupportedMediaType", "the emulator reads protobuf only for %s, not %s: send "
                           "JSON" % (", ".join(KINDS), kind or "this body"))
        return dict(_object(kind, unknown.get(2, b"")), apiVersion=api_version, kind=kind)
    except (ValueError, IndexError) as e:
        raise ApiError(400, "BadRequest", "cannot decode the protobuf body: %s" % e)
