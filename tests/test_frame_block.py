"""A FrameBlock's views equal what the record dicts it stands for give, for any layout and values."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from wallaroo_proto.capture.frame_block import COLUMN, OPTIONAL, PLAIN, SHARED, FrameBlock
from wallaroo_proto.protocols.schema import field_types
from wallaroo_proto.records import to_json

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
VALUES = {
    "string": TEXT,
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "u64": st.integers(0, 2**64 - 1),
    "double": st.floats(allow_nan=False, allow_infinity=False),
    "boolean": st.booleans(),
    "array<string>": st.lists(TEXT, max_size=3),
}
#: What a PLAIN column holds: text JSON writes as it is (base64 here).
BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
PLAIN_TEXT = st.text(alphabet=BASE64, max_size=12)
NAMES = [name for name, kind in field_types().items() if kind in VALUES and name not in ("capture", "offset")]


def _kinds(name: str) -> list[str]:
    return [SHARED, COLUMN, OPTIONAL] + ([PLAIN] if field_types()[name] == "string" else [])


@st.composite
def blocks(draw) -> tuple[FrameBlock, list[dict]]:
    """A block and the records it stands for, built field by field in layout order."""
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=12))
    layout = [("capture", SHARED), ("offset", COLUMN)]
    layout += [(n, draw(st.sampled_from(_kinds(n)))) for n in names]
    size = draw(st.integers(1, 5))
    shared = {n: draw(VALUES[field_types()[n]]) for n, kind in layout if kind == SHARED}
    columns = {}
    for name, kind in layout:
        if kind != SHARED:
            values = PLAIN_TEXT if kind == PLAIN else VALUES[field_types()[name]]
            if kind == OPTIONAL:
                values = st.none() | values
            columns[name] = draw(st.lists(values, min_size=size, max_size=size))
    rows = list(zip(*columns.values(), strict=True))
    records = []
    for i in range(size):
        record = {}
        for name, kind in layout:
            value = shared[name] if kind == SHARED else columns[name][i]
            if value is not None:
                record[name] = value
        records.append(record)
    return FrameBlock(tuple(layout), shared, rows), records


@given(blocks())
def test_rows_and_lines_are_the_records_and_their_json(case):
    block, records = case
    assert len(block) == len(records)
    assert block.records() == records
    assert [list(r) for r in block.records()] == [list(r) for r in records]  # the same key order
    assert block.jsonl() == [to_json(r) for r in records]
    columns = block.columns()
    assert list(columns) == [name for name, kind in block.layout if kind != SHARED]
    assert all(list(values) == [r.get(name) for r in records] for name, values in columns.items())
