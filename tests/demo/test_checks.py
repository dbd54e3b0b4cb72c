"""The checks pass on a correct run and FAIL on a corrupted one — each check can fail.

``local_run`` (conftest) runs a small scenario through the demo's loop, the real
dispatcher and the real store writer (no Spark). Most tests corrupt a copy of what the checks
read; one corrupts the database itself and reads it back."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from aggbox.demo import checks as ck
from aggbox.demo.checks import Check, Evidence, run_checks
from aggbox.demo.model import RunRecord
from aggbox.demo.store import StoreView, read_store
from aggregates.fold.document import F_HW, F_INBOX, F_OUTBOX, F_SEQ, F_STATE
from tests.demo.conftest import LocalRun

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
    assert len(results) == len(ck.CHECKS) == 12
    assert local_run.record.settled and len(local_run.record.rounds) == 3
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
