"""dissect and report on damaged captures: any mutation of a sample capture, through every view
and through the report, ends with exit 0, 1 or 2 and a message, never a traceback. Each
protocol's samples get their own examples.

Mutations are those a broken disk, a cut transfer or a bad capture tool make: byte flips,
truncation, inserted and deleted bytes, duplicated packets. The command runs in-process
(click's CliRunner) so that a few hundred runs take seconds.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from support import packet_spans
from wallaroo_proto_cli.dissect import command
from wallaroo_proto_cli.dissect_view import _fields, _RichFrames
from wallaroo_proto_cli.report import command as report_command

from wallaroo_proto.capture.dissector import dissect
from wallaroo_proto.capture.reading import FrameFilter
from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.records import to_json

pytestmark = pytest.mark.e2e

CAPTURES = Path(__file__).resolve().parent.parent / "captures"
SAMPLES = {p.name: p.read_bytes() for p in sorted(CAPTURES.glob("*.pcap*"))}

#: The fields the views rely on; a view shows a record that has only these.
IDENTITY = ("capture", "connection", "conn_index", "ts", "ts_ns", "packet", "type")
#: The fields every record the dissector makes has, however damaged its frame (README).
ALWAYS = (*IDENTITY, "sender", "direction", "offset", "verdict")
#: And a Wallaroo record's: whether its connection is a source's or a sink's.
ALWAYS_WALLAROO = (*ALWAYS, "use")

#: Every view and format, and the filtered path (records judged one by one).
VIEWS = [
    [],
    ["-x"],
    ["--summary"],
    ["--summary", "--format", "jsonl"],
    ["--format", "jsonl"],
    ["--format", "jsonl", "--stream", "1"],
    ["--strict"],
    ["--type", "message", "--type", "phase1", "--since", "0.001"],
]


def kinesis_late_start() -> bytes:
    """A Kinesis MLD conversation (hand-written lines: the daemon compact, kclpy's between blank
    lines) whose capture starts late, in the daemon's first batch, and lost the processor's
    checkpoint: the first whole line is the daemon's checkpoint reply, and which side is the
    daemon must be told from the lines alone. Read with ``--protocol kinesis --port 7300``."""
    batch = (
        b'{"action":"processRecords","records":[{"data":"YQ==","partitionKey":"k","sequenceNumber":"%d",'
        b'"approximateArrivalTimestamp":1,"subSequenceNumber":0,"action":"record"}],"millisBehindLatest":0}\n'
    )
    turns = [
        (
            True,
            b'{"action":"initialize","shardId":"shardId-0","sequenceNumber":"TRIM_HORIZON","subSequenceNumber":0}\n',
        ),
        (False, b'\n{"action": "status", "responseFor": "initialize"}\n'),
        (True, batch % 11),
        (False, b'\n{"action": "checkpoint", "sequenceNumber": "11", "subSequenceNumber": 0}\n'),
        (True, b'{"action":"checkpoint","sequenceNumber":"11","subSequenceNumber":0,"error":null}\n'),
        (False, b'\n{"action": "status", "responseFor": "processRecords"}\n'),
        (True, batch % 12),
        (False, b'\n{"action": "status", "responseFor": "processRecords"}\n'),
        (True, b'{"action":"leaseLost"}\n'),
        (False, b'\n{"action": "status", "responseFor": "leaseLost"}\n'),
    ]
    out = io.BytesIO()
    session = PcapWriter(out).tcp_session(("127.0.0.1", 40001), ("127.0.0.1", 7300), timestamp=1.0)
    for i, (from_daemon, line) in enumerate(turns):
        session.send(from_daemon, line, 2.0 + i / 1000)
    session.close(True, 3.0)
    data = out.getvalue()
    spans = packet_spans(data)  # the handshake, then one packet per line
    late, lost = spans[3 + 2], spans[3 + 3]  # from the first batch's packet; the checkpoint's is lost
    return data[:24] + data[late[0] : lost[0]] + data[lost[1] :]


SAMPLES["kinesis-late-start.pcap"] = kinesis_late_start()
#: The checkpoint reply's "error", its sign of the daemon: broken, the sides could be taken swapped.
KINESIS_ERROR_KEY = SAMPLES["kinesis-late-start.pcap"].index(b'"error"') + 1
#: Extra views for Kinesis samples: a connection on the processor port read as Kinesis.
KINESIS_VIEWS = [
    ["--protocol", "kinesis", "--port", "7300"],
    ["--protocol", "kinesis", "--port", "7300", "-x"],
]


def duplicate_packet(data: bytes, which: int) -> bytes:
    spans = packet_spans(data)
    if not spans:  # an earlier mutation left no packet whole enough to find
        return data
    start, end = spans[which % len(spans)]
    return data[:end] + data[start:end] + data[end:]


def apply(data: bytes, mutation: tuple) -> bytes:
    kind, where, arg = mutation
    if kind == "duplicate":
        return duplicate_packet(data, where)
    at = where % (len(data) + 1)
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ arg]) + data[at + 1 :] if at < len(data) else data
    if kind == "truncate":
        return data[:at]
    if kind == "insert":
        return data[:at] + arg + data[at:]
    return data[:at] + data[at + arg :]  # delete


positions = st.integers(0, 1 << 16)
mutation = st.one_of(
    st.tuples(st.just("flip"), positions, st.integers(1, 255)),
    st.tuples(st.just("truncate"), positions, st.none()),
    st.tuples(st.just("insert"), positions, st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), positions, st.integers(1, 16)),
    st.tuples(st.just("duplicate"), positions, st.none()),
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mutations")


def protocol_of(sample: str) -> str:
    """The sample's protocol, by its name's prefix (captures/README.md); the rest are Wallaroo's."""
    prefix = sample.split("-", 1)[0]
    return prefix if prefix in ("kinesis", "dcp", "ambrosia", "tremor") else "wallaroo"


PROTOCOLS = ("wallaroo", "kinesis", "dcp", "ambrosia", "tremor")
BY_PROTOCOL = {p: sorted(s for s in SAMPLES if protocol_of(s) == p) for p in PROTOCOLS}


def check_every_view(workdir: Path, sample: str, mutations: list) -> None:
    """The mutated capture through the dissector and every view: clean exits, no traceback."""
    data = SAMPLES[sample]
    for m in mutations:
        data = apply(data, m)
    records, _ = dissect(io.BytesIO(data))
    for r in records:
        always = ALWAYS_WALLAROO if r["protocol"] == "wallaroo" else ALWAYS
        assert all(name in r for name in always), (sample, mutations, r)
    path = workdir / sample
    path.write_bytes(data)
    runner = CliRunner()
    for view in VIEWS + (KINESIS_VIEWS if sample.startswith("kinesis") else []):
        result = runner.invoke(command, [*view, str(path)])
        where = f"dissect {' '.join(view)} on {sample} mutated by {mutations}"
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            where,
            result.exc_info,
        )
        assert result.exit_code in (0, 1, 2), (where, result.exit_code, result.output)
        assert "Traceback" not in result.stdout and "Traceback" not in result.stderr, where


# Per protocol, so that each gets its share of examples whatever the number of samples.
@pytest.mark.parametrize("protocol", sorted(BY_PROTOCOL))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), mutations=st.lists(mutation, min_size=1, max_size=4))
def test_any_mutation_through_any_view_exits_cleanly(workdir, protocol, data, mutations):
    check_every_view(workdir, data.draw(st.sampled_from(BY_PROTOCOL[protocol])), mutations)


@pytest.mark.parametrize(
    ("sample", "mutations"),
    [
        ("sink-2pc-ns.pcapng", [("flip", 409, 0x01)]),  # a HELLO cut short: framing breaks
        ("sink-2pc-ns.pcapng", [("flip", 48, 0x09)]),  # if_tsresol 0: years past 9999
        ("kinesis-late-start.pcap", [("flip", KINESIS_ERROR_KEY, 0x20)]),  # sides taken swapped
    ],
)
def test_mutations_found_before(workdir, sample, mutations):
    check_every_view(workdir, sample, mutations)


@pytest.mark.parametrize("protocol", sorted(BY_PROTOCOL))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), mutations=st.lists(mutation, min_size=1, max_size=4))
def test_any_mutation_through_report_exits_cleanly(workdir, protocol, data, mutations):
    sample = data.draw(st.sampled_from(BY_PROTOCOL[protocol]))
    captured = SAMPLES[sample]
    for m in mutations:
        captured = apply(captured, m)
    path = workdir / f"report-{sample}"
    path.write_bytes(captured)
    result = CliRunner().invoke(report_command, [str(path), "-o", str(workdir / "report.html")])
    where = f"report on {sample} mutated by {mutations}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (where, result.exc_info)
    assert result.exit_code in (0, 1, 2), (where, result.exit_code, result.output)
    assert "Traceback" not in result.output, where


def test_the_mutations_do_what_they_say():
    data = SAMPLES["source-session.pcap"]
    spans = packet_spans(data)
    assert spans[0][0] == 24 and spans[-1][1] == len(data)
    first = data[spans[0][0] : spans[0][1]]
    doubled = duplicate_packet(data, 0)
    assert len(doubled) == len(data) + len(first) and doubled[spans[0][1] :].startswith(first)
    ng = SAMPLES["sink-2pc-ns.pcapng"]
    assert packet_spans(ng) and all(ng[s : s + 4] == b"\x06\x00\x00\x00" for s, _ in packet_spans(ng))
    assert apply(b"abc", ("flip", 1, 0xFF)) == b"a\x9dc"
    assert apply(b"abc", ("truncate", 2, None)) == b"ab"
    assert apply(b"abc", ("insert", 1, b"xy")) == b"axybc"
    assert apply(b"abcdef", ("delete", 1, 2)) == b"adef"


def _sample_records() -> list[dict]:
    return [r for data in SAMPLES.values() for r in dissect(io.BytesIO(data), with_raw=True)[0]]


RECORDS = _sample_records()


@settings(max_examples=200, deadline=None)
@given(which=st.integers(0, len(RECORDS) - 1), data=st.data())
def test_views_show_what_a_record_holds(which, data):
    record = RECORDS[which]
    optional = sorted(k for k in record if k not in IDENTITY)
    dropped = data.draw(st.sets(st.sampled_from(optional)) if optional else st.just(set()))
    r = {k: v for k, v in record.items() if k not in dropped}
    out = io.StringIO()
    table = _RichFrames(Console(file=out, width=200), hexdump=True)
    table.add(r)
    table.flush()
    text = out.getvalue()
    # The type column is 17 wide: a longer name (AMBROSIA's TakeBecomingPrimaryCheckpoint) ends in "…".
    shown = r.get("twopc") or r["type"]
    assert str(r["packet"]) in text and (shown if len(shown) <= 17 else shown[:16] + "…") in text
    for label, k in (("stream", "stream_id"), ("id", "message_id")):
        if r["type"] == "MESSAGE" and not r.get("twopc") and r.get("verdict") != "malformed" and k in r:
            assert f"{label}={r[k]}" in _fields(r)
    keep = FrameFilter((1,), ("MESSAGE", "PHASE1"), ("1", "7100"), 0.0, 1e12)
    keep(r)
    assert to_json(r)


def test_a_record_without_sender_or_key_fields_is_shown():
    message = next(r for r in RECORDS if r["type"] == "MESSAGE" and r.get("key_len") and not r.get("twopc"))
    r = {k: v for k, v in message.items() if k not in ("sender", "key_b64", "key_len", "event_time")}
    out = io.StringIO()
    table = _RichFrames(Console(file=out, width=200), hexdump=False)
    table.add(r)
    table.flush()
    row = out.getvalue().splitlines()[1]
    assert " ? " in row and f"stream={r['stream_id']} id={r['message_id']}" in row and "key=" not in row
