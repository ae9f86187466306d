"""Two rules of the house's modules, checked over every product package (`PACKAGES`):

- No import cycles between modules. A cycle makes the order of a module's import
  matter and hides which of two modules is the lower one; every import counts, a
  lazy one inside a function and one under `TYPE_CHECKING` too (they are
  knowledge of the other module all the same). The walk is the one
  tests/test_import_rules.py judges the import directions with.
- No module over `LINES_MAX` lines: a module is one subject, and past that size it
  is nearly always two.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from test_import_rules import PACKAGES, ROOT, Import, project_imports

LINES_MAX = 700

#: modules allowed over LINES_MAX, and why; each must still be over it
OVERSIZED: dict[str, str] = {}


def import_cycles(imports: list[Import]) -> list[list[Import]]:
    """One cycle of imports for each group of modules that import each other
    (a strongly connected component of the import graph, by Tarjan's algorithm),
    each as the imports that close it, starting at its first module by name."""
    edges: dict[str, dict[str, Import]] = defaultdict(dict)
    for found in imports:
        if found.importer != found.imported:
            edges[found.importer].setdefault(found.imported, found)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(module: str) -> None:  # recursion is shallow: the import graph is
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in edges.get(module, {}):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return [_cycle_through(component, edges) for component in sorted(components)]


def _cycle_through(component: list[str], edges: dict[str, dict[str, Import]]) -> list[Import]:
    """A shortest way from the component's first module back to itself (breadth first)."""
    members = set(component)
    start = component[0]
    came_by: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for other, found in sorted(edges[module].items()):
                if other not in members or other in came_by:
                    continue
                came_by[other] = found
                if other == start:
                    path = [found]
                    while path[0].importer != start:
                        path.insert(0, came_by[path[0].importer])
                    return path
                following.append(other)
        frontier = following
    raise AssertionError(f"{component} is not a cycle")  # Tarjan's components are


def _described(cycle: list[Import]) -> str:
    return " -> ".join(f"{i.importer} (line {i.line})" for i in cycle) + f" -> {cycle[0].importer}"


def test_no_module_imports_itself_through_others() -> None:
    cycles = [_described(cycle) for cycle in import_cycles(project_imports())]
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def test_each_kind_of_import_closes_a_cycle(tmp_path: Path) -> None:
    """A lazy import and one under TYPE_CHECKING count; each cycle is named once."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    pora = tmp_path / "pora"
    (pora / "a.py").write_text("from pora import b\n")
    (pora / "b.py").write_text("def f():\n    import pora.c\n")
    (pora / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import thing\n"
    )
    (pora / "d.py").write_text("import pora.e\n")
    (pora / "e.py").write_text("from pora.d import x\n")
    (pora / "f.py").write_text("import pora.a\n")  # imports into a cycle: not in one
    described = [_described(cycle) for cycle in import_cycles(project_imports(tmp_path))]
    assert described == [
        "pora.a (line 1) -> pora.b (line 2) -> pora.c (line 3) -> pora.a",
        "pora.d (line 1) -> pora.e (line 1) -> pora.d",
    ]


def _product_modules(root: Path) -> dict[str, int]:
    """Lines of every module of the product packages, by path from the root."""
    return {
        path.relative_to(root).as_posix(): len(path.read_text().splitlines())
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
    }


def test_no_module_is_over_the_size_of_one_subject() -> None:
    sizes = _product_modules(ROOT)
    over = [
        f"{path}: {lines} lines"
        for path, lines in sizes.items()
        if lines > LINES_MAX and path not in OVERSIZED
    ]
    assert over == [], f"modules over {LINES_MAX} lines (split along their subjects): {over}"


def test_each_exception_to_the_size_rule_is_still_needed() -> None:
    sizes = _product_modules(ROOT)
    stale = [path for path in OVERSIZED if sizes.get(path, 0) <= LINES_MAX]
    assert stale == [], f"no longer over {LINES_MAX} lines: remove from OVERSIZED: {stale}"
