"""The oracle: independent of the generator's bookkeeping, yet it agrees with it; it notices
an order-sensitive input; it predicts each round's outcome counts."""

from __future__ import annotations

from aggbox.demo.generate import ScenarioSpec, envelope_line, generate
from aggbox.demo.oracle import classify, expect, expected_round_counts
from aggregates.ids import emitted_message_id
from examples.orders import registry


def test_oracle_agrees_with_the_generators_plan() -> None:
    sc = generate(ScenarioSpec(customers=12, orders=150, seed=21))
    ex = expect(sc.lines, registry)
    assert ex.order_sensitive == []
    for o in sc.orders:
        assert ex.states[("Order", o.order_id)] == {
            "customer_id": o.customer_id, "amount": o.amount, "status": o.expected_status}
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
    assert all(ex.seq[("Order", o.order_id)] == 1 for o in sc.orders)


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
