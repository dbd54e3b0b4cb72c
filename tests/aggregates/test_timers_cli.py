"""``aggbox timers list`` against the local MongoDB server, through ``aggbox.cli.main``: the
summary per aggregate type, overdue timers first, one JSON object with ``--json``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aggregates import AggboxSettings, Message, Source, StoreWriter
from tests.aggregates.cli import Run, run_cli
from tests.dispatcher.timerdomain import registry

pytestmark = pytest.mark.mongo

DOMAIN = "tests.dispatcher.timerdomain"


@pytest.fixture
def cli(db: Any, mongo_uri: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Run]:
    yield from run_cli(db, mongo_uri, monkeypatch, capsys)


def place(db: Any, ids: list[str], ms: int) -> None:
    w = StoreWriter(db, registry, settings=AggboxSettings(database=db.name))
    w.ensure_indexes()
    out = w.process([Message(f"place-{i}", "Place", "Order", i, {"ms": ms},
                             source=Source("Client", i, 1)) for i in ids])
    assert {o.outcome for o in out} == {"applied"}


def test_timers_list_counts_overdue_documents_and_lists_the_earliest_first(
        db: Any, cli: Run) -> None:
    place(db, ["late/1", "soon"], ms=3_600_000)
    place(db, ["later"], ms=7_200_000)
    # One timer long past due, as when no dispatcher runs for its partition.
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    db.torders.update_one({"_id": "late/1"}, {"$set": {"timers.0.due": hour_ago}})
    code, out, _err = cli("timers", "list", "--aggregates", DOMAIN, "--json")
    assert code == 0
    report = json.loads(out)
    order = next(t for t in report["types"] if t["aggregate_type"] == "Order")
    assert (order["documents_with_timers"], order["overdue_documents"]) == (3, 1)
    assert [r["aggregate_id"] for r in report["items"]] == ["late/1", "soon", "later"]
    first = report["items"][0]
    assert first["overdue"] is True and first["key"] == "deadline"
    assert first["target"] == "Order/late/1" and first["seconds_past_due"] >= 3599
    assert [r["overdue"] for r in report["items"][1:]] == [False, False]
    code, out, _err = cli("timers", "list", "--aggregates", DOMAIN, "--limit", "1")
    assert code == 0
    assert "Order/late/1" in out and "soon" not in out and "Pending timers" in out


def test_timers_list_without_aggregates_reads_the_types_from_the_store(
        db: Any, cli: Run) -> None:
    """Like ``parked list`` and ``deadletters list``, no ``--aggregates`` needed: the
    collections whose documents hold timers, named by the documents' ``_type``."""
    place(db, ["a", "b"], ms=3_600_000)
    code, out, _err = cli("timers", "list", "--json")
    assert code == 0, _err
    report = json.loads(out)
    assert [(t["aggregate_type"], t["collection"], t["documents_with_timers"])
            for t in report["types"]] == [("Order", "torders", 2)]
    assert [r["aggregate_id"] for r in report["items"]] == ["a", "b"]
    code, out, _err = cli("timers", "list", "--type", "Order")
    assert code == 0 and "Order/a" in out
