"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and strategic
merge patch (what kubectl apply/edit/label send for built-in kinds).

Strategic merge patch without the Go types' patch tags: lists of objects under
the field names in MERGE_KEYS are merged by their key (items with
`$patch: delete` removed), `finalizers` is merged as a set, `$deleteFromPrimitiveList/F`
removes values, `$patch: replace` replaces; other directives ($setElementOrder,
$retainKeys) are ignored and other lists are replaced whole.
"""

import copy

from errors import ApiError, bad_request

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


# field name -> the key its list items are merged by (from the core/v1 patch tags)
MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
              "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
              "imagePullSecrets": "name", "conditions": "type", "ownerReferences": "uid",
              "hostAliases": "ip", "topologySpreadConstraints": "topologyKey", "ports": None}


def apply_patch(content_type, target, patch):
    """The patched copy of target; 400/415/422 on a bad patch."""
    kind = (content_type or "").split(";")[0].strip()
    if kind == MERGE:
        return merge(target, patch)
    if kind == STRATEGIC:
        return strategic_merge(target, patch)
    if kind == JSON:
        return json_patch(target, patch)
    raise ApiError(415, "UnsupportedMediaType",
                   "the emulator does not support patch type %r (server-side apply is not emulated)" % kind)


def merge(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def strategic_merge(target, patch):
    if not isinstance(patch, dict):
        return _plain(patch)
    if patch.get("$patch") == "replace":
        return _plain(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            out[field] = [v for v in out.get(field) or [] if v not in value]
        elif key.startswith("$"):
            continue
        elif value is None:
            out.pop(key, None)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = _merge_list(key, out[key], value)
        else:
            out[key] = strategic_merge(out.get(key), value)
    return out


def _merge_list(field, current, patch):
    if field == "finalizers":
        return current + [v for v in patch if v not in current]
    if field not in MERGE_KEYS or not all(isinstance(v, dict) for v in current + patch):
        return _plain(patch)
    result = list(current)
    for item in patch:
        key = MERGE_KEYS[field] or ("containerPort" if "containerPort" in item else "port")
        index = next((i for i, v in enumerate(result) if v.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(_plain(item))
        else:
            result[index] = strategic_merge(result[index], item)
    return result


def _plain(value):
    """value without patch directives."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return copy.deepcopy(value)


def json_patch(target, ops):
    if not isinstance(ops, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "path" not in op or "op" not in op:
            raise bad_request("invalid json patch operation: %r" % (op,))
        doc = _apply_op(doc, op)
    return doc


def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request("json patch path %r must start with /" % path)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _apply_op(doc, op):
    kind, path = op["op"], _pointer(op["path"])
    if kind == "test":
        if _get(doc, path) != op.get("value"):
            raise ApiError(422, "Invalid", "json patch test operation failed at %s" % op["path"])
        return doc
    if kind in ("move", "copy"):
        value = copy.deepcopy(_get(doc, _pointer(op.get("from", ""))))
        if kind == "move":
            doc = _remove(doc, _pointer(op["from"]))
        return _add(doc, path, value)
    if kind == "remove":
        return _remove(doc, path)
    if kind == "add":
        return _add(doc, path, copy.deepcopy(op.get("value")))
    if kind == "replace":
        _get(doc, path)  # must exist
        return _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
    raise bad_request("unknown json patch operation %r" % kind)


def _missing(path):
    return ApiError(422, "Invalid", "json patch: path /%s does not exist" % "/".join(path))


def _get(doc, path):
    for step in path:
        if isinstance(doc, dict) and step in doc:
            doc = doc[step]
        elif isinstance(doc, list) and step.isdigit() and int(step) < len(doc):
            doc = doc[int(step)]
        else:
            raise _missing(path)
    return doc


def _add(doc, path, value):
    if not path:
        return value
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        index = len(parent) if last == "-" else int(last) if last.isdigit() else -1
        if not 0 <= index <= len(parent):
            raise _missing(path)
        parent.insert(index, value)
    else:
        raise _missing(path)
    return doc


def _remove(doc, path):
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise _missing(path)
    return doc
