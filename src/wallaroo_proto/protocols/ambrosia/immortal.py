"""The mock LB's immortal, a counter service, and the RPCs the mock IC delivers to it (sans-IO).

State changes only through RPCs, as AMBROSIA requires, so a checkpoint plus
the log's replay rebuilds it exactly. ``add`` (method 1) adds its argument
(a decimal number, or a JSON object's integer ``value``; other bytes count
their length); a multiple of
``BONUS_EVERY`` also makes a self call ``bonus`` (method 2) that adds it once
more when it comes back through the IC's log. The state keeps a sum of each
applied RPC's xxHash64, so a lost or doubled RPC shows even where the totals
happen to agree.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterator, Sequence
from itertools import compress, repeat

import xxhash

from .codec import FORK, IMPULSE, RPC, encode_batch, encode_incoming_rpc, encode_outgoing_rpc

ADD, BONUS = 1, 2
BONUS_EVERY = 5
_MASK = (1 << 64) - 1
_IS_ZERO = bytes([1] + [0] * 255)  # a byte translation: 1 for 0, else 0
_IS_ADD = bytes(int(b == ADD) for b in range(256))
_PERIOD = 1000  # generated args: (index * 7919) % _PERIOD + 1
#: The most bytes of generated mixed bodies kept to be sent again (one shape each).
_KEPT_BODIES = 8 << 20


_JSON_HEAD = b'{"value":'


def value_of(args: bytes) -> int:
    """An argument's value: a decimal number, a JSON object's integer ``value``, else its length."""
    try:
        return int(args)
    except ValueError:
        pass
    if args[:1] != b"{":
        return len(args)
    digits = args[9:-1]  # the common form, {"value":N}, read without a JSON parser
    plain = digits.isdigit() and len(digits) < 20 and (digits[:1] != b"0" or len(digits) == 1)
    if plain and args.startswith(_JSON_HEAD) and args[-1:] == b"}":
        return int(digits)
    try:
        value = json.loads(args).get("value")
    except (ValueError, RecursionError, AttributeError):
        return len(args)
    return value if type(value) is int else len(args)


#: Arguments all in the common JSON form, one a line: what ``value_of`` reads without a parser.
_JSON_RUN = re.compile(rb'\{"value":(?:0|[1-9][0-9]{0,18})\}(?:\n\{"value":(?:0|[1-9][0-9]{0,18})\})*')
_DIGITS = slice(9, -1)


def _json_values(args: list[bytes]) -> list[int] | None:
    """``value_of`` over arguments all in the common JSON form, in C; None if any is not."""
    if not _JSON_RUN.fullmatch(b"\n".join(args)):
        return None
    try:  # an argument holding a newline matched as two: its digits are no number
        return list(map(int, map(operator.getitem, args, repeat(_DIGITS))))
    except ValueError:
        return None


#: A self call bonus(args) up to its args, by the args' length while its size takes one byte:
#: size, type RPC, destination "", reserved 0, method, Fork.
_BONUS_HEADS = [bytes((2 * (n + 5), RPC, 0, 0, BONUS << 1, FORK)) for n in range(59)]


def bonus_call(args: bytes) -> bytes:
    """The encoded self call ``bonus(args)`` (``encode_outgoing_rpc``, its short form inline)."""
    if len(args) < 59:
        return _BONUS_HEADS[len(args)] + args
    return encode_outgoing_rpc("", BONUS, FORK, args)


class Counter:
    """The counter immortal: apply RPCs, snapshot and load."""

    __slots__ = ("rpcs", "total", "bonuses", "digest", "initialized")

    def __init__(self) -> None:
        self.rpcs = 0
        self.total = 0
        self.bonuses = 0
        self.digest = 0
        self.initialized = False

    def apply(self, method_id: int, args: bytes) -> bytes:
        """Apply one incoming RPC; the encoded outgoing self call it makes (b"" for none)."""
        value = value_of(args)
        self.rpcs += 1
        self.total += value
        self.digest = (self.digest + xxhash.xxh64_intdigest(args) + method_id) & _MASK
        if method_id == BONUS:
            self.bonuses += 1
        elif method_id == ADD and value % BONUS_EVERY == 0:
            return bonus_call(args)
        return b""

    def apply_many(self, methods: bytes, args: list[bytes]) -> list[bytes]:
        """``apply`` over a record's RPCs at once (method ids one a byte): the same state, the
        self calls in order. The per-RPC steps run in C (map, sum, compress).

        The digest stays a sum of each RPC's xxHash64, so it does not depend on
        how RPCs fall into records (a recovery's replay and a crash-free run agree).
        """
        if not args:
            return []
        try:
            values = list(map(int, args))
        except ValueError:
            values = _json_values(args) or list(map(value_of, args))
        self.rpcs += len(args)
        self.total += sum(values)
        self.digest = (self.digest + sum(map(xxhash.xxh64_intdigest, args)) + sum(methods)) & _MASK
        self.bonuses += methods.count(BONUS)
        if ADD not in methods:
            return []
        # one byte per RPC, 1 where it makes a self call: an add whose value is a multiple of BONUS_EVERY
        multiples = bytes(map(operator.mod, values, repeat(BONUS_EVERY))).translate(_IS_ZERO)
        calls = int.from_bytes(multiples) & int.from_bytes(methods.translate(_IS_ADD))
        chosen = list(compress(args, calls.to_bytes(len(args))))
        try:  # bonus_call over each, in C while the sizes take one byte
            return list(map(operator.add, map(_BONUS_HEADS.__getitem__, map(len, chosen)), chosen))
        except IndexError:
            return list(map(bonus_call, chosen))

    def snapshot(self) -> bytes:
        return json.dumps(self.state(), sort_keys=True).encode()

    def state(self) -> dict:
        return {
            "rpcs": self.rpcs,
            "total": self.total,
            "bonuses": self.bonuses,
            "digest": f"{self.digest:016x}",
            "initialized": self.initialized,
        }

    @classmethod
    def load(cls, blob: bytes) -> Counter:
        """A counter from a checkpoint blob (empty: a fresh one); ValueError if it is not one."""
        counter = cls()
        if blob:
            try:
                state = json.loads(blob)
                counter.rpcs, counter.total = int(state["rpcs"]), int(state["total"])
                counter.bonuses, counter.digest = int(state["bonuses"]), int(state["digest"], 16)
                counter.initialized = bool(state.get("initialized"))
            except KeyError as err:
                raise ValueError(f"no {err} in it") from None
            except (TypeError, AttributeError, OverflowError, RecursionError) as err:
                raise ValueError(f"not a counter's JSON object ({err})") from None
        return counter


#: How the mock IC groups a record's input RPCs: ``mixed`` as a busy IC's log holds them (plain
#: RPCs, RPCBatch and, where an Impulse is among them, CountReplayableRPCBatch), ``none`` or ``all``.
BATCHING = ("mixed", "none", "all")
#: Generated arguments: ``json`` (``{"value":N}``, read alike by every binding) or ``raw`` (``N``).
ARG_FORMS = ("json", "raw")


class RpcSource:
    """The mock IC's input RPCs: generated ``add`` calls, or one per line of input (its bytes the args).

    Lines can also be fed as they come (``streamed``): ``open`` until ``end``; the lines
    delivered are ``release``d, so only those not yet in the log are held.
    """

    def __init__(
        self,
        count: int = 0,
        lines: Sequence[bytes] | None = None,
        method_id: int = ADD,
        arg_form: str = "json",
        batching: str = "none",
    ) -> None:
        self.lines = list(lines) if lines is not None else None
        self.count = len(self.lines) if self.lines is not None else count
        self.method_id = method_id
        self.json = arg_form == "json"
        self.batching = batching
        self.open = False  # more lines may come
        self.streaming = False
        self.base = 0  # the index of lines[0]
        self.floor = 0  # lines below it are in the log already: dropped as they come
        self._period: list[bytes] | None = None
        self._bodies: dict[tuple[int, int], bytes] = {}  # generated mixed bodies, by shape
        self._kept = 0  # their bytes

    @classmethod
    def streamed(cls, method_id: int = ADD, batching: str = "none") -> RpcSource:
        source = cls(lines=[], method_id=method_id, batching=batching)
        source.open = source.streaming = True
        return source

    def feed(self, line: bytes) -> bool:
        """One more line; False if it was dropped at once (the log holds its RPC)."""
        self.count += 1
        if self.count <= self.floor:
            self.base = self.count
            return False
        self.lines.append(line)
        return True

    def end(self) -> None:
        self.open = False

    def release(self, upto: int) -> int:
        """A streamed source forgets the lines before ``upto`` (logged now); how many it dropped."""
        if not self.streaming:
            return 0
        self.floor = max(self.floor, upto)
        drop = min(upto, self.count) - self.base
        if drop <= 0:
            return 0
        del self.lines[:drop]
        self.base += drop
        return drop

    def args(self, index: int) -> bytes:
        if self.lines is not None:
            return self.lines[index - self.base]
        n = (index * 7919) % _PERIOD + 1
        return b'{"value":%d}' % n if self.json else b"%d" % n

    def body(self, first: int, last: int) -> bytes:
        """RPCs ``first`` to ``last`` as a record body holds them, grouped by ``batching``."""
        if self.batching == "none" or last - first < 2:
            return self._plain(first, last)
        if self.batching == "all":
            return encode_batch(self._rpcs(first, last))
        if self.lines is not None:
            return self._mixed(first, last)
        # Generated: the body depends on ``first`` only through its args' period and the runs'
        # pattern (of 21 indices), so each shape is built once.
        key = (first % (21 * _PERIOD), last - first)
        body = self._bodies.get(key)
        if body is None:
            body = self._mixed(first, last)
            self._kept += len(body)
            if self._kept > _KEPT_BODIES:  # shapes that do not repeat soon: start again
                self._bodies.clear()
                self._kept = len(body)
            self._bodies[key] = body
        return body

    def _mixed(self, first: int, last: int) -> bytes:
        parts: list[bytes] = []
        at = first
        while at < last:
            take = min(1 + at * 31 % 7, last - at)  # runs of 1 to 7, fixed by the index
            kind = at * 13 % 3
            if take == 1 or kind == 0:
                parts.append(self._plain(at, at + take))
            elif kind == 1:
                parts.append(encode_batch(self._rpcs(at, at + take)))
            else:  # its last RPC an Impulse: the IC counts the replayable ones apart
                rpcs = self._rpcs(at, at + take - 1)
                rpcs.append(encode_incoming_rpc(self.method_id, IMPULSE, self.args(at + take - 1)))
                parts.append(encode_batch(rpcs, replayable=take - 1))
            at += take
        return b"".join(parts)

    def _plain(self, first: int, last: int) -> bytes:
        return b"".join(self._rpcs(first, last))

    def _rpcs(self, first: int, last: int) -> list[bytes]:
        """RPCs ``first`` to ``last``, each encoded (generated ones from one period encoded once)."""
        if self.lines is not None:
            return list(self.encoded(first, last))
        if self._period is None:  # generated args repeat every 1000 RPCs: encode one period once
            self._period = list(self.encoded(0, _PERIOD))
        parts: list[bytes] = []
        while first < last:
            at = first % _PERIOD
            take = min(_PERIOD - at, last - first)
            parts += self._period[at : at + take]
            first += take
        return parts

    def encoded(self, first: int, last: int) -> Iterator[bytes]:
        """RPCs ``first`` to ``last`` as the IC puts them in a record (Fork, reserved byte 0)."""
        method = self.method_id
        for i in range(first, last):
            yield encode_incoming_rpc(method, FORK, self.args(i))

    def expected(self) -> dict:
        """The counter's state after exactly-once delivery of every RPC (and every bonus self call)."""
        counter = Counter()
        counter.initialized = True
        for i in range(self.count):
            args = self.args(i)
            if counter.apply(self.method_id, args):
                counter.apply(BONUS, args)
        return counter.state()
