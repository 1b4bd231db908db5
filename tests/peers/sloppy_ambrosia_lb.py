"""A sloppy AMBROSIA language binding for the conformance tests: it keeps no state across a recovery.

It connects to the IC's receive port, then its send port (``--receive-port``,
``--send-port``), answers TakeBecomingPrimaryCheckpoint with its InitialMessage
and a checkpoint, and every checkpoint request with the number of RPC records it
has read since it started, as its checkpoint: it never loads the checkpoint a
recovery hands it, so its state after a recovery differs from a crash-free run's.
An upgrade's checkpoint request it takes for a first start (an InitialMessage
first). When the IC closes it does not exit (it waits to be killed).
"""

from __future__ import annotations

import argparse
import asyncio

from wallaroo_proto.protocols.ambrosia.codec import (
    CHECKPOINT_SEQ,
    CONTROL_SEQ,
    INITIAL_MESSAGE,
    TAKE_BECOMING_PRIMARY_CHECKPOINT,
    UPGRADE_TAKE_CHECKPOINT,
    RecordFrame,
    RecordSplitter,
    encode_checkpoint,
    encode_message,
    record_messages,
)


async def main(receive_port: int, send_port: int) -> None:
    _, to_ic = await asyncio.open_connection("127.0.0.1", receive_port)
    while True:  # the IC listens on its send port only once the receive port is connected
        try:
            from_ic, _ = await asyncio.open_connection("127.0.0.1", send_port)
            break
        except ConnectionRefusedError:
            await asyncio.sleep(0.05)
    splitter = RecordSplitter()
    records = 0
    while data := await from_ic.read(65536):
        for frame in splitter.feed(data):
            if type(frame) is not RecordFrame or frame.header.seq == CHECKPOINT_SEQ:
                continue
            if frame.header.seq != CONTROL_SEQ:
                records += 1
                continue
            kind = record_messages(frame.body)[0].type
            if kind == TAKE_BECOMING_PRIMARY_CHECKPOINT and records == 0 or kind == UPGRADE_TAKE_CHECKPOINT:
                to_ic.write(encode_message(INITIAL_MESSAGE, b"sloppy"))
            blob = b"%d" % records
            to_ic.write(encode_checkpoint(len(blob)) + blob)
    await asyncio.Event().wait()  # the IC is gone, and this LB stays


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--receive-port", type=int, required=True)
    parser.add_argument("--send-port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(main(args.receive_port, args.send_port))
