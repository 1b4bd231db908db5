"""The oracle: what one played mutant tells of the peer, beyond whether it crashed.

It reads the live conversation as the core judged it (``Player.events``: every frame of
both sides with its verdict, and the peer's ends, in order) and says what is wrong:

* ``crash``: the peer's process exited, or grew beyond ``--max-rss``;
* ``reset``: the peer reset a connection while everything we had sent was legal;
* ``violation``: a frame of the peer broke a rule (the core's verdict), while everything we
  had sent before it was legal;
* ``accepted``: we sent an illegal frame and the peer went on as if it were legal: no error
  reply, and no close before ours;
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

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "state": self.state,
            "mutation": self.sent,
            "reaction": self.reaction,
            "detail": self.detail,
        }


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


def outstanding(events: list[tuple], hooks: Hooks) -> bool:
    """Does the peer still owe an answer to a legal frame of ours, or a refusal of an illegal one
    (and has not ended)? Waited for before a case ends, however briefly the recorded answers were."""
    owed: list[tuple[dict, frozenset[str], str]] = []
    illegal = False
    for event in events:
        if event[0] == "end":
            return False
        if event[0] == "we-end":
            continue
        who, record = event
        if illegal:
            if who == "peer" and hooks.refusal(record):
                return False
            continue
        if who == "ours":
            if hooks.closed(record):
                return False  # we ended the session ourselves: nothing more is owed
            if record.get("verdict") in BAD:
                illegal = True  # owed a refusal: an error reply or an end
                continue
            due = hooks.owed(record)
            if due is not None and due.types:
                owed.append((record, due.types, ""))
        else:
            _answer(owed, _kind(record))
    return illegal or bool(owed)


def _answer(owed: list[tuple[dict, frozenset[str], str]], kind: str) -> None:
    """The first owed answer ``kind`` is one of is given: (our record, types owed, state then)."""
    for i, (_, types, _) in enumerate(owed):
        if kind in types:
            del owed[i]
            return


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
    ``reconnected`` whether a new connection came after the run (None: not watched). An end of
    the peer's counts as its refusal only if it came before ours (``we-end`` events)."""
    out = Verdicts()
    last_peer = "start"
    illegal: dict | None = None  # our first illegal frame
    refused: str | None = None  # how the peer refused it: "reply", or how it ended first
    ended: str | None = None  # how the peer ended, if it did
    we_ended: str | None = None  # how we ended, if we did before the peer
    owed: list[tuple[dict, frozenset[str], str]] = []  # (our record, types owed, state then)
    reconnect_owed: tuple[dict, str] | None = None
    pending: list[tuple[str, str]] = []  # (state, our type) waiting for the peer's reaction
    signature: list[str] = []
    frames = 0
    over = False  # we sent our own error reply
    in_flight: list[frozenset[str]] = []  # answers owed when we sent our illegal frame
    crossed = False  # one came after it: the peer answered before it read our frame
    judged = False  # a frame of ours was judged (bytes the dissector did not take for the protocol are not)

    def found(kind: str, reaction: str, detail: str, state: str | None = None) -> None:
        out.findings.append(Finding(kind, state or last_peer, sent_label, reaction, detail))

    for event in events:
        if event[0] == "we-end":
            we_ended = we_ended or event[2]
            continue
        if event[0] == "end":
            how = event[2]
            signature.append(how)
            if ended is None:
                ended = how
                for state, sent in pending:
                    out.coverage.add((state, sent, how))
                pending = []
                if illegal is not None and refused is None and we_ended is None:
                    refused = how
                elif how == "reset" and judged and illegal is None and we_ended is None and not over:
                    found("reset", "reset", "the peer reset the connection after legal frames only")
            continue
        who, record = event
        frames += 1
        kind = _kind(record)
        bad = record.get("verdict") in BAD
        if who == "ours":
            judged = True
            pending.append((last_peer, kind + (" (illegal)" if bad else "")))
            if over:
                continue
            if hooks.closed(record) and illegal is None:
                over = True  # we ended the session ourselves (an ERROR, a Close): nothing more is owed
                owed.clear()
                continue
            if bad and illegal is None:
                illegal = record
                refused = "tolerated" if hooks.tolerated(record) else None  # the peer may pass over it
                if ended is not None:  # the peer had ended before it came whole: it never took it
                    refused = "gone"
                if we_ended == "closed":  # judged at our close (a cut line): the peer's close answers it
                    we_ended = None
                in_flight = [types for _, types, _ in owed]
            elif not bad and illegal is None:
                due = hooks.owed(record)
                if due is not None and due.types:
                    owed.append((record, due.types, last_peer))
                if due is not None and due.reconnect:
                    reconnect_owed = (record, last_peer)
            continue
        name = hooks.signature(kind)
        if not signature or signature[-1] != name:
            signature.append(name)
        for state, sent in pending:
            out.coverage.add((state, sent, kind))
        pending = []
        last_peer = kind
        if illegal is not None:
            if hooks.refusal(record) and refused is None:
                refused = "reply"
            elif any(kind in types for types in in_flight):
                crossed = True  # answered before it read our frame, which may be legal in its order
            continue
        if hooks.closed(record):  # the peer refused a frame the core finds legal (it may know more:
            over = True  # a vote it cast) or ended the session: what it then does is its own
            owed.clear()
        if bad:
            found("violation", _rule_key(record), f"{kind}: {_rule(record)}")
        _answer(owed, kind)
    for state, sent in pending:
        out.coverage.add((state, sent, ended or "silent"))
    if exited and not (illegal is not None and peer in hooks.REFUSE_BY_EXIT):
        found("crash", "exited", exited)
    if illegal is not None:
        what = f"{_kind(illegal)}: {_rule(illegal)}"
        if crossed:
            pass  # an answer owed before it came after it: the peer may have read it as legal
        elif refused is None and we_ended != "reset" and not (exited and peer in hooks.REFUSE_BY_EXIT):
            found(
                "accepted",
                "went on",
                f"the peer went on after our illegal {what}: no refusal before we ended",
            )
        elif refused not in (None, "reply", "tolerated", "gone") and peer in hooks.REPLY_BEFORE_CLOSE:
            found(
                "no-error-reply",
                refused,
                f"the peer {refused} the connection without an error reply to our illegal {what}",
            )
    elif owed and we_ended != "reset":
        record, types, state = owed[0]
        how = f"{ended} the connection" if ended else "sent none within the answer timeout"
        found(
            "silent",
            ended or "silent",
            f"no {' or '.join(sorted(types))} for our {_kind(record)}: the peer {how}",
            state,
        )
    if reconnect_owed is not None and reconnected is False:
        record, state = reconnect_owed
        found("no-reconnect", ended or "silent", f"no new connection after our {_kind(record)}", state)
    out.illegal = illegal is not None
    out.signature = tuple(signature)
    out.frames = frames
    return out
