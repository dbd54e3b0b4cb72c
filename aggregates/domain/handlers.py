"""Handlers: the handler signatures, typed handlers (the payload validated into its class
first) and the payload helpers typed handlers and emits share (a payload class ⇄ the dict
the envelope and the outbox carry)."""

from __future__ import annotations

import builtins
import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, Generic, TypeAlias

from pydantic import BaseModel, TypeAdapter, ValidationError

from aggregates.codec import scalar_dataclass_fields
from aggregates.core.errors import AggboxError, ConfigurationError
from aggregates.core.jsonvalue import INT64_MAX, INT64_MIN, json_payload
from aggregates.domain.typedjson import dump_json
from aggregates.message.emit import Handled, P, S
from aggregates.message.envelope import Message

__all__ = [
    "Handler",
    "InvalidPayload",
    "MessageHandler",
    "TypedHandler",
    "check_arity",
    "dump_payload",
    "dump_payload_checked",
    "is_payload_class",
    "payload_adapter",
]

#: A typed handler, registered with ``@atype.handles(PayloadClass)``.
Handler: TypeAlias = Callable[[S, P, Message], Handled[S]]
#: An untyped handler, registered with ``@atype.handles("TypeName", ...)``; also how every
#: registered handler is called (:meth:`AggregateType.handler_for`).
MessageHandler: TypeAlias = Callable[[S, Message], Handled[S]]


class InvalidPayload(AggboxError):
    """A message's payload does not validate into its typed handler's payload class
    (dead-lettered ``invalid_payload``). The text is one line naming the field paths."""


def is_payload_class(cls: object) -> bool:
    """A pydantic model class or a dataclass (what typed handlers and emits take)."""
    return isinstance(cls, builtins.type) and (
        issubclass(cls, BaseModel) or dataclasses.is_dataclass(cls))


_ADAPTERS: dict[builtins.type[Any], TypeAdapter[Any]] = {}


def payload_adapter(cls: builtins.type[Any]) -> TypeAdapter[Any]:
    """The pydantic ``TypeAdapter`` of a payload class, built once per class."""
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


_SCALAR_FIELDS: dict[builtins.type[Any], tuple[tuple[str, tuple[type, ...]], ...] | None] = {}


def dump_payload(obj: object, path: str = "payload") -> dict[str, Any]:
    """A payload object as the JSON dict the outbox stores: pydantic's JSON mode, and values
    it does not know judged by the rule of docs/design.md "JSON values"
    (:mod:`aggregates.core.jsonvalue`). Raises
    :class:`~aggregates.core.jsonvalue.NotJSONValue` naming the field under ``path``,
    ``TypeError`` for an object that is not a pydantic model or dataclass instance, or
    pydantic's errors."""
    return dump_payload_checked(obj, path)[0]


def dump_payload_checked(obj: object, path: str = "payload") -> tuple[dict[str, Any], bool]:
    """:func:`dump_payload`, and whether it took the hot path of typed emits: a dataclass
    of scalar fields read directly (keys: Python identifiers; a float finite, an int in
    MongoDB's 64-bit range — anything else takes pydantic's dump and the rule's check). A
    str is taken as it is there: one holding a lone surrogate is refused by the store's
    BSON encoding, which names the field (``aggregates.codec.bson.unstorable_at``)."""
    cls = builtins.type(obj)
    try:
        fast = _SCALAR_FIELDS[cls]
    except KeyError:
        fast = _SCALAR_FIELDS[cls] = scalar_dataclass_fields(cls)
    if fast is not None:
        out: dict[str, Any] = {}
        for name, allowed in fast:
            v = getattr(obj, name)
            t = builtins.type(v)
            if t not in allowed or (t is float and v - v != 0.0) or (
                    t is int and not INT64_MIN <= v <= INT64_MAX):
                break
            out[name] = v
        else:
            return out, True
    return _dump_payload_slow(obj, path), False


def _dump_payload_slow(obj: object, path: str) -> dict[str, Any]:
    cls = builtins.type(obj)
    if not is_payload_class(cls):
        raise TypeError(f"payload must be a dict, a pydantic model or a dataclass instance; "
                        f"got {cls.__name__}")
    adapter = payload_adapter(cls)
    out = dump_json(adapter, obj, path, check_nulls=not _chose_inf_nan(cls))
    if not isinstance(out, dict):
        raise TypeError(f"{cls.__name__} dumps to {builtins.type(out).__name__}, not a dict")
    return json_payload(out, path)


def _chose_inf_nan(cls: builtins.type[Any]) -> bool:
    """Whether the class chose how pydantic writes a NaN or infinity it infers the type of
    (``ser_json_inf_nan``): then a ``null`` in its dump is that choice, not a lost NaN."""
    config = getattr(cls, "model_config", None) or getattr(cls, "__pydantic_config__", None)
    return isinstance(config, dict) and "ser_json_inf_nan" in config


def _describe(exc: ValidationError, cls: builtins.type[Any], limit: int = 3) -> str:
    """pydantic's errors as one line: ``PlaceOrder: amount: Input should be ...``."""
    parts = []
    errors = exc.errors(include_url=False)
    for err in errors[:limit]:
        path = ".".join(str(p) for p in err["loc"]) or "(payload)"
        text = f"{path}: {err['msg']}"
        if err["type"] != "missing":
            text += f" (got {err['input']!r:.60})"
        parts.append(text)
    if len(errors) > limit:
        parts.append(f"and {len(errors) - limit} more")
    return " ".join(f"{cls.__name__}: {'; '.join(parts)}".split())


class TypedHandler(Generic[S, P]):
    """A handler registered with a payload class. Called like an untyped handler,
    ``(state, msg)``: :meth:`parse` validates ``msg.payload`` into the payload class (with a
    ``TypeAdapter`` built once, at registration) and the function gets
    ``(state, payload, msg)``. The fold calls :meth:`parse` and :attr:`fn` separately, so an
    invalid payload is dead-lettered ``invalid_payload``, not ``handler_error``."""

    def __init__(self, fn: Handler[S, P], payload_type: builtins.type[P],
                 message_type: str) -> None:
        self.fn = fn
        self.payload_type = payload_type
        self.message_type = message_type
        try:
            self._adapter: TypeAdapter[P] = TypeAdapter(payload_type)
            if not self._adapter.pydantic_complete:  # names an annotation cannot resolve
                self._adapter.rebuild(raise_errors=True)
            if not self._adapter.pydantic_complete:
                raise TypeError("not fully defined")
            # The core validator, called directly (as the codec does): the adapter's own
            # validate_python only passes its default options on, per message.
            self._validate: Callable[[Any], P] = self._adapter.validator.validate_python
        except Exception as exc:
            raise ConfigurationError(
                f"payload class {payload_type.__name__} of message type {message_type!r}: "
                f"pydantic cannot validate it ({builtins.type(exc).__name__}: "
                f"{' '.join(str(exc).split())}); define the class and the types its fields "
                "use at module level"
            ) from exc
        functools.update_wrapper(self, fn)  # name, annotations, __wrapped__

    def parse(self, msg: Message) -> P:
        """``msg.payload`` validated into the payload class, or :class:`InvalidPayload`."""
        try:
            return self._validate(msg.payload)
        except ValidationError as exc:
            raise InvalidPayload(_describe(exc, self.payload_type)) from None

    def __call__(self, state: S, msg: Message) -> Handled[S]:
        return self.fn(state, self.parse(msg), msg)

    def __repr__(self) -> str:
        return f"<typed handler {self.fn.__qualname__}({self.payload_type.__name__})>"


def check_arity(fn: Callable[..., Any], n: int, what: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to check
        return
    try:
        sig.bind(*range(n))
    except TypeError:
        raise ConfigurationError(
            f"handler {getattr(fn, '__qualname__', fn)!r} must take {what}; it is "
            f"{getattr(fn, '__name__', 'handler')}{sig}"
        ) from None


