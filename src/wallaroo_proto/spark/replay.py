"""One spark-replay run: captures read into the tables, a question asked of them, the tables
shown, written and drawn.

The command turns its options into a ``Replay`` and renders through a ``Show``; the steps and
their order (filter, the --fail-fast count, persisting, --sql and --job, writing, the report)
live here. Importing this module does not import pyspark; ``run`` does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from wallaroo_proto.spark import reports
from wallaroo_proto.spark.plan import Problem

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from wallaroo_proto.display_filter import Node

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


@dataclass
class Replay:
    """What one run reads, asks and writes (the command's options, checked)."""

    paths: Sequence[str]
    ports: Sequence[int] | None = None  # None: each protocol's own
    fail_fast: bool = False
    output: str | None = None  # a directory every table is written to
    output_format: str = "parquet"
    sql: str | None = None
    job: str | None = None  # MODULE:FUNCTION
    listing_problems: Sequence[Problem] = ()  # named before Spark started: not named again
    report_path: str | None = None
    display_filter: Node | None = None  # a parsed -Y expression
    standard: bool = True  # the standard tables are shown (else only the answers)


class Show(Protocol):
    """How a run is shown: the command's rendering, called in order as the run goes."""

    def stage(self, description: str) -> AbstractContextManager[None]:
        """Per-stage progress while the body runs Spark actions."""
        ...

    def problem(self, *parts: str) -> None:
        """One line naming a problem: the parts are text, each escaped on its own."""
        ...

    def note(self, text: str) -> None:
        """A timing line."""
        ...

    def done(self, text: str, detail: str = "") -> None:
        """What was written, and where."""
        ...

    def table(self, name: str, title: str, frame: DataFrame, answer: bool) -> None:
        """One table (``answer``: the frame --sql or --job made, shown as it came)."""
        ...


def _first_line(err: BaseException, limit: int) -> str:
    return str(err).strip().splitlines()[0][:limit]


def run(spark: SparkSession, replay: Replay, show: Show) -> int:  # noqa: C901 - the steps in their order
    """Read, ask, show, write and draw as ``replay`` says: the exit code (0, 1 problems, 2 usage)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from wallaroo_proto.spark import frames as frames_mod
    from wallaroo_proto.spark import jobs

    r = replay
    loaded = frames_mod.load_frames(spark, r.paths, ports=r.ports, fail_fast=r.fail_fast)
    if r.display_filter is not None:
        from wallaroo_proto.display_filter import spark_predicate

        loaded.frames = loaded.frames.where(spark_predicate(r.display_filter, reports.field_column))
    started = time.monotonic()
    try:
        with show.stage("reading captures"):
            by_protocol = dict(loaded.frames.groupBy("protocol").count().collect())
            totals = sum(by_protocol.values())
            problems = loaded.problems.collect()
    except (Py4JJavaError, PySparkException) as exc:
        failed = frames_mod.fail_fast_message(exc)
        if failed is None:
            raise
        show.problem(f"capture {failed}")
        show.problem("stopped (--fail-fast)")
        return EXIT_USAGE
    size = sum(c.size for c in loaded.captures)
    show.note(
        f"{len(loaded.captures)} captures ({size / 1e6:.1f} MB) in {loaded.tasks} tasks: "
        f"{totals:,} frames in {time.monotonic() - started:.1f} s"
    )
    listed = {p.capture for p in r.listing_problems}
    for problem in problems:
        if problem["capture"] not in listed:
            show.problem(
                "capture ", problem["capture"], ": ", problem["error"], " (frames before it are kept)"
            )

    tables = reports.build_tables(loaded.frames, loaded.problems)
    if r.output:  # shown, then written: each summary computed once (they are small; frames are persisted)
        tables = {n: t if n in ("frames", "messages", "problems") else t.persist() for n, t in tables.items()}
    jobs.register_views(tables)
    extra: dict[str, DataFrame] = {}
    try:  # planned before anything is shown: a mistake in them is usage, found at once
        if r.sql:
            extra["sql"] = jobs.run_sql(spark, r.sql)
        if r.job:
            extra["job"] = jobs.run_job(spark, r.job, tables["messages"])
    except jobs.JobError as exc:
        show.problem(str(exc))
        return EXIT_USAGE
    try:
        for name, title, frame in shown_tables(tables, extra, by_protocol, r):
            show.table(name, title, frame, answer=name in extra)
    except (Py4JJavaError, PySparkException) as exc:
        show.problem(f"the job failed: {_first_line(exc, 500)}")
        return EXIT_PROBLEM
    if r.output:
        try:
            with show.stage(f"writing {r.output_format}"):
                written = jobs.write_tables({**tables, **extra}, r.output, r.output_format)
        except (Py4JJavaError, PySparkException) as exc:
            show.problem("cannot write ", r.output, ": ", _first_line(exc, 300))
            return EXIT_USAGE
        show.done(
            f"wrote {len(written)} tables as {r.output_format} to {r.output}/", f"({', '.join(written)})"
        )
    if r.report_path:
        from wallaroo_proto.report import spark as report_spark
        from wallaroo_proto.report.html import write_report

        with show.stage("drawing the report"):
            errors = {p["capture"]: p["error"] for p in problems}
            flat = reports.flat_frames(loaded.frames)
            drawn = report_spark.build_report(flat, [c.name for c in loaded.captures], errors=errors)
            write_report(drawn, r.report_path)
        show.done(f"wrote the report to {r.report_path}")
    return EXIT_PROBLEM if problems or r.listing_problems else EXIT_OK


def shown_tables(
    tables: Mapping[str, DataFrame], extra: Mapping[str, DataFrame], by_protocol: Mapping[str, int], r: Replay
) -> list[tuple[str, str, DataFrame]]:
    """The tables shown, in order, with their titles: the standard ones, then the answers."""
    shown = reports.printed_views(by_protocol) if r.standard else []
    listed = [(name, title, tables[name]) for name, title in shown]
    return listed + [
        (name, f"--{name} {r.sql if name == 'sql' else r.job}", frame) for name, frame in extra.items()
    ]
