"""The oracle: independent of the generator's bookkeeping, yet it agrees with it; it notices
an order-sensitive input; it predicts each round's outcome counts."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from aggbox.demo.checks import (
    Evidence,
    check_customers,
    check_dead_letters,
    check_invariant_1,
    check_invariant_5,
    check_orders,
    run_checks,
)
from aggbox.demo.generate import ScenarioSpec, envelope_line, generate
from aggbox.demo.oracle import Envelope, PendingTimer, classify, expect
from aggbox.demo.oracle_rounds import expected_round_counts
from aggbox.demo.oracle_timers import apply_timer_ops
from aggbox.examples.orders import registry
from aggregates import Cancel, Emit, Schedule
from aggregates.core.errors import EnvelopeError
from aggregates.core.ids import emitted_message_id
from aggregates.core.reasons import Reason
from aggregates.domain.aggregate import StateCodec
from aggregates.message.envelope import Message
from tests.demo.conftest import LocalRun, run_locally


def test_oracle_agrees_with_the_generators_plan() -> None:
    sc = generate(ScenarioSpec(customers=12, orders=150, seed=21))
    ex = expect(sc.lines, registry)
    assert ex.order_sensitive == []
    for o in sc.orders:
        assert ex.states[("Order", o.order_id)] == {
            "customer_id": o.customer_id, "amount": o.amount,
            "status": "rejected" if o.oversized else "approved"}
    for c in sc.customers:
        reserved = sum(o.amount for o in sc.orders
                       if o.customer_id == c.customer_id and not o.oversized)
        assert ex.states[("Customer", c.customer_id)] == {
            "name": c.name, "credit_limit": c.credit_limit, "reserved": reserved}
    assert ex.generations == [12 + 150, 150, 150]
    assert {k: v for k, v in ex.dead.items()} == {
        classify(b.line, registry).key: b.reason for b in sc.bad_rows}
    # One OrderCreated per order, one reply per OrderCreated.
    assert len(ex.emitted) == 300
    # Each order took seq 1 for OrderCreated and timer number 1 (_tseq) for its credit
    # timer, which the answer cancelled: nothing is pending.
    assert all(ex.seq[("Order", o.order_id)] == 1 for o in sc.orders)
    assert all(ex.scheduled[("Order", o.order_id)] == 1 for o in sc.orders)
    assert ex.timers == {}
    # Each timer was stored a round before the answer cancelled it: recorded as handled.
    assert all(len(ex.withdrawn[("Order", o.order_id)]) == 1 for o in sc.orders)
    assert not any(m.type == "CreditDeadline" for m in ex.messages.values())


def test_until_the_answer_comes_every_order_has_its_credit_timer() -> None:
    sc = generate(ScenarioSpec(customers=3, orders=12, seed=2))
    ex = expect(sc.lines, registry, generations=1)
    assert ex.generations == [3 + 12]
    assert set(ex.timers) == {("Order", o.order_id) for o in sc.orders}
    for o in sc.orders:
        assert ex.states[("Order", o.order_id)]["status"] == "pending"
        assert ex.timers[("Order", o.order_id)] == {"credit": PendingTimer(
            key="credit", type="CreditDeadline", target=("Order", o.order_id),
            payload={"order_id": o.order_id}, causation_id=f"{o.order_id}:placed", seq=1,
            after=timedelta(minutes=30))}
    # The OrderCreated messages the first generation emitted are known, not yet applied.
    assert {ex.messages[i].type for i in ex.emitted} == {"OrderCreated"}


def test_the_oracles_timers_are_replaced_cancelled_and_numbered_on_their_own() -> None:
    timers: dict[str, PendingTimer] = {}
    at = datetime(2030, 1, 1, tzinfo=UTC)
    last, removed = apply_timer_ops(timers, [
        Schedule(Emit("Tick", {"n": 1}), key="a", after=timedelta(seconds=5)),
        Schedule(Emit("Ping", {}, to=("Other", "x")), key="b", at=at),
    ], owner=("T", "t-1"), cause="m-1", seq=3)
    assert last == 5 and removed == []
    assert (timers["a"].seq, timers["a"].target, timers["a"].payload) == (4, ("T", "t-1"),
                                                                          {"n": 1})
    assert (timers["b"].seq, timers["b"].target, timers["b"].at) == (5, ("Other", "x"), at)
    first = dict(timers)
    last, removed = apply_timer_ops(timers, [
        Schedule(Emit("Tick", {"n": 2}), key="a", after=timedelta(seconds=9)),
        Cancel("b"), Cancel("never-scheduled"),
    ], owner=("T", "t-1"), cause="m-2", seq=last)
    assert last == 6 and set(timers) == {"a"}  # a Cancel takes no number
    assert removed == [first["a"], first["b"]]  # replaced, cancelled
    assert (timers["a"].seq, timers["a"].payload, timers["a"].causation_id) == (6, {"n": 2},
                                                                                "m-2")


def test_emitted_messages_carry_deterministic_ids_and_sources() -> None:
    sc = generate(ScenarioSpec(customers=2, orders=3, bad_rows=False, seed=1))
    ex = expect(sc.lines, registry)
    created = [m for m in ex.messages.values() if m.type == "OrderCreated"]
    assert len(created) == 3
    for m in created:
        assert m.source is not None and m.source.type == "Order" and m.source.seq == 1
        assert m.message_id == emitted_message_id("Order", m.source.id, f"{m.source.id}:placed",
                                                  0)
    replies = [m for m in ex.messages.values() if m.source and m.source.type == "Customer"]
    for cid in {m.source.id for m in replies if m.source}:
        seqs = sorted(m.source.seq for m in replies if m.source and m.source.id == cid)
        assert seqs == list(range(1, len(seqs) + 1))


def _env(mid: str, mtype: str, atype: str, aid: str, payload: dict[str, object],
         seq: int | None = None) -> str:
    env: dict[str, object] = {"message_id": mid, "type": mtype, "aggregate_type": atype,
                              "aggregate_id": aid, "payload": payload}
    if seq is not None:
        env["source"] = {"type": "Checkout", "id": aid, "seq": seq}
    return envelope_line(env)


def test_an_order_sensitive_input_is_detected() -> None:
    # Two orders of 60 against a limit of 100: which one is approved depends on the order.
    lines = [
        _env("c:reg", "CustomerRegistered", "Customer", "c", {"name": "C", "credit_limit": 100}),
        _env("a:placed", "PlaceOrder", "Order", "a", {"customer_id": "c", "amount": 60}, 1),
        _env("b:placed", "PlaceOrder", "Order", "b", {"customer_id": "c", "amount": 60}, 1),
    ]
    ex = expect(lines, registry)
    assert ex.order_sensitive == [("Customer", "c")]


def test_round_counts_follow_first_sight_of_each_id() -> None:
    sc = generate(ScenarioSpec(customers=3, orders=10, duplicate_rate=0.5, seed=8))
    ex = expect(sc.lines, registry)
    seen: set[str] = set()
    first = expected_round_counts(list(sc.lines), registry, ex, seen=seen)
    assert first.applied == 13 and first.dead_lettered == 4
    assert first.duplicate == sc.duplicates and first.input == len(sc.lines)
    again = expected_round_counts(list(sc.lines), registry, ex, seen=seen)
    # A second delivery of everything: all duplicates, the bad rows dead again.
    assert again.applied == 0 and again.duplicate == 13 + sc.duplicates
    assert again.dead_lettered == 4


def test_classify_names_the_reason_of_each_bad_row() -> None:
    sc = generate(ScenarioSpec(customers=2, orders=2, seed=3))
    for b in sc.bad_rows:
        c = classify(b.line, registry)
        if b.reason == "handler_error":
            assert c.reason is None  # only running the handler tells
        else:
            assert c.reason == b.reason
    truncated = next(b for b in sc.bad_rows if b.reason == "invalid_json")
    assert classify(truncated.line, registry).key.startswith("raw:")


def _pipeline_view(line: str) -> tuple[str | None, dict[str, Any] | None]:
    """How the pipeline classifies ``line``: ``Message.from_dict`` and the registry."""
    try:
        msg = Message.from_dict(json.loads(line))
    except EnvelopeError:
        return Reason.INVALID_ENVELOPE, None
    except ValueError:
        return "invalid_json", None
    env = msg.to_dict()
    if msg.aggregate_type not in registry:
        return Reason.UNKNOWN_AGGREGATE_TYPE, env
    if msg.type not in registry.get(msg.aggregate_type).message_types:
        return Reason.UNKNOWN_MESSAGE_TYPE, env
    return None, env


def _oracle_view(line: str) -> tuple[str | None, dict[str, Any] | None]:
    """The same, by the oracle — its :class:`Envelope` in ``Message.to_dict``'s form."""
    c = classify(line, registry)
    m = c.message
    if m is None:
        return c.reason, None
    env: dict[str, Any] = {"message_id": m.message_id, "type": m.type,
                           "aggregate_type": m.aggregate_type,
                           "aggregate_id": m.aggregate_id, "payload": m.payload}
    if m.occurred_at is not None:
        env["occurred_at"] = m.occurred_at.isoformat()
    if m.source is not None:
        env["source"] = dataclasses.asdict(m.source)
    env.update({k: v for k, v in (("correlation_id", m.correlation_id),
                                  ("causation_id", m.causation_id)) if v is not None})
    if m.headers:
        env["headers"] = m.headers
    return c.reason, env


@pytest.mark.mongo
def test_the_oracles_own_envelope_check_agrees_with_the_pipelines(local_run: LocalRun) -> None:
    """Every line the demo feeds the pipeline — generated, bad on purpose, published by the
    dispatcher and redelivered — is classified alike by the oracle's envelope check and by
    ``Message.from_dict`` with the registry, and read into the same fields."""
    lines = [line for r in local_run.record.rounds for line in r.lines]
    assert any('"causation_id"' in line for line in lines)  # published records are in
    for line in [*lines, *(b.line for b in local_run.scenario.bad_rows)]:
        assert _oracle_view(line) == _pipeline_view(line), line
    assert all(isinstance(m, Envelope) for m in local_run.expected.messages.values())


def _drop_credit_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Message.from_dict

    def lossy(raw: Any, **kw: Any) -> Message:
        msg = original(raw, **kw)
        return dataclasses.replace(msg, payload={k: v for k, v in msg.payload.items()
                                                 if k != "credit_limit"})

    monkeypatch.setattr(Message, "from_dict", staticmethod(lossy))


def _rename_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    # dump_checked is what every dump of the definition goes through (dump itself delegates
    # to it). The batch fold encodes a scalar dataclass state itself (docs/design.md "The
    # batch fold"): the bug is planted where the run then goes, the definition.
    import aggregates.store.nativefold

    monkeypatch.setattr(aggregates.store.nativefold, "NATIVE", None)
    original = StateCodec.dump_checked

    def renaming(self: StateCodec[Any], state: Any, *, check: bool = True) -> dict[str, Any]:
        return {("reserved_credit" if k == "reserved" else k): v
                for k, v in original(self, state, check=check).items()}

    monkeypatch.setattr(StateCodec, "dump_checked", renaming)


@pytest.mark.mongo
@pytest.mark.parametrize(("bug", "must_fail"), [
    # Every CustomerRegistered fails in the pipeline (KeyError): dead letters, no credit.
    (_drop_credit_limit, {check_dead_letters, check_customers, check_orders, check_invariant_1}),
    # The stored state has ``reserved_credit`` where the domain's Customer has ``reserved``.
    (_rename_reserved, {check_customers, check_invariant_1, check_invariant_5}),
], ids=["from_dict-drops-a-payload-field", "codec-dump-renames-a-field"])
def test_a_library_bug_shared_with_the_pipeline_fails_the_checks(
        bug: Callable[[pytest.MonkeyPatch], None], must_fail: set[Callable[[Evidence], Any]],
        monkeypatch: pytest.MonkeyPatch, mongo_client: MongoClient[dict[str, Any]],
        mongo_uri: str, tmp_path: Path) -> None:
    """The oracle does not use what it checks: with a bug patched into
    ``Message.from_dict`` or into ``StateCodec.dump_checked`` for the whole run — pipeline,
    dispatcher, oracle and checks, as in a real demo — the checks FAIL.

    Before the oracle had its own envelope check, handler map and state conversion, it
    parsed lines with the same ``Message.from_dict`` and dumped states with the same
    codec: it made the same mistake as the pipeline (the registrations dead-lettered; the
    state stored as ``reserved_credit``), agreed with the store, and all 12 checks passed.
    """
    bug(monkeypatch)
    run = run_locally(mongo_client, mongo_uri, tmp_path,
                      ScenarioSpec(customers=3, orders=12, seed=4))
    mongo_client.drop_database(run.db.name)  # the checks read the copy in ``run.store``
    ev = Evidence(run.expected, run.store, run.record, run.registry)
    results = run_checks(ev)
    failed = {c.name for c in results if not c.passed}
    assert {fn(ev).name for fn in must_fail} <= failed, results
