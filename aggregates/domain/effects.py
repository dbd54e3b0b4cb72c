"""Side effects on systems without transactions: the domain API (docs/side-effects.md,
docs/design.md "Side effects").

Handlers never call the outside world. They emit an *effect entry* (``Emit(BookShipment(...))``)
and a function registered here for that message type performs the call *after* the write,
in the dispatcher's effect runner (:mod:`dispatcher.effects`):

    effects = Effects()

    @effects.effect("BookShipment", on_success="ShipmentBooked", on_failure="ShipmentFailed",
                    timeout_s=5, max_attempts=5)
    async def book(call: EffectCall) -> dict[str, Any]:
        reply = await shipping.book(call.payload, idempotency_key=call.idempotency_key)
        if reply.status == 409:
            raise PermanentEffectError("address_rejected", reply.text)
        return {"tracking": reply.tracking}          # the ShipmentBooked payload

    @effects.query("BookShipment")                   # optional: the resource can be asked
    async def booked(call: EffectCall) -> dict[str, Any] | None:
        found = await shipping.find(idempotency_key=call.idempotency_key)
        return None if found is None else {"tracking": found.tracking}

The runner records the attempt before the call and the result after it, then applies the
result to the emitting aggregate as a message (``on_success`` with the returned payload, or
``on_failure`` with ``{"reason", "error", "attempts"}``, ``causation_id`` = the entry id)
through the store writer, so the aggregate applies it exactly once; only then is the entry
removed from the outbox. After a crash between "attempting" and the recorded result, the
query function decides whether the call happened; without one the call is made again
(:attr:`Effect.guarantee`).

Everything here is pure: no I/O, nothing imported from the runner.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import Any, Final, Literal, TypeAlias

from aggregates.core.errors import AggboxError, ConfigurationError
from aggregates.core.reasons import Reason
from aggregates.core.tracecontext import TRACEPARENT, TRACESTATE
from aggregates.message.envelope import Message

__all__ = [
    "REPLY_ID_PREFIX",
    "REPLY_SOURCE_TYPE",
    "Effect",
    "EffectCall",
    "EffectError",
    "EffectFunction",
    "Effects",
    "Guarantee",
    "PermanentEffectError",
    "QueryFunction",
    "RetryableEffectError",
    "failure_payload",
    "reply_message",
    "reply_message_id",
]

#: The reply's ``message_id`` is this prefix + the effect entry's id: one id for success
#: and failure alike, so an aggregate can apply at most one result per effect.
REPLY_ID_PREFIX: Final = "effect-result:"
#: ``source.type`` of replies (``source.id`` = the aggregate id, ``seq`` = the entry's
#: ``seq``): a source of its own, so a reply never moves the high-water mark of messages
#: the aggregate sends itself.
REPLY_SOURCE_TYPE: Final = "aggbox.effect"

Guarantee: TypeAlias = Literal["once", "at-least-once"]


class EffectError(AggboxError):
    """Raised by an effect or query function: the call did not succeed."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class RetryableEffectError(EffectError):
    """The resource may succeed later (timeout, 5xx, connection refused): the runner calls
    again after a backoff, up to ``max_attempts``. Whether the call took effect is unknown,
    so the next attempt asks the query function first, if there is one."""

    def __init__(self, detail: str = "", *, reason: str = Reason.EFFECT_RETRYABLE) -> None:
        super().__init__(reason, detail)


class PermanentEffectError(EffectError):
    """The resource refused for good (4xx, invalid request): no retry; the aggregate receives
    the failure message and the entry is dead-lettered with ``reason``."""

    def __init__(self, reason: str = Reason.EFFECT_REJECTED, detail: str = "") -> None:
        super().__init__(reason, detail)


@dataclass(frozen=True, slots=True)
class EffectCall:
    """What an effect (or query) function receives: one outbox entry to execute.

    ``idempotency_key`` is the entry id — stable across retries, restarts and instances;
    send it to resources that honour one (HTTP ``Idempotency-Key``). ``attempt`` counts from
    1 and survives restarts (it is stored with the attempt record)."""

    idempotency_key: str
    type: str
    payload: Mapping[str, Any]
    aggregate_type: str
    aggregate_id: str
    attempt: int = 1
    headers: Mapping[str, str] = field(default_factory=dict)
    correlation_id: str | None = None
    created_at: datetime | None = None


EffectFunction: TypeAlias = Callable[
    [EffectCall], "Mapping[str, Any] | Awaitable[Mapping[str, Any] | None] | None"]
QueryFunction: TypeAlias = Callable[
    [EffectCall], "Mapping[str, Any] | Awaitable[Mapping[str, Any] | None] | None"]


@dataclass(frozen=True, slots=True)
class Effect:
    """One effect type. ``call`` performs it and returns the success reply's payload (``None``
    means ``{}``); ``query`` (optional) answers "did the call with this key take effect?":
    a payload if it did, ``None`` if it did not, :class:`RetryableEffectError` if it cannot
    tell now. ``idempotent=True`` declares that the resource does the work once per
    idempotency key even when called twice (docs only: the runner behaves the same)."""

    type: str
    call: EffectFunction
    on_success: str
    on_failure: str
    query: QueryFunction | None = None
    timeout_s: float = 10.0
    max_attempts: int = 5
    idempotent: bool = False
    kind: str = "python"

    def __post_init__(self) -> None:
        for name in ("type", "on_success", "on_failure"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigurationError(f"effect {self.type!r}: {name} must be a non-empty "
                                         f"message type name, got {value!r}")
        if self.on_success == self.on_failure:
            raise ConfigurationError(f"effect {self.type!r}: on_success and on_failure must "
                                     "differ, so the aggregate can tell them apart")
        if not callable(self.call):
            raise ConfigurationError(f"effect {self.type!r}: call must be a function")
        if self.query is not None and not callable(self.query):
            raise ConfigurationError(f"effect {self.type!r}: query must be a function or None")
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s <= 3600):
            raise ConfigurationError(f"effect {self.type!r}: timeout_s must be in (0, 3600] "
                                     f"seconds, got {self.timeout_s!r}")
        if (not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool)
                or not 1 <= self.max_attempts <= 1000):
            raise ConfigurationError(f"effect {self.type!r}: max_attempts must be an integer "
                                     f"in 1..1000, got {self.max_attempts!r}")

    @property
    def guarantee(self) -> Guarantee:
        """``once`` with a query function or an idempotency-honouring resource; otherwise
        ``at-least-once``: a crash between the call and its recorded result calls again."""
        return "once" if self.query is not None or self.idempotent else "at-least-once"

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.call)


class Effects:
    """The effect types of a domain module (the runner finds an instance at the top level of
    the ``--aggregates`` module). Register with :meth:`effect` (decorator) or :meth:`add`."""

    def __init__(self, effects: Iterator[Effect] | list[Effect] | tuple[Effect, ...] = ()
                 ) -> None:
        self._by_type: dict[str, Effect] = {}
        for e in effects:
            self.add(e)

    def add(self, effect: Effect) -> Effect:
        if effect.type in self._by_type:
            raise ConfigurationError(f"effect {effect.type!r} registered twice")
        self._by_type[effect.type] = effect
        return effect

    def effect(self, type: str, *, on_success: str, on_failure: str, timeout_s: float = 10.0,
               max_attempts: int = 5, idempotent: bool = False
               ) -> Callable[[EffectFunction], EffectFunction]:
        """Register the decorated function as the effect for emitted messages of ``type``."""
        def register(fn: EffectFunction) -> EffectFunction:
            self.add(Effect(type, fn, on_success, on_failure, timeout_s=timeout_s,
                            max_attempts=max_attempts, idempotent=idempotent))
            return fn
        return register

    def query(self, type: str) -> Callable[[QueryFunction], QueryFunction]:
        """Register the decorated function as the query of the effect ``type`` (registered
        before)."""
        def register(fn: QueryFunction) -> QueryFunction:
            current = self.get(type)
            if current.query is not None:
                raise ConfigurationError(f"effect {type!r} already has a query function")
            self._by_type[type] = _replace_query(current, fn)
            return fn
        return register

    def get(self, type: str) -> Effect:
        try:
            return self._by_type[type]
        except KeyError:
            raise ConfigurationError(
                f"no effect registered for message type {type!r}; registered: "
                f"{sorted(self._by_type)}") from None

    def merged(self, other: Effects) -> Effects:
        """Both registries in one (a type in both is an error)."""
        return Effects([*self, *other])

    def __contains__(self, type: object) -> bool:
        return type in self._by_type

    def __iter__(self) -> Iterator[Effect]:
        return iter(list(self._by_type.values()))

    def __len__(self) -> int:
        return len(self._by_type)

    @classmethod
    def from_module(cls, module: ModuleType | str) -> Effects:
        """Every :class:`Effects` at a module's top level, merged (empty if there is none)."""
        if isinstance(module, str):
            import importlib

            try:
                module = importlib.import_module(module)
            except ImportError as exc:
                raise ConfigurationError(f"cannot import effects module {module!r}: {exc}. "
                                         "Is it installed or on PYTHONPATH?") from exc
        found = Effects()
        for value in vars(module).values():
            if isinstance(value, Effects) and value is not found:
                found = found.merged(value)
        return found


def _replace_query(effect: Effect, fn: QueryFunction) -> Effect:
    return Effect(effect.type, effect.call, effect.on_success, effect.on_failure, query=fn,
                  timeout_s=effect.timeout_s, max_attempts=effect.max_attempts,
                  idempotent=effect.idempotent, kind=effect.kind)


def reply_message_id(entry_id: str) -> str:
    """The id of the result message of the effect entry ``entry_id`` (pure)."""
    return REPLY_ID_PREFIX + entry_id


def failure_payload(reason: str, error: str, attempts: int) -> dict[str, Any]:
    """The payload of an ``on_failure`` message."""
    return {"reason": reason, "error": error, "attempts": attempts}


def reply_message(effect: Effect, entry: Mapping[str, Any], *, aggregate_type: str,
                  aggregate_id: str, result: Mapping[str, Any] | None = None,
                  failure: tuple[str, str] | None = None, attempts: int = 1,
                  at: datetime | None = None) -> Message:
    """The result message of the effect entry ``entry`` (an outbox entry as stored), for the
    aggregate that emitted it (pure): ``on_success`` with ``result``, or — with ``failure``
    = ``(reason, error)`` — ``on_failure`` with :func:`failure_payload`. Its id is
    :func:`reply_message_id` (one per effect, whatever the result), ``causation_id`` the
    entry id, ``source`` ``(REPLY_SOURCE_TYPE, aggregate id, the entry's seq)``; the entry's
    trace context headers are carried over. Raises
    :class:`~aggregates.core.errors.EnvelopeError` if ``result`` is not a valid payload."""
    entry_id = str(entry.get("id"))
    src = entry.get("source")
    seq = src.get("seq") if isinstance(src, Mapping) else None
    if failure is None:
        mtype, payload = effect.on_success, dict(result or {})
    else:
        mtype, payload = effect.on_failure, failure_payload(failure[0], failure[1], attempts)
    headers = entry.get("headers")
    trace = ({k: str(v) for k, v in headers.items() if k in (TRACEPARENT, TRACESTATE)}
             if isinstance(headers, Mapping) else {})
    return Message.from_dict({
        "message_id": reply_message_id(entry_id),
        "type": mtype,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate_id,
        "payload": payload,
        "occurred_at": at,
        "source": {"type": REPLY_SOURCE_TYPE, "id": aggregate_id,
                   "seq": seq if isinstance(seq, int) and not isinstance(seq, bool)
                   and seq >= 1 else 1},
        "causation_id": entry_id,
        "correlation_id": entry.get("correlation_id"),
        "headers": trace,
    })
