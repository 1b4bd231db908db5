"""Conformance results as data: a JSON document and JUnit XML for CI systems."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .runner import FAIL, PASS, SKIP, Case, Result, Suite, Target

#: Why a case an interrupt stopped has no result: the one then running, and those after it.
STOPPED = "the run was interrupted before this case concluded"
NOT_RUN = "not run: the run was interrupted"


def counts(results: Sequence[Result], not_run: int = 0) -> dict[str, int]:
    """Cases by outcome; ``not_run``: those an interrupt left without a result (in ``total`` too)."""
    tally = Counter(r.status for r in results)
    return {
        "passed": tally[PASS],
        "failed": tally[FAIL],
        "skipped": tally[SKIP],
        "not_run": not_run,
        "total": len(results) + not_run,
    }


def as_json(
    suite: Suite,
    target: Target,
    results: Sequence[Result],
    *,
    interrupted: bool = False,
    not_run: Sequence[Case] = (),
) -> dict[str, Any]:
    """The run as one document; ``interrupted`` and the ids ``not_run`` say a run was cut short, so
    a CI job reading it cannot take the cases that ran for the whole suite."""
    return {
        "protocol": suite.protocol,
        "suite": suite.name,
        "target": target.describe(),
        "interrupted": interrupted,
        "summary": counts(results, len(not_run)),
        "cases": [r.as_dict() for r in results],
        "not_run": [c.id for c in not_run],
    }


def junit_xml(
    suite: Suite,
    target: Target,
    results: Sequence[Result],
    *,
    interrupted: bool = False,
    not_run: Sequence[Case] = (),
) -> bytes:
    """One <testsuite>: a <testcase> per case, <failure> or <skipped> with the reason, what was seen
    in <system-out>; the shape Jenkins, GitLab and GitHub test reporters read.

    After an interrupt every case still has its <testcase>: the first without a result an <error>
    (so the run is not green), the others <skipped>, and the property ``interrupted`` is true."""
    tally = counts(results, len(not_run))
    root = ET.Element("testsuites", name="wallaroo-proto conformance")
    node = ET.SubElement(
        root,
        "testsuite",
        name=f"{suite.protocol}.{suite.name}",
        tests=str(tally["total"]),
        failures=str(tally["failed"]),
        errors="1" if not_run else "0",
        skipped=str(tally["skipped"] + max(0, len(not_run) - 1)),
        time=f"{sum(r.seconds for r in results):.3f}",
    )
    properties = ET.SubElement(node, "properties")
    ET.SubElement(properties, "property", name="target", value=target.describe())
    if interrupted:
        ET.SubElement(properties, "property", name="interrupted", value="true")
    for r in results:
        case = ET.SubElement(
            node,
            "testcase",
            classname=f"{suite.protocol}.{suite.name}",
            name=r.case.id,
            time=f"{r.seconds:.3f}",
        )
        if r.status == FAIL:
            ET.SubElement(case, "failure", message=r.reason, type=r.case.ref).text = r.seen
        elif r.status == SKIP:
            ET.SubElement(case, "skipped", message=r.reason)
        out = "\n".join(part for part in (f"{r.case.ref}: {r.case.expect}", r.seen) if part)
        ET.SubElement(case, "system-out").text = out
    for index, left in enumerate(not_run):
        case = ET.SubElement(
            node, "testcase", classname=f"{suite.protocol}.{suite.name}", name=left.id, time="0"
        )
        if index == 0:
            ET.SubElement(case, "error", message=STOPPED, type="interrupted")
        else:
            ET.SubElement(case, "skipped", message=NOT_RUN)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
