"""Declarative fault injection for the mock sink: read from TOML or JSON, never run as code.

A fault file holds up to four lists of rules (all keys optional)::

    [[abort_vote]]            # vote abort at PHASE1 ...
    txn_id = "c_id=(3|7)$"    # ... when the txn id matches this regex, or
    # payload = "poison"      # ... when a MESSAGE payload in the txn matches (bytes regex)
    # stream = 1              # the stream that payload rule watches (0 or 1, default 1)

    [[close]]                 # close the worker's connection
    at = "before_phase1_reply"   # or "after_phase1_reply"
    txn_id = ".*"             # optional regex; default any txn

    [[exit]]                  # hard exit (os._exit, like kill -9: nothing flushed, no cleanup)
    at = "after_data_write"   # or before_phase1_fsync, after_phase1_reply, before_phase2_apply
    code = 137                # exit status, default 137

    [[delay]]
    reply = "phase1"          # or "uncommitted" (REPLY_UNCOMMITTED) or "phase2"
    ms = 250

Every rule also takes ``skip`` (let the first N matches pass, default 0) and
``count`` (fire at most N times, default unlimited). Unknown keys, wrong
types and bad regexes are refused with a message that names the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from wallaroo_proto.rules_file import RulesFileError, read_rules_file

EXIT_POINTS = ("after_data_write", "before_phase1_fsync", "after_phase1_reply", "before_phase2_apply")
CLOSE_POINTS = ("before_phase1_reply", "after_phase1_reply")
DELAY_REPLIES = ("phase1", "uncommitted", "phase2")
_COMMON = {"skip": int, "count": int}
_SCHEMA: dict[str, dict[str, type]] = {
    "abort_vote": {"txn_id": str, "payload": str, "stream": int, **_COMMON},
    "close": {"at": str, "txn_id": str, **_COMMON},
    "exit": {"at": str, "txn_id": str, "code": int, **_COMMON},
    "delay": {"reply": str, "ms": int, "txn_id": str, **_COMMON},
}


class FaultFileError(ValueError):
    """A fault file that cannot be used; the message names the file and the bad key."""


@dataclass(slots=True)
class Rule:
    kind: str
    where: str  # "abort_vote[0]" for messages
    at: str = ""
    txn_id: re.Pattern | None = None
    payload: re.Pattern | None = None
    stream: int = 1
    code: int = 137
    ms: int = 0
    skip: int = 0
    count: int | None = None
    fired: int = 0
    seen: int = 0

    def matches_txn(self, txn_id: str) -> bool:
        return self.txn_id is None or self.txn_id.search(txn_id) is not None

    def fire(self) -> bool:
        """Count one match; True if the rule acts on it (after ``skip``, within ``count``)."""
        self.seen += 1
        if self.seen <= self.skip or (self.count is not None and self.fired >= self.count):
            return False
        self.fired += 1
        return True


@dataclass(slots=True)
class Faults:
    rules: list[Rule] = field(default_factory=list)
    source: str = ""

    def of(self, kind: str, at: str | None = None) -> list[Rule]:
        return [r for r in self.rules if r.kind == kind and (at is None or r.at == at)]

    def abort_vote_for_txn(self, txn_id: str) -> str | None:
        """The reason to vote abort for this txn id, if a txn-id rule fires."""
        for rule in self.of("abort_vote"):
            if rule.txn_id is not None and rule.matches_txn(txn_id) and rule.fire():
                return f"fault {rule.where}: txn id {txn_id!r} matches {rule.txn_id.pattern!r}"
        return None

    def payload_rules(self, stream: int) -> list[Rule]:
        return [r for r in self.of("abort_vote") if r.payload is not None and r.stream == stream]

    def payload_abort(self, stream: int, payload: bytes) -> str | None:
        for rule in self.payload_rules(stream):
            if rule.payload.search(payload) is not None and rule.fire():
                return f"fault {rule.where}: a payload on stream {stream} matches {rule.payload.pattern!r}"
        return None

    def should_close(self, at: str, txn_id: str) -> bool:
        return any(r.matches_txn(txn_id) and r.fire() for r in self.of("close", at))

    def exit_code(self, at: str, txn_id: str = "") -> int | None:
        for rule in self.of("exit", at):
            if rule.matches_txn(txn_id) and rule.fire():
                return rule.code
        return None

    def never_fired(self) -> list[str]:
        """The rules that did not act once, said as what they waited for: a run that tested nothing
        of them should not pass for one that did."""
        notes = []
        for rule in self.rules:
            if rule.fired:
                continue
            if rule.seen:
                notes.append(
                    f"fault {rule.where} never fired: {rule.seen} match(es), all within skip {rule.skip}"
                )
            else:
                wanted = rule.txn_id.pattern if rule.txn_id is not None else None
                wanted = wanted or (rule.payload.pattern if rule.payload is not None else None)
                what = f"nothing matched {wanted!r}" if wanted else "its moment never came"
                notes.append(f"fault {rule.where} never fired: {what}")
        return notes

    def delay_ms(self, reply: str, txn_id: str = "") -> int:
        return sum(r.ms for r in self.of("delay", reply) if r.matches_txn(txn_id) and r.fire())


NO_FAULTS = Faults()


def load_faults(path: str | Path) -> Faults:
    """Read and validate a fault file (``.json`` is JSON, anything else TOML)."""
    path = Path(path)
    try:
        data = read_rules_file(path, json_suffix=True, text_mode=True)
    except RulesFileError as err:
        if not err.syntax:
            raise FaultFileError(f"{path}: cannot read fault file: {err.cause}") from err
        raise FaultFileError(
            f"{path}: not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {err.cause}"
        ) from err
    return parse_faults(data, str(path))


def parse_faults(data: object, source: str = "<faults>") -> Faults:
    if not isinstance(data, dict):
        raise FaultFileError(f"{source}: the top level must be a table/object of rule lists")
    faults = Faults(source=source)
    for kind, rules in data.items():
        if kind not in _SCHEMA:
            raise FaultFileError(f"{source}: unknown key {kind!r}; expected one of {', '.join(_SCHEMA)}")
        if isinstance(rules, dict):
            rules = [rules]
        if not isinstance(rules, list):
            raise FaultFileError(f"{source}: {kind} must be a list of tables")
        for i, spec in enumerate(rules):
            faults.rules.append(_rule(kind, i, spec, source))
    return faults


def _rule(kind: str, i: int, spec: object, source: str) -> Rule:
    where = f"{kind}[{i}]"
    if not isinstance(spec, dict):
        raise FaultFileError(f"{source}: {where} must be a table/object")
    schema = _SCHEMA[kind]
    for key, value in spec.items():
        if key not in schema:
            raise FaultFileError(f"{source}: {where}.{key}: unknown key; expected one of {', '.join(schema)}")
        want = schema[key]
        if type(value) is not want:
            raise FaultFileError(
                f"{source}: {where}.{key}: must be {want.__name__}, not {type(value).__name__} ({value!r})"
            )
        if want is int and value < 0:
            raise FaultFileError(f"{source}: {where}.{key}: must not be negative ({value})")
    rule = Rule(kind, where, skip=spec.get("skip", 0), count=spec.get("count"))
    if "txn_id" in spec:
        rule.txn_id = _regex(spec["txn_id"], f"{where}.txn_id", source)
    if kind == "abort_vote":
        if ("txn_id" in spec) == ("payload" in spec):
            raise FaultFileError(f"{source}: {where}: give exactly one of txn_id or payload")
        if "payload" in spec:
            rule.payload = _regex(spec["payload"].encode("utf-8"), f"{where}.payload", source)
        rule.stream = spec.get("stream", 1)
        if rule.stream not in (0, 1):
            raise FaultFileError(f"{source}: {where}.stream: a sink has streams 0 and 1, not {rule.stream}")
        if "stream" in spec and "payload" not in spec:
            raise FaultFileError(f"{source}: {where}.stream: only meaningful with payload")
    elif kind in ("close", "exit"):
        points = CLOSE_POINTS if kind == "close" else EXIT_POINTS
        at = spec.get("at")
        if at not in points:
            raise FaultFileError(f"{source}: {where}.at: must be one of {', '.join(points)}, not {at!r}")
        rule.at = at
        rule.code = spec.get("code", 137)
        if rule.code > 255:
            raise FaultFileError(f"{source}: {where}.code: an exit status is 0..255, not {rule.code}")
    else:
        reply = spec.get("reply")
        if reply not in DELAY_REPLIES:
            raise FaultFileError(
                f"{source}: {where}.reply: must be one of {', '.join(DELAY_REPLIES)}, not {reply!r}"
            )
        if "ms" not in spec:
            raise FaultFileError(f"{source}: {where}.ms: missing (the delay in milliseconds)")
        rule.at = reply
        rule.ms = spec["ms"]
    return rule


def _regex(pattern: str | bytes, where: str, source: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise FaultFileError(f"{source}: {where}: bad regular expression {pattern!r}: {err}") from err
