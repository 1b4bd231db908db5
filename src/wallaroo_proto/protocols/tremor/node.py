"""The mock node's logic (sans-IO): one ``NodeSession`` per connection, one ``Broker`` for pub/sub.

A session's replies are the answers its ``core.Session`` foretold, judged
again as the server's own messages, so the node cannot send what the
dissector would call a violation. A client's violation is answered as the
prototype answers it: ``{"tremor":{"close":"<code>: <text>"}}``, then the
connection closes. ``send`` on a pub/sub stream goes to every stream of any
session subscribed to its URL, as ``{"<alias>":{"data":..,"meta":{"url":..}}}``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, NamedTuple

from .core import CLIENT, SERVER, Session, full_url
from .messages import CONTROL, VERSION, dumps, status_text

#: The prototype's close text for a failure of its own (``prelude.rs``).
INTERNAL_ERROR = "unknown server error"


class Output(NamedTuple):
    #: Texts for this session's client, in order.
    replies: list[str]
    #: Close the connection after the replies.
    close: bool
    #: Pub/sub data for other sessions (or this one): (session, text).
    deliveries: list[tuple[NodeSession, str]]
    #: The client's violation, if it made one: its reason.
    violation: str | None = None
    #: The node's own failure on this message, if any (the session is closed as the prototype does).
    internal: str | None = None


class Broker:
    """Which streams of which sessions are subscribed to each URL."""

    def __init__(self) -> None:
        self.subscribers: dict[str, dict[tuple[int, str], NodeSession]] = {}

    def refresh(self, node: NodeSession) -> None:
        """Bring one session's entries up to date with its streams' subscriptions."""
        self.forget(node)
        for stream in node.session.streams.values():
            if stream.protocol == "pubsub" and stream.state != "disconnecting":
                for url in stream.subs:
                    self.subscribers.setdefault(full_url(url), {})[(node.ident, stream.alias)] = node

    def forget(self, node: NodeSession) -> None:
        for url in [u for u, subs in self.subscribers.items() if any(k[0] == node.ident for k in subs)]:
            subs = self.subscribers[url]
            for key in [k for k in subs if k[0] == node.ident]:
                del subs[key]
            if not subs:
                del self.subscribers[url]

    def publish(self, url: str, data: object) -> list[tuple[NodeSession, str]]:
        out = []
        full = full_url(url)
        for (_, alias), node in list(self.subscribers.get(full, {}).items()):
            push = {alias: {"data": data, "meta": {"url": full}}}
            verdict = node.session.feed(SERVER, push)
            if verdict.ok:
                out.append((node, dumps(push)))
        return out


class NodeSession:
    """One client's session as the node serves it."""

    def __init__(self, broker: Broker, ident: int, *, announce_version: bool = True) -> None:
        self.broker = broker
        self.ident = ident
        self.session = Session(protocols=("echo", "pubsub"))
        self.announce_version = announce_version
        #: The transport that carries pub/sub events from other sessions to this one (the peer sets it).
        self.connection: Any = None
        #: A rule broken on purpose, for the fuzz tests alone (tests/test_fuzz_tremor_e2e.py).
        self.plant = os.environ.get("WALLAROO_PROTO_PLANT")

    def opened(self) -> list[str]:
        """What the node sends as the WebSocket opens: the prototype announces its version."""
        if not self.announce_version:
            return []
        greeting = {CONTROL: {"version": VERSION}}
        self.session.feed(SERVER, greeting)
        return [dumps(greeting)]

    def receive(self, text: str) -> Output:
        """One text message from the client: the replies, whether to close, pub/sub deliveries.

        Never raises: a failure of the node's own ends the session with the prototype's
        internal-error close, so one client's message cannot take the node down.
        """
        try:
            return self._receive(text)
        except Exception as err:  # noqa: BLE001 - the node's own bug, reported and survived
            reply = {CONTROL: {"close": INTERNAL_ERROR}}
            with contextlib.suppress(Exception):
                self.session.feed(SERVER, reply)
            self.broker.forget(self)
            return Output([dumps(reply)], True, [], internal=f"{type(err).__name__}: {err}"[:200])

    def _receive(self, text: str) -> Output:
        session = self.session
        verdict = session.feed(CLIENT, text)
        if not verdict.ok:
            if self.plant == "reack-disconnect" and verdict.type == "disconnect" and verdict.code == "0.207":
                return Output([dumps({CONTROL: {"disconnect-ack": {"alias": verdict.alias}}})], False, [])
            return self._refuse(verdict.code or "0.202", verdict.reason)
        replies = []
        for answer in verdict.answers:
            judged = session.feed(SERVER, answer)
            if not judged.ok:  # the node's own bug: say so rather than send it
                raise RuntimeError(f"the node's answer would break the protocol: {judged.reason}")
            replies.append(dumps(answer))
        deliveries: list[tuple[NodeSession, str]] = []
        if verdict.protocol == "pubsub" or verdict.type in ("connect", "disconnect", "close"):
            self.broker.refresh(self)
            if verdict.type == "pubsub:send":
                arg = verdict.message.value["send"]
                deliveries = self.broker.publish(arg["to"], arg["data"])
        return Output(replies, session.state == "closed", deliveries)

    def _refuse(self, code: str, reason: str | None) -> Output:
        reply = {CONTROL: {"close": status_text(code)}}
        self.session.feed(SERVER, reply)
        self.broker.forget(self)
        return Output([dumps(reply)], True, [], reason)

    def gone(self) -> None:
        """The connection ended (any way): its subscriptions go."""
        self.broker.forget(self)


__all__ = ["CLIENT", "Broker", "NodeSession", "Output"]
