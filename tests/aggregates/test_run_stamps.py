"""Counts that survive retries (docs/design.md "Counts that survive retries"): a writer with a
run stamp whose earlier attempt died after a partial write counts what that attempt applied
as ``applied`` once (reason ``earlier_attempt``, naming the attempt), a real duplicate
stays ``duplicate``, and another run's redelivery of the same batch is all ``duplicate`` —
on the in-memory database and on the local server, with the inbox (a window of 3, so ids
go through the inbox archive) and high-water dedup; a timer's message recorded as handled
without being applied is never claimed."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aggregates import HighWater, Inbox, Message, Registry, StoreWriter
from aggregates.core.reasons import Reason
from aggregates.core.settings import AggboxSettings
from aggregates.dedup import DedupStrategy
from aggregates.dedup.runs import RunStamp
from aggregates.message.outcomes import Outcome
from aggregates.testing import memory_database, message
from aggregates.wire.outbound import entry_message
from tests.aggregates.domain import make_counter, msg
from tests.aggregates.test_timers import order_type

T0 = datetime(2026, 1, 2, tzinfo=UTC)
tally = make_counter("Tally", window=3)
mono = make_counter("Mono", dedup=HighWater(mode="monotonic"))
registry = Registry([tally, mono])
# Small slices and chunks: an aggregate's messages take several writes and chunks.
SETTINGS = AggboxSettings(slice_messages=2, chunk_messages=3, chunk_aggregates=2,
                          pipeline_depth=1)


class Died(Exception):
    """The attempt's executor is lost."""


@pytest.fixture(params=["memory", "server"])
def store(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        return memory_database()
    return request.getfixturevalue("db")


def at(i: int) -> str:
    return (T0 + timedelta(seconds=i)).isoformat().replace("+00:00", "Z")


def batch() -> tuple[list[Message], list[Message], int]:
    """(messages an earlier run applied, this run's batch, how many of the batch are new)."""
    old = [msg(f"t{a}-old", 1, agg=f"t{a}", atype="Tally", at=at(0)) for a in range(3)]
    old += [msg(f"m{a}-old", 1, agg=f"m{a}", atype="Mono", at=at(0),
                source=("Feed", f"f{a}", 1)) for a in range(2)]
    new: list[Message] = []
    i = 1
    for a in range(3):
        for k in range(7):
            new.append(msg(f"t{a}-{k}", k + 1, agg=f"t{a}", atype="Tally", at=at(i)))
            i += 1
    for a in range(2):
        for k in range(2, 9):
            new.append(msg(f"m{a}-{k}", k, agg=f"m{a}", atype="Mono", at=at(i),
                           source=("Feed", f"f{a}", k)))
            i += 1
    ordered: list[Message] = []
    for j, m in enumerate(new):  # each aggregate's messages in order, one after the other
        ordered.append(m)
        if j % 4 == 1:
            ordered.append(m)  # an exact copy right after it (a real duplicate)
        if j % 6 == 3:
            ordered.append(old[j % len(old)])  # a redelivery of the earlier run's message
    # copies of the first messages of t0 and m0 at the very end: other chunks, other calls
    ordered += [new[0], new[1], new[21], new[22]]
    return old, ordered, len(new)


def writer(db: Any, run: RunStamp | None, fault: Any = None) -> StoreWriter:
    w = StoreWriter(db, registry, settings=SETTINGS, sleep=lambda _: None, clock=lambda: T0,
                    fault=fault, run=run)
    w.ensure_indexes()
    return w


def dies_after(writes: int) -> Any:
    seen = [0]

    def fault(point: str) -> None:
        if point == "after_write":
            seen[0] += 1
            if seen[0] == writes:
                raise Died(f"executor lost after {writes} writes")
    return fault


def kinds(outcomes: list[Outcome]) -> Counter[str]:
    return Counter(o.outcome for o in outcomes if not o.from_parked)


def state(db: Any) -> dict[tuple[str, str], Any]:
    return {(c, d["_id"]): d["state"] for c in ("tallys", "monos") for d in db[c].find()}


@pytest.mark.parametrize("writes", [1, 3, 6])
def test_a_retried_attempt_counts_the_lost_attempts_writes_as_applied_once(
        store: Any, writes: int) -> None:
    old, messages, fresh = batch()
    copies = len(messages) - fresh
    writer(store, RunStamp("r0", "a")).process(old)

    with pytest.raises(Died):  # attempt 1 of run r1: some writes, then the executor is lost
        writer(store, RunStamp("r1", "task 0.0"), dies_after(writes)).process(messages)
    assert any(d.get("_run") for c in ("tallys", "monos") for d in store[c].find())

    # attempt 2 of r1, its input in three calls (claims hold across chunks and calls)
    retry = writer(store, RunStamp("r1", "task 0.1"))
    third = len(messages) // 3
    out = [o for part in (messages[:third], messages[third:2 * third], messages[2 * third:])
           for o in retry.process(part)]
    assert kinds(out) == {"applied": fresh, "duplicate": copies}
    earlier = [o for o in out if o.reason == Reason.EARLIER_ATTEMPT]
    assert earlier and all(o.outcome == "applied" and "task 0.0" in (o.detail or "")
                           for o in earlier)
    # each new message applied exactly once in the run's surviving outcomes
    applied = Counter(o.message_id for o in out if o.outcome == "applied")
    assert set(applied) == {m.message_id for m in messages if "old" not in m.message_id}
    assert set(applied.values()) == {1}

    # the store is an undisturbed run's
    clean = memory_database()
    writer(clean, None).process(old)
    writer(clean, None).process(messages)
    assert state(store) == state(clean)

    # another run's redelivery of the batch: all duplicate
    again = writer(store, RunStamp("r2", "task 0.0")).process(messages)
    assert kinds(again) == {"duplicate": len(messages)}


def test_a_writer_without_a_stamp_clears_the_run_it_finds(store: Any) -> None:
    """A write of no run (or of another run) replaces the stamp, so a retried attempt never
    takes another writer's applies for its own."""
    _, messages, fresh = batch()
    with pytest.raises(Died):
        writer(store, RunStamp("r1", "task 0.0"), dies_after(3)).process(messages)
    # another writer (no run) applies the whole batch in between
    writer(store, None).process(messages)
    out = writer(store, RunStamp("r1", "task 0.1")).process(messages)
    assert kinds(out) == {"duplicate": len(messages)}
    # the undercount this leaves is documented; nothing is counted twice
    assert not [o for o in out if o.reason == Reason.EARLIER_ATTEMPT]
    assert fresh > 0


def test_without_a_stamp_the_document_layout_is_unchanged() -> None:
    db = memory_database()
    _, messages, _ = batch()
    writer(db, None).process(messages)
    for d in db.tallys.find():
        assert "_run" not in d and all(len(e) == 3 for e in d["inbox"])
    assert all("w" not in d for d in db.tallys_inbox_archive.find())


@pytest.mark.parametrize("dedup", [Inbox(), HighWater(mode="monotonic")],
                         ids=["inbox", "highwater"])
def test_a_timer_recorded_as_handled_is_not_claimed(store: Any, dedup: DedupStrategy) -> None:
    """A handler cancels a stored timer that may be firing: its message is recorded as
    handled without being applied ("Timers"). When it then arrives in the same run, it is a
    duplicate in every attempt — never counted applied for the attempt that recorded it."""
    orders = order_type(dedup)
    reg = Registry([orders])

    def w(run: RunStamp | None, fault: Any = None) -> StoreWriter:
        sw = StoreWriter(store, reg, settings=SETTINGS.model_copy(update={"slice_messages": 1}),
                         sleep=lambda _: None, clock=lambda: T0, fault=fault, run=run)
        sw.ensure_indexes()
        return sw

    def send(mtype: str, seq: int) -> Message:
        return message(mtype, {"ops": []} if mtype == "Op" else {}, to="Order", id="o-1",
                       message_id=f"{mtype}-{seq}", occurred_at=T0,
                       source=("Upstream", "u", seq))

    assert kinds(w(None).process([send("Place", 1)])) == {"applied": 1}
    (timer,) = store[orders.collection].find_one({"_id": "o-1"})["timers"]
    in_flight = entry_message(timer, document_id="o-1", source_type="Order")
    run = [send("CreditReserved", 2), in_flight, send("Op", 3)]
    with pytest.raises(Died):  # wrote CreditReserved (and the timer as handled), then lost
        w(RunStamp("r1", "task 0.0"), dies_after(1)).process(run)
    out = w(RunStamp("r1", "task 0.1")).process(run)
    assert [(o.outcome, o.reason) for o in out] == [
        ("applied", Reason.EARLIER_ATTEMPT), ("duplicate", None), ("applied", None)]
