"""A sloppy DCP producer for the conformance tests: it says SUCCESS to everything and checks nothing.

One vbucket (0) of 20 items. Every request it can read is answered SUCCESS (unknown
controls, bad seqno ranges, a second stream, a vbucket it does not own, a uuid it
never had); HELLO grants Collections on top of what was asked; a stream goes out in
one snapshot with no regard to the flow-control buffer; once noops are enabled one
goes every 0.2 s, answered or not; bytes that are no packet are ignored. Prints the
usual ready line (``listening on HOST:PORT``) and serves until killed.
"""

from __future__ import annotations

import asyncio
import struct

from wallaroo_proto.protocols.dcp import codec

HIGH = 20
UUID = 0x5EED_0000_0000_0001
_STREAM_REQ = struct.Struct(">IIQQQQQ")


async def noops(writer: asyncio.StreamWriter) -> None:
    opaque = 1
    while True:
        await asyncio.sleep(0.2)
        opaque += 1
        writer.write(codec.noop(opaque))


def stream(vb: int, opaque: int, start: int, end: int) -> bytes:
    out = []
    last = min(end, HIGH)
    if last > start:
        out.append(codec.snapshot_marker(vb, opaque, start, last, codec.SNAP_MEMORY))
        for seqno in range(start + 1, last + 1):
            out.append(codec.mutation(vb, opaque, seqno, 1, f"key-{seqno:04d}".encode(), b"v" * 60))
    if end <= HIGH:
        out.append(codec.stream_end(vb, opaque, codec.END_OK))
    return b"".join(out)


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    buf = b""
    ticker = None
    while data := await reader.read(65536):
        buf += data
        while len(buf) >= 24 and len(buf) >= 24 + int.from_bytes(buf[8:12], "big"):
            size = 24 + int.from_bytes(buf[8:12], "big")
            wire, buf = buf[:size], buf[size:]
            try:
                p = codec.decode_packet(wire)
            except codec.ProtocolError:
                continue
            if not p.is_request:
                continue
            reply = b""
            if p.opcode == codec.HELLO:
                asked = p.value + b"\x00\x12"
                reply = codec.response(p.opcode, opaque=p.opaque, value=asked)
            elif p.opcode == codec.GET_ALL_VB_SEQNOS:
                reply = codec.response(p.opcode, opaque=p.opaque, value=codec.vb_seqnos_value([(0, HIGH)]))
            elif p.opcode == codec.STREAM_REQ and len(p.extras) == 48:
                _, _, start, end, *_ = _STREAM_REQ.unpack(p.extras)
                log = codec.failover_log_value([(UUID, 0)])
                reply = codec.response(p.opcode, opaque=p.opaque, value=log)
                reply += stream(p.vbucket, p.opaque, start, end)
            else:
                if p.opcode == codec.CONTROL and p.key == b"enable_noop" and p.value == b"true":
                    ticker = ticker or asyncio.ensure_future(noops(writer))
                reply = codec.response(p.opcode, opaque=p.opaque)
            writer.write(reply)
    if ticker is not None:
        ticker.cancel()
    writer.close()


async def main() -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"sloppy dcp producer: listening on {host}:{port}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
