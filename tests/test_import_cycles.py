"""No import cycle anywhere in the four first-party packages (aggregates, spark, dispatcher,
aggbox), across packages too: every import counts, also inside functions and under
``if TYPE_CHECKING:`` (tests/layering.py). Within each package the room order is held by
the package's own boundary test (tests/aggregates/, tests/dispatcher/, tests/spark/)."""

from __future__ import annotations

from pathlib import Path

from tests.layering import FIRST_PARTY, import_cycles, import_graph

ROOT = Path(__file__).resolve().parents[1]


def test_no_import_cycle_in_the_four_packages() -> None:
    assert import_cycles(ROOT, FIRST_PARTY) == []


def test_the_graph_covers_the_four_packages() -> None:
    """The walk reaches every package, and sees imports across them (a graph that saw nothing
    would have no cycle either)."""
    graph = import_graph(ROOT, FIRST_PARTY)
    assert {m.split(".")[0] for m in graph} == set(FIRST_PARTY)
    assert "aggregates.store.writer" in graph["spark.executor"]
    assert "dispatcher.daemon" in graph["aggbox.commands.dispatch"]


def test_relative_imports_count(tmp_path: Path) -> None:
    pkg = tmp_path / "aggbox" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "aggbox" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .. import sub\n    from .c import x\n")
    (pkg / "c.py").write_text("import importlib\nimportlib.import_module('aggbox.sub.b')\n")
    assert import_cycles(tmp_path, ["aggbox"]) == [
        ["aggbox.sub", "aggbox.sub.b", "aggbox.sub.c"]]
