"""The state graph a campaign saw, written as Graphviz dot (``--states FILE.dot``).

A node is what the peer last sent (the core's state as the peer's frames move it), an edge a
frame of ours and the reaction it got; the label counts how often.
"""

from __future__ import annotations

from collections import Counter


class StateGraph:
    def __init__(self) -> None:
        self.edges: Counter[tuple[str, str, str]] = Counter()

    def add(self, coverage: set[tuple[str, str, str]]) -> bool:
        """Count ``coverage``'s edges; True if any is new."""
        new = any(edge not in self.edges for edge in coverage)
        self.edges.update(coverage)
        return new

    def dot(self) -> str:
        lines = ["digraph states {", "  rankdir=LR;"]
        for (state, sent, reaction), count in sorted(self.edges.items()):
            label = f"{sent} ({count})".replace('"', "'")
            lines.append(f'  "{_q(state)}" -> "{_q(reaction)}" [label="{_q(label)}"];')
        lines.append("}")
        return "\n".join(lines) + "\n"

    def write(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as out:
            out.write(self.dot())


def _q(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
