"""Scenarios (aggregates.testing.Scenario, issue 26): the example domain's flows and an
effect round trip, each in a few lines — in memory, and through the real StoreWriter on the
in-memory database and on the suite's local MongoDB server (``with_store=``), with the same
assertions."""

from __future__ import annotations

from typing import Any

import pytest

from aggbox.examples.orders import customers, orders, registry
from aggregates import ConfigurationError
from aggregates.testing import (
    Answer,
    Fault,
    FlowDoesNotSettle,
    Scenario,
    ScenarioError,
    memory_database,
    message,
)
from tests.aggregates import scenario_domain as sd
from tests.aggregates.scenario_domain import effects, shipments, shipping


@pytest.fixture(params=["memory", "mongomock", pytest.param("server", marks=pytest.mark.mongo)])
def store(request: pytest.FixtureRequest) -> Any:
    """``with_store=``: nothing (in memory), the in-memory database, the local server's."""
    if request.param == "memory":
        return None
    if request.param == "mongomock":
        return memory_database()
    return request.getfixturevalue("db")


def register(cid: str, limit: int) -> Any:
    return message("CustomerRegistered", {"name": cid, "credit_limit": limit}, to=customers,
                   id=cid, message_id=f"reg-{cid}")


def place(oid: str, cid: str, amount: int) -> Any:
    return message("PlaceOrder", {"customer_id": cid, "amount": amount}, to=orders, id=oid,
                   message_id=f"place-{oid}", source=("Checkout", oid, 1))


def ship(sid: str, address: str) -> Any:
    """A current (version 2) PlaceOrder of the shipping domain."""
    return message("PlaceOrder", {"address": address}, to=shipments, id=sid, schema_version=2)


def test_an_order_reserves_credit_on_its_customer(store: Any) -> None:
    sc = Scenario(registry, with_store=store).given(register("c-1", 100))
    sc.when(place("o-1", "c-1", 30))
    assert sc.state(orders, "o-1").status == "approved"
    assert sc.state(customers, "c-1").reserved == 30
    assert sc.timeline.types() == ["CustomerRegistered", "PlaceOrder", "OrderCreated",
                                   "CreditReserved"]
    assert [(e.sender, e.receiver) for e in sc.timeline[1:]] == [
        (None, "Order/o-1"), ("Order/o-1", "Customer/c-1"), ("Customer/c-1", "Order/o-1")]

    t = sc.when(place("o-2", "c-1", 80))  # over the limit
    assert t.types() == ["PlaceOrder", "OrderCreated", "CreditLimitExceeded"]
    assert sc.state(orders, "o-2").status == "rejected"
    assert sc.state(customers, "c-1").reserved == 30
    assert "CreditLimitExceeded" in str(sc.timeline)


def test_outcomes_carry_their_reasons(store: Any) -> None:
    sc = Scenario(registry, with_store=store).given(register("c-1", 100))
    sc.when(place("o-1", "c-1", -5))  # the handler raises: dead-lettered
    o = sc.outcome("place-o-1")
    assert (o.outcome, o.reason) == ("dead_lettered", "handler_error")
    assert "order amount must be positive" in (o.detail or "")
    sc.when(message("Nope", {}, to="Nowhere", id="x", message_id="m-x"))
    assert sc.outcome("m-x").reason == "unknown_aggregate_type"
    with pytest.raises(ScenarioError, match="set-up messages must apply"):
        sc.given(message("CustomerRegistered", {"credit_limit": 1}, to=customers, id="c-2"))


def test_an_effect_round_trip(store: Any) -> None:
    sc = Scenario(shipping, effects=effects, with_store=store)
    sc.when(ship("s-1", "1 Main St"))
    assert sc.state(shipments, "s-1").tracking == "T-s-1"
    assert sc.timeline.types("effect", "reply", "event") == [
        "BookShipment", "ShipmentBooked", "Placed"]
    [call] = sc.effect_calls
    assert (call.type, call.answer, call.call.attempt) == ("BookShipment", "ok", 1)
    assert call.call.idempotency_key == sc.outcome("effect-result:" + call.call.idempotency_key
                                                   ).message_id.removeprefix("effect-result:")
    assert [e.type for e in sc.events] == ["Placed"]
    assert sc.events[0].headers["aggbox-kind"] == "event"
    assert sc.pending(shipments, "s-1") == []


def test_upcasting_and_a_permanent_effect_failure(store: Any) -> None:
    sc = Scenario(shipping, effects=effects, with_store=store)
    sc.when(message("PlaceOrder", {"addr": ""}, schema_version=1, to=shipments, id="s-2"))
    s = sc.state(shipments, "s-2")
    assert (s.status, s.failure, s.results) == ("needs_attention", "address_rejected", 1)
    assert [c.answer for c in sc.effect_calls] == ["permanent"]


def test_fakes_answer_per_call(store: Any) -> None:
    sc = Scenario(shipping, effects=effects, with_store=store)
    sc.fake_effect("BookShipment", Answer.timeout(), Answer.retryable("503"),
                   Answer.ok({"tracking": "FAKE"}))
    sc.when(ship("s-3", "x"))
    assert sc.state(shipments, "s-3").tracking == "FAKE"
    assert [(c.answer, c.call.attempt) for c in sc.effect_calls] == [
        ("timeout", 1), ("retryable", 2), ("ok", 3)]

    sc.fake_effect("BookShipment", Answer.timeout())  # every call: exhausted after 3
    sc.when(ship("s-4", "x"))
    s = sc.state(shipments, "s-4")
    assert (s.status, s.failure) == ("needs_attention", "effect_attempts_exhausted")
    reply = sc.timeline.of("ShipmentFailed")[0]
    assert reply.outcome == "applied"
    last = sc.timeline.of("BookShipment")[-1]
    assert (last.reason, last.detail) == ("effect_attempts_exhausted",
                                          "3 attempts; last: call did not finish within 10s")


def test_a_fake_needs_its_reply_types_when_no_effect_is_registered() -> None:
    sc = Scenario(shipping)
    with pytest.raises(ConfigurationError, match=r"say which messages carry its results"):
        sc.fake_effect("BookShipment", Answer.ok())
    sc.fake_effect("BookShipment", Answer.ok({"tracking": "T"}), on_success="ShipmentBooked",
                   on_failure="ShipmentFailed")
    sc.when(ship("s-1", "x"))
    assert sc.state(shipments, "s-1").tracking == "T"


def test_faults_change_nothing_for_safe_handlers(store: Any) -> None:
    def run(*faults: Fault) -> Scenario:
        sc = Scenario(registry, with_store=memory_database() if store is not None else None,
                      faults=faults)
        sc.given(register("c-1", 100), register("c-2", 10))
        sc.when(place("o-1", "c-1", 30), place("o-2", "c-2", 30))
        return sc

    calm = run()
    for fault in (Fault.duplicate(), Fault.redeliver("OrderCreated"), Fault.reorder("PlaceOrder"),
                  Fault.lost_write("CreditReserved"), Fault.replay("OrderCreated", times=2)):
        sc = run(fault)
        assert sc.states() == calm.states(), f"{fault}\n{sc.timeline}"
        assert any(e.kind == "fault" and e.outcome == fault.kind for e in sc.timeline), fault
    dup = run(Fault.duplicate("OrderCreated"))
    assert [(e.receiver, e.outcome) for e in dup.timeline.of("OrderCreated")
            if e.kind == "message"] == [("Customer/c-1", "applied"),
                                        ("Customer/c-1", "duplicate"),
                                        ("Customer/c-2", "applied")]
    moved = run(Fault.reorder("PlaceOrder"))
    assert moved.timeline.types()[2:4] == ["PlaceOrder", "PlaceOrder"]
    assert [e.receiver for e in moved.timeline if e.kind == "input"][2:] == ["Order/o-2",
                                                                             "Order/o-1"]


def test_a_late_copy_comes_after_the_rest_of_the_flow(store: Any) -> None:
    sc = Scenario(registry, with_store=store, faults=[Fault.late("OrderCreated")])
    sc.given(register("c-1", 100))
    sc.when(place("o-1", "c-1", 30), place("o-2", "c-1", 30))
    assert [e.note for e in sc.timeline.of("OrderCreated") if e.kind == "message"] == ["", ""]
    late = sc.deliver_late()
    assert [(e.type, e.receiver, e.outcome, e.note) for e in late] == [
        ("OrderCreated", "Customer/c-1", "duplicate", "redelivered late")]
    assert sc.state(customers, "c-1").reserved == 60
    assert list(sc.deliver_late()) == []


def test_a_swap_changes_places_with_the_next_message_from_another_sender(store: Any) -> None:
    sc = Scenario(registry, with_store=store, faults=[Fault.swap("OrderCreated")])
    sc.given(register("c-1", 100))
    sc.when(place("o-1", "c-1", 70), place("o-2", "c-1", 70))
    got = [(e.sender, e.outcome) for e in sc.timeline.of("OrderCreated")]
    assert got == [("Order/o-1", "swap"), ("Order/o-2", "applied"), ("Order/o-1", "applied")]
    # the second sender's order came first: o-2 has the credit, o-1 does not
    assert sc.state(orders, "o-2").status == "approved"
    assert sc.state(orders, "o-1").status == "rejected"


def test_redeliver_an_earlier_message(store: Any) -> None:
    sc = Scenario(registry, with_store=store).given(register("c-1", 100))
    sc.when(place("o-1", "c-1", 30))
    created = sc.timeline.of("OrderCreated")[0].message_id
    again = sc.redeliver(created)
    assert [(e.type, e.outcome, e.note) for e in again] == [
        ("OrderCreated", "duplicate", "redelivered")]
    assert sc.state(customers, "c-1").reserved == 30
    with pytest.raises(ScenarioError, match="no such message"):
        sc.redeliver("never")


def test_effect_faults_fail_then_succeed(store: Any) -> None:
    sc = Scenario(shipping, effects=effects, with_store=store,
                  faults=[Fault.effect_fails("BookShipment"), Fault.effect_lost("BookShipment")])
    sc.when(ship("s-9", "x"))
    assert [c.answer for c in sc.effect_calls] == ["lost", "ok"]  # the failed one never called
    assert sc.state(shipments, "s-9").results == 1
    assert sc.timeline.of("BookShipment")[-1].note == "attempt 3"


def test_a_loop_between_aggregates_is_reported() -> None:
    sc = Scenario(sd.loop, max_steps=50)
    with pytest.raises(FlowDoesNotSettle, match="loop between aggregates") as err:
        sc.when(message("Start", {}, to=sd.pingers, id="a"))
    text = str(err.value)
    assert "Pinger/a → [Ping] Ponger/b → [Pong] Pinger/a" in text or \
        "Ponger/b → [Pong] Pinger/a → [Ping] Ponger/b" in text
    assert {e.type for e in err.value.cycle or []} == {"Ping", "Pong"}


def test_a_gap_parks_until_it_closes(store: Any) -> None:
    sc = Scenario(sd.gaps, with_store=store)
    second = message("Add", {"digit": 2}, to=sd.ledgers, id="l", source=("Up", "u", 2))
    first = message("Add", {"digit": 1}, to=sd.ledgers, id="l", source=("Up", "u", 1))
    sc.when(second)
    assert (sc.outcome(second.message_id).outcome,
            sc.outcome(second.message_id).reason) == ("parked", "sequence_gap")
    t = sc.when(first)
    assert [(e.outcome, e.note) for e in t] == [("applied", ""),
                                                 ("applied", "released from parking")]
    assert sc.state(sd.ledgers, "l").n == 12


def test_listeners_get_events_and_may_answer(store: Any) -> None:
    sc = Scenario(shipping, with_store=store)
    sc.fake_effect("BookShipment", Answer.ok({"tracking": "T"}), on_success="ShipmentBooked",
                   on_failure="ShipmentFailed")
    seen: list[str] = []

    def notify(event: Any) -> list[Any]:
        seen.append(event.aggregate_id)
        return [ship("s-followup", "y")]

    sc.on_event("Placed", notify)
    sc.when(ship("s-1", "x"))
    assert seen == ["s-1", "s-followup"]
    assert sc.state(shipments, "s-followup").status == "shipping"


def test_one_aggregates_messages_of_one_batch_are_handled_in_the_pipelines_order() -> None:
    # Order (high-water, monotonic) receives seq 2 before seq 1 in one when(): handled as
    # the pipeline would handle one batch — by seq — so neither is lost as a duplicate.
    sc = Scenario(registry)
    late = message("CreditReserved", {"order_id": "o-1", "customer_id": "c", "amount": 1},
                   to=orders, id="o-1", source=("Customer", "c", 2), message_id="r2")
    early = message("PlaceOrder", {"customer_id": "c", "amount": 1}, to=orders, id="o-1",
                    source=("Customer", "c", 1), message_id="p1")
    sc.when(late, early)
    assert [(o.message_id, o.outcome) for o in sc.outcomes[:2]] == [("p1", "applied"),
                                                                   ("r2", "applied")]


def test_a_listener_stands_in_for_another_services_aggregate(store: Any) -> None:
    from aggregates import Registry

    sc = Scenario(Registry([orders]), with_store=store)  # customers live elsewhere

    def credit_service(created: Any) -> list[Any]:
        return [message("CreditReserved", {"order_id": created.payload["order_id"],
                                           "customer_id": created.aggregate_id, "amount": 1},
                        to=orders, id=created.payload["order_id"],
                        source=("Customer", created.aggregate_id, 1))]

    sc.when(place("o-1", "c-1", 30))
    assert [(m.type, m.aggregate_type) for m in sc.outside] == [("OrderCreated", "Customer")]
    assert sc.state(orders, "o-1").status == "pending"
    sc.on_event("OrderCreated", credit_service)
    sc.when(place("o-2", "c-1", 30))
    assert sc.state(orders, "o-2").status == "approved"
    assert sc.events == []
