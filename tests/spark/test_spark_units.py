"""Pure pieces of the pipeline package: schema derivation, settings, master strings, input
format detection (no Spark session, no server)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import MapType, StringType, StructType, TimestampType

from aggregates.core.errors import ConfigurationError
from aggregates.message.envelope import ENVELOPE_FIELDS
from aggregates.message.outcomes import Outcome
from spark.schema import OUTCOME_COLUMNS, envelope_schema, outcome_columns, outcome_row
from spark.session import kafka_package, kafka_token_provider_fallback, local_master
from spark.settings import SparkSettings
from spark.sources import detect_format
from tests.spark.helpers import write_parquet


def test_envelope_schema_is_derived_from_the_shared_table() -> None:
    schema = envelope_schema()
    assert schema.fieldNames() == list(ENVELOPE_FIELDS)
    fields = {f.name: f for f in schema.fields}
    for name, (_, required) in ENVELOPE_FIELDS.items():
        assert fields[name].nullable is (not required), name
    assert isinstance(fields["payload"].dataType, StringType)  # JSON text
    assert isinstance(fields["occurred_at"].dataType, TimestampType)
    assert isinstance(fields["source"].dataType, StructType)
    assert isinstance(fields["headers"].dataType, MapType)


def test_outcome_rows_follow_the_outcome_schema() -> None:
    o = Outcome("m1", "Account", "a1", "applied", None, None, ("e1", "e2"), 2)
    row = outcome_row(o, task_attempt=1)
    assert dict(zip(OUTCOME_COLUMNS, row, strict=True)) == {
        "message_id": "m1", "aggregate_type": "Account", "aggregate_id": "a1",
        "outcome": "applied", "reason": None, "detail": None, "emitted_ids": ["e1", "e2"],
        "attempt": 2, "from_parked": False, "task_attempt": 1, "message_type": None}
    assert outcome_row(o, task_attempt=1, message_type="Deposit")[-1] == "Deposit"


def test_outcome_columns_are_the_outcome_rows_by_column() -> None:
    outcomes = [Outcome("m1", "Account", "a1", "applied", None, None, ("e1", "e2"), 2),
                Outcome("m2", "", "", "dead_lettered", "invalid_json", "not JSON"),
                Outcome("m3", "Account", "a2", "duplicate", from_parked=True)]
    rows = [outcome_row(o, task_attempt=3) for o in outcomes]
    columns = outcome_columns(outcomes, task_attempt=3)
    assert len(columns) == len(OUTCOME_COLUMNS)
    assert [[list(v) if isinstance(v, tuple) else v for v in c] for c in columns] == [
        list(c) for c in zip(*rows, strict=True)]
    assert outcome_columns([], task_attempt=0) == [[] for _ in OUTCOME_COLUMNS]
    typed = outcome_columns(outcomes, task_attempt=3, message_types={"m1": "Deposit"})
    assert typed[OUTCOME_COLUMNS.index("message_type")] == ["Deposit", None, None]
    assert OUTCOME_COLUMNS[-1] == "message_type"


@pytest.mark.parametrize(("master", "expected"), [
    ("local[2]", "local[2, 4]"), ("local[*]", "local[*, 4]"), ("local[2, 8]", "local[2, 8]"),
    ("yarn", "yarn"), ("spark://h:7077", "spark://h:7077"),
])
def test_local_masters_retry_failed_tasks(master: str, expected: str) -> None:
    assert local_master(master, 4) == expected


def test_kafka_package_matches_pyspark() -> None:
    import pyspark

    assert kafka_package() == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"
    assert kafka_token_provider_fallback() == ".".join(pyspark.__version__.split(".")[:2]) + ".0"
    pinned = SparkSettings.load(kafka_package="g:a:1")
    assert kafka_package(pinned) == "g:a:1"


def test_settings_come_from_file_then_environment_then_arguments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "aggbox.toml"
    config.write_text('[spark]\nshuffle_partitions = 7\naggregates = "from.file"\n'
                      'conf = { "spark.executor.memory" = "2g" }\n')
    monkeypatch.setenv("AGGBOX_SPARK_AGGREGATES", "from.env")
    s = SparkSettings.load(config_file=config)
    assert (s.shuffle_partitions, s.aggregates) == (7, "from.env")
    assert s.conf == {"spark.executor.memory": "2g"}
    assert SparkSettings.load(config_file=config, aggregates="from.args").aggregates == "from.args"
    config.write_text("[spark]\nno_such_setting = 1\n")
    with pytest.raises(ConfigurationError, match="no_such_setting"):
        SparkSettings.load(config_file=config)


def test_input_format_detection(tmp_path: Path) -> None:
    assert detect_format("in/*.jsonl") == "json"
    assert detect_format("in/part-0.parquet") == "parquet"
    assert detect_format("in/*.parquet") == "parquet"
    pq_dir = tmp_path / "pq"
    pq_dir.mkdir()
    write_parquet(pq_dir / "a.parquet", [])
    assert detect_format(str(pq_dir)) == "parquet"
    assert detect_format(str(tmp_path)) == "parquet"  # partitioned: one level down
    json_dir = tmp_path / "js"
    json_dir.mkdir()
    (json_dir / "a.jsonl").write_text("{}\n")
    assert detect_format(str(json_dir)) == "json"


def test_executor_counts_equal_the_group_by_of_the_outcome_rows() -> None:
    """with_stats (the executors' counts, issue 25) gives what the group-by over the outcome
    rows gave: the partition's counts on its last row only, the batches otherwise as they
    were."""
    import pyarrow as pa

    from spark.executor import STATS_COLUMN, with_stats
    from spark.results import _fold, counts_from_stats

    rows = [("applied", False, None, "A", "X"), ("applied", False, None, "A", "X"),
            ("dead_lettered", False, "invalid_json", None, None),
            ("parked", False, "busy", "A", "Y"), ("applied", True, None, "A", None)]
    batches = [pa.RecordBatch.from_arrays(
        [pa.array([str(i) for i in range(len(part))]),
         *[pa.array(list(c)) for c in zip(*part, strict=True)]],
        names=["message_id", "outcome", "from_parked", "reason", "aggregate_type",
               "message_type"]) for part in (rows[:3], rows[3:])]
    out = list(with_stats(iter(batches)))
    assert [b.num_rows for b in out] == [3, 2]
    stats = [v for b in out for v in b.column(STATS_COLUMN).to_pylist()]
    assert stats[:-1] == [None] * 4 and stats[-1] is not None
    for before, after in zip(batches, out, strict=True):
        assert after.drop_columns([STATS_COLUMN]).equals(before)
    expected = _fold((*r, 1) for r in rows)
    got = counts_from_stats([stats[-1]])
    assert got[:3] == expected[:3]
    # The dead-lettered and parked rows' reasons come with a sample: message id and detail
    # (the batches have no detail column: None).
    assert got[3] == {("dead_lettered", "invalid_json"): ("2", None),
                      ("parked", "busy"): ("0", None)}
    counts, reasons, by_type, _ = expected
    assert by_type[("A", "X", "applied", "")] == 2
    assert counts["applied"] == 2 and counts["released_applied"] == 1 and counts["total"] == 4
    assert reasons == {("dead_lettered", "invalid_json"): 1, ("parked", "busy"): 1}
    assert list(with_stats(iter([]))) == []
