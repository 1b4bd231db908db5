"""The player: one side of a recorded conversation, played against a live peer.

It walks the recording in order. A frame of the played side is sent once every frame the
peer sent before it in the recording has come (or was waited for ``answer_timeout``), and
once the protocol's adapter lets it go (credits, a window); its bytes follow the live
peer's values through the adapter. The peer is not read while frames of ours are held to
be sent: what it answers comes after them in the live run, as it did in the recording (an
AMBROSIA LB's self calls answering a replayed record are judged after the IC's
TakeBecomingPrimaryCheckpoint that followed the record). A frame of the peer is expected: the live frames are
judged by the protocol's core (``live``) and matched and compared with the recorded ones
(``compare``). Everything waits with deadlines, so a peer that hangs is a finding.
"""

from __future__ import annotations

import contextlib
import os
import select
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from wallaroo_proto.capture.frame_block import FrameBlock

from . import adapter as adapters
from .compare import BAD, Matcher, Outcome, Result
from .diff import diff
from .links import Link, LinkError, Listener, SpawnLink, connect
from .live import Transcript
from .recording import ConnectionInfo, Conversation, Frame, StreamBytes, find, frames

#: Why a frame is not waited for once the live peer went quiet.
QUIET = "the live peer sent nothing through two answers' deadlines in a row"


class ReplayError(Exception):
    """The replay could not start (exit 2): nobody listening, no client came, bad options."""


@dataclass
class Options:
    """How to play: which side, against which peer, how fast, what to ignore."""

    #: The played side: one of the judge's ``SIDES``.
    side: str
    connect: list[tuple[str, int]] = field(default_factory=list)
    listeners: list[Listener] = field(default_factory=list)
    spawn: str | None = None
    #: Seconds each answer (or allowance) is waited for.
    answer_timeout: float = 10.0
    #: None: as fast as the peer answers; else the recording's pace times this factor.
    speed: float | None = None
    ignore: frozenset[str] = frozenset()
    record: str | None = None
    #: Outcomes other than matched kept for the summary (the rest are counted).
    keep: int = 1000
    #: Seconds a peer is waited for to connect (None: ``answer_timeout``): a peer process started
    #: for each run takes longer to come than an answer.
    connect_timeout: float | None = None
    #: Keep ``Player.events``: every live frame of both sides and every end, in order (fuzz's oracle).
    log: bool = False
    #: Fuzzing: from recorded frame ``fuzz_from`` on (the first changed), the recorded answers are
    #: waited for ``settle`` only (the peer may owe none now), and ``owes(events)`` says what is
    #: still waited for as long as an answer is, before the end too.
    fuzz_from: int | None = None
    settle: float | None = None
    #: Live server port -> the port written in ``record``'s capture (fuzz's reproducers carry the
    #: protocol's own ports, so every tool reads them as the protocol without being told).
    record_ports: dict[int, int] = field(default_factory=dict)
    owes: Callable[[list[tuple]], bool] | None = None


@dataclass
class Report:
    """What a replay found."""

    protocol: str
    side: str
    counts: dict[str, int]
    outcomes: list[Outcome]
    #: Violations in the played side's own frames (the recording's or an adaptation's).
    own_violations: list[str]
    sent: int
    received: int
    seconds: float
    stopped: str | None = None
    live_connections: list[str] = field(default_factory=list)
    #: What a person should know besides (a recording cut short: played up to there).
    notes: list[str] = field(default_factory=list)
    #: Our own frames that broke a rule (``own_violations`` describes the first of them).
    own_violation_count: int = 0
    #: The packet column of the other run, in the summary's table.
    other_packet: str = "live packet"

    def title(self) -> str:
        return f"replay of the {self.protocol} {self.side}: {self.sent} frames sent, {self.received} received"

    @property
    def ok(self) -> bool:
        return (
            not self.stopped and not any(self.counts.get(r.value, 0) for r in BAD) and not self.own_violations
        )

    def as_dict(self) -> dict:
        return {
            "protocol": self.protocol,
            "played": self.side,
            "ok": self.ok,
            "counts": self.counts,
            "sent": self.sent,
            "received": self.received,
            "seconds": round(self.seconds, 3),
            "stopped": self.stopped,
            "own_violations": self.own_violations,
            "own_violation_count": self.own_violation_count,
            "notes": self.notes,
            "live_connections": self.live_connections,
            "outcomes": [o.as_dict() for o in self.outcomes],
        }


class _Stop(Exception):
    """The replay cannot go on (the peer closed, or never allowed a frame)."""


class Player:
    """One replay of ``conversation`` (see the module's docstring)."""

    def __init__(
        self,
        conversation: Conversation,
        options: Options,
        on_outcome: Callable[[Outcome], None] | None = None,
        steps: Iterable[Frame] | None = None,
    ) -> None:
        self.conversation = conversation
        #: The frames played (fuzz's mutants), else the recording's.
        self.steps = steps
        #: With ``options.log``: ("ours" | "peer", record) for each live frame, ("end", live
        #: connection, "closed" | "reset") for the peer's ends, in the order they were read.
        self.events: list[tuple] = []
        self.options = options
        self.side = options.side
        self.adapter = adapters.make(conversation.protocol, options.side)
        ignore = adapters.noise(conversation.protocol, options.ignore)
        self.matcher = Matcher(ignore, adapters.key_of(conversation.protocol), keep=options.keep)
        self._units = adapters.units_of(conversation.protocol)
        #: An adapter whose units its frames' bytes tell (``Adapter.units``).
        self._adapter_units = getattr(self.adapter, "units", None)
        self._on_outcome = on_outcome
        self.matcher.on_outcome = self._decided
        self.transcript: Transcript | None = None
        self.links: dict[int, Link] = {}  # recorded conn_index -> live link
        self._live_order: list[Link] = []  # live conn_index - 1 -> link
        #: Live connection -> the peer's bytes, until its frames are read (the adapter gets them).
        self._streams: dict[int, StreamBytes] = {}
        self._to_connect = list(options.connect)
        self._spawn = options.spawn
        #: Our own frames that broke a rule: counted, the first ``keep`` described.
        self.own_violations: list[str] = []
        self.own_violation_count = 0
        #: Our frames of one recorded packet, sent together (``_flush_batch``), and where they go.
        self._batch = bytearray()
        self._batch_at: tuple[Link | None, int] = (None, 0)
        #: Recorded connection -> whether its initiator>responder bytes are the played side's.
        self._initiator_is_us: dict[int, bool] = {}
        self.sent = self.received = 0
        #: ``received`` when an answer last did not come in time; ``_quiet`` when nothing at all
        #: came before the next one did not either: the peer is taken to have stopped answering,
        #: and nothing is waited for until it sends again (a silent peer costs two deadlines).
        self._silent_at: int | None = None
        self._quiet = False
        #: The recording's frames from ``options.fuzz_from`` on are being played: see ``settle``.
        self._fuzzed = False
        self._start_ts: float | None = None
        self._start_wall = 0.0

    # --------------------------------------------------------------- outcomes

    def _decided(self, outcome: Outcome) -> None:
        if outcome.result is not Result.MATCHED and self.transcript is not None and outcome.live is not None:
            self.transcript.comment(outcome.live.get("packet") or 0, outcome.text())
        if self._on_outcome is not None:
            self._on_outcome(outcome)

    # --------------------------------------------------------------- links

    def _open(self, frame: Frame) -> Link:
        """The live link standing for the recorded connection of ``frame``, opened now, after the
        connections the recording opened before it (an AMBROSIA LB's receive socket comes before
        its send socket, whose IC speaks first)."""
        for info in self.conversation.connections:
            if info.conn_index not in self.links:
                self._open_one(info)
            if info.conn_index == frame.conn_index:
                break
        return self.links[frame.conn_index]

    def _open_one(self, info: ConnectionInfo) -> None:
        ours = info.initiator_side == self.side
        deadline = time.monotonic() + (self.options.connect_timeout or self.options.answer_timeout)
        if ours:
            if self._spawn is not None:
                link: Link = SpawnLink(self._spawn, info.client, info.server)
                self._spawn = None
            elif self._to_connect:
                # a peer may listen on its next port only once its first was taken (AMBROSIA's IC)
                link = connect(self._to_connect.pop(0), self.options.answer_timeout, retry=bool(self.links))
            else:
                raise ReplayError(
                    f"the recording's connection #{info.conn_index} was opened by the {self.side}: "
                    "give --connect HOST:PORT (once per connection it opens)"
                )
        else:
            link = self._accept(info.conn_index, deadline)
        self._attach(info.conn_index, link)

    def _accept(self, conn_index: int, deadline: float) -> Link:
        listeners = self.options.listeners
        if not listeners:
            raise ReplayError(
                f"the recording's connection #{conn_index} was opened by the peer: give --listen HOST:PORT"
            )
        while True:
            for listener in listeners:
                link = listener.accept()
                if link is not None:
                    return link
            left = deadline - time.monotonic()
            if left <= 0:
                waited = self.options.connect_timeout or self.options.answer_timeout
                raise ReplayError(f"no client connected within {waited:g} s")
            select.select([ls.sock for ls in listeners], [], [], min(left, 1.0))

    def _attach(self, conn_index: int, link: Link) -> None:
        self.links[conn_index] = link
        self._live_order.append(link)
        live_index = len(self._live_order)
        assert self.transcript is not None
        port = self.options.record_ports.get(link.server[1], link.server[1])
        self.transcript.open(live_index, link.client, (link.server[0], port))
        self._streams[live_index] = StreamBytes()

    # --------------------------------------------------------------- bytes

    def _send(self, link: Link, data: bytes, deadline_s: float) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + deadline_s
        live_index = self._live_order.index(link) + 1
        while view:
            if link.eof and link.reset:
                raise _Stop("the live peer reset the connection")
            try:
                n = link.send(view)
            except (BrokenPipeError, ConnectionResetError):
                self._pump(0)  # what it sent before: its refusal, maybe
                if not link.eof:
                    link.eof = link.reset = True
                    self.transcript.ended(live_index, not link.we_are_client, reset=True)
                    if self.options.log:
                        self.events.append(("end", live_index, "reset"))
                raise _Stop("the live peer reset the connection") from None
            except BlockingIOError:
                n = 0
            if n:
                chunk = bytes(view[:n])
                assert self.transcript is not None
                self.transcript.sent(live_index, link.we_are_client, chunk)
                view = view[n:]
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Stop(f"the live peer read nothing for {deadline_s:g} s (its receive buffer is full)")
            self._pump(min(left, 0.05))  # keep reading while it cannot: it may be waiting to write
            select.select([], [link.write_fd], [], min(left, 0.05))

    def _pump(self, timeout: float) -> int:
        """Read what the live links have (waiting at most ``timeout``); judge and match it.
        Returns the number of peer frames read that carry the conversation on: compared, or the
        answer to an ``Ask`` (not a keep-alive or a credit top-up, which a live peer may send
        forever while a recorded frame never comes)."""
        links = [link for link in self._live_order if not link.eof]
        if not links:
            if timeout > 0:
                time.sleep(min(timeout, 0.05))
            return 0
        ready, _, _ = select.select([link.read_fd for link in links], [], [], max(0.0, timeout))
        if not ready:
            return 0
        assert self.transcript is not None
        for link in links:
            if link.read_fd not in ready:
                continue
            try:
                data = link.recv()
            except BlockingIOError:
                continue
            live_index = self._live_order.index(link) + 1
            if not data:
                link.eof = True
                self.transcript.ended(live_index, not link.we_are_client, reset=link.reset)
                if self.options.log:
                    self._judge()  # its last frames come before its end
                    self.events.append(("end", live_index, "reset" if link.reset else "closed"))
                continue
            self._streams[live_index].buf += data
            self.transcript.sent(live_index, not link.we_are_client, data)
        return self._judge()

    def _from_us(self, conn_index: int, direction: str | None) -> bool:
        link = self._live_order[conn_index - 1] if 0 < conn_index <= len(self._live_order) else None
        return link is not None and (direction == "initiator>responder") == link.we_are_client

    def _live_records(self) -> Iterator[dict]:
        """The live frames' records, but for runs of our own accepted frames: no rule broken, and
        nothing of them is compared (most of what a fast source or producer sends)."""
        assert self.transcript is not None
        for item in self.transcript.items():
            if type(item) is FrameBlock:
                shared = item.shared
                if not self.options.log and self._from_us(
                    shared.get("conn_index") or 0, shared.get("direction")
                ):
                    continue
                yield from item.records()
            else:
                yield item

    def _judge(self) -> int:
        assert self.transcript is not None
        got = 0
        for record in self._live_records():
            link_index = record.get("conn_index") or 0
            ours = self._from_us(link_index, record.get("direction"))
            if self.options.log:
                self.events.append(("ours" if ours else "peer", record))
            if ours:
                if record.get("verdict") == "violation":
                    self.own_violation_count += 1
                    if len(self.own_violations) < self.options.keep:
                        self.own_violations.append(
                            f"live packet {record.get('packet')} {record.get('type')}: "
                            + "; ".join(record.get("violations") or ())
                        )
                continue
            raw = b""
            stream = self._streams.get(link_index)
            if stream is not None and record.get("offset") is not None and record.get("length"):
                raw = stream.take(record["offset"], record["length"])
            self.received += 1
            if self.adapter.incoming(record, raw):
                got += 1
                continue  # the answer to the adapter's own question (an Ask): not the recording's
            units = self._adapter_units(record, raw) if self._adapter_units else self._units(record)
            units = units or ([record] if record.get("verdict") == "violation" else [])
            got += bool(units)
            for unit in units:
                self.matcher.seen(unit)
        self.transcript.flush(before=self.matcher.oldest_early_packet())
        return got

    # --------------------------------------------------------------- play

    def _answer_owed(self) -> None:
        """Send what the adapter's ``owed()`` says the live peer is owed beyond the recording (the
        answer to a frame it never had: a Kinesis processor's extra checkpoint, which blocks until
        answered). Asked only while waiting, when the walk has expected every recorded frame before
        the next played one. Not progress: a wait's deadline stays (answering a peer's NOOPs
        would otherwise wait for a missing frame forever)."""
        owed = getattr(self.adapter, "owed", None)
        while owed is not None and (due := owed()) is not None:
            record, data = due
            self._send(self._live_order[record["conn_index"] - 1], data, self.options.answer_timeout)

    def _patience(self) -> float:
        """How long a recorded answer or an allowance is waited for: once the fuzzed frames began,
        the peer may owe neither, so ``settle``, unless ``owes`` says it owes an answer still."""
        settle, owes = self.options.settle, self.options.owes
        if self._fuzzed and settle is not None and not (owes is not None and owes(self.events)):
            return settle
        return self.options.answer_timeout

    def _wait_answers(self, before: int, frame: Frame | None = None) -> None:
        """Until every peer frame recorded before frame ``before`` came, or one waited too long, or
        the adapter says ``frame`` need not wait any longer."""
        front = None
        since = time.monotonic()
        while True:
            self._answer_owed()
            waiting = self.matcher.outstanding_before(before)
            if waiting is None or (frame is not None and not self.adapter.waits(frame)):
                return
            if waiting is not front:  # each answer gets its own deadline, whatever else comes
                front, since = waiting, time.monotonic()
            timeout = self._patience()
            deadline = since + timeout
            if self._quiet:
                if self.received == self._silent_at and not self._pump(0):
                    while (more := self.matcher.outstanding_before(before)) is not None:
                        self.matcher.give_up(more, f"not waited for: {QUIET}")
                    return
                self._quiet = False  # it speaks again
            if all(link.eof for link in self._live_order) and self._live_order:
                how = "reset" if any(link.reset for link in self._live_order) else "closed"
                self.matcher.settle_violations()
                self.matcher.give_up(waiting, f"the live peer {how} the connection before sending it")
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                self.matcher.settle_violations()
                self._quiet = self._silent_at == self.received  # nothing came through two deadlines
                self.matcher.give_up(waiting, f"no answer within {timeout:g} s (--answer-timeout)")
                while (more := self.matcher.outstanding_before(before)) is not None:
                    self.matcher.give_up(more, "not waited for after an earlier answer did not come")
                self._silent_at = self.received
                return
            self._pump(left)

    def _outgoing(self, frame: Frame, link: Link) -> bytes:
        since = time.monotonic()
        while True:
            timeout = self._patience()
            deadline = since + timeout
            self._answer_owed()
            out = self.adapter.outgoing(frame)
            if isinstance(out, adapters.Ask):
                self._flush_batch()  # our frames before it go first
                self._send(link, out.data, timeout)
                continue
            if not isinstance(out, adapters.Hold):
                return out
            self._flush_batch()
            if self._quiet and self.received == self._silent_at and not self._pump(0):
                raise _Stop(f"{frame.type} held: {out.reason}; {QUIET}")
            if self._live_order and all(link.eof for link in self._live_order):
                raise _Stop(f"{frame.type} held: {out.reason}; the live peer closed the connection")
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Stop(f"{frame.type} held for {timeout:g} s: {out.reason}")
            self._pump(left)

    def _flush_batch(self) -> None:
        """Send our frames held back to go in one write, as the recording's packet held them
        (a peer may act on how they come: answer a close-ack before the close that came with it)."""
        if self._batch:
            link = self._batch_at[0]
            data = bytes(self._batch)
            self._batch.clear()
            self._batch_at = (None, 0)
            self._send(link, data, self.options.answer_timeout)

    def _flush_batch_quietly(self) -> None:
        with contextlib.suppress(_Stop):
            self._flush_batch()

    def _pace(self, frame: Frame) -> None:
        speed = self.options.speed
        ts = frame.record.get("ts")
        if speed is None or ts is None:
            return
        if self._start_ts is None:
            self._start_ts, self._start_wall = ts, time.monotonic()
            return
        due = self._start_wall + (ts - self._start_ts) / speed
        while (left := due - time.monotonic()) > 0:
            self._pump(left)

    def run(self) -> Report:
        """Play the whole conversation; ``ReplayError`` if it cannot start."""
        options = self.options
        started = time.monotonic()
        ports = sorted(
            {c.server[1] for c in self.conversation.connections} | set(options.record_ports.values())
        )
        try:
            self.transcript = Transcript(self.conversation.protocol, ports, options.record)
        except OSError as err:
            raise ReplayError(f"cannot write --record {options.record}: {err.strerror or err}") from None
        stopped = None
        last_index = -1
        try:
            for frame in frames(self.conversation) if self.steps is None else self.steps:
                last_index = frame.index
                fuzz_from = self.options.fuzz_from
                self._fuzzed = fuzz_from is not None and frame.index >= fuzz_from
                link = self.links.get(frame.conn_index)
                if link is None:
                    self._flush_batch()  # the peer may open its connection once it has them
                    try:
                        link = self._open(frame)
                    except LinkError as err:
                        raise ReplayError(str(err)) from None
                if frame.sender:  # whose are the recorded connection's initiator>responder bytes
                    self._initiator_is_us[frame.conn_index] = (frame.sender == self.side) == (
                        frame.record.get("direction") == "initiator>responder"
                    )
                if frame.sender == self.side:
                    if frame.record.get("length") and len(frame.raw) != frame.record["length"]:
                        raise _Stop(
                            f"recorded frame {frame.index} ({frame.type}) lies past a lost segment: "
                            "its bytes were not captured, so it cannot be sent"
                        )
                    if (link, frame.packet) != self._batch_at or frame.note:
                        self._flush_batch()
                    self._wait_answers(frame.index, frame)
                    # a frame that broke a rule when recorded goes as it was (fuzz's reproducers)
                    as_recorded = frame.as_is or frame.record.get("verdict") in ("violation", "malformed")
                    if frame.as_is:
                        data = frame.raw
                    else:
                        data = self.adapter.as_recorded(frame) if as_recorded else self._outgoing(frame, link)
                    if frame.edit is not None:
                        data = frame.edit(data)
                    if frame.as_is or frame.edit is not None:
                        self.adapter.sent(frame, data)
                    if data:
                        self._pace(frame)
                        self._batch += data
                        self._batch_at = (link, frame.packet)
                        self.sent += 1
                    else:  # nothing of ours waits to go: read what came (ours go first, as recorded)
                        self._pump(0)
                    if frame.note or frame.then:
                        self._flush_batch()  # a fuzzed frame goes alone, its note on its own packet
                        if frame.note:
                            self.transcript.comment(self.transcript.feed.packets, frame.note)
                        if frame.then:
                            if frame.then != "reset":  # a refusal of an illegal frame comes first;
                                self._wait_owed()  # a reset is abrupt on purpose
                            self._end_ours(link, reset=frame.then == "reset")
                            break
                elif frame.sender:
                    self._flush_batch()
                    fields = self.adapter.expected(frame)
                    for unit in fields if isinstance(fields, list) else self._units(fields):
                        self.matcher.expect(frame.index, unit)
                    self._pump(0)
            self._flush_batch()
            self._wait_answers(1 << 62)
            self._finish()
            self.matcher.give_up_all("never came")  # what came early and was never expected: extra
        except _Stop as stop:
            if self.options.owes is not None:  # fuzzing: what the peer owes for our frames, read
                self._flush_batch_quietly()
                self._wait_owed()
            stopped = f"{stop} (at recorded frame {last_index})"
            self.matcher.give_up_all(f"not waited for: the replay stopped ({stop})")
        finally:
            self._close()
        counts = {r.value: n for r, n in self.matcher.counts.items()}
        return Report(
            self.conversation.protocol,
            self.side,
            counts,
            self.matcher.kept,
            self.own_violations,
            self.sent,
            self.received,
            time.monotonic() - started,
            stopped,
            [
                f"{link.client[0]}:{link.client[1]} > {link.server[0]}:{link.server[1]}"
                for link in self._live_order
            ],
            notes=[self.conversation.cut] if self.conversation.cut else [],
            own_violation_count=self.own_violation_count,
        )

    def _wait_owed(self) -> None:
        """Fuzzing: what the peer still owes (``Options.owes``: an answer, a refusal) is waited for
        before we end, however the play ended."""
        owes = self.options.owes
        if owes is None:
            return
        self._judge()  # our frames just sent: what they are owed is read from their verdicts
        deadline = time.monotonic() + self.options.answer_timeout
        while owes(self.events) and not all(link.eof for link in self._live_order):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._pump(left)

    def _end_ours(self, link: Link, reset: bool) -> None:
        """Fuzzing's half-close or reset of one connection: nothing of ours follows on any."""
        assert self.transcript is not None
        live_index = self._live_order.index(link) + 1
        if reset:
            link.abort()
        else:
            link.shutdown_write()
        self.transcript.ended(live_index, link.we_are_client, reset=reset)
        if self.options.log:
            self.events.append(("we-end", live_index, "reset" if reset else "closed"))

    def _finish(self) -> None:
        """The played side is done: half-close (after the peer, where the recording's peer closed
        first: some peers take an early close for a lost connection and reconnect), and read what
        the peer still sends until it closes too (or a short while passes)."""
        first_end = self.conversation.first_end
        peer_first = [
            link
            for conn_index, link in self.links.items()
            if conn_index in first_end and first_end[conn_index] != self._initiator_is_us.get(conn_index)
        ]
        deadline = time.monotonic() + self.options.answer_timeout
        self._wait_owed()
        while any(not link.eof for link in peer_first):  # the recording's peer closed first: let it
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._pump(left)
        for link in self._live_order:
            link.shutdown_write()
            live_index = self._live_order.index(link) + 1
            assert self.transcript is not None
            self.transcript.ended(live_index, link.we_are_client)
            if self.options.log:
                self.events.append(("we-end", live_index, "closed"))
        deadline = time.monotonic() + min(self.options.answer_timeout, 2.0)
        while any(not link.eof for link in self._live_order):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._pump(left)

    def _close(self) -> None:
        for link in self._live_order:
            with contextlib.suppress(OSError):
                link.close()
        if self.transcript is not None:
            self.transcript.close()


def run(conversation: Conversation, options: Options, on_outcome: Any = None) -> Report:
    return Player(conversation, options, on_outcome).run()


def learn_noise(conversation: Conversation, options: Options, runs: int) -> frozenset[str]:
    """The fields of the peer's frames that differ between ``runs`` replays against the same peer
    (as Diffy finds noise from two references): each run is recorded, and each after the first
    is compared with it as ``diff`` compares two captures (streamed, whatever their size)."""
    if runs < 2:
        raise ReplayError("--learn-noise needs at least 2 runs: noise is what differs between them")
    peer = tuple(side for side in conversation.sides if side != options.side)
    learned: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="wallaroo-proto-learn-") as folder:
        recorded = []
        for run_number in range(runs):
            path = os.path.join(folder, f"run-{run_number}.pcapng")
            player = Player(conversation, replace(options, record=path))
            player.run()
            ports = tuple(sorted({link.server[1] for link in player._live_order}))
            recorded.append(find(path, protocol=conversation.protocol, ports=ports or None))
        for other in recorded[1:]:
            report = diff(recorded[0], other, options.ignore, sides=peer)
            for outcome in report.outcomes:
                learned.update(name for name, _, _ in outcome.fields)
    return frozenset(learned)
