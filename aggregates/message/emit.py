"""What a handler emits: :class:`Emit`, addressed with an :class:`AggregateRef`; the timers it
schedules and cancels (:class:`Schedule`, :class:`Cancel`; docs/design.md "Timers"); and what
it returns (:data:`Handled`)."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, TypeVar, Union, overload

from pydantic import BaseModel

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["AggregateRef", "Cancel", "Emit", "Handled", "P", "PayloadObject", "S", "Schedule"]

S = TypeVar("S")
#: A message payload class: a pydantic model or a dataclass.
P = TypeVar("P", bound="BaseModel | DataclassInstance")

#: A payload object: an instance of a pydantic model or of a dataclass.
PayloadObject: TypeAlias = "BaseModel | DataclassInstance"


class AggregateRef(NamedTuple):
    """The address of one aggregate, ``orders.ref("o-1")``: what ``Emit(..., to=...)`` takes.
    It is an ``(aggregate_type, aggregate_id)`` tuple, so ``to=orders.ref("o-1")`` and
    ``to=("Order", "o-1")`` address the same aggregate and give the same outbox entry."""

    aggregate_type: str
    aggregate_id: str


_NO_PAYLOAD: Any = object()


@dataclass(frozen=True, slots=True, init=False)
class Emit:
    """A message a handler wants published (it becomes an outbox entry).

    Two forms: ``Emit(OrderCreated(order_id=..., amount=...))`` with a payload object (an
    instance of a pydantic model or a dataclass; the message type is its class name unless
    ``type="..."`` is given), or ``Emit("OrderCreated", {"order_id": ..., ...})`` with a type
    name and a dict. A payload object is dumped to a JSON-safe dict for the outbox
    (``TypeAdapter(cls).dump_python(obj, mode="json")``) when the fold stores the entry; a
    payload that cannot be dumped dead-letters the message ``invalid_emit``.

    ``to=orders.ref(order_id)`` (an :class:`AggregateRef`) or ``to=("Order", order_id)``
    addresses it to another aggregate, so the published record is itself a valid input
    envelope. ``topic`` defaults to the aggregate type's topic (or the dispatcher's
    template), ``key`` to the emitting aggregate's id. ``schema_version`` is the payload's
    schema version, written into the published envelope (default: none, i.e. 1): set it
    when the receiving type upcasts older versions of this message
    (docs/evolving-schemas.md)."""

    type: str
    #: a dict, or the payload object as given (dumped by the fold)
    payload: Mapping[str, Any] | PayloadObject
    to: tuple[str, str] | None
    topic: str | None
    key: str | None
    headers: Mapping[str, str]
    schema_version: int | None

    @overload
    def __init__(self, type: str, payload: Mapping[str, Any], *,
                 to: AggregateRef | tuple[str, str] | None = None, topic: str | None = None,
                 key: str | None = None, headers: Mapping[str, str] | None = None,
                 schema_version: int | None = None) -> None: ...

    @overload
    def __init__(self, payload: PayloadObject, /, *, type: str | None = None,
                 to: AggregateRef | tuple[str, str] | None = None, topic: str | None = None,
                 key: str | None = None, headers: Mapping[str, str] | None = None,
                 schema_version: int | None = None) -> None: ...

    def __init__(self, *args: Any, type: Any = None, payload: Any = _NO_PAYLOAD,
                 to: Any = None, topic: Any = None, key: Any = None,
                 headers: Any = None, schema_version: Any = None) -> None:
        # Never raises for bad values (only for a wrong call): the fold checks what a handler
        # emitted and dead-letters the message ``invalid_emit`` with a reason.
        n = len(args)
        if n == 1 and payload is _NO_PAYLOAD:  # Emit(obj, ...) (the common forms first)
            payload = args[0]
            if isinstance(payload, str):
                raise TypeError(f"Emit({payload!r}) needs a payload")
            if type is None and not isinstance(payload, Mapping):
                type = builtins.type(payload).__name__
        elif n == 2 and type is None and payload is _NO_PAYLOAD:  # Emit("T", {...}, ...)
            type, payload = args
        elif n >= 2:
            raise TypeError("use Emit(payload_object, type=...) or Emit(type_name, payload)")
        elif n == 1:  # Emit("T", payload={...})
            if type is not None:
                raise TypeError("Emit(): the message type is given twice")
            type = args[0]
        elif payload is _NO_PAYLOAD or type is None:
            raise TypeError("Emit() needs a payload (and a type name for a dict payload)")
        # The slots are filled directly (a frozen dataclass refuses setattr): ~7 calls of
        # ``object.__setattr__`` cost more than the rest of the constructor.
        _set_type(self, "" if type is None else type)
        _set_payload(self, payload)
        _set_to(self, to)
        _set_topic(self, topic)
        _set_key(self, key)
        _set_headers(self, {} if headers is None else headers)
        _set_schema_version(self, schema_version)


_set_type, _set_payload, _set_to, _set_topic, _set_key, _set_headers, _set_schema_version = (
    Emit.__dict__[name].__set__
    for name in ("type", "payload", "to", "topic", "key", "headers", "schema_version"))


@dataclass(frozen=True, slots=True)
class Schedule:
    """Publish ``emit`` at ``at`` (an aware datetime) or ``after`` a delay from the handling
    time — exactly one of the two. ``key`` names the timer within the aggregate: a pending
    timer with the same key is replaced. ``emit.to`` addresses another aggregate; without
    it the timer's message is input for the scheduling aggregate itself. Invalid values are
    not raised here: the fold dead-letters the message ``invalid_timer`` naming them."""

    emit: Emit
    key: str
    at: datetime | None = None
    after: timedelta | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    """Remove the pending timer ``key`` of this aggregate (nothing if there is none). A
    timer cancelled before the dispatcher read it never fires; for the limits see
    docs/design.md "Timers"."""

    key: str


#: What a handler returns: the new state, or the new state and the messages it emits (and
#: the timers it schedules or cancels).
Handled: TypeAlias = Union[S, tuple[S, Sequence[Emit | Schedule | Cancel]]]  # noqa: UP007
