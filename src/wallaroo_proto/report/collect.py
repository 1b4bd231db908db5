"""Captures to a ``Report`` in this process: the dissector's records into ``ReportBuilder``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from wallaroo_proto.capture.dissector import Dissector
from wallaroo_proto.capture.pcap import CaptureError

from .model import CaptureReport, Report, ReportBuilder, ReportLimits


def build_report(
    paths: Iterable[str | os.PathLike],
    *,
    ports: Iterable[int] | None = None,
    protocol: str | None = None,
    limits: ReportLimits | None = None,
    title: str | None = None,
    keep: Callable[[dict], bool] | None = None,
) -> Report:
    """Dissect each capture once, streaming: memory stays within ``limits`` whatever the sizes.

    A capture that cannot be read to its end keeps what came before the damage,
    and its error is shown in the report. ``keep`` (a display filter) picks the
    frames drawn; the others are read and left out.
    """
    limits = limits or ReportLimits()
    builder = ReportBuilder(limits)
    captures = []
    for path in paths:
        name = os.fspath(path)
        capture = CaptureReport(name)
        dissector = Dissector(name, ports=ports, protocol=protocol, keep_summaries=False)
        try:
            for record in dissector.run(name):
                if keep is None or keep(record):
                    builder.feed(record)
        except CaptureError as err:
            capture.error = str(err)
            capture.cut = err.cut
        except OSError as err:
            capture.error = err.strerror or str(err)
        capture.connections = builder.finish()
        captures.append(capture)
    report = Report(captures, limits)
    if title:
        report.title = title
    return report
