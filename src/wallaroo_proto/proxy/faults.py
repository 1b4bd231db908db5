"""Protocol faults by rule, for the proxy: which frame, and what happens to it (sans-IO).

Rules come from a TOML file (``[[fault]]`` tables) or from ``--fault`` options
(``"ACTION key=value ..."``, the same keys). Each proxied connection gets a
``ConnectionFaults``: it splits each direction into frames with the protocol's
``faultkit.Adapter``, matches every frame against the rules in order (the first
rule that fires acts; the others only count the frame as seen), and says what the
relay must do, as ``Step`` values. The relay does the I/O and the waiting.

Generic actions, for every protocol: ``drop``, ``delay`` (``ms``: this frame and
those behind it in its direction wait), ``duplicate``, ``reorder`` (this frame goes
after the next one in its direction), ``rewrite`` (``field``, ``value``), ``cut``
(the connection closed before this frame; ``reset = true`` for a reset), ``stall``
(nothing more forwarded in this direction, for ``ms`` or, by default, for ever).
A protocol's ``NAMED_FAULTS`` add its own words.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from wallaroo_proto.display_filter import FilterError, compile_filter
from wallaroo_proto.protocols import get_plugin, names, plugins, schema
from wallaroo_proto.proxy.faultkit import Adapter, Close, FaultError, Frame, NamedFault, Send, Stall, Wait
from wallaroo_proto.rules_file import RulesFileError, read_rules_file, toml_value

GENERIC_ACTIONS = ("drop", "delay", "duplicate", "reorder", "rewrite", "cut", "stall")
DIRECTIONS = ("upstream", "client", "both")
#: Keys every rule takes; a named fault adds its own ``params``.
COMMON_KEYS = (
    "action",
    "type",
    "where",
    "direction",
    "skip",
    "count",
    "bytes",
    "ms",
    "field",
    "value",
    "reset",
)
#: Bytes held while a connection's protocol is not known, before giving up on framing it.
DETECT_LIMIT = 1 << 16
#: Seconds the relay lets the first bytes wait for more before deciding with those there are.
DETECT_WAIT = 1.0


def _module(protocol: str) -> Any:
    """The plug-in's fault kit (``ProtocolPlugin.proxy_faults``), None when it has none (or the
    registry has no such plug-in: a caller's own adapter then brings no named faults)."""
    kit = next((plugin.proxy_faults for plugin in plugins() if plugin.name == protocol), None)
    return None if kit is None else kit()


@cache
def named_faults(protocol: str) -> Mapping[str, NamedFault]:
    """A protocol's own faults ({} when its plug-in offers none)."""
    module = _module(protocol)
    return {} if module is None else module.NAMED_FAULTS


def make_adapter(protocol: str) -> Adapter | None:
    """One connection's adapter, or None when the protocol's plug-in has none."""
    module = _module(protocol)
    return None if module is None else module.adapter()


@dataclass
class Rule:
    """One rule as given, checked, with its counts."""

    action: str
    text: str
    types: frozenset[str] | None = None
    where: str | None = None
    direction: str = "both"
    skip: int = 0
    count: int | None = None
    after_bytes: int = 0
    ms: int = 0
    field_name: str | None = None
    value: Any = None
    reset: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    #: Matched frames, those acted on, and those it could not act on (the frame lacked what it needs).
    seen: int = 0
    fired: int = 0
    not_applied: int = 0
    #: Protocols this rule's types were checked against once a connection of it was recognised.
    checked_for: set[str] = field(default_factory=set)
    _match: Callable[[Mapping[str, Any]], bool] | None = None

    def matches(self, frame: Frame, passed: int, named: NamedFault | None) -> bool:
        wants = named.direction if named is not None and self.direction == "both" else self.direction
        if wants != "both" and (wants == "upstream") != frame.from_client:
            return False
        if passed < self.after_bytes:
            return False
        if self.types is not None and kind(frame.fields) not in self.types:
            return False
        if named is not None and named.where and not _compiled(named.where)(frame.fields):
            return False  # a named fault acts at its own frames, the rule's keys narrowing them
        return self._match is None or bool(self._match(frame.fields))


def kind(fields: Mapping[str, Any]) -> str:
    """A frame's type as rules name it: a 2PC message's own name (PHASE1, ...) before MESSAGE,
    as ``dissect --stats`` counts them."""
    return fields.get("twopc") or fields.get("type") or "?"


def parse_option(text: str) -> dict[str, Any]:
    """``"drop type=ACK count=1"`` as a rule table: words split as a shell splits them (so
    ``where='stream_id == 3'`` is one), values read as TOML reads them; ``type=A,B`` gives a list."""
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise FaultError(str(err)) from err
    if not words:
        raise FaultError("an empty rule: give an action, e.g. 'drop type=ACK'")
    table: dict[str, Any] = {"action": words[0]}
    for word in words[1:]:
        key, sep, raw = word.partition("=")
        if not sep or not key:
            raise FaultError(f"{word!r} is not key=value")
        value = toml_value(raw)
        if key == "type" and isinstance(value, str) and "," in value:
            value = value.split(",")
        table[key] = value
    return table


def load_rules_file(path: str) -> list[dict[str, Any]]:
    """The ``[[fault]]`` tables of a TOML rules file."""
    try:
        document = read_rules_file(path)
    except RulesFileError as err:
        cause = err.cause
        if isinstance(cause, OSError):
            raise FaultError(f"{path}: {cause.strerror or cause}") from err
        if isinstance(cause, UnicodeDecodeError):
            raise FaultError(f"{path}: not UTF-8 text (byte {cause.start}): a rules file is TOML") from err
        raise FaultError(str(err)) from err
    unknown = set(document) - {"fault"}
    if unknown:
        raise FaultError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}: rules are [[fault]] tables")
    tables = document.get("fault", [])
    if not isinstance(tables, list):
        raise FaultError(f"{path}: 'fault' must be an array of tables ([[fault]])")
    return tables


def _kind(value: Any, wanted: type, key: str) -> Any:
    if wanted is int and isinstance(value, bool) or not isinstance(value, wanted):
        raise FaultError(f"{key} must be {'an integer' if wanted is int else wanted.__name__}, not {value!r}")
    return value


def _suggest(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _named_candidates(action: str, protocol: str | None) -> dict[str, NamedFault]:
    protocols = [protocol] if protocol else list(names())
    return {p: named_faults(p)[action] for p in protocols if action in named_faults(p)}


def build_rule(table: Mapping[str, Any], text: str, protocol: str | None = None) -> Rule:
    """A rule table checked: every key known and typed, its filter compiled, its action known."""
    action = table.get("action")
    if not isinstance(action, str):
        raise FaultError(
            f"{text}: every rule needs an action (one of {', '.join(GENERIC_ACTIONS)} or a named fault)"
        )
    named = _named_candidates(action, protocol) if action not in GENERIC_ACTIONS else {}
    if action not in GENERIC_ACTIONS and not named:
        everything = set(GENERIC_ACTIONS)
        for p in [protocol] if protocol else names():
            everything |= set(named_faults(p))
        where = f" for protocol {protocol}" if protocol else ""
        known = [*GENERIC_ACTIONS, *sorted(everything - set(GENERIC_ACTIONS))]
        raise FaultError(
            f"{text}: unknown action {action!r}{where}{_suggest(action, everything)}"
            f" (actions: {', '.join(known)})"
        )
    params: dict[str, tuple[type, Any]] = {}
    for fault in named.values():
        params.update(fault.params)
    unknown = [k for k in table if k not in COMMON_KEYS and k not in params]
    if unknown:
        raise FaultError(
            f"{text}: unknown key {unknown[0]!r}{_suggest(unknown[0], [*COMMON_KEYS, *params])}"
            f" (keys: {', '.join([*COMMON_KEYS, *params])})"
        )
    rule = Rule(action=action, text=text)
    try:
        if "type" in table:
            types = table["type"]
            types = [types] if isinstance(types, str) else types
            if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
                raise FaultError("type must be a frame type name or a list of them")
            rule.types = frozenset(types)
            if protocol:
                said = unknown_types(rule, protocol)
                if said:
                    raise FaultError(said)
        if "where" in table:
            rule.where = _kind(table["where"], str, "where")
            try:
                rule._match = compile_filter(rule.where)
            except FilterError as err:
                fields = ""
                if "unknown field" in str(err):
                    fields = f" (fields: {', '.join(sorted(schema.field_types()))})"
                raise FaultError(f"where: {err}{fields}") from err
        if "direction" in table:
            rule.direction = _kind(table["direction"], str, "direction")
            if rule.direction not in DIRECTIONS:
                raise FaultError(f"direction must be one of {', '.join(DIRECTIONS)}, not {rule.direction!r}")
        rule.skip = _kind(table.get("skip", 0), int, "skip")
        if "count" in table:
            rule.count = _kind(table["count"], int, "count")
        rule.after_bytes = _kind(table.get("bytes", 0), int, "bytes")
        rule.ms = _kind(table.get("ms", 0), int, "ms")
        rule.reset = _kind(table.get("reset", False), bool, "reset")
        if min(rule.skip, rule.after_bytes, rule.ms, 1 if rule.count is None else rule.count) < 0:
            raise FaultError("skip, count, bytes and ms cannot be negative")
        if rule.count == 0:
            raise FaultError("count must be at least 1: a rule of count 0 never acts")
        if action == "rewrite":
            if "field" not in table or "value" not in table:
                raise FaultError("rewrite needs field and value")
            rule.field_name = _kind(table["field"], str, "field")
            rule.value = table["value"]
        elif "field" in table or "value" in table:
            raise FaultError("field and value are for rewrite only")
        if action == "delay" and rule.ms <= 0:
            raise FaultError("delay needs ms, the milliseconds to hold the frame")
        for key, (wanted, default) in params.items():
            rule.params[key] = _kind(table[key], wanted, key) if key in table else default
    except FaultError as err:
        raise FaultError(f"{text}: {err}") from err
    return rule


def unknown_types(rule: Rule, protocol: str) -> str | None:
    """What is wrong with the rule's ``type`` for this protocol, naming its types; None when
    every type is one of the protocol's (or the protocol names none)."""
    known = get_plugin(protocol).type_names if protocol in names() else ()
    if not known or rule.types is None:
        return None
    for t in sorted(rule.types):
        if t not in known and not t.startswith("UNKNOWN("):
            return (
                f"type {t!r} is not a {protocol} frame type{_suggest(t, known)}"
                f" ({protocol} types: {', '.join(known)})"
            )
    return None


def parse_rules(
    options: Iterable[str] = (), files: Iterable[str] = (), protocol: str | None = None
) -> list[Rule]:
    """Every rule of the rules files, then the ``--fault`` options, in that order, checked."""
    rules = []
    for path in files:
        for number, table in enumerate(load_rules_file(path), 1):
            if not isinstance(table, dict):
                raise FaultError(f"{path}: fault #{number} is not a table")
            rules.append(build_rule(table, f"{path}: fault #{number}", protocol))
    for text in options:
        where = f"--fault {text!r}"
        try:
            table = parse_option(text)
        except FaultError as err:
            raise FaultError(f"{where}: {err}") from err
        rules.append(build_rule(table, where, protocol))
    return rules


# ---------------------------------------------------------------- what the relay does


@dataclass(frozen=True)
class Applied:
    """A fault that acted: for the stderr line, the live view, the summary and the recording."""

    rule: Rule
    frame: Frame
    #: The frame's number in its direction, 1-based.
    index: int
    #: What happened, in words: "dropped", "delayed 500 ms", ...
    what: str


@dataclass(frozen=True)
class Took:
    """These bytes were received from one side (recorded there as they came, whatever is sent on)."""

    from_client: bool
    data: bytes


@dataclass(frozen=True)
class Said:
    """A line for the user about this connection (a rule's type its protocol lacks)."""

    text: str


Step = Send | Wait | Close | Stall | Applied | Took | Said


class ConnectionFaults:
    """One connection's rules at work: bytes in, ``Step`` values out (sans-IO).

    With no ``protocol`` its first bytes tell it, as ``dissect`` detects a connection
    (the upstream's port first, then each plug-in's detector on the first sender's
    bytes); until then the bytes wait here, at most ``DETECT_LIMIT`` of them. A
    connection of no known protocol, or of one without an adapter, passes unframed.
    """

    def __init__(
        self,
        rules: list[Rule],
        protocol: str | None = None,
        upstream_port: int = 0,
        *,
        adapter: Adapter | None = None,
    ) -> None:
        """``adapter``: this one, for ``protocol``, instead of the plug-in's."""
        self.rules = rules
        self._given = adapter
        self.protocol = protocol
        self.adapter: Adapter | None = None
        self.named: Mapping[str, NamedFault] = {}
        self._index = {True: 0, False: 0}
        self._passed = {True: 0, False: 0}
        self._held: dict[bool, list[Send]] = {True: [], False: []}
        self._unframed = {True: False, False: False}
        self._waiting: list[tuple[bool, bytes]] = []
        self._cut = False
        #: Lines to give with the next steps, once the protocol is known.
        self._said: list[Step] = []
        self._deciding = protocol is None
        if protocol is None:
            for plugin in plugins():
                if upstream_port in plugin.default_ports:
                    self.protocol = plugin.name
                    self._deciding = False
                    break
        if not self._deciding:
            self._start()

    def _start(self) -> None:
        self._deciding = False
        self.adapter = self._given or (make_adapter(self.protocol) if self.protocol else None)
        if self.adapter is None:
            self._unframed = {True: True, False: True}
        else:
            self.named = named_faults(self.protocol)
        # A rule's type is checked once the protocol is known: said at its first connection, not
        # left to show only as "matched 0" at the end.
        for rule in self.rules if self.protocol else ():
            theirs = rule.action in GENERIC_ACTIONS or rule.action in self.named
            if theirs and self.protocol not in rule.checked_for:
                rule.checked_for.add(self.protocol)
                wrong = unknown_types(rule, self.protocol)
                if wrong:
                    self._said.append(
                        Said(f"{rule.text}: {wrong}; it matches none of this connection's frames")
                    )

    @property
    def deciding(self) -> bool:
        """Bytes wait here until the connection's first bytes tell its protocol."""
        return self._deciding

    def settle(self) -> list[Step]:
        """Decide now with the bytes there are (the relay's time for the first bytes ran out:
        a first sender may wait for an answer before it sends more)."""
        return self._detect(None, b"", final=True) if self._deciding else []

    def _detect(self, from_client: bool | None, data: bytes, final: bool = False) -> list[Step]:
        if from_client is not None:
            self._waiting.append((from_client, data))
        if not self._waiting:
            return []
        first = self._waiting[0][0]
        head = b"".join(d for side, d in self._waiting if side == first)
        final = final or sum(len(d) for _, d in self._waiting) >= DETECT_LIMIT
        undecided = False
        for plugin in plugins():
            said = plugin.detect(head, plugin.max_frame_size, final)
            if said:
                self.protocol = plugin.name
                break
            undecided |= said is None
        else:
            if undecided and not final:
                return []
        self._start()
        waiting, self._waiting = self._waiting, []
        steps: list[Step] = []
        for side, chunk in waiting:
            steps.extend(self.feed(side, chunk))
        return steps

    def feed(self, from_client: bool, data: bytes) -> list[Step]:
        """What to do with these bytes from one side, in order."""
        if self._said:
            said, self._said = self._said, []
            return [*said, *self.feed(from_client, data)]
        if self._cut:
            return []
        if self._deciding:
            return self._detect(from_client, data)
        if self._unframed[from_client]:
            return [Took(from_client, data), Send(from_client, data)]
        assert self.adapter is not None
        try:
            frames = self.adapter.frames(from_client, data)
        except ValueError:
            # Not the protocol's framing after all: what it held, then the rest, pass as they come.
            self._unframed[from_client] = True
            rest = self.adapter.tail(from_client)
            return [Took(from_client, rest), Send(from_client, rest)]
        steps: list[Step] = []
        for raw in frames:
            done = self._frame(from_client, raw)
            steps.extend(done)
            if any(type(step) is Close for step in done):
                # The connection ends here: the frames after the cut, read with it, are neither
                # sent nor matched (a busy peer's next records would count as cut again).
                self._cut = True
                break
        return steps

    def end(self, from_client: bool) -> list[Step]:
        """This side ended: bytes still waiting for detection, or a frame held back for
        reordering, still go on."""
        steps: list[Step] = []
        for side, chunk in self._waiting:
            if side == from_client:
                steps += [Took(side, chunk), Send(side, chunk)]
        self._waiting = [(side, d) for side, d in self._waiting if side != from_client]
        held, self._held[from_client] = self._held[from_client], []
        steps += held
        if self.adapter is not None and not self._unframed[from_client]:
            rest = self.adapter.tail(from_client)
            if rest:  # a last frame cut short: it goes on as it came
                steps += [Took(from_client, rest), Send(from_client, rest)]
        return steps

    def _frame(self, from_client: bool, raw: bytes) -> list[Step]:
        assert self.adapter is not None
        try:
            fields = self.adapter.fields(raw, from_client)
        except ValueError:
            fields = {"type": "INVALID"}
        self._index[from_client] += 1
        frame = Frame(raw, from_client, fields)
        passed = self._passed[from_client]
        self._passed[from_client] += len(raw)
        steps = self._act(frame, passed)
        steps.insert(1 if steps and type(steps[0]) is Applied else 0, Took(from_client, raw))
        held = self._held[from_client]
        if held and not (type(steps[0]) is Applied and steps[0].rule.action == "reorder"):
            # The frame that overtakes a held one has just gone: the held one follows it.
            steps.extend(held)
            held.clear()
        return steps

    def _act(self, frame: Frame, passed: int) -> list[Step]:
        forward = Send(frame.from_client, frame.data)
        chosen = None
        for rule in self.rules:
            named = self.named.get(rule.action) if rule.action not in GENERIC_ACTIONS else None
            if rule.action not in GENERIC_ACTIONS and named is None:
                continue  # another protocol's fault
            if not rule.matches(frame, passed, named):
                continue
            if rule.action == "reorder" and self._held[frame.from_client]:
                continue  # one frame held a direction: the next one, this, goes first
            rule.seen += 1
            if rule.seen <= rule.skip or (rule.count is not None and rule.fired >= rule.count):
                continue
            chosen = (rule, named)
            break
        if chosen is None:
            return [forward]
        rule, named = chosen
        rule.fired += 1
        try:
            steps, what = self._apply(rule, named, frame, forward)
        except FaultError as err:
            # A rule this frame cannot take (a field it lacks): the frame goes on unchanged, the
            # rule is not used up, and why is shown.
            rule.fired -= 1
            rule.not_applied += 1
            return [Applied(rule, frame, self._index[frame.from_client], f"not applied: {err}"), forward]
        return [Applied(rule, frame, self._index[frame.from_client], what), *steps]

    def _apply(
        self, rule: Rule, named: NamedFault | None, frame: Frame, forward: Send
    ) -> tuple[list[Step], str]:
        action = rule.action
        params: Mapping[str, Any] = rule.params
        if named is not None:
            if named.act is not None:
                done = list(named.act(frame, params, self.adapter))  # type: ignore[misc]
                return done, _acted(frame, done)
            action = named.action or "drop"
        ms = rule.ms or int(params.get("ms", 0) or 0)
        to = "the upstream" if frame.from_client else "the client"
        if action == "drop":
            return [], f"dropped: not forwarded to {to}"
        if action == "delay":
            return [
                Wait(ms / 1000),
                forward,
            ], f"delayed {ms} ms (and the frames behind it), then forwarded to {to}"
        if action == "duplicate":
            return [forward, forward], f"forwarded to {to} twice"
        if action == "reorder":
            self._held[frame.from_client].append(forward)
            return [], f"held back: forwarded to {to} after the next frame its way"
        if action == "rewrite":
            assert rule.field_name is not None and self.adapter is not None
            data = self.adapter.rewrite(frame, rule.field_name, rule.value)
            return [
                Send(frame.from_client, data)
            ], f"{rule.field_name} set to {rule.value!r}, then forwarded to {to}"
        if action == "cut":
            how = "reset" if rule.reset else "closed"
            return [Close(rule.reset)], f"connection {how} on both sides before it; it was not forwarded"
        if action == "stall":
            return [Stall(ms / 1000 if ms else None), forward], (
                f"held {ms} ms with everything after it to {to}, then forwarded"
                if ms
                else f"held with everything after it: nothing more reaches {to} on this connection"
            )
        raise FaultError(f"unknown action {action!r}")


@cache
def _compiled(where: str) -> Callable[[Mapping[str, Any]], bool]:
    return compile_filter(where)


def _acted(frame: Frame, done: list) -> str:
    """What a named fault's steps did, in order: which bytes went to which side, and the end."""
    said = []
    if not any(type(s) is Send and s.data == frame.data for s in done):
        said.append("the frame not forwarded")
    for step in done:
        if type(step) is Send:
            to = "the upstream" if step.to_upstream else "the client"
            if step.data == frame.data and step.to_upstream == frame.from_client:
                said.append(f"the frame forwarded to {to}")
            else:
                said.append(f"{step.what or 'bytes the proxy made'} ({len(step.data)} bytes) sent to {to}")
        elif type(step) is Wait:
            said.append(f"a wait of {step.seconds * 1000:g} ms")
        elif type(step) is Stall:
            said.append("this direction held" + (f" {step.seconds * 1000:g} ms" if step.seconds else ""))
        elif type(step) is Close:
            said.append(f"the connection {'reset' if step.reset else 'closed'} on both sides")
    return ", then ".join(said)


def describe(applied: Applied) -> str:
    """One applied fault as a line: which rule, which frame, what happened."""
    frame = applied.frame
    side = "client→upstream" if frame.from_client else "upstream→client"
    return f"fault {applied.rule.action} at {side} frame {applied.index} {kind(frame.fields)}: {applied.what}"
