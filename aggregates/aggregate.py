"""Defining an aggregate type and its handlers.

    @dataclass(frozen=True)
    class Customer:
        credit_limit: int = 0
        reserved: int = 0

    customers = AggregateType("Customer", state=Customer, collection="customers")

    @customers.handles("OrderCreated")
    def reserve(state: Customer, msg: Message) -> Handled[Customer]:
        amount = msg.payload["amount"]
        if state.reserved + amount > state.credit_limit:
            return state, [Emit("CreditLimitExceeded", {...}, to=("Order", order_id))]
        return replace(state, reserved=state.reserved + amount), [Emit("CreditReserved", {...})]

A handler is ``(state, message) -> state`` or ``-> (state, [Emit, ...])``; it must be
deterministic and side-effect free (docs/design.md "Invariants", 5) and must not mutate
the state it receives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Generic, Literal, TypeAlias, TypeVar, Union, cast

from aggregates.dedup import DedupStrategy, Inbox
from aggregates.envelope import Message
from aggregates.errors import ConfigurationError, UnknownAggregateType, UnknownMessageType

S = TypeVar("S")

OnHandlerError = Literal["skip", "park"]


@dataclass(frozen=True, slots=True)
class Emit:
    """A message a handler wants published (it becomes an outbox entry).

    ``to=(aggregate_type, aggregate_id)`` addresses it to another aggregate, so the published
    record is itself a valid input envelope. ``topic`` defaults to the aggregate type's topic
    (or the dispatcher's template), ``key`` to the emitting aggregate's id."""

    type: str
    payload: Mapping[str, Any]
    to: tuple[str, str] | None = None
    topic: str | None = None
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


Handled: TypeAlias = Union[S, tuple[S, Sequence[Emit]]]  # noqa: UP007
Handler: TypeAlias = Callable[[S, Message], Any]


class StateCodec(Generic[S]):
    """Converts between the handler's state object and the stored ``state`` sub-document."""

    def __init__(self, state: type[S] | Callable[[], S]) -> None:
        self._factory = state
        self._is_dataclass = isinstance(state, type) and dataclasses.is_dataclass(state)
        self._is_pydantic = isinstance(state, type) and hasattr(state, "model_validate")
        if self._is_dataclass:
            self._fields = [f.name for f in dataclasses.fields(state)]  # type: ignore[arg-type]

    def initial(self) -> S:
        return self._factory()

    def load(self, doc: Mapping[str, Any] | None) -> S:
        if doc is None:
            return self.initial()
        if self._is_dataclass:
            factory: Any = self._factory
            return cast(S, factory(**{k: doc[k] for k in self._fields if k in doc}))
        if self._is_pydantic:
            model: Any = self._factory
            return model.model_validate(dict(doc))  # type: ignore[no-any-return]
        base: Any = self.initial()
        if isinstance(base, dict):
            base.update(doc)
            return cast(S, base)
        raise ConfigurationError(
            f"state type {self._factory!r} is neither a dataclass, a pydantic model nor dict; "
            "use one of those"
        )

    def dump(self, state: S) -> dict[str, Any]:
        if isinstance(self._factory, type) and not isinstance(state, self._factory):
            from aggregates.errors import HandlerError

            raise HandlerError(f"handler returned state of type {type(state).__name__}, "
                               f"expected {self._factory.__name__}")
        if self._is_dataclass:
            return {k: _plain(getattr(state, k)) for k in self._fields}
        if self._is_pydantic:
            return state.model_dump(mode="python")  # type: ignore[attr-defined,no-any-return]
        if isinstance(state, Mapping):
            return {k: _plain(v) for k, v in state.items()}
        raise ConfigurationError(f"handler returned state of type {type(state).__name__}")


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> Any:
    if type(value) in _SCALARS:  # the common case, checked first (hot path)
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, frozenset | set):
        return sorted(value)
    return value


class AggregateType(Generic[S]):
    """One kind of aggregate: where its documents live, how it deduplicates, its handlers."""

    def __init__(
        self,
        name: str,
        *,
        state: type[S] | Callable[[], S],
        collection: str | None = None,
        dedup: DedupStrategy | None = None,
        on_handler_error: OnHandlerError = "skip",
        topic: str | None = None,
        max_outbox: int = 1000,
    ) -> None:
        if not name or "/" in name or "." in name or name.startswith("$"):
            raise ConfigurationError(
                f"aggregate type name {name!r} must be non-empty without '/', '.' or a "
                "leading '$'"
            )
        if on_handler_error not in ("skip", "park"):
            raise ConfigurationError(
                f"on_handler_error={on_handler_error!r}: use 'skip' (dead-letter the message "
                "and go on) or 'park' (dead-letter it and park the aggregate's later messages)"
            )
        if max_outbox < 1:
            raise ConfigurationError("max_outbox must be ≥ 1")
        self.name = name
        self.collection = collection or name.lower() + "s"
        self.dedup: DedupStrategy = dedup if dedup is not None else Inbox()
        self.on_handler_error: OnHandlerError = on_handler_error
        self.topic = topic
        self.max_outbox = max_outbox
        self.codec: StateCodec[S] = StateCodec(state)
        self._handlers: dict[str, Handler[S]] = {}

    def handles(self, *message_types: str) -> Callable[[Handler[S]], Handler[S]]:
        """Decorator registering a handler for one or more message types."""
        if not message_types:
            raise ConfigurationError("handles() needs at least one message type")

        def register(fn: Handler[S]) -> Handler[S]:
            for mtype in message_types:
                if mtype in self._handlers:
                    raise ConfigurationError(
                        f"{self.name}: message type {mtype!r} already has a handler "
                        f"({self._handlers[mtype].__name__})"
                    )
                self._handlers[mtype] = fn
            return fn

        return register

    @property
    def message_types(self) -> list[str]:
        return sorted(self._handlers)

    def handler_for(self, message_type: str) -> Handler[S]:
        try:
            return self._handlers[message_type]
        except KeyError:
            raise UnknownMessageType(self.name, message_type, list(self._handlers)) from None

    def __repr__(self) -> str:
        return (
            f"AggregateType({self.name!r}, collection={self.collection!r}, "
            f"dedup={self.dedup!r}, handlers={self.message_types})"
        )


class Registry:
    """The aggregate types a pipeline or writer knows, by name."""

    def __init__(self, types: Iterable[AggregateType[Any]] = ()) -> None:
        self._types: dict[str, AggregateType[Any]] = {}
        for t in types:
            self.register(t)

    def register(self, atype: AggregateType[Any]) -> AggregateType[Any]:
        existing = self._types.get(atype.name)
        if existing is not None and existing is not atype:
            raise ConfigurationError(f"aggregate type {atype.name!r} registered twice")
        for other in self._types.values():
            if other is not atype and other.collection == atype.collection:
                raise ConfigurationError(
                    f"aggregate types {other.name!r} and {atype.name!r} share the collection "
                    f"{atype.collection!r}; give each type its own collection (documents are "
                    "keyed by aggregate id alone)"
                )
        self._types[atype.name] = atype
        return atype

    def get(self, name: str) -> AggregateType[Any]:
        try:
            return self._types[name]
        except KeyError:
            raise UnknownAggregateType(name, list(self._types)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def __iter__(self) -> Any:
        return iter(self._types.values())

    def __len__(self) -> int:
        return len(self._types)

    @property
    def names(self) -> list[str]:
        return sorted(self._types)

    @classmethod
    def from_module(cls, module: ModuleType | str) -> Registry:
        """Collect every :class:`AggregateType` defined at a module's top level (or the
        module's ``registry`` attribute if it has one)."""
        if isinstance(module, str):
            import importlib

            try:
                module = importlib.import_module(module)
            except ImportError as exc:
                raise ConfigurationError(
                    f"cannot import aggregates module {module!r}: {exc}. Is it installed or "
                    "on PYTHONPATH (and shipped to executors with --py-files)?"
                ) from exc
        found = getattr(module, "registry", None)
        if isinstance(found, Registry):
            return found
        reg = cls(v for v in vars(module).values() if isinstance(v, AggregateType))
        if not reg:
            raise ConfigurationError(f"module {module.__name__!r} defines no AggregateType")
        return reg
