"""The rooms of ``dispatcher`` (docs/design.md "Layout of the dispatcher"), checked on the
source with ``ast`` like ``aggregates``' (tests/aggregates/test_boundaries.py): each room
imports only itself and the rooms on the floors below it, no module imports another in a
cycle, each room's ``__init__`` opens with a line saying what it is, and only the daemon's
wiring sits at the top level."""

from __future__ import annotations

from pathlib import Path

from tests.layering import first_line_problems, import_cycles, room_violations

ROOT = Path(__file__).resolve().parents[2]

#: Room → floor: a room may import the rooms on lower floors (and itself). The top-level
#: modules (:data:`TOP`) and ``dispatcher/__init__.py`` are the top floor: they may import all.
ROOMS: dict[str, int] = {
    "core": 0, "publishers": 1, "observe": 2,
    "leases": 3, "outbox": 3, "timers": 3, "effects": 3,
    "status": 4,
}

#: The daemon's wiring: the only modules directly under dispatcher/.
TOP = {"daemon", "worker", "wiring"}


def test_rooms_import_only_downwards() -> None:
    assert room_violations(ROOT, "dispatcher", ROOMS) == []


def test_every_room_is_ranked_and_only_the_wiring_is_on_top() -> None:
    base = ROOT / "dispatcher"
    rooms = {p.name for p in base.iterdir() if (p / "__init__.py").exists()}
    top = {p.stem for p in base.glob("*.py")} - {"__init__"}
    assert (rooms, top) == (set(ROOMS), TOP)


def test_each_room_says_what_it_is() -> None:
    assert first_line_problems(ROOT, "dispatcher") == []


def test_no_import_cycle_inside_dispatcher() -> None:
    assert import_cycles(ROOT, ["dispatcher"]) == []


def test_the_checks_fail_on_a_room_importing_up_or_across(tmp_path: Path) -> None:
    pkg = tmp_path / "dispatcher"
    for room in ("core", "leases", "outbox", "effects"):
        (pkg / room).mkdir(parents=True)
    (pkg / "core" / "__init__.py").write_text('"""Core: what every room may use."""\n')
    (pkg / "leases" / "__init__.py").write_text("")
    (pkg / "outbox" / "__init__.py").write_text(
        "from dispatcher.leases import x\nfrom dispatcher.core import a\n")
    (pkg / "effects" / "__init__.py").write_text('"""Effects."""\n')
    (pkg / "core" / "a.py").write_text("def f():\n    from dispatcher.outbox import y\n")
    (pkg / "daemon.py").write_text("import dispatcher.outbox\nimport dispatcher.core.a\n")
    assert room_violations(tmp_path, "dispatcher", ROOMS) == [
        "dispatcher/core/a.py:2: room core imports dispatcher.outbox",
        "dispatcher/outbox/__init__.py:1: room outbox imports dispatcher.leases",
    ]
    assert first_line_problems(tmp_path, "dispatcher") == [
        "dispatcher/effects/__init__.py: no first line saying what it is",
        "dispatcher/leases/__init__.py: no first line saying what it is",
        "dispatcher/outbox/__init__.py: no first line saying what it is",
    ]
    assert import_cycles(tmp_path, ["dispatcher"]) == [
        ["dispatcher.core.a", "dispatcher.outbox"]]
