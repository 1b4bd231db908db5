"""What a protocol gives the proxy's fault rules: its frames, their fields, and its own faults.

The proxy's engine (``proxy.faults``) is protocol-agnostic: it splits each direction
of a connection into frames through the protocol's ``Adapter``, matches rules
against each frame's fields (the names ``dissect`` gives them, so a rule's ``where``
is a ``-Y`` display filter), and applies the generic actions itself (drop, delay,
duplicate, reorder, rewrite, cut, stall). A protocol adds the faults its users fear
most as ``NamedFault`` values, built from its own codec. Everything here is sans-IO:
bytes in, bytes out, no sockets and no clocks.

A plug-in offers this through ``ProtocolPlugin.proxy_faults``: a module (its
``proxy_faults.py``) holding ``adapter() -> Adapter`` (one per proxied connection) and
``NAMED_FAULTS: dict[str, NamedFault]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class FaultError(ValueError):
    """A rule that cannot be applied as written; the message says which key and why."""


@dataclass(frozen=True)
class Frame:
    """One whole frame as it reached the proxy."""

    #: Its bytes, exactly as read.
    data: bytes
    #: True when the client (the side that connected to the proxy) sent it.
    from_client: bool
    #: ``type`` and the protocol's record fields, named and typed as ``dissect`` does.
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class Send:
    """Bytes the proxy sends: toward the upstream, or back toward the client."""

    to_upstream: bool
    data: bytes
    #: What the bytes are, for the fault line, when the proxy made them ("a RESTART").
    what: str = field(default="", compare=False)


@dataclass(frozen=True)
class Wait:
    """Hold this direction for ``seconds`` before the steps after it."""

    seconds: float


@dataclass(frozen=True)
class Close:
    """End the whole connection now: both sides closed, with a reset if ``reset``."""

    reset: bool


@dataclass(frozen=True)
class Stall:
    """Forward nothing more in this direction: for ``seconds``, or until the connection ends."""

    seconds: float | None


class Adapter(Protocol):
    """One proxied connection, for the fault rules (sans-IO; one instance per connection).

    ``frames`` is called with each direction's bytes in the order they arrive and
    ``fields`` once for every frame, in order, so an adapter may keep state across
    frames (an opaque's vbucket, a WebSocket's upgrade) in either.
    """

    def frames(self, from_client: bool, data: bytes) -> list[bytes]:
        """The whole frames these bytes complete, each as its bytes; a partial tail is kept.

        Bytes that are not frames of the protocol (an HTTP upgrade, a handshake) come
        out as frames too, so that every byte is forwarded. Raises ``ValueError`` when
        the bytes cannot be framed (the engine then forwards the rest unframed).
        """
        ...

    def fields(self, frame: bytes, from_client: bool) -> dict[str, Any]:
        """The frame's ``type`` and record fields, as ``dissect``'s record of it names them."""
        ...

    def rewrite(self, frame: Frame, field_name: str, value: Any) -> bytes:
        """The frame with one field set to ``value``, re-encoded; ``FaultError`` if that field
        cannot be rewritten (the message lists those that can)."""
        ...

    def error_frame(self, reason: str, to_client: bool) -> bytes | None:
        """The protocol's own error message for ``--strict`` to send before closing, or None."""
        ...

    def tail(self, from_client: bool) -> bytes:
        """The bytes of this side taken and not given out as frames (after a ``ValueError`` from
        ``frames``: every byte of that side no earlier call returned). The engine forwards them
        when the side ends, and when ``frames`` raises, so that no byte is lost."""
        ...


#: A named fault's action: (the frame it matched, the rule's parameters, the connection's
#: adapter) -> what to do instead of forwarding the frame: ``Send`` values, and a ``Wait``,
#: ``Stall`` or ``Close`` among them where the fault needs one. The frame itself goes on
#: only if the list sends it; an empty list drops it.
Act = Callable[[Frame, Mapping[str, Any], Any], list[Send | Wait | Stall | Close]]


@dataclass(frozen=True)
class NamedFault:
    """A fault a protocol's users fear, as one word in a rule (``action = "rollback"``)."""

    #: One line for ``proxy --help`` and docs/proxy-faults.md.
    help: str
    #: The frames it acts at, a display filter over ``Frame.fields``, unless a rule gives its own.
    where: str
    #: Its own rule keys, beyond the common ones, with their types and defaults.
    params: Mapping[str, tuple[type, Any]] = field(default_factory=dict)
    #: What it does at a matched frame; None when it is a generic action with its defaults.
    act: Act | None = None
    #: The generic action it stands for when ``act`` is None ("drop", "delay", "cut", ...).
    action: str | None = None
    #: The direction of the frames it acts at: "upstream" (client to upstream), "client", "both".
    direction: str = "both"
