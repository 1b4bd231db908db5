"""What a protocol brings to replay: how a recorded frame follows the live peer, and what may differ.

A plug-in's ``replay_adapter()`` gives a module with:

* ``Adapter(side)``: a sans-IO object for one replay, playing ``side`` (one of the judge's
  ``SIDES``). The engine calls
  ``outgoing(frame)`` for each recorded frame of the played side, in order, and sends the
  bytes it answers, or waits while it answers a ``Hold`` (the live peer has not yet allowed
  the frame: credits, a window, an answer still owed), or sends nothing for ``SKIP`` (a
  frame redone another way: a login), or sends an ``Ask``'s bytes first and asks again (a
  question of the adapter's own whose answer the frame needs: a DCP failover log).
  ``incoming(record, raw)`` is told every live frame of the peer, to learn the values it
  decides (ids, opaques, UUIDs, credits), and returns True for the answer to an ``Ask``
  (not the recording's: not compared); ``expected(frame)`` gives the fields a recorded
  frame of the peer should have live, as far as the adapter can tell (an echoed opaque maps
  to the live one); ``waits(frame)`` says whether a frame of the played side still waits
  for the peer's frames recorded before it (not once the peer needs the frame to go on: a
  full window's acknowledgement).
  An adapter may also have ``owed()``: ``(live record, bytes)`` the live peer is owed now
  that the recording does not hold (the answer to a frame it never had, the credits a
  connector spends as its own threads run), else None; the engine asks while it waits and
  sends them on that record's connection.
* ``NOISE``: the protocol's fields that legitimately differ between two runs (times,
  opaques, UUIDs, CAS values); ``--ignore`` adds to them.
* ``match_key(record)``: what makes a frame itself among frames of its type (a stream and
  message id, a vbucket and seqno): ``diff`` matches two recordings by it.
* ``conversation_key(record)``: which recorded connections are one conversation (default:
  each connection is one).
* ``units(record)``: what of a frame is compared, as records (default: the frame itself).
  A frame that only grants room to send (Wallaroo's refill ACK) has none: when and how
  often a peer sends those is timing, so they are judged and given to ``incoming`` but
  neither expected nor compared. A frame that gathers independent facts, as a peer
  happened to batch them (an ACK's points of reference), gives one unit each. Where only
  the frame's bytes tell its units (an AMBROSIA RPCBatch's RPCs), the ``Adapter`` has a
  ``units(record, raw)`` for the live frames, and its ``expected`` gives the list.
* ``opening(record)``: which side opened the record's connection, and its place in the order
  the conversation's connections were opened (default: the dissector's initiator, in their
  numbered order). A protocol whose first sender is not the opener says so here (AMBROSIA's
  IC speaks first on the socket its LB opened second).

The ``Adapter`` here plays the recording as it is: the protocols whose frames carry nothing
the live peer decides, or what a plug-in's adapter builds on.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Final

from wallaroo_proto.protocols import get_plugin


@dataclass(frozen=True, slots=True)
class Hold:
    """The frame may not go yet; ``reason`` says what the live peer still owes."""

    reason: str


@dataclass(frozen=True, slots=True)
class Ask:
    """Bytes of the adapter's own to send before the frame (then ``outgoing`` is asked again)."""

    data: bytes
    reason: str


#: ``outgoing``'s answer for a recorded frame that is not sent (redone another way).
SKIP: Final = b""


#: Fields of every record that differ between any two runs: where and when, not what.
COMMON_NOISE = frozenset(
    {
        "capture",
        "connection",
        "conn_index",
        "initiator_addr",
        "initiator_port",
        "responder_addr",
        "responder_port",
        "ts",
        "ts_ns",
        "packet",
        "offset",
        "frame_index",
        "latency",
        "notes",
        "_raw",
    }
)


class Adapter:
    """Plays the recording unchanged: every frame as recorded, nothing waited for."""

    NOISE: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, side: str) -> None:
        self.side = side

    def outgoing(self, frame: Any) -> bytes | Hold:
        """The bytes to send for recorded ``frame`` (a ``recording.Frame``) now, or a ``Hold``."""
        return frame.raw

    def incoming(self, record: dict, raw: bytes) -> bool | None:
        """A live frame from the peer: learn what it decided (True: it answers an ``Ask``)."""

    def expected(self, frame: Any) -> dict | list[dict]:
        """The fields recorded ``frame`` of the peer should have live (a list: its units)."""
        return frame.record

    def as_recorded(self, frame: Any) -> bytes:
        """The bytes of recorded ``frame`` as it went (one that broke a rule: fuzz's reproducers)."""
        return frame.raw

    def sent(self, frame: Any, data: bytes) -> None:
        """What went for ``frame`` where fuzz changed the adapter's bytes or inserted a frame:
        an adapter that follows its own frames' state takes these instead."""

    def waits(self, frame: Any) -> bool:
        """Does ``frame`` (of the played side) still wait for the peer's frames recorded before it?
        Asked while it waits: False once the live peer can send no more before it (a window's
        acknowledgement when the live window is full)."""
        return True


def match_key(record: dict) -> tuple:
    """Default: frames of one type are matched in their order alone."""
    return ()


def units(record: dict) -> list[dict]:
    """Default: a frame is compared whole."""
    return [record]


def conversation_key(record: dict) -> tuple:
    """Default: each TCP connection is a conversation of its own."""
    return (record["conn_index"],)


def opening(record: dict) -> tuple[str | None, int]:
    """Default: the sender of the initiator's frames opened the connection; the connections
    open in their numbered order."""
    side = record.get("sender") if record.get("direction") == "initiator>responder" else None
    return side, record["conn_index"]


def module(protocol: str) -> ModuleType:
    """The protocol's adapter module (its plug-in's ``replay_adapter``), else this one."""
    plugin = get_plugin(protocol)
    factory = getattr(plugin, "replay_adapter", None)
    return factory() if factory is not None else importlib.import_module(__name__)


def noise(protocol: str, extra: frozenset[str] = frozenset()) -> frozenset[str]:
    """Every field a comparison of ``protocol``'s frames passes over."""
    mod = module(protocol)
    return COMMON_NOISE | getattr(mod.Adapter, "NOISE", frozenset()) | extra


def make(protocol: str, side: str) -> Any:
    return module(protocol).Adapter(side)


def key_of(protocol: str):
    mod = module(protocol)
    return getattr(mod, "match_key", match_key)


def units_of(protocol: str):
    return getattr(module(protocol), "units", units)


def conversation_of(protocol: str):
    mod = module(protocol)
    return getattr(mod, "conversation_key", conversation_key)


def opening_of(protocol: str):
    return getattr(module(protocol), "opening", opening)
