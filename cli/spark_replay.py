"""``wallaroo-proto spark-replay``: captures into a PySpark batch job (thin CLI).

The work lives in ``wallaroo_proto.spark`` (``replay.run``); this module turns options into a
``Replay``, starts Spark and renders through ``spark_replay_view.ConsoleShow``.
"""

from __future__ import annotations

import time

import click
from rich.console import Console
from rich.markup import escape
from wallaroo_proto_cli.options import (
    AliasChoice,
    Command,
    examples,
    hidden_alias,
    output_option,
    usage_error,
    verbosity,
)
from wallaroo_proto_cli.spark_replay_view import ConsoleShow

from wallaroo_proto.spark.reports import view_names

EXIT_PROBLEM, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
NAME = "wallaroo-proto spark-replay"
#: Table file formats, once given as --format (now --output-format).
FILE_FORMATS = ("parquet", "csv", "json")


def shows_standard_tables(sql: str | None, job: str | None, tables: bool, verbosity: int) -> bool:
    """The standard tables print unless the run asks a question (--sql, --job): then only with
    --tables or -v, so the answer is not buried under them."""
    return not (sql or job) or tables or verbosity > 0


@click.command(
    name="spark-replay",
    cls=Command,
    sections={
        "Spark": ["master", "confs"],
        "What is read": ["ports", "fail_fast"],
        "What is printed and written": ["fmt", "rows", "tables", "output", "output_format", "report_path"],
        "Your own query or job": ["sql", "job"],
    },
    epilog=examples(
        "wallaroo-proto spark-replay",
        "wallaroo-proto spark-replay captures/ --sql 'SELECT type, count(*) AS n FROM frames GROUP BY type'",
        "wallaroo-proto spark-replay captures/*.pcap -o tables --output-format csv --format jsonl",
        "wallaroo-proto spark-replay captures/ --master spark://10.0.0.5:7077 --job jobs.keys:count_keys",
        "wallaroo-proto spark-replay captures/ -Y 'protocol == dcp and vbucket in {0 1}'",
    ),
)
@click.argument("paths", nargs=-1)
@click.option(
    "--master",
    default="local[*]",
    show_default=True,
    help="Spark master URL (local[N], spark://..., yarn, k8s://...).",
)
@output_option("Write every table to DIR/<name> (see --output-format).", type=click.Path(file_okay=False))
@click.option(
    "--output-format",
    type=click.Choice(["parquet", "csv", "json"]),
    default="parquet",
    show_default=True,
    help="File format of the tables --output writes.",
)
@click.option(
    "--format",
    "fmt",
    type=AliasChoice(["text", "jsonl"], aliases={f: f for f in FILE_FORMATS}),
    default="text",
    show_default=True,
    help="text: tables of the first --rows rows; jsonl: every row of every table, one JSON object a line.",
)
@click.option(
    "--sql",
    "sql",
    help=f"A SQL query over the views {', '.join(view_names())}.",
)
@click.option("--job", "job", help="MODULE:FUNCTION taking the messages DataFrame and returning a DataFrame.")
@click.option(
    "-Y",
    "--display-filter",
    "display_filter",
    metavar="EXPR",
    help="Only the frames the expression matches (as dissect -Y), before every table and report.",
)
@click.option("--fail-fast", is_flag=True, help="Stop at the first unreadable or damaged capture.")
@click.option(
    "--port",
    "ports",
    type=int,
    multiple=True,
    help="TCP port to read (repeatable; default each protocol's: wallaroo 7100 and 7200, kinesis 7300, "
    "dcp 11210, ambrosia 2000 and 2001, tremor 9899); "
    "connections that open with a known protocol are found on any port.",
)
@click.option(
    "--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Extra Spark configuration (repeatable)."
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    help="Also draw the captures as one offline HTML report (see the report command).",
)
@click.option(
    "--tables",
    is_flag=True,
    help="With --sql or --job, also print the standard tables (they print alone without either).",
)
@click.option("--rows", default=20, show_default=True, type=click.IntRange(1), help="Rows printed per table.")
@hidden_alias("--jsonl", "fmt", value="jsonl", is_flag=True)
@verbosity(
    quiet="No progress bars or timing lines: errors and the tables (with --sql or --job, the answer alone).",
    verbose="Also where Spark's own log is written, and the standard tables with --sql or --job.",
)
def command(
    paths: tuple[str, ...],
    master: str,
    output: str | None,
    output_format: str,
    fmt: str,
    sql: str | None,
    job: str | None,
    display_filter: str | None,
    fail_fast: bool,
    ports: tuple[int, ...],
    confs: tuple[str, ...],
    rows: int,
    tables: bool,
    report_path: str | None,
    verbosity: int,
) -> None:
    """Read pcap/pcapng captures (files, directories, globs; default captures/) with Spark:
    frames, messages, a delivery audit, flow control, RESTARTs, 2PC rounds and violations,
    then an optional --sql query or --job over them."""
    if fmt in FILE_FORMATS:  # the older --format parquet|csv|json named what --output writes
        output_format, fmt = fmt, "text"
    out = Console()
    err = Console(stderr=True, soft_wrap=True, highlight=False)
    info = Console(stderr=True, soft_wrap=True, quiet=verbosity < 0)  # progress and timings
    conf = []
    for item in confs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--conf")
        conf.append((key.strip(), value.strip()))

    from py4j.protocol import Py4JJavaError

    from wallaroo_proto.display_filter import FilterError, parse
    from wallaroo_proto.spark import jobs, plan
    from wallaroo_proto.spark.replay import Replay, run
    from wallaroo_proto.spark.session import SparkStartError, build_session, spark_failure, stop_session

    try:  # a bad expression is reported before Spark starts
        tree = None if display_filter is None else parse(display_filter)
    except FilterError as exc:
        raise usage_error(f"-Y: {exc}") from None
    if job:
        try:
            jobs.load_job(job)  # a typo in --job is reported before Spark reads anything
        except jobs.JobError as exc:
            raise usage_error(str(exc)) from None
    given = paths or plan.DEFAULT_PATHS
    captures, listing_problems = plan.list_captures(given)
    for problem in listing_problems:
        err.print(f"[red]{NAME}: capture {escape(problem.capture)}: {escape(problem.error)}[/red]")
    if (fail_fast or not captures) and listing_problems:  # the lines above said why
        raise SystemExit(EXIT_USAGE)
    if not captures:
        raise usage_error(f"no capture files in {', '.join(given)}")

    started = time.monotonic()
    with info.status(f"starting Spark on {master}…"):
        try:
            spark = build_session(master, conf=conf)
        except SparkStartError as exc:
            raise usage_error(str(exc)) from None
    info.print(f"[dim]Spark {spark.version} on {master} started in {time.monotonic() - started:.1f} s[/dim]")
    if verbosity > 0:
        err.print(f"{NAME}: Spark's own log: {getattr(spark, '_wallaroo_log', 'not known')}")
    replay = Replay(
        given,
        ports=ports or None,
        fail_fast=fail_fast,
        output=output,
        output_format=output_format,
        sql=sql,
        job=job,
        listing_problems=listing_problems,
        report_path=report_path,
        display_filter=tree,
        standard=shows_standard_tables(sql, job, tables, verbosity),
    )
    try:
        code = run(spark, replay, ConsoleShow(spark, out, err, info, None if fmt == "jsonl" else rows, NAME))
    except KeyboardInterrupt:
        err.print(f"[yellow]{NAME}: interrupted; stopping Spark[/yellow]")
        code = EXIT_INTERRUPTED
    except Py4JJavaError as exc:  # Spark itself failed (a master that gave up on us...): one line, no stack
        err.print(f"[red]{NAME}: Spark failed: {escape(spark_failure(spark, exc))}[/red]")
        code = EXIT_PROBLEM
    finally:
        stop_session(spark)
    raise SystemExit(code)
