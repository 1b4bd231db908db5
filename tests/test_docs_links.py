"""The README and docs link only inside the repository, and every link finds its file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_finds_its_file_inside_the_repository(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        path = target.split("#", 1)[0]
        if "://" in target or target.startswith("mailto:"):
            broken.append(f"{target}: outside the repository")
        elif path and not (page.parent / path).resolve().exists():
            broken.append(f"{target}: no such file")
    assert broken == []
