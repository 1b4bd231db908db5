"""Regenerate the synthetic sample captures in this folder (see README.md).

    python captures/make_samples.py

Frames come from the codec, packets from ``wallaroo_proto.pcap_writer``
(Ethernet/IPv4/TCP with real sequence numbers and checksums). Timestamps are
fixed so the files are byte-for-byte reproducible. The AMBROSIA captures are
recorded by ``ambrosia mock-ic --record`` from its own loopback sockets (real
ports and times, so not byte-for-byte the same twice). The tcpdump capture
(mock-source-tcpdump.pcap) is taken from the kernel instead; see README.md.
The DCP captures are recorded by the DCP mocks themselves over loopback
(``mock-producer --record``): real timestamps, ports and uuids, so they differ
on every run while holding the same conversation.
The Tremor captures are recorded by ``tremor mock-client --record`` style
clients against a live ``MockNode`` on loopback (real timestamps and ports).
"""

from __future__ import annotations

import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.wallaroo.codec import encode
from wallaroo_proto.protocols.wallaroo.frames import (
    Ack,
    EosMessage,
    Hello,
    Message,
    Notify,
    NotifyAck,
    Ok,
    Restart,
)
from wallaroo_proto.protocols.wallaroo.twopc import (
    ListUncommitted,
    Phase1,
    Phase2,
    Reply,
    ReplyUncommitted,
    twopc_frame,
)

HERE = Path(__file__).resolve().parent
T0 = 1_763_700_000.0  # 2025-11-21


class _Clock:
    def __init__(self, start: float = T0, step: float = 0.001) -> None:
        self.t = start
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def source_session(path: Path) -> None:
    """Two streams, credits and checkpoint ACKs, EOS on one stream, orderly close."""
    now = _Clock()
    with PcapWriter(path) as w:
        s = w.tcp_session(("127.0.0.1", 51000), ("127.0.0.1", 7100), timestamp=now())
        s.send(True, encode(Hello("0.0.1", b"", "sample-source", "source-1")), now())
        s.send(False, encode(Ok(20)), now())
        s.send(True, encode(Notify(11, "orders", 0)) + encode(Notify(12, "payments", 0)), now())
        s.send(False, encode(NotifyAck(True, 11, 0)) + encode(NotifyAck(True, 12, 100)), now())
        for i in range(1, 7):
            s.send(
                True, encode(Message(11, i, int(now() * 1e9), b"user-%d" % (i % 3), b"order %d" % i)), now()
            )
        s.send(True, encode(Message(12, 101, int(now() * 1e9), b"", b'{"amount": 12}')), now())
        s.send(True, encode(Message(12, 102, int(now() * 1e9), b"", b'{"amount": 7}')), now())
        s.send(False, encode(Ack(10, ((11, 6), (12, 102)))), now())
        s.send(True, encode(EosMessage(12, 102)), now())
        s.send(False, encode(Ack(0, ((12, 102),))), now())
        s.send(True, encode(Message(11, 7, int(now() * 1e9), b"user-1", b"order 7")), now())
        s.close(True, now())


def sink_session(path: Path) -> None:
    """A worker driving a connector sink: one 2PC round committed, one aborted."""
    now = _Clock()
    with PcapWriter(path) as w:
        s = w.tcp_session(("127.0.0.1", 52000), ("127.0.0.1", 7200), timestamp=now())
        s.send(
            True,
            encode(Hello("v0.0.1", b"", "wallaroo", "worker-1"))
            + encode(Notify(1, "sink-out", 0))
            + encode(twopc_frame(ListUncommitted(1))),
            now(),
        )
        s.send(False, encode(Ok(500)), now())
        s.send(False, encode(NotifyAck(True, 1, 0)), now())
        s.send(False, encode(twopc_frame(ReplyUncommitted(1, ()))), now())
        offset = 0
        for i in range(4):
            data = b"line %d\n" % i
            s.send(True, encode(Message(1, offset, 0, b"", data)), now())
            offset += len(data)
        txn = "sink-out:c_id=1"
        s.send(True, encode(twopc_frame(Phase1(txn, ((1, 0, offset),)))), now())
        s.send(False, encode(twopc_frame(Reply(txn, True))), now())
        s.send(True, encode(twopc_frame(Phase2(txn, True))), now())
        start = offset
        for i in range(4, 6):
            data = b"line %d\n" % i
            s.send(True, encode(Message(1, offset, 0, b"", data)), now())
            offset += len(data)
        txn = "sink-out:c_id=2"
        # The sink votes abort: the range claims more than it received.
        s.send(True, encode(twopc_frame(Phase1(txn, ((1, start, offset + 10),)))), now())
        s.send(False, encode(twopc_frame(Reply(txn, False))), now())
        s.send(True, encode(twopc_frame(Phase2(txn, False))), now())
        s.close(True, now())


def restart_reconnect(path: Path) -> None:
    """The worker sends RESTART (shipped form); the source reconnects and replays from the ACKed point."""
    now = _Clock()
    with PcapWriter(path) as w:
        s = w.tcp_session(("127.0.0.1", 53000), ("127.0.0.1", 7100), timestamp=now())
        s.send(True, encode(Hello("0.0.1", b"", "sample-source", "source-1")), now())
        s.send(False, encode(Ok(10)), now())
        s.send(True, encode(Notify(5, "events", 0)), now())
        s.send(False, encode(NotifyAck(True, 5, 0)), now())
        for i in range(1, 6):
            s.send(True, encode(Message(5, i, i, b"", b"event %d" % i)), now())
        s.send(False, encode(Ack(5, ((5, 3),))), now())
        s.send(False, encode(Restart("127.0.0.1:7100")), now())
        s.close(False, now())
        s = w.tcp_session(("127.0.0.1", 53001), ("127.0.0.1", 7100), timestamp=now())
        s.send(True, encode(Hello("0.0.1", b"", "sample-source", "source-1")), now())
        s.send(False, encode(Ok(10)), now())
        s.send(True, encode(Notify(5, "events", 3)), now())
        s.send(False, encode(NotifyAck(True, 5, 3)), now())
        for i in range(4, 8):
            s.send(True, encode(Message(5, i, i, b"", b"event %d" % i)), now())
        s.send(False, encode(Ack(4, ((5, 7),))), now())
        s.close(True, now())


class _LossyWriter(PcapWriter):
    """Drops the packets whose 1-based numbers are listed, as a capture that missed them."""

    def __init__(self, path: Path, drop: set[int]) -> None:
        super().__init__(path)
        self.drop = drop
        self.attempts = 0

    def write_packet(self, frame: bytes, timestamp: float | None = None) -> None:
        self.attempts += 1
        if self.attempts not in self.drop:
            super().write_packet(frame, timestamp)


def lost_segment(path: Path) -> None:
    """One data segment (two MESSAGE frames and the start of a third) is missing from the capture."""
    now = _Clock()
    with _LossyWriter(path, drop={9}) as w:
        s = w.tcp_session(("127.0.0.1", 54000), ("127.0.0.1", 7100), timestamp=now())
        s.send(True, encode(Hello("0.0.1", b"", "sample-source", "source-1")), now())  # 4
        s.send(False, encode(Ok(100)), now())  # 5
        s.send(True, encode(Notify(1, "lossy", 0)), now())  # 6
        s.send(False, encode(NotifyAck(True, 1, 0)), now())  # 7
        frames = b"".join(encode(Message(1, i, i, b"k", b"payload %02d" % i)) for i in range(1, 13))
        # 4 segments of 120 bytes; frames are 43 bytes, so segments cut frames.
        s.segment_size = 120
        s.send(True, frames, now())  # 8..12; 9 is lost
        s.segment_size = 65_000
        s.send(False, encode(Ack(12, ((1, 12),))), now())
        s.close(True, now())


def pcap_to_pcapng_ns(source: Path, target: Path) -> None:
    """Rewrite a microsecond Ethernet pcap as pcapng with nanosecond timestamps (if_tsresol=9)."""
    raw = source.read_bytes()
    out = bytearray()

    def block(kind: int, body: bytes) -> None:
        body += b"\x00" * (-len(body) % 4)
        total = 12 + len(body)
        out.extend(struct.pack("<II", kind, total) + body + struct.pack("<I", total))

    block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    # IDB: Ethernet, snaplen, options: if_tsresol (9) = 9 -> nanoseconds, then end of options.
    block(1, struct.pack("<HHI", 1, 0, 262144) + struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0))
    pos = 24
    extra_ns = 0
    while pos < len(raw):
        sec, usec, caplen, wirelen = struct.unpack_from("<IIII", raw, pos)
        data = raw[pos + 16 : pos + 16 + caplen]
        pos += 16 + caplen
        extra_ns = (extra_ns + 123) % 1000  # sub-microsecond digits a usec pcap cannot hold
        ts = sec * 1_000_000_000 + usec * 1000 + extra_ns
        block(6, struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, caplen, wirelen) + data)
    target.write_bytes(bytes(out))


def _words(text: str) -> list[str]:
    return text.split()


def _wallaroo_proto(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "wallaroo_proto_cli", *args], text=True, **kwargs)


def _dcp_producer(*args: str) -> tuple[subprocess.Popen, str]:
    """A mock producer on a free loopback port; its HOST:PORT from the ready line."""
    proc = _wallaroo_proto("dcp", "mock-producer", "--port", "0", *args, stdout=subprocess.PIPE)
    line = proc.stdout.readline()
    return proc, line.rsplit(" ", 1)[-1].strip()


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)


def dcp_samples(stream: Path, rollback: Path) -> None:
    """DCP captures recorded by our own mocks over loopback (mock-producer --record)."""
    consume = ["dcp", "mock-consumer", "--connect"]
    with tempfile.TemporaryDirectory() as tmp:
        producer, address = _dcp_producer(
            *[
                "--vbuckets",
                "2",
                "--items",
                "40",
                "--keys",
                "12",
                "--value-size",
                "24",
                "--snapshot-size",
                "8",
                "--seed",
                "1",
            ],
            *("--record", str(stream)),
        )
        cstate = Path(tmp, "c.json")
        options = ["--follow", "--noop-interval", "0.1", "--buffer-size", "1500", "--stream-ids"]
        consumer = _wallaroo_proto(
            *consume, address, *options, "--state", str(cstate), stdout=subprocess.DEVNULL
        )
        while not cstate.exists():  # it caught up
            time.sleep(0.05)
        time.sleep(0.5)  # long enough for a few noops
        _stop(consumer)
        _stop(producer)
    with tempfile.TemporaryDirectory() as tmp:
        pstate, cstate = Path(tmp, "p.json"), Path(tmp, "c.json")
        producer, address = _dcp_producer(*_words("--vbuckets 3 --items 30 --seed 2 --state"), str(pstate))
        _wallaroo_proto(*consume, address, "--state", str(cstate), stdout=subprocess.DEVNULL).wait(timeout=60)
        _stop(producer)
        producer, address = _dcp_producer(
            *[
                "--failover",
                "10",
                "--items",
                "5",
                "--seed",
                "3",
                "--not-my-vbucket",
                "2",
                "--stream-end",
                "too_slow@3",
                "--snapshot-size",
                "4",
            ],
            *("--state", str(pstate), "--record", str(rollback)),
        )
        options = ["--state", str(cstate), "--buffer-size", "600"]
        _wallaroo_proto(*consume, address, *options, stdout=subprocess.DEVNULL).wait(timeout=60)
        _stop(producer)


_CLI = [sys.executable, "-m", "wallaroo_proto_cli", "ambrosia"]


def ambrosia_run(pcap: Path | None, log_dir: str, *ic_args: str) -> int:
    """One mock-ic run (recorded to ``pcap``) with a mock-lb over loopback; the IC's exit code."""
    record = ["--record", str(pcap)] if pcap else []
    ic = subprocess.Popen(
        [
            *_CLI,
            "mock-ic",
            "--exit-when-done",
            "--args",  # the samples' bytes: bare numbers, no batches
            "raw",
            "--batches",
            "none",
            "--committer",
            "305419896",
            "--log-dir",
            log_dir,
            *record,
            *ic_args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    ports = re.search(r"receive port (\d+), send port (\d+)", ic.stdout.readline())
    lb = ["mock-lb", "--receive-port", ports.group(1), "--send-port", ports.group(2)]
    subprocess.run([*_CLI, *lb], capture_output=True, timeout=120)
    ic.communicate(timeout=120)
    return ic.returncode


def ambrosia_captures() -> None:
    """Recorded by mock-ic from its own sockets while mock-lb (the counter immortal) ran against it."""
    with tempfile.TemporaryDirectory() as log_dir:
        args = ("--rpcs", "60", "--batch", "10", "--checkpoint-every", "2")
        ambrosia_run(HERE / "ambrosia-first-start.pcap", log_dir, *args)
    with tempfile.TemporaryDirectory() as log_dir:
        ambrosia_run(None, log_dir, *args, "--crash-at", "3")  # killed right after logging record 3
        ambrosia_run(HERE / "ambrosia-recovery.pcap", log_dir, *args)
    with tempfile.TemporaryDirectory() as log_dir:
        ambrosia_run(HERE / "ambrosia-faults.pcap", log_dir, *args, "--bad-check-at", "2", "--gap-at", "4")


def tremor_samples(session_path: Path, framing_path: Path) -> None:
    """Tremor sessions recorded by our mock client against our mock node over loopback."""
    import asyncio
    import threading
    import time

    from wsproto.events import BytesMessage, Ping, TextMessage

    from wallaroo_proto.protocols.tremor.peers import (
        MockClient,
        MockNode,
        generated_exchange,
        scripted_exchange,
    )

    loop = asyncio.new_event_loop()
    node = MockNode(port=0)
    host, port = loop.run_until_complete(node.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with PcapWriter(session_path) as w:
            generated_exchange(MockClient(host, port, record=w), messages=12, window=4, payload=8, publish=3)
            script = [
                '{"tremor":{"connect":{"protocol":"echo","alias":"e"}}}',
                '{"e":"beep"}',
                '{"badger":"badger"}',
            ]
            scripted_exchange(MockClient(host, port, record=w), list(enumerate(script, 1)))
        with PcapWriter(framing_path) as w:
            c = MockClient(host, port, record=w)
            c.connect()
            c.send({"tremor": {"connect": {"protocol": "echo"}}})
            c.settle()
            c.send({"echo": "y" * 200})  # 16-bit lengths
            c.send({"echo": "z" * 70_000})  # 64-bit lengths
            c.settle()
            text = '{"echo":{"fragmented":"' + "f" * 30 + '"}}'
            c.session.client(text)
            c._write(c.ws.send(TextMessage(data=text[:10], message_finished=False)))
            c._write(c.ws.send(Ping(payload=b"between fragments")))
            c._write(c.ws.send(TextMessage(data=text[10:25], message_finished=False)))
            c._write(c.ws.send(TextMessage(data=text[25:], message_finished=True)))
            c.settle()
            c.send({"tremor": "close"})
            c.settle()
            c.close()
            c = MockClient(host, port, record=w)
            c.connect()
            c._write(c.ws.send(BytesMessage(data=b"\x00binary\xff")))
            c.receive(lambda: False, time.monotonic() + 10)
            c.close()
    finally:
        asyncio.run_coroutine_threadsafe(node.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def kinesis_sample(path: Path) -> None:
    """A MultiLangDaemon conversation recorded by mock-daemon driving mock-processor over pipes."""
    processor = [sys.executable, "-m", "wallaroo_proto_cli", "kinesis", "mock-processor"]
    args = ["--shards", "2", "--records", "5", "--batch-size", "2", "--shard-end", "--record", str(path)]
    proc = _wallaroo_proto("kinesis", "mock-daemon", *args, "--", *processor, stdout=subprocess.DEVNULL)
    if proc.wait(timeout=120) != 0:
        raise SystemExit(f"kinesis mock-daemon exited {proc.returncode}")


def main() -> None:
    source_session(HERE / "source-session.pcap")
    sink_session(HERE / "sink-2pc.pcap")
    restart_reconnect(HERE / "restart-reconnect.pcap")
    lost_segment(HERE / "lost-segment.pcap")
    pcap_to_pcapng_ns(HERE / "sink-2pc.pcap", HERE / "sink-2pc-ns.pcapng")
    dcp_samples(HERE / "dcp-stream.pcap", HERE / "dcp-rollback.pcap")
    ambrosia_captures()
    tremor_samples(HERE / "tremor-session.pcap", HERE / "tremor-framing.pcap")
    kinesis_sample(HERE / "kinesis-session.pcap")


if __name__ == "__main__":
    main()
