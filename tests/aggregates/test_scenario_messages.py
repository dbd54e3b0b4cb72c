"""Messages that help (issue 33, item 4): a handler found not deterministic is named with
the aggregate type and id, the message id, the step and the first field that differed (its
state, an emitted entry or its timers) — in AggregateHarness and in a Scenario; an effect
whose result changes is blamed on the effect, by name, with the result's field; and
``Scenario.state`` of an aggregate that never received a message raises, listing the ids
the scenario knows. Issue 43: a failure shows its head and at most 40 lines of timeline
(the whole one on the exception and in a file on request), a lost answer says so, and runs
that differ are told as seen."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import Any

import pytest

from aggregates import (
    AggregateType,
    EffectCall,
    Effects,
    Emit,
    Handled,
    HandlerError,
    Message,
    Registry,
)
from aggregates.testing import (
    AggregateHarness,
    Fault,
    FaultToleranceError,
    Scenario,
    ScenarioError,
    check_fault_tolerance,
    memory_database,
    message,
)
from tests.aggregates import planted_domain as pd

_numbers = itertools.count(1)


@dataclass(frozen=True)
class Acc:
    open: bool = False
    no: int = 0
    ref: str = ""


def accounts(bug: str = "") -> AggregateType[Acc]:
    """``Acc``: ``Open``, ``Credit`` (``bug="state"``: numbers the credit from a global
    counter; ``"emit"``: puts that number in the ``Credited`` it emits; ``"mutate"``:
    changes the state it was given), ``Withdraw`` (emits the ``Pay`` effect) and ``Paid``."""
    acc = AggregateType("Acc", state=Acc, collection="accs")

    @acc.handles("Open")
    def open_(state: Acc, msg: Message) -> Acc:
        return replace(state, open=True)

    @acc.handles("Credit")
    def credit(state: Acc, msg: Message) -> Handled[Acc]:
        if bug == "state":
            return replace(state, no=next(_numbers))
        if bug == "emit":
            return state, [Emit("Credited", {"no": next(_numbers)})]
        if bug == "mutate":
            object.__setattr__(state, "no", state.no + 1)
            return state
        return replace(state, no=state.no + 1)

    @acc.handles("Withdraw")
    def withdraw(state: Acc, msg: Message) -> Handled[Acc]:
        return state, [Emit("Pay", {"amount": msg.payload["amount"]})]

    @acc.handles("Paid")
    def paid(state: Acc, msg: Message) -> Acc:
        return replace(state, ref=msg.payload["ref"])

    @acc.handles("PayFailed")
    def pay_failed(state: Acc, msg: Message) -> Acc:
        return state

    return acc


def pay_effects() -> Effects:
    """``Pay`` whose payment reference comes from a global counter: a second call for the
    same entry returns another reference (not idempotent on the idempotency key)."""
    effects = Effects()

    @effects.effect("Pay", on_success="Paid", on_failure="PayFailed", max_attempts=3)
    def pay(call: EffectCall) -> dict[str, Any]:
        return {"ref": f"P-{next(_numbers)}"}

    return effects


def open_(aid: str) -> Message:
    return message("Open", {}, to="Acc", id=aid, message_id=f"open-{aid}")


def credit(aid: str, mid: str) -> Message:
    return message("Credit", {}, to="Acc", id=aid, message_id=mid)


def test_the_harness_names_aggregate_message_step_and_state_field() -> None:
    h = AggregateHarness(accounts("state"), aggregate_id="A").given(open_("A"))
    with pytest.raises(HandlerError) as err:
        h.when(credit("A", "cr-1"))
    text = str(err.value)
    assert "Acc/A, message cr-1 (step 2)" in text
    assert "handler for 'Credit' is not deterministic" in text
    assert "differ at state.no:" in text


def test_the_harness_names_the_emitted_field_that_differed() -> None:
    h = AggregateHarness(accounts("emit"), aggregate_id="B")
    with pytest.raises(HandlerError) as err:
        h.when(credit("B", "cr-9"))
    assert "Acc/B, message cr-9 (step 1)" in str(err.value)
    assert "emit[0] (Credited).payload.no:" in str(err.value)


def test_a_state_mutated_in_place_is_named_with_aggregate_and_message() -> None:
    h = AggregateHarness(accounts("mutate"), aggregate_id="C").given(open_("C"))
    with pytest.raises(HandlerError, match=r"Acc/C, message cr-3 \(step 2\): the handler for "
                                           r"'Credit' mutated the state it was given"):
        h.when(credit("C", "cr-3"))


def test_a_scenario_names_its_timeline_step() -> None:
    sc = Scenario(Registry([accounts("emit")]))
    sc.given(open_("A"), open_("B"))  # steps 1 and 2
    with pytest.raises(HandlerError) as err:
        sc.when(credit("B", "cr-7"))
    text = str(err.value)
    assert "Acc/B, message cr-7 (step 3)" in text
    assert "emit[0] (Credited).payload.no:" in text


def withdraw_flow(sc: Scenario) -> None:
    sc.given(open_("A"))
    sc.when(message("Withdraw", {"amount": 5}, to="Acc", id="A", message_id="wd-1"))


def test_an_effect_whose_result_changes_is_blamed_by_name() -> None:
    with pytest.raises(FaultToleranceError) as err:
        check_fault_tolerance(withdraw_flow, Registry([accounts()]), effects=pay_effects(),
                              max_examples=10)
    text = str(err.value)
    assert "the effect 'Pay' is not idempotent: its call for Acc/A" in text
    assert "first at result.ref:" in text
    assert "a handler is not" not in text
    assert "Acc/A first differs at state.ref:" in text


def test_an_effect_answering_a_retry_differently_is_blamed_within_one_run() -> None:
    sc = Scenario(Registry([accounts()]), effects=pay_effects(),
                  faults=[Fault.effect_lost("Pay")])
    withdraw_flow(sc)
    from aggregates.testing._blame import effect_blame

    blame = effect_blame((sc.effect_calls, sc.timeline), (sc.effect_calls, sc.timeline))
    assert blame is not None
    key = sc.effect_calls[0].call.idempotency_key
    step = next(e.step for e in sc.timeline if e.kind == "effect")
    assert f"the effect 'Pay' is not idempotent: its call for Acc/A (entry {key}, step {step})" \
        in blame
    assert "result.ref: 'P-" in blame and "at attempt 2 (undisturbed)" in blame


@pytest.mark.parametrize("store", [False, True], ids=["memory", "mongomock"])
def test_state_of_an_aggregate_that_never_received_a_message_raises(store: bool) -> None:
    acc = accounts()
    sc = Scenario(Registry([acc]), with_store=memory_database() if store else None)
    sc.given(open_("A"), open_("B"))
    with pytest.raises(ScenarioError) as err:
        sc.state(acc, "a")
    text = str(err.value)
    assert "Acc 'a' never received a message" in text
    assert "the Acc ids it knows (2): 'A', 'B'" in text
    assert sc.state(acc, "A").open
    # One that received a message it did not apply reads as the initial state.
    sc.when(message("Nope", {}, to="Acc", id="D", message_id="nope-1"))
    assert sc.outcome("nope-1").outcome == "dead_lettered"
    assert sc.state(acc, "D") == Acc()


# -- issue 43: messages a person reads, blame for what was seen ----------------------------


def test_a_failure_shows_the_head_and_forty_lines_the_whole_timeline_on_request(
        tmp_path: Any) -> None:
    path = tmp_path / "timeline.txt"
    flow = functools.partial(pd.ledger_flow, accounts=20, transfers=150, priority=120)
    with pytest.raises(FaultToleranceError) as err:
        check_fault_tolerance(flow, pd.ledger("priority"), timeline_file=path)
    text = str(err.value)
    head, _, rest = text.partition("\n")
    assert head.startswith("under 1 fault — duplicate at TransferRequested #121 (Account/a-00's "
                           "7th TransferRequested, message tr-120, step ")
    assert "Account/a-00 first differs at state.balance" in rest
    timeline = err.value.timeline
    assert timeline is not None and len(timeline) > 300
    shown = text.split("\ntimeline (", 1)[1]
    exchanges = [line for line in shown.splitlines()[2:] if line.strip() != "…"]
    assert 10 < len(exchanges) <= 40
    assert f"({len(exchanges)} of {len(timeline)} exchanges; all of them: err.timeline; the " \
           f"whole timeline is in {path}):" in text
    assert any("duplicate" in line and "fault" in line for line in exchanges)
    assert len(text.splitlines()) < 60
    assert path.read_text(encoding="utf-8") == f"{timeline}\n"


def test_a_lost_answer_says_so_in_the_timeline() -> None:
    sc = Scenario(Registry([accounts()]), effects=pay_effects(),
                  faults=[Fault.effect_lost("Pay")])
    withdraw_flow(sc)
    calls = [e for e in sc.timeline if e.kind == "effect"]
    assert str(calls[0]).split("effect", 2)[-1].split("  [")[0].strip().endswith(
        "answer lost (effect_timeout)")
    assert sc.effect_calls[0].answer == "lost"


def test_runs_that_differ_without_faults_are_told_as_seen() -> None:
    with pytest.raises(FaultToleranceError) as err:
        check_fault_tolerance(pd.bank_flow, pd.bank("counter"), check_determinism=False)
    text = str(err.value)
    assert text.startswith("in a run without faults: the final states differ between two "
                           "runs with no fault injected")
    assert "state.stamp: " in text and " in one run, " in text and " in another" in text
    assert "undisturbed" not in text and "under faults" not in text.split("\nfound by")[0]


def test_fresh_processes_that_agree_are_not_blamed_on_hash_order() -> None:
    """A module-level counter: three fresh processes agree with each other, this one (whose
    counter moved on) does not — said as seen, not as "the iteration order of a set"."""
    next(pd._counter)
    with pytest.raises(FaultToleranceError) as err:
        check_fault_tolerance(pd.bank_flow, pd.counting, check_determinism=False,
                              hash_seeds=True)
    text = str(err.value)
    assert text.startswith("the undisturbed run ends the same in three fresh processes "
                           "(PYTHONHASHSEED=1, 2, 3) but differently in this one — state this "
                           "process kept between runs")
    assert "state.stamp" in text or "stamp=" in text
