"""A sloppy Wallaroo worker for the conformance tests: it takes every HELLO and NOTIFY, refuses nothing.

OK (100 credits) to every HELLO, whatever its version or cookie, and NOTIFY_ACK
success=1 to every NOTIFY, before a HELLO too; every other frame is read and
dropped, and it never sends ERROR. Prints the usual ready line (``listening on
HOST:PORT``) and serves until killed.
"""

from __future__ import annotations

import asyncio

from wallaroo_proto.protocols.wallaroo.codec import encode
from wallaroo_proto.protocols.wallaroo.errors import ProtocolError
from wallaroo_proto.protocols.wallaroo.frames import Hello, Notify, NotifyAck, Ok
from wallaroo_proto.protocols.wallaroo.reader import FrameReader


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    frames = FrameReader(1 << 22)
    try:
        while data := await reader.read(65536):
            for frame in frames.feed(data):
                if type(frame) is Hello:
                    writer.write(encode(Ok(100)))
                elif type(frame) is Notify:
                    writer.write(encode(NotifyAck(True, frame.stream_id, 0)))
            await writer.drain()
    except (ConnectionError, ProtocolError):
        pass
    finally:
        writer.close()


async def main() -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"sloppy wallaroo worker: listening on {host}:{port}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
