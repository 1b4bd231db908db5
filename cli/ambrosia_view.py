"""How ``ambrosia mock-ic`` and ``mock-lb`` show themselves: the ready line, the summary, a checkpoint's
state in words."""

from __future__ import annotations

import json

from rich.markup import escape
from wallaroo_proto_cli.options import format_address, plural
from wallaroo_proto_cli.serving import json_summary
from wallaroo_proto_cli.tables import stdout_console

IC = "wallaroo-proto ambrosia mock-ic"


def state_words(state: object) -> str:
    """A checkpoint's state in words: ``key value`` pairs for an object, JSON for anything else."""
    if isinstance(state, dict):
        return ", ".join(f"{k} {json.dumps(v)}" for k, v in state.items())
    return json.dumps(state)


def ready_line(host: str, rport: int, send_host: str, sport: int) -> str:
    """The ready line: both ports, and the two options that point mock-lb at them."""
    receive, send = format_address((host, rport)), format_address((send_host, sport))
    return (
        f"{IC}: listening on {receive} (receive port {rport}, send port {sport}); "
        f"an LB connects with --connect {receive} --send-connect {send}"
    )


def print_ic_summary(s: dict, fmt: str) -> None:
    """The run for people: the counts on one line, the last checkpoint, the resets, each violation."""
    if json_summary(s, fmt):
        return
    out = stdout_console()
    out.print(
        f"ambrosia mock-ic summary: {plural(s['rpcs_logged'], 'RPC')} logged and delivered since it started "
        f"({s['rpcs_before']:,} were in the log then; {s['rpcs_total']:,} in all), "
        f"{plural(s['self_calls_logged'], 'self call')} logged ({s['self_calls_dropped']:,} replayed ones "
        f"dropped), {plural(s['records_sent'], 'record')} sent ({s['records_replayed']:,} replayed), "
        f"{plural(s['checkpoints'], 'checkpoint')}; "
        f"{plural(s['runs'], 'run')}: {plural(s['first_starts'], 'first start')}, "
        f"{plural(s['recoveries'], 'recovery', 'recoveries')}; {s['rpcs_per_second']:,} RPCs/s"
    )
    last = s["last_checkpoint"]
    if last is not None:
        out.print(
            f"last checkpoint: before record {last['seq']}, {plural(last['bytes'], 'byte')}, "
            f"state {escape(state_words(last['state']))}"
        )
    if s["stalls"]:
        out.print(f"{plural(s['stalls'], 'LB connection')} reset for reading nothing (--write-timeout)")
    for v in s["violations"]:
        out.print(f"[bold red]VIOLATION[/] {escape(v)}")
