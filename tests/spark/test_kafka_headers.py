"""Kafka record headers ``traceparent``/``tracestate`` reach the envelope's headers (and so the
outbox entries it causes) unless the envelope has its own trace context; the raw record and
its one outcome are unchanged (spark/sources.py, spark.messages.with_record_trace)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from aggbox.servers import LocalKafka, create_topic
from spark.messages import with_record_trace
from spark.sources import KafkaSource
from tests.spark.conftest import PipelineFactory

RECORD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
RECORD_2 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OWN = "00-11111111111111111111111111111111-2222222222222222-01"


def _deposit(mid: str, account: str, **extra: Any) -> bytes:
    return json.dumps({"message_id": mid, "type": "Deposited", "aggregate_type": "Account",
                       "aggregate_id": account, "payload": {"amount": 100}, **extra}).encode()


@pytest.mark.spark
@pytest.mark.mongo
@pytest.mark.kafka
def test_kafka_record_trace_headers_continue_the_trace(
    pipeline: PipelineFactory, db: Any, tmp_path: Path, kafka_server: LocalKafka,
) -> None:
    from confluent_kafka import Producer

    topic = f"aggbox-trace-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_server.bootstrap_servers, topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap_servers})
    sent: list[tuple[bytes | None, list[tuple[str, str | bytes | None]]]] = [
        # no envelope headers: the record's trace context fills them in
        (_deposit("m-a", "acc-a"),
         [("traceparent", RECORD.encode()), ("tracestate", b"congo=t61rcWkgMzE"),
          ("baggage", b"user=1")]),
        # the envelope's own traceparent wins (and the record's tracestate is not mixed in)
        (_deposit("m-b", "acc-b", headers={"traceparent": OWN, "x": "1"}),
         [("traceparent", RECORD_2.encode()), ("tracestate", b"rojo=00f067aa0ba902b7")]),
        # record headers that are not UTF-8 / not a traceparent: nothing is carried
        (_deposit("m-c", "acc-c"), [("traceparent", b"\xff\xfe" + RECORD.encode()[2:])]),
        (_deposit("m-d", "acc-d"), [("traceparent", b"00-not-a-trace")]),
        # not JSON, with a trace header: still exactly one dead letter, raw bytes kept
        (b"not json {", [("traceparent", RECORD.encode())]),
        # a JSON value that is not an object: dead-lettered as before
        (b"[1, 2]", [("traceparent", RECORD.encode())]),
        # a tombstone
        (None, [("traceparent", RECORD.encode())]),
    ]
    for value, headers in sent:
        producer.produce(topic, key=b"k", value=value, headers=headers)
    assert producer.flush(30) == 0

    result = pipeline().run_stream(
        KafkaSource(kafka_server.bootstrap_servers, topic),
        checkpoint_location=str(tmp_path / "checkpoint"), trigger="availableNow")

    assert all(b.ok for b in result.batches)
    assert result.input_count == len(sent)
    assert result.counts["applied"] == 4
    assert result.counts["dead_lettered"] == 3
    outcomes = ("applied", "duplicate", "dead_lettered", "parked")
    assert sum(result.counts[k] for k in outcomes) == len(sent)  # one outcome per record
    assert result.reasons == {("dead_lettered", "invalid_json"): 2,
                              ("dead_lettered", "invalid_envelope"): 1}

    def headers_of(account: str) -> dict[str, str]:
        doc = db.accounts.find_one({"_id": account})
        assert doc is not None and len(doc["outbox"]) == 1, doc
        return dict(doc["outbox"][0].get("headers") or {})

    assert headers_of("acc-a") == {"traceparent": RECORD, "tracestate": "congo=t61rcWkgMzE"}
    assert headers_of("acc-b") == {"traceparent": OWN}
    assert "traceparent" not in headers_of("acc-c")
    assert "traceparent" not in headers_of("acc-d")
    raws = [d.get("raw") for d in db.aggbox_dead_letters.find()]
    assert len(raws) == 3 and {"[1, 2]", "not json {"} <= set(raws)  # bytes kept as sent


def test_with_record_trace_rules() -> None:
    plain = {"message_id": "m", "payload": {}}
    out = with_record_trace(plain, RECORD, "a=1")
    assert out == {**plain, "headers": {"traceparent": RECORD, "tracestate": "a=1"}}
    assert "headers" not in plain  # not changed in place
    assert with_record_trace(plain, None, "a=1") is plain
    assert with_record_trace(plain, "00-bad", None) is plain
    assert with_record_trace(plain, "00-" + "0" * 32 + "-00f067aa0ba902b7-01", None) is plain
    own = {"headers": {"traceparent": OWN}}
    assert with_record_trace(own, RECORD, "a=1") is own
    state_only = {"headers": {"tracestate": "mine=1", "x": "y"}}
    assert with_record_trace(state_only, RECORD, "a=1")["headers"] == {
        "traceparent": RECORD, "tracestate": "mine=1", "x": "y"}
    for odd in ([1], "text", {"headers": ["x"]}, {"headers": "x"}):
        assert with_record_trace(odd, RECORD, None) is odd
    assert with_record_trace({"headers": None}, RECORD, "")["headers"] == {"traceparent": RECORD}
