"""Codec throughput: MESSAGE frames (64-byte payload, short key) through the reader.

Baseline, measured in the same run over the same buffer: a bare loop of
``struct.unpack_from`` that reads each frame's length and MESSAGE header and
slices out key and payload, making no objects. Target: decoding through the
FrameReader (fed 64 KiB chunks) at no less than 0.6x that loop.

    python benchmarks/codec.py [--frames N] [--chunk BYTES]
"""

from __future__ import annotations

import argparse
import struct
import time

from wallaroo_proto.protocols.wallaroo import FrameReader, Message, encode

HEAD = struct.Struct(">IBQQqH")


def best_of(runs: int, fn) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bare_loop(buf: bytes) -> int:
    unpack = HEAD.unpack_from
    pos, n, count = 0, len(buf), 0
    while pos < n:
        length, _type, _stream, _msg, _time, key_len = unpack(buf, pos)
        key_end = pos + 31 + key_len
        _key = buf[pos + 31 : key_end]
        _payload = buf[key_end : pos + 4 + length]
        pos += 4 + length
        count += 1
    return count


def reader_loop(chunks: list[bytes]) -> int:
    reader = FrameReader()
    count = 0
    for chunk in chunks:
        count += len(reader.feed(chunk))
    return count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=64 * 1024)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    frames = [
        Message(i % 8, i, 1_700_000_000_000 + i, b"key-%d" % (i % 100), bytes(64)) for i in range(args.frames)
    ]
    encode_s = best_of(args.runs, lambda: [encode(f) for f in frames])
    buf = b"".join(encode(f) for f in frames)
    chunks = [buf[i : i + args.chunk] for i in range(0, len(buf), args.chunk)]
    assert bare_loop(buf) == reader_loop(chunks) == args.frames

    bare_s = best_of(args.runs, lambda: bare_loop(buf))
    reader_s = best_of(args.runs, lambda: reader_loop(chunks))
    mb = len(buf) / 1e6
    print(
        f"frames: {args.frames} MESSAGE, {len(buf) / args.frames:.0f} bytes each, {mb:.1f} MB, "
        f"chunk {args.chunk}"
    )
    print(f"encode            {args.frames / encode_s / 1e6:6.2f} M frames/s  {mb / encode_s:7.1f} MB/s")
    print(
        f"bare unpack loop  {args.frames / bare_s / 1e6:6.2f} M frames/s  {mb / bare_s:7.1f} MB/s  (baseline)"
    )
    print(f"FrameReader.feed  {args.frames / reader_s / 1e6:6.2f} M frames/s  {mb / reader_s:7.1f} MB/s")
    ratio = bare_s / reader_s
    print(f"ratio reader/bare: {ratio:.2f}x (target >= 0.60x) {'OK' if ratio >= 0.6 else 'BELOW TARGET'}")


if __name__ == "__main__":
    main()
