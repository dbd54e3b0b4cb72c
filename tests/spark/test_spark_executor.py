"""The executor-side writer function called directly (no Spark): Arrow batches in, outcome
batches out; an aggregate spanning two Arrow batches is carried over and written once."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from aggregates.core.settings import AggboxSettings
from aggregates.store.writer import StoreWriter
from spark.executor import WriterTask, get_client, write_partition
from spark.schema import OUTCOME_COLUMNS
from tests.spark import domain
from tests.spark.helpers import at

pytestmark = pytest.mark.mongo


def rows(aid: str, n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"_raw": json.dumps({
        "message_id": f"{aid}-{i}", "type": "Deposited", "aggregate_type": "Account",
        "aggregate_id": aid, "payload": {"amount": i}, "occurred_at": at(i)}),
        "_reason": None, "_detail": None, "_mid": f"{aid}-{i}", "_atype": "Account",
        "_aid": aid} for i in range(start, start + n)]


def batch(items: list[dict[str, Any]]) -> Any:
    names = ["_raw", "_reason", "_detail", "_mid", "_atype", "_aid"]
    return pa.RecordBatch.from_arrays(
        [pa.array([r[k] for r in items], type=pa.string()) for k in names], names=names)


def run(db: Any, uri: str, batches: list[Any], carry_over_max: int) -> list[dict[str, Any]]:
    settings = AggboxSettings.load(mongodb_uri=uri, database=db.name)
    StoreWriter(db, domain.registry, settings=settings).ensure_indexes()
    task = WriterTask(mongodb_uri=uri, aggregates="tests.spark.domain",
                      settings=settings.model_dump(), carry_over_max=carry_over_max)
    out: list[dict[str, Any]] = []
    for b in write_partition(task, iter(batches)):
        assert b.schema.names == list(OUTCOME_COLUMNS)
        out.extend(b.to_pylist())
    return out


@pytest.mark.parametrize(("carry_over_max", "writes"), [(5_000, 1), (0, 2)])
def test_an_aggregate_spanning_two_arrow_batches(db: Any, mongo_uri: str,
                                                 carry_over_max: int, writes: int) -> None:
    first = rows("a", 3) + rows("b", 3)
    second = rows("b", 2, start=3) + rows("c", 2)
    out = run(db, mongo_uri, [batch(first), batch(second)], carry_over_max)

    assert sorted(o["message_id"] for o in out) == sorted(r["_mid"] for r in first + second)
    assert {o["outcome"] for o in out} == {"applied"}
    docs = {d["_id"]: d for d in db.accounts.find()}
    assert docs["b"]["state"]["count"] == 5
    assert [e[0] for e in docs["b"]["inbox"]] == [f"b-{i}" for i in range(5)]
    assert docs["b"]["_v"] == writes  # carried over: one write; otherwise one per batch
    assert docs["a"]["_v"] == docs["c"]["_v"] == 1


def test_the_mongo_client_is_cached_per_worker(mongo_uri: str) -> None:
    assert get_client(mongo_uri) is get_client(mongo_uri)


def test_rows_flagged_in_spark_become_dead_letters(db: Any, mongo_uri: str) -> None:
    bad = {"_raw": '{"message_id": "x"', "_reason": "invalid_json", "_detail": "not JSON",
           "_mid": None, "_atype": None, "_aid": None}
    unknown = {"_raw": json.dumps({"message_id": "u1", "type": "Nope", "aggregate_type": "Account",
                                   "aggregate_id": "a", "payload": {}}),
               "_reason": "unknown_message_type", "_detail": "no handler", "_mid": "u1",
               "_atype": "Account", "_aid": "a"}
    out = run(db, mongo_uri, [batch([bad, unknown, *rows("a", 1)])], 5_000)

    by_reason = {o["reason"]: o for o in out}
    assert by_reason["invalid_json"]["message_id"].startswith("raw:")
    assert by_reason["unknown_message_type"]["message_id"] == "u1"
    letters = {d["reason"]: d for d in db.aggbox_dead_letters.find()}
    assert letters["invalid_json"]["raw"] == bad["_raw"]
    # A valid envelope is kept as a message (replayable), keyed like the writer's own.
    assert letters["unknown_message_type"]["message"]["message_id"] == "u1"
    assert letters["unknown_message_type"]["_id"] == "Account/a/u1"


def test_the_executor_decides_what_spark_read_as_text(db: Any, mongo_uri: str) -> None:
    """Spark reads the routing fields as text (17 and "17" alike); the outcome row's ids and
    the exact reason come from the executor's own parse, whatever Spark flagged."""
    def row(envelope: Any, reason: str | None = None) -> dict[str, Any]:
        return {"_raw": json.dumps(envelope), "_reason": reason,
                "_detail": "spark's guess" if reason else None}

    base = {"type": "Deposited", "aggregate_type": "Account", "aggregate_id": "a",
            "payload": {"amount": 1}}
    numeric_id = row({**base, "message_id": 17})
    numeric_aggregate = row({**base, "message_id": "n1", "aggregate_id": 17})
    flagged = row({**base, "message_id": "p1", "payload": [1]}, "invalid_envelope")
    deep = row({**base, "message_id": "d1", "payload": {"k": [1]}})
    deep["_raw"] = deep["_raw"].replace("[1]", "[" * 80 + "1" + "]" * 80)
    names = ["_raw", "_reason", "_detail"]
    items = [numeric_id, numeric_aggregate, flagged, deep]
    arrow = pa.RecordBatch.from_arrays(
        [pa.array([r[k] for r in items], type=pa.string()) for k in names], names=names)
    out = {o["detail"]: o for o in run(db, mongo_uri, [arrow], 5_000)}

    assert len(out) == 4 and {o["outcome"] for o in out.values()} == {"dead_lettered"}
    numeric = next(o for d, o in out.items() if "'message_id': must be a string, got int" in d)
    assert numeric["message_id"].startswith("raw:") and numeric["aggregate_id"] == "a"
    agg = next(o for d, o in out.items() if "'aggregate_id': must be a string, got int" in d)
    assert agg["message_id"] == "n1" and not agg["aggregate_id"]  # no string id: none
    payload = next(o for d, o in out.items() if "'payload': must be a JSON object" in d)
    assert payload["message_id"] == "p1" and payload["reason"] == "invalid_envelope"
    too_deep = next(o for d, o in out.items() if "levels deep" in d)
    # never decoded (the depth is counted first): its id is its bytes' hash
    assert too_deep["reason"] == "payload_too_deep"
    assert too_deep["message_id"].startswith("raw:")
    assert not any("spark's guess" in d for d in out)
