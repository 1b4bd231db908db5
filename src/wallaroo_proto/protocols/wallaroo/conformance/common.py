"""What the three Wallaroo suites share: where the rules are written, and fresh ids."""

from __future__ import annotations

import random

SPEC = "spec"
NOTES = "protocol-notes"


def spec(section: str) -> str:
    """A section of the connector protocol v3 specification."""
    return f"{SPEC}: {section}"


def notes(section: str) -> str:
    """Shipped behaviour, as a section of docs/protocol-notes.md records it."""
    return f"{NOTES}: {section}"


def new_stream_id() -> int:
    """A stream id no earlier run used, so a worker's memory of old streams cannot matter."""
    return random.getrandbits(62) | 1 << 62


def tag() -> str:
    return f"{random.getrandbits(32):08x}"
