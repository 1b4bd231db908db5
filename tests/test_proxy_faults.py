"""The proxy's fault rules: parsing, the sans-IO engine, the relay carrying its steps out over
real loopback sockets, and faults as pcapng comments that dissect and tshark read.

The engine is tested with a toy protocol written here (a frame: one length byte, then a
type letter and a body), so these tests hold whatever the five plug-ins' adapters do.
"""

from __future__ import annotations

import asyncio
import errno
import json
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import Server, run_cli, wait_for

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.pcap import MAX_PENDING_COMMENTS, keep_comment
from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols import get_plugin
from wallaroo_proto.protocols.wallaroo.codec import encode
from wallaroo_proto.protocols.wallaroo.frames import Message
from wallaroo_proto.proxy import faults
from wallaroo_proto.proxy.faultkit import FaultError, Frame, NamedFault, Send
from wallaroo_proto.proxy.relay import Relay


class ToyAdapter:
    """Frames: a length byte (of what follows), a type letter, a body."""

    def __init__(self) -> None:
        self.rest = {True: b"", False: b""}

    def frames(self, from_client: bool, data: bytes) -> list[bytes]:
        buf = self.rest[from_client] = self.rest[from_client] + data
        out = []
        while buf and len(buf) > buf[0]:
            if buf[0] == 0:
                raise ValueError("a frame of no length")  # everything since the last call is the tail
            out.append(buf[: buf[0] + 1])
            buf = buf[buf[0] + 1 :]
        self.rest[from_client] = buf
        return out

    def tail(self, from_client: bool) -> bytes:
        return self.rest[from_client]

    def fields(self, frame: bytes, from_client: bool) -> dict:
        return {"type": chr(frame[1]), "length": len(frame)}

    def rewrite(self, frame: Frame, field_name: str, value) -> bytes:
        if field_name != "type":
            raise FaultError(f"cannot rewrite {field_name!r} (can: type)")
        return frame.data[:1] + value.encode() + frame.data[2:]

    def error_frame(self, reason: str, to_client: bool) -> bytes | None:
        return b"\x01E"


def frame(kind: str, body: bytes = b"") -> bytes:
    return bytes([1 + len(body)]) + kind.encode() + body


def engine(*options: str, named: dict | None = None, monkeypatch=None) -> faults.ConnectionFaults:
    if named is not None:
        monkeypatch.setattr(faults, "named_faults", lambda protocol: named)
    rules = [
        faults.build_rule(faults.parse_option(o), o, "toy" if named is not None else None) for o in options
    ]
    return faults.ConnectionFaults(rules, "toy", adapter=ToyAdapter())


def sent(steps: list) -> list[tuple[bool, bytes]]:
    return [(s.to_upstream, s.data) for s in steps if type(s) is Send]


# ---------------------------------------------------------------- rules as written


def test_an_option_is_an_action_and_typed_keys() -> None:
    table = faults.parse_option(
        "rewrite type=A,B field=point_of_ref value=0 count=2 reset=true where='x == 1'"
    )
    assert table == {
        "action": "rewrite",
        "type": ["A", "B"],
        "field": "point_of_ref",
        "value": 0,
        "count": 2,
        "reset": True,
        "where": "x == 1",
    }


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("dorp type=ACK", "unknown action 'dorp' (did you mean drop?)"),
        ("drop typ=ACK", "unknown key 'typ' (did you mean type?)"),
        ("drop count=-1", "cannot be negative"),
        ("drop count=two", "count must be an integer, not 'two'"),
        ("delay type=ACK", "delay needs ms"),
        ("rewrite type=ACK field=x", "rewrite needs field and value"),
        ("drop field=x value=1", "field and value are for rewrite only"),
        ("drop direction=sideways", "direction must be one of upstream, client, both"),
        ("drop where=strem_id==1", "unknown field 'strem_id' (did you mean stream_id?)"),
        ("drop type=ACK oops", "'oops' is not key=value"),
        ("drop where='type == 1", "No closing quotation"),
    ],
)
def test_a_bad_rule_is_refused_naming_it_and_the_key(option: str, message: str) -> None:
    with pytest.raises(FaultError) as caught:
        faults.parse_rules([option])
    assert f"--fault {option!r}" in str(caught.value)
    assert message in str(caught.value)


def test_a_rules_file_is_fault_tables(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[fault]]\naction = "drop"\ntype = "ACK"\nwhere = "stream_id == 3"\ncount = 1\n')
    (rule,) = faults.parse_rules(files=[str(rules)], protocol="wallaroo")
    assert (rule.action, rule.types, rule.count, rule.text) == ("drop", {"ACK"}, 1, f"{rules}: fault #1")
    assert rule._match({"stream_id": 3}) and not rule._match({"stream_id": 4})
    rules.write_text('[[faults]]\naction = "drop"\n')
    with pytest.raises(FaultError, match=r"unknown table\(s\) faults"):
        faults.parse_rules(files=[str(rules)])
    rules.write_text("[[fault]]\naction = \n")
    with pytest.raises(FaultError, match=str(rules)):
        faults.parse_rules(files=[str(rules)])


def test_a_type_the_protocol_lacks_is_refused_with_a_suggestion() -> None:
    with pytest.raises(FaultError, match="'AKC' is not a wallaroo frame type.*did you mean ACK"):
        faults.parse_rules(["drop type=AKC"], protocol="wallaroo")


def test_an_unknown_action_lists_the_actions() -> None:
    with pytest.raises(FaultError) as caught:
        faults.parse_rules(["explode type=ACK"])
    said = str(caught.value)
    assert "unknown action 'explode' (actions: drop, delay, duplicate, reorder, rewrite, cut, stall, " in said
    assert all(f", {named}" in said for named in ("restart", "rollback", "checkpoint-error", "close"))
    with pytest.raises(FaultError) as caught:
        faults.parse_rules(["explode"], protocol="tremor")
    assert str(caught.value).endswith(
        "(actions: drop, delay, duplicate, reorder, rewrite, cut, stall, close)"
    )


def test_an_unknown_type_or_field_lists_the_known_ones() -> None:
    with pytest.raises(FaultError) as caught:
        faults.parse_rules(["drop type=AKC"], protocol="wallaroo")
    assert "(wallaroo types: ACK, EOS_MESSAGE, ERROR, HELLO, " in str(caught.value)
    with pytest.raises(FaultError) as caught:
        faults.parse_rules(["drop where='strem_id == 1'"])
    assert "unknown field 'strem_id' (did you mean stream_id?) (fields: " in str(caught.value)
    assert ", stream_id, " in str(caught.value)


def test_a_type_the_protocol_lacks_is_said_once_at_the_first_connection_of_that_protocol() -> None:
    rules = faults.parse_rules(["drop type=AKC", "delay type=ACK ms=1"])  # no --protocol: accepted
    first = faults.ConnectionFaults(rules, "wallaroo")
    said = [s.text for s in first.feed(True, b"\x00") if type(s) is faults.Said]
    assert said == [
        "--fault 'drop type=AKC': type 'AKC' is not a wallaroo frame type (did you mean ACK?) (wallaroo "
        f"types: {', '.join(get_plugin('wallaroo').type_names)}); it matches none of this connection's frames"
    ]
    assert not [s for s in first.feed(True, b"\x00") if type(s) is faults.Said]
    second = faults.ConnectionFaults(rules, "wallaroo")  # the rules are the proxy's: once for them all
    assert not [s for s in second.feed(True, b"\x00") if type(s) is faults.Said]
    other = faults.ConnectionFaults(rules, "tremor")  # another protocol's first connection says it again
    assert len([s for s in other.feed(True, b"G") if type(s) is faults.Said]) == 2


# ---------------------------------------------------------------- the engine


def test_without_rules_every_frame_passes_as_it_came_however_cut() -> None:
    shaper = engine()
    stream = frame("A", b"xyz") + frame("B") + frame("C", b"12")
    out = []
    for i in range(len(stream)):
        out += sent(shaper.feed(True, stream[i : i + 1]))
    assert out == [(True, frame("A", b"xyz")), (True, frame("B")), (True, frame("C", b"12"))]


def test_drop_skip_count_and_direction() -> None:
    shaper = engine("drop type=B skip=1 count=1 direction=upstream")
    steps = shaper.feed(True, frame("B") + frame("B") + frame("B"))
    assert sent(steps) == [(True, frame("B")), (True, frame("B"))]
    (applied,) = [s for s in steps if type(s) is faults.Applied]
    assert (applied.index, applied.what) == (2, "dropped: not forwarded to the upstream")
    assert sent(shaper.feed(False, frame("B"))) == [(False, frame("B"))]  # the other direction
    assert shaper.rules[0].seen == 3 and shaper.rules[0].fired == 1


def test_duplicate_reorder_and_delay() -> None:
    shaper = engine("duplicate type=A", "reorder type=B", "delay type=C ms=250")
    steps = shaper.feed(True, frame("A") + frame("B") + frame("D") + frame("C"))
    assert sent(steps) == [
        (True, frame("A")),
        (True, frame("A")),
        (True, frame("D")),
        (True, frame("B")),
        (True, frame("C")),
    ]
    wait = [s for s in steps if type(s) is faults.Wait]
    assert wait == [faults.Wait(0.25)]
    assert steps.index(wait[0]) < len(steps) - 1 and steps[-1] == Send(True, frame("C"))


def test_reorder_holds_one_frame_a_direction_however_many_match() -> None:
    shaper = engine("reorder type=B")
    steps = shaper.feed(True, frame("B", b"1") + frame("B", b"2") + frame("B", b"3") + frame("B", b"4"))
    # Each held frame is overtaken by the next, which is then not held itself.
    assert sent(steps) == [
        (True, frame("B", b"2")),
        (True, frame("B", b"1")),
        (True, frame("B", b"4")),
        (True, frame("B", b"3")),
    ]


def test_a_rule_that_could_not_act_is_not_used_up() -> None:
    shaper = engine("rewrite type=B field=length value=1 count=1")
    steps = shaper.feed(True, frame("B") + frame("B"))
    (rule,) = shaper.rules
    assert (rule.seen, rule.fired, rule.not_applied) == (2, 0, 2)  # tried again at the second B
    assert sent(steps) == [(True, frame("B")), (True, frame("B"))]


def test_first_bytes_too_few_to_tell_are_decided_when_the_relay_says_time_is_up() -> None:
    rules = [faults.build_rule(faults.parse_option("drop type=ACK"), "drop type=ACK")]
    shaper = faults.ConnectionFaults(rules, None, upstream_port=1)
    first = b"\x00\x00\x00"  # could open a Wallaroo length prefix, or not: too few to tell
    assert shaper.feed(True, first) == [] and shaper.deciding
    steps = shaper.settle()
    assert not shaper.deciding
    assert sent(steps) == [(True, first)]


def test_a_frame_held_for_reordering_goes_before_the_end() -> None:
    shaper = engine("reorder type=B")
    assert sent(shaper.feed(True, frame("B"))) == []
    assert sent(shaper.end(True)) == [(True, frame("B"))]


def test_cut_after_n_bytes_and_stall() -> None:
    shaper = engine("cut bytes=4 reset=true", "stall direction=client")
    steps = shaper.feed(True, frame("A", b"xy") + frame("B") + frame("C"))
    assert sent(steps) == [(True, frame("A", b"xy"))]
    assert faults.Close(reset=True) in steps
    steps = engine("stall direction=client").feed(False, frame("Z"))
    assert steps[-2:] == [faults.Stall(None), Send(False, frame("Z"))]


def test_frames_after_a_cut_are_neither_sent_nor_counted() -> None:
    """A busy peer's next frames, read with the one cut before (or after), are not cut again."""
    shaper = engine("cut type=A skip=1")
    steps = shaper.feed(True, frame("A") + frame("A") + frame("A") + frame("A"))
    steps += shaper.feed(True, frame("A")) + shaper.feed(False, frame("A"))
    assert sent(steps) == [(True, frame("A"))]
    assert [type(s) for s in steps].count(faults.Close) == 1
    (rule,) = shaper.rules
    assert (rule.seen, rule.fired) == (2, 1)


def test_rewrite_and_a_rewrite_the_frame_cannot_take() -> None:
    shaper = engine('rewrite type=A field=type value="Q"', "rewrite type=B field=length value=1")
    steps = shaper.feed(True, frame("A", b"1") + frame("B"))
    assert sent(steps) == [(True, frame("Q", b"1")), (True, frame("B"))]
    whats = [s.what for s in steps if type(s) is faults.Applied]
    assert whats == [
        "type set to 'Q', then forwarded to the upstream",
        "not applied: cannot rewrite 'length' (can: type)",
    ]


def test_a_named_fault_replies_in_place_of_the_frame(monkeypatch) -> None:
    def answer(frame_: Frame, params, adapter) -> list[Send]:
        return [Send(False, frame("R", bytes([params["code"]])))]

    named = {"refuse": NamedFault("answer R", 'type == "B"', {"code": (int, 7)}, act=answer)}
    shaper = engine("refuse code=9", named=named, monkeypatch=monkeypatch)
    steps = shaper.feed(True, frame("A") + frame("B"))
    assert sent(steps) == [(True, frame("A")), (False, frame("R", b"\x09"))]


def test_the_frame_a_fault_acts_at_is_taken_before_it_is_sent() -> None:
    shaper = engine("drop type=B")
    steps = shaper.feed(True, frame("B"))
    assert [type(s) for s in steps] == [faults.Applied, faults.Took]
    assert steps[1].data == frame("B")


def test_bytes_that_do_not_frame_pass_unframed_from_then_on_none_lost() -> None:
    shaper = engine("drop type=A")
    assert sent(shaper.feed(True, b"\x02B")) == []  # a frame begun
    steps = shaper.feed(True, b"x\x02Ay\x00junk")
    assert sent(steps) == [(True, b"\x02Bx\x02Ay\x00junk")]  # the adapter's tail: nothing lost
    assert sent(shaper.feed(True, frame("A"))) == [(True, frame("A"))]


def test_a_last_frame_cut_short_goes_on_when_its_side_ends() -> None:
    shaper = engine()
    assert sent(shaper.feed(True, frame("A") + b"\x05BC")) == [(True, frame("A"))]
    assert sent(shaper.end(True)) == [(True, b"\x05BC")]


@given(st.lists(st.sampled_from("ABCD"), max_size=30), st.data())
def test_any_cut_of_the_stream_gives_the_same_steps(kinds: list[str], data) -> None:
    stream = b"".join(frame(k, k.encode() * (i % 3)) for i, k in enumerate(kinds))
    rules = ("drop type=A count=2", "duplicate type=B skip=1", "reorder type=C")
    whole = sent(engine(*rules).feed(True, stream))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(stream)))))
    shaper, out, start = engine(*rules), [], 0
    for cut in [*cuts, len(stream)]:
        out += sent(shaper.feed(True, stream[start:cut]))
        start = cut
    assert out == whole
    assert sent(engine().feed(True, stream)) == [
        (True, frame(k, k.encode() * (i % 3))) for i, k in enumerate(kinds)
    ]


# ---------------------------------------------------------------- the relay carries the steps out


class Upstream:
    """A loopback server that keeps what it reads and sends what a test gives it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.got = b""
        self.conn: socket.socket | None = None
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.conn, _ = self.listener.accept()
        try:
            while chunk := self.conn.recv(65536):
                self.got += chunk
        except ConnectionResetError:
            self.got += b"<reset>"
        self.conn.close()  # the client's end passed on: ours goes back
        self.closed.set()


class EndsSeen:
    """A tap that keeps only how each recorded connection's sides ended."""

    congested = False  # its output never falls behind

    def __init__(self) -> None:
        self.ends: list[tuple[object, bool, bool]] = []

    async def room(self) -> None:
        pass

    def opened(self, *args) -> None:
        pass

    def data(self, *args) -> None:
        pass

    def note(self, *args) -> None:
        pass

    def ended(self, conn, from_client: bool, reset: bool, when: float) -> None:
        self.ends.append((conn, from_client, reset))


def relayed(*options: str, client_sends: bytes, tap=None):
    """A Relay with these rules between a loopback client and ``Upstream``; what each end got."""
    rules = [faults.build_rule(faults.parse_option(o), o) for o in options]
    upstream = Upstream()
    applied: list[faults.Applied] = []
    relay = Relay(
        ("127.0.0.1", 0),
        ("127.0.0.1", upstream.port),
        tap,
        faults=partial(faults.ConnectionFaults, rules, "toy", adapter=ToyAdapter()),
        on_fault=lambda conn, step: applied.append(step),
    )
    loop = asyncio.new_event_loop()
    port = loop.run_until_complete(relay.start())[1]
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        client = socket.create_connection(("127.0.0.1", port), timeout=60)
        client.sendall(client_sends)
        back = b""
        try:
            client.shutdown(socket.SHUT_WR)
            while chunk := client.recv(65536):
                back += chunk
        except ConnectionResetError:
            back += b"<reset>"
        except OSError as err:  # a reset that came before the half-close leaves nothing to shut down
            assert err.errno == errno.ENOTCONN, err
            back += b"<reset>"
        assert upstream.closed.wait(60), "the upstream never saw the end"
        client.close()
        return upstream.got, back, applied
    finally:
        asyncio.run_coroutine_threadsafe(relay.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(60)
        loop.close()


def test_the_relay_drops_duplicates_and_reorders_over_loopback() -> None:
    stream = frame("A") + frame("B", b"1") + frame("C") + frame("D")
    got, _, applied = relayed("drop type=A", "duplicate type=C", "reorder type=B", client_sends=stream)
    assert got == frame("C") + frame("C") + frame("B", b"1") + frame("D")  # B after C, sent twice
    assert [a.rule.action for a in applied] == ["drop", "reorder", "duplicate"]


def test_a_cut_with_reset_resets_both_sides() -> None:
    got, back, applied = relayed(
        "cut type=C reset=true", client_sends=frame("A") + frame("B") + frame("C") + frame("D")
    )
    assert got == frame("A") + frame("B") + b"<reset>"
    assert back == b"<reset>"
    assert [a.what for a in applied] == ["connection reset on both sides before it; it was not forwarded"]


def test_a_cut_is_recorded_as_the_proxy_ended_each_side() -> None:
    tap = EndsSeen()
    relayed("cut type=B", client_sends=frame("A") + frame("B"), tap=tap)
    # The proxy's FIN, then the peer's, on the client's side (the proxy is its server) and on
    # the upstream's (the proxy is its client).
    assert sorted(tap.ends[:4], key=str) == sorted(
        [((1, "client"), False, False), ((1, "client"), True, False)]
        + [((1, "upstream"), True, False), ((1, "upstream"), False, False)],
        key=str,
    )


# ---------------------------------------------------------------- faults as notes in the recording

# A Wallaroo HELLO, by hand from the spec: length 22, type 0, version "0.0.1", cookie "ck",
# program "prog", instance "i1" (each a u16 length and its bytes).
HELLO = bytes.fromhex("00000016000005 302e302e310002 636b0004 70726f670002 6931".replace(" ", ""))


def test_a_fault_is_a_comment_that_dissect_shows_as_a_note_and_tshark_reads(tmp_path: Path) -> None:
    path = tmp_path / "noted.pcapng"
    with PcapWriter(str(path), pcapng=True) as writer:
        session = writer.tcp_session(("127.0.0.1", 40000), ("127.0.0.1", 7100), timestamp=1.0)
        session.send(
            True,
            HELLO,
            1.5,
            "fault drop at client→upstream frame 1 HELLO: dropped: not forwarded to the upstream",
        )
        session.fin(True, 2.0)
    records = list(Dissector(str(path), ports=[7100]).run(str(path)))
    assert [r["type"] for r in records] == ["HELLO"]
    assert (
        "fault drop at client→upstream frame 1 HELLO: dropped: not forwarded to the upstream"
        in records[0]["notes"]
    )
    lines = [json.loads(line) for line in Dissector(str(path), ports=[7100]).run_jsonl(str(path))]
    assert [r["notes"] for r in lines] == [records[0]["notes"]]
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed: the comment was checked by dissect alone")
    out = subprocess.run(
        ["tshark", "-r", str(path), "-Y", "frame.comment", "-T", "fields", "-e", "frame.comment"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert (
        out.strip() == "fault drop at client→upstream frame 1 HELLO: dropped: not forwarded to the upstream"
    )


def test_a_pcap_packet_has_no_comment_and_a_pcapng_header_is_as_the_format_says(tmp_path: Path) -> None:
    path = tmp_path / "x.pcapng"
    PcapWriter(str(path), pcapng=True, nanoseconds=True).close()
    data = path.read_bytes()
    kind, length, magic, major, minor = struct.unpack_from("<IIIHH", data)
    assert (kind, length, magic, major, minor) == (0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0)
    kind, length, linktype = struct.unpack_from("<IIH", data, 28)
    assert (kind, linktype) == (1, 1)
    assert data[28 + 16 : 28 + 21] == bytes([9, 0, 1, 0, 9])  # if_tsresol = 10^-9


# ---------------------------------------------------------------- the command


def test_a_bad_rule_is_exit_2_with_the_reason() -> None:
    result = run_cli(
        "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9", "--fault", "dorp type=ACK"
    )
    assert result.returncode == 2
    assert "fault rules: --fault 'dorp type=ACK': unknown action 'dorp' (did you mean drop?)" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_cli("proxy", "--listen", ":0", "--listen", ":0", "--upstream", "127.0.0.1:9")
    assert result.returncode == 2
    assert "2 --listen but 1 --upstream: give them in pairs" in result.stderr


def _echo_upstream() -> tuple[socket.socket, threading.Thread]:
    """A server echoing every connection's bytes back, until the client's end."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                while chunk := conn.recv(65536):
                    conn.sendall(chunk)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_two_listen_upstream_pairs_are_served_each_to_its_own(tmp_path: Path) -> None:
    first, _ = _echo_upstream()
    second, _ = _echo_upstream()
    try:
        with Server(
            *("proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{first.getsockname()[1]}"),
            *("--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{second.getsockname()[1]}"),
            "--no-summary",
        ) as proxy:
            ready = proxy.lines[-1]
            ports = [int(p) for p in re.findall(r"listening on 127\.0\.0\.1:(\d+)", ready)]
            upstreams = [int(p) for p in re.findall(r"forwarding to 127\.0\.0\.1:(\d+)", ready)]
            assert upstreams == [first.getsockname()[1], second.getsockname()[1]] and len(ports) == 2
            for port, payload in zip(ports, (b"to the first", b"to the second"), strict=True):
                with socket.create_connection(("127.0.0.1", port), timeout=60) as client:
                    client.sendall(payload)
                    client.shutdown(socket.SHUT_WR)
                    got = b""
                    while chunk := client.recv(65536):
                        got += chunk
                assert got == payload
            code, _, stderr = proxy.stop()
        assert code == 0, stderr
    finally:
        first.close()
        second.close()


@pytest.mark.e2e
def test_the_summary_numbers_connections_as_the_fault_lines_and_names_each_side() -> None:
    with Server("mock-worker", "--port", "0", "--no-live") as worker:
        with Server(
            *("proxy", "--listen", "127.0.0.1:0", "--upstream", worker.address, "--no-live"),
            *("--fault", "restart skip=2 count=1"),
        ) as proxy:
            source = run_cli(
                "mock-source", "--connect", proxy.address, "-q", "--streams", "2", "--count", "200"
            )
            assert source.returncode == 0, source.stderr
            code, stdout, stderr = proxy.stop()
        worker.stop()
    assert code == 0, stderr
    assert "connection #1 fault restart" in stderr  # the RESTART ends #1: the source comes back as #2
    titles = re.findall(r"connection #(.+?)  \S+ > \S+  \(source\)", stdout)
    assert sorted(titles) == [f"{n} ({side} side)" for n in (1, 2) for side in ("client", "upstream")]


@pytest.mark.e2e
def test_a_type_the_detected_protocol_lacks_is_one_line_while_the_proxy_runs() -> None:
    with Server("mock-worker", "--port", "0", "--no-live") as worker:
        with Server(
            *("proxy", "--listen", "127.0.0.1:0", "--upstream", worker.address, "--no-live"),
            *("--fault", "drop type=AKC"),
        ) as proxy:
            for _ in range(2):
                source = run_cli("mock-source", "--connect", proxy.address, "-q", "--count", "10")
                assert source.returncode == 0, source.stderr
            wait_for(lambda: "AKC" in proxy.stderr(), "the line", 60)
            code, stdout, stderr = proxy.stop()
        worker.stop()
    assert code == 0, stderr
    [line] = [x for x in stderr.splitlines() if "AKC" in x]  # once, at the first connection
    assert line.startswith(
        "wallaroo-proto proxy: connection #1: --fault 'drop type=AKC': type 'AKC' is not a wallaroo "
        "frame type (did you mean ACK?) (wallaroo types: ACK, "
    )
    assert "fault --fault 'drop type=AKC': matched 0, applied 0" in stdout


def test_strict_closes_the_connection_at_its_first_violation_and_exits_1() -> None:
    upstream = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = upstream.accept()
        with conn:
            conn.settimeout(60)
            try:
                while chunk := conn.recv(65536):
                    seen.append(chunk)
            except OSError:
                pass
            seen.append(b"<end>")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with Server(
        *("proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{upstream.getsockname()[1]}"),
        *("--protocol", "wallaroo", "--strict", "--no-summary"),
    ) as proxy:
        client = socket.create_connection((proxy.host, proxy.port), timeout=60)
        client.sendall(HELLO)
        client.sendall(encode(Message(7, 1, 0, b"", b"on a stream never notified")))
        got = b""
        try:
            while chunk := client.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
        client.close()  # the proxy closed it: recv gave the end
        thread.join(60)
        code, _, stderr = proxy.stop()
    upstream.close()
    assert seen and seen[-1] == b"<end>", "the upstream's side was closed too"
    assert "client→upstream frame 1 MESSAGE" in stderr
    assert code == 1, stderr


def test_a_second_pair_waits_for_an_upstream_that_listens_once_the_first_is_accepted() -> None:
    second = socket.socket()  # bound, not listening: refuses connects until listen()
    second.bind(("127.0.0.1", 0))
    # The second pair's relay, as `proxy` makes it for a pair after the first.
    relay = Relay(("127.0.0.1", 0), second.getsockname(), wait_for_upstream=120)
    loop = asyncio.new_event_loop()
    port = loop.run_until_complete(relay.start())[1]
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        send = socket.create_connection(("127.0.0.1", port), timeout=60)
        deadline = time.monotonic() + 60
        while relay.stats.connect_retries == 0:  # refused at least once: what is waited out
            assert time.monotonic() < deadline, "the relay never tried the upstream"
            time.sleep(0.01)
        second.listen()
        other, _ = second.accept()
        other.sendall(b"from the second port")
        other.close()
        got = b""
        while chunk := send.recv(65536):
            got += chunk
        send.close()
        assert got == b"from the second port"
        assert relay.stats.refused_upstream == 0
    finally:
        asyncio.run_coroutine_threadsafe(relay.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(60)
        loop.close()
        second.close()


def test_first_bytes_that_cannot_tell_a_protocol_still_reach_a_waiting_upstream() -> None:
    echo, _ = _echo_upstream()
    try:
        with Server(
            *("proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{echo.getsockname()[1]}"),
            *("--fault", "drop type=ACK", "--no-summary"),
        ) as proxy:
            with socket.create_connection((proxy.host, proxy.port), timeout=60) as client:
                client.sendall(b"\x00\x00\x00")  # then waits for the answer, as a first sender may
                assert client.recv(65536) == b"\x00\x00\x00"
            code, _, stderr = proxy.stop()
        assert code == 0, stderr
    finally:
        echo.close()


def test_a_stalled_direction_ends_with_the_connection() -> None:
    upstream = socket.create_server(("127.0.0.1", 0))

    def greet_then_close() -> None:
        conn, _ = upstream.accept()
        with conn:
            conn.sendall(HELLO)  # a whole frame, stalled on its way to the client
            while conn.recv(65536):
                pass  # until the client's end, passed on

    threading.Thread(target=greet_then_close, daemon=True).start()
    try:
        with Server(
            *("proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{upstream.getsockname()[1]}"),
            *("--protocol", "wallaroo", "--fault", "stall direction=client", "--no-summary"),
        ) as proxy:
            with socket.create_connection((proxy.host, proxy.port), timeout=60) as client:
                client.sendall(HELLO)
                client.shutdown(socket.SHUT_WR)
                got = b""
                while chunk := client.recv(65536):  # the end comes, though nothing was forwarded
                    got += chunk
            assert got == b""
            code, _, stderr = proxy.stop()
        assert code == 0, stderr
    finally:
        upstream.close()


def test_comments_no_frame_takes_are_kept_in_bounded_memory() -> None:
    comments: dict[int, list[str]] = {}
    for packet in range(1, MAX_PENDING_COMMENTS + 100):
        keep_comment(comments, packet, [f"fault at {packet}"])
    assert len(comments) == MAX_PENDING_COMMENTS and next(iter(comments)) == 100  # the oldest went


def test_a_raw_packet_in_a_pcapng_file_is_a_pcapng_block(tmp_path: Path) -> None:
    path = tmp_path / "raw.pcapng"
    with PcapWriter(str(path), pcapng=True) as writer:
        session = writer.tcp_session(("127.0.0.1", 40000), ("127.0.0.1", 7100), timestamp=1.0)
        session.send(True, HELLO, 1.5)
    packets = [p for p in read_packets(path)]
    copy = tmp_path / "copy.pcapng"
    with PcapWriter(str(copy), pcapng=True) as writer:
        for ts_ns, data in packets:
            writer.write_raw(data, ts_ns)
    assert read_packets(copy) == packets


def read_packets(path: Path) -> list[tuple[int, bytes]]:
    """(timestamp ns, bytes) of every packet, by scapy's own pcapng reader."""
    from scapy.utils import RawPcapNgReader

    with RawPcapNgReader(str(path)) as reader:
        return [((m.tshigh << 32 | m.tslow) * 1_000_000_000 // m.tsresol, bytes(d)) for d, m in reader]


def test_a_rules_file_that_is_not_utf8_is_one_line_naming_it_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe[[fault]]\n")
    done = run_cli("proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9", "--faults", str(bad))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"wallaroo-proto proxy: fault rules: {bad}: not UTF-8 text (byte 0): a rules file is TOML"
    ]


def test_a_rule_of_count_0_is_refused() -> None:
    done = run_cli("proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9", "--fault", "drop count=0")
    assert done.returncode == 2
    assert "count must be at least 1" in done.stderr and "Traceback" not in done.stderr


def test_a_violation_is_held_against_a_peer_only_on_the_side_it_sent_from() -> None:
    """``relay.sent_by_a_peer``: with faults what the proxy sent on a side may be its own doing."""
    from wallaroo_proto.proxy.relay import sent_by_a_peer

    from_client = {"direction": "initiator→responder"}
    from_upstream = {"direction": "responder→initiator"}
    assert sent_by_a_peer(from_client, None) and sent_by_a_peer(from_upstream, None)  # no faults
    assert sent_by_a_peer(from_client, "client") and not sent_by_a_peer(from_client, "upstream")
    assert sent_by_a_peer(from_upstream, "upstream") and not sent_by_a_peer(from_upstream, "client")
