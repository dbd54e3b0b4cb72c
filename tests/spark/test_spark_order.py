"""The pipeline's order within an aggregate is :func:`aggregates.fold.ordering.delivery_order`.

:func:`spark.pipeline.order_within_aggregates` (validate → key → repartition → window →
sort, no writer) runs on one DataFrame holding many random aggregates at once; the order it
hands to the executor is compared, aggregate by aggregate, with ``delivery_order`` of the same
messages in input order. Inputs have several sources per aggregate whose ``occurred_at`` goes
backwards within a source, unsourced messages, ties (times, seqs, exact copies), missing and
sub-millisecond times, times before 1970, and invalid rows that must flow through untouched.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from aggregates.fold.ordering import delivery_order
from aggregates.message.envelope import Message
from spark.pipeline import order_within_aggregates
from spark.validate import RegistryInfo, validate
from tests.spark.conftest import PipelineFactory

pytestmark = pytest.mark.spark

INFO = RegistryInfo({"A": ("Evt",), "B": ("Evt",)})
RAW_SCHEMA = "_raw string, _src string, _o1 long, _o2 long"
PARTITIONS = 3
Key = tuple[str, str]

_BASES = (datetime(2026, 1, 1, 10, tzinfo=UTC), datetime(1969, 12, 31, 23, 59, 59, 990_000,
                                                         tzinfo=UTC))


def _time(rng: random.Random, base: datetime) -> Any:
    """An ``occurred_at`` value: missing, JSON null, epoch milliseconds or ISO-8601 text
    (UTC or +02:00, 3 or 6 fraction digits: sub-millisecond parts that tie after truncation)."""
    kind = rng.random()
    if kind < 0.12:
        return ...  # the field is absent
    if kind < 0.17:
        return None
    t = base + timedelta(milliseconds=rng.randint(0, 25))
    if kind < 0.35:
        return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    if rng.random() < 0.4:
        t += timedelta(microseconds=rng.randint(0, 999))
    if rng.random() < 0.3:
        text = t.astimezone(UTC).replace(tzinfo=None) + timedelta(hours=2)
        return text.isoformat(timespec="microseconds") + "+02:00"
    spec = "microseconds" if t.microsecond % 1000 else rng.choice(["milliseconds",
                                                                    "microseconds"])
    return t.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def _aggregate(rng: random.Random, atype: str, aid: str) -> list[dict[str, Any]]:
    """One aggregate's records (envelopes; a few are invalid for validation)."""
    base = rng.choice(_BASES)
    sources = [(t, i) for t in ("S", "T") for i in ("1", "2")][: rng.randint(1, 4)]
    out: list[dict[str, Any]] = []
    for j in range(rng.randint(1, 12)):
        if out and rng.random() < 0.08:  # an exact copy of an earlier record
            out.append(dict(rng.choice(out)))
            continue
        env: dict[str, Any] = {"message_id": f"{atype}{aid}-m{j}", "type": "Evt",
                               "aggregate_type": atype, "aggregate_id": aid, "payload": {}}
        at = _time(rng, base)
        if at is not ...:
            env["occurred_at"] = at
        if rng.random() < 0.75:
            stype, sid = rng.choice(sources)
            env["source"] = {"type": stype, "id": sid, "seq": rng.randint(1, 6)}
        if rng.random() < 0.06:
            # Rejected by validation (no handler), with a source and the latest time: it must
            # not move the valid messages of its source, and it must reach the executor.
            env["type"] = "Unknown"
            env["occurred_at"] = "2999-01-01T00:00:00Z"
        out.append(env)
    return out


@st.composite
def inputs(draw: st.DrawFn) -> list[dict[str, Any] | str]:
    """Records of 25-50 aggregates, interleaved at random, plus a few records without an
    aggregate (invalid JSON, no aggregate id)."""
    rng = draw(st.randoms(use_true_random=False))
    records: list[dict[str, Any] | str] = []
    for k in range(rng.randint(25, 50)):
        records += _aggregate(rng, rng.choice("AB"), f"a{k // 2}")
    records += ["{not json", json.dumps({"message_id": "x", "type": "Evt",
                                         "aggregate_type": "A", "payload": {}})]
    rng.shuffle(records)
    return records


def _ordered(spark: Any, records: list[dict[str, Any] | str]) -> list[dict[str, Any]]:
    """Rows in the order the executor receives them (partition by partition)."""
    from pyspark.sql import functions as F

    rows = [(r if isinstance(r, str) else json.dumps(r), "in.jsonl", 0, i)
            for i, r in enumerate(records)]
    raw = spark.createDataFrame(rows, RAW_SCHEMA)
    ordered = order_within_aggregates(validate(raw, INFO, max_payload_bytes=0), PARTITIONS)
    out = ordered.select("_pa", "_pb", "_reason", "_o2",
                         F.monotonically_increasing_id().alias("_seen"))
    return sorted((r.asDict() for r in out.collect()), key=lambda r: r["_seen"])


def _message_ids(spark: Any, records: list[dict[str, Any] | str]) -> list[str]:
    envelopes = [r for r in records if isinstance(r, dict)]
    assert len(envelopes) == len(records)
    return [envelopes[r["_o2"]]["message_id"] for r in _ordered(spark, records)]


def _expected(records: list[dict[str, Any] | str]) -> dict[Key, list[int]]:
    """Per aggregate: input positions of its valid messages in ``delivery_order``."""
    groups: dict[Key, list[tuple[int, Message]]] = defaultdict(list)
    for pos, r in enumerate(records):
        if isinstance(r, dict) and r["type"] == "Evt":
            m = Message.from_dict(r)
            groups[m.aggregate_key].append((pos, m))
    out: dict[Key, list[int]] = {}
    for key, items in groups.items():
        pos_of = {id(m): pos for pos, m in items}
        out[key] = [pos_of[id(m)] for m in delivery_order([m for _, m in items])]
    return out


def _check(spark: Any, records: list[dict[str, Any] | str]) -> None:
    got_rows = _ordered(spark, records)
    assert sorted(r["_o2"] for r in got_rows) == list(range(len(records)))  # nothing lost
    # Each aggregate's rows are consecutive (the executor folds one aggregate at a time).
    keys = [(r["_pa"], r["_pb"]) for r in got_rows]
    runs = [k for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]]
    assert len(runs) == len(set(runs))
    got: dict[Key, list[int]] = defaultdict(list)
    for r in got_rows:
        if r["_reason"] is None:
            got[(r["_pa"], r["_pb"])].append(r["_o2"])
    expected = _expected(records)
    assert set(got) == set(expected)
    for key, want in expected.items():
        assert got[key] == want, (key, [records[p] for p in want], got[key])


@settings(max_examples=4, deadline=None, derandomize=True,
          phases=(Phase.explicit, Phase.generate),  # shrinking would run hundreds of jobs
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(records=inputs())
def test_spark_order_is_delivery_order(spark_session: Any,
                                       records: list[dict[str, Any] | str]) -> None:
    _check(spark_session, records)


def test_sequence_numbers_of_different_sources_are_not_compared(spark_session: Any) -> None:
    """The old defect: source A's seq 5 at 10:00 went after source B's seq 1 at 10:05."""
    def env(mid: str, sid: str, seq: int, at: str) -> dict[str, Any]:
        return {"message_id": mid, "type": "Evt", "aggregate_type": "A", "aggregate_id": "x",
                "payload": {}, "occurred_at": at,
                "source": {"type": "Src", "id": sid, "seq": seq}}

    records: list[dict[str, Any] | str] = [
        env("b1", "B", 1, "2026-01-01T10:05:00Z"), env("a5", "A", 5, "2026-01-01T10:00:00Z")]
    assert _message_ids(spark_session, records) == ["a5", "b1"]
    _check(spark_session, records)


def test_clock_going_backwards_keeps_the_source_order(spark_session: Any) -> None:
    """Within a source seq order wins over a clock that went backwards; an unsourced message
    is placed by the effective time (10:10 for A's seq 2), not by A's own 09:00."""
    records: list[dict[str, Any] | str] = [
        {"message_id": mid, "type": "Evt", "aggregate_type": "B", "aggregate_id": "y",
         "payload": {}, "occurred_at": at, **({"source": src} if src else {})}
        for mid, at, src in [
            ("a2", "2026-01-01T09:00:00Z", {"type": "S", "id": "A", "seq": 2}),
            ("u", "2026-01-01T10:05:00Z", None),
            ("a1", "2026-01-01T10:10:00Z", {"type": "S", "id": "A", "seq": 1}),
        ]
    ]
    assert _message_ids(spark_session, records) == ["u", "a1", "a2"]
    _check(spark_session, records)


@pytest.mark.mongo
def test_the_window_adds_no_shuffle(spark_session: Any, pipeline: PipelineFactory) -> None:
    """The source window runs after the repartition by aggregate: one Exchange in the plan."""
    raw = spark_session.createDataFrame([("{}", "in.jsonl", 0, 0)], RAW_SCHEMA)
    plan = pipeline().plan(raw)._jdf.queryExecution().executedPlan().toString()
    assert "Window" in plan
    exchanges = [line for line in plan.splitlines() if "Exchange" in line]
    assert len(exchanges) == 1 and "hashpartitioning(_pa" in exchanges[0], plan
