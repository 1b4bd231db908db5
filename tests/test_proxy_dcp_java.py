"""Couchbase's own DCP client (java-dcp-client) through ``proxy`` into dcp mock-producer.

The producer's bucket config names its own node by KV port only (no hostname), and the
client goes on to that port at the host it first connected to: so the proxy listens on
the producer's port number on another loopback address (127.0.0.1 in front of 127.0.0.2),
as a proxy in front of a real node listens on the client's host at 11210. Every connection
of the client then passes the proxy.

The client is compiled and run as in test_dcp_java.py (same driver, same helpers).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Server, run_cli
from test_dcp_java import classpath, live_keys, producer_keys, stream  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e

LOGIN = ("default", "Administrator", "password", "2000")


@contextlib.contextmanager
def behind_proxy(producer_args: tuple[str, ...], *proxy_args: str) -> Iterator[tuple[Server, Server]]:
    """A producer on 127.0.0.2 and a proxy on 127.0.0.1 at the same port; a few tries in case
    that port is taken on 127.0.0.1."""
    for attempt in range(5):
        producer = Server("dcp", "mock-producer", "--listen", "127.0.0.2:0", *producer_args)
        try:
            proxy = Server(
                "proxy", "--listen", f"127.0.0.1:{producer.port}", "--upstream", producer.address, *proxy_args
            )
        except RuntimeError as err:
            producer.kill()
            if "cannot listen" not in str(err) or attempt == 4:
                raise
            continue
        with producer, proxy:
            yield producer, proxy
        return


def items_of(events: list[list[str]]) -> list[tuple[str, str]]:
    return [(e[1], e[2]) for e in events if e[0] in ("MUTATION", "DELETION")]


def summary_of(stdout: str) -> str:
    """The proxy's summary: its stdout after the ready line."""
    return stdout.split("\n", 1)[1].strip()


def test_the_client_streams_every_item_once_through_the_proxy_and_its_summary_is_dissects(
    classpath,  # noqa: F811
    tmp_path: Path,
) -> None:
    state, recording = tmp_path / "p.json", tmp_path / "proxy.pcap"
    args = ("--vbuckets", "8", "--items", "200", "--state", str(state), "--format", "json")
    with behind_proxy(args, "--record", str(recording)) as (producer, proxy):
        rc, events = stream(classpath, proxy, *LOGIN)
        code, stdout, stderr = proxy.stop()
        _, produced, _ = producer.stop()
    assert rc == 0, events[-5:]
    assert sorted((e[1], e[2]) for e in events if e[0] == "END") == [(str(vb), "OK") for vb in range(8)]
    items = items_of(events)
    assert len(items) == len(set(items))
    assert live_keys(events) == {vb: keys for vb, keys in producer_keys(state).items() if keys}
    # The proxy saw it all and found nothing wrong; the producer neither.
    assert code == 0, stderr
    assert "violation" not in stderr.lower() and "fault" not in stderr
    sent = json.loads(produced.splitlines()[-1])
    assert not sent["violations"] and sent["items_sent"] == len(items)
    # Its summary is dissect's of its recording, and the recording holds every item once.
    summary = run_cli("dissect", str(recording), "--summary")
    assert summary.returncode == 0, summary.stderr
    assert summary_of(stdout) == summary.stdout.strip()
    assert "DCP_BUFFER_ACKNOWLEDGEMENT" in summary.stdout
    frames = run_cli(
        "dissect", str(recording), "--format", "jsonl", "-Y", "type in {DCP_MUTATION DCP_DELETION}"
    )
    assert frames.returncode == 0, frames.stderr
    seen = [json.loads(line) for line in frames.stdout.splitlines()]
    assert sorted((str(r["vbucket"]), str(r["seqno"])) for r in seen) == sorted(items)
    assert {r["verdict"] for r in seen} == {"accepted"}


def test_an_injected_rollback_is_recovered_from_and_every_item_still_arrives(
    classpath,  # noqa: F811
    tmp_path: Path,
) -> None:
    state, recording = tmp_path / "p.json", tmp_path / "proxy.pcapng"
    rule = "rollback type=DCP_STREAM_REQ where='vbucket == 2' count=1"
    args = ("--vbuckets", "4", "--items", "100", "--state", str(state), "--format", "json")
    with behind_proxy(args, "--fault", rule, "--record", str(recording)) as (producer, proxy):
        rc, events = stream(classpath, proxy, *LOGIN)
        code, stdout, stderr = proxy.stop()
        _, produced, _ = producer.stop()
    # The client: its onRollback fired once, for vbucket 2 to 0, and it still got every item once.
    assert rc == 0, events[-5:]
    assert [e for e in events if e[0] == "ROLLBACK"] == [["ROLLBACK", "2", "0"]]
    assert sorted((e[1], e[2]) for e in events if e[0] == "END") == [(str(vb), "OK") for vb in range(4)]
    items = items_of(events)
    assert len(items) == len(set(items))
    assert live_keys(events) == producer_keys(state)
    # The producer answered the changed request itself (one rollback), and saw nothing wrong.
    sent = json.loads(produced.splitlines()[-1])
    assert sent["rollbacks"] == 1 and not sent["violations"] and sent["items_sent"] == len(items)
    # The proxy: one fault line, at the client's stream request, and no violation on either side.
    assert code == 0, stderr
    faults = [line for line in stderr.splitlines() if " fault " in line]
    assert len(faults) == 1, stderr
    assert re.fullmatch(
        r"wallaroo-proto proxy: connection #\d+ fault rollback at client→upstream frame \d+ DCP_STREAM_REQ: "
        r"the frame not forwarded, then the stream request changed so that the producer rolls it back to 0 "
        r"\(72 bytes\) sent to the upstream",
        faults[0],
    )
    assert "violation" not in stderr.lower()
    # matched: the stream request it changed and the client's next one for vbucket 2, which passed.
    assert f"fault --fault {rule!r}: matched 2, applied 1" in " ".join(stdout.split())  # as wrapped
    shown = summary_of(stdout)
    assert shown.count("rollbacks     vb 2 to 0") == 2  # on the client's side and on the producer's
    assert "violations    0" in shown and "violations    1" not in shown
    # The recording: vbucket 2's stream requests as each side had them, the fault a note on the client's.
    asked = run_cli("dissect", str(recording), "-Y", "type == DCP_STREAM_REQ and vbucket == 2")
    assert asked.returncode == 0, asked.stderr
    client_side, upstream_side, *again = asked.stdout.splitlines()
    assert "start=0 " in client_side and "note: fault rollback at client→upstream frame" in client_side
    assert "start=1 uuid=0x0" in upstream_side and "note" not in upstream_side
    assert again and all("start=0 " in line and "note" not in line for line in again)


def test_a_stream_ended_too_slow_is_reopened_by_the_client_and_nothing_is_lost(
    classpath,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Ddriver.endsOk=true")  # done once every stream ended OK
    state, recording = tmp_path / "p.json", tmp_path / "proxy.pcapng"
    rule = "stream-end where='vbucket == 2' skip=30 reason=too_slow"
    args = ("--vbuckets", "4", "--items", "100", "--state", str(state), "--format", "json")
    with behind_proxy(args, "--fault", rule, "--record", str(recording)) as (producer, proxy):
        rc, events = stream(classpath, proxy, *LOGIN)
        code, stdout, stderr = proxy.stop()
        _, produced, _ = producer.stop()
    # The client: vbucket 2 ended TOO_SLOW once, it asked again from where it was, and it got
    # every item once; every stream ended OK at last.
    assert rc == 0, events[-5:]
    ends = [(e[1], e[2]) for e in events if e[0] == "END"]
    assert ends.count(("2", "TOO_SLOW")) == 1 and sorted(set(ends) - {("2", "TOO_SLOW")}) == [
        (str(vb), "OK") for vb in range(4)
    ]
    items = items_of(events)
    assert len(items) == len(set(items))
    assert live_keys(events) == producer_keys(state)
    # The producer: nobody broke a rule (the close is in the recording, below).
    sent = json.loads(produced.splitlines()[-1])
    assert not sent["violations"]
    # The proxy: the stream closed upstream and ended toward the client at one of vbucket 2's
    # messages, then that stream's messages in flight and the close's answer withheld; the
    # reopened stream's messages passed.
    assert code == 0, stderr
    faults = [line.split(" fault ", 1)[1] for line in stderr.splitlines() if " fault " in line]
    assert re.fullmatch(
        r"stream-end at upstream→client frame \d+ DCP_\w+: the frame not forwarded, then a CLOSE_STREAM of "
        r"vbucket 2 \(24 bytes\) sent to the upstream, then a STREAM_END \(too_slow\) of vbucket 2 "
        r"\(28 bytes\) sent to the client(, then a BUFFER_ACKNOWLEDGEMENT of the \d+ bytes withheld \(\d+ "
        r"bytes\) sent to the upstream)?",
        faults[0],
    ), faults[0]
    withheld = re.compile(
        r"DCP_\w+: the frame not forwarded(, then a BUFFER_ACKNOWLEDGEMENT of the \d+ bytes withheld "
        r"\(\d+ bytes\) sent to the upstream)?$"
    )
    passed = re.compile(
        r"DCP_\w+: not applied: passed on: (no stream's message|this rule has ended its 1 stream)"
    )
    assert all(withheld.search(f) or passed.search(f) for f in faults[1:]), faults
    assert sum(f.endswith("DCP_CLOSE_STREAM_RESPONSE: the frame not forwarded") for f in faults) == 1
    assert "violation" not in stderr.lower()
    # The recording: the end on the client's side only; the close on the producer's.
    ended = run_cli("dissect", str(recording), "-Y", "type == DCP_CLOSE_STREAM or end_reason == too_slow")
    assert ended.returncode == 0, ended.stderr
    lines = ended.stdout.splitlines()
    assert len(lines) == 2, lines
    closed, ended_too_slow = sorted(lines, key=lambda line: "DCP_STREAM_END" in line)
    assert "DCP_CLOSE_STREAM" in closed and "vb=2" in closed
    assert (
        "DCP_STREAM_END" in ended_too_slow
        and "vb=2" in ended_too_slow
        and "reason=too_slow" in ended_too_slow
    )


def test_a_not_my_vbucket_carries_the_producers_cluster_map_and_the_client_asks_again(
    classpath,  # noqa: F811
    tmp_path: Path,
) -> None:
    state, log = tmp_path / "p.json", tmp_path / "client.log"
    recording = tmp_path / "proxy.pcapng"
    rule = "not-my-vbucket type=DCP_STREAM_REQ where='vbucket == 1' count=1"
    args = ("--vbuckets", "4", "--items", "60", "--state", str(state), "--format", "json")
    with behind_proxy(args, "--fault", rule, "--record", str(recording)) as (producer, proxy):
        rc, events = stream(classpath, proxy, *LOGIN, log=log)
        code, stdout, stderr = proxy.stop()
        _, produced, _ = producer.stop()
    # The client read the cluster map in the answer's body, asked again, and got every item once.
    assert rc == 0, events[-5:]
    assert sorted((e[1], e[2]) for e in events if e[0] == "END") == [(str(vb), "OK") for vb in range(4)]
    items = items_of(events)
    assert len(items) == len(set(items))
    assert live_keys(events) == producer_keys(state)
    client = log.read_text()
    assert "Received bucket config from NotMyVbucket" in client
    assert "Rescheduling Stream Start for vbid 1 due to" in client
    # The producer answered NOT_MY_VBUCKET once (to the request for vbucket 0xffff).
    sent = json.loads(produced.splitlines()[-1])
    assert sent["not_my_vbucket"] == 1 and not sent["violations"]
    # The proxy: one fault line, no violation.
    assert code == 0, stderr
    faults = [line.split(" fault ", 1)[1] for line in stderr.splitlines() if " fault " in line]
    assert len(faults) == 1 and re.fullmatch(
        r"not-my-vbucket at client→upstream frame \d+ DCP_STREAM_REQ: the frame not forwarded, "
        r"then the stream request for vbucket 65535, which no node holds \(72 bytes\) sent to the upstream",
        faults[0],
    ), faults
    assert "violation" not in stderr.lower()
    assert f"fault --fault {rule!r}: matched 2, applied 1" in " ".join(stdout.split())
    # The recording: the request for vbucket 0xffff on the producer's side, and the same answer,
    # the cluster map (rev 1) in its body, on both.
    asked = run_cli("dissect", str(recording), "-Y", "vbucket == 65535 or status == NOT_MY_VBUCKET")
    assert asked.returncode == 0, asked.stderr
    request, *answers = asked.stdout.splitlines()
    assert "DCP_STREAM_REQ\t" in request and "vb=65535" in request
    assert len(answers) == 2 and all("status=NOT_MY_VBUCKET" in a and "config_rev=1" in a for a in answers)


def test_withheld_buffer_acks_stall_the_producer_at_its_window(
    classpath,  # noqa: F811
    tmp_path: Path,
) -> None:
    state, recording = tmp_path / "p.json", tmp_path / "proxy.pcapng"
    args = ("--vbuckets", "4", "--items", "100", "--state", str(state), "--format", "json")
    with behind_proxy(args, "--fault", "stall-buffer-ack", "--record", str(recording)) as (producer, proxy):
        # The client waits 20 s after it starts streaming for what never comes, then gives up.
        rc, events = stream(classpath, proxy, *LOGIN, timeout=20)
        code, stdout, stderr = proxy.stop()
        _, produced, _ = producer.stop()
    # The client got the producer's window's worth and then nothing: no stream ended.
    assert rc == 3 and events[-1] == ["TIMEOUT", "4"], events[-5:]
    items = items_of(events)
    assert items and not [e for e in events if e[0] == "END"]
    sent = json.loads(produced.splitlines()[-1])
    assert sent["items_sent"] == len(items) < 400 and not sent["violations"]
    # Each side as recorded: the client acknowledged, the producer heard none of it, and its
    # window (2000 bytes) filled and stayed full.
    records = run_cli("dissect", str(recording), "--summary", "--format", "json")
    assert records.returncode == 0, records.stderr
    summaries = [entry["summary"] for entry in json.loads(records.stdout)]
    client_side = [s for s in summaries if " > 127.0.0.1:" in s["connection"]]  # to the proxy
    producer_side = [s for s in summaries if " > 127.0.0.2:" in s["connection"]]
    acks = sum(s["packets_by_type"].get("DCP_BUFFER_ACKNOWLEDGEMENT", 0) for s in client_side)
    assert acks >= 1 and not any("DCP_BUFFER_ACKNOWLEDGEMENT" in s["packets_by_type"] for s in producer_side)
    streaming = [s for s in producer_side if s["streams"]]
    assert len(streaming) == 1 and streaming[0]["acked_bytes"] == 0
    assert streaming[0]["flow_control_stalls"] >= 1 and streaming[0]["buffer_size"] == 2000
    # The proxy: each acknowledgement a fault line, and no violation.
    assert code == 0, stderr
    faults = [line.split(" fault ", 1)[1] for line in stderr.splitlines() if " fault " in line]
    assert len(faults) == acks and all(
        re.fullmatch(
            r"stall-buffer-ack at client→upstream frame \d+ DCP_BUFFER_ACKNOWLEDGEMENT: "
            r"dropped: not forwarded to the upstream",
            f,
        )
        for f in faults
    ), faults
    assert "violation" not in stderr.lower()
