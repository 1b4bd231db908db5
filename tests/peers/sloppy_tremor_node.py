"""A sloppy Tremor node for the conformance tests: it acks and echoes everything and refuses nothing.

It speaks WebSocket through wsproto but sends no version greeting, acks every
connect, disconnect and close, sends every other JSON record straight back,
ignores what is not JSON, and never sends an error close. Prints the usual ready
line (``listening on HOST:PORT``) and serves until killed.
"""

from __future__ import annotations

import asyncio
import json

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Ping, Request, TextMessage
from wsproto.utilities import RemoteProtocolError


def answer(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    control = value.get("tremor") if isinstance(value, dict) else None
    if isinstance(control, dict) and "connect" in control:
        body = control["connect"]
        protocol = body.get("protocol")
        return [
            json.dumps(
                {"tremor": {"connect-ack": {"protocol": protocol, "alias": body.get("alias", protocol)}}}
            )
        ]
    if isinstance(control, dict) and "disconnect" in control:
        alias = control["disconnect"]
        alias = alias.get("alias") if isinstance(alias, dict) else alias
        return [json.dumps({"tremor": {"disconnect-ack": {"alias": alias}}})]
    if control == "close":
        return [json.dumps({"tremor": {"close-ack": "ok"}})]
    return [text]


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    ws = WSConnection(ConnectionType.SERVER)
    parts: list[str] = []
    while data := await reader.read(65536):
        try:
            ws.receive_data(data)
            events = list(ws.events())
        except RemoteProtocolError:
            break
        for event in events:
            if isinstance(event, Request):
                writer.write(ws.send(AcceptConnection()))
            elif isinstance(event, TextMessage):
                parts.append(event.data)
                if event.message_finished:
                    for reply in answer("".join(parts)):
                        writer.write(ws.send(TextMessage(data=reply)))
                    parts.clear()
            elif isinstance(event, Ping):
                writer.write(ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                pass  # neither answered nor acted on
    writer.close()


async def main() -> None:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"sloppy tremor node: listening on {host}:{port}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
