"""A timer's due time is stored rounded *up* to the millisecond (a BSON date holds
milliseconds): asked for an instant with sub-millisecond precision, it is never due, fired or
stamped (``occurred_at``) before that instant, and its id is the one of the stored due time
(docs/design.md "Timers")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pymongo.database import Database

from aggregates import (
    AggboxSettings,
    AggregateType,
    Emit,
    Handled,
    Message,
    Registry,
    Schedule,
    StoreWriter,
    timer_message_id,
)
from aggregates.domain.timers import stored_due
from aggregates.testing import AggregateHarness, message

NOW = datetime(2030, 5, 1, 12, 0, 0, 0, tzinfo=UTC)
AT = datetime(2030, 5, 1, 12, 0, 0, 123_456, tzinfo=UTC)  # .123456: between two ms
CEIL = datetime(2030, 5, 1, 12, 0, 0, 124_000, tzinfo=UTC)


@dataclass(frozen=True)
class Slot:
    started: tuple[str, ...] = ()


slots: AggregateType[Slot] = AggregateType("Slot", state=Slot, collection="slots")


@slots.handles("Book")
def book(state: Slot, msg: Message) -> Handled[Slot]:
    at = datetime.fromisoformat(msg.payload["at"]) if "at" in msg.payload else None
    after = timedelta(microseconds=msg.payload["us"]) if "us" in msg.payload else None
    return state, [Schedule(Emit("Start", {}), key="start", at=at, after=after)]


@slots.handles("Start")
def start(state: Slot, msg: Message) -> Slot:
    assert msg.occurred_at is not None
    return replace(state, started=(*state.started, msg.occurred_at.isoformat()))


def test_stored_due_rounds_up_to_the_millisecond() -> None:
    assert stored_due(AT) == CEIL
    assert stored_due(CEIL) == CEIL  # whole milliseconds stay
    assert stored_due(AT.replace(microsecond=123_001)) == CEIL
    assert stored_due(AT.replace(tzinfo=None)) == CEIL  # naive: UTC
    later = datetime(2030, 5, 1, 14, 0, 0, 123_456, tzinfo=UTC)  # same instant, +02:00
    assert stored_due(later.replace(tzinfo=timezone(timedelta(hours=2)))) == CEIL
    assert stored_due(datetime(1969, 12, 31, 23, 59, 59, 999_500, tzinfo=UTC)) == \
        datetime(1970, 1, 1, tzinfo=UTC)
    # The id of a due time is the id of its stored due time.
    assert timer_message_id("Slot", "s", "k", AT, "m") == \
        timer_message_id("Slot", "s", "k", CEIL, "m")
    assert timer_message_id("Slot", "s", "k", CEIL, "m") != \
        timer_message_id("Slot", "s", "k", CEIL - timedelta(milliseconds=1), "m")


@pytest.mark.parametrize(("payload", "asked"), [
    ({"at": AT.isoformat()}, AT),
    ({"us": 1500}, NOW + timedelta(microseconds=1500)),  # after= with a sub-ms part
])
def test_a_sub_millisecond_instant_never_fires_early(payload: dict[str, Any],
                                                     asked: datetime) -> None:
    h = AggregateHarness(slots, aggregate_id="s-1", now=NOW)
    book_msg = message("Book", payload, to=slots, id="s-1")
    assert h.when(book_msg).outcome == "applied"
    (timer,) = h.timers
    due = timer["due"]
    assert due >= asked and due - asked < timedelta(milliseconds=1)
    assert due.microsecond % 1000 == 0
    assert timer["created_at"] == due  # the fired message's occurred_at
    assert timer["id"] == timer_message_id("Slot", "s-1", "start", due, book_msg.message_id)
    # The whole millisecond the instant falls in has begun, the instant itself is reached:
    # not due yet (rounding down fired it up to 0.999 ms early).
    floor = asked.replace(microsecond=asked.microsecond // 1000 * 1000)
    assert h.advance(floor - h.now) == []
    assert h.advance(asked - h.now) == []
    assert h.state == Slot()
    (fired,) = h.advance(due - h.now)
    assert fired.outcome == "applied"
    started: tuple[str, ...] = h.state.started
    assert started == (due.isoformat(),)
    assert datetime.fromisoformat(started[0]) >= asked


@pytest.mark.mongo
def test_the_store_keeps_a_due_time_that_is_never_before_the_instant_asked_for(
        db: Database[Any], mongo_uri: str) -> None:
    """Through the writer and the real server (BSON dates: milliseconds): what is read back
    is the due time the fold computed, not a truncation of it."""
    writer = StoreWriter(db, Registry([slots]),
                         settings=AggboxSettings.load(mongodb_uri=mongo_uri, database=db.name))
    writer.ensure_indexes()
    msg = Message("book-1", "Book", "Slot", "s-1", {"at": AT.isoformat()})
    assert [o.outcome for o in writer.process([msg])] == ["applied"]
    doc = db.slots.find_one({"_id": "s-1"})
    assert doc is not None
    (timer,) = doc["timers"]
    due = timer["due"].replace(tzinfo=UTC)
    assert due == CEIL >= AT
    assert timer["created_at"].replace(tzinfo=UTC) == CEIL
    assert timer["id"] == timer_message_id("Slot", "s-1", "start", due, "book-1")
