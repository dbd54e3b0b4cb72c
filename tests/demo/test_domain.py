"""The demo's domain (aggbox/examples/orders): a placed order waits 30 minutes for the
customer's credit answer — its timer ``credit`` — on the harness's fake clock (the writer's
fold)."""

from __future__ import annotations

from datetime import timedelta

from aggbox.examples.orders.domain import Order, orders
from aggregates.testing import AggregateHarness, Step, message


def _harness() -> AggregateHarness[Order]:
    h = AggregateHarness(orders, aggregate_id="o-1")
    step = h.when(message("PlaceOrder", {"customer_id": "c-1", "amount": 50}, to=orders,
                          id="o-1", occurred_at=h.now, source=("Checkout", "o-1", 1)))
    assert step.outcome == "applied" and step.emitted_types == ["OrderCreated"]
    return h


def _answer(h: AggregateHarness[Order], mtype: str) -> Step:
    return h.when(message(mtype, {"order_id": "o-1", "customer_id": "c-1", "amount": 50},
                          to=orders, id="o-1", occurred_at=h.now,
                          source=("Customer", "c-1", 1)))


def test_placing_an_order_sets_its_credit_deadline() -> None:
    h = _harness()
    assert h.state.status == "pending"
    (timer,) = h.timers
    assert timer["timer"] == "credit" and timer["type"] == "CreditDeadline"
    assert timer["payload"] == {"order_id": "o-1"}
    assert timer["target"] == {"type": "Order", "id": "o-1"}
    assert timer["due"] == h.now + timedelta(minutes=30)
    # OrderCreated took seq 1; the timer counts apart (_tseq), leaving the emits gapless.
    assert (h.snapshot.seq, h.snapshot.timer_seq) == (1, 1)
    assert timer["source"]["seq"] == 1


def test_an_answer_in_time_cancels_the_deadline() -> None:
    for reply, status in (("CreditReserved", "approved"), ("CreditLimitExceeded", "rejected")):
        h = _harness()
        h.advance(timedelta(minutes=29))
        assert _answer(h, reply).outcome == "applied"
        assert h.state.status == status and h.timers == []
        assert h.advance(timedelta(hours=1)) == []


def test_no_answer_in_time_cancels_the_order_and_a_late_answer_does_not_revive_it() -> None:
    h = _harness()
    assert h.advance(timedelta(minutes=29, seconds=59)) == []
    (fired,) = h.advance(timedelta(seconds=1))
    assert fired.outcome == "applied" and h.state.status == "cancelled" and h.timers == []
    assert _answer(h, "CreditReserved").outcome == "applied"
    assert h.state.status == "cancelled"


def test_a_deadline_for_an_answered_order_changes_nothing() -> None:
    h = _harness()
    _answer(h, "CreditReserved")
    late = h.when(message("CreditDeadline", {"order_id": "o-1"}, to=orders, id="o-1",
                          occurred_at=h.now, source=("Elsewhere", "x", 1)))
    assert late.outcome == "applied" and h.state.status == "approved"
