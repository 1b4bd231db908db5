"""Findings: what a frame shows went wrong, or explains what follows, each with its cause.

This is Wireshark's expert info for these protocols. One vocabulary, three sources:

- a frame's protocol violations are **errors**;
- its capture notes (a gap, a start mid-connection, a resync, a packet comment such as a proxy
  fault's) are **warnings**: what the capture says about itself;
- a plug-in marks the frames that carry an event of its protocol a reader needs to know of, with
  the cause the frames give (a DCP rollback with the start and uuid asked for, a Wallaroo
  RESTART, a Kinesis checkpoint refused): ``mark`` puts it in the record's ``severity`` and
  ``finding`` fields, as **error**, **warning** or **note**.

``of_record`` gives a record's findings in that order. Frames handed out in a ``FrameBlock`` (the
fast paths' runs of accepted frames) never carry one, so a reader of findings may skip blocks.
"""

from __future__ import annotations

from collections.abc import Iterator

#: Most severe first (the order every view lists them in).
SEVERITIES = ("error", "warning", "note")

#: Findings a connection's summary lists (all are counted).
KEEP = 1000


def mark(record: dict, severity: str, text: str, kept: list[dict] | None = None) -> None:
    """Give ``record`` a finding of its protocol, and keep it in ``kept`` (a tracker's list for its
    summary, bounded by ``KEEP``). A second mark on one frame joins the first, the more severe first."""
    if severity not in SEVERITIES:
        raise ValueError(f"unknown severity {severity!r} (known: {', '.join(SEVERITIES)})")
    joined = text
    old = record.get("finding")
    if old is not None:
        rank = SEVERITIES.index
        if rank(severity) < rank(record["severity"]):
            joined = f"{text}; {old}"
        else:
            joined, severity = f"{old}; {text}", record["severity"]
    record["severity"], record["finding"] = severity, joined
    if kept is not None and len(kept) < KEEP:
        kept.append(
            {
                "severity": severity,
                "packet": record.get("packet"),
                "frame_index": record.get("frame_index"),
                "type": record.get("type"),
                "finding": text,
            }
        )


def of_record(record: dict) -> Iterator[tuple[str, str]]:
    """A record's findings as (severity, text): its violations, its notes, then its plug-in's."""
    for reason in record.get("violations") or ():
        yield "error", reason
    for note in record.get("notes") or ():
        yield "warning", note
    if record.get("finding") is not None:
        yield record["severity"], record["finding"]


def has_findings(record: dict) -> bool:
    return bool(record.get("violations") or record.get("notes") or record.get("finding") is not None)


def of_summary(summary: dict) -> list[dict]:
    """A connection summary's findings, in frame order: the violations and plug-in findings it kept
    (``violation_list``, ``findings``), then its capture notes (which name their packet in their text)."""
    about = {"conn_index": summary["conn_index"], "protocol": summary.get("protocol", "wallaroo")}
    rows = [
        {
            **about,
            "severity": "error",
            "packet": v.get("packet"),
            "type": v.get("type"),
            "finding": v["reason"],
        }
        for v in summary.get("violation_list") or ()
    ]
    rows += [{**about, **f} for f in summary.get("findings") or ()]
    rows.sort(key=lambda row: row["packet"] or 0)
    rows += [
        {**about, "severity": "warning", "packet": None, "type": None, "finding": note}
        for note in summary.get("capture_notes") or ()
    ]
    return rows


__all__ = ["KEEP", "SEVERITIES", "has_findings", "mark", "of_record", "of_summary"]
