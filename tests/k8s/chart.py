"""A renderer of the subset of Helm's template language that charts/pliant keeps
to (`helm` is not installed where the tests run): {{ }} actions with '-'
whitespace trimming, comments, fields (.Values.x.y, .Release.Name/Namespace/
Service, .Chart.Name/Version/AppVersion, $ and $var), pipelines, parentheses,
if / else if / else, with / else, range (lists and maps, with $i, $v :=),
define / include, and the functions toYaml, nindent, indent, quote, default,
trunc, trimSuffix, printf, list, int, eq, ne, lt, le, gt, ge, not, and, or.
Anything else is an error (TemplateError), so the templates cannot drift outside
the subset unnoticed. Values are merged over values.yaml as Helm does (maps
deeply, the rest replaced), numbers print as Go prints float64 values.

render(overrides, release, namespace) -> [(template, object)]; crds() -> the
chart's CRD objects. Used by tests/cli/test_chart.py and by cluster.py, which
installs the chart as `helm install` would.
"""

import copy
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import yamlmini  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(REPO, "charts", "pliant")


class ChartError(Exception):
    """A rendered template is not valid YAML of Kubernetes objects."""




class TemplateError(Exception):
    pass


_TOKEN_RE = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<num>-?\d+(?:\.\d+)?)
  | (?P<decl>:=)
  | (?P<assign>=)
  | (?P<punct>[()|,])
  | (?P<field>(?:\$[A-Za-z0-9_]*|)(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.|\$[A-Za-z0-9_]*)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
""", re.X)


def _lex_action(text, where):
    toks, i = [], 0
    while i < len(text):
        m = _TOKEN_RE.match(text, i)
        if not m:
            raise TemplateError("%s: cannot read %r" % (where, text[i:i + 20]))
        i = m.end()
        kind = m.lastgroup
        if kind == "ws":
            continue
        val = m.group(kind)
        if kind == "str":
            val = json.loads(val)
        elif kind == "raw":
            kind, val = "str", val[1:-1]
        elif kind == "num":
            val = float(val) if "." in val else int(val)
        toks.append((kind, val))
    return toks


def _split_template(src, name):
    """[("text", s) | ("action", content, where)] with trimming applied."""
    out, i, line = [], 0, 1
    while True:
        j = src.find("{{", i)
        if j < 0:
            out.append(["text", src[i:]])
            return out
        text = src[i:j]
        k = j + 2
        trim_left = src.startswith("- ", k) or src.startswith("-\n", k)
        if trim_left:
            k += 1
        # find the closing braces outside string literals
        m = k
        quote = None
        while m < len(src):
            ch = src[m]
            if quote:
                if ch == "\\" and quote == '"':
                    m += 2
                    continue
                if ch == quote:
                    quote = None
            elif ch in "\"`":
                quote = ch
            elif src.startswith("}}", m):
                break
            m += 1
        else:
            raise TemplateError("%s:%d: unclosed action" % (name, line))
        content = src[k:m]
        trim_right = content.endswith(" -") or content.endswith("\n-")
        if trim_right:
            content = content[:-1]
        if trim_left:
            text = text.rstrip(" \t\r\n")
        line += src[i:m].count("\n")
        out.append(["text", text])
        out.append(["action", content.strip(), "%s:%d" % (name, line), trim_right])
        i = m + 2
        if trim_right:
            while i < len(src) and src[i] in " \t\r\n":
                i += 1


class _Parser:
    def __init__(self, pieces, defines):
        self.p = pieces
        self.i = 0
        self.defines = defines

    def parse(self, stop=()):
        """Nodes until an action whose keyword is in stop: (nodes, stop keyword, action)."""
        nodes = []
        while self.i < len(self.p):
            piece = self.p[self.i]
            self.i += 1
            if piece[0] == "text":
                if piece[1]:
                    nodes.append(("text", piece[1]))
                continue
            content, where = piece[1], piece[2]
            if content.startswith("/*"):
                if not content.endswith("*/"):
                    raise TemplateError("%s: bad comment" % where)
                continue
            word = content.split(None, 1)[0] if content else ""
            rest = content[len(word):].strip()
            if word in stop:
                return nodes, word, (rest, where)
            if word == "if":
                nodes.append(self.conditional("if", rest, where))
            elif word == "with":
                nodes.append(self.conditional("with", rest, where))
            elif word == "range":
                nodes.append(self.conditional("range", rest, where))
            elif word == "define":
                toks = _lex_action(rest, where)
                if len(toks) != 1 or toks[0][0] != "str":
                    raise TemplateError("%s: define needs a name" % where)
                body, kw, _ = self.parse(("end",))
                if kw != "end":
                    raise TemplateError("%s: define without end" % where)
                self.defines[toks[0][1]] = body
            elif word in ("end", "else"):
                raise TemplateError("%s: unexpected %s" % (where, word))
            elif word in ("template", "block", "break", "continue", "tpl"):
                raise TemplateError("%s: '%s' is outside the chart's template subset" % (where, word))
            else:
                nodes.append(("action", _parse_pipeline(_lex_action(content, where), where), where))
        if stop:
            raise TemplateError("missing {{ end }}")
        return nodes, None, None

    def conditional(self, kind, rest, where):
        pipe = _parse_pipeline(_lex_action(rest, where), where)
        body, kw, info = self.parse(("else", "end"))
        other = []
        if kw == "else":
            erest, ewhere = info
            if erest.startswith("if ") and kind == "if":
                other = [self.conditional("if", erest[3:].strip(), ewhere)]
                return (kind, pipe, body, other, where)
            if erest:
                raise TemplateError("%s: else %s is outside the subset" % (ewhere, erest))
            other, kw2, _ = self.parse(("end",))
        return (kind, pipe, body, other, where)


def _parse_pipeline(toks, where):
    """{"decl": [vars], "cmds": [[operand...]]}; operands: (kind, value)."""
    decl = []
    if len(toks) >= 2 and toks[0][0] == "field" and toks[0][1].startswith("$"):
        # $v := ...  or  $i, $v := ...
        k = 0
        names = []
        while k < len(toks) and toks[k][0] == "field" and toks[k][1].startswith("$"):
            names.append(toks[k][1])
            k += 1
            if k < len(toks) and toks[k] == ("punct", ","):
                k += 1
                continue
            break
        if k < len(toks) and toks[k][0] == "decl":
            decl = names
            toks = toks[k + 1:]
    pos = [0]

    def operand():
        kind, val = toks[pos[0]]
        pos[0] += 1
        if (kind, val) == ("punct", "("):
            depth, start = 1, pos[0]
            while depth:
                if pos[0] >= len(toks):
                    raise TemplateError("%s: unbalanced (" % where)
                if toks[pos[0]] == ("punct", "("):
                    depth += 1
                elif toks[pos[0]] == ("punct", ")"):
                    depth -= 1
                pos[0] += 1
            return ("pipe", _parse_pipeline(toks[start:pos[0] - 1], where))
        if kind == "punct":
            raise TemplateError("%s: unexpected %r" % (where, val))
        return (kind, val)

    cmds, cur = [], []
    while pos[0] < len(toks):
        if toks[pos[0]] == ("punct", "|"):
            pos[0] += 1
            if not cur:
                raise TemplateError("%s: empty command" % where)
            cmds.append(cur)
            cur = []
            continue
        cur.append(operand())
    if not cur:
        raise TemplateError("%s: empty pipeline" % where)
    cmds.append(cur)
    return {"decl": decl, "cmds": cmds, "where": where}


def _truthy(v):
    if v is None or v is False:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, (str, list, dict, tuple)):
        return len(v) > 0
    return True


def _gostr(v):
    """What Go's fmt prints for a value (maps and slices are refused)."""
    if v is None:
        return ""  # Helm turns <no value> into ""
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, float):
        if v == int(v) and abs(v) < 1e21:
            return "%d" % int(v)
        return repr(v)
    if isinstance(v, (dict, list)):
        raise TemplateError("printing a %s (use toYaml)" % type(v).__name__)
    return str(v)


def _go_printf(fmt, *args):
    out, ai, i = [], 0, 0
    while i < len(fmt):
        ch = fmt[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        verb = fmt[i + 1]
        i += 2
        if verb == "%":
            out.append("%")
            continue
        a = args[ai]
        ai += 1
        if verb in "sv":
            out.append(_gostr(a))
        elif verb == "d":
            out.append("%d" % int(a))
        elif verb == "q":
            out.append(json.dumps(_gostr(a)))
        else:
            raise TemplateError("printf verb %%%s is outside the subset" % verb)
    return "".join(out)


def _indent(n, s):
    pad = " " * int(n)
    return pad + s.replace("\n", "\n" + pad)


def _num_types_same(a, b):
    # Go compares float64 with int only after an explicit conversion.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return type(a) is type(b)
    return True


def _eq(a, *bs):
    for b in bs:
        if not _num_types_same(a, b):
            raise TemplateError("incompatible types for comparison: %r, %r" % (a, b))
        if a == b:
            return True
    return False


def _order(op):
    def f(a, b):
        if not _num_types_same(a, b) or isinstance(a, (dict, list, type(None))):
            raise TemplateError("incompatible types for comparison: %r, %r" % (a, b))
        return op(a, b)
    return f


class Renderer:
    def __init__(self, values, release_name="pliant", namespace="pliant-system"):
        with open(os.path.join(CHART, "Chart.yaml")) as f:
            chart = yamlmini.load(f.read())
        self.root = {
            "Values": _as_helm_values(values),
            "Release": {"Name": release_name, "Namespace": namespace, "Service": "Helm",
                        "IsInstall": True, "IsUpgrade": False, "Revision": 1},
            "Chart": {"Name": chart["name"], "Version": chart["version"],
                      "AppVersion": chart.get("appVersion", "")},
        }
        self.defines = {}
        self.templates = {}
        self.values_read = set()  # every .Values.a.b path a template read
        tdir = os.path.join(CHART, "templates")
        for name in sorted(os.listdir(tdir)):
            path = os.path.join(tdir, name)
            with open(path) as f:
                src = f.read()
            nodes, _, _ = _Parser(_split_template(src, "templates/" + name), self.defines).parse()
            self.templates[name] = nodes
        self.funcs = {
            "include": self._include,
            "toYaml": lambda v: "" if v is None else yamlmini.dump(_json_numbers(v)),
            "nindent": lambda n, s: "\n" + _indent(n, s),
            "indent": _indent,
            "quote": lambda *a: " ".join(json.dumps(_gostr(x)) for x in a if x is not None),
            "default": lambda d, *v: v[0] if v and _truthy(v[0]) else d,
            "trunc": lambda n, s: s[:int(n)] if n >= 0 else s[int(n):],
            "trimSuffix": lambda suf, s: s[:-len(suf)] if suf and s.endswith(suf) else s,
            "printf": _go_printf,
            "list": lambda *a: list(a),
            "int": lambda v: int(v or 0),
            "eq": _eq,
            "ne": lambda a, b: not _eq(a, b),
            "lt": _order(lambda a, b: a < b),
            "le": _order(lambda a, b: a <= b),
            "gt": _order(lambda a, b: a > b),
            "ge": _order(lambda a, b: a >= b),
            "not": lambda v: not _truthy(v),
            "and": lambda *a: next((x for x in a if not _truthy(x)), a[-1]),
            "or": lambda *a: next((x for x in a if _truthy(x)), a[-1]),
        }

    def _include(self, name, dot):
        if name not in self.defines:
            raise TemplateError("include of undefined template %r" % name)
        return self.exec(self.defines[name], dot, {"$": dot})

    def render_all(self):
        """{template file: text} for every template that is not a partial (_*)."""
        return {n: self.exec(nodes, self.root, {"$": self.root})
                for n, nodes in self.templates.items() if not n.startswith("_") and n.endswith(".yaml")}

    # -- evaluation

    def exec(self, nodes, dot, scope):
        out = []
        for node in nodes:
            kind = node[0]
            if kind == "text":
                out.append(node[1])
            elif kind == "action":
                v = self.pipeline(node[1], dot, scope)
                if not node[1]["decl"]:
                    out.append(_gostr(v))
            elif kind == "if":
                _, pipe, body, other, _ = node
                if _truthy(self.pipeline(pipe, dot, scope)):
                    out.append(self.exec(body, dot, dict(scope)))
                else:
                    out.append(self.exec(other, dot, dict(scope)))
            elif kind == "with":
                _, pipe, body, other, _ = node
                v = self.pipeline(pipe, dot, scope)
                if _truthy(v):
                    out.append(self.exec(body, v, dict(scope)))
                else:
                    out.append(self.exec(other, dot, dict(scope)))
            elif kind == "range":
                _, pipe, body, other, where = node
                v = self.pipeline(dict(pipe, decl=[]), dot, scope)
                names = pipe["decl"]
                if not _truthy(v):
                    out.append(self.exec(other, dot, dict(scope)))
                    continue
                if isinstance(v, dict):
                    items = [(k, v[k]) for k in sorted(v)]
                elif isinstance(v, list):
                    items = list(enumerate(v))
                elif isinstance(v, int):
                    items = [(i, i) for i in range(v)]
                else:
                    raise TemplateError("%s: range over %r" % (where, v))
                for k, item in items:
                    s = dict(scope)
                    if len(names) == 1:
                        s[names[0]] = item
                    elif len(names) == 2:
                        s[names[0]], s[names[1]] = k, item
                    out.append(self.exec(body, item, s))
        return "".join(out)

    def pipeline(self, pipe, dot, scope):
        val, have = None, False
        for cmd in pipe["cmds"]:
            val = self.command(cmd, dot, scope, val if have else _NOARG, pipe["where"])
            have = True
        for name in pipe["decl"]:
            scope[name] = val
        return val

    def command(self, cmd, dot, scope, piped, where):
        head = cmd[0]
        if head[0] == "ident" and head[1] not in ("true", "false", "nil"):
            fn = self.funcs.get(head[1])
            if fn is None:
                raise TemplateError("%s: function %r is outside the chart's template subset" % (where, head[1]))
            args = [self.operand(o, dot, scope, where) for o in cmd[1:]]
            if piped is not _NOARG:
                args.append(piped)
            try:
                return fn(*args)
            except TemplateError as e:
                raise TemplateError("%s: %s: %s" % (where, head[1], e))
            except (TypeError, ValueError, IndexError) as e:
                raise TemplateError("%s: %s: %s" % (where, head[1], e))
        if len(cmd) != 1 or piped is not _NOARG:
            raise TemplateError("%s: %r is not a function" % (where, head[1]))
        return self.operand(head, dot, scope, where)

    def operand(self, op, dot, scope, where):
        kind, val = op
        if kind in ("str", "num"):
            return val
        if kind == "ident":
            if val in ("true", "false"):
                return val == "true"
            if val == "nil":
                return None
            # a function without arguments in argument position
            return self.command([op], dot, scope, _NOARG, where)
        if kind == "pipe":
            return self.pipeline(val, dot, dict(scope))
        if kind == "field":
            if val == ".":
                return dot
            if val.startswith("$"):
                name, _, rest = val.partition(".")
                if name not in scope:
                    raise TemplateError("%s: undefined variable %s" % (where, name))
                cur = scope[name]
                parts = rest.split(".") if rest else []
            else:
                cur = dot
                parts = val[1:].split(".")
            if cur is self.root and parts and parts[0] == "Values":
                self.values_read.add(tuple(parts[1:]))
            for part in parts:
                if cur is None:
                    return None
                if not isinstance(cur, dict):
                    raise TemplateError("%s: can't evaluate field %s in %r" % (where, part, type(cur).__name__))
                cur = cur.get(part)
            return cur
        raise TemplateError("%s: unexpected %r" % (where, val))


_NOARG = object()


def _as_helm_values(v):
    """Numbers as Helm sees them: values.yaml goes through JSON, so every number is a float64."""
    if isinstance(v, dict):
        return {k: _as_helm_values(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_as_helm_values(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def _json_numbers(v):
    """Numbers as Helm's toYaml writes them (through Go's JSON): integral float64 values
    without a fraction."""
    if isinstance(v, dict):
        return {k: _json_numbers(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_numbers(x) for x in v]
    if isinstance(v, float) and v == int(v) and abs(v) < 1e21:
        return int(v)
    return v


def _integral_floats(v, path=""):
    """Paths of integral floats in a rendered object (a YAML 65532.0 where Kubernetes wants an integer)."""
    if isinstance(v, dict):
        return [p for k, x in v.items() for p in _integral_floats(x, path + "." + k)]
    if isinstance(v, list):
        return [p for i, x in enumerate(v) for p in _integral_floats(x, "%s[%d]" % (path, i))]
    return [path] if isinstance(v, float) and v == int(v) else []


def merge_values(base, over):
    """Helm's coalescing: maps merge key by key, anything else replaces; null deletes."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_values(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def default_values():
    with open(os.path.join(CHART, "values.yaml")) as f:
        return yamlmini.load(f.read())


def render(overrides=None, release="pliant", namespace="pliant-system"):
    """[(template, object)] of every rendered document, in template order."""
    values = merge_values(default_values(), overrides or {})
    texts = Renderer(values, release, namespace).render_all()
    objs = []
    for name, text in texts.items():
        try:
            docs = yamlmini.load_all(text)
        except yamlmini.YAMLError as e:
            numbered = "\n".join("%4d %s" % (i + 1, l) for i, l in enumerate(text.split("\n")))
            raise ChartError("templates/%s does not render to valid YAML: %s\n%s" % (name, e, numbered))
        for d in docs:
            if not isinstance(d, dict):
                raise ChartError("templates/%s: a document is not a mapping: %r" % (name, d))
            bad = _integral_floats(d)
            if bad:
                raise ChartError("templates/%s: %s %s: integral numbers written as floats at %s" % (
                    name, d.get("kind"), d.get("metadata", {}).get("name"), bad))
            objs.append((name, d))
    return objs


def crds():
    """The objects of the chart's crds/ (installed before the templates, never templated)."""
    out = []
    directory = os.path.join(CHART, "crds")
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            out += [d for d in yamlmini.load_all(f.read()) if d]
    return out
