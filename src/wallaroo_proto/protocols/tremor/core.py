"""One Tremor network-protocol session's rules (sans-IO): both directions judged, answers foretold.

``Session`` keeps the judge contract (``wallaroo_proto.judge``): ``feed(side,
text)`` takes what the client or the server sent, as text or as a parsed JSON
value, and returns a ``Verdict``: accepted, or a violation with its rule
(``RULES``), its reason and, for the client's, the status code the server
closes the session with. For every accepted client message it also works out
the server's answer (``Verdict.answers``), so the mock node sends exactly what
the judge of a capture expects, and a rule is written once. ``end(side,
End.CUT)`` says a side's messages were lost (a capture's gap): answers are no
longer judged.

Lifecycle (RFC 0019's FSM; the prototype's states in brackets): ``idle``
[Connecting] until a stream is connected, ``active`` while streams are,
back to ``idle`` when the last one is disconnected (the RFC's Active->Idle),
``closing`` after the client's ``close``, ``closed`` once the server
acknowledged it or closed the session with an error (the RFC's Zombie).

Sub-protocols judged: ``echo`` (RFC 0021: any value comes back unchanged) and
``pubsub`` (the prototype's operations and replies, with the RFC 0020
connect properties, ``list`` and ``version``); ``api`` streams are tracked but
their contents not judged.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from wallaroo_proto.judge import End, Expected, Kind
from wallaroo_proto.judge import Verdict as _Verdict

from .messages import (
    CONTROL,
    VERSION,
    Close,
    CloseAck,
    Connect,
    ConnectAck,
    Disconnect,
    DisconnectAck,
    ErrorClose,
    Message,
    MessageError,
    StreamMessage,
    VersionInfo,
    VersionRequest,
    dumps,
    parse_json,
    parse_value,
)

CLIENT, SERVER = "client", "server"
PROTOCOLS = ("echo", "pubsub", "api")
#: The pub/sub sub-protocol's version (RFC 0020's example reply).
PUBSUB_VERSION = "0.10"
PUBSUB_LISTS = ("subscribe", "unsubscribe", "publish", "unpublish")
#: Strict-mode failure code of each list operation.
_PUBSUB_CODES = {"subscribe": "2.200", "unsubscribe": "2.201", "publish": "2.202", "unpublish": "2.203"}
_URL = re.compile(r"^(?:tremor://[^/\s]+)?(/[A-Za-z0-9_.-]+){2,4}$")


#: Every rule a violation can name, with what it says.
RULES: dict[str, str] = {
    "message": "a text that is no JSON, or no message of the protocol (its status code says which)",
    "after-close": "a message after the client's own close, or after the session was closed",
    "control-alias": "a connect that names the control plane (tremor) as its protocol or alias",
    "unknown-protocol": "a connect to a sub-protocol the node does not serve",
    "alias-taken": "a connect to an alias that is already connected",
    "command-policy": "a command.policy header other than strict or non-strict",
    "not-connected": "a stream message or a disconnect on an alias that is not connected",
    "wrong-sender": "a control message that is the other side's to send",
    "pubsub-url": "a pub/sub list operation that takes no list, or one of whose URLs fails (strict policy)",
    "pubsub-operation": "a pub/sub request other than list, version or a one-field record of a known op",
    "pubsub-send": "a pub/sub send without to and data, or to a URL the stream does not publish (strict)",
    "answer": "a server answer that nothing asked for, out of its turn, or other than the one due",
    "pubsub-data": "pub/sub data on a stream that never subscribed",
    "pubsub-reply": "a pub/sub reply that is not a one-field record of a known reply",
}


@dataclass(slots=True)
class Verdict(_Verdict):
    """The judge's verdict on one message, with what the records and the mock node need of it."""

    #: Message type: a control op (``connect``, ``error-close``...), ``echo``, ``pubsub:<op>``, ``api``.
    type: str = ""
    alias: str | None = None
    protocol: str | None = None
    message: Message | None = None
    #: The status code the server answers a client's violation with (``"0.207"``).
    code: str | None = None
    #: The server's answers to an accepted client message, as JSON values, in order.
    answers: tuple = ()


def full_url(url: str) -> str:
    """A tremor URL with its host, as the prototype's pub/sub ``list`` shows it."""
    return url if url.startswith("tremor://") else f"tremor://localhost{url}"


class Stream:
    """One alias's stream: its sub-protocol, state and, for pub/sub, its endpoints."""

    __slots__ = (
        "alias",
        "protocol",
        "state",
        "strict",
        "subs",
        "pubs",
        "subscribed",
        "pending",
        "sent",
        "received",
    )

    def __init__(self, alias: str, protocol: str, strict: bool) -> None:
        self.alias = alias
        self.protocol = protocol
        self.state = "connecting"  # -> open -> disconnecting
        self.strict = strict
        self.subs: list[str] = []
        self.pubs: list[str] = []
        self.subscribed = False  # ever: events may still arrive after an unsubscribe
        #: Answers the server owes on this stream, in order: (type, value or None for any).
        self.pending: deque[tuple[str, Any]] = deque()
        self.sent = 0
        self.received = 0


class _Refused(Exception):
    def __init__(self, rule: str, code: str, reason: str) -> None:
        self.rule = rule
        self.code = code
        self.reason = reason


class Session:
    """Both directions of one session; the mock node, the mock client and the dissector drive it."""

    SIDES: ClassVar[tuple[str, str]] = (CLIENT, SERVER)
    RULES: ClassVar[dict[str, str]] = RULES

    def __init__(self, protocols: tuple[str, ...] = PROTOCOLS) -> None:
        self.protocols = protocols
        self.state = "idle"
        self.streams: dict[str, Stream] = {}
        #: Control answers the server owes, in order: (type, expected value).
        self.control: deque[tuple[str, Any]] = deque()
        self.server_messages = 0
        self.client_messages = 0
        self.connects = 0
        self.violations = 0
        self.failed: str | None = None  # the code of the client's first violation
        self.error_close: str | None = None  # the server's error-close text
        self.history: list[tuple[str, str, str]] = []  # (alias, protocol, how it ended), for reports
        #: Bytes were lost (a capture's gap): what is owed is no longer known, so answers are not judged.
        self.uncertain = False

    def feed(self, side: str, frame: str | Any) -> Verdict:
        """A message ``side`` sent: its text, or its parsed JSON value (a ``str`` is always text)."""
        if side == CLIENT:
            return self._client(frame)
        if side == SERVER:
            return self._server_message(frame)
        raise ValueError(f"side {side!r}: one of {self.SIDES}")

    def end(self, side: str, how: End = End.CLOSED, partial: int = 0) -> Verdict | None:
        """``side`` stopped sending. Cut inside a message, what it asked is unknown: answers and
        unknown aliases are no longer judged. A close or a reset breaks no rule of this protocol
        (the WebSocket handshake is the reader's)."""
        if side not in self.SIDES:
            raise ValueError(f"unknown side {side!r} (known: {', '.join(self.SIDES)})")
        if how == End.CUT:
            self.lost()
        return None

    def lost(self) -> None:
        """Some messages of either side were never seen (a capture's lost bytes, a start
        mid-connection), and both sides go on: stop judging answers and unknown aliases."""
        self.uncertain = True

    # ------------------------------------------------------------------------- client

    def _client(self, text: str | Any) -> Verdict:
        """A message the client sent: its text, or its parsed record (a ``str`` is always text)."""
        self.client_messages += 1
        try:
            value = parse_json(text) if isinstance(text, str) else text
            message = parse_value(value)
        except MessageError as err:
            return self._client_violation("INVALID", None, None, None, "message", err.code, err.detail)
        try:
            if self.uncertain and self.state == "closed":
                # A capture's late bytes (held behind a hole) may come after the close they preceded.
                alias = getattr(message, "alias", None)
                return Verdict(Kind.ACCEPTED, CLIENT, type=message.op, alias=alias, message=message)
            if self.uncertain and self.state == "closing":
                pass
            elif self.state == "closing":
                raise _Refused("after-close", "0.202", "message after the client's own close")
            elif self.state == "closed" and self.error_close is not None:
                # the node's error close may have crossed it on the wire: read, not acted on
                reason = "after the node's error close (which it may not have had yet): not acted on"
                alias = getattr(message, "alias", None)
                return Verdict(Kind.IGNORED, CLIENT, None, reason, message.op, alias, None, message)
            elif self.state == "closed":
                raise _Refused("after-close", "0.202", "message after the session was closed")
            if isinstance(message, StreamMessage):
                return self._client_stream(message)
            return self._client_control(message)
        except _Refused as err:
            stream = self.streams.get(message.alias) if isinstance(message, StreamMessage) else None
            kind = _stream_type(stream, message.value, CLIENT) if stream else message.op
            return self._client_violation(
                kind, message, getattr(message, "alias", None), stream, err.rule, err.code, err.reason
            )

    def _client_violation(self, type_, message, alias, stream, rule, code, reason) -> Verdict:
        self.violations += 1
        if self.failed is None:
            self.failed = code
        protocol = stream.protocol if stream else None
        return Verdict(Kind.VIOLATION, CLIENT, rule, reason, type_, alias, protocol, message, code)

    def _client_control(self, m: Message) -> Verdict:
        if isinstance(m, Connect):
            if m.protocol in (CONTROL, "control") or m.alias == CONTROL:
                raise _Refused("control-alias", "0.206", f"{m.alias!r} is the control plane's")
            if m.protocol not in self.protocols:
                raise _Refused(
                    "unknown-protocol",
                    "0.200",
                    f"unknown protocol {m.protocol!r} (known: {', '.join(self.protocols)})",
                )
            if m.alias in self.streams and not self.uncertain:
                raise _Refused("alias-taken", "0.206", f"alias {m.alias!r} is already connected")
            policy = m.headers.get("command.policy", "strict")
            if policy not in ("strict", "non-strict"):
                raise _Refused("command-policy", "0.202", f"command.policy {policy!r} (strict or non-strict)")
            stream = Stream(m.alias, m.protocol, policy == "strict")
            if m.protocol == "pubsub":
                for key, op in (("subscriptions", "subscribe"), ("publications", "publish")):
                    urls = m.properties.get(key, [])
                    ok = self._pubsub_urls(stream, op, urls)
                    (stream.subs if op == "subscribe" else stream.pubs).extend(ok)
                stream.subscribed = bool(stream.subs)
            self.streams[m.alias] = stream
            self.connects += 1
            answer = {CONTROL: {"connect-ack": {"protocol": m.protocol, "alias": m.alias}}}
            self.control.append(("connect-ack", answer))
            if self.state == "idle":
                self.state = "active"
            return self._accepted("connect", m.alias, m.protocol, m, (answer,))
        if isinstance(m, Disconnect):
            stream = self.streams.get(m.alias)
            if stream is None and self.uncertain:
                stream = self.streams[m.alias] = Stream(m.alias, "unknown", False)
            if stream is None or stream.state == "disconnecting":
                raise _Refused("not-connected", "0.207", f"disconnect of {m.alias!r}, which is not connected")
            stream.state = "disconnecting"
            answer = {CONTROL: {"disconnect-ack": {"alias": m.alias}}}
            self.control.append(("disconnect-ack", answer))
            return self._accepted("disconnect", m.alias, stream.protocol, m, (answer,))
        if isinstance(m, Close):
            self.state = "closing"
            answer = {CONTROL: {"close-ack": "ok"}}
            self.control.append(("close-ack", answer))
            return self._accepted("close", None, None, m, (answer,))
        if isinstance(m, VersionRequest):
            self.control.append(("version-info", None))
            return self._accepted("version", None, None, m, ({CONTROL: {"version": VERSION}},))
        raise _Refused("wrong-sender", "0.202", f"{m.op} is the server's to send")

    @staticmethod
    def _accepted(type_: str, alias, protocol, m: Message, answers: tuple) -> Verdict:
        return Verdict(Kind.ACCEPTED, CLIENT, None, None, type_, alias, protocol, m, None, answers)

    def _client_stream(self, m: StreamMessage) -> Verdict:
        stream = self.streams.get(m.alias)
        if stream is None and self.uncertain:  # connected in bytes the capture lost
            stream = self.streams[m.alias] = Stream(m.alias, "unknown", False)
        if stream is None or stream.state == "disconnecting":
            raise _Refused("not-connected", "0.207", f"no stream {m.alias!r} is connected")
        stream.sent += 1
        value = m.value
        answers: tuple = ()
        if stream.protocol == "echo":
            stream.pending.append(("echo", value))
            answers = ({m.alias: value},)
        elif stream.protocol == "pubsub":
            answers = self._pubsub_request(stream, value)
        type_ = _stream_type(stream, value, CLIENT)
        return self._accepted(type_, m.alias, stream.protocol, m, answers)

    def _pubsub_urls(self, stream: Stream, op: str, urls: Any) -> list[str]:
        """The URLs of a list operation that succeed; strict mode refuses the request for any that fails."""
        if not isinstance(urls, list):
            raise _Refused("pubsub-url", "0.203", f"{op} takes a list of tremor URLs")
        ok = []
        for url in urls:
            problem = None
            if not isinstance(url, str) or not _URL.match(url):
                problem = f"{url!r} is not a tremor URL"
            elif op == "unsubscribe" and full_url(url) not in map(full_url, stream.subs):
                problem = f"{url} is not subscribed"
            elif op == "unpublish" and full_url(url) not in map(full_url, stream.pubs):
                problem = f"{url} is not published"
            if problem is None:
                ok.append(url)
            elif stream.strict:
                raise _Refused("pubsub-url", _PUBSUB_CODES[op], f"{op}: {problem} (strict command policy)")
        return ok

    def _pubsub_request(self, stream: Stream, value: Any) -> tuple:
        alias = stream.alias
        if value in ("list", "version"):
            if value == "list":
                answer = {
                    alias: {
                        "list": {
                            "subs": [full_url(u) for u in stream.subs],
                            "pubs": [full_url(u) for u in stream.pubs],
                        }
                    }
                }
                stream.pending.append(("list", answer))
            else:
                answer = {alias: {"version": PUBSUB_VERSION}}
                stream.pending.append(("version", None))
            return (answer,)
        if not isinstance(value, dict):
            raise _Refused(
                "pubsub-operation", "0.203", "a pubsub operation must be a record, 'list' or 'version'"
            )
        if len(value) != 1:
            raise _Refused("pubsub-operation", "0.205", f"a pubsub operation has {len(value)} fields")
        op, arg = next(iter(value.items()))
        if op in PUBSUB_LISTS:
            ok = self._pubsub_urls(stream, op, arg)
            # The node acts on requests in order, so the change holds for the next request already,
            # whether or not its ack has come back (a client may pipeline them).
            target = stream.subs if op in ("subscribe", "unsubscribe") else stream.pubs
            for url in ok:
                known = full_url(url) in map(full_url, target)
                if op in ("subscribe", "publish") and not known:
                    target.append(url)
                    stream.subscribed |= op == "subscribe"
                elif op in ("unsubscribe", "unpublish"):
                    target[:] = [u for u in target if full_url(u) != full_url(url)]
            answer = {alias: {f"{op}-ack": ok}}
            stream.pending.append((f"{op}-ack", answer))
            return (answer,)
        if op == "send":
            if not isinstance(arg, dict) or "to" not in arg or "data" not in arg:
                raise _Refused("pubsub-send", "0.204", "send takes a record with 'to' and 'data'")
            to = arg["to"]
            published = isinstance(to, str) and full_url(to) in map(full_url, stream.pubs)
            if not published and stream.strict:
                raise _Refused("pubsub-send", "2.202", f"send to {to!r}, which this stream does not publish")
            return ()
        raise _Refused(
            "pubsub-operation",
            "0.202",
            f"unknown pubsub operation {op!r} (known: {', '.join(PUBSUB_LISTS)}, send; or list, version)",
        )

    # ------------------------------------------------------------------------- server

    def _server_message(self, text: str | Any) -> Verdict:
        """A message the server sent: its text, or its parsed record (a ``str`` is always text)."""
        self.server_messages += 1
        first = self.server_messages == 1
        try:
            value = parse_json(text) if isinstance(text, str) else text
            message = parse_value(value)
        except MessageError as err:
            self.violations += 1
            return Verdict(
                Kind.VIOLATION, SERVER, "message", f"server sent a malformed message: {err.detail}", "INVALID"
            )
        stream = self.streams.get(message.alias) if isinstance(message, StreamMessage) else None
        type_ = _stream_type(stream, message.value, SERVER) if stream else message.op
        alias = getattr(message, "alias", None)
        protocol = stream.protocol if stream else getattr(message, "protocol", None)
        if self.state == "closed" and not self.uncertain:
            broken = "after-close", "server message after the session was closed"
        else:
            broken = self._server(message, stream, first)
        if broken is not None:
            self.violations += 1
            return Verdict(Kind.VIOLATION, SERVER, *broken, type_, alias, protocol, message)
        return Verdict(Kind.ACCEPTED, SERVER, None, None, type_, alias, protocol, message)

    def _owed(self, queue: deque, type_: str, value: Any, what: str) -> tuple[str, str] | None:
        if self.uncertain:  # after lost bytes: take the answer it matches, if any, and judge no more
            for i, (want, expected) in enumerate(queue):
                if want == type_ and (expected is None or value == expected):
                    for _ in range(i + 1):
                        queue.popleft()
                    break
            return None
        if not queue:
            return "answer", f"{what} that answers nothing"
        want, expected = queue[0]
        if want != type_:
            return "answer", f"{what} where {want} was due"
        if expected is not None and value != expected:
            return "answer", f"{what} {_short(value)} where {_short(expected)} was due"
        queue.popleft()
        return None

    def _server(self, m: Message, stream: Stream | None, first: bool) -> tuple[str, str] | None:
        """The (rule, reason) a server message breaks, or None."""
        if isinstance(m, ErrorClose):
            self.error_close = m.text
            self._end("error-close")
            return None
        if isinstance(m, VersionInfo):
            if first:  # the node's greeting, sent as the WebSocket opens: a request it crossed is
                return None  # answered after it
            if self.control and self.control[0][0] == "version-info":
                self.control.popleft()
                return None
            return "answer", "version info that answers nothing (only the first message may announce it)"
        if isinstance(m, ConnectAck):
            reason = self._owed(
                self.control,
                "connect-ack",
                {CONTROL: {"connect-ack": {"protocol": m.protocol, "alias": m.alias}}},
                "connect-ack",
            )
            if reason is None:
                s = self.streams.get(m.alias)
                if s is not None:
                    s.state = "open"
            return reason
        if isinstance(m, DisconnectAck):
            reason = self._owed(
                self.control,
                "disconnect-ack",
                {CONTROL: {"disconnect-ack": {"alias": m.alias}}},
                "disconnect-ack",
            )
            if reason is None:
                s = self.streams.pop(m.alias, None)
                if s is not None:
                    self.history.append((s.alias, s.protocol, "disconnected"))
                if not self.streams and self.state == "active":
                    self.state = "idle"
            return reason
        if isinstance(m, CloseAck):
            reason = self._owed(self.control, "close-ack", {CONTROL: {"close-ack": m.status}}, "close-ack")
            if reason is None:
                self._end("closed")
            return reason
        if isinstance(m, StreamMessage):
            if stream is None:
                return (
                    None
                    if self.uncertain
                    else ("not-connected", f"message on {m.alias!r}, which is not connected")
                )
            stream.received += 1
            value = m.value
            if stream.protocol == "echo":
                return self._owed(stream.pending, "echo", value, "echo reply")
            if stream.protocol == "pubsub":
                return self._pubsub_reply(stream, value)
            return None
        return "wrong-sender", f"{m.op} is the client's to send"

    def _pubsub_reply(self, stream: Stream, value: Any) -> tuple[str, str] | None:
        if _is_data(value):
            # Not ``stream.subs``: an event may cross an unsubscribe on the wire.
            if stream.subscribed or self.uncertain:
                return None
            return "pubsub-data", "pubsub data on a stream that never subscribed"
        if not isinstance(value, dict) or len(value) != 1:
            return "pubsub-reply", f"pubsub reply {_short(value)} is not a record with one field"
        op = next(iter(value))
        if op in ("list", "version") or op.endswith("-ack") and op[:-4] in PUBSUB_LISTS:
            return self._owed(stream.pending, op, {stream.alias: value}, f"pubsub {op}")
        acks = ", ".join(f"{o}-ack" for o in PUBSUB_LISTS)
        return "pubsub-reply", f"unknown pubsub reply {op!r} (known: {acks}, list, version)"

    def _end(self, how: str) -> None:
        """The session is over: nothing is owed any more (a node may refuse what this judge would take)."""
        self.state = "closed"
        self.control.clear()
        for s in self.streams.values():
            self.history.append((s.alias, s.protocol, how))
        self.streams.clear()

    # ------------------------------------------------------------------------- state

    def owed(self) -> int:
        """Answers the server still owes (control and stream)."""
        return len(self.control) + sum(len(s.pending) for s in self.streams.values())

    def expects(self) -> Expected:
        """What comes next: the message types each side may send now (as records name them), and a
        line for a summary."""
        if self.state == "closed":
            return Expected({CLIENT: frozenset(), SERVER: frozenset()}, "nothing: the session is closed")
        client: set[str] = set()
        if self.state != "closing":
            client |= _CLIENT_CONTROL
            for s in self.streams.values():
                if s.state != "disconnecting":
                    client |= _CLIENT_STREAM.get(s.protocol, {s.protocol})
                    client.add("disconnect")
        server = {"error-close"}
        if self.server_messages == 0 or self.control and self.control[0][0] == "version-info":
            server.add("version-info")
        if self.control:
            server.add(self.control[0][0])
        for s in self.streams.values():
            if s.pending:
                want = s.pending[0][0]
                server.add(want if s.protocol == "echo" else f"pubsub:{want}")
            if s.protocol == "pubsub" and s.subscribed:
                server.add("pubsub:data")
            elif s.protocol not in ("echo", "pubsub"):
                server.add(s.protocol)  # not judged
        if self.control:
            text = f"the server's {self.control[0][0]}"
        else:
            waiting = next((s for s in self.streams.values() if s.pending), None)
            if waiting is not None:
                text = f"the server's {waiting.pending[0][0]} on {waiting.alias!r}"
            else:
                text = "a client message" if self.state != "closing" else "the server's close-ack"
        return Expected({CLIENT: frozenset(client), SERVER: frozenset(server)}, text)


#: The control messages a client may send while the session is open.
_CLIENT_CONTROL = frozenset({"connect", "version", "close"})
#: The message types a client may send on a stream of each sub-protocol.
_CLIENT_STREAM = {
    "echo": {"echo"},
    "pubsub": {f"pubsub:{op}" for op in (*PUBSUB_LISTS, "send", "list", "version")},
}


def _stream_type(stream: Stream | None, value: Any, sender: str) -> str:
    if stream is None:
        return "stream"
    if stream.protocol != "pubsub":
        return stream.protocol
    if isinstance(value, str):
        return f"pubsub:{value}" if value in ("list", "version") else "pubsub"
    if sender == SERVER and _is_data(value):
        return "pubsub:data"
    if isinstance(value, dict) and len(value) == 1:
        op = next(iter(value))
        if isinstance(op, str) and op.replace("-", "").isalpha() and len(op) <= 16:
            return f"pubsub:{op}"
    return "pubsub"


def _is_data(value: Any) -> bool:
    """The prototype's pub/sub event push: ``{"data": v, "meta": m}``."""
    return isinstance(value, dict) and "data" in value and value.keys() <= {"data", "meta"}


def _short(value: Any, limit: int = 80) -> str:
    text = dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
