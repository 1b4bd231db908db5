"""Where a connector source's messages come from: files, stdin or generated data.

Each input is one stream. An input opens a ``MessageReader`` positioned at a
point of reference, so a connector can resume where the worker's NOTIFY_ACK
says. Message ids are the 1-based record number in the stream, and a point of
reference is the id of the last message the worker holds (the shipped worker's
rule), so a resume opens the reader at the point + 1 and replays are exact.

Readers never block the event loop for long: files and generated data are read
on demand, stdin is read by a thread into a bounded queue (a slow producer on a
pipe must not stall the ACKs of a live connection).
"""

from __future__ import annotations

import hashlib
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import BinaryIO

from ...input_spec import STDIN
from ...main_thread_signals import signals_blocked
from .frames import Message
from .wire import U32

U64_MAX = (1 << 64) - 1
#: MESSAGE body bytes besides key and payload: type, stream_id, message_id, event_time, key length.
MESSAGE_OVERHEAD = 27


class InputError(Exception):
    """Input that cannot be turned into messages: says which input and where."""


def stream_id_for(name: str | bytes) -> int:
    """The spec's recommended deterministic id: a 64-bit hash of the stream's name.

    blake2b with an 8-byte digest, read big endian: stable across runs, hosts
    and Python versions (unlike ``hash()``).
    """
    raw = name.encode("utf-8") if isinstance(name, str) else name
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big")


def now_ms() -> int:
    """Event time for a message read now: milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class KeyTemplate:
    """The key of each message: fixed text, or with ``{stream}`` and ``{n}`` filled in."""

    def __init__(self, template: str | None, stream_name: str) -> None:
        text = template or ""
        self._fixed = "{n}" not in text
        text = text.replace("{stream}", stream_name)
        self._text = text
        self._raw = text.encode("utf-8")
        if len(self._raw) > 0xFFFF:
            raise InputError(f"key for stream {stream_name!r} is {len(self._raw)} bytes; at most 65535")

    def __call__(self, n: int) -> bytes:
        if self._fixed:
            return self._raw
        return self._text.replace("{n}", str(n)).encode("utf-8")

    def keys(self, numbers: range) -> Iterable[bytes]:
        """The keys of a range of message numbers."""
        return repeat(self._raw, len(numbers)) if self._fixed else map(self, numbers)


class MessageReader:
    """Messages of one stream in order; ``read`` never blocks for long."""

    def read(self, limit: int) -> list[Message] | None:
        """Up to ``limit`` messages; ``[]`` if none is ready yet, ``None`` at the end of input."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the underlying file."""


@dataclass
class StreamInput:
    """One stream: its name, its id and how to read it from a point of reference."""

    name: str
    stream_id: int
    opener: Callable[[int], MessageReader]
    #: False for stdin: what was read once cannot be read again.
    rewindable: bool = True
    #: Messages in the stream when known in advance (generated data), for progress bars.
    total: int | None = None

    def open(self, start: int = 0) -> MessageReader:
        """A reader of the messages whose id is ``start`` or above (ids begin at 1)."""
        return self.opener(start)


# --- generated data -----------------------------------------------------------


def generated_payload(stream_name: str, n: int, size: int) -> bytes:
    """A deterministic payload that names its stream and number, padded to ``size`` bytes."""
    head = f"{stream_name}:{n}:".encode()
    if len(head) >= size:
        return head[:size]
    return head + b"." * (size - len(head))


_new_message = tuple.__new__  # skips the NamedTuple constructor's argument handling


class GeneratedReader(MessageReader):
    """``generated_payload`` for each number, built in bulk (this feeds the benchmark)."""

    def __init__(
        self, name: str, stream_id: int, count: int, size: int, key: KeyTemplate, start: int
    ) -> None:
        self.name = name
        self.prefix = f"{name}:".encode()
        self.stream_id = stream_id
        self.count = count
        self.size = size
        self.key = key
        self.dots = b"." * size
        self.next = max(start, 1)

    def read(self, limit: int) -> list[Message] | None:
        first = self.next
        if first > self.count:
            return None
        last = min(self.count, first + limit - 1)
        self.next = last + 1
        numbers = range(first, last + 1)
        keys, payloads = self.key.keys(numbers), self._payloads(numbers)
        fields = zip(repeat(self.stream_id), numbers, repeat(now_ms()), keys, payloads)
        return list(map(_new_message, repeat(Message), fields))

    def _payloads(self, numbers: range) -> list[bytes]:
        """``generated_payload`` of each number, one ``%`` template per run of numbers of one width."""
        size, prefix, dots = self.size, self.prefix, self.dots
        out: list[bytes] = []
        n, last = numbers.start, numbers.stop - 1
        while n <= last:
            width = len(str(n))
            upto = min(last, 10**width - 1)
            head = len(prefix) + width + 1
            if head < size:
                template = prefix.replace(b"%", b"%%") + b"%d:" + dots[head:]
                out += map(template.__mod__, range(n, upto + 1))
            else:
                out += [(b"%b%d:" % (prefix, i))[:size] for i in range(n, upto + 1)]
            n = upto + 1
        return out


def generated_inputs(
    *,
    streams: int,
    count: int,
    payload_size: int,
    key: str | None = None,
    prefix: str = "stream",
    names: list[str] | None = None,
    ids: list[int] | None = None,
) -> list[StreamInput]:
    """``streams`` streams of ``count`` messages each, named ``PREFIX-i`` unless ``names`` says."""
    if streams < 1:
        raise InputError("--streams must be at least 1")
    if count < 0:
        raise InputError("--count must not be negative")
    if payload_size < 0:
        raise InputError("--payload-size must not be negative")
    names = _names(names, [f"{prefix}-{i}" for i in range(streams)])
    out = []
    for name, stream_id in zip(names, _ids(ids, names), strict=True):
        keyt = KeyTemplate(key, name)

        def opener(start: int, name=name, stream_id=stream_id, keyt=keyt) -> MessageReader:
            return GeneratedReader(name, stream_id, count, payload_size, keyt, start)

        out.append(StreamInput(name, stream_id, opener, True, count))
    return out


# --- files and stdin ----------------------------------------------------------


def iter_lines(f: BinaryIO) -> Iterator[bytes]:
    """One message per line; the line ending (``\\n`` or ``\\r\\n``) is not part of it."""
    for line in f:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield line


def iter_length_prefixed(f: BinaryIO, label: str, max_size: int) -> Iterator[bytes]:
    """Length-prefixed records: u32 big-endian length, then that many bytes."""
    offset = 0
    index = 1
    while True:
        head = f.read(4)
        if not head:
            return
        if len(head) < 4:
            raise InputError(
                f"{label}: record #{index} at byte offset {offset}: truncated length prefix "
                f"({len(head)} of 4 bytes)"
            )
        (size,) = U32.unpack(head)
        if size > max_size:
            raise InputError(
                f"{label}: record #{index} at byte offset {offset} is {size} bytes; a frame holds at "
                f"most {max_size} bytes of payload (raise --max-frame-size?)"
            )
        body = f.read(size)
        if len(body) < size:
            raise InputError(
                f"{label}: record #{index} at byte offset {offset}: {size} bytes announced, "
                f"only {len(body)} left in the input"
            )
        yield body
        offset += 4 + size
        index += 1


class IterReader(MessageReader):
    """Messages from a blocking iterator of payloads that is cheap to pull (a regular file)."""

    def __init__(
        self,
        payloads: Iterator[bytes],
        stream_id: int,
        key: KeyTemplate,
        start: int,
        max_size: int,
        label: str,
        closer: Callable[[], None] = lambda: None,
    ) -> None:
        self.payloads = payloads
        self.stream_id = stream_id
        self.key = key
        self.n = 0
        self.start = start
        self.max_size = max_size
        self.label = label
        self.closer = closer
        self.ended = False

    def _check(self, payload: bytes, key: bytes) -> None:
        if len(payload) + len(key) > self.max_size:
            raise InputError(
                f"{self.label}: message #{self.n} is {len(payload)} bytes; with its key and header it "
                f"exceeds the maximum frame size (raise --max-frame-size?)"
            )

    def read(self, limit: int) -> list[Message] | None:
        if self.ended:
            return None
        out: list[Message] = []
        for payload in self.payloads:
            self.n += 1
            if self.n < self.start:
                continue
            key = self.key(self.n)
            self._check(payload, key)
            # The time it was read: for a pipe, when the producer wrote it.
            out.append(Message(self.stream_id, self.n, now_ms(), key, payload))
            if len(out) >= limit:
                return out
        self.ended = True
        self.close()
        return out or None

    def close(self) -> None:
        self.closer()


def file_input(
    path: str,
    *,
    framing: str = "lines",
    key: str | None = None,
    name: str | None = None,
    stream_id: int | None = None,
    max_frame_size: int,
) -> StreamInput:
    """One stream read from a file; checked for readability now, so a typo fails before connecting."""
    name = name or path
    try:
        with open(path, "rb"):
            pass
    except OSError as err:
        raise InputError(f"cannot read input file {path!r}: {err.strerror or err}") from err
    keyt = KeyTemplate(key, name)
    max_size = max_frame_size - MESSAGE_OVERHEAD

    def opener(start: int) -> MessageReader:
        try:
            f = open(path, "rb")  # noqa: SIM115 - the reader closes it
        except OSError as err:
            raise InputError(f"cannot read input file {path!r}: {err.strerror or err}") from err
        payloads = iter_lines(f) if framing == "lines" else iter_length_prefixed(f, path, max_size)
        return IterReader(payloads, sid, keyt, start, max_size, path, f.close)

    sid = stream_id if stream_id is not None else stream_id_for(name)
    return StreamInput(name, sid, opener, True, None)


class ThreadedReader(MessageReader):
    """Messages from a blocking source (stdin) read by a daemon thread into a bounded queue.

    ``on_ready`` is called from the thread when data or the end arrives, so an
    event loop can wake up; the queue bound keeps memory flat when the
    connection is slower than the producer.
    """

    _END = object()

    def __init__(
        self,
        payloads: Iterator[bytes],
        stream_id: int,
        key: KeyTemplate,
        start: int,
        max_size: int,
        label: str,
        depth: int = 4096,
    ) -> None:
        self.inner = IterReader(payloads, stream_id, key, start, max_size, label)
        self.queue: queue.Queue = queue.Queue(depth)
        self.on_ready: Callable[[], None] = lambda: None
        self.ended = False
        self.thread = threading.Thread(target=self._pump, name=f"input {label}", daemon=True)
        with signals_blocked():
            self.thread.start()

    def _pump(self) -> None:
        try:
            while True:
                # One message at a time: a line typed into a pipe goes out now, with its own
                # event time, instead of waiting for a batch to fill.
                batch = self.inner.read(1)
                if batch is None:
                    break
                self.queue.put(batch)
                self.on_ready()
            self.queue.put(self._END)
        except InputError as err:
            self.queue.put(err)
        except OSError as err:
            self.queue.put(InputError(f"{self.inner.label}: read failed: {err}"))
        self.on_ready()

    def read(self, limit: int) -> list[Message] | None:
        if self.ended:
            return None
        out: list[Message] = []
        while len(out) < limit:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return out
            if item is self._END:
                self.ended = True
                return out or None
            if isinstance(item, InputError):
                self.ended = True
                raise item
            out.extend(item)
        return out


def stdin_input(
    *,
    framing: str = "lines",
    key: str | None = None,
    name: str | None = None,
    stream_id: int | None = None,
    max_frame_size: int,
    stream: BinaryIO | None = None,
) -> StreamInput:
    """One stream read from stdin (not rewindable: a replay comes from the replay buffer only)."""
    name = name or "stdin"
    keyt = KeyTemplate(key, name)
    max_size = max_frame_size - MESSAGE_OVERHEAD
    sid = stream_id if stream_id is not None else stream_id_for(name)
    opened = []

    def opener(start: int) -> MessageReader:
        if opened:
            raise InputError("stdin cannot be read a second time")
        opened.append(True)
        f = stream if stream is not None else sys.stdin.buffer
        payloads = iter_lines(f) if framing == "lines" else iter_length_prefixed(f, name, max_size)
        return ThreadedReader(payloads, sid, keyt, start, max_size, name)

    return StreamInput(name, sid, opener, False, None)


# --- helpers ------------------------------------------------------------------


def _names(given: list[str] | None, default: list[str]) -> list[str]:
    if not given:
        return default
    if len(given) != len(default):
        raise InputError(f"{len(given)} stream names given for {len(default)} streams")
    if len(set(given)) != len(given):
        raise InputError("stream names must be unique")
    return list(given)


def _ids(given: list[int] | None, names: list[str]) -> list[int]:
    if not given:
        ids = [stream_id_for(name) for name in names]
    else:
        if len(given) != len(names):
            raise InputError(f"{len(given)} stream ids given for {len(names)} streams")
        for value in given:
            if not 0 <= value <= U64_MAX:
                raise InputError(f"stream id {value} is not a u64")
        ids = list(given)
    if len(set(ids)) != len(ids):
        raise InputError("stream ids must be unique")
    return ids


def build_inputs(
    *,
    files: list[str],
    framing: str,
    streams: int | None,
    count: int | None,
    payload_size: int,
    key: str | None,
    names: list[str] | None,
    ids: list[int] | None,
    max_frame_size: int,
    prefix: str = "stream",
) -> list[StreamInput]:
    """The streams a command line asks for: files (``-`` is stdin) or generated data."""
    if files and (streams is not None or count is not None):
        raise InputError("give input files or --streams/--count for generated data, not both")
    if not files:
        if payload_size + MESSAGE_OVERHEAD + len((key or "").encode()) > max_frame_size:
            raise InputError(
                f"--payload-size {payload_size} does not fit in --max-frame-size {max_frame_size}"
            )
        return generated_inputs(
            streams=1 if streams is None else streams,
            count=100 if count is None else count,
            payload_size=payload_size,
            key=key,
            prefix=prefix,
            names=names,
            ids=ids,
        )
    if files.count(STDIN) > 1:
        raise InputError("stdin ('-') can be given only once")
    stream_names = _names(names, list(files))
    stream_ids = _ids(ids, stream_names)
    out = []
    for path, name, sid in zip(files, stream_names, stream_ids, strict=True):
        if path == STDIN:
            out.append(
                stdin_input(
                    framing=framing,
                    key=key,
                    name=name if names else None,
                    stream_id=sid,
                    max_frame_size=max_frame_size,
                )
            )
        else:
            out.append(
                file_input(
                    path, framing=framing, key=key, name=name, stream_id=sid, max_frame_size=max_frame_size
                )
            )
    return out


class RateLimiter:
    """A token bucket: at most ``rate`` messages a second, bursts of up to a tenth of a second."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        if rate is not None and rate <= 0:
            raise InputError("--rate must be positive")
        self.rate = rate
        self.clock = clock
        self.burst = max(1.0, (rate or 0) / 10)
        self.tokens = self.burst if rate else 0.0
        self.last = clock()

    def allow(self, wanted: int) -> int:
        """How many of ``wanted`` messages may go now (all of them without a rate)."""
        if self.rate is None:
            return wanted
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        granted = min(wanted, int(self.tokens + 1e-9))  # 0.05 s * 100/s is 4.999...: still 5
        self.tokens -= granted
        return granted

    def wait_time(self) -> float:
        """Seconds until the next message may go."""
        if self.rate is None:
            return 0.0
        return max(0.0, (1 - self.tokens) / self.rate)
