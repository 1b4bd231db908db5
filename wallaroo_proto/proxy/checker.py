"""The proxy's live checker, a process of its own: the relayed bytes in, violations and summaries out.

Run as ``python -m wallaroo_proto.proxy.checker NAME PROTOCOL PORTS`` (PROTOCOL ``-``:
detected; PORTS comma-separated) with the relay's events (``proxy.chunks``) on stdin. Each frame with a
violation is written to stdout as its JSONL record the moment it is read; at the
end, one line ``{"summaries": [...]}``. The first line, ``{"ready": true}``, says it has
started (its imports take a few hundred ms). A process, not a thread: dissecting costs
about as much as relaying, and a second core is worth more than a shared one.
"""

from __future__ import annotations

import os
import signal
import sys

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.pcap import CaptureError
from wallaroo_proto.proxy.chunks import segments
from wallaroo_proto.records import to_json


def main(argv: list[str]) -> int:
    name, protocol, ports = argv
    # Ctrl-C reaches the whole process group: the proxy ends the stream, and this reads to its end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Second to the relay and the peers for the CPU: its work waits in the pipe, theirs holds up the traffic.
    os.nice(10)
    dissector = Dissector(
        name,
        protocol=None if protocol == "-" else protocol,
        ports=[int(p) for p in ports.split(",") if p],
    )
    dissector.want_records = False  # as for --summary: no record where a plug-in can avoid one
    out = sys.stdout
    out.write('{"ready": true}\n')  # what the proxy waits for before it says it is listening
    out.flush()
    error = None
    try:
        for item in dissector.segment_frames(segments(sys.stdin.fileno(), dissector.stats)):
            # Blocks hold accepted frames only: a violation is always a record of its own.
            if type(item) is dict and item.get("violations"):
                out.write(to_json(item) + "\n")
                out.flush()
    except CaptureError as err:
        error = str(err)
    out.write(to_json({"summaries": dissector.summaries(), "error": error}) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
