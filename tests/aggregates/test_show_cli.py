"""``aggbox show TYPE ID`` against the local MongoDB server, through ``aggbox.cli.main``:
text and ``--json``, with and without ``--aggregates``, and an unknown id."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest

from aggregates import AggboxSettings, AggregateType, Emit, Handled, Message, Registry, StoreWriter
from aggregates.domain.timers import Schedule
from aggregates.testing import message
from tests.aggregates.cli import Run, run_cli

pytestmark = pytest.mark.mongo

DOMAIN = "aggbox_show_test_domain"


@dataclass(frozen=True)
class Tab:
    total: int = 0


def make_registry() -> Registry:
    tabs = AggregateType("Tab", state=Tab, collection="tab_docs", on_handler_error="park")

    @tabs.handles("Charge")
    def charge(state: Tab, msg: Message) -> Handled[Tab]:
        if msg.payload.get("fail"):
            raise RuntimeError("card reader on fire")
        amount = int(msg.payload["amount"])
        return replace(state, total=state.total + amount), [
            Emit("Charged", {"n": amount}),
            Schedule(Emit("Remind", {}), key="remind", after=timedelta(days=1))]

    return Registry([tabs])


def charge(mid: str, amount: int, *, fail: bool = False) -> Message:
    return message("Charge", {"amount": amount, "fail": fail}, to="Tab", id="t1",
                   message_id=mid)


@pytest.fixture
def cli(db: Any, mongo_uri: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Run]:
    import aggbox.cli

    monkeypatch.setattr(aggbox.cli, "SUBCOMMAND_MODULES", ("aggbox.commands.show",))
    module = types.ModuleType(DOMAIN)
    module.registry = make_registry()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, DOMAIN, module)
    yield from run_cli(db, mongo_uri, monkeypatch, capsys)


@pytest.fixture
def stored(db: Any) -> None:
    """Tab t1: k1 applied (an outbox entry, a timer), k2 failed (dead letter, blocked),
    k3 parked behind it."""
    w = StoreWriter(db, make_registry(), settings=AggboxSettings(database=db.name),
                    sleep=lambda s: None)
    w.ensure_indexes()
    out = w.process([charge("k1", 5), charge("k2", 1, fail=True), charge("k3", 2)])
    assert [o.outcome for o in out] == ["applied", "dead_lettered", "parked"]


def test_show_text_with_aggregates(cli: Run, stored: None) -> None:
    rc, out, err = cli("show", "Tab", "t1", "--aggregates", DOMAIN)
    assert rc == 0, err
    assert out.startswith("aggregate Tab/t1\n")
    assert "collection" in out and "tab_docs" in out
    assert "state (Tab):" in out and "total" in out
    assert "inbox: 1 remembered" in out and "k1" in out
    assert "outbox: 1 pending" in out and "Charged" in out
    assert "timers: 1 pending" in out and "remind" in out and "Remind" in out
    assert "blocked" in out and "YES by message 'k2'" in out and "card reader on fire" in out
    assert "parked: 1 messages" in out and "k3" in out
    assert "dead letters: 1 (any status)" in out and "Tab/t1/k2" in out


def test_show_json_without_aggregates(cli: Run, stored: None) -> None:
    # The collection comes from the parked message; the state is shown as stored.
    rc, out, err = cli("show", "Tab", "t1", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["collection"] == "tab_docs" and doc["exists"] is True
    assert doc["state"] == {"total": 5} and doc["version"] >= 1
    assert [e["message_id"] for e in doc["inbox"]] == ["k1"]
    assert [e["type"] for e in doc["outbox"]] == ["Charged"]
    assert [t["timer"] for t in doc["timers"]] == ["remind"]
    assert doc["blocked"]["message_id"] == "k2"
    assert [p["message_id"] for p in doc["parked"]] == ["k3"]
    assert [d["id"] for d in doc["dead_letters"]] == ["Tab/t1/k2"]
    assert doc["dead_letters"][0]["status"] == "open"


def test_show_text_without_aggregates_default_collection(cli: Run, db: Any) -> None:
    db.tabs.insert_one({"_id": "t9", "_v": 3, "state": {"total": 1}})
    rc, out, err = cli("show", "Tab", "t9")
    assert rc == 0, err
    assert "collection" in out and " tabs" in out and "version (_v)" in out
    assert "state (dict):" in out and "dead letters: 0" in out


def test_show_unknown_id_names_some_that_exist(cli: Run, stored: None, db: Any) -> None:
    rc, out, err = cli("show", "Tab", "nope", "--aggregates", DOMAIN)
    assert rc == 3 and out == ""
    assert err.strip() == ("aggbox show: error: no Tab 'nope' in collection 'tab_docs' "
                           "(it has t1)")
    rc, out, err = cli("show", "Tab", "nope", "--collection", "empty_coll")
    assert rc == 3 and len(err.strip().splitlines()) == 1
    assert "collection 'empty_coll' holds no aggregates" in err


def test_show_unknown_type_with_aggregates(cli: Run, stored: None) -> None:
    rc, _, err = cli("show", "Tabb", "t1", "--aggregates", DOMAIN)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "Tab" in err
