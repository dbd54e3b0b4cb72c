"""The state codec: the handler's state object ⇄ the stored ``state`` sub-document.

One :class:`StateCodec` per aggregate type, built when the type is defined. It converts with
one pydantic ``TypeAdapter`` (``dump_python(mode="python")`` then a small BSON-normalising
step; ``validate_python`` on load) and round-trips what domain teams use as state:
dataclasses (frozen or not, nested, defaults, ``default_factory``), pydantic models,
``typing_extensions.TypedDict``\\ s and plain dicts, with fields of these types:

==================  ===========================================================================
Python              stored as (BSON)
==================  ===========================================================================
str, int, float,    themselves
bool, None, bytes
datetime            a BSON date (UTC milliseconds). Must be timezone-aware and a whole number
                    of milliseconds: anything else is refused at dump (``StateCodecError``,
                    the message is dead-lettered ``invalid_state``), never rounded, so
                    ``load(dump(x)) == x`` for every value the codec accepts. Loads back in UTC
                    (a naive stored date is read as UTC).
date                a BSON date at midnight UTC (loads back as ``date``)
Decimal             ``Decimal128`` (exact; a value Decimal128 cannot hold exactly is refused)
Enum / StrEnum      its ``value`` (str or int)
UUID                BSON binary subtype 4 (the standard UUID representation)
tuple, list, set,   an array (sets sorted, so the stored array does not depend on hashing)
frozenset
dict[str, X]        an embedded document (keys: str, or Enum/Literal with str values)
dataclass, model,   an embedded document
TypedDict
Optional / unions   the member's form; members that would be stored alike (``date |
                    datetime``, ``str | MyEnum``, ``list[int] | tuple[int, ...]`` …) are
                    refused, they could not be told apart on load
==================  ===========================================================================

A type it cannot store is refused when the aggregate type is defined
(:class:`~aggregates.core.errors.ConfigurationError` naming the field path and the type).

Unknown stored fields (in the stored ``state`` but not in the current type, at any depth
of nested structures) are never dropped silently; the policy is per aggregate type:
``"keep"`` (default) carries them, unchanged, into the next write of the aggregate;
``"refuse"`` makes the write fail, so the message is dead-lettered ``invalid_state`` naming
the field. The codec remembers the unknown fields of the document it loaded last in the
current context (thread / task) and merges them into the documents it dumps after that —
the fold loads once, then dumps the state after each message it applies.

The definition-time type checks are in :mod:`aggregates.codec.check`, the BSON normalisation
and the unknown-field helpers in :mod:`aggregates.codec.bson`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast

from pydantic import TypeAdapter, ValidationError
from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError
from typing_extensions import is_typeddict

from aggregates.codec.bson import (
    Unstorable,
    from_bson,
    path_text,
    to_bson,
    unknown_in,
    validation_summary,
    without,
)
from aggregates.codec.check import Flags, check_struct, scalar_dataclass_fields, type_name
from aggregates.core.errors import AggboxError, ConfigurationError, HandlerError
from aggregates.core.fieldnames import check_field_names

S = TypeVar("S")

UnknownStateFields = Literal["keep", "refuse"]



class StateCodecError(AggboxError, ValueError):
    """A state (or stored state document) the codec cannot convert. Raised from
    :meth:`StateCodec.dump` inside the fold, it dead-letters the message ``invalid_state``."""


@dataclass(frozen=True, slots=True)
class _Loaded:
    """What :meth:`StateCodec.load` found besides the state: stored fields the type does not
    know, as (path, value)."""

    unknown: tuple[tuple[tuple[str | int, ...], Any], ...]


class StateCodec(Generic[S]):
    """Converts between the handler's state object and the stored ``state`` sub-document.

    ``state`` is the state type (a dataclass, a pydantic model, a TypedDict, ``dict``) or a
    zero-argument factory returning the initial state (its return type is the state type).
    """

    def __init__(self, state: type[S] | Callable[[], S], *, name: str | None = None,
                 unknown_state_fields: UnknownStateFields = "keep") -> None:
        if unknown_state_fields not in ("keep", "refuse"):
            raise ConfigurationError(
                f"unknown_state_fields={unknown_state_fields!r}: use 'keep' (carry stored "
                "fields the state type does not know into the next write) or 'refuse' "
                "(dead-letter the message, reason invalid_state)")
        self._factory = state
        if isinstance(state, type) or is_typeddict(state):
            tp: Any = state
        else:
            try:
                tp = type(state())
            except Exception as exc:
                raise ConfigurationError(
                    f"state factory {state!r} failed: {type(exc).__name__}: {exc}") from exc
        self.state_type: Any = tp
        self.name: str = name or str(getattr(tp, "__name__", "state"))
        self.unknown_state_fields: UnknownStateFields = unknown_state_fields
        self._plain_dict = tp is dict
        flags = Flags()
        if not self._plain_dict:
            check_struct(tp, self.name, flags, set())
        else:
            flags.any = True
        self._dump_walk = flags.any or flags.dump_walk
        self._load_walk = flags.any or flags.load_walk
        self._adapter: TypeAdapter[Any] | None = None
        if not self._plain_dict:
            try:
                self._adapter = TypeAdapter(tp)
            except (PydanticSchemaGenerationError, PydanticUserError, NameError) as exc:
                raise ConfigurationError(
                    f"{self.name}: state type {type_name(tp)} cannot be stored in MongoDB: "
                    f"{exc}") from exc
        # pydantic-core's validator and serializer, called directly (the TypeAdapter methods
        # add ~0.4 µs per call on the hot path).
        self._validate: Callable[..., Any] = (
            self._adapter.validator.validate_python if self._adapter else dict)
        self._serialize: Callable[..., Any] = (
            self._adapter.serializer.to_python if self._adapter else dict)
        self._typeddict = is_typeddict(tp)
        self._check_type = (isinstance(tp, type) and not self._typeddict
                            and not self._plain_dict)
        # Hot path: a stdlib/pydantic dataclass whose fields are all scalars is dumped by
        # reading its fields (each value's type checked); anything else goes through pydantic.
        self._fast: tuple[tuple[str, tuple[type, ...]], ...] | None = None
        if dataclasses.is_dataclass(tp) and flags.scalar_fields is not None:
            self._fast = tuple(flags.scalar_fields)
        # Loading a type without nested structures checks its keys itself (cheaper than
        # pydantic's extra="forbid").
        self._known: frozenset[str] | None = None
        if flags.scalar_fields is not None and not self._typeddict:
            self._known = frozenset(n for n, _ in flags.scalar_fields)
        self._loaded: ContextVar[_Loaded | None] = ContextVar(
            f"aggbox_state_codec_{self.name}", default=None)

    # -- public API -----------------------------------------------------------------------
    def initial(self) -> S:
        return self._factory()

    def load(self, doc: Mapping[str, Any] | None) -> S:
        """The state object of a stored ``state`` document (the initial state for ``None``).

        Stored fields the type does not know are remembered (see the module docstring) and
        merged into the next :meth:`dump` in this context."""
        if doc is None or (not doc and self._plain_dict):
            self._loaded.set(None)
            return self.initial()
        data: Any = from_bson(doc) if self._load_walk else doc
        if self._plain_dict:
            base: Any = self.initial()
            base.update(data)
            self._loaded.set(None)
            return cast(S, base)
        validate = self._validate
        known = self._known
        if known is not None and known.issuperset(data):
            # No nested structures and no unknown top-level field: the fast path.
            try:
                state = validate(data)
            except ValidationError:
                pass  # reported by the general path below
            else:
                if self._loaded.get() is not None:
                    self._loaded.set(None)
                return cast(S, state)
        unknown: list[tuple[tuple[str | int, ...], Any]] = []
        for _ in range(8):
            try:
                state = validate(data, extra="forbid")
                break
            except ValidationError as exc:
                found = unknown_in(exc, data)
                if not found:
                    raise StateCodecError(
                        f"{self.name}: the stored state does not fit {type_name(self.state_type)}"
                        f": {validation_summary(exc)}") from None
                unknown.extend(found)
                data = without(data, [p for p, _ in found])
        else:  # pragma: no cover - 8 levels of unions with unknown fields
            raise StateCodecError(f"{self.name}: cannot separate unknown stored fields")
        self._loaded.set(_Loaded(tuple(unknown)) if unknown else None)
        return cast(S, state)

    def dump(self, state: S) -> dict[str, Any]:
        """The ``state`` document to store (plain BSON: what ``bson.encode`` accepts)."""
        return self.dump_checked(state, check=False)

    def dump_checked(self, state: S, *, check: bool = True) -> dict[str, Any]:
        """:meth:`dump`, and with ``check`` every key (at any depth) checked as a MongoDB
        field name (:func:`aggregates.core.fieldnames.check_field_names`, raising
        ``InvalidFieldName``). A scalar-field dataclass dumped by the fast path needs no
        check: its keys are its field names, Python identifiers."""
        out: dict[str, Any] | None = None
        fast = self._fast
        if fast is not None and type(state) is self.state_type:
            out = {}
            for name, allowed in fast:
                v = getattr(state, name)
                if type(v) not in allowed:
                    out = None
                    break
                out[name] = v
        trusted = out is not None
        if out is None:
            out = self._dump_slow(state)
        loaded = self._loaded.get()
        if loaded is not None:
            self._merge_unknown(out, loaded)
            trusted = False
        if check and not trusted:
            check_field_names(out, "state")
        return out

    # -- internals -------------------------------------------------------------------------
    def _dump_slow(self, state: S) -> dict[str, Any]:
        tp = self.state_type
        if self._check_type and not isinstance(state, tp):
            raise HandlerError(f"handler returned state of type {type(state).__name__}, "
                               f"expected {tp.__name__}")
        if (self._typeddict or self._plain_dict) and not isinstance(state, Mapping):
            raise HandlerError(f"handler returned state of type {type(state).__name__}, "
                               f"expected a dict ({type_name(tp)})")
        if self._plain_dict:
            raw: Any = state
        else:
            try:
                raw = self._serialize(state, mode="python", warnings="error")
            except Exception as exc:  # pydantic_core.PydanticSerializationError
                raise StateCodecError(f"{self.name}: the state does not match "
                                      f"{type_name(tp)}: {exc}") from None
        if not self._dump_walk:
            return cast(dict[str, Any], raw)
        try:
            return cast(dict[str, Any], to_bson(raw))
        except Unstorable as exc:
            shown = path_text(self.name, tuple(reversed(exc.path)))
            raise StateCodecError(f"{shown}: {exc.reason}") from None

    def _merge_unknown(self, out: dict[str, Any], loaded: _Loaded) -> None:
        for path, value in loaded.unknown:
            shown = path_text(self.name, path)
            if self.unknown_state_fields == "refuse":
                raise StateCodecError(
                    f"{shown}: the stored state has a field {self.name}'s state type "
                    f"{type_name(self.state_type)} does not know (unknown_state_fields="
                    "'refuse'); migrate the stored documents, add the field to the type, or "
                    "use unknown_state_fields='keep'")
            if any(isinstance(p, int) for p in path):
                raise StateCodecError(
                    f"{shown}: the stored state has a field the state type does not know, "
                    "inside an array element: it cannot be carried through reliably "
                    "(elements move); migrate the stored documents or add the field")
            node: Any = out
            for p in path[:-1]:
                node = node.get(p) if isinstance(node, dict) else None
            if isinstance(node, dict) and path[-1] not in node:
                node[path[-1]] = value


__all__ = ["StateCodec", "StateCodecError", "UnknownStateFields", "scalar_dataclass_fields"]
