"""The README and docs link only inside the repository, every link finds its file, and every
``#anchor`` in a link to a markdown page finds a heading (or an ``<a id>``) there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page: each heading's slug (lower case, punctuation but ``-`` and
    ``_`` dropped, spaces as ``-``; a repeated one gets ``-1``, ``-2``), and ``<a id>`` names."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if heading is None:
            continue
        text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        path, _, anchor = target.partition("#")
        if "://" in target or target.startswith("mailto:"):
            broken.append(f"{target}: outside the repository")
            continue
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such heading in {linked.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_finds_its_file_and_heading_inside_the_repository(page: Path) -> None:
    assert broken_links(page) == []


def test_anchors_are_githubs_slugs_of_the_headings(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# wallaroo-proto\n"
        "### proxy: watch and break a real conversation\n"
        "## AMBROSIA: mock-ic to mock-lb (`benchmarks/ambrosia.py`)\n"
        "## Exit codes\n"
        "## Exit codes\n"
        "## See [the notes](notes.md) too ##\n"
        "```sh\n# not a heading\n```\n"
        '<a id="kept-by-hand"></a>\n'
    )
    assert anchors(page) == {
        "wallaroo-proto",
        "proxy-watch-and-break-a-real-conversation",
        "ambrosia-mock-ic-to-mock-lb-benchmarksambrosiapy",
        "exit-codes",
        "exit-codes-1",
        "see-the-notes-too",
        "kept-by-hand",
    }


def test_a_link_to_a_heading_that_is_not_there_is_broken(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n## Its part\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Here\n[ok](other.md#its-part) [ok](#here) [bad](other.md#no-part) [bad](#nowhere) "
        "[file only](other.md)\n"
    )
    assert broken_links(page) == [
        "other.md#no-part: no such heading in other.md",
        "#nowhere: no such heading in page.md",
    ]
