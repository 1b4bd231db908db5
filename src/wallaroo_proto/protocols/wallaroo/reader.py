"""Incremental frame reader: bytes in, whole frames out, in chunks of any size.

Only the unfinished tail is kept. The length prefix is checked against the
maximum frame size before anything is buffered for that frame, so a peer that
announces a 4 GiB frame costs nothing.
"""

from __future__ import annotations

import struct
from itertools import repeat

from .codec import decode
from .errors import FrameTooLarge, MalformedFrame, ProtocolError
from .frames import DEFAULT_MAX_FRAME_SIZE, Frame, Message
from .wire import MESSAGE_HEAD, U32

_MESSAGE_HEAD_SIZE = MESSAGE_HEAD.size  # 31
_MESSAGE_MIN_LENGTH = _MESSAGE_HEAD_SIZE - 4  # 27: type + fixed fields, empty key and payload
_MESSAGE_TYPE = 5
_new_tuple = tuple.__new__
_MESSAGE_BYTE = b"\x05"
#: Below this many frames of one size in a row, the block path is not worth its set-up.
_MIN_BLOCK = 8
#: After a block attempt fails, bytes read frame by frame before the next attempt.
_RETRY_AFTER_BYTES = 4096
_block_structs: dict[tuple[int, int], struct.Struct] = {}


def _block_struct(key_len: int, payload_len: int) -> struct.Struct:
    """One whole MESSAGE frame with this key and payload size, unpacked to ``Message``'s fields
    (length prefix, type and key length skipped as pad bytes: checked by the caller)."""
    packer = _block_structs.get((key_len, payload_len))
    if packer is None:
        if len(_block_structs) > 64:
            _block_structs.clear()
        packer = _block_structs[(key_len, payload_len)] = struct.Struct(f">5xQQq2x{key_len}s{payload_len}s")
    return packer


def _same_bytes_run(column: bytes) -> int:
    """How many bytes at the start of ``column`` equal its first."""
    return len(column) - len(column.lstrip(column[:1]))


def message_block(buf: bytes, pos: int, max_frame_size: int) -> tuple[list[Message], int]:
    """The MESSAGE frames from ``pos`` that share the first one's frame size and key length,
    split and decoded in passes in C, and where they end; ``([], pos)`` if fewer than a few.

    Load generators send frames of one size, and here each costs no Python step: every
    frame's length prefix, type byte and key length are checked by comparing byte columns
    (every ``size``-th byte) with the first frame's, and ``struct.iter_unpack`` decodes them.
    """
    n = len(buf)
    if n - pos < _MIN_BLOCK * _MESSAGE_HEAD_SIZE:
        return [], pos
    length, type_byte, _, _, _, key_len = MESSAGE_HEAD.unpack_from(buf, pos)
    if type_byte != _MESSAGE_TYPE or length > max_frame_size or length < _MESSAGE_MIN_LENGTH + key_len:
        return [], pos
    size = 4 + length
    count = (n - pos) // size
    if count < _MIN_BLOCK:
        return [], pos
    region = buf[pos : pos + count * size]
    # The length prefix (bytes 0-3), the type (4) and the key length (29-30) of every frame.
    for column in (4, 0, 1, 2, 3, 29, 30):
        count = min(count, _same_bytes_run(region[column::size]))
        if count < _MIN_BLOCK:
            return [], pos
    end = count * size
    unpacked = _block_struct(key_len, length - _MESSAGE_MIN_LENGTH - key_len).iter_unpack(
        region if end == len(region) else region[:end]
    )
    return list(map(_new_tuple, repeat(Message), unpacked)), pos + end


class FrameReader:
    """Splits a byte stream into frames.

    ``offset`` is the stream offset of the first byte not yet consumed as a
    whole frame and ``frame_index`` the number of whole frames read.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 1:
            raise ValueError("max_frame_size must be at least 1")
        self.max_frame_size = max_frame_size
        self.offset = 0
        self.frame_index = 0
        self._tail = bytearray()
        self._needed = 0  # total size of the frame the tail is the start of, once known
        self._broken: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that has not arrived whole: non-zero at EOF means truncation."""
        return len(self._tail)

    def _check_length(self, length: int, pos: int) -> None:
        if length > self.max_frame_size or length == 0:
            if length == 0:
                err: ProtocolError = MalformedFrame(
                    "length prefix 0: a frame has at least its type byte",
                    offset=self.offset + pos,
                    frame_index=self.frame_index,
                )
            else:
                err = FrameTooLarge(
                    f"length prefix {length} exceeds the maximum frame size {self.max_frame_size}",
                    offset=self.offset + pos,
                    frame_index=self.frame_index,
                )
            err.recoverable = False
            self._broken = err
            raise err

    def _buffer(self, data: bytes) -> bytes | None:
        """The bytes to parse now, or None when the pending frame is still incomplete."""
        if self._broken is not None:
            raise self._broken
        if not self._tail:
            return data if type(data) is bytes else bytes(data)
        self._tail += data
        if self._needed == 0 and len(self._tail) >= 4:
            (length,) = U32.unpack_from(self._tail, 0)
            self._check_length(length, 0)
            self._needed = 4 + length
        if len(self._tail) < max(self._needed, 4):
            return None
        buf = bytes(self._tail)
        self._tail.clear()
        self._needed = 0
        return buf

    def _keep_tail(self, buf: bytes, pos: int, needed: int) -> None:
        self.offset += pos
        self._tail += memoryview(buf)[pos:]
        self._needed = needed

    def feed(self, data: bytes) -> list[Frame]:
        """Frames completed by ``data``, in order.

        A bad frame raises ProtocolError carrying the frames decoded before it in
        ``decoded``. If its length prefix was sound (``recoverable``) the reader
        has stepped past it and may be fed on; otherwise every later call raises.
        """
        buf = self._buffer(data)
        if buf is None:
            return []
        out: list[Frame] = []
        append = out.append
        head = MESSAGE_HEAD.unpack_from
        max_size = self.max_frame_size
        n = len(buf)
        pos = 0
        index = self.frame_index
        next_block = pos  # where to try a block of same-size MESSAGEs next
        while True:
            if pos >= next_block:
                block, block_end = message_block(buf, pos, max_size)
                if block:
                    out += block
                    index += len(block)
                    pos = block_end
                else:
                    next_block = pos + _RETRY_AFTER_BYTES
            if n - pos >= _MESSAGE_HEAD_SIZE:
                length, type_byte, stream_id, message_id, event_time, key_len = head(buf, pos)
            elif n - pos >= 4:
                (length,) = U32.unpack_from(buf, pos)
                type_byte = -1
            else:
                break
            if length > max_size or length == 0:
                self.frame_index = index
                self.offset += pos
                try:
                    self._check_length(length, 0)
                except ProtocolError as err:
                    err.decoded = out
                    raise
            end = pos + 4 + length
            if end > n:
                break
            if type_byte == _MESSAGE_TYPE and length >= _MESSAGE_MIN_LENGTH:
                key_end = pos + _MESSAGE_HEAD_SIZE + key_len
                if key_end <= end:
                    append(
                        _new_tuple(
                            Message,
                            (
                                stream_id,
                                message_id,
                                event_time,
                                buf[pos + _MESSAGE_HEAD_SIZE : key_end],
                                buf[key_end:end],
                            ),
                        )
                    )
                    pos = end
                    index += 1
                    continue
            try:
                append(decode(buf[pos + 4 : end]))
            except ProtocolError as err:
                err.locate(offset=self.offset + pos, frame_index=index)
                err.decoded = out
                self._finish(buf, end, index + 1)
                raise
            pos = end
            index += 1
        self._finish(buf, pos, index)
        return out

    def _finish(self, buf: bytes, pos: int, index: int) -> None:
        self.frame_index = index
        if pos < len(buf):
            needed = 0
            if len(buf) - pos >= 4:
                (length,) = U32.unpack_from(buf, pos)
                if 0 < length <= self.max_frame_size:
                    needed = 4 + length  # else the next call checks it and raises
            self._keep_tail(buf, pos, needed)
        else:
            self.offset += pos

    def feed_bodies(self, data: bytes) -> list[tuple[int, bytes]]:
        """Split without decoding: (stream offset, body) of each completed frame.

        For callers that decode frame by frame and keep going past a bad body,
        such as the dissector.
        """
        buf = self._buffer(data)
        if buf is None:
            return []
        out: list[tuple[int, bytes]] = []
        n = len(buf)
        pos = 0
        while n - pos >= 4:
            (length,) = U32.unpack_from(buf, pos)
            if length > self.max_frame_size or length == 0:
                self.offset += pos
                try:
                    self._check_length(length, 0)
                except ProtocolError as err:
                    err.decoded = out
                    raise
            end = pos + 4 + length
            if end > n:
                break
            out.append((self.offset + pos, buf[pos + 4 : end]))
            self.frame_index += 1
            pos = end
        self._finish(buf, pos, self.frame_index)
        return out
