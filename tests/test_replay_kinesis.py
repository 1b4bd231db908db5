"""The Kinesis replay adapter, sans-IO: lines written by hand from the MLD notes, and the sample capture.

Daemon lines are the Java MLD's compact JSON, processor lines kclpy's ``json.dumps`` (the
notes' "Exact MLD output" and "Exact kclpy output"), without their line ends, as a
recording's frames hold them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from wallaroo_proto.protocols.kinesis import replay as kinesis_replay
from wallaroo_proto.replay import adapter as adapters
from wallaroo_proto.replay import recording
from wallaroo_proto.replay.recording import Frame

CAPTURE = Path(__file__).resolve().parent.parent / "captures" / "kinesis-session.pcap"

INIT = (
    b'{"action":"initialize","shardId":"shardId-000000000001","sequenceNumber":"TRIM_HORIZON",'
    b'"subSequenceNumber":0}'
)


def records(*seqs: str, sub: int = 0) -> bytes:
    one = (
        '{"data":"a2l0dGVu","partitionKey":"some cats","sequenceNumber":"%s",'
        '"approximateArrivalTimestamp":1700000000123,"subSequenceNumber":%d,"action":"record"}'
    )
    body = ",".join(one % (seq, sub) for seq in seqs)
    return f'{{"action":"processRecords","records":[{body}],"millisBehindLatest":0}}'.encode()


def status(action: str) -> bytes:
    return b'{"action": "status", "responseFor": "%s"}' % action.encode()


def ask(seq: str | None, sub: str = "0") -> bytes:
    number = b"null" if seq is None else b'"%s"' % seq.encode()
    return b'{"action": "checkpoint", "sequenceNumber": %s, "subSequenceNumber": %s}' % (number, sub.encode())


def reply(seq: str | None, error: str | None = None, sub: str = "0") -> bytes:
    number = b"null" if seq is None else b'"%s"' % seq.encode()
    err = b"null" if error is None else b'"%s"' % error.encode()
    return b'{"action":"checkpoint","sequenceNumber":%s,"subSequenceNumber":%s,"error":%s}' % (
        number,
        sub.encode(),
        err,
    )


def frame(sender: str, kind: str, raw: bytes, **fields) -> Frame:
    return Frame(0, {"sender": sender, "type": kind, "conn_index": 1, **fields}, raw)


def live(sender: str, kind: str, raw: bytes) -> tuple[dict, bytes]:
    """A live frame as the engine hands it over: the dissector's record and the line's bytes."""
    return {"sender": sender, "type": kind, "conn_index": 1, "length": len(raw)}, raw


def daemon_after_a_batch(*seqs: str) -> kinesis_replay.Adapter:
    """Playing the daemon: initialize answered, a batch of ``seqs`` sent."""
    played = kinesis_replay.Adapter("daemon")
    assert played.outgoing(frame("daemon", "initialize", INIT)) == INIT + b"\n"
    played.incoming(*live("processor", "status", status("initialize")))
    assert played.outgoing(frame("daemon", "processRecords", records(*seqs))) == records(*seqs) + b"\n"
    return played


def test_the_plugin_gives_this_adapter_and_its_noise():
    assert adapters.module("kinesis") is kinesis_replay
    noise = adapters.noise("kinesis")
    assert {"line_number", "length", "millis_behind_latest"} <= noise
    assert not {"sequence_number", "sub_sequence_number", "response_for", "checkpoint_error"} & noise


# ----------------------------------------------------------------------------- playing the daemon


def test_a_reply_echoes_what_the_live_processor_asked():
    played = daemon_after_a_batch("4955", "4956")
    played.expected(frame("processor", "checkpoint", ask("4956")))
    recorded_reply = frame("daemon", "checkpoint", reply("4956"))
    held = played.outgoing(recorded_reply)
    assert isinstance(held, adapters.Hold) and "checkpoint" in held.reason  # nothing asked yet
    played.incoming(*live("processor", "checkpoint", ask("4955")))
    assert played.outgoing(recorded_reply) == reply("4955") + b"\n"


def test_the_same_ask_gets_the_recorded_reply_and_its_error():
    played = daemon_after_a_batch("4955", "4956")
    played.expected(frame("processor", "checkpoint", ask("4956")))
    played.incoming(*live("processor", "checkpoint", ask("4956")))
    recorded = reply("4956", "ThrottlingException")
    assert played.outgoing(frame("daemon", "checkpoint", recorded)) == recorded + b"\n"


def test_another_ask_gets_the_checkpointers_own_answer():
    played = daemon_after_a_batch("4955", "4956")
    played.expected(frame("processor", "checkpoint", ask("4956")))
    played.incoming(*live("processor", "checkpoint", ask("4957")))  # beyond the last record sent
    out = played.outgoing(frame("daemon", "checkpoint", reply("4956")))
    assert out == reply("4957", "IllegalArgumentException") + b"\n"


def test_a_recorded_circumstantial_error_stays_when_the_ask_differs():
    played = daemon_after_a_batch("4955", "4956")
    played.expected(frame("processor", "checkpoint", ask("4956")))
    played.incoming(*live("processor", "checkpoint", ask("4955")))
    out = played.outgoing(frame("daemon", "checkpoint", reply("4956", "ThrottlingException")))
    assert out == reply("4955", "ThrottlingException") + b"\n"


def test_a_request_waits_for_the_live_processors_status():
    played = daemon_after_a_batch("4955")
    ended = frame("daemon", "shardEnded", b'{"action":"shardEnded"}')
    held = played.outgoing(ended)
    assert isinstance(held, adapters.Hold) and "status for processRecords" in held.reason
    played.incoming(*live("processor", "status", status("processRecords")))
    assert played.outgoing(ended) == b'{"action":"shardEnded"}\n'


def test_a_checkpoint_the_recording_never_had_is_owed_its_reply():
    played = daemon_after_a_batch("4955", "4956")
    assert played.owed() is None
    record, raw = live("processor", "checkpoint", ask("4956"))
    played.incoming(record, raw)
    due = played.owed()
    assert due is not None and due[0] is record and due[1] == reply("4956") + b"\n"
    assert played.owed() is None  # answered once
    ended = frame("daemon", "shardEnded", b'{"action":"shardEnded"}')
    assert isinstance(played.outgoing(ended), adapters.Hold)  # its status still to come
    played.incoming(*live("processor", "status", status("processRecords")))
    assert played.outgoing(ended) == b'{"action":"shardEnded"}\n'


def test_a_recorded_checkpoint_is_not_owed_twice():
    played = daemon_after_a_batch("4955", "4956")
    played.expected(frame("processor", "checkpoint", ask("4956")))
    played.incoming(*live("processor", "checkpoint", ask("4956")))
    assert played.owed() is None  # the recorded reply answers it


def test_a_recorded_reply_the_live_processor_never_asked_for_is_not_sent():
    played = daemon_after_a_batch("4955", "4956")
    played.expected(frame("processor", "checkpoint", ask("4956")))
    played.incoming(*live("processor", "status", status("processRecords")))
    assert played.outgoing(frame("daemon", "checkpoint", reply("4956"))) == adapters.SKIP


def test_the_captures_daemon_side_goes_as_recorded_to_its_own_processor():
    """The sample capture's daemon lines, each after the recorded processor's lines before it."""
    conv = recording.find(CAPTURE, connections=("1",))
    played = kinesis_replay.Adapter("daemon")
    sent = 0
    for f in recording.frames(conv):
        if f.sender == "daemon":
            assert played.outgoing(f) == f.raw + b"\n", f.record
            sent += 1
        else:
            played.expected(f)
            played.incoming(f.record, f.raw)
            assert played.owed() is None
    assert sent == 6


# ----------------------------------------------------------------------------- playing the processor


def processor_after_a_batch(recorded: tuple[str, ...], seen: tuple[str, ...]) -> kinesis_replay.Adapter:
    """Playing the processor: initialize answered; a batch recorded as ``recorded`` came live as ``seen``."""
    played = kinesis_replay.Adapter("processor")
    played.expected(frame("daemon", "initialize", INIT))
    played.incoming(*live("daemon", "initialize", INIT))
    assert played.outgoing(frame("processor", "status", status("initialize"))) == status("initialize") + b"\n"
    played.expected(frame("daemon", "processRecords", records(*recorded)))
    played.incoming(*live("daemon", "processRecords", records(*seen)))
    return played


def test_a_checkpoint_asks_for_the_live_record_at_the_recorded_ones_place():
    played = processor_after_a_batch(("4955", "4956"), ("7001", "7002"))
    out = played.outgoing(frame("processor", "checkpoint", ask("4956")))
    assert out == b"\n" + ask("7002") + b"\n"  # kclpy's bytes, as recorded
    recorded_reply = frame("daemon", "checkpoint", reply("4956"), sequence_number="4956")
    assert played.expected(recorded_reply)["sequence_number"] == "7002"


def test_a_checkpoint_keeps_the_recorded_writers_style_and_a_null_subsequence_number():
    played = processor_after_a_batch(("4955", "4956"), ("7001", "7002"))
    compact = b'{"action":"checkpoint","sequenceNumber":"4955","subSequenceNumber":null}'
    out = played.outgoing(frame("processor", "checkpoint", compact))
    assert out == b'{"action":"checkpoint","sequenceNumber":"7001","subSequenceNumber":null}\n'


def test_numbers_of_no_recorded_record_go_as_they_are():
    played = processor_after_a_batch(("4955", "4956"), ("7001", "7002"))
    assert played.outgoing(frame("processor", "checkpoint", ask("1234"))) == ask("1234") + b"\n"


def test_the_same_numbers_live_send_the_recorded_bytes():
    played = processor_after_a_batch(("4955", "4956"), ("4955", "4956"))
    assert played.outgoing(frame("processor", "checkpoint", ask("4956"))) == ask("4956") + b"\n"


def test_a_status_names_the_live_daemons_pending_request_and_waits_for_one():
    played = kinesis_replay.Adapter("processor")
    answer = frame("processor", "status", status("initialize"))
    held = played.outgoing(answer)
    assert isinstance(held, adapters.Hold) and "request" in held.reason
    played.incoming(*live("daemon", "initialize", INIT))
    played.outgoing(answer)
    played.incoming(*live("daemon", "leaseLost", b'{"action":"leaseLost"}'))
    out = played.outgoing(frame("processor", "status", status("shardEnded")))
    assert out == b"\n" + status("leaseLost") + b"\n"


def test_a_line_that_is_no_message_goes_as_recorded():
    played = kinesis_replay.Adapter("processor")
    debug = b"a debug line on stdout, which the daemon skips"
    assert played.outgoing(frame("processor", "SKIPPED", debug)) == debug + b"\n"


def test_an_unknown_side_is_refused():
    with pytest.raises(ValueError, match="unknown side"):
        kinesis_replay.Adapter("client")


def test_a_processors_answers_match_within_their_request_and_the_rest_in_order():
    """A checkpoint the recording never had (during the first batch) is not taken for the recorded
    one at the shard's end: the daemon played numbers the requests the answers came during."""
    played = daemon_after_a_batch("4955")
    extra, raw = live("processor", "checkpoint", ask("4955"))
    played.incoming(extra, raw)
    assert played.owed() is not None
    played.incoming(*live("processor", "status", status("processRecords")))
    ended = b'{"action":"shardEnded"}'
    assert played.outgoing(frame("daemon", "shardEnded", ended)) == ended + b"\n"
    recorded = played.expected(frame("processor", "checkpoint", ask(None, "null")))
    assert kinesis_replay.match_key(extra) == (2,) and kinesis_replay.match_key(recorded) == (3,)
    assert kinesis_replay.match_key({"type": "processRecords", "sequence_number": "4955"}) == (None,)


def test_places_are_kept_for_a_window_of_records_only(monkeypatch):
    monkeypatch.setattr(kinesis_replay, "WINDOW", 2)
    played = processor_after_a_batch(("4955", "4956", "4957"), ("7001", "7002", "7003"))
    assert len(played._recorded_at) == len(played._live_at) == 2
    assert played.outgoing(frame("processor", "checkpoint", ask("4955"))) == ask("4955") + b"\n"  # gone
    played.incoming(*live("daemon", "checkpoint", reply("4955", "IllegalArgumentException")))
    assert played.outgoing(frame("processor", "checkpoint", ask("4957"))) == b"\n" + ask("7003") + b"\n"
