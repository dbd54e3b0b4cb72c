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
