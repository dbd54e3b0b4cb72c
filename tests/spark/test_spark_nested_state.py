"""The state codec through ``aggbox run``'s pipeline: a nested, typed state applies three
messages in a row, each handler reading ``state.address.city`` (the stored state comes back
as the dataclasses, not as dicts and lists)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from bson.decimal128 import Decimal128

from aggregates import AggboxSettings
from spark.pipeline import Pipeline
from spark.settings import SparkSettings

pytestmark = [pytest.mark.spark, pytest.mark.mongo]


def test_a_nested_state_applies_three_messages_in_a_row(
        spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path) -> None:
    settings = AggboxSettings.load(mongodb_uri=mongo_uri, database=db.name)
    pipe = Pipeline(spark_session, aggregates="tests.spark.nested", settings=settings,
                    spark_settings=SparkSettings.load(shuffle_partitions=2),
                    mongodb_uri=mongo_uri)
    for i, city in enumerate(["Oslo", "Lima", "Pune"]):
        line = {"message_id": f"mv-{i}", "type": "Moved", "aggregate_type": "Customer",
                "aggregate_id": "c-1", "payload": {"city": city, "credit": "1.10"},
                "occurred_at": f"2026-0{i + 1}-01T00:00:00.123Z"}
        path = tmp_path / f"{i}.jsonl"
        path.write_text(json.dumps(line) + "\n")
        result = pipe.run_batch([str(path)])  # one message per run: each reads the last
        assert result.counts.get("applied") == 1, result.reasons
    doc = db.nested_customers.find_one({"_id": "c-1"})
    state = doc["state"]
    assert state["address"] == {"city": "Pune"}
    assert state["tags"] == ["left:-", "left:Oslo", "left:Lima"]
    assert state["credit"] == Decimal128(Decimal("3.30"))
    assert state["moved_at"].replace(tzinfo=UTC) == datetime(2026, 3, 1, 0, 0, 0, 123000,
                                                             tzinfo=UTC)
