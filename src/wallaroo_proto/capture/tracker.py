"""What every plug-in's connection tracker keeps alike, so each writes only its protocol's part.

The dissector driver reads ``summary``, ``label``, ``ident``, ``violations`` and
the notes of any tracker; a plug-in subclasses ``ConnectionTracker`` and adds
its directions, its core and its own counters.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from wallaroo_proto.capture.pcap import connection_ident

if TYPE_CHECKING:
    from wallaroo_proto.capture.dissector import Dissector

#: Violations listed per connection in its summary (all of them are counted).
KEEP_VIOLATIONS = 1000


class ConnectionTracker:
    """One TCP connection's identity, notes, type counts and violations."""

    #: The plug-in's name, as in the records' ``protocol`` field.
    protocol = ""

    def __init__(
        self, dissector: Dissector, index: int, client: tuple[bytes, int], server: tuple[bytes, int]
    ):
        self.out = dissector.out
        self.jsonl = dissector.jsonl
        self.canon: tuple = ()
        self.initiator_fixed = False
        self.frame_index = 0
        self.notes: list[str] = []  # for the next record
        self.capture_notes: list[str] = []  # all of them, for the summary
        self.types: Counter[str] = Counter()
        self.violation_list: list[dict] = []
        self.violations = 0
        self.findings: list[dict] = []  # the plug-in's own (findings.mark), for the summary
        self.first_packet = self.last_packet = 0
        self.first_ts = self.last_ts = 0.0
        self.closed = "open at end of capture"
        self.conn_index = index
        self.ident = connection_ident(dissector.capture_name, self.protocol, index, client, server)
        self.label = self.ident["connection"]

    @property
    def summary(self) -> Any:
        """The driver asks for ``summary.violations`` and ``summary.as_dict()``: both are here."""
        return self

    def dir_label(self, direction: Any) -> str:
        return "initiator>responder" if direction.client else "responder>initiator"

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.capture_notes.append(text)

    def _violation(self, record: dict, reason: str) -> None:
        record["violations"] = [reason]
        self.violations += 1
        if len(self.violation_list) < KEEP_VIOLATIONS:
            self.violation_list.append(
                {
                    "packet": record["packet"],
                    "offset": record["offset"],
                    "type": record["type"],
                    "reason": reason,
                }
            )
