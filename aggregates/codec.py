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
(:class:`~aggregates.errors.ConfigurationError` naming the field path and the type).

Unknown stored fields (in the stored ``state`` but not in the current type, at any depth
of nested structures) are never dropped silently; the policy is per aggregate type:
``"keep"`` (default) carries them, unchanged, into the next write of the aggregate;
``"refuse"`` makes the write fail, so the message is dead-lettered ``invalid_state`` naming
the field. The codec remembers the unknown fields of the document it loaded last in the
current context (thread / task) and merges them into the documents it dumps after that —
the fold loads once, then dumps the state after each message it applies.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, Inexact, InvalidOperation
from typing import Any, Final, Generic, Literal, TypeVar, Union, cast, get_args, get_origin
from uuid import UUID

from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError
from typing_extensions import is_typeddict

from aggregates.errors import AggboxError, ConfigurationError, HandlerError
from aggregates.fieldnames import check_field_names

S = TypeVar("S")

UnknownStateFields = Literal["keep", "refuse"]

_PLAIN: Final = frozenset({str, int, float, bool, type(None), bytes})
_EXTRA_ERRORS: Final = frozenset({"extra_forbidden", "unexpected_keyword_argument"})


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
        flags = _Flags()
        if not self._plain_dict:
            _check_struct(tp, self.name, flags, set())
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
                    f"{self.name}: state type {_tname(tp)} cannot be stored in MongoDB: "
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
        data: Any = _from_bson(doc) if self._load_walk else doc
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
                found = _unknown_in(exc, data)
                if not found:
                    raise StateCodecError(
                        f"{self.name}: the stored state does not fit {_tname(self.state_type)}"
                        f": {_summary(exc)}") from None
                unknown.extend(found)
                data = _without(data, [p for p, _ in found])
        else:  # pragma: no cover - 8 levels of unions with unknown fields
            raise StateCodecError(f"{self.name}: cannot separate unknown stored fields")
        self._loaded.set(_Loaded(tuple(unknown)) if unknown else None)
        return cast(S, state)

    def dump(self, state: S) -> dict[str, Any]:
        """The ``state`` document to store (plain BSON: what ``bson.encode`` accepts)."""
        return self.dump_checked(state, check=False)

    def dump_checked(self, state: S, *, check: bool = True) -> dict[str, Any]:
        """:meth:`dump`, and with ``check`` every key (at any depth) checked as a MongoDB
        field name (:func:`aggregates.fieldnames.check_field_names`, raising
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
                               f"expected a dict ({_tname(tp)})")
        if self._plain_dict:
            raw: Any = state
        else:
            try:
                raw = self._serialize(state, mode="python", warnings="error")
            except Exception as exc:  # pydantic_core.PydanticSerializationError
                raise StateCodecError(f"{self.name}: the state does not match "
                                      f"{_tname(tp)}: {exc}") from None
        if not self._dump_walk:
            return cast(dict[str, Any], raw)
        try:
            return cast(dict[str, Any], _to_bson(raw))
        except _Unstorable as exc:
            shown = _path_text(self.name, tuple(reversed(exc.path)))
            raise StateCodecError(f"{shown}: {exc.reason}") from None

    def _merge_unknown(self, out: dict[str, Any], loaded: _Loaded) -> None:
        for path, value in loaded.unknown:
            shown = _path_text(self.name, path)
            if self.unknown_state_fields == "refuse":
                raise StateCodecError(
                    f"{shown}: the stored state has a field {self.name}'s state type "
                    f"{_tname(self.state_type)} does not know (unknown_state_fields="
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


# -- BSON normalisation -------------------------------------------------------------------
class _Unstorable(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str | int] = []


def _to_bson(v: Any) -> Any:
    t = type(v)
    if t in _PLAIN:
        return v
    if t is dict:
        out = {}
        for k, x in v.items():
            key = _key(k)
            try:
                out[key] = _to_bson(x)
            except _Unstorable as exc:
                exc.path.append(key)
                raise
        return out
    if t is list or t is tuple:
        return _seq(v)
    if t is datetime:
        return _datetime(v)
    if isinstance(v, enum.Enum):
        return _to_bson(v.value)
    if t is set or t is frozenset:
        items = _seq(v)
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if t is Decimal:
        try:
            return Decimal128(v)
        except (Inexact, InvalidOperation):
            raise _Unstorable(f"Decimal {v} cannot be stored exactly as Decimal128 (at most "
                              "34 significant digits, exponent -6176…6111)") from None
    if t is UUID:
        return Binary.from_uuid(v)
    if t is date:
        return datetime(v.year, v.month, v.day, tzinfo=UTC)
    if isinstance(v, Binary | Decimal128 | ObjectId | Int64):
        return v
    if isinstance(v, datetime):
        return _datetime(v)
    if isinstance(v, str | int | float | bytes):  # subclasses: store the plain value
        for base in (bool, int, float, str, bytes):
            if isinstance(v, base):
                return cast(Any, base)(v)
    if isinstance(v, Mapping):
        return _to_bson(dict(v))
    if isinstance(v, list | tuple):
        return _seq(v)
    if isinstance(v, set | frozenset):
        return _to_bson(frozenset(v))
    raise _Unstorable(f"a value of type {t.__name__} cannot be stored in MongoDB")


def _seq(v: Any) -> list[Any]:
    out = []
    for i, x in enumerate(v):
        try:
            out.append(_to_bson(x))
        except _Unstorable as exc:
            exc.path.append(i)
            raise
    return out


def _key(k: Any) -> str:
    if type(k) is str:
        return k
    if isinstance(k, enum.Enum) and isinstance(k.value, str):
        return k.value
    if isinstance(k, str):
        return str(k)
    raise _Unstorable(f"dict key {k!r} of type {type(k).__name__}: MongoDB document keys "
                      "are strings")


def _datetime(v: datetime) -> datetime:
    off = v.utcoffset()
    if off is None:
        raise _Unstorable(f"datetime {v.isoformat()} is naive; store timezone-aware datetimes "
                          "(e.g. datetime.now(UTC) or msg.occurred_at)")
    if v.microsecond % 1000:
        raise _Unstorable(f"datetime {v.isoformat()} has sub-millisecond precision; MongoDB "
                          "stores milliseconds: truncate it first, e.g. "
                          "v.replace(microsecond=v.microsecond // 1000 * 1000)")
    return v if not off else v.astimezone(UTC)


def _from_bson(v: Any) -> Any:
    t = type(v)
    if t in _PLAIN:
        return v
    if t is dict or isinstance(v, Mapping):
        return {k: _from_bson(x) for k, x in v.items()}
    if t is list:
        return [_from_bson(x) for x in v]
    if isinstance(v, datetime):
        return v if v.tzinfo is not None else v.replace(tzinfo=UTC)
    if t is Decimal128:
        return v.to_decimal()
    if t is Binary and v.subtype == 4:
        return v.as_uuid()
    return v


# -- unknown stored fields ----------------------------------------------------------------
def _unknown_in(exc: ValidationError, data: Any) -> list[tuple[tuple[str | int, ...], Any]]:
    """The unknown-field errors of ``exc`` as (path in ``data``, value); pydantic's
    locations also name union members, which are skipped by following ``data``."""
    found: dict[tuple[str | int, ...], Any] = {}
    for err in exc.errors():
        if err["type"] not in _EXTRA_ERRORS:
            continue
        node, path = data, []
        ok = True
        for i, p in enumerate(err["loc"]):
            last = i == len(err["loc"]) - 1
            if isinstance(node, Mapping) and p in node:
                path.append(p)
                if not last:
                    node = node[p]
            elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
                path.append(p)
                node = node[p]
            elif last:
                ok = False
        if ok and path and isinstance(path[-1], str):
            found.setdefault(tuple(path), err["input"])
    return list(found.items())


def _without(data: Any, paths: list[tuple[str | int, ...]]) -> Any:
    """A copy of ``data`` without the fields at ``paths`` (only copied along the paths)."""
    def strip(node: Any, rest: list[tuple[str | int, ...]]) -> Any:
        if isinstance(node, Mapping):
            out = dict(node)
        elif isinstance(node, list):
            out = list(node)  # type: ignore[assignment]
        else:
            return node
        groups: dict[Any, list[tuple[str | int, ...]]] = {}
        for p in rest:
            if len(p) == 1:
                if isinstance(out, dict):
                    out.pop(cast(str, p[0]), None)
            else:
                groups.setdefault(p[0], []).append(p[1:])
        for k, sub in groups.items():
            out[k] = strip(out[k], sub)
        return out

    return strip(data, paths)


def _path_text(name: str, path: tuple[str | int, ...]) -> str:
    out = name
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _summary(exc: ValidationError) -> str:
    errs = exc.errors()
    parts = [f"{'.'.join(str(x) for x in e['loc']) or '(state)'}: {e['msg']}" for e in errs[:3]]
    more = f" (and {len(errs) - 3} more)" if len(errs) > 3 else ""
    return "; ".join(parts) + more


# -- definition-time checks ---------------------------------------------------------------
@dataclass
class _Flags:
    any: bool = False
    dump_walk: bool = False
    load_walk: bool = False
    #: top-level (name, exact value types) when every field is a plain scalar, else None
    scalar_fields: list[tuple[str, tuple[type, ...]]] | None = None


_SCALAR_TYPES: Final[dict[Any, tuple[type, ...]]] = {
    str: (str,), int: (int,), float: (float, int), bool: (bool,), type(None): (type(None),),
}


def _tname(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return repr(tp).replace("typing.", "")


def _refuse(path: str, tp: Any, why: str = "") -> ConfigurationError:
    return ConfigurationError(
        f"{path}: type {_tname(tp)} cannot be stored in MongoDB{why}. State fields may be "
        "str, int, float, bool, None, bytes, datetime (aware), date, Decimal, UUID, Enum, "
        "list/tuple/set/frozenset, dict[str, …], Optional/unions, nested dataclasses, "
        "pydantic models and TypedDicts (see docs/concepts.md \"State types\")")


def _fields(tp: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        for name, info in tp.model_fields.items():
            yield (info.alias or name), info.annotation
        return
    try:
        hints = typing.get_type_hints(tp, include_extras=True)
    except Exception as exc:
        raise ConfigurationError(
            f"{path}: cannot resolve the annotations of {_tname(tp)} ({type(exc).__name__}: "
            f"{exc}); define the state types at module level") from exc
    if dataclasses.is_dataclass(tp):
        for f in dataclasses.fields(tp):
            yield f.name, hints.get(f.name, Any)
    else:
        yield from hints.items()


def _is_struct(tp: Any) -> bool:
    return (dataclasses.is_dataclass(tp) and isinstance(tp, type)) or is_typeddict(tp) \
        or (isinstance(tp, type) and issubclass(tp, BaseModel))


def _check_struct(tp: Any, path: str, flags: _Flags, seen: set[Any]) -> None:
    if not _is_struct(tp):
        raise _refuse(path, tp, " as the state (use a dataclass, a pydantic model, a "
                      "TypedDict or dict)")
    top = not seen
    seen = seen | {tp}
    scalars: list[tuple[str, tuple[type, ...]]] | None = [] if top else None
    for name, ftype in _fields(tp, path):
        if scalars is not None:
            allowed = _scalar_types(ftype)
            if allowed is None:
                scalars = None
            else:
                scalars.append((name, allowed))
        _check(ftype, f"{path}.{name}", flags, seen)
    if top:
        flags.scalar_fields = scalars


def scalar_dataclass_fields(tp: Any) -> tuple[tuple[str, tuple[type, ...]], ...] | None:
    """For a dataclass whose fields are all plain scalars (str, int, float, bool, None and
    unions of them): each field's name and the exact value types that may be copied as is
    (a dump that reads the fields gives what pydantic's would, in python and JSON mode
    alike). ``None`` for anything else."""
    if not (dataclasses.is_dataclass(tp) and isinstance(tp, type)):
        return None
    out = []
    try:
        for name, ftype in _fields(tp, tp.__name__):
            allowed = _scalar_types(ftype)
            if allowed is None:
                return None
            out.append((name, allowed))
    except ConfigurationError:
        return None
    return tuple(out)


def _scalar_types(tp: Any) -> tuple[type, ...] | None:
    if tp in _SCALAR_TYPES:
        return _SCALAR_TYPES[tp]
    if get_origin(tp) in (Union, types.UnionType):
        out: tuple[type, ...] = ()
        for a in get_args(tp):
            if a not in _SCALAR_TYPES:
                return None
            out += _SCALAR_TYPES[a]
        return out
    return None


def _check(tp: Any, path: str, flags: _Flags, seen: set[Any]) -> None:
    """Refuse what cannot be stored (raising ConfigurationError naming ``path``); note what
    needs the BSON-normalising step."""
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is typing.Annotated:
        _check(args[0], path, flags, seen)
        return
    if hasattr(tp, "__supertype__"):  # NewType
        _check(tp.__supertype__, path, flags, seen)
        return
    if isinstance(tp, typing.TypeAliasType if hasattr(typing, "TypeAliasType") else ()):
        _check(tp.__value__, path, flags, seen)  # pragma: no cover - py ≥ 3.12
        return
    if tp is Any or tp is object:
        flags.any = True
        return
    if tp in _PLAIN or tp is type(None) or tp is None:
        return
    if tp is datetime or tp is date:
        flags.dump_walk = flags.load_walk = True
        return
    if tp is Decimal:
        flags.dump_walk = flags.load_walk = True
        return
    if tp is UUID:
        flags.dump_walk = True
        return
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        flags.dump_walk = True
        bad = [m for m in tp if type(m.value) not in (str, int)]
        if bad:
            raise _refuse(path, tp, f": enum values must be str or int, {bad[0]!r} is not")
        return
    if origin is Literal:
        bad = [a for a in args if type(a) not in (str, int, bool, type(None)) and
               not isinstance(a, enum.Enum)]
        if bad:
            raise _refuse(path, tp, f": literal {bad[0]!r}")
        if any(isinstance(a, enum.Enum) for a in args):
            flags.dump_walk = True
        return
    if origin in (Union, types.UnionType):
        _check_union(tp, args, path, flags, seen)
        return
    if _is_struct(tp):
        if tp in seen:  # recursive type: checked above
            return
        if is_typeddict(tp) and not _typing_extensions_typeddict(tp):
            raise _refuse(path, tp, ": on Python < 3.12 pydantic needs "
                          "typing_extensions.TypedDict instead of typing.TypedDict")
        _check_struct(tp, path, flags, seen)
        return
    if tp in (list, tuple, set, frozenset, dict) or origin in (list, tuple, set, frozenset, dict):
        o = origin or tp
        if o is not list and o is not dict:
            flags.dump_walk = True
        if o is dict:
            k, v = (args or (str, Any))
            _check_key(k, path, tp)
            _check(v, f"{path}[]", flags, seen)
            return
        if not args:
            flags.any = True
            return
        if o is tuple and len(args) == 2 and args[1] is Ellipsis:
            args = args[:1]
        elif o is tuple and args == ((),):
            return
        for i, a in enumerate(args):
            if o in (set, frozenset) and not _hashable(a):
                raise _refuse(path, tp, f": the elements of a {o.__name__} must be hashable, "
                              f"{_tname(a)} is not (use a frozen dataclass or a tuple)")
            _check(a, f"{path}[{i if o is tuple and len(args) > 1 else ''}]", flags, seen)
        return
    if isinstance(tp, typing.TypeVar):
        raise _refuse(path, tp, ": an unbound type variable")
    raise _refuse(path, tp)


def _typing_extensions_typeddict(tp: Any) -> bool:
    import sys

    if sys.version_info >= (3, 12):
        return True
    return type(tp).__module__ == "typing_extensions"


def _check_key(k: Any, path: str, tp: Any) -> None:
    if k is str or k is Any:
        return
    if hasattr(k, "__supertype__"):
        _check_key(k.__supertype__, path, tp)
        return
    if isinstance(k, type) and issubclass(k, enum.Enum) and \
            all(type(m.value) is str for m in k):
        return
    if get_origin(k) is Literal and all(type(a) is str for a in get_args(k)):
        return
    raise _refuse(path, tp, f": dict keys of type {_tname(k)} (MongoDB document keys are "
                  "strings; use str, a str-valued Enum or Literal of strings)")


def _hashable(tp: Any) -> bool:
    origin = get_origin(tp) or tp
    if origin is typing.Annotated:
        return _hashable(get_args(tp)[0])
    if tp is Any:
        return True
    if origin in (list, dict, set):
        return False
    if origin in (Union, types.UnionType) or origin is tuple or origin is frozenset:
        return all(_hashable(a) for a in get_args(tp) if a is not Ellipsis)
    if isinstance(tp, type):
        return getattr(tp, "__hash__", None) is not None
    return True


def _kind(tp: Any) -> str | None:
    """How a union member is stored, to refuse unions whose members could not be told
    apart on load (None: never ambiguous)."""
    origin = get_origin(tp)
    if origin is typing.Annotated:
        return _kind(get_args(tp)[0])
    if hasattr(tp, "__supertype__"):
        return _kind(tp.__supertype__)
    if origin is Literal or tp is type(None) or tp is Any or tp is object:
        return None
    if _is_struct(tp) or tp is dict or origin is dict:
        return None  # embedded documents: pydantic tells structures apart by their fields
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "int" if all(type(m.value) is int for m in tp) else "str"
    if tp in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset):
        return "array"
    if tp is datetime or tp is date:
        return "date"
    if tp is bool:
        return "bool"
    if isinstance(tp, type):
        for base, kind in ((int, "int"), (float, "float"), (str, "str"), (bytes, "bytes"),
                           (Decimal, "decimal"), (UUID, "uuid")):
            if issubclass(tp, base):
                return kind
    return None


def _check_union(tp: Any, args: tuple[Any, ...], path: str, flags: _Flags,
                 seen: set[Any]) -> None:
    by_kind: dict[str, Any] = {}
    for a in args:
        _check(a, path, flags, seen)
        kind = _kind(a)
        if kind is None:
            continue
        if kind in by_kind:
            raise _refuse(path, tp, f": {_tname(by_kind[kind])} and {_tname(a)} are stored "
                          "alike and could not be told apart on load; use one of them (or a "
                          "dataclass per alternative)")
        by_kind[kind] = a


__all__ = ["StateCodec", "StateCodecError", "UnknownStateFields"]
