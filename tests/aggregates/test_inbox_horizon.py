"""The inbox dedup guarantee (docs/design.md "Dedup"), shown by randomized runs:

    A message that was never applied is refused only when it occurred more than the dedup
    horizon ago; no message is ever applied twice.

Scenarios: bursts of 1–20× the window per aggregate from several producers whose
``occurred_at`` go backwards and forwards, redeliveries at random later points (within the
horizon), every batch re-run concurrently by a second writer (version conflicts, archive
look-ups after re-reads), crashes between read and write, and messages older than the
horizon. Each batch is put in the pipeline's order (:func:`aggregates.fold.ordering.delivery_order`)
first. The expected state is :func:`tests.aggregates.domain.oracle`, which shares no code with
the writer: dedup by id, first occurrence wins.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient

from aggregates import AggboxSettings, Inbox, Message, Registry, StoreWriter
from aggregates.core.reasons import Reason
from aggregates.fold.ordering import delivery_order
from aggregates.testing import AggregateHarness, memory_database
from tests.aggregates.domain import Crash, make_counter, msg, oracle, process_redelivered, stored
from tests.hypo import examples

HORIZON = timedelta(days=7)
#: The writers' clock: the real one (the servers' TTL monitors use it), fixed per module.
NOW = datetime.now(UTC).replace(microsecond=0)
#: How often :func:`run_writers` redelivers the messages still parked after version
#: conflicts once the rival writer is gone (one pass should settle them all).
REDELIVERIES = 5




def counters_with(window: int, lookup: Any = "by_time") -> Registry:
    return Registry([make_counter("Counter", dedup=Inbox(window=window, horizon=HORIZON,
                                                         lookup=lookup))])


@st.composite
def scenarios(draw: st.DrawFn, *, max_window: int = 50, max_total: int = 400,
              restamp: bool = False) -> dict[str, Any]:
    """``restamp``: every redelivery carries a new ``occurred_at`` (its producer re-stamps it
    when it resends), newer than any first delivery — for ``Inbox(lookup="always")``."""
    window = draw(st.integers(2, max_window))
    n_aggs = draw(st.integers(1, 3))
    logical: list[Message] = []
    for a in range(n_aggs):
        burst = min(max_total // n_aggs, window * draw(st.integers(1, 20)))
        producers = draw(st.integers(1, 5))
        for i in range(burst):
            p = draw(st.integers(0, producers - 1))
            # Disordered producer clocks: anywhere in the last 6 days, to the second.
            age = draw(st.integers(60, 6 * 86400))
            at = (NOW - timedelta(seconds=age)).isoformat()
            logical.append(msg(f"a{a}-p{p}-{i}", draw(st.integers(1, 20)), agg=f"a{a}", at=at,
                               source=("Payer", f"p{p}-{a}", i + 1)))
    old = draw(st.lists(st.integers(1, 30), max_size=3))  # days beyond the horizon
    for k, days in enumerate(old):
        at = (NOW - HORIZON - timedelta(days=days)).isoformat()
        logical.append(msg(f"old-{k}", 1, agg="a0", at=at))
    order = draw(st.permutations(range(len(logical))))
    deliveries = [logical[i] for i in order]
    # Redeliveries at random later points (a delay of up to the whole run).
    for i in draw(st.lists(st.integers(0, len(logical) - 1), max_size=len(logical) // 2)):
        first = deliveries.index(logical[i])
        copy = logical[i]
        if restamp and not copy.message_id.startswith("old-"):
            copy = replace(copy, occurred_at=NOW - timedelta(seconds=draw(st.integers(0, 50))))
        deliveries.insert(draw(st.integers(first + 1, len(deliveries))), copy)
    n_batches = draw(st.integers(1, 6))
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(deliveries) - 1)),
                                min_size=n_batches - 1, max_size=n_batches - 1)))
    batches, start = [], 0
    for c in [*cuts, len(deliveries)]:
        if c > start:
            batches.append(_pipeline_order(deliveries[start:c]))
            start = c
    return {
        "window": window,
        "logical": logical,
        "old": {m.message_id for m in logical if m.message_id.startswith("old-")},
        "batches": batches,
        "slice": draw(st.sampled_from([1, 2, 7, 1000])),
        "rerun_calls": draw(st.sets(st.integers(1, 12), max_size=4)),
        "crash_calls": draw(st.sets(st.integers(1, 12), max_size=2)),
        "lookup": "always" if restamp else "by_time",
    }


def _pipeline_order(batch: list[Message]) -> list[Message]:
    by_agg: dict[str, list[Message]] = defaultdict(list)
    for m in batch:
        by_agg[m.aggregate_id].append(m)
    return [m for agg in sorted(by_agg) for m in delivery_order(by_agg[agg])]


def check(sc: dict[str, Any], applied: list[str], refused: dict[str, str],
          recorded: set[str], final: dict[str, Any]) -> None:
    """``applied``: the ids reported ``applied`` (a crashed attempt's reports are lost, so
    its effects come back as ``duplicate``); ``recorded``: the ids the store remembers
    (inbox and archive); ``final``: the stored states."""
    # No message reported applied twice.
    assert len(applied) == len(set(applied)), "a message was applied twice"
    assert set(applied) <= recorded
    # Nothing refused unless older than the horizon (and never applied).
    assert set(refused) <= sc["old"] - recorded, f"refused: {refused}"
    assert set(refused.values()) <= {Reason.BEYOND_DEDUP_HORIZON}
    # Every message within the horizon was applied.
    within = {m.message_id for m in sc["logical"]} - sc["old"]
    assert within <= recorded, f"never applied: {sorted(within - recorded)[:5]}"
    # The state is the oracle's fold of the recorded messages, in first-delivery order
    # (every n ≥ 1, so a message applied twice, or recorded but not applied, shows).
    order = [m for b in sc["batches"] for m in b if m.message_id in recorded]
    expected = oracle(order)
    assert {k: (v.total, v.items, v.seq) for k, v in final.items()} == \
        {k: (v.total, v.items, v.seq) for k, v in expected.items()}


def recorded_ids(db: Any) -> set[str]:
    ids = {str(e[0]) for d in db.counters.find() for e in d.get("inbox", [])}
    return ids | {str(d["m"]) for d in db.counters_inbox_archive.find()}


def run_writers(db: Any, sc: dict[str, Any], *, pipeline_depth: int = 2) -> None:
    reg = counters_with(sc["window"], sc["lookup"])
    s = AggboxSettings(slice_messages=sc["slice"], chunk_messages=9, chunk_aggregates=2,
                       pipeline_depth=pipeline_depth)
    w = StoreWriter(db, reg, settings=s, sleep=lambda _: None, clock=lambda: NOW)
    w.ensure_indexes()
    rival = StoreWriter(db, reg, settings=s, sleep=lambda _: None, clock=lambda: NOW)
    calls = {"n": 0}
    current: list[Message] = []
    applied: list[str] = []
    refused: dict[str, str] = {}

    #: Messages parked after too many version conflicts in a row: the rival writer's many
    #: small writes to one aggregate can outlast the retries (no backoff sleep here), which
    #: a busy machine makes likelier. They are redelivered at the end, as the broker would.
    #: A message leaves this map on any report that it is in the store: ``applied``, or
    #: ``duplicate`` (the rival applied it while it was being parked; docs/design.md
    #: "Parking and blocking": a redelivery settles a conflict-parked message either way).
    conflicted: dict[str, Message] = {}
    last: dict[str, str] = {}  # message id → its last outcome (for the failure message)

    def note(outcomes: list[Any]) -> None:
        for o in outcomes:
            last[o.message_id] = f"{o.outcome} {o.reason or ''}".strip()
            if o.outcome == "applied":
                applied.append(o.message_id)
                conflicted.pop(o.message_id, None)
            elif o.outcome == "dead_lettered":
                refused[o.message_id] = o.reason
            elif o.outcome == "parked":
                assert o.reason == Reason.VERSION_CONFLICT_RETRIES_EXHAUSTED, o
                conflicted[o.message_id] = by_id[o.message_id]
            else:
                assert o.outcome == "duplicate", o
                conflicted.pop(o.message_id, None)

    def interfere(ops: list[Any]) -> None:
        calls["n"] += 1
        if calls["n"] in sc["crash_calls"]:
            raise Crash()
        if calls["n"] in sc["rerun_calls"]:
            note(rival.process(current))  # the same batch, run concurrently (and ahead)

    by_id = {m.message_id: m for b in sc["batches"] for m in b}
    w.before_write = interfere
    for batch in sc["batches"]:
        current[:] = batch
        out = process_redelivered(w, batch)
        assert len([o for o in out if not o.from_parked]) == len(batch)
        note(out)
    w.before_write = None
    # The rival is gone: one redelivery settles every conflict-parked message (its parked
    # copy comes back applied or duplicate, the redelivered copy duplicate); a few passes
    # at most, never an endless loop.
    for _ in range(REDELIVERIES):
        if not conflicted:
            break
        note(w.process(list(conflicted.values())))
    assert not conflicted, (
        f"{len(conflicted)} message(s) still parked after {REDELIVERIES} redeliveries: "
        + ", ".join(f"{i} ({last.get(i)})" for i in sorted(conflicted)[:10]))
    assert db[s.parked_collection].count_documents({}) == 0, \
        [p["_id"] for p in db[s.parked_collection].find().limit(10)]
    check(sc, applied, refused, recorded_ids(db), stored(db))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(sc=scenarios())
def test_inbox_never_refuses_a_new_message_within_the_horizon_mongomock(
        sc: dict[str, Any]) -> None:
    # mongomock is not thread-safe: one chunk at a time (the local server runs two).
    run_writers(memory_database("horizon"), sc, pipeline_depth=1)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=list(HealthCheck))
@given(sc=scenarios(max_total=250, restamp=True))
def test_lookup_always_catches_redeliveries_with_a_new_occurred_at_mongomock(
        sc: dict[str, Any]) -> None:
    """Inbox(lookup="always"): the same guarantee when producers re-stamp what they resend."""
    run_writers(memory_database("horizon"), sc, pipeline_depth=1)


def test_a_restamped_redelivery_after_eviction_needs_lookup_always() -> None:
    """By time (the default), a copy re-stamped newer than everything archived is not looked
    up and is applied again (the documented precondition); with lookup="always" it is a
    duplicate."""
    first = [msg(f"m{i}", i + 1, at=(NOW - timedelta(hours=5 - i)).isoformat())
             for i in range(4)]
    again = replace(first[0], occurred_at=NOW - timedelta(seconds=5))
    applied = {}
    for lookup in ("by_time", "always"):
        db = memory_database(f"restamp_{lookup}")
        w = StoreWriter(db, counters_with(2, lookup), sleep=lambda _: None, clock=lambda: NOW)
        w.ensure_indexes()
        for m in first:  # one write each: m0 and m1 leave the inbox (window 2)
            assert w.process([m])[0].outcome == "applied"
        assert db.counters_inbox_archive.count_documents({}) == 2
        applied[lookup] = w.process([again])[0].outcome
    assert applied == {"by_time": "applied", "always": "duplicate"}


@pytest.fixture(scope="module")
def horizon_client(mongo_uri: str) -> Any:
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri)
    yield client
    client.close()


@settings(max_examples=examples(15), deadline=None, suppress_health_check=list(HealthCheck))
@given(sc=scenarios(max_total=200))
def test_inbox_never_refuses_a_new_message_within_the_horizon_local_server(
        horizon_client: Any, sc: dict[str, Any]) -> None:
    name = f"horizon_{uuid.uuid4().hex[:10]}"
    try:
        run_writers(horizon_client[name], sc)
    finally:
        horizon_client.drop_database(name)


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=list(HealthCheck))
@given(sc=scenarios(max_window=12, max_total=120))
def test_inbox_never_refuses_a_new_message_in_memory(sc: dict[str, Any]) -> None:
    """The same property through the in-memory harness (the fold with an in-memory archive),
    for many more scenarios than a store allows in CI time."""
    atype = counters_with(sc["window"]).get("Counter")
    harnesses: dict[str, AggregateHarness[Any]] = {}
    applied: list[str] = []
    refused: dict[str, str] = {}
    for batch in sc["batches"]:
        for m in batch:
            h = harnesses.setdefault(m.aggregate_id, AggregateHarness(
                atype, aggregate_id=m.aggregate_id, check_determinism=False, now=NOW))
            step = h.when(m)
            if step.outcome == "applied":
                applied.append(m.message_id)
            elif step.outcome == "dead_lettered":
                refused[m.message_id] = str(step.reason)
    final: dict[str, Any] = {}
    recorded: set[str] = set()
    for agg, h in harnesses.items():
        recorded |= {str(e[0]) for e in h.snapshot.dedup.inbox} | set(h.snapshot.dedup.archived)
        st_ = h.snapshot.state or {}
        if st_:
            final[agg] = type("E", (), {"total": st_["total"], "items": list(st_["items"]),
                                       "seq": h.snapshot.seq})()
    check(sc, applied, refused, recorded, final)


def test_a_burst_far_above_the_window_applies_every_new_message() -> None:
    """One aggregate, window 2, 2,000 new messages from 40 producers whose clocks disagree by
    up to a day, delivered in three batches, each batch then redelivered whole."""
    db = memory_database("burst")
    reg = counters_with(2)
    w = StoreWriter(db, reg, settings=AggboxSettings(slice_messages=50), clock=lambda: NOW)
    w.ensure_indexes()
    ms = [msg(f"b{i}", 1, agg="hot", source=("Payer", f"p{i % 40}", i // 40 + 1),
              at=(NOW - timedelta(seconds=(i * 7919) % 86400)).isoformat())
          for i in range(2000)]
    batches = [_pipeline_order(ms[k:k + 700]) for k in range(0, 2000, 700)]
    for b in batches:
        assert {o.outcome for o in w.process(b)} == {"applied"}
    for b in batches:
        assert {o.outcome for o in w.process(b)} == {"duplicate"}
    doc = db.counters.find_one({"_id": "hot"})
    assert doc["state"]["total"] == 2000
    assert len(doc["inbox"]) <= 50  # the window, plus at most one slice of new ids
    assert db.counters_inbox_archive.count_documents({}) >= 1950


def test_five_credits_from_five_payers_are_all_applied_in_a_pure_replay() -> None:
    """The reproduction from the issue, without a server: window 3; five new credits whose
    occurred_at (the payers' write times) are 900, 400, 950, 980, 500 ms after t0, in the
    pipeline's order. The fifth used to be dead-lettered beyond_dedup_horizon."""
    from aggregates.debug import replay_steps

    atype = counters_with(3).get("Counter")
    t0 = NOW - timedelta(minutes=1)
    batch = [msg(f"credit-{i}", 10, agg="acct", source=("Account", f"payer-{i}", i + 1),
                 at=(t0 + timedelta(milliseconds=ms)).isoformat())
             for i, ms in enumerate((900, 400, 950, 980, 500))]
    # In the old pipeline order (by source.seq) as in the report, and in today's order.
    ordered = delivery_order(batch)
    assert [m.message_id for m in ordered] == [
        "credit-1", "credit-4", "credit-0", "credit-2", "credit-3"]
    for delivery in (batch, ordered):
        run = replay_steps(atype, delivery + batch, now=NOW)
        assert [s.outcome for s in run.steps] == ["applied"] * 5 + ["duplicate"] * 5
        assert run.state.total == 50
        assert len(run.snapshot.dedup.inbox) == 3 and len(run.snapshot.dedup.archived) == 2
