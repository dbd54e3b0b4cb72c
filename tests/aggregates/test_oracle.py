"""Randomized runs against the oracle: duplicates, redeliveries across batches, reorders
across aggregates, crashes mid-batch and injected version conflicts (a rival writer) must
all end in exactly the state, inbox, ``_seq`` and outbox ids of a pure fold of the
deduplicated messages."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient

from aggregates import AggboxSettings, Message, StoreWriter
from aggregates.testing import memory_database
from tests.aggregates.domain import Crash, msg, oracle, process_redelivered, registry, stored
from tests.hypo import examples


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    n_aggs = draw(st.integers(1, 4))
    n_msgs = draw(st.integers(1, 40))
    logical = [msg(f"m{i}", draw(st.integers(0, 20)), agg=f"a{draw(st.integers(0, n_aggs - 1))}")
               for i in range(n_msgs)]
    # Deliveries: every message at least once, some redelivered later, aggregates interleaved.
    deliveries: list[Message] = []
    for m in logical:
        deliveries.append(m)
    redeliver = draw(st.lists(st.integers(0, n_msgs - 1), max_size=n_msgs))
    for i in redeliver:
        pos = draw(st.integers(0, len(deliveries)))
        earliest = deliveries.index(logical[i]) + 1
        deliveries.insert(max(pos, earliest), logical[i])
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(deliveries) - 1)), max_size=4))))
    batches, start = [], 0
    for c in [*cuts, len(deliveries)]:
        if c > start:
            batches.append(deliveries[start:c])
            start = c
    return {
        "deliveries": deliveries,
        "batches": batches,
        "rival_calls": draw(st.sets(st.integers(1, 8), max_size=3)),
        "crash_calls": draw(st.sets(st.integers(1, 8), max_size=2)),
        "slice": draw(st.sampled_from([1, 3, 1000])),
    }


def run_scenario(db: Any, sc: dict[str, Any]) -> None:
    s = AggboxSettings(slice_messages=sc["slice"], chunk_messages=7, chunk_aggregates=3)
    w = StoreWriter(db, registry, settings=s, sleep=lambda _: None)
    w.ensure_indexes()
    rival = StoreWriter(db, registry, settings=s, sleep=lambda _: None)
    calls = {"n": 0}
    current: list[Message] = []

    def interfere(ops: list[Any]) -> None:
        calls["n"] += 1
        if calls["n"] in sc["crash_calls"]:
            raise Crash()
        if calls["n"] in sc["rival_calls"]:
            rival.process(current[: max(1, len(current) // 2)])  # a duplicate task, ahead

    w.before_write = interfere
    for batch in sc["batches"]:
        current[:] = batch
        out = process_redelivered(w, batch)
        assert len([o for o in out if not o.from_parked]) == len(batch)
        assert {o.outcome for o in out} <= {"applied", "duplicate"}
    assert stored(db) == oracle(sc["deliveries"])


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_random_streams_match_oracle_mongomock(sc: dict[str, Any]) -> None:
    run_scenario(memory_database("oracle"), sc)


@pytest.fixture(scope="module")
def oracle_client(mongo_uri: str) -> Any:
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri)
    yield client
    client.close()


@settings(max_examples=examples(30), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(sc=scenarios())
def test_random_streams_match_oracle_local_server(oracle_client: Any, sc: dict[str, Any]) -> None:
    name = f"oracle_{uuid.uuid4().hex[:10]}"
    try:
        run_scenario(oracle_client[name], sc)
    finally:
        oracle_client.drop_database(name)


# -- reorders across sources: contiguous high-water parks gaps and releases them in order --
@st.composite
def source_streams(draw: st.DrawFn) -> dict[str, Any]:
    n_sources = draw(st.integers(1, 3))
    per_source = [draw(st.integers(1, 6)) for _ in range(n_sources)]
    logical = [
        msg(f"s{s}-{q}", 100 * (s + 1) + q, atype="Seq", agg="a1", source=("Up", f"u{s}", q))
        for s, n in enumerate(per_source) for q in range(1, n + 1)
    ]
    deliveries = draw(st.permutations(logical))  # any order across and within sources
    extra = draw(st.lists(st.sampled_from(logical), max_size=len(logical)))
    deliveries = [*deliveries, *extra]  # redeliveries, after the first copies
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(deliveries) - 1)), max_size=3))))
    batches, start = [], 0
    for c in [*cuts, len(deliveries)]:
        if c > start:
            batches.append(deliveries[start:c])
            start = c
    return {"logical": logical, "batches": batches, "per_source": per_source}


def run_sources(db: Any, sc: dict[str, Any]) -> None:
    w = StoreWriter(db, registry, settings=AggboxSettings(chunk_messages=4), sleep=lambda _: None)
    w.ensure_indexes()
    settled: dict[str, str] = {}
    for batch in sc["batches"]:
        for o in w.process(batch):
            assert o.outcome in ("applied", "duplicate", "parked"), o
            if o.outcome == "applied":
                assert o.message_id not in settled, f"{o.message_id} applied twice"
                settled[o.message_id] = o.outcome
    doc = db.seqs.find_one({"_id": "a1"})
    # Every message applied exactly once, nothing left parked, hw at each source's last seq.
    assert sorted(settled) == sorted(m.message_id for m in sc["logical"])
    assert db.aggbox_parked.count_documents({}) == 0
    assert doc["hw"] == {f"Up/u{s}": n for s, n in enumerate(sc["per_source"])}
    assert doc["state"]["total"] == sum(int(m.payload["n"]) for m in sc["logical"])
    # Per source, messages were applied in sequence order (the items keep the order).
    items = doc["state"]["items"]
    for s in range(len(sc["per_source"])):
        mine = [i for i in items if i // 100 == s + 1]
        assert mine == sorted(mine)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=source_streams())
def test_contiguous_high_water_across_reordered_sources_mongomock(sc: dict[str, Any]) -> None:
    run_sources(memory_database("sources"), sc)


@settings(max_examples=examples(20), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(sc=source_streams())
def test_contiguous_high_water_across_reordered_sources_local_server(
        oracle_client: Any, sc: dict[str, Any]) -> None:
    name = f"sources_{uuid.uuid4().hex[:10]}"
    try:
        run_sources(oracle_client[name], sc)
    finally:
        oracle_client.drop_database(name)
