"""Planted bugs that the default check_fault_tolerance must find (issues 33 and 43),
mutation-style: each test plants one bug in the bank (or the ledger) of
tests/aggregates/planted_domain.py and runs the check with its defaults (the string-set
order with its one flag, ``hash_seeds=True``).

Measured before the fault placement of issue 33 (faults drawn point by point, "no fault"
one option of six): the double credit behind a 12-account set-up, the effect that pays on
every call and the set order all passed the check, even with ``max_examples=200``; the
uuid4, counter, wall-clock and in-place mutation bugs were already caught by the
harness's own checks (every handling run twice) in the undisturbed run.

Measured before the sweeps of issue 43 (random placement only, 30 runs): the quarter fee
charged twice on one business account's third timer firing was caught for 5 of the 24
accounts it could sit on (not for a-11, the one planted here); the priority transfer
mishandled on redelivery for 0 of 10 positions sampled among 450 (not for #431); the
query that looks up the wrong key — one payment made twice while the final states agree —
passed. The deterministic handler that keeps ``msg.occurred_at`` failed as "not
deterministic" (and, with ``hash_seeds=True``, as a set's order), and the docs' 50-account
flow stopped at the step limit, reported as a loop between aggregates."""

from __future__ import annotations

import functools

import pytest

from aggregates import ConfigurationError
from aggregates.testing import (
    FaultToleranceError,
    FlowDoesNotSettle,
    Scenario,
    check_fault_tolerance,
    message,
)
from aggregates.testing._scenario_plan import PlannedFault
from tests.aggregates import planted_domain as pd


def test_the_bank_without_bugs_passes_and_every_point_gets_faults() -> None:
    report = check_fault_tolerance(pd.payout_flow, pd.bank(), effects=pd.pay_effects())
    cov = report.coverage
    assert list(cov.points) == [("deliver", "OpenAccount"), ("deliver", "TransferRequested"),
                                ("effect", "Pay"), ("reply", "Paid"),
                                ("deliver", "CreditRequested")]
    for stratum, n in cov.points.items():  # the sweeps: every point of every stratum
        assert cov.tried[stratum] == set(range(n)), (stratum, cov)
    assert [kind for kind, _ in report.sweeps] == ["duplicate", "late", "effect_lost", "swap"]
    assert report.random_runs == 6
    assert str(report).startswith("fault tolerance: no run differed; sweeps over every "
                                  "point: duplicate (82), late (82), effect_lost (10), swap")
    assert "effect Pay 10/10" in str(cov) and "reply Paid 10/10" in str(cov)


def test_the_ledger_without_bugs_passes() -> None:
    """No dedup, every handler idempotent by itself: no sweep may fail it (no false alarm)."""
    check_fault_tolerance(pd.ledger_flow, pd.ledger())
    check_fault_tolerance(pd.quarter_flow, pd.ledger())


def test_a_double_credit_behind_a_long_set_up_is_found_and_shrunk_to_one_fault() -> None:
    with pytest.raises(FaultToleranceError) as err:
        check_fault_tolerance(pd.bank_flow, pd.bank("double_credit"))
    assert err.value.faults == [PlannedFault("deliver", "CreditRequested", 0, "duplicate")]
    text = str(err.value)
    assert text.startswith("under 1 fault — duplicate at CreditRequested #1 (Account/a-01's "
                           "1st CreditRequested, message ")
    assert "— the final states differ" in text.splitlines()[0]
    assert text.count("duplicate at") == 1
    assert "state.balance" in text and "\nfaults tried at " in text
    assert "found by: the sweep 'every delivery" in text


def test_a_handler_wrong_on_one_accounts_third_timer_firing_is_found() -> None:
    with pytest.raises(FaultToleranceError) as err:
        check_fault_tolerance(pd.quarter_flow, pd.ledger("quarter_fee"))
    (fault,) = err.value.faults
    assert (fault.point, fault.type, fault.kind) == ("timer", "MonthlyFee", "duplicate")
    head = str(err.value).splitlines()[0]
    assert f"duplicate at timer MonthlyFee #{fault.index + 1} (Account/a-11's 3rd " \
           "MonthlyFee, message " in head
    assert "Account/a-11 first differs at state.balance" in str(err.value)


def test_one_late_transfer_of_a_common_type_mishandled_on_redelivery_is_found() -> None:
    with pytest.raises(FaultToleranceError) as err:
        check_fault_tolerance(pd.ledger_flow, pd.ledger("priority"))
    assert err.value.faults == [PlannedFault("deliver", "TransferRequested", 430, "duplicate")]
    assert str(err.value).startswith(
        "under 1 fault — duplicate at TransferRequested #431 (Account/a-30's 9th "
        "TransferRequested, message tr-430, step ")


def test_a_payment_made_twice_behind_a_query_that_looks_up_the_wrong_key_is_found() -> None:
    effects = pd.pay_effects("wrong_key_query")
    with pytest.raises(FaultToleranceError) as err:
        check_fault_tolerance(pd.payout_flow, pd.bank(), effects=effects)
    assert err.value.faults == [PlannedFault("effect", "Pay", 0, "effect_lost")]
    text = str(err.value)
    assert "effect 'Pay' reached its resource 2 times for entry " in text
    assert "(undisturbed: 1); the final states agree, the resource does not" in text
    assert "its query function found nothing" in text
    check_fault_tolerance(pd.payout_flow, pd.bank(), effects=effects, at_least_once=["Pay"])


def test_an_effect_declared_idempotent_that_is_not_is_out_of_reach_by_design() -> None:
    """docs/testing.md "What the check cannot see": idempotent=True is taken at its word —
    the resource is said to do the work once per key, so calling it again is allowed."""
    paid = len(pd.payments)
    check_fault_tolerance(pd.payout_flow, pd.bank(), effects=pd.pay_effects("claims_idempotent"))
    made = [k for k, _ in pd.payments[paid:]]
    assert len(made) > len(set(made))  # it did pay twice under the lost answers


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
    assert report.coverage.points[("timer", "MonthlyFee")] == 4
    assert report.coverage.tried[("timer", "MonthlyFee")] == {0, 1, 2, 3}
    assert "timer MonthlyFee 4/4" in str(report.coverage)


# -- no false alarms (issue 43) -----------------------------------------------------------


def test_a_handler_that_keeps_occurred_at_is_deterministic_across_runs() -> None:
    """message() numbers ids and times from 1 in every run of the check (before: a
    process-wide counter gave every run other times — "not deterministic")."""
    check_fault_tolerance(pd.stamp_flow, pd.stamped)


def test_a_handler_that_keeps_occurred_at_is_not_blamed_on_hash_order() -> None:
    """Before: the subprocesses built their messages with a fresh counter, this process
    with one other tests had moved on — "the iteration order of a set of strings"."""
    message("Noted", {}, to="Note", id="elsewhere")  # as another test would
    check_fault_tolerance(pd.stamp_flow, pd.stamped, hash_seeds=True)


def test_the_docs_fifty_account_flow_settles_within_the_default_step_budget() -> None:
    """Before: max_steps=1000 stopped it after 1,000 of its 1,254 steps of one when(),
    reported as "a loop between aggregates"."""
    sc = Scenario(pd.bank(), effects=pd.pay_effects())
    pd.bank_flow(sc, accounts=50, transfers=470, payout=True)
    assert len(sc.timeline) == 50 + 470 * 2 + 157 * 2


def test_a_step_budget_that_runs_out_is_not_called_a_loop() -> None:
    sc = Scenario(pd.bank(), effects=pd.pay_effects(), max_steps=300)
    with pytest.raises(FlowDoesNotSettle) as err:
        pd.bank_flow(sc, accounts=50, transfers=470, payout=True)
    text = str(err.value)
    assert text.startswith("the flow did not settle within max_steps=300: no loop — it was "
                           "still working through its 470 input message(s) (")
    assert "raise it: Scenario(max_steps=...)" in text and "loop between" not in text
    assert err.value.cycle is None
