"""OpenTelemetry spans for the store writer (docs/design.md "Tracing").

Optional: without the ``opentelemetry-api`` package, or with no tracer provider configured
in the process, :func:`chunk_trace` returns ``None`` and the writer does nothing more than
carry the input's ``traceparent`` to the entries it causes
(:mod:`aggregates.core.tracecontext`). With a provider, per chunk of the writer:

- one span ``aggbox.write <type>`` (kind ``CONSUMER``, the messaging conventions' batch
  *process* span) with a **link** to the trace context of each of its messages (the first
  :data:`MAX_LINKS` that have one), and an
  **event** per message that was not applied (``aggbox.duplicate``, ``aggbox.parked``,
  ``aggbox.dead_lettered``, with its id and reason) — so a redelivered duplicate costs an
  event, never a span;
- (setting ``tracing = "messages"``, the default; ``"chunks"`` leaves it out and the
  entries carry their input's context) one span ``aggbox.handle <message type>`` per
  *applied* message, a child of the input's ``traceparent`` (a new trace when it has
  none). Its context is what the entries the
  message emits carry in their ``traceparent`` header, so the records the dispatcher
  publishes continue the trace through it. It starts with the chunk and ends when the
  chunk's write committed (the effect exists from then on). The fold may run a message
  again after a version conflict; its span is made once per chunk and reused.

The provider's sampler decides as usual: an input whose ``traceparent`` is not sampled gets
non-recording spans (cheap) whose ids still go on downstream."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from aggregates.core.tracecontext import (
    TRACEPARENT,
    TRACESTATE,
    emit_trace,
    trace_headers,
    valid_tracestate,
)
from aggregates.message.envelope import Message
from aggregates.message.outcomes import Outcome

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["ChunkTrace", "chunk_trace", "format_traceparent", "tracer"]

#: Instrumentation scope name of aggbox's spans.
SCOPE: Final = "aggbox"

try:  # the optional extra
    from opentelemetry import trace as _otel
except ImportError:  # pragma: no cover - the extra is part of the dev install
    _otel = None  # type: ignore[assignment]

#: Links per chunk span: the SDK keeps 128 by default (OTEL_SPAN_LINK_COUNT_LIMIT) and drops
#: the rest, so more are not even built.
MAX_LINKS: Final = 128
#: Events per chunk span, likewise (OTEL_SPAN_EVENT_COUNT_LIMIT); the outcome counts on the
#: span stay complete.
MAX_EVENTS: Final = 128

_cached: tuple[Any, Tracer | None] = (None, None)


def tracer() -> Tracer | None:
    """aggbox's tracer from the global tracer provider, or ``None`` when no provider is
    configured (or the OpenTelemetry API is not installed): then aggbox makes no spans."""
    global _cached
    if _otel is None:
        return None
    provider = _otel.get_tracer_provider()
    cached_provider, cached = _cached
    if provider is cached_provider:
        return cached
    found: Tracer | None = None
    if not isinstance(provider, (_otel.ProxyTracerProvider, _otel.NoOpTracerProvider)):
        found = provider.get_tracer(SCOPE)
    _cached = (provider, found)
    return found


def format_traceparent(span: Span) -> dict[str, str]:
    """The W3C ``traceparent`` (and ``tracestate``) headers naming ``span``."""
    ctx = span.get_span_context()
    out = {TRACEPARENT: f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"}
    state = ctx.trace_state.to_header() if ctx.trace_state else ""
    if state:
        out[TRACESTATE] = state
    return out


def parent_context(headers: Mapping[str, str]) -> Any:
    """The OpenTelemetry context of a message's well-formed ``traceparent`` (``None`` when it
    has none: a span started with it begins a new trace). Validated by
    :func:`aggregates.core.tracecontext.trace_headers`, so the span context is built directly
    (the propagator would parse it a second time)."""
    carried = trace_headers(headers) if headers else None
    if not carried:
        return None
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    _, trace_id, span_id, flags = carried[TRACEPARENT].split("-", 4)[:4]
    state = carried.get(TRACESTATE)
    if state and not valid_tracestate(state):
        state = None  # dropped, as the SDK would, but without its warning per message
    ctx = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                      trace_flags=TraceFlags(int(flags, 16) & TraceFlags.SAMPLED),
                      trace_state=TraceState.from_header([state]) if state else None)
    return _otel.set_span_in_context(NonRecordingSpan(ctx))


_Key = tuple[str, str, str]


class ChunkTrace:
    """The spans of one writer chunk (see the module docstring)."""

    def __init__(self, tracer: Tracer, messages: Sequence[Message], *,
                 per_message: bool = True, types: Sequence[str] = ()) -> None:
        from opentelemetry.trace import Link, SpanKind

        self._tracer = tracer
        self._per_message = per_message
        self._start = time.time_ns()
        self._messages: dict[_Key, Message] = {}
        #: the input's context per message, parsed once (links, then its handling span)
        self._parents: dict[_Key, Any] = {}
        links: list[Link] = []
        for m in messages:
            key = (m.aggregate_type, m.aggregate_id, m.message_id)
            self._messages.setdefault(key, m)
            if len(links) < MAX_LINKS and m.headers:
                parent = self._parent(key, m)
                if parent is not None:
                    ctx = _otel.get_current_span(parent).get_span_context()
                    links.append(Link(ctx, {"messaging.message.id": m.message_id}))
        types = sorted(set(types) | {m.aggregate_type for m in messages})
        self.span = tracer.start_span(
            f"aggbox.write {types[0] if len(types) == 1 else 'aggregates'}",
            kind=SpanKind.CONSUMER, links=links, start_time=self._start,
            attributes={"messaging.operation.type": "process",
                        "messaging.batch.message_count": len(messages),
                        "aggbox.aggregate.types": types})
        self._handling: dict[_Key, Span] = {}

    def _parent(self, key: _Key, msg: Message) -> Any:
        if key not in self._parents:
            self._parents[key] = parent_context(msg.headers)
        return self._parents[key]

    def emit_headers(self, msg: Message) -> dict[str, str]:
        """The trace headers of the entries ``msg`` emits: its handling span's."""
        return format_traceparent(self._handling_span(msg))

    def _handling_span(self, msg: Message) -> Span:
        key = (msg.aggregate_type, msg.aggregate_id, msg.message_id)
        span = self._handling.get(key)
        if span is None:
            from opentelemetry.trace import SpanKind

            span = self._tracer.start_span(
                f"aggbox.handle {msg.type}", context=self._parent(key, msg),
                kind=SpanKind.CONSUMER, start_time=self._start,
                attributes={"messaging.message.id": msg.message_id,
                            "aggbox.aggregate.type": msg.aggregate_type,
                            "aggbox.aggregate.id": msg.aggregate_id})
            self._handling[key] = span
        return span

    def finish(self, outcomes: Sequence[Outcome]) -> None:
        """End the spans: a handling span per applied message, events for the others."""
        counts: dict[str, int] = {}
        events = 0
        for o in outcomes:
            counts[o.outcome] = counts.get(o.outcome, 0) + 1
            key = (o.aggregate_type, o.aggregate_id, o.message_id)
            msg = self._messages.get(key)
            span = self._handling.get(key)
            if o.outcome == "applied" and not self._per_message:
                continue  # counted on the chunk span, no event: applied is the norm
            if o.outcome == "applied" and (span is not None or msg is not None):
                if span is None:
                    assert msg is not None
                    span = self._handling_span(msg)
                if o.emitted_ids:
                    span.set_attribute("aggbox.emitted", len(o.emitted_ids))
                if o.from_parked:
                    span.set_attribute("aggbox.from_parked", True)
                span.end()
                continue
            events += 1
            if events > MAX_EVENTS:
                continue
            attrs: dict[str, Any] = {"messaging.message.id": o.message_id,
                                     "aggbox.aggregate.type": o.aggregate_type,
                                     "aggbox.aggregate.id": o.aggregate_id}
            if o.reason:
                attrs["aggbox.reason"] = o.reason
            if msg is not None:
                carried = trace_headers(msg.headers) if msg.headers else None
                if carried:
                    attrs[TRACEPARENT] = carried[TRACEPARENT]
            self.span.add_event(f"aggbox.{o.outcome}", attrs)
        # A message whose handler ran but did not end applied (refused by a later check,
        # a duplicate after a conflict, …): its span, still open, ends too, saying so.
        for span in self._handling.values():
            if span.is_recording():  # an ended (or unsampled) span records nothing more
                span.set_attribute("aggbox.outcome", "not_applied")
                span.end()
        for kind, n in counts.items():
            self.span.set_attribute(f"aggbox.outcomes.{kind}", n)
        if events > MAX_EVENTS:
            self.span.set_attribute("aggbox.events_dropped", events - MAX_EVENTS)
        self.span.end()

    def fail(self, exc: BaseException) -> None:
        """End every span of a chunk whose processing raised."""
        from opentelemetry.trace import Status, StatusCode

        for span in self._handling.values():
            span.end()
        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self.span.end()


@contextmanager
def chunk_trace(messages: Sequence[Message], *, per_message: bool = True,
                types: Sequence[str] = ()) -> Iterator[ChunkTrace | None]:
    """Spans for one writer chunk when a tracer provider is configured, else ``None``.
    ``types``: the chunk's aggregate types (those of ``messages`` are added).
    ``per_message`` (setting ``tracing = "messages"``): while the block runs, the entries the
    fold builds carry the handling spans' context
    (:data:`aggregates.core.tracecontext.emit_trace`); without it (``"chunks"``) only the chunk
    span is made and the entries carry their input's context."""
    t = tracer()
    if t is None:
        yield None
        return
    trace = ChunkTrace(t, messages, per_message=per_message, types=types)
    token = emit_trace.set(trace.emit_headers) if per_message else None
    try:
        yield trace
    except BaseException as exc:
        trace.fail(exc)
        raise
    finally:
        if token is not None:
            emit_trace.reset(token)
