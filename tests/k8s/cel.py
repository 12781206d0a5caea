"""A subset of CEL for x-kubernetes-validations rules of CRD schemas.

Supported: literals (int, double, 'string', "string", true, false, null, lists),
`self` and field selection (`self.a.b`, `self['a']`), has(self.a.b), size(x) and
x.size(), startsWith/endsWith/contains/matches, `in`, ! - * / % + - == != < <= > >=
&& || and ?:. `&&` and `||` absorb errors as CEL does (`false || error` is an
error, `true || error` is true). Rules using anything else (oldSelf, macros
such as all/exists, messageExpression) are not evaluated: they pass.
"""

import re

_TOKEN = re.compile(r"\s*(?:(\d+\.\d+)|(\d+)|'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"|"
                    r"([A-Za-z_][A-Za-z0-9_]*)|(&&|\|\||==|!=|<=|>=|[-+*/%<>!()\[\].,?:]))")


class Unsupported(Exception):
    """The rule uses CEL beyond this subset."""


class EvalError(Exception):
    """A runtime error (no such key, bad types): the rule fails."""


def check(rule, value):
    """True/False for the rule on value (self); raises Unsupported."""
    parser = _Parser(rule)
    tree = parser.expr()
    if parser.peek() is not None:
        raise Unsupported("unexpected %r" % (parser.peek(),))
    try:
        return _eval(tree, value) is True
    except EvalError:
        return False


class _Parser:
    def __init__(self, text):
        self.tokens, pos = [], 0
        while pos < len(text.rstrip()):
            m = _TOKEN.match(text, pos)
            if not m:
                raise Unsupported("cannot read %r" % text[pos:])
            pos = m.end()
            double, integer, sq, dq, ident, op = m.groups()
            if double:
                self.tokens.append(("lit", float(double)))
            elif integer:
                self.tokens.append(("lit", int(integer)))
            elif sq is not None or dq is not None:
                self.tokens.append(("lit", (sq if sq is not None else dq).encode().decode("unicode_escape")))
            elif ident:
                self.tokens.append({"true": ("lit", True), "false": ("lit", False), "null": ("lit", None)}.get(
                    ident, ("id", ident)))
            else:
                self.tokens.append(("op", op))
        self.i = 0

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, op=None):
        tok = self.peek()
        if tok is None or op is not None and tok != ("op", op):
            raise Unsupported("expected %r, got %r" % (op, tok))
        self.i += 1
        return tok

    def accept(self, *ops):
        tok = self.peek()
        if tok and tok[0] == "op" and tok[1] in ops:
            self.i += 1
            return tok[1]
        return None

    def expr(self):
        cond = self.binary(0)
        if self.accept("?"):
            yes = self.expr()
            self.take(":")
            return ("?", cond, yes, self.expr())
        return cond

    _LEVELS = [("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"), ("+", "-"), ("*", "/", "%")]

    def binary(self, level):
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while True:
            op = self.accept(*self._LEVELS[level])
            if op is None and "in" in self._LEVELS[level] and self.peek() == ("id", "in"):
                self.i += 1
                op = "in"
            if op is None:
                return left
            left = (op, left, self.binary(level + 1))

    def unary(self):
        op = self.accept("!", "-")
        if op:
            return ("neg" if op == "-" else "!", self.unary())
        return self.member(self.primary())

    def member(self, node):
        while True:
            if self.accept("."):
                name = self.take()
                if name[0] != "id":
                    raise Unsupported("bad selector")
                if self.accept("("):
                    node = ("call", name[1], [node] + self.args(")"))
                else:
                    node = (".", node, name[1])
            elif self.accept("["):
                node = ("[]", node, self.expr())
                self.take("]")
            else:
                return node

    def args(self, close):
        out = []
        if self.accept(close):
            return out
        while True:
            out.append(self.expr())
            if self.accept(close):
                return out
            self.take(",")

    def primary(self):
        tok = self.take()
        if tok[0] == "lit":
            return tok
        if tok == ("op", "("):
            node = self.expr()
            self.take(")")
            return node
        if tok == ("op", "["):
            return ("list", self.args("]"))
        if tok == ("id", "self"):
            return ("self",)
        if tok[0] == "id" and self.accept("("):
            return ("call", tok[1], self.args(")"))
        raise Unsupported("unsupported identifier %r" % (tok,))


def _eval(node, this):
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "self":
        return this
    if kind == "list":
        return [_eval(n, this) for n in node[1]]
    if kind in ("||", "&&"):
        return _logic(kind, node[1], node[2], this)
    if kind == "?":
        return _eval(node[2] if _bool(_eval(node[1], this)) else node[3], this)
    if kind == "!":
        return not _bool(_eval(node[1], this))
    if kind == "neg":
        return -_number(_eval(node[1], this))
    if kind == ".":
        return _select(_eval(node[1], this), node[2])
    if kind == "[]":
        return _index(_eval(node[1], this), _eval(node[2], this))
    if kind == "call":
        return _call(node[1], node[2], this)
    return _binary(kind, _eval(node[1], this), _eval(node[2], this))


def _logic(op, left, right, this):
    try:
        a = _bool(_eval(left, this))
    except EvalError:
        b = _bool(_eval(right, this))
        if b == (op == "||"):
            return b
        raise
    if a == (op == "||"):
        return a
    return _bool(_eval(right, this))


def _bool(v):
    if not isinstance(v, bool):
        raise EvalError("no such overload")
    return v


def _number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EvalError("no such overload")
    return v


def _select(obj, name):
    if not isinstance(obj, dict) or name not in obj:
        raise EvalError("no such key: %s" % name)
    return obj[name]


def _index(obj, key):
    try:
        return obj[key]
    except (KeyError, IndexError, TypeError):
        raise EvalError("no such key: %r" % (key,))


def _call(name, args, this):
    if name == "has":
        if len(args) != 1 or args[0][0] != ".":
            raise Unsupported("has() needs a field selection")
        parent = _eval(args[0][1], this)
        return isinstance(parent, dict) and args[0][2] in parent
    values = [_eval(a, this) for a in args]
    if name == "size" and len(values) == 1 and isinstance(values[0], (str, list, dict)):
        return len(values[0])
    if name in ("startsWith", "endsWith", "contains", "matches") and len(values) == 2 and \
            all(isinstance(v, str) for v in values):
        s, arg = values
        return {"startsWith": s.startswith, "endsWith": s.endswith, "contains": lambda a: a in s,
                "matches": lambda a: re.search(a, s) is not None}[name](arg)
    if name in ("size", "startsWith", "endsWith", "contains", "matches"):
        raise EvalError("no such overload: %s" % name)
    raise Unsupported("function %s" % name)


def _binary(op, a, b):
    if op == "==":
        return a == b and type(a) is type(b) or _both_numbers(a, b) and a == b
    if op == "!=":
        return not _binary("==", a, b)
    if op == "in":
        if isinstance(b, (list, dict)):
            return a in b
        raise EvalError("no such overload: in")
    if op in ("<", "<=", ">", ">="):
        if not (_both_numbers(a, b) or isinstance(a, str) and isinstance(b, str)):
            raise EvalError("no such overload: %s" % op)
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if op == "+" and (isinstance(a, str) and isinstance(b, str) or isinstance(a, list) and isinstance(b, list)):
        return a + b
    a, b = _number(a), _number(b)
    if op in ("/", "%") and b == 0:
        raise EvalError("division by zero")
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b if isinstance(a, float) or isinstance(b, float) else int(a / b)
    return a - b * int(a / b)  # CEL's % truncates toward zero, like C


def _both_numbers(a, b):
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
