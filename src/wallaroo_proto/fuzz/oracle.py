"""The oracle: what one played mutant tells of the peer, beyond whether it crashed.

It reads the live conversation as the core judged it (``Player.events``: every frame of
both sides with its verdict, and the peer's ends, in order) and says what is wrong:

* ``crash``: the peer's process exited, or grew beyond ``--max-rss``;
* ``reset``: the peer reset a connection while everything we had sent was legal;
* ``violation``: a frame of the peer broke a rule (the core's verdict), while everything we
  had sent before it was legal;
* ``accepted``: we sent an illegal frame and the peer went on as if it were legal: no error
  reply, no close;
* ``no-error-reply``: we sent an illegal frame and the peer closed without the error reply
  its protocol requires of it;
* ``silent``: a legal frame of ours owed an answer (the hooks' ``owed``) that never came,
  the peer neither answering nor closing within ``--answer-timeout``;
* ``no-reconnect``: a frame of ours owed a new connection (a RESTART) and none came.

Each execution also gives its coverage: (state, frame sent, reaction) for each frame of ours,
the state being the type of the peer's last frame before it (or the hooks' ``state``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .hooks import Hooks

BAD = ("violation", "malformed")


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong with the peer; ``key`` deduplicates."""

    kind: str
    state: str
    sent: str
    reaction: str
    detail: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.kind, self.state, self.sent, self.reaction)


@dataclass
class Verdicts:
    findings: list[Finding] = field(default_factory=list)
    #: (state, frame sent, reaction) for each frame of ours.
    coverage: set[tuple[str, str, str]] = field(default_factory=set)
    #: The peer's frame types and ends, in order: two runs of one conversation compare them.
    signature: tuple[str, ...] = ()
    #: Frames in the live conversation (both sides).
    frames: int = 0
    #: Whether we sent an illegal frame.
    illegal: bool = False


def _kind(record: dict) -> str:
    return str(record.get("type") or record.get("verdict") or "?")


def _rule(record: dict) -> str:
    texts = record.get("violations") or [record.get("reason") or record.get("error") or "a rule"]
    return str(texts[0])


def _rule_key(record: dict) -> str:
    """The rule broken, with its numbers left out: one rule broken with other ids is one finding."""
    return re.sub(r"\d+", "#", _rule(record))[:80]


def judge(
    events: list[tuple],
    hooks: Hooks,
    peer: str,
    sent_label: str = "",
    exited: str | None = None,
    reconnected: bool | None = None,
) -> Verdicts:
    """The findings and coverage of one execution (see the module's docstring). ``sent_label``
    names the mutation (the findings' ``sent``); ``exited`` says how the peer's process ended;
    ``reconnected`` whether a new connection came after the run (None: not watched)."""
    out = Verdicts()
    last_peer = "start"
    illegal: dict | None = None  # our first illegal frame
    refused = False
    ended: str | None = None
    owed: list[tuple[dict, frozenset[str], str]] = []  # (our record, types owed, state then)
    reconnect_owed: tuple[dict, str] | None = None
    pending: list[tuple[str, str]] = []  # (state, our type) waiting for the peer's reaction
    signature: list[str] = []
    frames = 0
    for event in events:
        if event[0] == "end":
            how = event[2]
            signature.append(how)
            ended = ended or how
            for state, sent in pending:
                out.coverage.add((state, sent, how))
            pending = []
            if how == "reset" and illegal is None:
                out.findings.append(
                    Finding(
                        "reset",
                        last_peer,
                        sent_label,
                        "reset",
                        "the peer reset the connection after legal frames only",
                    )
                )
            continue
        who, record = event
        frames += 1
        kind = _kind(record)
        bad = record.get("verdict") in BAD
        if who == "ours":
            pending.append((last_peer, kind + (" (illegal)" if bad else "")))
            if bad and illegal is None:
                illegal = record
                refused = hooks.tolerated(record)  # the protocol lets the peer pass over it
            elif not bad and illegal is None:
                due = hooks.owed(record)
                if due is not None and due.types:
                    owed.append((record, due.types, last_peer))
                if due is not None and due.reconnect:
                    reconnect_owed = (record, last_peer)
            continue
        signature.append(kind)
        for state, sent in pending:
            out.coverage.add((state, sent, kind))
        pending = []
        last_peer = kind
        if illegal is not None:
            if hooks.refusal(record):
                refused = True
            continue
        if bad:
            out.findings.append(
                Finding("violation", last_peer, sent_label, _rule_key(record), f"{kind}: {_rule(record)}")
            )
        for i, (_, types, _) in enumerate(owed):
            if kind in types:
                del owed[i]
                break
    for state, sent in pending:
        out.coverage.add((state, sent, ended or "silent"))
    if exited:
        out.findings.append(Finding("crash", last_peer, sent_label, "exited", exited))
    if illegal is not None and not refused:
        what = f"{_kind(illegal)}: {_rule(illegal)}"
        if ended is None:
            out.findings.append(
                Finding(
                    "accepted", last_peer, sent_label, "went on", f"the peer went on after our illegal {what}"
                )
            )
        elif peer in hooks.REPLY_BEFORE_CLOSE:
            out.findings.append(
                Finding(
                    "no-error-reply",
                    last_peer,
                    sent_label,
                    ended,
                    f"the peer {ended} the connection without an error reply to our illegal {what}",
                )
            )
    if illegal is None and owed and ended is None:
        record, types, state = owed[0]
        out.findings.append(
            Finding(
                "silent",
                state,
                sent_label,
                "silent",
                f"no {' or '.join(sorted(types))} for our {_kind(record)} within the answer timeout",
            )
        )
    if reconnect_owed is not None and reconnected is False:
        record, state = reconnect_owed
        out.findings.append(
            Finding(
                "no-reconnect",
                state,
                sent_label,
                ended or "silent",
                f"no new connection after our {_kind(record)}",
            )
        )
    out.illegal = illegal is not None
    out.signature = tuple(signature)
    out.frames = frames
    return out
