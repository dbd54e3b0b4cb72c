"""How an effect call's answer becomes a result (pure): the rules the dispatcher's effect
runner (:mod:`dispatcher.effects.runner`) and the in-memory scenarios of
:mod:`aggregates.testing` share, so a test sees the reasons and texts production records.

- :func:`effect_call` — the :class:`~aggregates.domain.effects.EffectCall` of an outbox entry, from
  its published envelope;
- :func:`retry_reason` — a failed call (an exception, a timeout) as ``(reason, error)``:
  :class:`~aggregates.domain.effects.PermanentEffectError` is final, everything else retryable;
- :func:`result_payload` — a returned value as the success reply's payload (its JSON form),
  or why it cannot be (:func:`payload_problem`: only the why);
- :func:`exhausted_error` — the error text once ``max_attempts`` calls were begun.

The reply message itself is :func:`aggregates.domain.effects.reply_message`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from aggregates.core.errors import EnvelopeError
from aggregates.core.jsonvalue import NotJSONValue, json_payload
from aggregates.core.reasons import Reason
from aggregates.domain.effects import Effect, EffectCall, EffectError
from aggregates.message.envelope import Message

__all__ = ["MAX_ERROR", "effect_call", "exhausted_error", "payload_problem", "result_payload",
           "retry_reason", "with_attempt"]

#: Error texts are cut to this many characters (in attempt records and replies).
MAX_ERROR: Final = 2000


def effect_call(envelope: Mapping[str, Any], entry: Mapping[str, Any], *, source_type: str,
                document_id: Any, created_at: datetime | None,
                trace: Mapping[str, str] | None = None) -> EffectCall:
    """The call of an effect entry (attempt 1); ``trace`` (the effect span's headers)
    replaces the entry's trace context in its headers."""
    src = entry.get("source")
    atype = (str(src["type"]) if isinstance(src, Mapping) and src.get("type")
             else source_type)
    headers = envelope.get("headers") or {}
    return EffectCall(
        idempotency_key=str(envelope.get("message_id")),
        type=str(envelope.get("type")),
        payload=envelope.get("payload") or {},
        aggregate_type=atype,
        aggregate_id=str(document_id),
        headers={**{str(k): str(v) for k, v in headers.items()}, **(trace or {})},
        correlation_id=envelope.get("correlation_id"),
        created_at=created_at,
    )


def with_attempt(call: EffectCall, attempt: int) -> EffectCall:
    """``call`` as its ``attempt``-th attempt (at least 1)."""
    return EffectCall(call.idempotency_key, call.type, call.payload, call.aggregate_type,
                      call.aggregate_id, attempt=max(1, attempt), headers=call.headers,
                      correlation_id=call.correlation_id, created_at=call.created_at)


def retry_reason(effect: Effect, exc: BaseException, *, what: str = "call") -> tuple[str, str]:
    """A failed call or query that may be retried, as ``(reason, error)``: a timeout is
    ``effect_timeout``, an :class:`~aggregates.domain.effects.EffectError` keeps its reason, any
    other exception is ``effect_error`` with its type and text."""
    if isinstance(exc, TimeoutError):
        return Reason.EFFECT_TIMEOUT, f"{what} did not finish within {effect.timeout_s:g}s"
    if isinstance(exc, EffectError):
        return exc.reason, text(exc.detail or exc)
    return Reason.EFFECT_ERROR, text(f"{type(exc).__name__}: {exc}")


def exhausted_error(effect: Effect, last: str | None) -> str:
    """The error of an effect that failed ``effect_attempts_exhausted``."""
    return f"{effect.max_attempts} attempts; last: {last or 'no result recorded'}"


def result_payload(payload: Any, effect: Effect, *, aggregate_type: str, aggregate_id: str
                   ) -> tuple[dict[str, Any] | None, str | None]:
    """What the effect function returned (``None`` already made ``{}``) as the payload of the
    ``on_success`` message — in its JSON form, by the rule every published payload follows
    (docs/design.md "JSON values": a numpy number as its value, a ``Decimal`` as its text)
    — and ``None``; or ``None`` and why it cannot be (a NaN, an int outside 64 bits, bytes,
    a type of its own: the detail names the field, ``result.amount``). The call took effect
    all the same: the aggregate then receives a failure (``effect_error``)."""
    if not isinstance(payload, Mapping):
        return None, (f"the {effect.type} function returned {type(payload).__name__}, not a "
                      "payload dict (or None)")
    try:
        plain = json_payload(payload, "result")
        Message.from_dict({"message_id": "x", "type": effect.on_success,
                           "aggregate_type": aggregate_type,
                           "aggregate_id": aggregate_id, "payload": dict(plain)})
    except (NotJSONValue, EnvelopeError) as exc:
        return None, f"the {effect.type} result cannot be a message payload: {exc}"
    return (dict(plain) if plain is payload else plain), None


def payload_problem(payload: Any, effect: Effect, *, aggregate_type: str,
                    aggregate_id: str) -> str | None:
    """Why ``payload`` cannot be the payload of the ``on_success`` message (see
    :func:`result_payload`, whose JSON form is what the reply is to carry); ``None`` if it
    can."""
    return result_payload(payload, effect, aggregate_type=aggregate_type,
                          aggregate_id=aggregate_id)[1]


def text(value: object) -> str:
    """An error text, cut to :data:`MAX_ERROR` characters."""
    return str(value)[:MAX_ERROR]
