"""``wallaroo-proto conformance SUITE``: run a protocol's conformance cases against an implementation.

One subcommand per suite the protocol plug-ins bring (``wallaroo_proto.conformance.suites``);
the runner does the work, this module parses options and draws the table.
Exit 0 when no case failed, 1 when one did, 2 when the target cannot be tested.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from wallaroo_proto_cli.options import (
    LISTEN_ADDRESS,
    Command,
    Group,
    examples,
    format_address,
    open_failure,
    plural,
    usage_error,
)

from wallaroo_proto.conformance import Suite, SuiteUnavailable, run_suite, select, suites
from wallaroo_proto.conformance.report import as_json, counts, junit_xml
from wallaroo_proto.conformance.runner import FAIL, PASS, Result, Target

#: Lines of a failure's trace the table shows.
SEEN_LINES = 6
#: Parameter names of the hidden older spellings of suite options.
ALIAS = "alias__"
STYLES = {PASS: "[green]pass[/]", FAIL: "[bold red]FAIL[/]", "skip": "[yellow]skip[/]"}


def render(console: Console, suite: Suite, target: Target, results: list[Result], seconds: float) -> None:
    table = Table(
        title=f"{suite.protocol} {suite.name} conformance: {escape(target.describe())}", show_lines=False
    )
    table.add_column("result")
    table.add_column("case", no_wrap=True)
    table.add_column("rule", max_width=26)
    table.add_column("expected / seen", overflow="fold", ratio=1)
    for r in results:
        detail = escape(r.case.expect)
        if r.status == FAIL:
            detail += f"\n[red]{escape(r.reason)}[/]"
            if r.seen:  # the table shows the last lines; --format json has them all
                lines = r.seen.splitlines()
                shown = (
                    [f"... {len(lines) - SEEN_LINES} earlier"] if len(lines) > SEEN_LINES else []
                ) + lines[-SEEN_LINES:]
                detail += "\n[dim]" + escape("\n".join(shown)) + "[/]"
        elif r.status == "skip":
            detail += f"\n[yellow]{escape(r.reason)}[/]"
        else:
            detail += f"\n[dim]{escape(r.seen)}[/]"
        table.add_row(STYLES[r.status], r.case.id, escape(r.case.ref), detail)
    console.print(table)
    tally = counts(results)
    console.print(
        f"{tally['passed']} passed, {tally['failed']} failed, {tally['skipped']} skipped in {seconds:.2f} s"
    )


def list_cases(console: Console, suite: Suite) -> None:
    table = Table(title=f"{suite.protocol} {suite.name} conformance cases")
    for column in ("case", "rule", "expectation"):
        table.add_column(column)
    for case in suite.cases:
        table.add_row(case.id, escape(case.ref), escape(case.expect))
    console.print(table)


def make_command(suite: Suite) -> click.Command:
    params: list[click.Parameter] = []
    if suite.target == "address":
        params.append(click.Argument(["address"], required=False))
    else:
        params.append(click.Argument(["command"], nargs=-1, type=click.UNPROCESSED))
    if suite.can_listen:
        params.append(
            click.Option(
                ["--listen"],
                type=LISTEN_ADDRESS,
                help="Listen on HOST:PORT and wait for clients started by hand.",
            )
        )
    for opt in suite.options:
        kwargs: dict = {"help": opt.help, "show_default": opt.default is not None}
        if opt.flag:
            kwargs["is_flag"] = True
        elif opt.choices:
            kwargs["type"] = click.Choice(opt.choices)
        elif isinstance(opt.default, int):
            kwargs["type"] = click.IntRange(1)
        params.append(click.Option([f"--{opt.name}"], default=opt.default, hidden=opt.hidden, **kwargs))
        dest = opt.name.replace("-", "_")
        for alias in opt.aliases:  # an older name, still taken, hidden
            hidden = {k: v for k, v in kwargs.items() if k in ("is_flag", "type")}
            params.append(click.Option([f"--{alias}", f"{ALIAS}{dest}"], default=None, hidden=True, **hidden))
    params += [
        click.Option(
            ["--case", "only"], multiple=True, help="Run only this case, or cases under this prefix (repeat)."
        ),
        click.Option(
            ["--skip"], multiple=True, help="Leave out this case, or cases under this prefix (repeat)."
        ),
        click.Option(
            ["--timeout"],
            type=click.FloatRange(0.1),
            default=10.0,
            show_default=True,
            help="Seconds per case.",
        ),
        click.Option(
            ["--format", "fmt"],
            type=click.Choice(["text", "json"]),
            default="text",
            show_default=True,
            help="text: a table of the cases; json: one object with every case and what was seen.",
        ),
        click.Option(["--junit"], type=click.Path(dir_okay=False), help="Also write JUnit XML to this file."),
        click.Option(["--list", "list_only"], is_flag=True, help="List the cases and exit."),
        click.Option(["-q", "--quiet"], is_flag=True, help="No line per case as it ends: the table only."),
        click.Option(
            ["-v", "--verbose"],
            is_flag=True,
            help="A line per case as it ends on stderr, even when it is not a terminal.",
        ),
    ]

    def callback(
        only,
        skip,
        timeout,
        fmt,
        junit,
        list_only,
        quiet,
        verbose,
        address=None,
        command=(),
        listen=None,
        **options,
    ):
        if quiet and verbose:
            raise click.UsageError("--quiet and --verbose exclude each other")
        for key in [k for k in options if k.startswith(ALIAS)]:
            value = options.pop(key)
            if value is not None:
                options[key.removeprefix(ALIAS)] = value
        console = Console()
        if list_only:
            if fmt == "json":
                click.echo(json.dumps([{"id": c.id, "ref": c.ref, "expect": c.expect} for c in suite.cases]))
            else:
                list_cases(console, suite)
            return
        if suite.target == "address" and not address:
            raise usage_error("give the HOST:PORT to test")
        try:
            cases = select(suite.cases, only, skip)
        except ValueError as err:
            raise usage_error(str(err)) from None
        if junit:
            try:  # an unwritable --junit is said before the cases run, not after them as a traceback
                open(junit, "ab").close()
            except OSError as err:
                raise usage_error(open_failure(err, "--junit")) from None
        shown_listen = None if listen is None else format_address(listen)
        target = Target(address=address, command=tuple(command), listen=shown_listen)
        progress = Console(stderr=True)

        finished: list[Result] = []

        def on_result(result: Result) -> None:
            finished.append(result)
            if verbose or (fmt == "text" and progress.is_terminal and not quiet):
                progress.print(f"{STYLES[result.status]} {result.case.id}", highlight=False)

        def report(results: list[Result], interrupted: bool = False) -> None:
            cut = {"interrupted": interrupted, "not_run": cases[len(results) :] if interrupted else ()}
            if junit:
                Path(junit).write_bytes(junit_xml(suite, target, results, **cut))
            if fmt == "json":
                click.echo(json.dumps(as_json(suite, target, results, **cut)))
            else:
                render(console, suite, target, results, time.monotonic() - started)
                if cut["not_run"]:
                    console.print(
                        f"interrupted: {plural(len(cut['not_run']), 'case')} not run", highlight=False
                    )

        started = time.monotonic()
        try:
            results = asyncio.run(
                run_suite(suite, target, options, cases, timeout=timeout, on_result=on_result)
            )
        except SuiteUnavailable as err:
            raise usage_error(str(err)) from None
        except KeyboardInterrupt:
            report(finished, interrupted=True)  # the cases that ended, those not run, "interrupted", 130
            raise
        report(results)
        if any(r.status == FAIL for r in results):
            sys.exit(1)

    return Command(
        suite.name,
        params=params,
        callback=callback,
        epilog=examples(*suite.examples) if suite.examples else None,
        help=suite.help
        + " Exit 0 when every case passed or was skipped, 1 when one failed, 2 when the target "
        "cannot be tested.",
        short_help=suite.help,
    )


class SuiteGroup(Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [s.name for s in suites()]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for suite in suites():
            if suite.name == cmd_name:
                return make_command(suite)
        return None


@click.group(
    cls=SuiteGroup,
    epilog=examples(
        "wallaroo-proto conformance worker 127.0.0.1:7100",
        "wallaroo-proto conformance sink 127.0.0.1:7200 --format json --junit sink.xml",
        "wallaroo-proto conformance connector -- python my_connector.py --worker {host}:{port}",
        "wallaroo-proto conformance worker --list",
    ),
)
def command() -> None:
    """Test an implementation against a protocol's rules, case by case (like h2spec): one
    suite per role each protocol has (below).

    Each suite plays the other side and prints a table of its cases (pass, fail or
    skip, with the reason and what was seen); --format json and --junit FILE for CI.
    """
