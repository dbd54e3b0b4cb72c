"""One effect entry: attempt → call → result → reply (docs/design.md "Side effects").

For an outbox entry whose type has an :class:`~aggregates.domain.effects.Effect`:

1. read the attempt record; a recorded result goes straight to step 5;
2. an open attempt (begun, no result: a crash, a timeout, a dropped response) is *recovered*:
   the query function, if any, says whether it took effect (done → its payload is the
   result, step 4); without one, or "not done", the call is made again (at-least-once);
3. ``max_attempts`` calls begun already → the effect failed (``effect_attempts_exhausted``);
   otherwise record the attempt (``attempts`` + 1, durable) and make the call, bounded by
   ``timeout_s``;
4. record the result once (success payload, or failure reason); a retryable failure leaves
   the attempt open and the entry in the outbox (the dispatcher retries the document after
   its backoff);
5. apply the reply to the emitting aggregate through the store writer — ``on_success`` with
   the result, or ``on_failure`` with ``{reason, error, attempts}``; message id
   ``effect-result:<entry id>`` and ``causation_id`` = the entry id, so however often this
   step runs the aggregate applies one result;
6. report to the dispatcher: ``ok`` (it pulls the entry) or ``permanent`` (it dead-letters
   the entry with the reason, then pulls it).

A crash anywhere leaves the entry in the outbox and repeats from step 1 with what was
recorded. Fault points ``effect_before_call``, ``effect_after_call``,
``effect_after_result`` (:mod:`dispatcher.core.faults`) mark the three crash windows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from pymongo.errors import PyMongoError

from aggregates.core.reasons import Reason
from aggregates.domain.effect_rules import (
    MAX_ERROR,
    effect_call,
    exhausted_error,
    result_payload,
    retry_reason,
    with_attempt,
)
from aggregates.domain.effects import (
    Effect,
    EffectCall,
    EffectError,
    PermanentEffectError,
    reply_message,
)
from aggregates.message.envelope import Message
from aggregates.message.outcomes import Outcome
from aggregates.store.tracing import format_traceparent
from dispatcher.core.faults import Faults
from dispatcher.effects.attempts import FAILED, SUCCEEDED, AttemptRecord, Attempts, attempt_key
from dispatcher.observe.metrics import Metrics
from dispatcher.observe.tracing import effect_span, end_with
from dispatcher.publishers.base import PublishResult
from dispatcher.publishers.record import OutboundRecord

__all__ = ["EffectRunner", "ReplyWriter"]

log = logging.getLogger("aggbox.dispatcher.effects")
trace_log = logging.getLogger("aggbox.trace")

#: Applies reply messages (the store writer, in a thread): one outcome per message.
ReplyWriter = Callable[[list[Message]], Awaitable[list[Outcome]]]

_MAX_ERROR = MAX_ERROR


def _now() -> datetime:
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


class _Retry(Exception):
    """A retryable failure of this attempt (internal)."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason = reason
        self.error = error


class EffectRunner:
    """Executes effect entries; see the module documentation."""

    def __init__(self, attempts: Attempts, reply: ReplyWriter, *, metrics: Metrics,
                 faults: Faults | None = None, clock: Callable[[], datetime] = _now) -> None:
        self.attempts = attempts
        self.reply = reply
        self.metrics = metrics
        self.faults = faults or Faults()
        self.clock = clock

    async def execute(self, record: OutboundRecord, effect: Effect) -> PublishResult:
        span = effect_span(record, effect)  # None: no tracer provider
        trace = format_traceparent(span) if span is not None else None
        result: PublishResult | None = None
        try:
            result = await self._execute(record, effect, trace)
            return result
        finally:
            if span is not None:
                end_with(span, result)

    async def _execute(self, record: OutboundRecord, effect: Effect,
                       trace: dict[str, str] | None) -> PublishResult:
        call = _call_of(record, trace)
        key = attempt_key(record.collection, record.message_id)
        try:
            att = await self._settle(key, record, effect, call)
        except _Retry as exc:
            return PublishResult.retryable(exc.error, exc.reason)
        except PyMongoError as exc:
            return PublishResult.retryable(f"effect attempt record: {exc}",
                                           Reason.BROKER_UNAVAILABLE)
        if att is None:
            return PublishResult.retryable("effect not settled", Reason.EFFECT_RETRYABLE)
        try:
            await self._deliver(record, effect, call, att, trace)
        except PyMongoError as exc:
            return PublishResult.retryable(f"writing the reply of effect {effect.type}: {exc}",
                                           Reason.BROKER_UNAVAILABLE)
        if att.state == SUCCEEDED:
            return PublishResult.ok()
        return PublishResult.permanent(att.reason or Reason.EFFECT_REJECTED,
                                       att.error or "effect failed")

    # -- steps 1–4 -----------------------------------------------------------------------
    async def _settle(self, key: str, record: OutboundRecord, effect: Effect, call: EffectCall
                      ) -> AttemptRecord | None:
        """The recorded result, after making the call if needed; raises :class:`_Retry`."""
        att = await self.attempts.read(key)
        if att is not None and att.final:
            return att
        meta = _meta(record, call)
        if att is not None and att.open:
            decided = await self._recover(key, effect, call, att, meta)
            if decided is not None:
                return decided
        attempts_begun = att.attempts if att is not None else 0
        if attempts_begun >= effect.max_attempts:
            return await self._fail(key, effect, meta, Reason.EFFECT_ATTEMPTS_EXHAUSTED,
                                    _exhausted(effect, att))
        att = await self.attempts.begin(key, meta=meta, now=self.clock())
        if att.final:
            return att
        call = _with_attempt(call, att.attempts)
        self.faults.hit("effect_before_call")
        self.metrics.effect_calls.labels(effect.type).inc()
        started = time.monotonic()
        try:
            result = await _invoke(effect.call, call, effect.timeout_s)
        except PermanentEffectError as exc:
            self.faults.hit("effect_after_call")
            self._observe(effect, started)
            return await self._fail(key, effect, meta, exc.reason, _text(exc.detail or exc))
        except Exception as exc:
            self.faults.hit("effect_after_call")
            self._observe(effect, started)
            reason, error = _retry_reason(effect, exc)
            self.metrics.effect_retries.labels(effect.type, reason).inc()
            await self.attempts.note_failure(key, reason=reason, error=error)
            if att.attempts >= effect.max_attempts:
                return await self._fail(key, effect, meta, Reason.EFFECT_ATTEMPTS_EXHAUSTED,
                                        f"{effect.max_attempts} attempts; last: {error}")
            raise _Retry(reason, error) from None
        self.faults.hit("effect_after_call")
        self._observe(effect, started)
        return await self._succeed(key, effect, meta, result, call)

    async def _recover(self, key: str, effect: Effect, call: EffectCall, att: AttemptRecord,
                       meta: dict[str, Any]) -> AttemptRecord | None:
        """An open attempt: ask the resource, if it can be asked. Returns the recorded result
        when the query found the effect done, ``None`` to call (again)."""
        if effect.query is None:
            self.metrics.effect_recoveries.labels(effect.type, "call_again").inc()
            if effect.idempotent:
                log.info("effect %s %s: attempt %d has no recorded result: calling again "
                         "with the same Idempotency-Key (the resource honours it: once)",
                         effect.type, call.idempotency_key, att.attempts)
            else:
                log.info("effect %s %s: attempt %d has no recorded result and %s cannot be "
                         "asked: calling again (at-least-once)", effect.type,
                         call.idempotency_key, att.attempts, effect.type)
            return None
        try:
            found = await _invoke(effect.query, _with_attempt(call, att.attempts),
                                  effect.timeout_s)
        except PermanentEffectError as exc:
            return await self._fail(key, effect, meta, exc.reason, _text(exc.detail or exc))
        except Exception as exc:
            reason, error = _retry_reason(effect, exc, what="query")
            self.metrics.effect_retries.labels(effect.type, reason).inc()
            await self.attempts.note_failure(key, reason=reason, error=error)
            raise _Retry(reason, error) from None
        if found is None:
            self.metrics.effect_recoveries.labels(effect.type, "query_not_done").inc()
            return None
        self.metrics.effect_recoveries.labels(effect.type, "query_done").inc()
        return await self._succeed(key, effect, meta, found, call)

    async def _succeed(self, key: str, effect: Effect, meta: dict[str, Any], result: Any,
                       call: EffectCall) -> AttemptRecord:
        payload, problem = result_payload({} if result is None else result, effect,
                                          aggregate_type=call.aggregate_type,
                                          aggregate_id=call.aggregate_id)
        if payload is None:
            # The call took effect but its answer cannot be a message payload: the
            # aggregate learns of it as a failure with the reason (never silently).
            return await self._fail(key, effect, meta, Reason.EFFECT_ERROR, str(problem))
        # The result is recorded in its JSON form (docs/design.md "JSON values"): what the
        # reply carries, and what BSON can store (a numpy number, a Decimal, a UUID as
        # their values and texts).
        att = await self.attempts.finish(key, state=SUCCEEDED, now=self.clock(),
                                         result=payload, meta=meta)
        self.metrics.effect_results.labels(effect.type, att.state).inc()
        self.faults.hit("effect_after_result")
        return att

    async def _fail(self, key: str, effect: Effect, meta: dict[str, Any], reason: str,
                    error: str) -> AttemptRecord:
        att = await self.attempts.finish(key, state=FAILED, now=self.clock(), reason=reason,
                                         error=error[:_MAX_ERROR], meta=meta)
        self.metrics.effect_results.labels(effect.type, att.state).inc()
        if att.state == FAILED:
            self.metrics.effect_failures.labels(effect.type, att.reason or reason).inc()
        self.faults.hit("effect_after_result")
        return att

    def _observe(self, effect: Effect, started: float) -> None:
        self.metrics.effect_latency.labels(effect.type).observe(time.monotonic() - started)

    # -- step 5 --------------------------------------------------------------------------
    async def _deliver(self, record: OutboundRecord, effect: Effect, call: EffectCall,
                       att: AttemptRecord, trace: dict[str, str] | None = None) -> None:
        msg = reply_for(record, effect, call, att, trace=trace)
        outcomes = await self.reply([msg])
        for o in outcomes:
            if o.message_id == msg.message_id and o.outcome in ("dead_lettered", "parked"):
                log.warning("the reply %s of effect %s to %s/%s was %s (%s): it waits there "
                            "(aggbox deadletters / parked)", msg.type, effect.type,
                            msg.aggregate_type, msg.aggregate_id, o.outcome, o.reason)


def reply_for(record: OutboundRecord, effect: Effect, call: EffectCall, att: AttemptRecord,
              *, trace: Mapping[str, str] | None = None) -> Message:
    """The result message of a settled effect (pure; :func:`aggregates.domain.effects.reply_message`
    with what was recorded). ``trace``: the effect span's trace headers, which replace the
    entry's in the message (so its handling continues from the effect's span)."""
    failure = (None if att.state == SUCCEEDED
               else (att.reason or Reason.EFFECT_REJECTED, att.error or ""))
    entry = record.entry
    if trace:
        headers = entry.get("headers")
        entry = {**entry, "headers": {**(headers if isinstance(headers, Mapping) else {}),
                                      **trace}}
    return reply_message(effect, entry, aggregate_type=call.aggregate_type,
                         aggregate_id=call.aggregate_id, result=att.result, failure=failure,
                         attempts=att.attempts, at=att.finished_at)


def _call_of(record: OutboundRecord, trace: Mapping[str, str] | None = None) -> EffectCall:
    """The call of an effect entry; ``trace`` (the effect span's headers) replaces the
    entry's trace context in its headers (:func:`aggregates.domain.effect_rules.effect_call`)."""
    return effect_call(record.envelope, record.entry, source_type=record.source_type,
                       document_id=record.document_id, created_at=record.created_at,
                       trace=trace)


_with_attempt = with_attempt


def _meta(record: OutboundRecord, call: EffectCall) -> dict[str, Any]:
    return {"collection": record.collection, "aggregate_type": call.aggregate_type,
            "aggregate_id": call.aggregate_id, "entry_id": call.idempotency_key,
            "type": call.type}


async def _invoke(fn: Callable[[EffectCall], Any], call: EffectCall, timeout_s: float) -> Any:
    """Run an effect or query function within ``timeout_s`` (sync ones in a thread: the
    thread cannot be stopped, only no longer waited for)."""
    if asyncio.iscoroutinefunction(fn):
        return await asyncio.wait_for(fn(call), timeout_s)
    result = await asyncio.wait_for(asyncio.to_thread(fn, call), timeout_s)
    if asyncio.iscoroutine(result):  # a callable object with an async __call__
        return await asyncio.wait_for(result, timeout_s)
    return result


def _retry_reason(effect: Effect, exc: BaseException, what: str = "call") -> tuple[str, str]:
    if not isinstance(exc, TimeoutError | EffectError):
        trace_log.error("effect %s: the %s function raised", effect.type, what, exc_info=exc)
    return retry_reason(effect, exc, what=what)


def _exhausted(effect: Effect, att: AttemptRecord | None) -> str:
    return exhausted_error(effect, att.last_error if att is not None else None)


def _text(value: object) -> str:
    return str(value)[:_MAX_ERROR]
