"""Fails when the packages' modules import each other in a circle.

    python scripts/check-import-cycles.py [PACKAGE ...]   (default: master agent cli resolute)

Every import counts, wherever it is written: at the top, inside a function (a deferred
import hides a circle from Python's start-up, not from the design) and under
`if TYPE_CHECKING:`. `from package import name` counts as importing `package.name` when that
is a module, else `package`. A package's `__init__` is a module like any other. Prints each
circle (its modules, and one import of each edge with its line) and exits 1; exits 0 and
prints the module count when there is none. Reads the source only: nothing is imported.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PACKAGES = ("master", "agent", "cli", "resolute")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def collect_modules(packages: list[str], root: Path = ROOT) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "_pb2" in path.name:  # generated protobuf modules import only each other
                continue
            modules[module_name(path, root)] = path
    return modules


def imported_names(tree: ast.AST, importer: str, is_package: bool) -> list[tuple[str, int]]:
    """(module or module.attribute, line) for every import in the file."""
    names: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the importer's package
                base = importer.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names.append((target, node.lineno))
            names.extend((f"{target}.{alias.name}", node.lineno) for alias in node.names)
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {module it imports: the line of one such import}, within `modules`."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: dict[str, int] = {}
        for target, line in imported_names(tree, name, path.name == "__init__.py"):
            # `from a.b import c`: the module a.b.c if there is one, else a.b.
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively (no recursion limit): components of two or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            if pending:
                child = pending.pop()
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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
    return found


def main(argv: list[str], root: Path = ROOT) -> int:
    packages = argv or list(DEFAULT_PACKAGES)
    modules = collect_modules(packages, root)
    graph = import_graph(modules)
    circles = strongly_connected(graph)
    for circle in circles:
        members = set(circle)
        print(f"import circle of {len(circle)} modules: {', '.join(circle)}")
        for module in circle:
            for target, line in sorted(graph[module].items()):
                if target in members:
                    path = modules[module].relative_to(root)
                    print(f"  {path}:{line}: {module} imports {target}")
    if circles:
        print(f"{len(circles)} import circle(s) in {', '.join(packages)}", file=sys.stderr)
        return 1
    print(f"no import circle among {len(modules)} modules of {', '.join(packages)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
