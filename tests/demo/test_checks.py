"""The checks pass on a correct run and FAIL on a corrupted one — each check can fail.

``local_run`` (conftest) runs a small scenario through the demo's loop, the real
dispatcher and the real store writer (no Spark). Most tests corrupt a copy of what the checks
read; one corrupts the database itself and reads it back. ``early_run`` stops after round 1,
while every order still waits for its credit answer: its timer is pending."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from pymongo import MongoClient

from aggbox.demo import checks as ck
from aggbox.demo.checks import Check, Evidence, run_checks
from aggbox.demo.generate import ScenarioSpec
from aggbox.demo.model import RunRecord
from aggbox.demo.store import StoreView, read_store
from aggregates.fold.document import F_HW, F_INBOX, F_OUTBOX, F_SEQ, F_STATE, F_TIMERS
from tests.demo.conftest import LocalRun, run_locally

pytestmark = pytest.mark.mongo


def evidence(run: LocalRun, *, store: StoreView | None = None,
             record: RunRecord | None = None) -> Evidence:
    return Evidence(run.expected, store or run.store, record or run.record, run.registry)


def failing(checks: list[Check]) -> set[str]:
    return {c.name for c in checks if not c.passed}


def name(fn: Callable[[Evidence], Check], run: LocalRun) -> str:
    return fn(evidence(run)).name


def test_a_correct_run_passes_every_check(local_run: LocalRun) -> None:
    results = run_checks(evidence(local_run))
    assert [c.name for c in results if not c.passed] == []
    assert len(results) == len(ck.CHECKS) == 13
    assert local_run.record.settled and len(local_run.record.rounds) == 3
    # Every order was answered, so every credit timer was cancelled.
    orders = len(local_run.scenario.orders)
    assert local_run.store.pending_timers == 0
    assert sum(local_run.expected.scheduled.values()) == orders
    timers = ck.check_timers(evidence(local_run)).detail
    assert f"{orders} scheduled, {orders} cancelled or replaced, 0 pending" in timers
    # The redelivered copies reached rounds 2 and 3 and were dropped as duplicates.
    assert all(r.redelivered > 0 and r.counts["duplicate"] >= r.redelivered
               for r in local_run.record.rounds[1:])


def _store(run: LocalRun) -> StoreView:
    return copy.deepcopy(run.store)


def _doc(store: StoreView, atype: str, pick: Callable[[dict[str, Any]], bool] = lambda d: True
         ) -> dict[str, Any]:
    return next(d for d in store.of_type(atype).values() if pick(d))


def test_a_wrong_order_status_fails_the_oracle_and_invariants_1_and_5(local_run: LocalRun
                                                                      ) -> None:
    store = _store(local_run)
    _doc(store, "Order", lambda d: d[F_STATE]["status"] == "approved")[F_STATE]["status"] = \
        "rejected"
    bad = failing(run_checks(evidence(local_run, store=store)))
    assert bad == {name(ck.check_orders, local_run), name(ck.check_invariant_1, local_run),
                   name(ck.check_invariant_5, local_run)}


def test_reserved_credit_over_the_limit_fails(local_run: LocalRun) -> None:
    store = _store(local_run)
    doc = _doc(store, "Customer")
    doc[F_STATE]["reserved"] = doc[F_STATE]["credit_limit"] + 1
    check = ck.check_customers(evidence(local_run, store=store))
    assert not check.passed and "over the credit limit" in check.detail


def test_a_missing_inbox_entry_fails_invariant_1(local_run: LocalRun) -> None:
    store = _store(local_run)
    _doc(store, "Customer", lambda d: len(d[F_INBOX]) > 1)[F_INBOX].pop()
    assert failing(run_checks(evidence(local_run, store=store))) == {
        name(ck.check_invariant_1, local_run)}


def test_a_wrong_high_water_mark_fails_invariant_1(local_run: LocalRun) -> None:
    store = _store(local_run)
    doc = _doc(store, "Order", lambda d: bool(d.get(F_HW)))
    doc[F_HW] = {k: v + 1 for k, v in doc[F_HW].items()}
    assert not ck.check_invariant_1(evidence(local_run, store=store)).passed


def test_a_withdrawn_timer_missing_from_the_high_water_mark_fails_invariant_1(
        local_run: LocalRun) -> None:
    """The answer cancelled the stored credit timer, which might have been firing: its
    message is recorded as handled (hw of the timer's source) — here it is not."""
    store = _store(local_run)
    doc = _doc(store, "Order")
    doc[F_HW] = {k: v for k, v in doc[F_HW].items() if not k.startswith("aggbox")}
    assert failing(run_checks(evidence(local_run, store=store))) == {
        name(ck.check_invariant_1, local_run)}


def test_a_pending_outbox_entry_fails_invariant_2_and_nothing_pending(local_run: LocalRun
                                                                      ) -> None:
    store = _store(local_run)
    _doc(store, "Order")[F_OUTBOX] = [{"id": "resurrected", "type": "OrderCreated"}]
    bad = failing(run_checks(evidence(local_run, store=store)))
    assert bad == {name(ck.check_invariant_2, local_run),
                   name(ck.check_nothing_pending, local_run)}


def _record(run: LocalRun) -> RunRecord:
    return copy.deepcopy(run.record)


def test_a_lost_published_message_fails_invariants_2_and_4(local_run: LocalRun) -> None:
    record = _record(local_run)
    record.drains[0].records.pop(0)
    bad = failing(run_checks(evidence(local_run, record=record)))
    assert name(ck.check_invariant_2, local_run) in bad
    assert name(ck.check_invariant_4, local_run) in bad


def test_a_message_published_by_two_drains_fails_invariant_2(local_run: LocalRun) -> None:
    record = _record(local_run)
    record.drains[1].records.append(record.drains[0].records[0])
    check = ck.check_invariant_2(evidence(local_run, record=record))
    assert not check.passed and "more than one drain" in check.detail


def _rewrite(record: RunRecord, index: int, change: Callable[[dict[str, Any]], None]) -> None:
    env = json.loads(record.drains[0].records[index])
    change(env)
    record.drains[0].records[index] = json.dumps(env)


def test_a_non_deterministic_id_fails_invariant_3(local_run: LocalRun) -> None:
    record = _record(local_run)
    _rewrite(record, 0, lambda e: e.update(causation_id="something-else"))
    check = ck.check_invariant_3(evidence(local_run, record=record))
    assert not check.passed and "recomputed id" in check.detail


def test_a_published_payload_other_than_the_oracles_fails_invariant_3(local_run: LocalRun
                                                                      ) -> None:
    record = _record(local_run)
    _rewrite(record, 0, lambda e: e["payload"].update(amount=10**6))
    assert not ck.check_invariant_3(evidence(local_run, record=record)).passed


def test_a_sequence_gap_fails_invariant_4(local_run: LocalRun) -> None:
    store = _store(local_run)
    _doc(store, "Customer", lambda d: d.get(F_SEQ, 0) > 0)[F_SEQ] += 1
    bad = failing(run_checks(evidence(local_run, store=store)))
    assert name(ck.check_invariant_4, local_run) in bad


def test_an_applied_message_missing_from_the_state_fails_invariant_5(local_run: LocalRun
                                                                     ) -> None:
    # The outcome log claims an extra applied OrderCreated the state does not reflect.
    record = _record(local_run)
    rnd = record.rounds[1]
    dup = next(o for o in rnd.outcomes if o.outcome == "duplicate")
    i = rnd.outcomes.index(dup)
    rnd.outcomes[i] = type(dup)(dup.message_id + "-x", dup.aggregate_type, dup.aggregate_id,
                                "applied")
    assert not ck.check_invariant_5(evidence(local_run, record=record)).passed


def test_counts_that_do_not_add_up_fail_invariant_6_and_the_oracle_counts(local_run: LocalRun
                                                                          ) -> None:
    record = _record(local_run)
    record.rounds[0].counts["duplicate"] -= 1
    bad = failing(run_checks(evidence(local_run, record=record)))
    assert bad == {name(ck.check_invariant_6, local_run),
                   name(ck.check_round_counts, local_run)}


def test_a_missing_dead_letter_fails(local_run: LocalRun) -> None:
    store = _store(local_run)
    store.dead_letters.pop()
    assert failing(run_checks(evidence(local_run, store=store))) == {
        name(ck.check_dead_letters, local_run)}


def test_parked_messages_and_unsettled_runs_fail_nothing_pending(local_run: LocalRun) -> None:
    store = _store(local_run)
    store.parked.append({"reason": "outbox_full"})
    assert not ck.check_nothing_pending(evidence(local_run, store=store)).passed
    record = _record(local_run)
    record.settled = False
    assert not ck.check_nothing_pending(evidence(local_run, record=record)).passed


def test_a_corrupted_database_fails(local_run: LocalRun) -> None:
    """The same, through MongoDB: lower one customer's reserved credit in the store."""
    coll = local_run.db["customers"]
    doc = coll.find_one({"state.reserved": {"$gt": 0}})
    assert doc is not None
    coll.update_one({"_id": doc["_id"]}, {"$inc": {"state.reserved": -1}})
    try:
        store = read_store(local_run.db, local_run.registry, local_run.settings)
        bad = failing(run_checks(evidence(local_run, store=store)))
        assert bad == {name(ck.check_customers, local_run),
                       name(ck.check_invariant_1, local_run),
                       name(ck.check_invariant_5, local_run)}
    finally:
        coll.update_one({"_id": doc["_id"]}, {"$inc": {"state.reserved": 1}})


def test_a_missing_document_fails_the_oracle_and_invariant_1(local_run: LocalRun) -> None:
    store = _store(local_run)
    key = next(k for k in store.documents if k[0] == "Order")
    del store.documents[key]
    bad = failing(run_checks(evidence(local_run, store=store)))
    assert {name(ck.check_orders, local_run), name(ck.check_invariant_1, local_run)} <= bad
    check = ck.check_invariant_1(evidence(local_run, store=store))
    assert f"Order/{key[1]}: no document" in check.detail


# -- timers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def early_run(mongo_client: MongoClient[dict[str, Any]], mongo_uri: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRun]:
    run = run_locally(mongo_client, mongo_uri, tmp_path_factory.mktemp("demo-early"),
                      ScenarioSpec(customers=3, orders=12, seed=4), max_rounds=1)
    yield run
    mongo_client.drop_database(run.db.name)


def _timer(store: StoreView) -> dict[str, Any]:
    doc = _doc(store, "Order", lambda d: bool(d.get(F_TIMERS)))
    timer: dict[str, Any] = doc[F_TIMERS][0]
    return timer


def test_pending_timers_are_checked_and_are_not_outbox_entries(early_run: LocalRun) -> None:
    """Stopped after round 1 against the oracle of one generation: only "Nothing pending"
    fails — because the run did not settle, not because of the timers."""
    orders = len(early_run.scenario.orders)
    assert early_run.store.pending_timers == orders
    assert failing(run_checks(evidence(early_run))) == {
        name(ck.check_nothing_pending, early_run)}
    timers = ck.check_timers(evidence(early_run))
    assert timers.passed and f"{orders} scheduled, 0 cancelled or replaced, {orders} pending" \
        in timers.detail
    assert "each due 0:30:00 after scheduling" in timers.detail
    record = _record(early_run)
    record.settled = True
    pending = ck.check_nothing_pending(evidence(early_run, record=record))
    assert pending.passed and f"{orders} timers not due yet" in pending.detail


def test_a_timer_due_at_another_time_fails(early_run: LocalRun) -> None:
    store = _store(early_run)
    _timer(store)["due"] += timedelta(seconds=1)
    check = ck.check_timers(evidence(early_run, store=store))
    assert not check.passed and "after scheduling, expected 0:30:00" in check.detail
    assert "recomputed" in check.detail  # the id is derived from the due time


def test_a_timer_id_not_derived_from_its_fields_fails(early_run: LocalRun) -> None:
    store = _store(early_run)
    _timer(store)["id"] = "not-derived"
    check = ck.check_timers(evidence(early_run, store=store))
    assert not check.passed and "id not-derived, recomputed" in check.detail


def test_a_timer_with_another_payload_fails(early_run: LocalRun) -> None:
    store = _store(early_run)
    _timer(store)["payload"] = {"order_id": "o-other"}
    check = ck.check_timers(evidence(early_run, store=store))
    assert not check.passed and "payload {'order_id': 'o-other'}" in check.detail


def test_a_lost_timer_fails_the_timers_check_and_invariant_5(early_run: LocalRun) -> None:
    store = _store(early_run)
    doc = _doc(store, "Order", lambda d: bool(d.get(F_TIMERS)))
    doc[F_TIMERS] = []
    bad = failing(run_checks(evidence(early_run, store=store)))
    assert bad == {name(ck.check_timers, early_run), name(ck.check_invariant_5, early_run),
                   name(ck.check_nothing_pending, early_run)}
    check = ck.check_timers(evidence(early_run, store=store))
    assert f"Order/{doc['_id']}: timer 'credit' missing" in check.detail


def test_a_timer_left_after_the_answer_fails(local_run: LocalRun, early_run: LocalRun) -> None:
    """An answered order whose credit timer was not cancelled."""
    store = _store(local_run)
    doc = _doc(store, "Order", lambda d: d[F_STATE]["status"] == "approved")
    doc[F_TIMERS] = [copy.deepcopy(_timer(early_run.store))]
    check = ck.check_timers(evidence(local_run, store=store))
    assert not check.passed
    assert f"Order/{doc['_id']}: unexpected timer 'credit' (CreditDeadline)" in check.detail
