"""Checkers of the source's layering (docs/design.md "Layering"), shared by the boundary tests
of ``aggregates`` (tests/aggregates/test_boundaries.py), ``dispatcher``
(tests/dispatcher/test_boundaries.py), ``spark`` (tests/spark/test_boundaries.py) and the
whole tree (tests/test_import_cycles.py). Read with ``ast``: nothing is imported.

Every import counts: module level, inside functions, under ``if TYPE_CHECKING:``, relative
imports and ``importlib.import_module("…")`` / ``__import__("…")`` with a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

FIRST_PARTY = ("aggregates", "spark", "dispatcher", "aggbox")

_DYNAMIC = {"import_module", "__import__"}


def imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``tree``; relative imports give ""."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, ("" if node.level else node.module or "")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if (name in _DYNAMIC and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                yield node.lineno, node.args[0].value


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_violations(root: Path, package: str, rooms: Mapping[str, int]) -> list[str]:
    """``path:line: room <a> imports <module>`` for every import up (or across) the room
    order of ``package``: a room (a sub-package, or a module of a flat package) may import
    itself and the rooms ranked below it. The package's own ``__init__`` (its public API) may
    import all; so may its top-level modules when the package has rooms (sub-packages) —
    they are the top floor (the dispatcher's daemon wiring)."""
    problems = []
    base = root / package
    flat = not any(p.is_dir() and (p / "__init__.py").exists() for p in base.iterdir())
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(base).parts
        if parts == ("__init__.py",):
            continue  # the package's own __init__: the public API
        if len(parts) < 2 and not flat:
            continue  # a top-level module of a package with rooms: the top floor
        room = parts[0].removesuffix(".py") if flat else parts[0]
        if room not in rooms:
            problems.append(f"{path.relative_to(root)}: room {room!r} has no rank")
            continue
        for line, module in imports(ast.parse(path.read_text(encoding="utf-8"))):
            bits = module.split(".")
            if bits[0] != package:
                continue
            target = bits[1] if len(bits) > 1 else ""
            if target != room and rooms.get(target, 99) >= rooms[room]:
                problems.append(f"{path.relative_to(root)}:{line}: room {room} imports "
                                f"{module}")
    return problems


def first_line_problems(root: Path, package: str) -> list[str]:
    """Rooms (sub-packages) of ``package`` whose ``__init__.py`` does not open with a
    docstring saying what the room is."""
    problems = []
    for init in sorted((root / package).glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        first = doc.splitlines()[0] if doc else ""
        if len(first.split()) < 4:
            problems.append(f"{init.relative_to(root)}: no first line saying what it is")
    return problems


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module → the modules of ``packages`` it imports (every import, relative ones resolved;
    ``from pkg import submodule`` names the submodule)."""
    modules = {module_name(p, root): p for package in packages
               for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    deps.add(sub if sub in modules else base)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.Call):
                deps.update(m for _, m in imports(node) if m)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def import_cycles(root: Path, packages: Iterable[str] = ("aggregates",)) -> list[list[str]]:
    """Cycles among the modules of ``packages``: the strongly connected components of more
    than one module (Tarjan)."""
    graph = import_graph(root, packages)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
