"""Package boundaries (docs/design.md "Goals and guarantees"): ``aggregates`` imports
neither ``spark`` nor ``dispatcher``; ``dispatcher`` never imports ``spark``. Checked on the
source (static) and at run time in a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(package: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_aggregates_imports_neither_spark_nor_dispatcher() -> None:
    mods = imported_modules("aggregates")
    assert "spark" not in mods and "dispatcher" not in mods and "pyspark" not in mods
    assert "aggbox" not in mods  # the library stands alone


def test_dispatcher_does_not_import_spark() -> None:
    mods = imported_modules("dispatcher")
    assert "spark" not in mods and "pyspark" not in mods


def test_importing_aggregates_loads_no_other_component() -> None:
    code = ("import sys, aggregates, aggregates.testing, aggregates.writer; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('spark', 'dispatcher', 'pyspark', 'confluent_kafka')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
