"""The guard that holds entries of effects other live instances execute and this one lacks
(dispatcher/effects/guard.py): what it learns from the members, what it holds back, and
that a document's order survives it."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aggregates.core.reasons import Reason
from dispatcher.effects.guard import EffectGuard, FleetEffects
from dispatcher.publishers.builder import build_record
from dispatcher.publishers.record import OutboundRecord
from tests.dispatcher.helpers import ListPublisher

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
LIVE, DEAD = NOW + timedelta(seconds=5), NOW - timedelta(seconds=1)


def test_fleet_effects_counts_only_other_live_instances(caplog: Any) -> None:
    fleet = FleetEffects(["SendMail"])
    members = {"me": (LIVE, frozenset({"BookShipment"})),  # own record: ignored
               "gone": (DEAD, frozenset({"ChargeCard"})),  # expired: ignored
               "b": (LIVE, frozenset({"BookShipment", "SendMail"})),
               "c": (LIVE, frozenset({"SendMail"}))}
    with caplog.at_level(logging.INFO, logger="aggbox.dispatcher"):
        assert fleet.update("orders", members, me="me", now=NOW) == {"BookShipment"}
        assert fleet.update("orders", members, me="me", now=NOW) == {"BookShipment"}
        assert fleet.update("orders", {"b": (DEAD, frozenset({"BookShipment"}))}, me="me",
                            now=NOW) == frozenset()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # said once per change, naming who and what
    assert "b execute effect(s) BookShipment" in errors[0].getMessage()
    assert any("every live instance has" in r.getMessage() for r in caplog.records)
    assert fleet.missing == {"orders": frozenset()}


def _record(doc: str, i: int, etype: str, collection: str = "orders") -> OutboundRecord:
    entry = {"id": f"{doc}-{i}", "type": etype, "payload": {"i": i}, "headers": {},
             "created_at": NOW}
    return build_record(entry, collection=collection, document_id=doc, source_type="Order",
                        topic_template="{aggregate_type}")


def test_the_guard_holds_missing_effects_and_what_follows_them() -> None:
    fleet = FleetEffects([])
    fleet.missing = {"orders": frozenset({"BookShipment"})}
    inner = ListPublisher()
    guard = EffectGuard(inner, fleet)
    records = [_record("o1", 0, "Placed"), _record("o1", 1, "BookShipment"),
               _record("o1", 2, "Placed"), _record("o2", 0, "Placed"),
               _record("x1", 0, "BookShipment", collection="other")]
    results = asyncio.run(guard.publish(records))
    assert [r.status for r in results] == ["ok", "retryable", "retryable", "ok", "ok"]
    assert {r.reason for r in results[1:3]} == {Reason.EFFECT_NOT_CONFIGURED}
    assert "configure the same effects on every instance" in (results[1].error or "")
    # sent: what precedes the held entry, other documents, other collections
    assert [r.message_id for r in inner.records] == ["o1-0", "o2-0", "x1-0"]
    assert guard.name == inner.name


def test_the_guard_passes_everything_through_when_nothing_is_missing() -> None:
    inner = ListPublisher()
    guard = EffectGuard(inner, FleetEffects(["BookShipment"]))
    records = [_record("o1", 0, "BookShipment"), _record("o1", 1, "Placed")]
    assert [r.status for r in asyncio.run(guard.publish(records))] == ["ok", "ok"]
    assert len(inner.records) == 2


def test_a_publisher_answering_the_wrong_count_fails_the_batch() -> None:
    class Short(ListPublisher):
        async def publish(self, records: Any) -> list[Any]:
            return (await super().publish(records))[:-1]

    fleet = FleetEffects([])
    fleet.missing = {"orders": frozenset({"BookShipment"})}
    with pytest.raises(RuntimeError, match="returned 1 results for 2 records"):
        asyncio.run(EffectGuard(Short(), fleet).publish(
            [_record("o1", 0, "Placed"), _record("o2", 0, "Placed"),
             _record("o3", 0, "BookShipment")]))
