"""How Wallaroo records and summaries read in ``dissect``'s tables (the plug-in's views)."""

from __future__ import annotations

import base64

from rich.console import Console
from rich.table import Table
from rich.text import Text


def preview(data: bytes, width: int = 32) -> str:
    """Printable ASCII, dots for the rest, cut at ``width``."""
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in data[:width])
    return text + ("…" if len(data) > width else "")


def describe(r: dict) -> str:
    """The frame's own fields that the record holds: a damaged frame may lack any of them."""
    t = r["type"]
    get = r.get
    if get("verdict") == "malformed":  # its fields could not be read: say why instead
        return "; ".join(get("violations") or ())
    if t == "MESSAGE":
        parts = []
        if get("twopc"):
            if get("txn_id") is not None:
                parts.append(f"txn={r['txn_id']}")
            if get("where") is not None:
                parts.append("where=" + _where(r["where"]))
            if get("commit") is not None:
                parts.append("commit" if r["commit"] else "abort")
            if get("rtag") is not None:
                parts.append(f"rtag={r['rtag']}")
            if get("txn_ids") is not None:
                parts.append(f"txns={r['txn_ids']}")
            return " ".join(parts)
        for label, k in (("stream", "stream_id"), ("id", "message_id"), ("t", "event_time")):
            if get(k) is not None:
                parts.append(f"{label}={r[k]}")
        if get("key_b64"):  # '' when the message has no key
            parts.append("key=" + preview(base64.b64decode(r["key_b64"]), 16))
        return " ".join(parts)
    keys = {
        "HELLO": ("version", "program_name", "instance_name", "cookie_len"),
        "OK": ("initial_credits",),
        "ERROR": ("reason",),
        "NOTIFY": ("stream_id", "stream_name", "point_of_ref"),
        "NOTIFY_ACK": ("success", "stream_id", "point_of_ref"),
        "ACK": ("credits",),
        "RESTART": ("address",),
        "EOS_MESSAGE": ("stream_id", "message_id"),
        "WORKERS_LEFT": ("rtag", "worker_names"),
    }.get(t, ())
    text = " ".join(f"{k}={r[k]}" for k in keys if r.get(k) is not None)
    if t == "ACK" and r.get("acks"):
        text += " acks=" + ",".join(f"{a['stream_id']}@{a['point_of_ref']}" for a in r["acks"])
    return text


def _where(where: list[dict]) -> str:
    return ",".join(f"{w['stream_id']}:{w['start_por']}-{w['end_por']}" for w in where)


def print_summary(console: Console, s: dict) -> None:
    title = f"connection #{s['conn_index']}  {s['connection']}  ({s['use']})"
    console.rule(Text(title, style="bold"))
    info = Table(show_header=False, box=None, pad_edge=False)
    info.add_column(style="bold")
    info.add_column()
    hello = s["hello"]
    if hello:
        info.add_row(
            "hello", f"version {hello['version']!r}, {hello['program_name']}/{hello['instance_name']}"
        )
    info.add_row(
        "packets", f"{s['first_packet']}..{s['last_packet']} over {s['duration']:.6f} s, {s['closed']}"
    )
    info.add_row("frames", ", ".join(f"{k} {v}" for k, v in s["frames_by_type"].items()) or "none")
    info.add_row("bytes", ", ".join(f"{k} {v}" for k, v in s["bytes_by_direction"].items()) or "0")
    if s["use"] != "sink":  # a sink ignores credits: its connection's counts would mean nothing
        info.add_row(
            "credits", f"granted {s['credits_granted']}, spent {s['credits_spent']}, left {s['credits_left']}"
        )
    info.add_row("checkpoints acked", str(s["checkpoints_acknowledged"]))
    restarts = ", ".join(
        f"packet {r['packet']}" + (f" → {r['address']}" if r["address"] else "") for r in s["restarts"]
    )
    info.add_row("RESTARTs", f"{len(s['restarts'])}" + (f" ({restarts})" if restarts else ""))
    for e in s["errors"]:
        info.add_row("ERROR", Text(f"packet {e['packet']} from {e['sender']}: {e['reason']}", style="red"))
    info.add_row("violations", Text(str(s["violations"]), style="bold red" if s["violations"] else "green"))
    console.print(info)
    if s["streams"]:
        t = Table(title="streams", title_justify="left", box=None, header_style="bold")
        for col in (
            "id",
            "name",
            "messages",
            "bytes",
            "ids",
            "gaps",
            "missing",
            "replays",
            "eos",
            "acked",
            "last acked",
        ):
            t.add_column(col, justify="left" if col == "name" else "right")
        for st in s["streams"]:
            ids = "" if st["first_id"] is None else f"{st['first_id']}..{st['last_id']}"
            t.add_row(
                str(st["stream_id"]),
                st["name"],
                str(st["messages"]),
                str(st["payload_bytes"]),
                ids,
                str(st["gaps"]),
                str(st["missing_ids"]),
                str(st["replays"]),
                str(st["eos"]),
                str(st["checkpoints"]),
                "" if st["last_acked"] is None else str(st["last_acked"]),
            )
        console.print(t)
    if s["twopc_rounds"] or s["list_uncommitted"]:
        t = Table(
            title=f"2PC rounds (LIST_UNCOMMITTED {s['list_uncommitted']})", title_justify="left", box=None
        )
        for col in ("txn", "where", "vote", "decision", "phase1 pkt", "phase2 pkt"):
            t.add_column(col)
        for r in s["twopc_rounds"]:
            where = _where(r["where"])
            t.add_row(
                r["txn_id"],
                where,
                Text(str(r["vote"]), style="green" if r["vote"] == "commit" else "red"),
                Text(str(r["decision"]), style="green" if r["decision"] == "commit" else "red"),
                str(r["phase1_packet"] or ""),
                str(r["phase2_packet"] or ""),
            )
        console.print(t)
    for v in s["violation_list"][:50]:
        console.print(Text(f"  packet {v['packet']} {v['type']}: {v['reason']}", style="red"))
    if len(s["violation_list"]) > 50:
        console.print(Text(f"  ... {s['violations'] - 50} more", style="red"))
    for note in s["capture_notes"]:
        console.print(Text(f"  note: {note}", style="yellow"))
