"""Testing helpers for domain teams: run handlers in memory, no server needed, with the same
dedup, outbox and parking rules as the real writer (both use :func:`aggregates.fold.fold`).

    h = AggregateHarness(customers, aggregate_id="c-1")
    h.given(message("CustomerRegistered", {"credit_limit": 100}, to=customers, id="c-1"))
    step = h.when(message("OrderCreated", {"order_id": "o-1", "amount": 30}, ...))
    assert step.outcome == "applied"
    assert step.emitted_types == ["CreditReserved"]
    assert h.state.reserved == 30

Effects (docs/side-effects.md): ``h.effect_result(book, result={"tracking": "T-1"})`` delivers
the result of the pending ``BookShipment`` entry the way the dispatcher's effect runner does.

A flow across aggregates, with effects and faults: :class:`Scenario` (docs/testing.md), and
:func:`check_fault_tolerance` to run it under faults at every point (sweeps), then random ones.
"""

from __future__ import annotations

from aggregates.message.envelope import Source
from aggregates.testing._scenario_effects import Answer, EffectCallRecord
from aggregates.testing._scenario_faults import Fault, FaultSource, RandomFaults
from aggregates.testing._scenario_property import (
    FaultToleranceError,
    FaultToleranceReport,
    check_fault_tolerance,
)
from aggregates.testing._scenario_timeline import Exchange, Timeline
from aggregates.testing.harness import AggregateHarness, Step, memory_database, message
from aggregates.testing.scenario import FlowDoesNotSettle, Scenario, ScenarioError

__all__ = ["AggregateHarness", "Answer", "EffectCallRecord", "Exchange", "Fault", "FaultSource",
           "FaultToleranceError", "FaultToleranceReport",
           "FlowDoesNotSettle", "RandomFaults", "Scenario",
           "ScenarioError", "Source", "Step", "Timeline", "check_fault_tolerance",
           "memory_database", "message"]
