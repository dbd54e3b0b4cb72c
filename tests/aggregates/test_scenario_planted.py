"""Planted bugs that the default check_fault_tolerance must find (issue 33), mutation-style:
each test plants one bug in the bank of tests/aggregates/planted_domain.py and runs the
check with its defaults (the string-set order with its one flag, ``hash_seeds=True``).

Measured before the fault placement of issue 33 (faults drawn point by point, "no fault"
one option of six): the double credit behind a 12-account set-up, the effect that pays on
every call and the set order all passed the check, even with ``max_examples=200``; the
uuid4, counter, wall-clock and in-place mutation bugs were already caught by the
harness's own checks (every handling run twice) in the undisturbed run."""

from __future__ import annotations

import functools

import pytest

from aggregates import ConfigurationError
from aggregates.testing import FaultToleranceError, check_fault_tolerance
from aggregates.testing._scenario_plan import PlannedFault
from tests.aggregates import planted_domain as pd


def test_the_bank_without_bugs_passes_and_every_kind_of_point_gets_faults() -> None:
    report = check_fault_tolerance(pd.payout_flow, pd.bank(), effects=pd.pay_effects())
    cov = report.coverage
    assert list(cov.points) == [("deliver", "OpenAccount"), ("deliver", "TransferRequested"),
                                ("effect", "Pay"), ("deliver", "CreditRequested")]
    for stratum, n in cov.points.items():  # every stratum, and its late points too
        assert any(i >= n // 2 for i in cov.tried.get(stratum, ())), (stratum, cov)
    assert str(report).startswith("fault tolerance: no run differed; faults tried at ")
    assert "effect Pay " in str(cov) and "CreditRequested " in str(cov)


def test_a_double_credit_behind_a_long_set_up_is_found_and_shrunk_to_one_fault() -> None:
    with pytest.raises(FaultToleranceError) as err:
        check_fault_tolerance(pd.bank_flow, pd.bank("double_credit"))
    assert err.value.faults == [PlannedFault("deliver", "CreditRequested", 0, "duplicate")]
    text = str(err.value)
    assert text.startswith("under 1 fault — duplicate at CreditRequested #1 — the final "
                           "states differ")
    assert text.count("duplicate at") == 1
    assert "state.balance" in text and "\nfaults tried at " in text


def test_an_effect_that_pays_on_every_call_is_found() -> None:
    effects = pd.pay_effects("pays_twice")
    with pytest.raises(FaultToleranceError) as err:
        check_fault_tolerance(pd.payout_flow, pd.bank(), effects=effects)
    assert err.value.faults == [PlannedFault("effect", "Pay", 0, "effect_lost")]
    assert "effect 'Pay' reached its resource 2 times" in str(err.value)
    # where paying twice is harmless, the team says so
    check_fault_tolerance(pd.payout_flow, pd.bank(), effects=effects, at_least_once=["Pay"])


@pytest.mark.parametrize(("bug", "says"), [
    ("uuid", "not deterministic"), ("counter", "not deterministic"),
    ("clock", "not deterministic"), ("mutate", "mutated the state it was given")])
def test_a_handler_reading_uuid4_a_counter_or_the_clock_or_mutating_its_state_is_found(
        bug: str, says: str) -> None:
    with pytest.raises(FaultToleranceError, match=says):
        check_fault_tolerance(pd.bank_flow, pd.bank(bug))


@pytest.mark.parametrize("bug", ["uuid", "counter", "clock"])
def test_without_the_harness_check_the_runs_themselves_disagree(bug: str) -> None:
    with pytest.raises(FaultToleranceError, match=r"^in a run without faults: ") as err:
        check_fault_tolerance(pd.bank_flow, pd.bank(bug), check_determinism=False)
    assert err.value.faults == [] and "state.stamp" in str(err.value)


def test_emits_in_the_order_of_a_string_set_are_found_with_hash_seeds() -> None:
    check_fault_tolerance(pd.watch_flow, pd.watch)  # one process, one hash order: unseen
    with pytest.raises(FaultToleranceError, match="PYTHONHASHSEED=") as err:
        check_fault_tolerance(pd.watch_flow, pd.watch, hash_seeds=True)
    assert "iteration order of a set" in str(err.value) and "Board/b-1" in str(err.value)
    check_fault_tolerance(pd.watch_flow, pd.watch_sorted, hash_seeds=True)


def test_hash_seeds_needs_importable_names() -> None:
    with pytest.raises(ConfigurationError, match="top level of an importable"):
        check_fault_tolerance(functools.partial(pd.watch_flow), pd.watch, hash_seeds=True)


def test_timer_firings_are_fault_points_of_their_own() -> None:
    report = check_fault_tolerance(pd.fee_flow, pd.bank())
    assert report.coverage.points[("deliver", "MonthlyFee")] == 4
    assert report.coverage.tried[("deliver", "MonthlyFee")]
    assert "MonthlyFee " in str(report.coverage)
