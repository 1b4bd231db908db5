"""The import graph is one-way: no module imports, at any depth, a module that imports it back.

Circles are why a module needs a function-local import or a module ``__getattr__`` to load at
all, and why a reader cannot learn the layers bottom-up. The graph is read from the installed
package's source with ``ast``: every import statement anywhere in a module (module level, in a
function, under ``TYPE_CHECKING``) is an edge, relative imports resolved; ``from pkg import name``
where ``name`` is a submodule is an edge to that submodule, and importing a module is an edge to
each of its parent packages too (Python runs their ``__init__`` first).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from pathlib import Path

import wallaroo_proto_cli

import wallaroo_proto

PACKAGES = (wallaroo_proto, wallaroo_proto_cli)


def _modules(package) -> dict[str, Path]:
    """Every module of an installed package by dotted name (a package by its own name)."""
    root = Path(package.__file__).parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package.__name__, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _with_parents(name: str) -> list[str]:
    """``a.b.c`` and the packages Python imports first: ``a``, ``a.b``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def imports(name: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The known modules that module ``name`` imports, at any depth of its source.

    A target's parent packages count too, but not the importer's own: they began to load before
    it did, so an edge to one adds no order (a package's ``__init__`` that imports its own
    submodules would otherwise be a circle with each of them). A name taken from one of them
    (``from .. import ProtocolPlugin``) is an edge all the same.
    """
    own = set(_with_parents(name))
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, node.module] if node.module else here)
            else:
                base = node.module
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    parents = {parent for target in targets for parent in _with_parents(target)[:-1]} - own
    return {target for target in targets | parents if target in known and target != name}


def import_graph() -> dict[str, set[str]]:
    modules = {name: path for package in PACKAGES for name, path in _modules(package).items()}
    known = set(modules)
    return {
        name: imports(name, path.read_text(encoding="utf-8"), path.name == "__init__.py", known)
        for name, path in modules.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest path from the component's first module back to itself, inside the component."""
    start, inside = component[0], set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node] & inside):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start] if node != start else [start, start]
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"no cycle in {component}")


def test_the_reader_sees_every_kind_of_import():
    """Imports in functions and under TYPE_CHECKING count; relative ones resolve; a name that is a
    submodule is an edge to it; importing a module is an edge to its parents."""
    known = {"p", "p.a", "p.b", "p.c", "p.d", "p.sub", "p.sub.e", "p.sub.f", "q"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from . import a\n"
        "def f():\n    from .b import thing\n"
        "class K:\n    def m(self):\n        import p.sub.e\n"
        "from .sub import f as g\n"
        "from p import c\n"
        "import q\n"
    )
    assert imports("p.d", source, False, known) == {"p.a", "p.b", "p.c", "p.sub", "p.sub.e", "p.sub.f", "q"}
    assert imports("p.sub", "from .. import a\nfrom . import e, name\n", True, known) == {"p.a", "p.sub.e"}
    assert imports("p.sub.e", "from .. import name\nfrom . import f\n", False, known) == {"p", "p.sub.f"}


def test_records_is_a_leaf():
    """The vocabulary every layer shares imports none of them."""
    assert import_graph()["wallaroo_proto.records"] == set()


def test_the_graph_covers_both_packages():
    graph = import_graph()
    assert "wallaroo_proto.capture.dissector" in graph
    assert "wallaroo_proto_cli.main" in graph
    assert "wallaroo_proto.protocols" in graph["wallaroo_proto.capture.dissector"]


def test_no_module_imports_a_module_that_imports_it_back():
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(
        f"  {' -> '.join(a_cycle(graph, component))}  (all of: {', '.join(component)})" for component in found
    )


def drivers_private_state(package_root: Path) -> list[str]:
    """Where a plug-in (or the trackers' base) reads a private attribute of its driver."""
    found = []
    paths = [*sorted((package_root / "protocols").rglob("*.py")), package_root / "capture" / "tracker.py"]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
                continue
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if name in ("dissector", "driver") and not node.attr.startswith("__"):
                found.append(f"{path.relative_to(package_root)}:{node.lineno}: {name}.{node.attr}")
    return found


def test_trackers_use_only_the_drivers_public_interface():
    """``Dissector.out`` and ``Dissector.hold_back``, not ``_out`` and ``_holding``: the driver may
    change its insides without breaking a plug-in."""
    assert drivers_private_state(Path(wallaroo_proto.__file__).parent) == []


def test_the_package_root_loads_no_machinery() -> None:
    """Every module (a mock peer's core, a Spark executor's reader) loads the root first: it holds
    the shared vocabulary, never the capture driver nor a plug-in."""
    probe = (
        "import sys, wallaroo_proto\n"
        "print(' '.join(m for m in sys.modules if m.startswith(('wallaroo_proto.capture', "
        "'wallaroo_proto.protocols.', 'wallaroo_proto.spark'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["wallaroo_proto.protocols.schema"]


def protocol_leaks(graph: dict[str, set[str]]) -> list[str]:
    """Where a module outside ``protocols/<p>/`` and the CLI imports protocol ``<p>``'s modules:
    shared code reaches a protocol only through the registry (``wallaroo_proto.protocols``)."""
    root = "wallaroo_proto.protocols."
    packages = {
        name
        for name, path in _modules(wallaroo_proto).items()
        if name.startswith(root) and name.count(".") == 2 and path.name == "__init__.py"
    }

    def protocol(module: str) -> str | None:
        return next((p for p in packages if module == p or module.startswith(p + ".")), None)

    return [
        f"{name} -> {target}"
        for name, targets in sorted(graph.items())
        if not name.startswith("wallaroo_proto_cli.") and protocol(name) is None
        for target in sorted(targets)
        if protocol(target) is not None
    ]


def test_shared_code_reaches_a_protocol_only_through_the_registry():
    """A protocol's package is its own: the dissector, the proxy or Spark importing one names that
    protocol, and the others cannot offer the same through their plug-ins."""
    assert protocol_leaks(import_graph()) == []
