"""Defining an aggregate type and its handlers.

    @dataclass(frozen=True)
    class Customer:
        credit_limit: int = 0
        reserved: int = 0

    customers = AggregateType("Customer", state=Customer, collection="customers")

    @dataclass(frozen=True)
    class OrderCreated:                 # a payload class: a dataclass or a pydantic model
        order_id: str
        amount: int

    @customers.handles(OrderCreated)    # message type "OrderCreated" (or type="...")
    def reserve(state: Customer, payload: OrderCreated, msg: Message) -> Handled[Customer]:
        reply = CreditReserved(order_id=payload.order_id, amount=payload.amount)
        if state.reserved + payload.amount > state.credit_limit:
            return state, [Emit(CreditLimitExceeded(...), to=orders.ref(payload.order_id))]
        return replace(state, reserved=state.reserved + payload.amount), [Emit(reply)]

    @customers.handles("CustomerRegistered")    # untyped: the payload is msg.payload, a dict
    def register(state: Customer, msg: Message) -> Customer: ...

A *typed* handler (registered with a payload class) is ``(state, payload, message)``: the
message's payload is validated into that class before the handler runs (a payload that does
not validate is dead-lettered ``invalid_payload``). An *untyped* handler (registered with
message type names) is ``(state, message)``. Either returns ``state`` or
``(state, [Emit, ...])``; it must be deterministic and side-effect free (docs/design.md
"Invariants", 5) and must not mutate the state it receives.

This module holds :class:`AggregateType` and :class:`Registry` and re-exports the rest of the
definition API: ``Emit`` and ``AggregateRef`` (:mod:`aggregates.message.emit`), the handler
types and payload helpers (:mod:`aggregates.domain.handlers`), upcasters and state migrations
(:mod:`aggregates.domain.evolution`).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, Literal, overload

from aggregates.codec import StateCodec, UnknownStateFields
from aggregates.core.errors import ConfigurationError, UnknownAggregateType, UnknownMessageType
from aggregates.dedup import DedupStrategy, Inbox
from aggregates.domain.evolution import SchemaEvolution, StateMigration, Upcaster
from aggregates.domain.handlers import (
    Handler,
    InvalidPayload,
    MessageHandler,
    TypedHandler,
    check_arity,
    dump_payload,
    dump_payload_checked,
    is_payload_class,
    payload_adapter,
)
from aggregates.message.emit import AggregateRef, Emit, Handled, P, PayloadObject, S

__all__ = [
    "AggregateRef",
    "AggregateType",
    "Emit",
    "Handled",
    "Handler",
    "InvalidPayload",
    "MessageHandler",
    "OnHandlerError",
    "PayloadObject",
    "Registry",
    "StateCodec",
    "StateMigration",
    "TypedHandler",
    "Upcaster",
    "default_collection",
    "dump_payload",
    "dump_payload_checked",
    "former_default_collection",
    "is_payload_class",
    "payload_adapter",
]

OnHandlerError = Literal["skip", "park"]

_VOWELS = frozenset("aeiou")


def default_collection(name: str) -> str:
    """The collection of an aggregate type that names none: its name in lower case, made
    plural — ``Order`` → ``orders``, ``Category`` → ``categories``, ``Box`` → ``boxes``,
    ``Address`` → ``addresses``, ``Batch`` → ``batches`` (consonant + y → ies; s, x, z, ch,
    sh → + es; else + s). Before aggbox 0.2 it was always + s (``categorys``): such a type is
    named by :func:`former_default_collection`, docs/operations.md "Upgrading"."""
    word = name.lower()
    if len(word) > 1 and word.endswith("y") and word[-2] not in _VOWELS:
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    return word + "s"


def former_default_collection(name: str) -> str | None:
    """The default collection of a type named ``name`` before aggbox 0.2 (its name in lower
    case + s) when it differs from :func:`default_collection`'s; else None."""
    former = name.lower() + "s"
    return former if former != default_collection(name) else None


class AggregateType(SchemaEvolution[S]):
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
        unknown_state_fields: UnknownStateFields = "keep",
        state_version: int = 1,
    ) -> None:
        """``state`` is checked here: a state type the codec cannot store is refused with a
        :class:`ConfigurationError` naming the field (aggregates/codec/__init__.py). Stored state
        fields the type does not know are carried into the next write
        (``unknown_state_fields="keep"``) or dead-letter the message ``invalid_state``
        (``"refuse"``).

        ``state_version`` is the version of the ``state`` shape this definition writes (the
        document's ``_sv``); older stored states are brought up to it by the
        :meth:`state_migration` chain when loaded (docs/evolving-schemas.md)."""
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
        if (not isinstance(state_version, int) or isinstance(state_version, bool)
                or state_version < 1):
            raise ConfigurationError(f"{name}: state_version={state_version!r} must be an "
                                     "integer ≥ 1")
        self.name = name
        self.collection = collection or default_collection(name)
        #: the collection this type defaulted to before aggbox 0.2, when that was another one
        #: (``categorys``): the commands refuse to run while it holds documents
        self.former_collection = None if collection else former_default_collection(name)
        self.dedup: DedupStrategy = dedup if dedup is not None else Inbox()
        self.on_handler_error: OnHandlerError = on_handler_error
        self.topic = topic
        self.max_outbox = max_outbox
        self.codec: StateCodec[S] = StateCodec(state, name=name,
                                               unknown_state_fields=unknown_state_fields)
        self._handlers: dict[str, MessageHandler[S]] = {}
        self.state_version = state_version
        #: message type → upcasters, index i turning version i + 1 into i + 2
        self._upcasters: dict[str, list[Upcaster]] = {}
        #: index i turns stored state version i + 1 into i + 2
        self._migrations: list[StateMigration] = []

    @overload
    def handles(self, message_type: str, /, *message_types: str
                ) -> Callable[[MessageHandler[S]], MessageHandler[S]]: ...

    @overload
    def handles(self, payload: builtins.type[P], /, *, type: str | None = None
                ) -> Callable[[Handler[S, P]], Handler[S, P]]: ...

    def handles(self, *args: Any, type: str | None = None) -> Any:
        """Decorator registering a handler.

        ``@atype.handles(PlaceOrder)`` (a pydantic model or dataclass; the message type is
        the class name, or ``type="..."``): a typed handler ``(state, payload, msg)``, the
        payload validated into ``PlaceOrder`` first. ``@atype.handles("PlaceOrder", ...)``
        (one or more type names): an untyped handler ``(state, msg)``, the payload a dict."""
        if not args:
            raise ConfigurationError("handles() needs a payload class or message type names")
        typed = not isinstance(args[0], str)
        if typed:
            cls = args[0]
            if len(args) > 1 or not is_payload_class(cls):
                raise ConfigurationError(
                    f"handles({', '.join(map(repr, args))}): pass one payload class (a pydantic "
                    "model or a dataclass) or message type names (strings)")
            names = [cls.__name__ if type is None else type]
        else:
            if type is not None or not all(isinstance(a, str) for a in args):
                raise ConfigurationError(
                    f"handles({', '.join(map(repr, args))}): message type names are strings; "
                    "type= goes with a payload class")
            names = list(args)
        for mtype in names:
            if not isinstance(mtype, str) or not mtype:
                raise ConfigurationError(f"{self.name}: message type {mtype!r} must be a "
                                         "non-empty string")

        def register(fn: Any) -> Any:
            if typed:
                check_arity(fn, 3, "(state, payload, msg) (it is registered with a payload "
                                    "class)")
            else:
                check_arity(fn, 2, "(state, msg) (register it with a payload class to get "
                                    "(state, payload, msg))")
            for mtype in names:
                if mtype in self._handlers:
                    raise ConfigurationError(
                        f"{self.name}: message type {mtype!r} already has a handler "
                        f"({getattr(self._handlers[mtype], '__name__', '?')})"
                    )
                self._handlers[mtype] = TypedHandler(fn, cls, mtype) if typed else fn
            return fn

        return register

    def ref(self, aggregate_id: str) -> AggregateRef:
        """The address of this type's aggregate ``aggregate_id``, for ``Emit(..., to=...)``."""
        return AggregateRef(self.name, aggregate_id)

    @property
    def message_types(self) -> list[str]:
        return sorted(self._handlers)

    def handler_for(self, message_type: str) -> MessageHandler[S]:
        """The handler of ``message_type``, called ``(state, msg)``: a typed handler comes as
        its :class:`TypedHandler` (which validates the payload, then calls the function)."""
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
