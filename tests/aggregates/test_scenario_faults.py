"""check_fault_tolerance (issue 26): random faults (hypothesis) leave the example domain's
final states unchanged, and find a planted handler that reads a global counter or the wall
clock; a failing sweep is narrowed by bisection (issue 43)."""

from __future__ import annotations

from typing import Any

import pytest

from aggbox.examples.orders import customers, orders, registry
from aggregates import ConfigurationError
from aggregates.testing import (
    Fault,
    FaultToleranceError,
    RandomFaults,
    Scenario,
    check_fault_tolerance,
    message,
)
from aggregates.testing._scenario_plan import PlannedFault
from aggregates.testing._scenario_sweeps import narrow
from tests.aggregates import scenario_domain as sd


def credit_flow(sc: Scenario) -> None:
    """Two customers, three orders: approved, rejected, approved."""
    sc.given(message("CustomerRegistered", {"name": "Ada", "credit_limit": 100},
                     to=customers, id="c-1", message_id="reg-1"),
             message("CustomerRegistered", {"name": "Bo", "credit_limit": 20},
                     to=customers, id="c-2", message_id="reg-2"))
    for oid, cid, amount in (("o-1", "c-1", 30), ("o-2", "c-2", 50), ("o-3", "c-1", 70)):
        sc.when(message("PlaceOrder", {"customer_id": cid, "amount": amount}, to=orders,
                        id=oid, message_id=f"place-{oid}", source=("Checkout", oid, 1)))


def shipping_flow(sc: Scenario) -> None:
    for sid in ("s-1", "s-2"):
        sc.when(message("PlaceOrder", {"address": "1 Main St"}, to=sd.shipments, id=sid,
                        schema_version=2, message_id=f"ship-{sid}"))


def test_the_example_domain_is_safe_under_random_faults() -> None:
    check_fault_tolerance(credit_flow, registry, max_examples=40)


def test_the_effect_round_trip_is_safe_under_random_faults() -> None:
    check_fault_tolerance(shipping_flow, sd.shipping, effects=sd.effects, max_examples=30)


def test_a_handler_reading_a_global_counter_is_found() -> None:
    # The harness's determinism check (every handling run twice) sees it first ...
    with pytest.raises(FaultToleranceError, match="not deterministic"):
        check_fault_tolerance(credit_flow, sd.planted("counter"), max_examples=10)
    # ... and without it, comparing the runs' final states does.
    with pytest.raises(FaultToleranceError, match="final states differ") as err:
        check_fault_tolerance(credit_flow, sd.planted("counter"), max_examples=10,
                              check_determinism=False)
    assert "Customer/c-1" in str(err.value) and "reservation_no" in str(err.value)


def test_a_handler_reading_the_wall_clock_is_found() -> None:
    with pytest.raises(FaultToleranceError) as err:
        check_fault_tolerance(credit_flow, sd.planted("clock"), max_examples=20)
    assert "reserved_at" in str(err.value) or "not deterministic" in str(err.value)


def test_random_faults_draw_within_their_budget() -> None:
    draws: list[list[Any]] = []

    def choose(options: list[Any]) -> Any:
        draws.append(options)
        return options[-1]

    source = RandomFaults(choose, kinds=["duplicate", "effect_lost"], budget=3)
    sc = Scenario(sd.shipping, effects=sd.effects, faults=source)
    shipping_flow(sc)
    assert len(source.injected) == 3  # the budget
    assert {k for k, _ in source.injected} == {"duplicate", "effect_lost"}
    assert draws[0] == [None, "duplicate"]
    assert sc.states()[("Shipment", "s-1")].results == 1


def test_a_whole_step_replayed_publishes_its_entries_again() -> None:
    sc = Scenario(registry, faults=[Fault.replay("PlaceOrder")])
    credit_flow(sc)
    again = [e for e in sc.timeline if e.note == "replayed" or e.note == "published again"]
    assert [e.type for e in again] == ["PlaceOrder", "OrderCreated"]
    assert [e.outcome for e in sc.timeline.of("OrderCreated") if e.kind == "message"][:2] == [
        "applied", "duplicate"]


def test_misuse_says_what_to_do() -> None:
    with pytest.raises(ConfigurationError, match="drop with_store="):
        check_fault_tolerance(credit_flow, registry, with_store=object())
    with pytest.raises(ConfigurationError, match="unknown"):
        check_fault_tolerance(credit_flow, registry, faults=["meteor"])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="times must be"):
        Fault.duplicate(times=0)


def test_a_failing_sweep_is_narrowed_by_bisection() -> None:
    plan = [PlannedFault("deliver", "T", i, "duplicate") for i in range(1000)]
    calls: list[int] = []

    def fails_at(*bad: int) -> Any:
        def fails(p: Any) -> bool:
            calls.append(len(p))
            return all(any(f.index == b for f in p) for b in bad)
        return fails

    assert narrow(plan, fails_at(431)) == [plan[431]]
    assert len(calls) <= 2 * 10  # one or two runs per halving of 1,000 points
    calls.clear()
    # two faults that fail only together are both kept
    assert narrow(plan, fails_at(17, 940)) == [plan[17], plan[940]]
    assert len(calls) <= 4 * 10
    # several that fail alone: the earliest
    assert narrow(plan, lambda p: any(f.index in (300, 700) for f in p)) == [plan[300]]
