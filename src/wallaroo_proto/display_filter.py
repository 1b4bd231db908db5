"""Display filters: tshark-shaped expressions over frame records (``dissect -Y``).

``parse(text)`` turns an expression into a small tree, checked against the record
schema (``protocols.schema.field_types()``); ``compile_filter(text)`` makes it one Python
function over a record dict (generated source, compiled once: dissect calls it per
frame); ``spark_predicate(tree)`` makes the same test a Spark column for the
``frames`` table. Sans-IO; pyspark is imported only by ``spark_predicate``.

Semantics, as tshark's: a comparison with an absent field (missing, None, or an empty
list) is false, ``!=`` included, so ``not x == 1`` and ``x != 1`` differ there. A
list field (``violations``, ``acks.stream_id``, ...) matches when any element does;
``!=`` and ``not in`` when it has elements and none equals. ``matches`` is a Python
regex search, case-insensitive; ``contains`` is a case-sensitive substring test.
A bare field name tests presence. ``and`` binds tighter than ``or``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import Decimal
from functools import cache
from typing import Any, NamedTuple

from .protocols import schema

COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
_WORD_OPS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "~": "matches"}
_NUMBER_KINDS = frozenset({"int", "long", "u64", "double"})


class FilterError(ValueError):
    """A bad expression: ``column N: what`` (1-based column of the offending token)."""

    def __init__(self, column: int, message: str) -> None:
        super().__init__(f"column {column}: {message}")
        self.column = column


class Field(NamedTuple):
    """A record field, or one key of a list of structs (``acks.stream_id``)."""

    name: str
    sub: str | None  # the struct key, for ``name.sub``
    kind: str  # the element's kind: string, int, long, u64, double, boolean
    many: bool  # a list: any element may match

    @property
    def label(self) -> str:
        return f"{self.name}.{self.sub}" if self.sub else self.name


class Present(NamedTuple):
    field: Field


class Compare(NamedTuple):
    field: Field
    op: str  # one of COMPARISONS, "contains", "matches"
    value: Any


class In(NamedTuple):
    field: Field
    values: tuple  # plain values, and (low, high) tuples for ranges
    negate: bool


class Not(NamedTuple):
    item: Any


class And(NamedTuple):
    items: tuple


class Or(NamedTuple):
    items: tuple


Node = Present | Compare | In | Not | And | Or

# ---------------------------------------------------------------- lexing

_TOKEN_PATTERN = r"""(?P<space>\s+)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    |(?P<op>==|!=|<=|>=|&&|\|\||\.\.|[<>!~(){},])
    |(?P<word>(?:[A-Za-z0-9_:/+\-]|\.(?!\.))+)
    """
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}


class _Token(NamedTuple):
    kind: str  # string, op, word, end
    text: str  # a string's value (unquoted), or the text as written
    column: int


def _unquote(raw: str, column: int) -> str:
    out, i, body = [], 0, raw[1:-1]
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt == "x" and re.fullmatch(r"[0-9A-Fa-f]{2}", body[i + 2 : i + 4]):
            out.append(chr(int(body[i + 2 : i + 4], 16)))
            i += 4
        elif nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            known = " ".join(f"\\{e}" for e in (*_ESCAPES, "xHH"))
            raise FilterError(column + i + 1, f"unknown escape '\\{nxt}' in a string (known: {known})")
    return "".join(out)


@cache
def _token() -> re.Pattern:
    return re.compile(_TOKEN_PATTERN, re.VERBOSE)  # compiled on first use, not at every start-up


def _tokens(text: str) -> list[_Token]:
    tokens, pos = [], 0
    while pos < len(text):
        m = _token().match(text, pos)
        if m is None:
            if text[pos] in "\"'":
                raise FilterError(pos + 1, "a string without its closing quote")
            raise FilterError(pos + 1, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup
        if kind == "string":
            tokens.append(_Token("string", _unquote(m.group(), pos + 1), pos + 1))
        elif kind != "space":
            tokens.append(_Token(kind, m.group(), pos + 1))
        pos = m.end()
    tokens.append(_Token("end", "", len(text) + 1))
    return tokens


# ---------------------------------------------------------------- parsing


def _field(token: _Token) -> Field:
    types = schema.field_types()
    name, _, sub = token.text.partition(".")
    kind = types.get(name)
    if kind is None:
        import difflib  # only for the message

        close = difflib.get_close_matches(token.text, types, n=1)
        raise FilterError(
            token.column,
            f"unknown field {token.text!r}"
            + (f" (did you mean {close[0]}?)" if close else f" (known: {', '.join(types)})"),
        )
    if kind.startswith("array<struct:"):
        keys = dict(schema.structs()[kind[len("array<struct:") : -1]])
        if not sub:
            return Field(name, None, "struct", True)
        if sub not in keys:
            raise FilterError(token.column, f"{name} has no key {sub!r} (keys: {', '.join(keys)})")
        return Field(name, sub, keys[sub], True)
    if sub:
        raise FilterError(token.column, f"{name} is a {kind}, it has no key {sub!r}")
    if kind.startswith("array<"):
        return Field(name, None, kind[len("array<") : -1], True)
    return Field(name, None, kind, False)


def _number(text: str) -> int | float | None:
    try:
        return int(text, 0)
    except ValueError:
        pass
    try:
        return int(text, 10)  # leading zeros
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def _literal(field: Field, token: _Token) -> Any:
    """The token as a value of the field's kind, or a FilterError saying why not."""
    if token.kind not in ("string", "word"):
        found = "the end" if token.kind == "end" else repr(token.text)
        raise FilterError(token.column, f"expected a value for {field.label}, found {found}")
    kind, text = field.kind, token.text
    if kind == "string":
        return text
    if kind in _NUMBER_KINDS:
        value = _number(text)
        if value is None:
            raise FilterError(token.column, f"{field.label} is a number ({kind}); {text!r} is not")
        return value
    if kind == "boolean":
        value = {"true": True, "false": False, "1": True, "0": False}.get(text.lower())
        if value is None:
            raise FilterError(token.column, f"{field.label} is true or false; {text!r} is neither")
        return value
    raise FilterError(
        token.column, f"{field.label} is a list of structs: compare one key, e.g. {field.name}.KEY"
    )


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self) -> _Token:
        return self.tokens[self.pos]

    def take(self) -> _Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def at_word(self, *words: str) -> bool:
        token = self.peek()
        return token.kind == "word" and token.text.lower() in words

    def at_op(self, *ops: str) -> bool:
        token = self.peek()
        return token.kind == "op" and token.text in ops

    def expression(self) -> Node:
        items = [self.conjunction()]
        while self.at_word("or") or self.at_op("||"):
            self.take()
            items.append(self.conjunction())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def conjunction(self) -> Node:
        items = [self.unary()]
        while self.at_word("and") or self.at_op("&&"):
            self.take()
            items.append(self.unary())
        return items[0] if len(items) == 1 else And(tuple(items))

    def unary(self) -> Node:
        if self.at_word("not") or self.at_op("!"):
            self.take()
            return Not(self.unary())
        if self.at_op("("):
            opening = self.take()
            inner = self.expression()
            if not self.at_op(")"):
                token = self.peek()
                found = "the end" if token.kind == "end" else repr(token.text)
                raise FilterError(
                    token.column, f"expected ')' to close column {opening.column}, found {found}"
                )
            self.take()
            return inner
        return self.test()

    def test(self) -> Node:
        token = self.take()
        if token.kind != "word":
            found = "the end" if token.kind == "end" else repr(token.text)
            raise FilterError(token.column, f"expected a field name, found {found}")
        field = _field(token)
        op_token = self.peek()
        op = op_token.text if op_token.kind == "op" else op_token.text.lower()
        op = _WORD_OPS.get(op, op)
        if op_token.kind == "word" and op == "not" and self.tokens[self.pos + 1].text.lower() == "in":
            self.take()
            self.take()
            return In(field, self.members(field, op_token), True)
        if op == "in" and op_token.kind == "word":
            self.take()
            return In(field, self.members(field, op_token), False)
        if op not in COMPARISONS + ("contains", "matches"):
            return Present(field)
        self.take()
        if field.kind == "struct":
            raise FilterError(
                token.column, f"{field.label} is a list of structs: compare one key, e.g. {field.name}.KEY"
            )
        if op in ("contains", "matches") and field.kind != "string":
            raise FilterError(op_token.column, f"{op} needs a string field; {field.label} is {field.kind}")
        if op not in ("==", "!=") and field.kind == "boolean":
            raise FilterError(op_token.column, f"{field.label} is true or false: only == and != apply")
        value_token = self.take()
        value = _literal(field, value_token)
        if op == "matches":
            try:
                value = re.compile(value, re.IGNORECASE)
            except re.error as err:
                raise FilterError(value_token.column, f"bad regular expression: {err}") from None
        return Compare(field, op, value)

    def members(self, field: Field, at: _Token) -> tuple:
        if field.kind == "struct":
            raise FilterError(
                at.column, f"{field.label} is a list of structs: compare one key, e.g. {field.name}.KEY"
            )
        if not self.at_op("{"):
            raise FilterError(self.peek().column, "expected '{' after in")
        self.take()
        values: list = []
        while not self.at_op("}"):
            if self.at_op(","):
                self.take()
                continue
            token = self.take()
            low = _literal(field, token)
            if self.at_op(".."):
                dots = self.take()
                if field.kind not in _NUMBER_KINDS and field.kind != "string":
                    raise FilterError(
                        dots.column, f"a range needs numbers or strings; {field.label} is {field.kind}"
                    )
                values.append((low, _literal(field, self.take())))
            else:
                values.append(low)
        self.take()
        if not values:
            raise FilterError(at.column, "an empty set: give at least one value between { }")
        return tuple(values)


def parse(text: str) -> Node:
    """The expression's tree, every field and value checked; FilterError if it is not one."""
    parser = _Parser(text)
    if parser.peek().kind == "end":
        raise FilterError(1, "an empty expression")
    tree = parser.expression()
    token = parser.peek()
    if token.kind != "end":
        raise FilterError(token.column, f"expected and, or or the end, found {token.text!r}")
    return tree


# ---------------------------------------------------------------- Python


class _PythonCode:
    """Source of one boolean expression over ``r``, with its constants in ``namespace``."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {}
        self.count = 0

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"_{prefix}{self.count}"

    def constant(self, value: Any) -> str:
        if isinstance(value, (bool, int, str)) or isinstance(value, float) and math.isfinite(value):
            return repr(value)
        name = self.fresh("c")
        self.namespace[name] = value
        return name

    def source(self, node: Node) -> str:
        if isinstance(node, Or):
            return "(" + " or ".join(map(self.source, node.items)) + ")"
        if isinstance(node, And):
            return "(" + " and ".join(map(self.source, node.items)) + ")"
        if isinstance(node, Not):
            return f"(not {self.source(node.item)})"
        field = node.field
        get = f"r.get({field.name!r})"
        if isinstance(node, Present):
            return f"bool({get})" if field.many else f"({get} is not None)"
        if not field.many:
            if isinstance(node, Compare) and node.op == "==":
                return f"({get} == {self.constant(node.value)})"  # None equals no literal
            var = self.fresh("v")
            return f"(({var} := {get}) is not None and {self.test(node, var)})"
        items = self.fresh("v")
        each = f"for _e in {get} or ()"
        fetch = f"({get} or ())" if field.sub is None else f"[_e.get({field.sub!r}) {each}]"
        if isinstance(node, Compare) and node.op == "!=":  # has elements, none equal
            found = self.test(Compare(field, "==", node.value), "_x")
        elif isinstance(node, In) and node.negate:
            found = self.test(In(field, node.values, False), "_x")
        else:
            return f"any(_x is not None and {self.test(node, '_x')} for _x in {fetch})"
        return f"(bool({items} := {fetch}) and not any(_x is not None and {found} for _x in {items}))"

    def test(self, node: Compare | In, var: str) -> str:
        """The test of one present value ``var``."""
        if isinstance(node, In):
            plain = frozenset(v for v in node.values if not isinstance(v, tuple))
            parts = []
            if plain:
                parts.append(f"{var} in {self.constant(plain)}")
            ranges = [v for v in node.values if isinstance(v, tuple)]
            parts += [f"{self.constant(lo)} <= {var} <= {self.constant(hi)}" for lo, hi in ranges]
            test = " or ".join(parts)
            return f"(not ({test}))" if node.negate else f"({test})"
        if node.op == "contains":
            return f"({self.constant(node.value)} in {var})"
        if node.op == "matches":
            return f"({self.constant(node.value)}.search({var}) is not None)"
        return f"({var} {node.op} {self.constant(node.value)})"


def compile_tree(tree: Node) -> Callable[[dict], bool]:
    """One Python function ``record -> bool`` for the tree (its source compiled once)."""
    code = _PythonCode()
    body = code.source(tree)
    source = f"def _display_filter(r):\n    return {body}\n"
    namespace = dict(code.namespace)
    exec(compile(source, "<display filter>", "exec"), namespace)  # noqa: S102 - our own generated source
    function = namespace["_display_filter"]
    function.source = source
    return function


def compile_filter(text: str) -> Callable[[dict], bool]:
    """The expression as one function ``record -> bool``; FilterError if it is not one."""
    return compile_tree(parse(text))


# ---------------------------------------------------------------- Spark


def spark_predicate(tree: Node, column_of: Callable[[str], Any] | None = None):
    """The tree as a ``pyspark.sql.Column`` (imports pyspark); ``column_of(name)`` gives a field's
    column (default: the column of that name, as in a table of flat records)."""
    from pyspark.sql import functions as F  # noqa: N812

    false = F.lit(False)
    column_of = column_of or F.col

    def lit(field: Field, value: Any):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return F.lit(value)
        if field.kind == "u64" or isinstance(value, int) and not -(2**63) <= value < 2**63:
            # exact, compared with the unsigned value (u64_column); a long literal would overflow
            return F.lit(Decimal(repr(value)) if isinstance(value, float) else Decimal(value))
        return F.lit(value)

    def test(node: Compare | In, column):
        field = node.field
        if field.kind == "u64":
            column = u64_column(column)
        if isinstance(node, In):
            plain = [lit(field, v) for v in node.values if not isinstance(v, tuple)]
            parts = [column.isin(*plain)] if plain else []
            parts += [
                column.between(lit(field, lo), lit(field, hi))
                for lo, hi in (v for v in node.values if isinstance(v, tuple))
            ]
            found = parts[0]
            for part in parts[1:]:
                found = found | part
            return ~found if node.negate else found
        if node.op == "contains":
            return column.contains(F.lit(node.value))
        if node.op == "matches":
            return column.rlike("(?i)" + node.value.pattern)
        value = lit(field, node.value)
        return {
            "==": column == value,
            "!=": column != value,
            "<": column < value,
            "<=": column <= value,
            ">": column > value,
            ">=": column >= value,
        }[node.op]

    def sure(column):
        return F.coalesce(column, false)  # null (an absent field) is false, so not works as in Python

    def build(node: Node):
        if isinstance(node, Or):
            out = build(node.items[0])
            for item in node.items[1:]:
                out = out | build(item)
            return out
        if isinstance(node, And):
            out = build(node.items[0])
            for item in node.items[1:]:
                out = out & build(item)
            return out
        if isinstance(node, Not):
            return ~build(node.item)
        field = node.field
        column = column_of(field.name)
        if field.sub is not None:
            column = F.transform(column, lambda e: e[field.sub])
        if isinstance(node, Present):
            return sure(column.isNotNull() & (F.size(column) > 0)) if field.many else column.isNotNull()
        if not field.many:
            return sure(test(node, column))
        negate = isinstance(node, In) and node.negate or isinstance(node, Compare) and node.op == "!="
        if negate:
            positive = (
                In(field, node.values, False) if isinstance(node, In) else Compare(field, "==", node.value)
            )
            return sure((F.size(column) > 0) & ~F.exists(column, lambda x: sure(test(positive, x))))
        return sure(F.exists(column, lambda x: sure(test(node, x))))

    return build(tree)


def u64_column(column):
    """A ``u64`` field's Spark column (a ``long`` of its 64 bits) as its exact unsigned value, a
    ``decimal(20,0)``: for comparing and ordering values from 2^63 up (imports pyspark)."""
    from pyspark.sql import functions as F  # noqa: N812

    exact = column.cast("decimal(20,0)")
    return F.when(column < 0, exact + F.lit(Decimal(2**64))).otherwise(exact).cast("decimal(20,0)")
