"""The record of a fired timer (pure): its topic, key and fields name the aggregate that
scheduled it as the emitter — as for any outbox entry (docs/design.md "Timers",
docs/operations.md "Dispatcher") — never the timer's own source type ``aggbox.timer``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from aggregates.domain.timers import TIMER_SOURCE_TYPE
from aggregates.testing import AggregateHarness, message
from dispatcher.publishers.builder import build_record
from dispatcher.publishers.record import H_KIND, KIND_INPUT
from tests.dispatcher.timerdomain import orders

NOW = datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC)


def _timer(mtype: str, **payload: object) -> dict[str, object]:
    h = AggregateHarness(orders, aggregate_id="o/1", now=NOW)
    assert h.when(message(mtype, payload, to=orders, id="o/1")).outcome == "applied"
    (timer,) = h.timers
    assert timer["source"]["type"] == TIMER_SOURCE_TYPE
    return timer


@pytest.mark.parametrize(("template", "own", "remind"), [
    ("{aggregate_type}.events", "Order.events", "Order.events"),
    ("{target_type}.in", "Order.in", "Customer.in"),
    ("t-{type}", "t-Deadline", "t-Reminded"),
    ("{collection}-{aggregate_type}-{target_type}", "torders-Order-Order",
     "torders-Order-Customer"),
])
def test_a_fired_timer_is_published_as_the_scheduling_aggregates_entry(
        template: str, own: str, remind: str) -> None:
    """The default template sends an order's deadline to ``Order.events`` (the topic its
    pipeline reads); a timer addressed elsewhere (``to=``) has that target as
    ``{target_type}`` and still the scheduling aggregate as ``{aggregate_type}``."""
    for timer, topic, target in ((_timer("Place", ms=10), own, ("Order", "o/1")),
                                 (_timer("Remind", customer="c-9", ms=10), remind,
                                  ("Customer", "c-9"))):
        rec = build_record(timer, collection="torders", document_id="o/1",
                           source_type="Order", topic_template=template)
        assert rec.topic == topic
        assert rec.source_type == "Order" and rec.collection == "torders"
        assert rec.document_id == "o/1" and rec.key == "o/1"
        assert (rec.headers["aggregate_type"], rec.headers["aggregate_id"]) == target
        assert rec.headers[H_KIND] == KIND_INPUT
        # The message keeps the timer's own source (the receiver's dedup of re-fires).
        assert rec.headers["source_type"] == TIMER_SOURCE_TYPE
        assert rec.message.source is not None and rec.message.source.type == TIMER_SOURCE_TYPE


def test_a_timer_without_a_key_is_keyed_by_the_scheduling_aggregate() -> None:
    """A stored timer that lost its ``key`` (hand-edited) is partitioned by the aggregate's
    id — with its other records, not by the timer's source id."""
    timer = {k: v for k, v in _timer("Place", ms=10).items() if k != "key"}
    rec = build_record(timer, collection="torders", document_id="o/1", source_type="Order",
                       topic_template="{aggregate_type}.events")
    assert (rec.key, rec.topic) == ("o/1", "Order.events")
