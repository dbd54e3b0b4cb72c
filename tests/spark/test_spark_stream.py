"""Structured Streaming through ``foreachBatch`` (the batch code path): a directory of JSON
Lines files and a real Kafka broker, trigger ``availableNow``, checkpoints that resume."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from aggbox.servers import LocalKafka, create_topic
from aggregates import Message
from aggregates.core.errors import ConfigurationError
from aggregates.fold.ordering import delivery_order
from spark.pipeline import RunResult
from spark.sources import DirectorySource, KafkaSource
from tests.spark.conftest import PipelineFactory
from tests.spark.helpers import assert_matches_oracle, make_records, write_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.mongo]


def in_pipeline_order(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records sorted the way the pipeline orders each aggregate (so that splitting them
    into micro-batches by position keeps every aggregate's order)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["aggregate_type"], r["aggregate_id"]), []).append(r)
    out: list[dict[str, Any]] = []
    for recs in groups.values():
        msgs = [Message.from_dict(r) for r in recs]
        index = {id(m): i for i, m in enumerate(msgs)}
        out.extend(recs[index[id(m)]] for m in delivery_order(msgs))
    return out


def test_directory_stream_available_now(pipeline: PipelineFactory, db: Any,
                                        tmp_path: Path) -> None:
    inbox = tmp_path / "incoming"
    inbox.mkdir()
    files = [make_records(seed=20 + i, accounts=12, ledgers=3, prefix=f"f{i}-")
             for i in range(3)]
    files[2] = files[2] + files[0][:10]  # copies of already processed messages
    for i, recs in enumerate(files):
        write_jsonl(inbox / f"part-{i}.jsonl", recs)
    checkpoint, audit = tmp_path / "checkpoint", tmp_path / "outcomes"
    seen: list[RunResult] = []
    p = pipeline()

    result = p.run_stream(DirectorySource(str(inbox), max_files_per_trigger=1),
                          checkpoint_location=str(checkpoint), trigger="availableNow",
                          outcomes_path=str(audit), on_batch=seen.append)

    assert [b.input_count for b in result.batches] == [len(r) for r in files]
    assert seen == result.batches and all(b.ok for b in result.batches)
    assert result.batches[2].counts["duplicate"] >= 10
    all_records = [r for recs in files for r in recs]
    assert result.input_count == len(all_records)
    assert_matches_oracle(db, all_records)
    assert sorted(x.name for x in audit.iterdir()) == ["batch_id=0", "batch_id=1", "batch_id=2"]

    # A new file later: the same checkpoint picks up only that file.
    extra = make_records(seed=30, accounts=5, ledgers=1, prefix="late-")
    write_jsonl(inbox / "part-3.jsonl", extra)
    again = p.run_stream(DirectorySource(str(inbox)), checkpoint_location=str(checkpoint),
                         trigger="availableNow")
    assert [b.input_count for b in again.batches] == [len(extra)]
    assert_matches_oracle(db, all_records + extra)


def test_a_stream_needs_a_checkpoint(pipeline: PipelineFactory, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="checkpoint"):
        pipeline().run_stream(DirectorySource(str(tmp_path)))


@pytest.mark.kafka
def test_kafka_stream_available_now(pipeline: PipelineFactory, db: Any, tmp_path: Path,
                                    kafka_server: LocalKafka) -> None:
    from confluent_kafka import Producer

    topic = f"aggbox-in-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_server.bootstrap_servers, topic, partitions=2)
    records = in_pipeline_order(make_records(seed=40, accounts=30, ledgers=6))
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap_servers})

    def produce(recs: list[dict[str, Any]], *extra: tuple[str, bytes | None]) -> None:
        for r in recs:
            producer.produce(topic, key=r["aggregate_id"], value=json.dumps(r).encode())
        for key, value in extra:
            producer.produce(topic, key=key, value=value)
        assert producer.flush(30) == 0

    produce(records, ("junk", b'{"message_id": "cut'), ("tombstone", None))
    source = KafkaSource(kafka_server.bootstrap_servers, topic, max_offsets_per_trigger=100)
    checkpoint = str(tmp_path / "checkpoint")
    p = pipeline()

    result = p.run_stream(source, checkpoint_location=checkpoint, trigger="availableNow")

    assert len(result.batches) >= 2, "maxOffsetsPerTrigger splits the backlog"
    assert all(b.ok for b in result.batches)
    assert result.input_count == len(records) + 2
    assert result.counts["dead_lettered"] == 2
    assert result.reasons == {("dead_lettered", "invalid_json"): 2}
    unique = len({r["message_id"] for r in records})
    assert result.counts["applied"] == unique
    assert result.counts["duplicate"] == len(records) - unique
    assert_matches_oracle(db, records)

    # More messages later: the checkpoint resumes after the last consumed offsets.
    more = in_pipeline_order(make_records(seed=41, accounts=10, ledgers=2, prefix="more-"))
    produce(more)
    again = p.run_stream(source, checkpoint_location=checkpoint, trigger="availableNow")
    assert again.input_count == len(more)
    assert again.counts["dead_lettered"] == 0
    assert_matches_oracle(db, records + more)
