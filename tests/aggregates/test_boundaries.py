"""Package layering (docs/design.md, "Layering"), checked on the source with ``ast``:

- ``aggregates`` (the library) imports none of the other first-party packages;
- ``spark`` (the pipeline) and ``dispatcher`` (the daemon) import ``aggregates`` only;
- ``aggbox`` (command line, demo, local servers, example domains) may import everything.

Every import counts: module level, inside functions, under ``if TYPE_CHECKING:``, relative
imports (they stay inside their package) and ``importlib.import_module("…")`` /
``__import__("…")`` with a literal name. The checker is tested on a synthetic package that
imports upwards, so a checker that sees nothing cannot pass silently.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.layering import FIRST_PARTY, import_cycles, imports, room_violations

ROOT = Path(__file__).resolve().parents[2]

#: package → first-party packages it may import (besides itself).
ALLOWED: dict[str, frozenset[str]] = {
    "aggregates": frozenset(),
    "spark": frozenset({"aggregates"}),
    "dispatcher": frozenset({"aggregates"}),
    "aggbox": frozenset(FIRST_PARTY),
}

#: third-party packages a package must not import (heavy optional extras).
FORBIDDEN_THIRD_PARTY: dict[str, frozenset[str]] = {
    "aggregates": frozenset({"pyspark", "confluent_kafka", "prometheus_client"}),
    "dispatcher": frozenset({"pyspark"}),
}

def layering_violations(root: Path, allowed: Mapping[str, frozenset[str]] = ALLOWED,
                        forbidden: Mapping[str, frozenset[str]] = FORBIDDEN_THIRD_PARTY,
                        ) -> list[str]:
    """``path:line: <package> imports <module>`` for every import that breaks the layering
    of the packages under ``root``."""
    problems: list[str] = []
    for package, may in allowed.items():
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for line, module in imports(tree):
                top = module.split(".")[0]
                bad_first_party = top in allowed and top != package and top not in may
                if bad_first_party or top in forbidden.get(package, frozenset()):
                    problems.append(f"{path.relative_to(root)}:{line}: {package} imports "
                                    f"{module}")
    return problems


def test_every_package_imports_only_downwards() -> None:
    assert layering_violations(ROOT) == []


def test_the_checker_fails_on_upwardimports(tmp_path: Path) -> None:
    spark = tmp_path / "spark"
    (spark / "sub").mkdir(parents=True)
    (spark / "__init__.py").write_text("import aggregates.core.settings\nfrom . import sub\n")
    (spark / "sub" / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import dispatcher.daemon\n"
        "def f():\n"
        "    from aggbox import x\n"
        "    return x\n"
        "def g():\n"
        "    import importlib\n"
        "    return importlib.import_module('aggbox.servers')\n")
    lib = tmp_path / "aggregates"
    lib.mkdir()
    (lib / "__init__.py").write_text("def h():\n    import spark.pipeline\n")
    assert layering_violations(tmp_path) == [
        "aggregates/__init__.py:2: aggregates imports spark.pipeline",
        "spark/sub/__init__.py:3: spark imports dispatcher.daemon",
        "spark/sub/__init__.py:5: spark imports aggbox",
        "spark/sub/__init__.py:9: spark imports aggbox.servers",
    ]


@pytest.mark.parametrize("package", ["spark", "dispatcher"])
def test_the_checker_sees_the_real_tree(package: str) -> None:
    """The real packages import ``aggregates`` (so the walk does reach their files)."""
    found = {m.split(".")[0] for p in (ROOT / package).rglob("*.py")
             for _, m in imports(ast.parse(p.read_text(encoding="utf-8")))}
    assert "aggregates" in found


def test_importing_the_libraries_loads_no_upper_layer() -> None:
    code = ("import sys, aggregates, aggregates.testing, aggregates.store.writer; "
            "lib = [m for m in sys.modules if m.split('.')[0] in "
            "('spark', 'dispatcher', 'aggbox', 'pyspark', 'confluent_kafka')]; "
            "import spark.pipeline, spark.session, dispatcher.daemon; "
            "up = [m for m in sys.modules if m.split('.')[0] == 'aggbox']; print(lib, up)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[] []"


# -- rooms inside aggregates/ ----------------------------------------------------------------
#: Each room of ``aggregates`` (docs/design.md "Layout of the library") may import the rooms
#: ranked below it and itself; ``aggregates/__init__.py`` (the public API) may import all.
ROOMS: dict[str, int] = {
    "core": 0, "codec": 1, "message": 1, "wire": 2, "dedup": 2, "domain": 3, "fold": 4,
    "store": 5, "debug": 6, "ops": 7, "testing": 8,
}

#: Calls that write to MongoDB (collection methods): none may appear under aggregates/debug.
WRITES = frozenset({"insert_one", "insert_many", "update_one", "update_many", "replace_one",
                    "delete_one", "delete_many", "bulk_write", "find_one_and_update",
                    "find_one_and_replace", "find_one_and_delete", "drop", "create_index",
                    "create_indexes", "drop_index", "rename"})


def test_rooms_import_only_downwards() -> None:
    assert room_violations(ROOT, "aggregates", ROOMS) == []


def test_no_import_cycle_inside_aggregates() -> None:
    assert import_cycles(ROOT) == []


def test_the_room_checks_fail_on_upward_imports_and_cycles(tmp_path: Path) -> None:
    lib = tmp_path / "aggregates"
    for room in ("core", "fold"):
        (lib / room).mkdir(parents=True)
        (lib / room / "__init__.py").write_text("")
    (lib / "__init__.py").write_text("from aggregates.fold import x\n")
    (lib / "core" / "a.py").write_text("def f():\n    from aggregates.fold.b import y\n")
    (lib / "fold" / "b.py").write_text("from aggregates.core import a\n")
    assert room_violations(tmp_path, "aggregates", ROOMS) == [
        "aggregates/core/a.py:2: room core imports aggregates.fold.b"]
    assert import_cycles(tmp_path) == [["aggregates.core.a", "aggregates.fold.b"]]


def test_nothing_under_debug_writes() -> None:
    """``aggregates.debug`` reads only; what writes (redrive, release) is ``aggregates.ops``."""
    found = []
    for path in sorted((ROOT / "aggregates" / "debug").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in WRITES):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.attr}")
    assert found == []
