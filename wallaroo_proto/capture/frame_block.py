"""Frames as columns: many records of one connection in one object, never a dict per frame.

A plug-in that judges a run of frames at once (``dcp.core.Connection.process_run``)
hands the driver a ``FrameBlock`` instead of one record dict per frame: the fields
every frame of the block shares are given once, the others as one column (list)
each, ``None`` where a frame lacks the field. The views take what they need from
the columns: ``jsonl()`` the lines ``records.to_json`` makes of the same records,
byte for byte, ``rows()`` the record dicts, in the same key order.

Each layout (field order, which fields are shared, which are optional) gets one
generated function per view, so the work per frame is one f-string or one dict
display, with no loop over fields in Python.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from wallaroo_proto.records import FIELD_TYPES

#: ``json.dumps(s, ensure_ascii=False)`` of one string (the C encoder), as ``records.to_json`` writes it.
_string = json.encoder.encode_basestring
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

SHARED, COLUMN, OPTIONAL = "shared", "column", "optional"


class FrameBlock:
    """Records of consecutive frames as shared values and columns.

    ``layout``: (field name, SHARED | COLUMN | OPTIONAL) in record order;
    ``shared``: the SHARED fields' values; ``columns``: one sequence per other
    field, all as long as the block (an OPTIONAL column's ``None`` leaves the
    field out of that frame's record). The first field must be SHARED, and one at least a column.
    """

    __slots__ = ("layout", "shared", "columns", "size")

    def __init__(
        self, layout: tuple[tuple[str, str], ...], shared: dict[str, Any], columns: dict[str, Sequence]
    ) -> None:
        self.layout = layout
        self.shared = shared
        self.columns = columns
        self.size = len(next(iter(columns.values()))) if columns else 0

    def __len__(self) -> int:
        return self.size

    def _column_args(self) -> list[Sequence]:
        return [self.columns[name] for name, kind in self.layout if kind != SHARED]

    def jsonl(self) -> list[str]:
        """The records' JSONL lines (no newline), as ``records.to_json`` writes each record."""
        fragments = _fragments(self.layout, self.shared)
        return _jsonl_function(self.layout)(fragments, *self._column_args())

    def rows(self) -> list[dict]:
        """The record dicts, keys in record order."""
        shared = [self.shared[name] for name, kind in self.layout if kind == SHARED]
        return _rows_function(self.layout)(shared, *self._column_args())


def _fragments(layout: tuple[tuple[str, str], ...], shared: dict[str, Any]) -> list[str]:
    """The JSON text of each stretch of consecutive shared fields, the comma before it included."""
    out: list[str] = []
    text = None
    for name, kind in layout:
        if kind == SHARED:
            text = ("{" if not out and text is None else (text or "") + ",") + f"{_string(name)}:"
            text += _encode(shared[name])
        elif text is not None:
            out.append(text)
            text = None
    if text is not None:
        out.append(text)
    return out


def _value(kind: str, var: str) -> str:
    """The f-string replacement field writing one value of a field of type ``kind`` as JSON."""
    if kind in ("int", "long", "u64"):
        return f"{{{var}}}"
    if kind == "string":
        return f"{{_string({var})}}"
    return f"{{_encode({var})}}"


@cache
def _jsonl_function(layout: tuple[tuple[str, str], ...]) -> Callable[..., list[str]]:
    """One f-string per line: shared stretches as variables, labels as literal text."""
    parts: list[str] = []
    labels: list[str] = []
    variables: list[str] = []
    fragments = 0
    in_shared = False
    for name, kind in layout:
        if kind == SHARED:
            if not in_shared:
                parts.append(f"{{f{fragments}}}")
                fragments += 1
            in_shared = True
            continue
        in_shared = False
        var = f"c{len(variables)}"
        variables.append(var)
        label = f",{_string(name)}:"
        value = _value(FIELD_TYPES.get(name, "string"), var)
        if kind == COLUMN:
            parts.append(label.replace("{", "{{").replace("}", "}}") + value)
        else:
            labels.append(label)
            inner = f'f"{{L{len(labels) - 1}}}{value}"'
            parts.append(f'{{"" if {var} is None else {inner}}}')
    parts.append("}}")
    line = "f'" + "".join(parts) + "'"
    columns = ", ".join(f"col{v}" for v in variables)
    source = (
        f"def jsonl(fragments, {columns}):\n"
        f"    {''.join(f'f{n}, ' for n in range(fragments))}= fragments\n"
        + (f"    {''.join(f'L{n}, ' for n in range(len(labels)))}= {labels!r}\n" if labels else "")
        + f"    return [{line} for {''.join(f'{v}, ' for v in variables)}in zip({columns})]\n"
    )
    return _compile(source, "jsonl")


@cache
def _rows_function(layout: tuple[tuple[str, str], ...]) -> Callable[..., list[dict]]:
    """One dict display per record up to its first optional field, then one statement a field."""
    shared_vars: list[str] = []
    variables: list[str] = []
    head: list[str] = []
    tail: list[str] = []
    for name, kind in layout:
        if kind == SHARED:
            var = f"s{len(shared_vars)}"
            shared_vars.append(var)
        else:
            var = f"c{len(variables)}"
            variables.append(var)
        if kind == OPTIONAL:
            tail.append(f"        if {var} is not None: d[{name!r}] = {var}\n")
        elif tail:
            tail.append(f"        d[{name!r}] = {var}\n")
        else:
            head.append(f"{name!r}: {var}")
    columns = ", ".join(f"col{v}" for v in variables)
    source = (
        f"def rows(shared, {columns}):\n"
        f"    {''.join(f'{v}, ' for v in shared_vars)}= shared\n"
        "    out = []\n"
        f"    for {''.join(f'{v}, ' for v in variables)}in zip({columns}):\n"
        f"        d = {{{', '.join(head)}}}\n" + "".join(tail) + "        out.append(d)\n"
        "    return out\n"
    )
    return _compile(source, "rows")


def _compile(source: str, name: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"_string": _string, "_encode": _encode}
    exec(compile(source, f"<frame_block {name}>", "exec"), namespace)  # noqa: S102 - our own template
    return namespace[name]
