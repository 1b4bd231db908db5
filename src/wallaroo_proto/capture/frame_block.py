"""Frames in blocks: many records of one connection in one object, never a dict per frame.

A plug-in that takes a run of frames in one loop (Wallaroo's plain MESSAGEs, the
DCP producer's stream through ``dcp.core.Connection.feed_run``) hands the
driver a ``FrameBlock`` instead of one record dict per frame: the fields every
frame of the block shares are given once, the others as one tuple per frame
(``None`` where a frame lacks an optional field). The views take what they need:
``jsonl()`` the lines ``records.to_json`` makes of the same records, byte for
byte; ``records()`` the record dicts, in the same key order; ``columns()`` one
sequence per field, for Arrow.

Each layout (field order, which fields are shared, which are optional) gets one
generated function per view, so the work per frame is one f-string or one dict
display, with no loop over fields in Python. A tracker may add rows to the block
it made last while that block is still the last thing it handed out
(``extends``), so a packet of one frame costs no block of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any

from wallaroo_proto.protocols import schema

#: ``json.dumps(s, ensure_ascii=False)`` of one string (the C encoder), as ``records.to_json`` writes it.
_string = json.encoder.encode_basestring
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

SHARED, COLUMN, OPTIONAL = "shared", "column", "optional"
#: A column of strings that never need escaping (base64, hex, names), written between quotes as they are.
PLAIN = "plain"
#: Rows a block takes before a tracker starts another (the driver's batches stay small).
MAX_ROWS = 64


class FrameBlock:
    """Records of consecutive frames of one connection as shared values and rows.

    ``layout``: (field name, SHARED | COLUMN | PLAIN | OPTIONAL) in record order;
    ``shared``: the SHARED fields' values; ``rows``: one tuple per frame of the
    other fields' values in layout order (an OPTIONAL field's ``None`` leaves it
    out of that frame's record; a ``double`` must be finite). The first field must be SHARED.
    """

    __slots__ = ("layout", "shared", "rows")

    def __init__(
        self, layout: tuple[tuple[str, str], ...], shared: dict[str, Any], rows: list[tuple]
    ) -> None:
        self.layout = layout
        self.shared = shared
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def extends(self, out: list) -> bool:
        """May rows still be added: it is the last item of ``out`` and not full."""
        return bool(out) and out[-1] is self and len(self.rows) < MAX_ROWS

    def columns(self) -> dict[str, tuple]:
        """Each non-shared field's values, in row order."""
        names = [name for name, kind in self.layout if kind != SHARED]
        if not self.rows:
            return dict.fromkeys(names, ())
        return dict(zip(names, zip(*self.rows, strict=True), strict=True))

    def jsonl(self) -> list[str]:
        """The records' JSONL lines (no newline), as ``records.to_json`` writes each record."""
        return _jsonl_function(self.layout)(_fragments(self.layout, self.shared), self.rows)

    def records(self) -> list[dict]:
        """The record dicts, keys in record order."""
        shared = [self.shared[name] for name, kind in self.layout if kind == SHARED]
        return _records_function(self.layout)(shared, self.rows)


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
    if kind == "double":  # finite, as timestamps are: json writes NaN and Infinity, repr does not
        return f"{{{var}!r}}"
    return f"{{_encode({var})}}"


@cache
def _jsonl_function(layout: tuple[tuple[str, str], ...]) -> Callable[..., list[str]]:
    """One f-string per line: shared stretches as variables, labels as literal text.

    A ``double`` column (a timestamp, the same object on every frame of a packet) is
    written once per new value: ``repr`` of a float costs more than the rest of a line.
    """
    parts: list[str] = []
    labels: list[str] = []
    variables: list[str] = []
    doubles: list[str] = []
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
        field_type = schema.field_types().get(name, "string")
        if kind == COLUMN and field_type == "double":
            doubles.append(var)
            parts.append(f"{label}{{t{var}}}")
            continue
        value = _value(field_type, var)
        if kind == PLAIN:
            parts.append(f'{label}"{{{var}}}"')
        elif kind == COLUMN:
            parts.append(label + value)
        else:
            labels.append(label)
            inner = f'f"{{L{len(labels) - 1}}}{value}"'
            parts.append(f'{{"" if {var} is None else {inner}}}')
    parts.append("}}")
    line = "f'" + "".join(parts) + "'"
    head = "def jsonl(fragments, rows):\n"
    head += f"    {''.join(f'f{n}, ' for n in range(fragments))}= fragments\n"
    if labels:
        head += f"    {''.join(f'L{n}, ' for n in range(len(labels)))}= {labels!r}\n"
    target = "".join(f"{v}, " for v in variables)
    if not doubles:
        return _compile(head + f"    return [{line} for {target}in rows]\n", "jsonl")
    body = "    out = []\n    append = out.append\n"
    body += "".join(f"    last{v} = t{v} = None\n" for v in doubles)
    body += f"    for {target}in rows:\n"
    for v in doubles:
        body += f"        if {v} is not last{v}:\n            last{v}, t{v} = {v}, repr({v})\n"
    body += f"        append({line})\n    return out\n"
    return _compile(head + body, "jsonl")


@cache
def _records_function(layout: tuple[tuple[str, str], ...]) -> Callable[..., list[dict]]:
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
    source = (
        "def records(shared, rows):\n"
        f"    {''.join(f'{v}, ' for v in shared_vars)}= shared\n"
        "    out = []\n"
        f"    for {''.join(f'{v}, ' for v in variables)}in rows:\n"
        f"        d = {{{', '.join(head)}}}\n" + "".join(tail) + "        out.append(d)\n"
        "    return out\n"
    )
    return _compile(source, "records")


def _compile(source: str, name: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"_string": _string, "_encode": _encode}
    exec(compile(source, f"<frame_block {name}>", "exec"), namespace)  # noqa: S102 - our own template
    return namespace[name]
