"""Conformance results as data: a JSON document and JUnit XML for CI systems."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .runner import FAIL, PASS, SKIP, Result, Suite, Target


def counts(results: Sequence[Result]) -> dict[str, int]:
    tally = Counter(r.status for r in results)
    return {"passed": tally[PASS], "failed": tally[FAIL], "skipped": tally[SKIP], "total": len(results)}


def as_json(suite: Suite, target: Target, results: Sequence[Result]) -> dict[str, Any]:
    return {
        "protocol": suite.protocol,
        "suite": suite.name,
        "target": target.describe(),
        "summary": counts(results),
        "cases": [r.as_dict() for r in results],
    }


def junit_xml(suite: Suite, target: Target, results: Sequence[Result]) -> bytes:
    """One <testsuite>: a <testcase> per case, <failure> or <skipped> with the reason, what was seen
    in <system-out>; the shape Jenkins, GitLab and GitHub test reporters read."""
    tally = counts(results)
    root = ET.Element("testsuites", name="wallaroo-proto conformance")
    node = ET.SubElement(
        root,
        "testsuite",
        name=f"{suite.protocol}.{suite.name}",
        tests=str(tally["total"]),
        failures=str(tally["failed"]),
        errors="0",
        skipped=str(tally["skipped"]),
        time=f"{sum(r.seconds for r in results):.3f}",
    )
    ET.SubElement(ET.SubElement(node, "properties"), "property", name="target", value=target.describe())
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
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"
