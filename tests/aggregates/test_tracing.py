"""OpenTelemetry spans of the store writer (aggregates/store/tracing.py), recorded by the SDK's
in-memory exporter; and no spans, only the carried context, without a tracer provider."""

from __future__ import annotations

import dataclasses
from typing import Any

from opentelemetry.trace import SpanKind

from aggregates import Message
from aggregates.fold.document import F_OUTBOX
from aggregates.store.tracing import tracer
from aggregates.testing import memory_database
from tests.aggregates.contract import msg, writer

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def _traced(m: Message, traceparent: str = PARENT, **more: str) -> Message:
    return dataclasses.replace(m, headers={"traceparent": traceparent, **more})


def _outbox(db: Any, agg: str = "a1") -> list[dict[str, Any]]:
    doc = db.counters.find_one({"_id": agg})
    return list(doc.get(F_OUTBOX) or []) if doc else []


def _handling(spans: Any) -> list[Any]:
    return [s for s in spans if s.name.startswith("aggbox.handle ")]


def _writes(spans: Any) -> list[Any]:
    return [s for s in spans if s.name.startswith("aggbox.write ")]


def test_without_a_tracer_provider_no_spans_and_the_input_context_is_carried() -> None:
    assert tracer() is None
    db = memory_database()
    out = writer(db).process([_traced(msg("m1", 3), tracestate="k=v")])
    assert out[0].outcome == "applied"
    (entry,) = _outbox(db)
    assert entry["headers"] == {"traceparent": PARENT, "tracestate": "k=v"}


def test_handling_span_is_the_inputs_child_and_the_entries_carry_it(otel_spans: Any) -> None:
    db = memory_database()
    out = writer(db).process([_traced(msg("m1", 3), tracestate="k=v"), msg("m2", 1)])
    assert [o.outcome for o in out] == ["applied", "applied"]
    spans = otel_spans.get_finished_spans()
    first, second = sorted(_handling(spans), key=lambda s: s.attributes["messaging.message.id"])
    # m1: a child of the input's span, in the input's trace, with its tracestate.
    assert first.context.trace_id == int(TRACE, 16)
    assert first.parent is not None and first.parent.span_id == 0x00f067aa0ba902b7
    assert first.parent.is_remote and first.kind is SpanKind.CONSUMER
    assert "aggbox.outcome" not in first.attributes  # only a span not applied says so
    assert first.attributes["aggbox.aggregate.id"] == "a1"
    assert first.attributes["aggbox.emitted"] == 1
    (entry,) = _outbox(db)
    assert entry["headers"]["traceparent"] == (
        f"00-{TRACE}-{first.context.span_id:016x}-01")
    assert entry["headers"]["tracestate"] == "k=v"
    # m2 had no trace context: its handling span starts a trace of its own.
    assert second.parent is None and second.context.trace_id != int(TRACE, 16)
    # One write span for the chunk, linked to the traced input.
    (write,) = _writes(spans)
    assert [link.context.trace_id for link in write.links] == [int(TRACE, 16)]
    assert write.attributes["aggbox.outcomes.applied"] == 2
    assert write.attributes["messaging.batch.message_count"] == 2


def test_a_duplicate_redelivery_is_an_event_not_a_second_handling_span(otel_spans: Any) -> None:
    db = memory_database()
    w = writer(db)
    w.process([_traced(msg("m1", 3))])
    first_entry = _outbox(db)[0]["headers"]["traceparent"]
    otel_spans.clear()
    out = w.process([_traced(msg("m1", 3))])
    assert out[0].outcome == "duplicate"
    spans = otel_spans.get_finished_spans()
    assert _handling(spans) == []
    (write,) = _writes(spans)
    (event,) = write.events
    assert event.name == "aggbox.duplicate"
    assert event.attributes["messaging.message.id"] == "m1"
    assert event.attributes["traceparent"] == PARENT
    assert [link.context.trace_id for link in write.links] == [int(TRACE, 16)]
    assert _outbox(db)[0]["headers"]["traceparent"] == first_entry  # nothing re-emitted


def test_a_version_conflict_reruns_the_fold_but_makes_one_handling_span(
        otel_spans: Any) -> None:
    """The fold runs m1 twice (a rival write in between); the entry and the one span agree."""
    db = memory_database()
    w = writer(db)
    w.process([msg("m0", 1)])
    rival = writer(db)
    calls = {"n": 0}

    def interfere(_ops: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            rival.process([msg("r1", 1)])

    w.before_write = interfere
    otel_spans.clear()
    out = w.process([_traced(msg("m1", 3))])
    assert out[0].outcome == "applied" and out[0].attempt == 2
    spans = [s for s in _handling(otel_spans.get_finished_spans())
             if s.attributes["messaging.message.id"] == "m1"]
    assert len(spans) == 1
    (entry,) = _outbox(db)
    assert entry["headers"]["traceparent"] == f"00-{TRACE}-{spans[0].context.span_id:016x}-01"


def test_refused_messages_are_events_with_their_reason(otel_spans: Any) -> None:
    db = memory_database()
    out = writer(db).process([_traced(msg("b1", mtype="Boom")), msg("m1", 1)])
    assert [o.outcome for o in out] == ["dead_lettered", "applied"]
    spans = otel_spans.get_finished_spans()
    assert [s.attributes["messaging.message.id"] for s in _handling(spans)] == ["m1"]
    (write,) = _writes(spans)
    (event,) = write.events
    assert event.name == "aggbox.dead_lettered"
    assert event.attributes["aggbox.reason"] == "handler_error"
    assert event.attributes["messaging.message.id"] == "b1"


def test_an_unsampled_input_makes_no_recorded_span_but_its_trace_goes_on(
        otel_spans: Any) -> None:
    db = memory_database()
    unsampled = f"00-{TRACE}-00f067aa0ba902b7-00"
    writer(db).process([_traced(msg("m1", 3), unsampled)])
    assert _handling(otel_spans.get_finished_spans()) == []
    (entry,) = _outbox(db)
    version, trace_id, span_id, flags = entry["headers"]["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE, "00")
    assert span_id != "00f067aa0ba902b7"  # a new span of aggbox's, not the input's


def test_chunks_mode_makes_one_span_per_chunk_and_carries_the_input_context(
        otel_spans: Any) -> None:
    """tracing = "chunks": no span per message; the entries carry the input's own context;
    duplicates are still events."""
    db = memory_database()
    w = writer(db, tracing="chunks")
    inputs = [_traced(msg(f"m{i}", 3, agg=f"a{i}")) for i in range(3)]
    w.process(inputs)
    out = w.process([inputs[0]])
    assert out[0].outcome == "duplicate"
    spans = otel_spans.get_finished_spans()
    assert _handling(spans) == []
    first, second = _writes(spans)
    assert len(first.links) == 3 and first.events == ()
    assert first.attributes["aggbox.outcomes.applied"] == 3
    assert [e.name for e in second.events] == ["aggbox.duplicate"]
    assert all(_outbox(db, f"a{i}")[0]["headers"] == {"traceparent": PARENT}
               for i in range(3))


def test_events_stop_at_the_limit_and_the_counts_stay_complete(otel_spans: Any) -> None:
    from aggregates.store.tracing import MAX_EVENTS

    db = memory_database()
    w = writer(db)
    inputs = [msg(f"m{i}", 1, agg=f"a{i}") for i in range(MAX_EVENTS + 5)]
    w.process(inputs)
    otel_spans.clear()
    w.process(inputs)  # every one a duplicate
    (write,) = _writes(otel_spans.get_finished_spans())
    assert len(write.events) == MAX_EVENTS
    assert write.attributes["aggbox.outcomes.duplicate"] == MAX_EVENTS + 5
    assert write.attributes["aggbox.events_dropped"] == 5


def test_retrying_parked_messages_names_the_aggregate_type(otel_spans: Any) -> None:
    db = memory_database()
    writer(db).retry_parked("Counter", ["a1"])
    (write,) = _writes(otel_spans.get_finished_spans())
    assert write.name == "aggbox.write Counter"


def test_hostile_trace_headers_never_fail_a_chunk(otel_spans: Any, caplog: Any) -> None:
    """Odd but well-formed traceparents and any tracestate: every message is applied, the
    spans are made, an invalid tracestate is dropped rather than carried — and the tracing
    library is not made to log a warning per message."""
    future = f"01-{TRACE}-00f067aa0ba902b7-03-and-more"
    heads = [{"traceparent": future},
             {"traceparent": PARENT, "tracestate": "é=1,\udc80=x"},
             {"traceparent": PARENT, "tracestate": "a=b," * 100},
             {"traceparent": "00-" + "f" * 32 + "-" + "f" * 16 + "-ff"},
             {"traceparent": PARENT.upper()}, {"tracestate": "lonely=1"}]
    db = memory_database()
    inputs = [dataclasses.replace(msg(f"m{i}", 3, agg=f"a{i}"), headers=h)
              for i, h in enumerate(heads)]
    with caplog.at_level("WARNING"):
        out = writer(db).process(inputs)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry")] == []
    assert [o.outcome for o in out] == ["applied"] * len(heads)
    assert len(_handling(otel_spans.get_finished_spans())) == len(heads)
    carried = [_outbox(db, f"a{i}")[0]["headers"] for i in range(len(heads))]
    assert carried[0]["traceparent"].startswith(f"00-{TRACE}-")  # sampled flag kept
    assert carried[0]["traceparent"].endswith("-01")
    assert "tracestate" not in carried[1]
    assert carried[3]["traceparent"].startswith("00-" + "f" * 32)
    assert all(c["traceparent"][3:35] != TRACE for c in carried[4:])  # not carried: new


def test_without_the_opentelemetry_package_nothing_changes(
        otel_spans: Any, monkeypatch: Any) -> None:
    """The extra is optional: with the API missing (simulated) even a configured provider
    is not reached, and the input's context is carried as without tracing."""
    import aggregates.store.tracing as tracing

    monkeypatch.setattr(tracing, "_otel", None)
    assert tracing.tracer() is None
    db = memory_database()
    assert writer(db).process([_traced(msg("m1", 3))])[0].outcome == "applied"
    assert otel_spans.get_finished_spans() == ()
    assert _outbox(db)[0]["headers"] == {"traceparent": PARENT}


def test_the_library_and_the_dispatcher_import_without_opentelemetry() -> None:
    """A real ImportError (the package blocked in a fresh interpreter), not a patched name."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import aggregates.store.tracing, dispatcher.observe.tracing, dispatcher.daemon\n"
        "from tests.aggregates.contract import msg, writer\n"
        "from aggregates.testing import memory_database\n"
        "import dataclasses\n"
        "db = memory_database()\n"
        f"m = dataclasses.replace(msg('m1', 3), headers={{'traceparent': {PARENT!r}}})\n"
        "assert writer(db).process([m])[0].outcome == 'applied'\n"
        "print(db.counters.find_one()['outbox'][0]['headers']['traceparent'])\n")
    from pathlib import Path

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == PARENT


def test_a_handler_that_ran_but_was_not_applied_ends_its_span_saying_so(
        otel_spans: Any) -> None:
    """The handler emitted (so its span exists), then the size check refused the message:
    the span still ends, marked not applied, and the chunk span has the refusal's event."""
    db = memory_database()
    big = _traced(msg("b1", mtype="Big", payload={"size": 100_000}))
    out = writer(db, max_document_bytes=64 * 1024).process([big])
    assert out[0].outcome != "applied"
    spans = otel_spans.get_finished_spans()
    (handling,) = _handling(spans)
    assert handling.attributes["aggbox.outcome"] == "not_applied"
    assert handling.parent is not None and handling.parent.span_id == 0x00f067aa0ba902b7
    (write,) = _writes(spans)
    assert [e.attributes["messaging.message.id"] for e in write.events] == ["b1"]
