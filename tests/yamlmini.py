"""A small YAML reader and writer for the tests (standard library only).

It reads the subset of YAML that Pliant's manifests, CRD, Helm chart and
rendered templates use: block mappings and sequences (including "- key: v"
items), flow mappings and sequences ({a: 1, b: [x, y]}, possibly over several
lines), plain, single- and double-quoted scalars, literal and folded block
scalars (| |- |+ > >- >+), comments, and several documents separated by "---".
Plain scalars resolve as in YAML 1.2's core schema (null ~, true/false,
integers, floats, .inf, .nan); everything else is a string. Not supported:
anchors and aliases, tags, complex keys, multi-line plain scalars. Duplicate
keys and tabs in indentation are errors (YAMLError, with the line number).

    load(text)      -> the single document (None when empty)
    load_all(text)  -> list of non-empty documents
    dump(obj)       -> block-style YAML (keys sorted, as Helm's toYaml writes it)
"""

import json
import math
import re

__all__ = ["YAMLError", "load", "load_all", "dump"]


class YAMLError(ValueError):
    pass


_INT_RE = re.compile(r"^[-+]?[0-9]+$")
_HEX_RE = re.compile(r"^0x[0-9a-fA-F]+$")
_OCT_RE = re.compile(r"^0o[0-7]+$")
_FLOAT_RE = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_DOC_SEP_RE = re.compile(r"^---(\s|$)")
_DOC_END_RE = re.compile(r"^\.\.\.(\s|$)")


def resolve_plain(s):
    """A plain scalar's value under the YAML 1.2 core schema."""
    if s in ("", "~", "null", "Null", "NULL"):
        return None
    if s in ("true", "True", "TRUE"):
        return True
    if s in ("false", "False", "FALSE"):
        return False
    if _INT_RE.match(s):
        return int(s, 10)
    if _HEX_RE.match(s):
        return int(s[2:], 16)
    if _OCT_RE.match(s):
        return int(s[2:], 8)
    if _FLOAT_RE.match(s):
        return float(s)
    low = s.lower()
    if low in (".inf", "+.inf"):
        return math.inf
    if low == "-.inf":
        return -math.inf
    if low == ".nan":
        return math.nan
    return s


_ESCAPES = {"0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v",
            "f": "\f", "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\",
            "N": "\x85", "_": "\xa0", "L": "\u2028", "P": "\u2029"}


def _strip_comment(s):
    """s without a trailing comment (a '#' at the start or after white space,
    outside quotes). Quotes only count where a scalar may start."""
    i, n = 0, len(s)
    quote = None
    while i < n:
        ch = s[i]
        if quote == "'":
            if ch == "'":
                if i + 1 < n and s[i + 1] == "'":
                    i += 2
                    continue
                quote = None
        elif quote == '"':
            if ch == "\\":
                i += 2
                continue
            if ch == '"':
                quote = None
        else:
            if ch == "#" and (i == 0 or s[i - 1] in " \t"):
                return s[:i].rstrip()
            if ch in "'\"" and (i == 0 or s[i - 1] in " \t[{,:-?"):
                # a quote starts a scalar only at a token start (not in it's or a"b)
                j = i - 1
                while j >= 0 and s[j] in " \t":
                    j -= 1
                if j < 0 or s[j] in "[{,:-?" or i == 0:
                    quote = ch
        i += 1
    return s.rstrip()


class _Flow:
    """Parser of one flow collection or quoted scalar held in a string."""

    def __init__(self, text, lineno):
        self.s = text
        self.i = 0
        self.lineno = lineno

    def err(self, msg):
        raise YAMLError("line %d: %s (in %r)" % (self.lineno, msg, self.s[:80]))

    def ws(self):
        while self.i < len(self.s) and self.s[self.i] in " \t\n":
            self.i += 1

    def value(self, in_flow):
        self.ws()
        if self.i >= len(self.s):
            self.err("value expected")
        ch = self.s[self.i]
        if ch == "{":
            return self.mapping()
        if ch == "[":
            return self.sequence()
        if ch == '"':
            return self.dquoted()
        if ch == "'":
            return self.squoted()
        return self.plain(in_flow)

    def mapping(self):
        self.i += 1
        out = {}
        while True:
            self.ws()
            if self.i >= len(self.s):
                self.err("unterminated flow mapping")
            if self.s[self.i] == "}":
                self.i += 1
                return out
            key = self.value(True)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                self.err("complex keys are not supported")
            self.ws()
            val = None
            if self.i < len(self.s) and self.s[self.i] == ":":
                self.i += 1
                self.ws()
                if self.i < len(self.s) and self.s[self.i] not in ",}":
                    val = self.value(True)
            k = _key(key)
            if k in out:
                self.err("duplicate key %r" % k)
            out[k] = val
            self.ws()
            if self.i < len(self.s) and self.s[self.i] == ",":
                self.i += 1
            elif self.i < len(self.s) and self.s[self.i] == "}":
                continue
            else:
                self.err("',' or '}' expected")

    def sequence(self):
        self.i += 1
        out = []
        while True:
            self.ws()
            if self.i >= len(self.s):
                self.err("unterminated flow sequence")
            if self.s[self.i] == "]":
                self.i += 1
                return out
            out.append(self.value(True))
            self.ws()
            if self.i < len(self.s) and self.s[self.i] == ",":
                self.i += 1
            elif self.i < len(self.s) and self.s[self.i] == "]":
                continue
            else:
                self.err("',' or ']' expected")

    def dquoted(self):
        self.i += 1
        out = []
        s = self.s
        while True:
            if self.i >= len(s):
                self.err("unterminated double-quoted string")
            ch = s[self.i]
            if ch == '"':
                self.i += 1
                return "".join(out)
            if ch == "\\":
                e = s[self.i + 1] if self.i + 1 < len(s) else ""
                if e in _ESCAPES:
                    out.append(_ESCAPES[e])
                    self.i += 2
                elif e in "xuU":
                    width = {"x": 2, "u": 4, "U": 8}[e]
                    hexs = s[self.i + 2:self.i + 2 + width]
                    try:
                        out.append(chr(int(hexs, 16)))
                    except ValueError:
                        self.err("bad escape \\%s%s" % (e, hexs))
                    self.i += 2 + width
                elif e == "\n":
                    self.i += 2
                    while self.i < len(s) and s[self.i] in " \t":
                        self.i += 1
                else:
                    self.err("bad escape \\%s" % e)
                continue
            if ch == "\n":
                # line folding: the break becomes a space, leading white space goes
                while out and out[-1] in " \t":
                    out.pop()
                self.i += 1
                blank = 0
                while self.i < len(s) and s[self.i] in " \t\n":
                    if s[self.i] == "\n":
                        blank += 1
                    self.i += 1
                out.append("\n" * blank if blank else " ")
                continue
            out.append(ch)
            self.i += 1

    def squoted(self):
        self.i += 1
        out = []
        s = self.s
        while True:
            if self.i >= len(s):
                self.err("unterminated single-quoted string")
            ch = s[self.i]
            if ch == "'":
                if self.i + 1 < len(s) and s[self.i + 1] == "'":
                    out.append("'")
                    self.i += 2
                    continue
                self.i += 1
                return "".join(out)
            if ch == "\n":
                while out and out[-1] in " \t":
                    out.pop()
                self.i += 1
                while self.i < len(s) and s[self.i] in " \t":
                    self.i += 1
                out.append(" ")
                continue
            out.append(ch)
            self.i += 1

    def plain(self, in_flow):
        start = self.i
        s = self.s
        while self.i < len(s):
            ch = s[self.i]
            if in_flow and ch in ",[]{}":
                break
            if ch == ":" and (self.i + 1 >= len(s) or s[self.i + 1] in " \t\n" or
                              (in_flow and s[self.i + 1] in ",[]{}")):
                break
            if ch == "\n":
                break
            self.i += 1
        return resolve_plain(s[start:self.i].strip())

    def done(self):
        self.ws()
        if self.i != len(self.s):
            self.err("unexpected text after value")


def _key(k):
    """Mapping keys are kept as strings (as Kubernetes' YAML-to-JSON does)."""
    if isinstance(k, bool):
        return "true" if k else "false"
    if k is None:
        return "null"
    return k if isinstance(k, str) else str(k)


def _split_key(content, lineno):
    """(key, rest) when content is "key: rest" or "key:", else None."""
    if not content or content[0] in "[{":
        return None
    if content[0] in "'\"":
        f = _Flow(content, lineno)
        key = f.dquoted() if content[0] == '"' else f.squoted()
        rest = content[f.i:].lstrip(" \t")
        if rest.startswith(":") and (len(rest) == 1 or rest[1] in " \t"):
            return key, rest[1:].strip()
        return None
    m = re.search(r":(\s|$)", content)
    if not m:
        return None
    key = content[:m.start()].rstrip()
    if not key or key.startswith(("- ", "#")) or key == "-":
        return None
    return _key(resolve_plain(key)), content[m.end():].strip()


class _Block:
    def __init__(self, lines, first_lineno):
        self.raw = lines
        self.base = first_lineno
        self.pos = 0

    def err(self, msg, idx=None):
        idx = self.pos if idx is None else idx
        raise YAMLError("line %d: %s" % (self.base + idx, msg))

    def peek(self):
        """(index, indent, content) of the next significant line, or None."""
        i = self.pos
        while i < len(self.raw):
            line = self.raw[i]
            stripped = line.lstrip(" ")
            if stripped.startswith("\t") and _strip_comment(stripped.strip()):
                self.err("tab in indentation", i)
            content = _strip_comment(stripped)
            if content.strip():
                return i, len(line) - len(stripped), content.rstrip()
            i += 1
        return None

    def node(self, min_indent):
        nxt = self.peek()
        if nxt is None or nxt[1] < min_indent:
            return None
        idx, ind, content = nxt
        if content == "-" or content.startswith("- "):
            return self.sequence(ind)
        if _split_key(content, self.base + idx) is not None:
            return self.mapping(ind)
        self.pos = idx + 1
        return self.scalar_or_flow(content, idx, ind)

    def scalar_or_flow(self, text, idx, indent):
        """A value written on one line (or a flow collection / quoted string
        continuing over the following lines)."""
        if text[0] in "[{\"'":
            buf = text
            j = idx
            while True:
                try:
                    f = _Flow(buf, self.base + idx)
                    v = f.value(False)
                    f.done()
                    self.pos = j + 1
                    return v
                except YAMLError as e:
                    j += 1
                    if j >= len(self.raw) or "unterminated" not in str(e):
                        raise
                    more = self.raw[j]
                    more = _strip_comment(more) if text[0] in "[{" else more
                    buf += "\n" + more
        if text[0] in "&*!":
            self.err("anchors, aliases and tags are not supported", idx)
        if text[0] in "|>":
            self.pos = idx + 1
            return self.block_scalar(text, indent)
        self.pos = idx + 1
        return resolve_plain(text)

    def block_scalar(self, header, parent_indent):
        m = re.match(r"^([|>])([-+]?)([1-9]?)([-+]?)$", header)
        if not m:
            self.err("bad block scalar header %r" % header)
        style, chomp = m.group(1), (m.group(2) or m.group(4))
        lines = []
        indent = int(m.group(3)) + parent_indent if m.group(3) else None
        while self.pos < len(self.raw):
            line = self.raw[self.pos]
            if not line.strip():
                lines.append("")
                self.pos += 1
                continue
            ind = len(line) - len(line.lstrip(" "))
            if indent is None:
                if ind <= parent_indent:
                    break
                indent = ind
            if ind < indent:
                break
            lines.append(line[indent:])
            self.pos += 1
        # trailing blank lines belong to chomping
        body_end = len(lines)
        while body_end and lines[body_end - 1] == "":
            body_end -= 1
        trailing = lines[body_end:]
        body = lines[:body_end]
        if style == "|":
            text = "\n".join(body)
        else:
            out = []
            for k, ln in enumerate(body):
                if k == 0:
                    out.append(ln)
                elif ln == "" or ln.startswith(" ") or (body[k - 1].startswith(" ")):
                    out.append("\n" + ln)
                elif body[k - 1] == "":
                    out.append(ln)
                else:
                    out.append(" " + ln)
            text = "".join(out)
        if not body:
            return "" if chomp != "+" else "\n" * len(trailing)
        if chomp == "-":
            return text
        if chomp == "+":
            return text + "\n" + "\n" * len(trailing)
        return text + "\n"

    def mapping(self, indent):
        out = {}
        while True:
            nxt = self.peek()
            if nxt is None or nxt[1] < indent:
                return out
            idx, ind, content = nxt
            if ind > indent:
                self.err("bad indentation (mapping at column %d)" % (indent + 1), idx)
            kv = _split_key(content, self.base + idx)
            if kv is None:
                self.err("mapping key expected, got %r" % content[:40], idx)
            key, rest = kv
            if key in out:
                self.err("duplicate key %r" % key, idx)
            self.pos = idx + 1
            if rest:
                out[key] = self.scalar_or_flow(rest, idx, indent)
            else:
                nx = self.peek()
                if nx and nx[1] > indent:
                    out[key] = self.node(indent + 1)
                elif nx and nx[1] == indent and (nx[2] == "-" or nx[2].startswith("- ")):
                    out[key] = self.sequence(indent)
                else:
                    out[key] = None

    def sequence(self, indent):
        out = []
        while True:
            nxt = self.peek()
            if nxt is None or nxt[1] < indent:
                return out
            idx, ind, content = nxt
            if ind > indent:
                self.err("bad indentation (sequence at column %d)" % (indent + 1), idx)
            if not (content == "-" or content.startswith("- ")):
                return out  # e.g. the next key of a mapping at the same indentation
            rest = content[1:].lstrip(" ")
            if not rest:
                self.pos = idx + 1
                out.append(self.node(indent + 1))
                continue
            # "- item": re-read the item as if it started on its own line
            offset = ind + len(content) - len(rest)
            line = self.raw[idx]
            self.raw[idx] = " " * offset + line[offset:]
            self.pos = idx
            out.append(self.node(offset))


def _documents(text):
    """(first line number, lines) of each document."""
    docs, cur, start = [], [], 1
    for n, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if _DOC_SEP_RE.match(line):
            docs.append((start, cur))
            rest = _strip_comment(line[3:].strip())
            cur = [rest] if rest else []
            start = n if cur else n + 1
            continue
        if _DOC_END_RE.match(line):
            docs.append((start, cur))
            cur, start = [], n + 1
            continue
        if line.startswith("%") and not cur:
            continue  # directive
        cur.append(line)
    docs.append((start, cur))
    return docs


def load_all(text):
    out = []
    for start, lines in _documents(text):
        b = _Block(lines, start)
        if b.peek() is None:
            continue
        v = b.node(0)
        rest = b.peek()
        if rest is not None:
            b.err("unexpected content %r" % rest[2][:40], rest[0])
        if v is not None:
            out.append(v)
    return out


def load(text):
    docs = load_all(text)
    if len(docs) > 1:
        raise YAMLError("expected one document, found %d" % len(docs))
    return docs[0] if docs else None


# --------------------------------------------------------------------------
# Writer

_PLAIN_SAFE = re.compile(r"^[A-Za-z0-9_./][A-Za-z0-9_./ @$%()=+,;<>^-]*$")
_INDICATORS = set("-?:,[]{}#&*!|>'\"%@`")


def _scalar(v):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ".nan"
        if math.isinf(v):
            return ".inf" if v > 0 else "-.inf"
        r = repr(v)
        return r if ("." in r or "e" in r or "n" in r) else r + ".0"
    s = str(v)
    if (s and _PLAIN_SAFE.match(s) and s == s.strip() and resolve_plain(s) == s
            and ": " not in s and " #" not in s):
        return s
    if "'" not in s and "\n" not in s and all(c.isprintable() for c in s):
        return "'" + s + "'"
    return json.dumps(s)


def dump(obj, indent=0):
    """Block-style YAML for obj (dicts with sorted keys, as Helm's toYaml).
    Empty collections are written {} and []. No trailing newline."""
    pad = " " * indent
    if isinstance(obj, dict):
        if not obj:
            return pad + "{}"
        lines = []
        for k in sorted(obj):
            v = obj[k]
            ks = _scalar(k if isinstance(k, str) else str(k))
            if isinstance(v, (dict, list)) and v:
                child = dump(v, indent + 2 if isinstance(v, dict) else indent)
                lines.append("%s%s:\n%s" % (pad, ks, child))
            else:
                lines.append("%s%s: %s" % (pad, ks, dump(v, 0)))
        return "\n".join(lines)
    if isinstance(obj, list):
        if not obj:
            return pad + "[]"
        lines = []
        for v in obj:
            if isinstance(v, (dict, list)) and v:
                child = dump(v, indent + 2)
                lines.append("%s- %s" % (pad, child[indent + 2:]))
            else:
                lines.append("%s- %s" % (pad, dump(v, 0)))
        return "\n".join(lines)
    return pad + _scalar(obj)
