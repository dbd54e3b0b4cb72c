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
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    NamedTuple,
    TypeAlias,
    TypeVar,
    Union,
    cast,
    overload,
)

from pydantic import BaseModel, TypeAdapter, ValidationError

from aggregates.codec import StateCodec, UnknownStateFields, scalar_dataclass_fields
from aggregates.dedup import DedupStrategy, Inbox
from aggregates.envelope import Message
from aggregates.errors import (
    AggboxError,
    ConfigurationError,
    StateMigrationError,
    UnknownAggregateType,
    UnknownMessageType,
    UnknownSchemaVersion,
    UpcastFailed,
)
from aggregates.fieldnames import check_field_names

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

S = TypeVar("S")
#: A message payload class: a pydantic model or a dataclass.
P = TypeVar("P", bound="BaseModel | DataclassInstance")

#: A payload object: an instance of a pydantic model or of a dataclass.
PayloadObject: TypeAlias = "BaseModel | DataclassInstance"

OnHandlerError = Literal["skip", "park"]


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
        if len(args) > 2 or (len(args) == 2 and (type is not None
                                                  or payload is not _NO_PAYLOAD)):
            raise TypeError("use Emit(payload_object, type=...) or Emit(type_name, payload)")
        if len(args) == 2:
            type, payload = args
        elif len(args) == 1 and payload is not _NO_PAYLOAD:  # Emit("T", payload={...})
            if type is not None:
                raise TypeError("Emit(): the message type is given twice")
            type = args[0]
        elif len(args) == 1:
            if isinstance(args[0], str):
                raise TypeError(f"Emit({args[0]!r}) needs a payload")
            payload = args[0]
            if type is None and not isinstance(payload, Mapping):
                type = builtins.type(payload).__name__
        elif payload is _NO_PAYLOAD or type is None:
            raise TypeError("Emit() needs a payload (and a type name for a dict payload)")
        object.__setattr__(self, "type", "" if type is None else type)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "to", to)
        object.__setattr__(self, "topic", topic)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "headers", {} if headers is None else headers)
        object.__setattr__(self, "schema_version", schema_version)


#: What a handler returns: the new state, or the new state and the messages it emits.
Handled: TypeAlias = Union[S, tuple[S, Sequence[Emit]]]  # noqa: UP007
#: A typed handler, registered with ``@atype.handles(PayloadClass)``.
Handler: TypeAlias = Callable[[S, P, Message], Handled[S]]
#: An untyped handler, registered with ``@atype.handles("TypeName", ...)``; also how every
#: registered handler is called (:meth:`AggregateType.handler_for`).
MessageHandler: TypeAlias = Callable[[S, Message], Handled[S]]
#: An upcaster: a message type's payload at version N → its payload at version N + 1.
Upcaster: TypeAlias = Callable[[dict[str, Any]], dict[str, Any]]
#: A state migration: the stored ``state`` document at version N → at version N + 1.
StateMigration: TypeAlias = Callable[[dict[str, Any]], dict[str, Any]]


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


def dump_payload(obj: object) -> dict[str, Any]:
    """A payload object as the JSON-safe dict the outbox stores. Raises ``TypeError`` for an
    object that is not a pydantic model or dataclass instance, or pydantic's errors."""
    return dump_payload_checked(obj)[0]


def dump_payload_checked(obj: object) -> tuple[dict[str, Any], bool]:
    """:func:`dump_payload`, and whether the dict's keys are known to be valid MongoDB field
    names without looking (a dataclass of scalar fields read directly: its keys are Python
    identifiers; the hot path of typed emits)."""
    cls = builtins.type(obj)
    try:
        fast = _SCALAR_FIELDS[cls]
    except KeyError:
        fast = _SCALAR_FIELDS[cls] = scalar_dataclass_fields(cls)
    if fast is not None:
        out: dict[str, Any] = {}
        for name, allowed in fast:
            v = getattr(obj, name)
            if builtins.type(v) not in allowed or (builtins.type(v) is float
                                                  and not math.isfinite(v)):
                break
            out[name] = v
        else:
            return out, True
    return _dump_payload_slow(obj), False


def _dump_payload_slow(obj: object) -> dict[str, Any]:
    cls = builtins.type(obj)
    if not is_payload_class(cls):
        raise TypeError(f"payload must be a dict, a pydantic model or a dataclass instance; "
                        f"got {cls.__name__}")
    out = payload_adapter(cls).dump_python(obj, mode="json", warnings="error")
    if not isinstance(out, dict):
        raise TypeError(f"{cls.__name__} dumps to {builtins.type(out).__name__}, not a dict")
    return out


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
            return self._adapter.validate_python(msg.payload)
        except ValidationError as exc:
            raise InvalidPayload(_describe(exc, self.payload_type)) from None

    def __call__(self, state: S, msg: Message) -> Handled[S]:
        return self.fn(state, self.parse(msg), msg)

    def __repr__(self) -> str:
        return f"<typed handler {self.fn.__qualname__}({self.payload_type.__name__})>"


def _check_arity(fn: Callable[..., Any], n: int, what: str) -> None:
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
        unknown_state_fields: UnknownStateFields = "keep",
        state_version: int = 1,
    ) -> None:
        """``state`` is checked here: a state type the codec cannot store is refused with a
        :class:`ConfigurationError` naming the field (aggregates/codec.py). Stored state
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
        self.collection = collection or name.lower() + "s"
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
                _check_arity(fn, 3, "(state, payload, msg) (it is registered with a payload "
                                    "class)")
            else:
                _check_arity(fn, 2, "(state, msg) (register it with a payload class to get "
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

    # -- evolving schemas (docs/evolving-schemas.md) ------------------------------------
    def upcaster(self, message_type: str | builtins.type[Any], *, from_version: int
                 ) -> Callable[[Upcaster], Upcaster]:
        """Decorator registering ``fn(payload: dict) -> dict``, turning ``message_type``'s
        payload at ``from_version`` into its payload at ``from_version + 1``. Register a
        type's upcasters in order (``from_version=1``, then 2, …); the last one's target is
        the type's current version (:meth:`message_version`). An upcaster must be pure and
        deterministic: it gets a copy of the payload and may change it."""
        mtype = message_type if isinstance(message_type, str) else getattr(
            message_type, "__name__", "")
        if not isinstance(mtype, str) or not mtype:
            raise ConfigurationError(f"{self.name}: upcaster({message_type!r}): pass a message "
                                     "type name or a payload class")
        expected = self.message_version(mtype)
        if (not isinstance(from_version, int) or isinstance(from_version, bool)
                or from_version != expected):
            raise ConfigurationError(
                f"{self.name}: upcaster for {mtype!r} from_version={from_version!r}: "
                f"expected from_version={expected} (register upcasters in order, one per "
                "version step)")

        def register(fn: Upcaster) -> Upcaster:
            _check_arity(fn, 1, "(payload) and return the upgraded payload dict")
            chain = self._upcasters.setdefault(mtype, [])
            if len(chain) + 1 != from_version:
                raise ConfigurationError(f"{self.name}: upcaster for {mtype!r} from version "
                                         f"{from_version} registered twice")
            chain.append(fn)
            return fn

        return register

    @property
    def upcasts(self) -> bool:
        """Whether any upcaster is registered (the fold skips :meth:`upcast` otherwise for
        messages at schema version 1)."""
        return bool(self._upcasters)

    def message_version(self, message_type: str) -> int:
        """The latest schema version of ``message_type``: 1 plus its upcasters."""
        return len(self._upcasters.get(message_type, ())) + 1

    def upcast(self, msg: Message) -> Message:
        """``msg`` with its payload brought to :meth:`message_version` of its type (``msg``
        itself when it is current). Raises :class:`UnknownSchemaVersion` for a version newer
        than the latest, :class:`UpcastFailed` when an upcaster raises or returns
        something that is not a payload dict."""
        latest = self.message_version(msg.type)
        version = msg.schema_version
        if version == latest:
            return msg
        if version > latest:
            raise UnknownSchemaVersion(
                f"{msg.type} schema_version {version} is newer than the latest this "
                f"definition of {self.name} knows ({latest}); deploy the definitions with its "
                "upcaster (readers first), then replay the dead letters")
        payload = _run_chain(self._upcasters[msg.type][version - 1:], msg.payload,
                             start=version, what=f"upcaster {{}} of {msg.type}",
                             error=UpcastFailed)
        try:
            check_field_names(payload, "payload", envelope=True)
        except AggboxError as exc:
            raise UpcastFailed(f"the upcast payload of {msg.type}: {exc}") from None
        return dataclasses.replace(msg, payload=payload, schema_version=latest)

    def state_migration(self, *, from_version: int
                        ) -> Callable[[StateMigration], StateMigration]:
        """Decorator registering ``fn(doc: dict) -> dict``, turning a stored ``state``
        document at ``from_version`` into one at ``from_version + 1`` (plain BSON values, as
        stored; before the codec loads it). Register them in order, from 1 up to
        ``state_version - 1``. A migration must be pure and deterministic: it gets a copy."""
        expected = len(self._migrations) + 1
        if (not isinstance(from_version, int) or isinstance(from_version, bool)
                or from_version != expected):
            raise ConfigurationError(
                f"{self.name}: state_migration(from_version={from_version!r}): expected "
                f"from_version={expected} (register migrations in order, one per version step)")
        if from_version >= self.state_version:
            raise ConfigurationError(
                f"{self.name}: state_migration(from_version={from_version}) goes beyond "
                f"state_version={self.state_version}; raise state_version")

        def register(fn: StateMigration) -> StateMigration:
            _check_arity(fn, 1, "(state_document) and return the migrated document")
            if len(self._migrations) + 1 != from_version:
                raise ConfigurationError(f"{self.name}: state migration from version "
                                         f"{from_version} registered twice")
            self._migrations.append(fn)
            return fn

        return register

    def migrate_state(self, doc: Mapping[str, Any] | None, stored_version: int
                      ) -> Mapping[str, Any] | None:
        """The stored ``state`` document ``doc`` (written at ``stored_version``) brought to
        :attr:`state_version` (``doc`` itself when current; ``None`` and an empty document
        are never migrated: there is nothing to convert). Raises
        :class:`StateMigrationError`."""
        if (not isinstance(stored_version, int) or isinstance(stored_version, bool)
                or stored_version < 1):
            raise StateMigrationError(f"{self.name}: the stored state version (_sv) "
                                      f"{stored_version!r} is not an integer ≥ 1")
        if stored_version > self.state_version:
            raise StateMigrationError(
                f"{self.name}: the stored state was written by a newer version (_sv "
                f"{stored_version}, this definition has state_version {self.state_version}); "
                "deploy the newer definitions")
        if stored_version == self.state_version or not doc:
            return doc
        if len(self._migrations) < self.state_version - 1:
            raise StateMigrationError(
                f"{self.name}: no state migration from version {len(self._migrations) + 1} "
                f"(state_version is {self.state_version}); register one with "
                f"@{self.name.lower()}.state_migration(from_version="
                f"{len(self._migrations) + 1})")
        return _run_chain(self._migrations[stored_version - 1:self.state_version - 1],
                          dict(doc), start=stored_version,
                          what=f"{self.name}: state migration {{}}", error=StateMigrationError)

    def load_state(self, doc: Mapping[str, Any] | None, stored_version: int = 1) -> S:
        """The state object of a stored ``state`` document written at ``stored_version``
        (the document's ``_sv``): migrated (:meth:`migrate_state`), then loaded by the codec.
        Raises :class:`StateMigrationError` or the codec's ``StateCodecError``."""
        if type(stored_version) is int and stored_version == self.state_version:  # current
            return self.codec.load(doc)
        return self.codec.load(self.migrate_state(doc, stored_version))

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


def _run_chain(fns: Sequence[Callable[[Any], Any]], value: Mapping[str, Any], *, start: int,
               what: str, error: builtins.type[AggboxError]) -> dict[str, Any]:
    """Apply version steps ``fns`` (the first takes version ``start``) to a deep copy of
    ``value``; each must return a dict. ``what`` names a step (``{}`` → the function)."""
    out: Any = copy.deepcopy(dict(value))
    for i, fn in enumerate(fns, start=start):
        name = what.format(getattr(fn, "__qualname__", fn))
        try:
            out = fn(out)
        except Exception as exc:
            raise error(f"{name} from version {i} to {i + 1} raised "
                        f"{builtins.type(exc).__name__}: {' '.join(str(exc).split())}"
                        ) from exc
        if not isinstance(out, dict):
            raise error(f"{name} from version {i} to {i + 1} returned "
                        f"{builtins.type(out).__name__}, not a dict")
    return cast(dict[str, Any], out)
