"""The campaign: seeds played, mutated while they find new states, findings confirmed, shrunk
and written as captures that ``replay`` plays and ``dissect`` reads.

One execution plays one mutant with replay's engine (``replay.engine.Player``): the frames
still follow the live peer through the protocol's replay adapter, the core judges every live
frame, and ``oracle`` reads the result. Given ``seed``, the choices are the same each run, so
a deterministic peer gives the same campaign.
"""

from __future__ import annotations

import os
import random
import select
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from wallaroo_proto.protocols import get_plugin
from wallaroo_proto.replay.engine import Options, Player, ReplayError
from wallaroo_proto.replay.links import Listener
from wallaroo_proto.replay.recording import Conversation, Frame, frames

from . import mutate
from .hooks import Hooks
from .mutate import Mutant
from .oracle import Finding, Verdicts, judge, outstanding
from .peer import PeerError, PeerProcess
from .shrink import shrink
from .states import StateGraph

#: Seconds a recorded answer is waited for once a changed frame went: the peer may owe none now.
#: What it does owe (``hooks.owed``) is waited for up to the answer timeout before a case ends.
SETTLE = 0.01


#: A finding is confirmed with this many times the answer timeout (and at least CONFIRM_FLOOR
#: seconds): what a loaded machine made late is not a finding; what never comes still is.
CONFIRM_PATIENCE = 4.0
CONFIRM_FLOOR = 2.0
#: Shrinking's tries wait twice the answer timeout: many tries, each cheaper than a confirmation.
SHRINK_PATIENCE = 2.0


class FuzzError(Exception):
    """The campaign cannot start (exit 2)."""


class PeerGone(Exception):
    """The peer stopped taking connections for good: the campaign ends with what it found."""


@dataclass
class Settings:
    side: str
    connect: list[tuple[str, int]] = field(default_factory=list)
    listen: list[tuple[str, int]] = field(default_factory=list)
    spawn: str | None = None
    reset_cmd: str | None = None
    answer_timeout: float = 0.5
    #: Seconds a peer process started for a case is waited for to connect.
    connect_timeout: float = 10.0
    confirm: int = 3
    budget_seconds: float | None = 60.0
    budget_runs: int | None = None
    #: Findings written after which the campaign ends (None: the whole budget).
    stop_after: int | None = None
    seed: int = 0
    max_rss: float | None = None
    shrink_seconds: float = 60.0
    findings_dir: str = "fuzz-findings"
    states: str | None = None


@dataclass
class Found:
    """A finding, confirmed and shrunk, and where its reproducer is."""

    finding: Finding
    mutant: Mutant
    label: str
    confirmed: int
    tries: int
    capture: str | None = None
    frames: int = 0
    shrink_seconds: float = 0.0

    @property
    def deterministic(self) -> bool:
        return self.confirmed == self.tries

    def as_dict(self) -> dict:
        f = self.finding
        return {
            "kind": f.kind,
            "state": f.state,
            "mutation": self.label,
            "reaction": f.reaction,
            "detail": f.detail,
            "confirmed": f"{self.confirmed} of {self.tries}",
            "deterministic": self.deterministic,
            "reproducer": self.capture,
            "frames": self.frames,
            "shrink_seconds": round(self.shrink_seconds, 2),
        }


@dataclass
class Summary:
    protocol: str
    side: str
    executions: int = 0
    seconds: float = 0.0
    states: int = 0
    corpus: int = 0
    found: list[Found] = field(default_factory=list)
    #: Findings seen once and never again in ``confirm`` tries.
    unconfirmed: int = 0
    #: Seeds whose two plays differed (the peer answered the same conversation differently).
    unsteady: list[str] = field(default_factory=list)
    seeds: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.executions / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict:
        return {
            "protocol": self.protocol,
            "played": self.side,
            "executions": self.executions,
            "seconds": round(self.seconds, 3),
            "executions_per_second": round(self.rate, 1),
            "states": self.states,
            "corpus": self.corpus,
            "seeds": self.seeds,
            "unsteady_seeds": self.unsteady,
            "unconfirmed": self.unconfirmed,
            "notes": self.notes,
            "findings": [f.as_dict() for f in self.found],
        }


@dataclass
class Seed:
    conversation: Conversation
    frames: list[Frame]
    name: str


def load_seed(conversation: Conversation, name: str, max_frames: int) -> Seed:
    """The conversation's frames in memory (at most ``max_frames``: fuzzing plays them many times)."""
    out = []
    for frame in frames(conversation):
        if len(out) >= max_frames:
            break
        out.append(frame)
    return Seed(conversation, out, name)


class Campaign:
    """Plays seeds and their mutants against one live peer (see the module's docstring)."""

    def __init__(
        self, seeds: list[Seed], settings: Settings, progress: Callable[[Summary], None] | None = None
    ) -> None:
        if not seeds:
            raise FuzzError("no seed conversation")
        protocols = {s.conversation.protocol for s in seeds}
        if len(protocols) > 1:
            raise FuzzError(
                f"the seeds hold conversations of several protocols ({', '.join(sorted(protocols))}): "
                "fuzz one at a time"
            )
        self.protocol = protocols.pop()
        self.seeds = seeds
        self.settings = settings
        self.hooks = Hooks(self.protocol)
        self.side = settings.side
        sides = seeds[0].conversation.sides
        if self.side not in sides:
            raise FuzzError(f"--play {self.side}: the seeds' sides are {' and '.join(sides)}")
        self.peer_side = next(s for s in sides if s != self.side)
        self.templates = self.hooks.templates(self.side)
        self.rng = random.Random(settings.seed)
        self.summary = Summary(self.protocol, self.side, seeds=len(seeds))
        self.graph = StateGraph()
        self.progress = progress
        try:
            self.listeners = [Listener(address) for address in settings.listen]
        except OSError as err:
            raise FuzzError(str(err)) from None
        mode = "client" if settings.listen else "server" if settings.connect else "stdio"
        self.peer = PeerProcess(
            settings.spawn,
            mode,
            ports=tuple(listener.address[1] for listener in self.listeners),
            connect=settings.connect[0] if settings.connect else None,
            max_rss=settings.max_rss,
            reset_cmd=settings.reset_cmd,
        )
        self.stdio = mode == "stdio"
        live = [listener.address[1] for listener in self.listeners] + [port for _, port in settings.connect]
        #: The live ports as the reproducers carry them: the protocol's own (dissect reads them as it).
        self.record_ports = dict(zip(live, get_plugin(self.protocol).default_ports, strict=False))
        self._last_progress = 0.0
        #: The findings written, by what their shrunk conversation is.
        self._shrunk: set[tuple] = set()
        #: A server refused the last case's connection: the next case checks it is back first.
        self._refused = False
        #: The answer timeout's multiple in this case: CONFIRM_PATIENCE while a finding is confirmed.
        self._patience = 1.0

    @property
    def ports(self) -> list[int]:
        return [listener.address[1] for listener in self.listeners]

    # ------------------------------------------------------------ one execution

    def execute(self, mutant: Mutant, record: str | None = None) -> Verdicts:
        seed = self.seeds[mutant.seed]
        steps = mutate.steps(mutant, seed.frames, self.side, self.hooks)
        s = self.settings
        options = Options(
            side=self.side,
            connect=list(s.connect),
            listeners=self.listeners,
            spawn=s.spawn if self.stdio else None,
            answer_timeout=s.answer_timeout * self._patience,
            connect_timeout=s.connect_timeout,
            record=record,
            keep=10,
            log=True,
            fuzz_from=min((e.at for e in mutant.edits), default=None),
            settle=min(s.answer_timeout * self._patience, SETTLE * self._patience),
            owes=lambda events: outstanding(events, self.hooks),
            record_ports=self.record_ports,
        )
        if self._refused and not self.peer.healthy():
            raise PeerGone(f"the peer no longer takes connections at {s.connect[0][0]}:{s.connect[0][1]}")
        self._refused = False
        self.peer.before()
        player = Player(seed.conversation, options, steps=steps)
        setup_error = None
        try:
            player.run()
        except ReplayError as err:
            setup_error = str(err)
        reconnected = self._reconnected(player.events) if self.listeners else None
        exited = self.peer.after()
        if self.stdio:
            exited = _stdio_exit(player)
        self._drain()
        label = mutant.kinds  # findings are told apart by the mutation's kind, not its place
        verdicts = judge(player.events, self.hooks, self.peer_side, label, exited, reconnected)
        if setup_error is not None:
            if self.peer.mode == "server" and self.summary.executions:
                self._refused = True  # the next case checks its health first
                verdicts.findings.append(
                    Finding(
                        "crash",
                        "start",
                        label,
                        "refused",
                        f"the peer stopped taking connections: {setup_error}",
                    )
                )
            else:
                raise FuzzError(setup_error)
        if self.peer.mode == "client" and verdicts.illegal:
            verdicts.findings = [f for f in verdicts.findings if f.kind != "crash" or self.peer.over_rss]
        self.summary.executions += 1
        return verdicts

    def _reconnected(self, events: list[tuple]) -> bool | None:
        """Whether a peer that owed a new connection (a RESTART) made one within the answer timeout."""
        owed = any(
            event[0] == "ours" and (due := self.hooks.owed(event[1])) is not None and due.reconnect
            for event in events
        )
        if not owed:
            return None
        deadline = time.monotonic() + self.settings.answer_timeout * self._patience
        socks = [listener.sock for listener in self.listeners]
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(socks, [], [], left)
            if ready:
                return True
        return False

    def _drain(self) -> None:
        """Connections left from the case (a reconnect) are closed: the next case starts afresh."""
        for listener in self.listeners:
            while (link := listener.accept()) is not None:
                link.close()

    # ------------------------------------------------------------ the campaign

    def run(self) -> Summary:
        s = self.settings
        started = time.monotonic()
        summary = self.summary
        seen: set[tuple] = set()
        corpus: list[Mutant] = []
        try:
            self._campaign(started, seen, corpus)
            if self._found_enough():
                count = len(summary.found)
                summary.notes.append(f"stopped after {count} finding{'s' * (count > 1)} (--stop-after)")
        except PeerGone as gone:
            summary.notes.append(f"{gone}: the campaign stopped")
        finally:
            self.peer.stop()
            for listener in self.listeners:
                listener.close()
        summary.seconds = time.monotonic() - started
        summary.states = len(self.graph.edges)
        summary.corpus = len(corpus)
        if s.states:
            self.graph.write(s.states)
        return summary

    def _campaign(self, started: float, seen: set[tuple], corpus: list[Mutant]) -> None:
        """Calibration, the deterministic stage, then random mutants until the budget is spent."""
        summary = self.summary
        for index, seed in enumerate(self.seeds):
            base = Mutant(index)
            # the first play may change what the peer keeps (a worker remembers where a stream
            # got to): of the three after it, two must agree (a racy peer may interleave once)
            plays = [self.execute(base) for _ in range(4)]
            signatures = [play.signature for play in plays[1:]]
            if len(set(signatures)) == len(signatures):
                summary.unsteady.append(seed.name)
            for play in plays:
                self._learn(play, base, corpus)
                for finding in play.findings:
                    self._consider(finding, base, seen)
        if len(summary.unsteady) == len(self.seeds):
            return
        if not corpus:
            corpus += [Mutant(i) for i in range(len(self.seeds))]
        for index, seed in enumerate(self.seeds):
            for mutant in mutate.sweep(index, seed.frames, self.side, self.templates):
                if self._spent(started):
                    break
                self._play(mutant, corpus, seen, started)
        while not self._spent(started):
            parent = self.rng.choice(corpus)
            if len(parent.edits) >= 3:
                parent = Mutant(parent.seed)
            seed = self.seeds[parent.seed]
            child = mutate.mutate(parent, seed.frames, self.side, self.hooks, self.rng, self.templates)
            if child is parent:
                break  # no frame of ours to change
            self._play(child, corpus, seen, started)

    def _play(self, mutant: Mutant, corpus: list[Mutant], seen: set[tuple], started: float) -> None:
        verdicts = self.execute(mutant)
        self._learn(verdicts, mutant, corpus)
        for finding in verdicts.findings:
            self._consider(finding, mutant, seen)
        self.summary.seconds = time.monotonic() - started
        self._tick()

    def _found_enough(self) -> bool:
        stop_after = self.settings.stop_after
        return stop_after is not None and len(self.summary.found) >= stop_after

    def _spent(self, started: float) -> bool:
        s = self.settings
        if self._found_enough():
            return True
        if s.budget_runs is not None and self.summary.executions >= s.budget_runs:
            return True
        return s.budget_seconds is not None and time.monotonic() - started >= s.budget_seconds

    def _tick(self) -> None:
        now = time.monotonic()
        if self.progress is not None and now - self._last_progress >= 0.5:
            self._last_progress = now
            self.summary.states = len(self.graph.edges)
            self.progress(self.summary)

    def _learn(self, verdicts: Verdicts, mutant: Mutant, corpus: list[Mutant]) -> None:
        if self.graph.add(verdicts.coverage):
            corpus.append(mutant)

    def _consider(self, finding: Finding, mutant: Mutant, seen: set[tuple]) -> None:
        """A finding not had before: confirmed ``confirm`` times, shrunk, and written."""
        if finding.key in seen:
            return
        seen.add(finding.key)
        tries = max(1, self.settings.confirm)
        try:
            self._patience = max(CONFIRM_PATIENCE, CONFIRM_FLOOR / self.settings.answer_timeout)
            hits = sum(self._gives(mutant, finding) for _ in range(tries))
        except PeerGone:  # the peer is gone for good: the finding stands as seen, unconfirmed
            self.summary.found.append(Found(finding, mutant, mutant.label, 1, 1))
            raise
        finally:
            self._patience = 1.0
        if hits == 0:
            self.summary.unconfirmed += 1
            return
        began = time.monotonic()
        self._patience = SHRINK_PATIENCE  # a try a loaded machine fails keeps frames not needed
        try:
            small = shrink(
                mutant,
                self.seeds[mutant.seed].frames,
                self.side,
                lambda m: self._gives(m, finding),
                self.settings.shrink_seconds,
            )
        finally:
            self._patience = 1.0
        shrunk_key = (finding.kind, finding.state, finding.reaction, small.label)
        if shrunk_key in self._shrunk:
            return  # another way to the same shrunk conversation
        self._shrunk.add(shrunk_key)
        found = Found(finding, small, small.label, hits, tries, shrink_seconds=time.monotonic() - began)
        found.capture, found.frames = self._write(found, len(self.summary.found) + 1)
        self.summary.found.append(found)
        if self.progress is not None:
            self.progress(self.summary)

    def _gives(self, mutant: Mutant, finding: Finding) -> bool:
        verdicts = self.execute(mutant)
        return any(f.kind == finding.kind and f.reaction == finding.reaction for f in verdicts.findings)

    def _write(self, found: Found, number: int) -> tuple[str | None, int]:
        """The reproducer: the shrunk mutant played once more, recorded, its mutated frames noted."""
        os.makedirs(self.settings.findings_dir, exist_ok=True)
        path = os.path.join(
            self.settings.findings_dir, f"{self.protocol}-{number:03d}-{found.finding.kind}.pcapng"
        )
        verdicts = self.execute(found.mutant, record=path)
        return path, verdicts.frames


def _stdio_exit(player: Player) -> str | None:
    """A process spoken to over its stdin ends when its input does, with any status (the Kinesis
    MLD never reads it): only a signal is a crash, or its kill for not ending within 5 s."""
    for link in player._live_order:
        process = getattr(link, "process", None)
        if process is not None and process.returncode == -9:
            return "the peer's process did not exit within 5 s of its input closing (killed)"
        if process is not None and process.returncode is not None and process.returncode < 0:
            return f"the peer's process was killed by signal {-process.returncode}"
    return None


def rerun(seed: Seed, settings: Settings) -> tuple[list[Finding], Summary]:
    """A reproducer played as it was recorded: its findings now (the same, if it still fails)."""
    campaign = Campaign([seed], replace(settings, confirm=1))
    try:
        verdicts = campaign.execute(Mutant(0))
    except PeerError as err:
        raise FuzzError(str(err)) from None
    finally:
        campaign.peer.stop()
        for listener in campaign.listeners:
            listener.close()
    campaign.summary.seconds = 0.0
    return verdicts.findings, campaign.summary


__all__ = ["Campaign", "FuzzError", "PeerError", "Settings", "Summary", "load_seed", "rerun"]
