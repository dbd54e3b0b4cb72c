"""Noise and small lies of the ``aggbox`` command (issue 44, item 7), through the command as a
subprocess in a team's folder:

- ``timers list`` prints its "Overdue … is a dispatcher running" hint only when a timer is
  overdue (before: always, even with none overdue);
- ``run --conf``'s help shows ``KEY=VALUE`` (before: the config file's TOML table);
- ``config --write`` and ``reasons --write`` write under the current folder or the folder
  given (before: into the installed package — site-packages in a wheel install);
- a type named ``Category`` without a collection is stored in ``categories`` (before:
  ``categorys``); while the former default still holds documents, ``aggbox run`` stops before
  Spark with one line saying how to keep them, and ``aggbox show`` finds them there.

- the Scenario timeline's columns stay aligned when a timer's sender names its key (before:
  ``Booking/b-1 ('payment') → Booking/b-1`` pushed that line's outcome out of its column).

(``run --no-progress`` without the pipeline's raw INFO dict: tests/spark/test_progress_cli.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import aggbox.configref
import aggbox.reasonref
from tests.teamcli import run_aggbox, team_env

SHOP = '''
from dataclasses import dataclass
from datetime import timedelta

from aggregates import AggregateType, Emit, Handled, Message, Schedule


@dataclass(frozen=True)
class Category:
    name: str = ""


categories = AggregateType("Category", state=Category)
boxes = AggregateType("Box", state=dict, collection="my_boxes")  # explicit: never changes


@categories.handles("Named")
def named(state: Category, msg: Message) -> Handled[Category]:
    return Category(msg.payload["name"]), [
        Schedule(Emit("Review", {}), key="review", after=timedelta(days=1))]
'''


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return team_env(tmp_path, COLUMNS="200", **extra)


_aggbox = run_aggbox


@pytest.fixture
def team(tmp_path: Path) -> Path:
    folder = tmp_path / "team"
    folder.mkdir()
    (folder / "shop.py").write_text(SHOP)
    return folder


def _write(db: Any, team: Path) -> Any:
    """``Named`` applied to category c-1 by the store writer (shop.py loaded from its file)."""
    import importlib.util

    from aggregates import AggboxSettings, Message, Registry, StoreWriter

    spec = importlib.util.spec_from_file_location("shop_seed", team / "shop.py")
    assert spec is not None and spec.loader is not None
    shop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shop)
    writer = StoreWriter(db, Registry([shop.categories, shop.boxes]),
                         settings=AggboxSettings(database=db.name, pipeline_depth=1))
    out = writer.process([Message("m-1", "Named", "Category", "c-1", {"name": "tea"})])
    assert [o.outcome for o in out] == ["applied"], out
    return shop


@pytest.mark.mongo
def test_timers_list_hints_at_the_dispatcher_only_when_a_timer_is_overdue(
        team: Path, tmp_path: Path, mongo_uri: str, db: Any) -> None:
    _write(db, team)
    env = _env(tmp_path, AGGBOX_MONGODB_URI=mongo_uri, AGGBOX_DATABASE=db.name)
    done = _aggbox(team, env, "timers", "list", "--aggregates", "shop")
    assert done.returncode == 0, done
    assert "review" in done.stdout and "Overdue" not in done.stdout, done.stdout
    past = datetime.now(UTC) - timedelta(hours=1)
    db.categories.update_one({"_id": "c-1"}, {"$set": {"timers.0.due": past}})
    done = _aggbox(team, env, "timers", "list", "--aggregates", "shop")
    assert done.returncode == 0, done
    assert "Overdue: due more than" in done.stdout and "is a dispatcher running" in done.stdout


def test_the_conf_help_shows_key_equals_value(tmp_path: Path) -> None:
    done = _aggbox(tmp_path, _env(tmp_path), "run", "--help")
    assert done.returncode == 0, done
    text = " ".join(done.stdout.split())
    assert "e.g. --conf spark.executor.memory=4g" in text, text
    assert 'e.g. {"spark.executor.memory"' not in text, text


@pytest.mark.parametrize(("command", "files"), [
    ("config", ["config/aggbox.toml", "docs/configuration.md"]),
    ("reasons", ["docs/reasons.md"]),
])
def test_write_goes_under_the_current_folder_or_the_one_given(
        command: str, files: list[str], tmp_path: Path) -> None:
    installed = [aggbox.configref.TOML_PATH, aggbox.configref.DOC_PATH,
                 aggbox.reasonref.DOC_PATH]
    before = {p: p.stat().st_mtime_ns for p in installed}
    work = tmp_path / "work"
    work.mkdir()
    done = _aggbox(work, _env(tmp_path), command, "--write")
    assert done.returncode == 0, done
    for name in files:
        assert (work / name).is_file(), done.stdout
        assert str(work / name) in done.stdout, done.stdout
    done = _aggbox(work, _env(tmp_path), command, "--write", str(tmp_path / "elsewhere"))
    assert done.returncode == 0, done
    assert all((tmp_path / "elsewhere" / name).is_file() for name in files), done.stdout
    assert {p: p.stat().st_mtime_ns for p in installed} == before  # the package untouched


def test_default_collections_are_proper_plurals() -> None:
    from aggregates import AggregateType

    names = {n: AggregateType(n, state=dict).collection
             for n in ("Order", "Category", "Day", "Box", "Address", "Batch", "Dish")}
    assert names == {"Order": "orders", "Category": "categories", "Day": "days",
                     "Box": "boxes", "Address": "addresses", "Batch": "batches",
                     "Dish": "dishes"}
    assert AggregateType("Category", state=dict, collection="categorys").collection == \
        "categorys"
    assert AggregateType("Category", state=dict, collection="categorys").former_collection \
        is None
    assert AggregateType("Category", state=dict).former_collection == "categorys"
    assert AggregateType("Order", state=dict).former_collection is None


@pytest.mark.mongo
def test_documents_in_the_former_default_collection_are_never_silently_left_behind(
        team: Path, tmp_path: Path, mongo_uri: str, db: Any) -> None:
    _write(db, team)
    assert db.categories.count_documents({}) == 1  # the new default
    db.categorys.insert_one(db.categories.find_one_and_delete({"_id": "c-1"}))  # as before
    env = _env(tmp_path, AGGBOX_MONGODB_URI=mongo_uri, AGGBOX_DATABASE=db.name)
    (team / "in.jsonl").write_text('{"message_id": "m-2"}\n')
    done = _aggbox(team, {**env, "JAVA_HOME": str(tmp_path / "no-java")}, "run", "--input",
                   "in.jsonl", "--aggregates", "shop", "--no-progress")
    assert done.returncode == 1, done
    assert done.stderr.splitlines() == [
        "aggbox run: error: aggregate type Category: its documents are in the collection "
        "'categorys', its default before aggbox 0.2; the default is now 'categories': give "
        "the type collection='categorys' to keep them (or rename the collection when no "
        "aggbox command runs)"], done.stderr
    assert db.categories.count_documents({}) == 0  # nothing was written to the new one
    done = _aggbox(team, env, "show", "Category", "c-1")  # without --aggregates: found
    assert done.returncode == 0, done
    assert "tea" in done.stdout, done.stdout


def test_the_scenario_timeline_keeps_its_columns_with_a_timer_key() -> None:
    from aggregates import AggregateType, Emit, Registry, Schedule
    from aggregates.testing import Scenario, message

    bookings = AggregateType("Booking", state=dict)

    @bookings.handles("Reserve")
    def reserve(state: dict[str, Any], msg: Any) -> Any:
        return state, [Schedule(Emit("PaymentDeadline", {}), key="payment-reminder-first",
                                after=timedelta(minutes=30))]

    @bookings.handles("PaymentDeadline")
    def expire(state: dict[str, Any], msg: Any) -> dict[str, Any]:
        return {"status": "released"}

    sc = Scenario(Registry([bookings]))
    sc.when(message("Reserve", {}, to=bookings, id="booking-2024-000123"))
    sc.advance(timedelta(minutes=31))
    lines = str(sc.timeline).splitlines()
    assert "('payment-reminder-first') → Booking/booking-2024-000123" in lines[2], lines
    column = lines[0].index("outcome")
    assert [line[column:].split()[0] for line in lines] == ["outcome", "applied", "applied"]
