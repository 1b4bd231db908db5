"""Small captures for the report tests, written frame by frame from the protocol's rules."""

from __future__ import annotations

from pathlib import Path

from wallaroo_proto.pcap_writer import PcapWriter
from wallaroo_proto.protocols.wallaroo.codec import encode
from wallaroo_proto.protocols.wallaroo.frames import Ack, Hello, Message, Notify, NotifyAck, Ok

CAPTURES = Path(__file__).resolve().parent.parent / "captures"

#: Frames per connection of the sample captures, counted by hand from captures/make_samples.py:
#: source-session: HELLO, OK, 2 NOTIFY, 2 NOTIFY_ACK, 8 MESSAGE, ACK, EOS_MESSAGE, ACK, MESSAGE.
#: restart-reconnect: HELLO, OK, NOTIFY, NOTIFY_ACK, 5 MESSAGE, ACK, RESTART; then HELLO, OK,
#: NOTIFY, NOTIFY_ACK, 4 MESSAGE, ACK.
SAMPLE_FRAMES = {"source-session.pcap": [18], "restart-reconnect.pcap": [11, 9]}


def unnotified_message(path: Path) -> Path:
    """HELLO, OK, then a MESSAGE on stream 9 that was never NOTIFYed: one violation (frame 2)."""
    with PcapWriter(path) as w:
        s = w.tcp_session(("127.0.0.1", 51000), ("127.0.0.1", 7100), timestamp=1000.0)
        s.send(True, encode(Hello("0.0.1", b"", "bad-source", "b-1")), 1000.001)
        s.send(False, encode(Ok(5)), 1000.002)
        s.send(True, encode(Message(9, 1, 0, b"", b"x")), 1000.003)
        s.close(True, 1000.004)
    return path


def long_session(path: Path, messages: int, credits: int = 10, unnotified: tuple[int, ...] = ()) -> Path:
    """A source streaming ``messages`` MESSAGEs, 1 ms apart; the worker grants ``credits`` per ACK
    each time the connector runs out, so the level falls to zero ``messages // credits`` times.
    The MESSAGEs numbered in ``unnotified`` (from 1) go to stream 9, never NOTIFYed: a violation
    each, at frame 4 + (i - 1) + (i - 1) // credits."""
    with PcapWriter(path) as w:
        t = 2000.0
        s = w.tcp_session(("127.0.0.1", 52000), ("127.0.0.1", 7100), timestamp=t)
        s.send(True, encode(Hello("0.0.1", b"", "long-source", "l-1")), t + 0.001)
        s.send(False, encode(Ok(credits + 1)), t + 0.002)  # one for the NOTIFY
        s.send(True, encode(Notify(1, "s", 0)), t + 0.003)
        s.send(False, encode(NotifyAck(True, 1, 0)), t + 0.004)
        t += 0.005
        for i in range(1, messages + 1):
            s.send(True, encode(Message(9 if i in unnotified else 1, i, i, b"", b"m")), t)
            t += 0.001
            if i % credits == 0:
                t += 0.002  # the spell at zero credits
                s.send(False, encode(Ack(credits, ((1, i),))), t)
                t += 0.001
        s.close(True, t)
    return path
