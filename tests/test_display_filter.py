"""Display filters (``-Y``): the compiled function against a plain evaluation written here.

The property test draws an expression as a small tree of its own (``Leaf``, ``Both``,
``Either``, ``Negated``), renders it as text in tshark's spellings and checks that
``compile_filter(text)`` agrees, record by record, with ``oracle`` below, a slow
reading of the documented semantics that shares no code with the module. Records
come from the sample captures and from hypothesis.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import run_cli

from wallaroo_proto.capture.dissector import iter_records
from wallaroo_proto.capture.pcap import CaptureError
from wallaroo_proto.display_filter import FilterError, compile_filter
from wallaroo_proto.protocols.schema import field_types, structs

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
NUMBERS = {"int", "long", "u64", "double"}
KEYWORDS = {
    "and",
    "or",
    "not",
    "in",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "contains",
    "matches",
    "true",
    "false",
}


@cache
def sample_records() -> list[dict]:
    found = []
    for path in sorted(CAPTURES.glob("*.pcap*")):
        with contextlib.suppress(CaptureError):  # the records before the damage are in
            found.extend(iter_records(str(path)))
    return found


@cache
def fields() -> list[tuple[str, str, bool]]:
    """(name as written, element kind, is a list) for every field and struct key."""
    out = []
    for name, kind in field_types().items():
        if kind.startswith("array<struct:"):
            out += [(f"{name}.{k}", t, True) for k, t in structs()[kind[13:-1]]]
        elif kind.startswith("array<"):
            out.append((name, kind[6:-1], True))
        else:
            out.append((name, kind, False))
    return out


@cache
def busy_fields() -> list[tuple[str, str, bool]]:
    """Fields the samples fill often, lists among them: drawn half the time."""
    busy = {"type", "protocol", "stream_id", "length", "commit", "vbucket", "twopc", "notes", "violations"}
    busy |= {"txn_ids", "acks.stream_id", "worker_names", "message_types", "dcp_key", "stream_name"}
    return [f for f in fields() if f[0] in busy]


def values_of(record: dict, name: str) -> list | object:
    """The field's value (None when absent), or the list of its elements."""
    top, _, key = name.partition(".")
    value = record.get(top)
    if key:
        return [item.get(key) for item in value or []]
    return value


@cache
def seen() -> dict[str, list]:
    """Values each field takes in the samples: literals that match something."""
    out: dict[str, set] = {}
    for record in sample_records():
        for name, _, many in fields():
            value = values_of(record, name)
            for v in (value or []) if many else [value]:
                if v is not None:
                    out.setdefault(name, set()).add(v)
    return {k: sorted(v, key=repr)[:50] for k, v in out.items()}


# ---------------------------------------------------------------- the test's own trees


@dataclass(frozen=True)
class Leaf:
    field: str
    kind: str
    many: bool
    op: str  # ==, !=, <, <=, >, >=, contains, matches, in, not in, present
    value: object  # a literal, a regex text, or a list of literals and (low, high)
    text: str  # as rendered


@dataclass(frozen=True)
class Both:
    left: object
    right: object
    word: str


@dataclass(frozen=True)
class Either:
    left: object
    right: object
    word: str


@dataclass(frozen=True)
class Negated:
    item: object
    word: str


def compare(x, op: str, lit) -> bool:
    if op == "contains":
        return lit in x
    if op == "matches":
        return re.search(lit, x, re.IGNORECASE) is not None
    if op in ("in", "not in"):
        hits = [m[0] <= x <= m[1] if isinstance(m, tuple) else x == m for m in lit]
        return any(hits)
    return {
        "==": x == lit,
        "!=": x != lit,
        "<": x < lit,
        "<=": x <= lit,
        ">": x > lit,
        ">=": x >= lit,
    }[op]


def oracle(tree, record: dict) -> bool:
    if isinstance(tree, Both):
        return oracle(tree.left, record) and oracle(tree.right, record)
    if isinstance(tree, Either):
        return oracle(tree.left, record) or oracle(tree.right, record)
    if isinstance(tree, Negated):
        return not oracle(tree.item, record)
    value = values_of(record, tree.field)
    if tree.many:
        present = [v for v in value or [] if v is not None]
        if tree.op == "present":
            return bool(value)
        if not value:
            return False
        if tree.op == "!=":  # it has elements and none equals
            return not any(compare(v, "==", tree.value) for v in present)
        if tree.op == "not in":
            return not any(compare(v, "in", tree.value) for v in present)
        return any(compare(v, tree.op, tree.value) for v in present)
    if tree.op == "present":
        return value is not None
    if value is None:  # an absent field fails every comparison, != too
        return False
    if tree.op == "not in":
        return not compare(value, "in", tree.value)
    return compare(value, tree.op, tree.value)


def render(tree) -> str:
    if isinstance(tree, Leaf):
        return tree.text
    if isinstance(tree, Negated):
        inner = render(tree.item)
        if not isinstance(tree.item, Leaf):
            inner = f"({inner})"
        return f"{tree.word} {inner}" if tree.word != "!" else f"!{inner}"
    if isinstance(tree, Both):  # and binds tighter than or: an or inside needs parentheses
        parts = [f"({render(s)})" if isinstance(s, Either) else render(s) for s in (tree.left, tree.right)]
        return f" {tree.word} ".join(parts)
    return f"{render(tree.left)} {tree.word} {render(tree.right)}"


# ---------------------------------------------------------------- strategies

_plain_word = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def string_text(draw, value: str) -> str:
    if _plain_word.fullmatch(value) and value.lower() not in KEYWORDS and draw(st.booleans()):
        return value
    body = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{body}"'


def literal(draw, name: str, kind: str):
    """(value, text) of a literal for the field: often one the samples hold."""
    known = seen().get(name, [])
    if kind == "boolean":
        value = draw(st.booleans())
        return value, draw(st.sampled_from(["true", "TRUE", "1"] if value else ["false", "False", "0"]))
    if kind in NUMBERS:
        if known and draw(st.booleans()):
            value = draw(st.sampled_from(known))
        elif kind == "double":
            value = draw(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12))
        else:
            value = draw(st.integers(min_value=-10, max_value=2**64 - 1) | st.integers(-3, 300))
        if isinstance(value, int) and value >= 0 and draw(st.booleans()):
            return value, hex(value)
        return value, repr(value)
    if known and draw(st.booleans()):
        value = draw(st.sampled_from(known))
    else:
        value = draw(st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=8))
    return value, string_text(draw, value)


@st.composite
def leaves(draw) -> Leaf:
    name, kind, many = draw(st.sampled_from(fields()) | st.sampled_from(busy_fields()))
    ops = ["present", "==", "!=", "in", "not in"]
    if kind != "boolean":
        ops += ["<", "<=", ">", ">="]
    if kind == "string":
        ops += ["contains", "matches"]
    op = draw(st.sampled_from(ops))
    if op == "present":
        return Leaf(name, kind, many, op, None, name)
    if op in ("in", "not in"):
        members, texts = [], []
        for _ in range(draw(st.integers(1, 4))):
            low, low_text = literal(draw, name, kind)
            if kind != "boolean" and draw(st.integers(0, 3)) == 0:
                high, high_text = literal(draw, name, kind)
                members.append((low, high))
                texts.append(f"{low_text}..{high_text}")
            else:
                members.append(low)
                texts.append(low_text)
        sep = draw(st.sampled_from([" ", ", ", ","]))
        return Leaf(name, kind, many, op, tuple(members), f"{name} {op} {{{sep.join(texts)}}}")
    if op == "matches":
        known = [v for v in seen().get(name, []) if v]
        if known and draw(st.booleans()):
            source = draw(st.sampled_from(known))
            start = draw(st.integers(0, len(source) - 1))
            pattern = re.escape(source[start : start + draw(st.integers(1, 4))])
            pattern = draw(st.sampled_from(["", "^"])) + pattern.lower()
        else:
            pattern = draw(st.sampled_from(["^M", "ACK$", "a.c", "[0-9]+", "e", "^$", "_R(EQ|SP)"]))
        return Leaf(
            name,
            kind,
            many,
            op,
            pattern,
            f"{name} {draw(st.sampled_from(['matches', '~']))} {string_text(draw, pattern)}",
        )
    if op == "contains":
        known = [v for v in seen().get(name, []) if v]
        if known and draw(st.booleans()):
            source = draw(st.sampled_from(known))
            start = draw(st.integers(0, len(source) - 1))
            value = source[start : start + draw(st.integers(1, 5))]
        else:
            value = draw(st.text(max_size=3))
        return Leaf(name, kind, many, op, value, f"{name} contains {string_text(draw, value)}")
    value, text = literal(draw, name, kind)
    words = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
    spelled = draw(st.sampled_from([op, words[op]]))
    return Leaf(name, kind, many, op, value, f"{name} {spelled} {text}")


expressions = st.recursive(
    leaves(),
    lambda inner: st.one_of(
        st.builds(Both, inner, inner, st.sampled_from(["and", "&&", "AND"])),
        st.builds(Either, inner, inner, st.sampled_from(["or", "||"])),
        st.builds(Negated, inner, st.sampled_from(["not", "!"])),
    ),
    max_leaves=6,
)


@st.composite
def made_records(draw) -> dict:
    """A record with random fields of the right kinds (absent, None, empty lists included)."""
    record = {}
    for name, kind in draw(st.lists(st.sampled_from(list(field_types().items())), max_size=12)):
        if draw(st.integers(0, 5)) == 0:
            record[name] = None
            continue
        scalar = {
            "string": st.text(max_size=6) | st.sampled_from(seen().get(name, ["x"])),
            "int": st.integers(-(2**31), 2**31 - 1),
            "long": st.integers(-(2**63), 2**63 - 1),
            "u64": st.integers(0, 2**64 - 1) | st.sampled_from(seen().get(name, [0])),
            "double": st.floats(allow_nan=False, allow_infinity=False),
            "boolean": st.booleans(),
        }
        if kind.startswith("array<struct:"):
            keys = structs()[kind[13:-1]]
            item = st.fixed_dictionaries({k: st.integers(0, 2**64 - 1) | st.integers(0, 20) for k, _ in keys})
            record[name] = draw(st.lists(item, max_size=3))
        elif kind.startswith("array<"):
            record[name] = draw(st.lists(scalar["string"], max_size=3))
        else:
            record[name] = draw(scalar[kind])
    return record


@pytest.fixture(scope="module", autouse=True)
def _samples_read():
    """Read the samples before hypothesis draws from them (their reading is not a strategy's)."""
    seen()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=expressions, made=st.lists(made_records(), max_size=5))
def test_compiled_filter_agrees_with_plain_evaluation(tree, made):
    text = render(tree)
    keep = compile_filter(text)
    for record in sample_records() + made:
        assert keep(record) is oracle(tree, record), (text, record)


def test_samples_give_the_property_test_matches_and_misses():
    """The samples are varied enough that a filter both keeps and drops frames."""
    keep = compile_filter("type == MESSAGE or dcp_opcode >= 0x57")
    kept = sum(map(keep, sample_records()))
    assert 0 < kept < len(sample_records())


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("text", "column", "message"),
    [
        ("type == MESSAGE and strem_id == 3", 21, "unknown field 'strem_id' (did you mean stream_id?)"),
        ("stream_id == abc", 14, "stream_id is a number (u64); 'abc' is not"),
        ("stream_id contains 1", 11, "contains needs a string field; stream_id is u64"),
        ("commit > true", 8, "commit is true or false: only == and != apply"),
        ("commit == maybe", 11, "commit is true or false; 'maybe' is neither"),
        ("(type == OK", 12, "expected ')' to close column 1, found the end"),
        ("type == OK)", 11, "expected and, or or the end, found ')'"),
        ("type = OK", 6, "unexpected character '='"),
        ('type == "OK', 9, "a string without its closing quote"),
        ('type matches "("', 14, "bad regular expression"),
        ("stream_id in {}", 11, "an empty set"),
        ("stream_id in 1", 14, "expected '{' after in"),
        ("acks == 1", 1, "acks is a list of structs: compare one key, e.g. acks.KEY"),
        ("acks.stream == 1", 1, "acks has no key 'stream'"),
        ("", 1, "an empty expression"),
        ("type ==", 8, "expected a value for type, found the end"),
        ("and", 1, "unknown field 'and'"),
    ],
)
def test_a_bad_expression_says_what_and_at_which_column(text, column, message):
    with pytest.raises(FilterError) as caught:
        compile_filter(text)
    assert caught.value.column == column
    assert str(caught.value).startswith(f"column {column}: {message}")


def test_absent_fields_fail_every_comparison_but_not_its_negation():
    record = {"type": "OK"}
    assert not compile_filter("stream_id != 3")(record)
    assert compile_filter("not stream_id == 3")(record)
    assert not compile_filter("violations")({"violations": []})
    assert compile_filter("violations")({"violations": ["x"]})
    assert compile_filter("acks.stream_id in {2 7..9}")({"acks": [{"stream_id": 1}, {"stream_id": 8}]})
    assert not compile_filter("acks.stream_id != 8")({"acks": [{"stream_id": 1}, {"stream_id": 8}]})
    assert compile_filter('type matches "^ok$"')(record)
    assert not compile_filter('type contains "o"')(record)


# ---------------------------------------------------------------- the commands


def jsonl(*args: str) -> list[dict]:
    import json

    done = run_cli("dissect", *args, "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


SOURCE = str(CAPTURES / "source-session.pcap")
SINK = str(CAPTURES / "sink-2pc.pcap")
DCP = str(CAPTURES / "dcp-stream.pcap")


def test_dissect_filters_by_each_operator_on_the_samples():
    everything = jsonl(SOURCE, SINK, DCP)
    cases = {
        "type == NOTIFY": lambda r: r["type"] == "NOTIFY",
        "type eq NOTIFY || type == ACK": lambda r: r["type"] in ("NOTIFY", "ACK"),
        "stream_id != 11": lambda r: r.get("stream_id") is not None and r["stream_id"] != 11,
        "length < 30": lambda r: r["length"] < 30,
        "length le 30 and packet >= 10": lambda r: r["length"] <= 30 and r["packet"] >= 10,
        "message_id > 3": lambda r: r.get("message_id") is not None and r["message_id"] > 3,
        'stream_name contains "ord"': lambda r: "ord" in (r.get("stream_name") or ""),
        'type matches "^dcp_.*req$"': lambda r: re.search("^dcp_.*req$", r["type"], re.I) is not None,
        "type in {HELLO, OK} and not protocol == dcp": lambda r: (
            r["type"] in ("HELLO", "OK") and r["protocol"] != "dcp"
        ),
        "vbucket in {0..3}": lambda r: r.get("vbucket") is not None and 0 <= r["vbucket"] <= 3,
        "twopc": lambda r: r.get("twopc") is not None,
        "!(protocol == wallaroo) && (opaque == 0x0 || seqno)": lambda r: (
            r["protocol"] != "wallaroo" and (r.get("opaque") == 0 or r.get("seqno") is not None)
        ),
    }
    for expression, expected in cases.items():
        wanted = [r for r in everything if expected(r)]
        assert wanted, expression  # each case keeps something...
        assert len(wanted) < len(everything), expression  # ...and drops something
        assert jsonl(SOURCE, SINK, DCP, "-Y", expression) == wanted, expression


def test_dissect_composes_y_with_the_options_and_counts_what_passed():
    got = jsonl(SOURCE, "-Y", "stream_id == 11", "--type", "message", "-c", "3")
    assert [(r["type"], r["stream_id"]) for r in got] == [("MESSAGE", 11)] * 3
    assert got[0]["packet"] > 6  # the NOTIFY of stream 11 (packet 6) was filtered out, not counted


def test_dissect_says_when_the_filter_matches_nothing():
    done = run_cli("dissect", SOURCE, "--type", "ack", "-Y", "stream_id > 1000")
    assert done.returncode == 0 and done.stdout == ""
    read = len(jsonl(SOURCE))
    assert done.stderr == (
        f"wallaroo-proto dissect: no frame matched --type ack -Y 'stream_id > 1000' ({read} frame(s) read)\n"
    )


@pytest.mark.parametrize("command", [["dissect"], ["report", "-o", "never.html"], ["spark-replay"]])
def test_a_bad_expression_is_one_line_and_exit_2_in_every_command(command, tmp_path):
    done = run_cli(*command, SOURCE, "-Y", "type == MESSAGE and strem_id == 3", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        f"wallaroo-proto {command[0]}: -Y: column 21: unknown field 'strem_id' (did you mean stream_id?)\n"
    )
    assert done.stdout == "" and not (tmp_path / "never.html").exists()


def test_report_draws_only_the_matching_frames(tmp_path):
    page = tmp_path / "r.html"
    every = run_cli("report", SINK, "-o", str(page))
    only = run_cli("report", SINK, "-o", str(page), "-Y", "type == MESSAGE")
    assert every.returncode == only.returncode == 0, only.stderr
    messages = len(jsonl(SINK, "-Y", "type == MESSAGE"))
    assert f", {messages} frames," in only.stderr
    assert f", {len(jsonl(SINK))} frames," in every.stderr
