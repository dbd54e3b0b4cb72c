"""NaN is the same NaN (issue 40 item 4): the testing tools' determinism and round-trip
checks and the debugging diffs compare values as stored (aggregates/core/samevalue.py) —
a state holding NaN (which docs/reasons.md allows: it is BSON) is deterministic, while
``-0.0`` and ``0.0`` (stored differently) still differ. And the hot path of typed emits
leaves no value to be lost: an int outside 64 bits or a lone surrogate in a scalar field
is refused naming the field."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from aggregates import (
    AggboxSettings,
    AggregateType,
    Emit,
    HandlerError,
    Message,
    Registry,
    StoreWriter,
)
from aggregates.core.reasons import Reason
from aggregates.core.samevalue import same_value
from aggregates.debug import replay_steps
from aggregates.debug.diff import state_diff
from aggregates.testing import (
    AggregateHarness,
    Scenario,
    check_fault_tolerance,
    memory_database,
    message,
)


@dataclass(frozen=True)
class Gauge:
    reading: float = 0.0
    count: int = 0


gauges: AggregateType[Gauge] = AggregateType("Gauge", state=Gauge)
_calls = itertools.count()


@gauges.handles("Read")
def read(state: Gauge, msg: Message) -> Gauge:
    return Gauge(float(msg.payload["reading"]), state.count + 1)


@gauges.handles("Flip")
def flip(state: Gauge, msg: Message) -> Gauge:
    """Not deterministic in the stored value only: -0.0 or 0.0 (the harness calls it three
    times per handling: the run, its mutation check and the second run)."""
    return Gauge(-0.0 if next(_calls) % 4 < 2 else 0.0, state.count + 1)


def test_a_state_holding_nan_is_deterministic() -> None:
    h = AggregateHarness(gauges, aggregate_id="g-1")
    for reading in ("nan", "inf", "nan"):
        step = h.when(message("Read", {"reading": reading}, to=gauges, id="g-1"))
        assert step.outcome == "applied"
    assert math.isnan(h.state.reading) and h.state.count == 3


def test_minus_zero_is_not_zero_for_the_determinism_check() -> None:
    h = AggregateHarness(gauges, aggregate_id="g-2")
    with pytest.raises(HandlerError, match=r"not deterministic: .* state\.reading: -?0\.0 in "
                                           r"the first run, -?0\.0 in the second"):
        h.when(message("Flip", {}, to=gauges, id="g-2"))


gauge_registry = Registry([gauges])


def gauge_flow(sc: Scenario) -> None:
    for i, reading in enumerate(("nan", "1.5", "inf", "nan")):
        sc.when(message("Read", {"reading": reading}, to=gauges, id="g-9",
                        message_id=f"read-{i}", source=("Meter", "g-9", i + 1)))


def test_a_flow_ending_in_nan_is_fault_tolerant() -> None:
    # The undisturbed run, the runs under faults and the runs under other hash seeds all
    # end with reading NaN: the same state, not a difference.
    report = check_fault_tolerance(gauge_flow, gauge_registry, max_examples=5,
                                   hash_seeds=True)
    assert report is not None


def test_a_nan_that_stays_nan_is_no_change_in_a_replay() -> None:
    run = replay_steps(gauges, [message("Read", {"reading": "nan"}, to=gauges, id="g-3"),
                                message("Read", {"reading": "nan"}, to=gauges, id="g-3")])
    assert [sorted(s.changes) for s in run.steps] == [["count", "reading"], ["count"]]
    assert state_diff({"x": 0.0}, {"x": -0.0}) == {"x": (0.0, -0.0)}
    assert state_diff({"x": 1}, {"x": 1.0}) == {}


@pytest.mark.parametrize(("a", "b", "strict", "same"), [
    (math.nan, math.nan, True, True),
    ({"v": [math.nan]}, {"v": [math.nan]}, True, True),
    (Decimal("NaN"), Decimal("NaN"), True, True),
    (-0.0, 0.0, True, False),
    (-0.0, 0.0, False, True),
    (1, 1.0, True, False),
    (1, 1.0, False, True),
    (True, 1, True, False),
    (Decimal("1.10"), Decimal("1.1"), True, False),
    ((1, 2), [1, 2], False, False),
    (Gauge(math.nan), Gauge(math.nan), True, True),
])
def test_same_value(a: Any, b: Any, strict: bool, same: bool) -> None:
    assert same_value(a, b, strict=strict) is same


# -- the hot path of typed emits ----------------------------------------------------------
@dataclass(frozen=True)
class Counted:
    name: str
    n: int


counters: AggregateType[Gauge] = AggregateType("Counter", state=Gauge)


@counters.handles("Count")
def count(state: Gauge, msg: Message) -> Any:
    value = {"big": 2**63, "surrogate": "a\ud800b"}[msg.payload["what"]]
    name, n = (value, 1) if isinstance(value, str) else ("x", value)
    return state, [Emit(Counted(name, n))]


@pytest.mark.parametrize(("what", "field"), [("big", "n"), ("surrogate", "name")])
def test_a_scalar_field_the_store_cannot_hold_is_refused_naming_it(what: str,
                                                                   field: str) -> None:
    h = AggregateHarness(counters, aggregate_id="c-1")
    step = h.when(message("Count", {"what": what}, to=counters, id="c-1"))
    assert (step.outcome, step.reason) == ("dead_lettered", Reason.INVALID_EMIT)
    assert f"emit[0].payload.{field}: " in (step.detail or "")
    db = memory_database()
    w = StoreWriter(db, Registry([counters]), settings=AggboxSettings(database=db.name))
    (o,) = w.process([message("Count", {"what": what}, to=counters, id="c-2")])
    assert (o.outcome, o.reason) == ("dead_lettered", Reason.INVALID_EMIT)
    assert f"emit[0].payload.{field}: " in (o.detail or "")
    assert db.counters.find_one({"_id": "c-2"}) is None
