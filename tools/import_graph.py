"""The import graph of the `cadence` package: file circles, package circles, layer order.

Every import counts: module level, inside functions, and under ``TYPE_CHECKING``. A
``from pkg import name`` counts as an edge to ``pkg.name`` when that is a module, else to
``pkg`` itself. A *package* here is a directory under ``cadence/`` (``cadence.core``) or a
top-level module (``cadence.config``); ``cadence/__init__.py`` re-exports the public API
and is left out of the package graph (it sits above everything).

Run ``python tools/import_graph.py`` for the report the issues ask for.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "cadence"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    files = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def file_edges(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in the file)."""
    files = module_files(root)
    edges: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                origin = _resolve(name, is_package, node)
                for alias in node.names:
                    sub = f"{origin}.{alias.name}"
                    targets.append(sub if sub in files else origin)
            for target in targets:
                while target and target not in files:  # `import a.b.c` of a name inside
                    target = target.rpartition(".")[0]
                if target.startswith(PACKAGE) and target != name:
                    edges[name].add(target)
    return edges


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """package -> packages it imports; the root package (the public façade) is left out."""
    out: dict[str, set[str]] = defaultdict(set)
    for src, targets in edges.items():
        if src == PACKAGE:
            continue
        out[package_of(src)]
        for dst in targets:
            if dst != PACKAGE and package_of(dst) != package_of(src):
                out[package_of(src)].add(package_of(dst))
    return dict(out)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def layers(graph: dict[str, set[str]]) -> list[list[str]]:
    """Packages bottom to top: each layer imports only from the layers below it."""
    placed: dict[str, int] = {}
    remaining = set(graph)
    while remaining:
        ready = {p for p in remaining if all(d in placed for d in graph[p] if d != p)}
        if not ready:  # a circle: report what is left as one layer
            ready = remaining
        for package in ready:
            placed[package] = 1 + max(
                (placed[d] for d in graph[package] if d in placed), default=-1
            )
        remaining -= ready
    order: dict[int, list[str]] = defaultdict(list)
    for package, level in placed.items():
        order[level].append(package)
    return [sorted(order[level]) for level in sorted(order)]


def largest(root: Path = ROOT, top: int = 8) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The longest files and functions, by lines."""
    files, functions = [], []
    for name, path in module_files(root).items():
        text = path.read_text()
        files.append((len(text.splitlines()), str(path.relative_to(root))))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{name}.{node.name}"))
    return sorted(files, reverse=True)[:top], sorted(functions, reverse=True)[:top]


def main() -> int:
    edges = file_edges()
    packages = package_edges(edges)
    file_circles, package_circles = circles(edges), circles(packages)
    print(f"file circles: {file_circles or 'none'}")
    print(f"package circles: {package_circles or 'none'}")
    print("packages, bottom to top:")
    for level, members in enumerate(layers(packages)):
        print(f"  {level}: {', '.join(m.removeprefix('cadence.') for m in members)}")
    files, functions = largest()
    print("largest files:", ", ".join(f"{path} {n}" for n, path in files))
    print("largest functions:", ", ".join(f"{name} {n}" for n, name in functions))
    return 1 if file_circles or package_circles else 0


if __name__ == "__main__":
    sys.exit(main())
