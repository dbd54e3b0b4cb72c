"""Timers in the domain API, on the harness's fake clock (pure: the same fold as the writer).

The oracle for the randomized test is a dictionary key → due time: a timer fires once,
at its latest due time, unless cancelled first."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregates import (
    TIMER_HEADER,
    AggregateType,
    Cancel,
    Emit,
    Handled,
    HighWater,
    Inbox,
    Message,
    Reason,
    Schedule,
    timer_message_id,
)
from aggregates.dedup import DedupStrategy
from aggregates.domain.timers import MAX_TIMERS, TIMER_SOURCE_TYPE
from aggregates.testing import AggregateHarness, message
from aggregates.wire.outbound import entry_message
from tests.hypo import examples


@dataclass(frozen=True)
class Order:
    status: str = "new"
    fired: tuple[str, ...] = ()


def order_type(dedup: DedupStrategy) -> AggregateType[Order]:
    orders: AggregateType[Order] = AggregateType("Order", state=Order, dedup=dedup)

    @orders.handles("Place")
    def place(state: Order, msg: Message) -> Handled[Order]:
        return replace(state, status="awaiting_credit"), [
            Schedule(Emit("CreditDeadline", {"n": 1}), key="credit",
                     after=timedelta(minutes=30))]

    @orders.handles("CreditReserved")
    def reserved(state: Order, msg: Message) -> Handled[Order]:
        return replace(state, status="confirmed"), [Cancel("credit")]

    @orders.handles("Postpone")
    def postpone(state: Order, msg: Message) -> Handled[Order]:
        return state, [Schedule(Emit("CreditDeadline", {"n": 2}), key="credit",
                                after=timedelta(minutes=msg.payload["minutes"]))]

    @orders.handles("CreditDeadline")
    def deadline(state: Order, msg: Message) -> Order:
        fired = (*state.fired, msg.headers[TIMER_HEADER])
        if state.status != "awaiting_credit":
            return replace(state, fired=fired)
        return replace(state, status="cancelled", fired=fired)

    @orders.handles("Op")
    def op(state: Order, msg: Message) -> Handled[Order]:
        """A test hook: the payload lists the timer operations to return."""
        ops: list[Any] = []
        for o in msg.payload["ops"]:
            if o[0] == "s":
                ops.append(Schedule(Emit("Tick", {"k": o[1]}), key=o[1],
                                    after=timedelta(seconds=o[2])))
            else:
                ops.append(Cancel(o[1]))
        return state, ops

    @orders.handles("Tick")
    def tick(state: Order, msg: Message) -> Order:
        return replace(state, fired=(*state.fired, msg.payload["k"]))

    @orders.handles("Bad")
    def bad(state: Order, msg: Message) -> Handled[Order]:
        kind = msg.payload["kind"]
        if kind == "naive":
            return state, [Schedule(Emit("Tick", {}), key="k", at=datetime(2030, 1, 1))]
        if kind == "both":
            return state, [Schedule(Emit("Tick", {}), key="k", at=datetime.now(UTC),
                                    after=timedelta(1))]
        if kind == "key":
            return state, [Cancel("")]
        if kind == "overflow":
            return state, [Schedule(Emit("Tick", {}), key="k", after=timedelta.max)]
        return state, [Schedule(Emit("Tick", {}), key=f"k{i}", after=timedelta(1))
                       for i in range(MAX_TIMERS + 1)]

    return orders


DEDUPS = [Inbox(), HighWater(mode="monotonic")]


def harness(dedup: DedupStrategy) -> AggregateHarness[Order]:
    return AggregateHarness(order_type(dedup), aggregate_id="o/1.$x")


def send(h: AggregateHarness[Order], mtype: str, payload: dict[str, Any] | None = None,
         seq: list[int] | None = None) -> Any:
    n = (seq or [0])[0]
    return h.when(message(mtype, payload, to="Order", id=h.snapshot.aggregate_id,
                          occurred_at=h.now, source=("Upstream", "u", n) if seq else None))


class _Seq:
    """Upstream source seqs, for the high-water strategy (every input needs a source)."""

    def __init__(self) -> None:
        self.n = 0

    def next(self) -> list[int]:
        self.n += 1
        return [self.n]


@pytest.mark.parametrize("dedup", DEDUPS, ids=["inbox", "highwater"])
def test_a_deadline_fires_once_when_due(dedup: DedupStrategy) -> None:
    h, s = harness(dedup), _Seq()
    step = send(h, "Place", {}, s.next())
    assert step.outcome == "applied" and step.emitted == []  # a timer is not an outbox entry
    (timer,) = h.timers
    assert timer["timer"] == "credit" and timer["due"] == h.now + timedelta(minutes=30)
    assert h.advance(timedelta(minutes=29, seconds=59)) == []
    (fired,) = h.advance(timedelta(seconds=1))
    assert fired.outcome == "applied" and h.state.status == "cancelled"
    assert h.state.fired == ("credit",) and h.timers == []
    assert h.advance(timedelta(days=1)) == []


@pytest.mark.parametrize("dedup", DEDUPS, ids=["inbox", "highwater"])
def test_a_cancelled_timer_never_fires(dedup: DedupStrategy) -> None:
    h, s = harness(dedup), _Seq()
    send(h, "Place", {}, s.next())
    h.advance(timedelta(minutes=10))
    assert send(h, "CreditReserved", {}, s.next()).outcome == "applied"
    assert h.timers == []
    assert h.advance(timedelta(hours=5)) == []
    assert h.state == Order(status="confirmed")


@pytest.mark.parametrize("dedup", DEDUPS, ids=["inbox", "highwater"])
def test_a_replaced_timer_fires_once_at_its_new_time(dedup: DedupStrategy) -> None:
    h, s = harness(dedup), _Seq()
    send(h, "Place", {}, s.next())
    send(h, "Postpone", {"minutes": 60}, s.next())
    (timer,) = h.timers
    assert timer["payload"] == {"n": 2}
    assert h.advance(timedelta(minutes=59)) == []
    (fired,) = h.advance(timedelta(minutes=1))
    assert fired.outcome == "applied" and h.state.fired == ("credit",)
    assert h.advance(timedelta(days=1)) == []


@pytest.mark.parametrize("dedup", DEDUPS, ids=["inbox", "highwater"])
def test_a_timer_fired_again_is_a_duplicate(dedup: DedupStrategy) -> None:
    """The dispatcher crashed after publishing, before removing: the same entry is
    published again with the same id."""
    h, s = harness(dedup), _Seq()
    send(h, "Place", {}, s.next())
    (timer,) = h.timers
    again = entry_message(timer, document_id="o/1.$x", source_type="Order")
    h.advance(timedelta(minutes=30))
    assert again.message_id == timer["id"]
    assert h.when(again).outcome == "duplicate"
    assert h.state.fired == ("credit",)


@pytest.mark.parametrize("dedup", DEDUPS, ids=["inbox", "highwater"])
def test_a_timer_cancelled_while_it_fires_is_never_handled(dedup: DedupStrategy) -> None:
    """The dispatcher read the due timer and published it; before it removed it, the
    aggregate cancelled it. The published message comes: recorded as handled at the
    cancel, it is a duplicate and the handler never sees it."""
    h, s = harness(dedup), _Seq()
    send(h, "Place", {}, s.next())
    h.now += timedelta(minutes=31)  # due, not yet fired
    (timer,) = h.timers
    in_flight = entry_message(timer, document_id="o/1.$x", source_type="Order")
    assert send(h, "CreditReserved", {}, s.next()).outcome == "applied"
    assert h.when(in_flight).outcome == "duplicate"
    assert h.state == Order(status="confirmed")


def test_the_timer_id_and_source_are_derived_from_aggregate_key_due_and_cause() -> None:
    h = harness(Inbox())
    send(h, "Place", {})
    (timer,) = h.timers
    cause = timer["causation_id"]
    due = timer["due"]
    assert timer["id"] == timer_message_id("Order", "o/1.$x", "credit", due, cause)
    assert timer["id"] != timer_message_id("Order", "o/1.$x", "credit",
                                           due + timedelta(milliseconds=1), cause)
    assert timer["id"] != timer_message_id("Order", "o/1", ".$xcredit", due, cause)
    fired = entry_message(timer, document_id="o/1.$x", source_type="Order")
    assert (fired.aggregate_type, fired.aggregate_id) == ("Order", "o/1.$x")
    assert fired.source is not None and fired.source.type == TIMER_SOURCE_TYPE
    assert fired.source.id == "Order/o%2F1.$x/credit"
    assert fired.causation_id == cause and fired.occurred_at == due
    assert fired.headers[TIMER_HEADER] == "credit"


def test_a_timer_to_another_aggregate_is_published_when_due() -> None:
    orders: AggregateType[Order] = AggregateType("Order", state=Order)

    @orders.handles("Place")
    def place(state: Order, msg: Message) -> Handled[Order]:
        return state, [Schedule(Emit("Remind", {}, to=("Customer", "c-1")), key="remind",
                                at=datetime(2026, 1, 2, tzinfo=UTC))]

    h = AggregateHarness(orders, aggregate_id="o-1")
    h.when(message("Place", {}, to="Order", id="o-1"))
    assert h.advance(timedelta(hours=23)) == [] and h.outbox == []
    assert h.advance(timedelta(hours=1)) == []
    (entry,) = h.outbox
    fired = entry_message(entry, document_id="o-1", source_type="Order")
    assert (fired.aggregate_type, fired.aggregate_id, fired.type) == ("Customer", "c-1",
                                                                      "Remind")


@pytest.mark.parametrize("kind", ["naive", "both", "key", "overflow", "many"])
def test_an_invalid_timer_dead_letters_the_message_naming_it(kind: str) -> None:
    h = harness(Inbox())
    step = send(h, "Bad", {"kind": kind})
    assert step.outcome == "dead_lettered" and step.reason == Reason.INVALID_TIMER
    assert step.detail and "\n" not in step.detail
    assert h.timers == []


OPS = st.lists(st.one_of(
    st.tuples(st.just("s"), st.sampled_from("abc"), st.integers(0, 100)),
    st.tuples(st.just("c"), st.sampled_from("abc")),
), max_size=4)


@settings(max_examples=examples(200), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(OPS, st.integers(0, 120)), max_size=8),
       st.sampled_from(["inbox", "highwater"]))
def test_timers_fire_as_the_key_to_due_time_model_says(
        script: list[tuple[list[tuple[Any, ...]], int]], dedup_name: str) -> None:
    h, s = harness(Inbox() if dedup_name == "inbox" else HighWater(mode="monotonic")), _Seq()
    model: dict[str, datetime] = {}
    for ops, wait in script:
        assert send(h, "Op", {"ops": [list(o) for o in ops]}, s.next()).outcome == "applied"
        for o in ops:
            if o[0] == "s":
                model[o[1]] = h.now + timedelta(seconds=o[2])
            else:
                model.pop(o[1], None)
        target = h.now + timedelta(seconds=wait)
        due = sorted((d, k) for k, d in model.items() if d <= target)
        for _, k in due:
            del model[k]
        before = len(h.state.fired)
        steps = h.advance(timedelta(seconds=wait))
        assert all(step.outcome == "applied" for step in steps)
        # Fired once each, and in due order (ties in any order).
        fired = list(h.state.fired[before:])
        assert sorted(fired) == sorted(k for _, k in due)
        dues = {k: d for d, k in due}
        assert [dues[k] for k in fired] == sorted(dues[k] for k in fired)
        assert sorted(t["timer"] for t in h.timers) == sorted(model)


@pytest.mark.parametrize("backend", ["memory", "store"])
def test_a_scenario_fires_timers_as_its_clock_advances(backend: str) -> None:
    from aggregates.testing import Scenario, memory_database
    from tests.dispatcher.timerdomain import orders
    from tests.dispatcher.timerdomain import registry as timer_registry

    sc = Scenario(timer_registry,
                  with_store=memory_database() if backend == "store" else None)

    def send_to(mtype: str, aid: str, n: int, **payload: Any) -> None:
        sc.when(message(mtype, payload, to="Order", id=aid, source=("Client", aid, n)))

    send_to("Place", "o-1", 1, ms=60_000)
    send_to("Place", "o-2", 1, ms=60_000)
    send_to("Confirm", "o-2", 2)
    send_to("Remind", "o-3", 1, customer="c/1", ms=30_000)
    sc.advance(timedelta(seconds=29))
    assert sc.state(orders, "o-1").status == "waiting" and sc.outside == []
    sc.advance(timedelta(seconds=1))
    (reminder,) = sc.outside
    assert (reminder.aggregate_type, reminder.aggregate_id, reminder.type) == (
        "Customer", "c/1", "Reminded")
    sc.advance(timedelta(seconds=30))
    assert sc.state(orders, "o-1") == replace(sc.state(orders, "o-1"), status="expired",
                                              deadlines=1)
    assert sc.state(orders, "o-2").status == "confirmed"
    assert sc.state(orders, "o-2").deadlines == 0
    sc.advance(timedelta(days=1))
    assert sc.state(orders, "o-1").deadlines == 1
    assert "timer fired" in str(sc.timeline)


def test_the_notebook_view_shows_an_aggregates_pending_timers() -> None:
    from aggregates import AggboxSettings, Source, StoreWriter
    from aggregates.debug import load_aggregate
    from aggregates.testing import memory_database
    from tests.dispatcher.timerdomain import registry as timer_registry

    db = memory_database()
    w = StoreWriter(db, timer_registry, settings=AggboxSettings(database=db.name))
    w.process([Message("p-1", "Place", "Order", "o-1", {"ms": 60_000},
                       source=Source("Client", "o-1", 1)),
               Message("r-1", "Remind", "Order", "o-1", {"ms": 1_000, "customer": "c-9"},
                       source=Source("Client", "o-1", 2))])
    view = load_aggregate(db, timer_registry, "Order", "o-1", settings=AggboxSettings())
    assert [t["timer"] for t in view.timers] == ["remind", "deadline"]  # earliest due first
    text = str(view)
    assert "timers: 2 pending" in text and "Customer/c-9" in text and "Deadline" in text


def test_timers_take_no_number_of_the_emits_seq() -> None:
    """A contiguous high-water receiver of the aggregate's emits must see no gap: timers
    count on their own (``_tseq``)."""
    orders: AggregateType[Order] = AggregateType("Order", state=Order)

    @orders.handles("Go")
    def go(state: Order, msg: Message) -> Handled[Order]:
        return state, [Emit("A", {}, to=("X", "x")),
                       Schedule(Emit("T", {}), key="k", after=timedelta(1)),
                       Emit("B", {}, to=("X", "x"))]

    h = AggregateHarness(orders, aggregate_id="o-1")
    h.when(message("Go", {}, to="Order", id="o-1"))
    h.when(message("Go", {}, to="Order", id="o-1"))
    assert [e["source"]["seq"] for e in h.outbox] == [1, 2, 3, 4]
    assert h.snapshot.seq == 4 and h.snapshot.timer_seq == 2
    (timer,) = h.timers
    assert timer["source"]["seq"] == 2
