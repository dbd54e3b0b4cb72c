"""A team runs ``aggbox`` from its own project folder (issue 44, items 2 and 6), through the
``aggbox`` command as a subprocess in a temporary folder that holds ``fleet.py``:

- every command that takes ``--aggregates MODULE`` imports ``fleet`` from the current folder,
  as ``aggbox run`` does. Before: ``dispatch``, ``dispatch-status``, ``show``, ``parked
  list``, ``deadletters replay``, ``indexes``, ``timers list`` … said "cannot import
  aggregates module 'fleet'" (the console script's ``sys.path`` starts at its ``bin/``).
- a folder of the team's named ``spark``, ``dispatcher`` or ``aggregates`` (a package: it has
  an ``__init__.py``) would hide aggbox's own package of that name from Python started
  there: the command says so in one line naming the folder and what to do, keeps using its
  own packages, and ``aggbox run`` (whose local Spark workers get the folder on their
  ``PYTHONPATH``) stops before Spark starts. Before: nothing said so, and ``import spark``
  resolved to the team's ``spark/__init__.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.teamcli import run_aggbox, team_env

pytestmark = pytest.mark.mongo


#: A two-type domain as a team writes it: an emit across types and a timer.
FLEET = '''
from dataclasses import dataclass, replace
from datetime import timedelta

from aggregates import AggregateType, Emit, Handled, Message, Schedule


@dataclass(frozen=True)
class Truck:
    km: int = 0


@dataclass(frozen=True)
class Depot:
    arrivals: int = 0


trucks = AggregateType("Truck", state=Truck, collection="fleet_trucks")
depots = AggregateType("Depot", state=Depot, collection="fleet_depots")


@trucks.handles("Drove")
def drove(state: Truck, msg: Message) -> Handled[Truck]:
    return replace(state, km=state.km + msg.payload["km"]), [
        Emit("Arrived", {"truck": msg.aggregate_id}, to=("Depot", msg.payload["depot"])),
        Schedule(Emit("Service", {}), key="service", after=timedelta(days=30))]


@depots.handles("Arrived")
def arrived(state: Depot, msg: Message) -> Depot:
    return replace(state, arrivals=state.arrivals + 1)
'''


def _env(tmp_path: Path, mongo_uri: str, db: Any) -> dict[str, str]:
    return team_env(tmp_path, AGGBOX_MONGODB_URI=mongo_uri, AGGBOX_DATABASE=db.name)


_aggbox = run_aggbox


@pytest.fixture
def team(tmp_path: Path) -> Path:
    folder = tmp_path / "team"
    folder.mkdir()
    (folder / "fleet.py").write_text(FLEET)
    return folder


def _seed(db: Any, team: Path) -> None:
    """A truck with a pending outbox entry and a timer, as the writer leaves them (fleet.py
    loaded from its file here, the store written directly: no Spark)."""
    import importlib.util

    from aggregates import AggboxSettings, Message, Registry, StoreWriter

    spec = importlib.util.spec_from_file_location("fleet_seed", team / "fleet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    writer = StoreWriter(db, Registry([module.trucks, module.depots]),
                         settings=AggboxSettings(database=db.name, pipeline_depth=1))
    outcomes = writer.process([Message("m-1", "Drove", "Truck", "t-1",
                                       {"km": 5, "depot": "d-1"})])
    assert [o.outcome for o in outcomes] == ["applied"], outcomes


#: Each command that takes --aggregates, run from the team's folder with ``--aggregates fleet``.
COMMANDS = [
    ("show", "Truck", "t-1"),
    ("parked", "list"),
    ("parked", "release", "--aggregate", "Truck/t-1"),
    ("deadletters", "replay", "--all"),
    ("indexes",),
    ("timers", "list"),
    ("migrate", "partitions", "--dry-run"),
    ("dispatch-status",),
    ("dispatch", "--once", "--publisher", "stdout"),
]


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_every_command_imports_the_aggregates_module_from_the_current_folder(
        argv: tuple[str, ...], team: Path, tmp_path: Path, mongo_uri: str, db: Any) -> None:
    _seed(db, team)
    done = _aggbox(team, _env(tmp_path, mongo_uri, db), *argv, "--aggregates", "fleet")
    assert "cannot import" not in done.stderr, done.stderr
    assert "No module named" not in done.stderr, done.stderr
    assert done.returncode in (0, 3), done  # 3: `migrate partitions` with pending documents
    if argv[0] == "show":
        assert "km" in done.stdout and "5" in done.stdout, done.stdout
    if argv[0] == "dispatch":
        assert '"Arrived"' in done.stdout, done.stdout  # fleet's emit, published


@pytest.mark.parametrize("name", ["spark", "dispatcher", "aggregates"])
def test_a_team_folder_named_like_an_aggbox_package_gets_one_line(
        name: str, team: Path, tmp_path: Path, mongo_uri: str, db: Any) -> None:
    _seed(db, team)
    own = team / name
    own.mkdir()
    (own / "__init__.py").write_text("raise ImportError('the team package was imported')\n")
    env = _env(tmp_path, mongo_uri, db)
    done = _aggbox(team, env, "show", "Truck", "t-1", "--aggregates", "fleet")
    assert done.returncode == 0, done  # aggbox kept its own packages
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("aggbox: warning: folder ./" + name + " "), lines
    assert str(own) in lines[0] and f"aggbox's package {name!r}" in lines[0], lines
    assert "rename" in lines[0], lines
    # `aggbox run` would start local Spark workers on the folder: they would import the
    # team's package; it stops before Spark with the same line as an error.
    (team / "in.jsonl").write_text('{"message_id": "m-9"}\n')
    done = _aggbox(team, {**env, "JAVA_HOME": str(tmp_path / "no-java")}, "run", "--input",
                   "in.jsonl", "--aggregates", "fleet", "--no-progress")
    assert done.returncode == 1, done
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"aggbox run: error: folder ./{name} "), \
        done.stderr


def test_no_line_in_aggboxs_own_checkout(tmp_path: Path, mongo_uri: str, db: Any) -> None:
    """aggbox run from its own checkout: its packages there are the installed ones."""
    checkout = Path(__file__).resolve().parents[1]
    done = _aggbox(checkout, _env(tmp_path, mongo_uri, db), "indexes", "--aggregates",
                   "aggbox.examples.orders")
    assert done.returncode == 0 and "warning" not in done.stderr, done
