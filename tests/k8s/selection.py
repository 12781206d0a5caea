"""Label selectors, field selectors and the JSONPath subset of printer columns.

Label selector syntax as in k8s.io/apimachinery/pkg/labels (and selects(): a
metav1.LabelSelector object): comma-separated
requirements `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`.
Field selectors: `path=v`, `path==v`, `path!=v` on the fields each resource
supports (anything else is a 400, as from a real server).
"""

import re

from errors import bad_request

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\((.*)\)|(==|=|!=)\s*(\S*))?\s*$")


def _split_top(text):
    """Splits on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def parse_labels(text):
    """A predicate over a labels dict; 400 on bad syntax."""
    reqs = []
    for part in _split_top(text or ""):
        m = _SET_RE.match(part)
        if not m:
            raise bad_request("unable to parse requirement: %r" % part.strip())
        neg, key, setop, values, op, value = m.groups()
        if setop:
            vals = {v.strip() for v in values.split(",") if v.strip()}
            reqs.append(_set_req(key, setop == "in", vals))
        elif op:
            reqs.append(_eq_req(key, op != "!=", value))
        else:
            reqs.append(_exists_req(key, not neg))
    return lambda labels: all(r(labels or {}) for r in reqs)


def _set_req(key, inside, vals):
    # `notin` matches objects without the label too, as in Kubernetes.
    return lambda labels: (labels.get(key) in vals) == inside if key in labels else not inside


def _eq_req(key, equal, value):
    return lambda labels: (labels.get(key) == value) == equal


def _exists_req(key, present):
    return lambda labels: (key in labels) == present


def selects(selector, labels):
    """metav1.LabelSelector matching (matchLabels, matchExpressions); {} selects all."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values or op == "NotIn" and labels.get(key) in values or \
                op == "Exists" and key not in labels or op == "DoesNotExist" and key in labels:
            return False
    return True


def parse_fields(text, supported):
    """A predicate over an object for a field selector; `supported` lists the paths
    the resource accepts (None: any path, as for Events)."""
    reqs = []
    for part in _split_top(text or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise bad_request("invalid selector: %r; can't understand %r" % (text, part))
        path, op, value = m.groups()
        if supported is not None and path not in supported:
            raise bad_request('field label not supported: %s' % path)
        reqs.append((path.split("."), op != "!=", value))
    return lambda obj: all((_field_string(obj, p) == v) == eq for p, eq, v in reqs)


def _field_string(obj, path):
    for step in path:
        obj = obj.get(step) if isinstance(obj, dict) else None
    if obj is None:
        return ""
    if isinstance(obj, bool):
        return "true" if obj else "false"
    return str(obj)


# -- JSONPath, as additionalPrinterColumns use it --------------------------------------

_STEP_RE = re.compile(r'\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.]+)\s*==\s*["\']([^"\']*)["\']\)\]'
                      r'|\[[\'"]([^\'"]+)[\'"]\]')


def jsonpath(obj, expr):
    """The values `expr` (`.a.b[0].c`, `.a[?(@.type=="Ready")].status`, `.a['k.x']`)
    selects in obj, as a list."""
    expr = expr.strip()
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    current = [obj]
    pos = 0
    while pos < len(expr):
        m = _STEP_RE.match(expr, pos)
        if not m:
            return []
        pos = m.end()
        name, index, fpath, fvalue, quoted = m.groups()
        current = [v for c in current for v in _step(c, name or quoted, index, fpath, fvalue)]
    return current


def _step(value, name, index, fpath, fvalue):
    if name is not None:
        return [value[name]] if isinstance(value, dict) and name in value else []
    if index is not None:
        return [value[int(index)]] if isinstance(value, list) and int(index) < len(value) else []
    if isinstance(value, list):
        return [v for v in value if _field_string(v, fpath.split(".")) == fvalue]
    return []
