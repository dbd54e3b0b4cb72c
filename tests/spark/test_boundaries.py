"""The floors of ``spark`` (docs/design.md "Layout of the pipeline"), checked on the source
with ``ast`` like ``aggregates``' rooms (tests/aggregates/test_boundaries.py). ``spark`` is
one room of flat modules, so each module is ranked: it imports only the modules on lower
floors, never one on its own floor or above, and no import cycle (the pipeline imports the
micro-batch, never the other way round)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.layering import import_cycles, room_violations

ROOT = Path(__file__).resolve().parents[2]

#: Module → floor: a module may import the modules on lower floors only.
FLOORS: dict[str, int] = {
    # what the rest stands on: settings, the input schema, results, the wire of messages,
    # the live counts of a run, which kind of session (classic or Connect)
    "settings": 0, "schema": 0, "results": 0, "messages": 0, "order": 0,
    "metrics_export": 0, "live": 0, "connect": 0,
    # sources of messages; shipping Python files to the executors; the raw column, natively
    "sources": 1, "pyfiles": 1, "rawtext": 1,
    # the session; validation; rows → records
    "session": 2, "validate": 2, "records": 2,
    # progress reports, the executors' side, streaming micro-batches
    "progress": 3, "executor": 3, "microbatch": 3,
    # the pipeline: everything above, put together
    "pipeline": 4,
}


def test_modules_import_only_downwards() -> None:
    assert room_violations(ROOT, "spark", FLOORS) == []


def test_no_import_cycle_inside_spark() -> None:
    assert import_cycles(ROOT, ["spark"]) == []


def test_the_package_says_what_it_is() -> None:
    doc = ast.get_docstring(ast.parse((ROOT / "spark" / "__init__.py").read_text())) or ""
    assert doc.startswith("aggbox's Spark pipeline:")


def test_the_floor_check_fails_on_a_module_importing_up(tmp_path: Path) -> None:
    pkg = tmp_path / "spark"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from spark.pipeline import Pipeline\n")
    (pkg / "microbatch.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from spark.pipeline import Pipeline\n")
    (pkg / "pipeline.py").write_text("from spark.microbatch import MicroBatch\n")
    (pkg / "stray.py").write_text("")
    assert room_violations(tmp_path, "spark", FLOORS) == [
        "spark/microbatch.py:3: room microbatch imports spark.pipeline",
        "spark/stray.py: room 'stray' has no rank",
    ]
    assert import_cycles(tmp_path, ["spark"]) == [["spark.microbatch", "spark.pipeline"]]
