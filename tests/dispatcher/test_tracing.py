"""One trace from an input message through its handling to the Kafka records the dispatcher
publishes (real broker, real MongoDB stand-in): with a tracer provider (the SDK's in-memory
exporter) the chain input → handling span → producer span → record header, a duplicate
redelivery an event and no second handling span; without a provider the input's own
``traceparent`` reaches the records (aggregates/store/tracing.py, dispatcher/observe/tracing.py)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from opentelemetry.trace import SpanKind
from pymongo.database import Database

from aggbox.servers import LocalKafka, create_topic
from aggregates import AggboxSettings, Message, StoreWriter
from dispatcher.daemon import Dispatcher
from tests.dispatcher.helpers import pending_entries
from tests.dispatcher.test_kafka import consume, settings

pytestmark = [pytest.mark.mongo, pytest.mark.kafka]

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INPUT_SPAN = "00f067aa0ba902b7"
PARENT = f"00-{TRACE}-{INPUT_SPAN}-01"


def _input(mid: str, doc: str) -> Message:
    return Message(message_id=mid, type="Emit", aggregate_type="Emitter", aggregate_id=doc,
                   payload={"n": 2}, headers={"traceparent": PARENT, "tracestate": "k=v"})


def _publish_and_read(writer: StoreWriter, ddb: Database[Any], store: AggboxSettings,
                      kafka: LocalKafka, emitted: list[str]) -> list[tuple[dict[str, str], Any]]:
    prefix = "t" + uuid.uuid4().hex[:10]
    create_topic(kafka.bootstrap_servers, f"{prefix}-Emitter", partitions=1)
    d = Dispatcher(settings(prefix, kafka), store=store)
    assert asyncio.run(d.run(once=True)) == 0
    assert pending_entries(ddb) == 0
    got = consume(kafka.bootstrap_servers, f"{prefix}-Emitter", set(emitted), grace=0.5)
    return [({k: v.decode() for k, v in (m.headers() or [])}, json.loads(m.value()))
            for _, m in got]


def test_one_trace_from_input_through_a_redelivery_to_the_published_records(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        kafka_server: LocalKafka, otel_spans: Any) -> None:
    first = writer.process([_input("in-1", "a1")])
    again = writer.process([_input("in-1", "a1")])  # the broker delivered it twice
    assert [o.outcome for o in first + again] == ["applied", "duplicate"]
    emitted = list(first[0].emitted_ids)
    records = _publish_and_read(writer, ddb, store, kafka_server, emitted)
    assert sorted(h["message_id"] for h, _ in records) == sorted(emitted)

    spans = otel_spans.get_finished_spans()
    (handling,) = [s for s in spans if s.name == "aggbox.handle Emit"]
    assert handling.context.trace_id == int(TRACE, 16)
    assert handling.parent is not None and handling.parent.span_id == int(INPUT_SPAN, 16)
    # The redelivery: no second handling span; a duplicate event on its chunk's span.
    writes = [s for s in spans if s.name == "aggbox.write Emitter"]
    assert len(writes) == 2
    events = [e for s in writes for e in s.events]
    assert [(e.name, e.attributes["messaging.message.id"]) for e in events] == [
        ("aggbox.duplicate", "in-1")]
    # One producer span per record, a child of the handling span, named in the record.
    producers = {s.attributes["messaging.message.id"]: s for s in spans
                 if s.kind is SpanKind.PRODUCER}
    assert set(producers) == set(emitted)
    for headers, envelope in records:
        p = producers[headers["message_id"]]
        assert p.attributes["messaging.system"] == "kafka"
        assert p.attributes["messaging.destination.name"].endswith("-Emitter")
        assert p.parent is not None and p.parent.span_id == handling.context.span_id
        assert p.context.trace_id == int(TRACE, 16)
        assert headers["traceparent"] == f"00-{TRACE}-{p.context.span_id:016x}-01"
        assert headers["tracestate"] == "k=v"
        # The envelope keeps the entry's headers: the handling span's context.
        assert envelope["headers"]["traceparent"] == (
            f"00-{TRACE}-{handling.context.span_id:016x}-01")


def test_without_a_tracer_provider_the_inputs_context_reaches_the_records(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        kafka_server: LocalKafka) -> None:
    out = writer.process([_input("in-2", "a2")])
    emitted = list(out[0].emitted_ids)
    records = _publish_and_read(writer, ddb, store, kafka_server, emitted)
    assert len(records) == 2
    for headers, envelope in records:
        assert headers["traceparent"] == PARENT and headers["tracestate"] == "k=v"
        assert envelope["headers"]["traceparent"] == PARENT
