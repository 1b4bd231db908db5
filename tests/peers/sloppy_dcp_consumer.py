"""A sloppy DCP consumer for the conformance tests: it over-acknowledges and never asks twice.

Connects to ``--connect HOST:PORT``, opens a DCP connection with a 64 KiB
flow-control buffer, asks every vbucket GET_ALL_VB_SEQNOS names for its stream
from 0 to its high seqno, and reads until every stream ended, whatever way it
ended (it never asks again after a STREAM_END other than ok). Once half its
buffer is used it acknowledges twice the buffer, more than was ever sent. Exits 0.
"""

from __future__ import annotations

import argparse
import asyncio

from wallaroo_proto.protocols.dcp import codec

BUFFER = 65536


async def main(host: str, port: int) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(codec.open_request("sloppy", codec.OPEN_PRODUCER, 1))
    writer.write(codec.control_request("connection_buffer_size", str(BUFFER), 2))
    writer.write(codec.request(codec.GET_ALL_VB_SEQNOS, opaque=3))
    splitter = codec.PacketSplitter()
    streams = None  # how many are still open, once asked for
    unacked = 0
    while data := await reader.read(65536):
        for _, wire in splitter.feed(data):
            p = codec.decode_packet(wire)
            if not p.is_request and p.opcode == codec.GET_ALL_VB_SEQNOS:
                seqnos = codec.parse(p, 0, codec.GET_ALL_VB_SEQNOS).vb_seqnos
                for vb, high in seqnos:
                    writer.write(codec.stream_req_request(vb, 100 + vb, codec.StreamReq(0, 0, high, 0, 0, 0)))
                streams = len(seqnos)
            elif not p.is_request and p.opcode == codec.STREAM_REQ and p.status != codec.SUCCESS:
                streams -= 1
            elif p.is_request and p.opcode == codec.NOOP:
                writer.write(codec.response(codec.NOOP, opaque=p.opaque))
            elif p.is_request:
                unacked += len(wire)
                if unacked >= BUFFER // 2:
                    writer.write(codec.buffer_ack(2 * BUFFER))  # more than can be unacknowledged
                    unacked = 0
                if p.opcode == codec.STREAM_END:
                    streams -= 1
        if streams is not None and streams <= 0:
            break
    writer.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--connect", required=True)
    args = parser.parse_args()
    host, _, port = args.connect.rpartition(":")
    asyncio.run(main(host, int(port)))
