"""Definition-time checks of state types: refuse (``ConfigurationError`` naming the field path)
what :class:`aggregates.codec.StateCodec` cannot store, and note which types need the
BSON-normalising step on dump or load (:class:`Flags`)."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Final, Literal, Union, get_args, get_origin
from uuid import UUID

from pydantic import BaseModel
from typing_extensions import is_typeddict

from aggregates.codec.bson import PLAIN_TYPES
from aggregates.core.errors import ConfigurationError

__all__ = ["Flags", "check_struct", "scalar_dataclass_fields", "type_name"]


@dataclass
class Flags:
    """What a state type needs: ``any`` (an ``Any`` somewhere: walk everything),
    ``dump_walk``/``load_walk`` (the BSON-normalising step on dump/load)."""

    any: bool = False
    dump_walk: bool = False
    load_walk: bool = False
    #: top-level (name, exact value types) when every field is a plain scalar, else None
    scalar_fields: list[tuple[str, tuple[type, ...]]] | None = None


_SCALAR_TYPES: Final[dict[Any, tuple[type, ...]]] = {
    str: (str,), int: (int,), float: (float, int), bool: (bool,), type(None): (type(None),),
}


def type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return repr(tp).replace("typing.", "")


def _refuse(path: str, tp: Any, why: str = "") -> ConfigurationError:
    return ConfigurationError(
        f"{path}: type {type_name(tp)} cannot be stored in MongoDB{why}. State fields may be "
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
            f"{path}: cannot resolve the annotations of {type_name(tp)} ({type(exc).__name__}: "
            f"{exc}); define the state types at module level") from exc
    if dataclasses.is_dataclass(tp):
        for f in dataclasses.fields(tp):
            yield f.name, hints.get(f.name, Any)
    else:
        yield from hints.items()


def _is_struct(tp: Any) -> bool:
    return (dataclasses.is_dataclass(tp) and isinstance(tp, type)) or is_typeddict(tp) \
        or (isinstance(tp, type) and issubclass(tp, BaseModel))


def check_struct(tp: Any, path: str, flags: Flags, seen: set[Any]) -> None:
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


def _check(tp: Any, path: str, flags: Flags, seen: set[Any]) -> None:
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
    if _check_scalar(tp, origin, args, path, flags):
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
        check_struct(tp, path, flags, seen)
        return
    if tp in _COLLECTIONS or origin in _COLLECTIONS:
        _check_collection(tp, origin or tp, args, path, flags, seen)
        return
    if isinstance(tp, typing.TypeVar):
        raise _refuse(path, tp, ": an unbound type variable")
    raise _refuse(path, tp)


_COLLECTIONS: Final = (list, tuple, set, frozenset, dict)


def _check_scalar(tp: Any, origin: Any, args: tuple[Any, ...], path: str, flags: Flags) -> bool:
    """:func:`_check` of a scalar type (refusing what cannot be stored); False if ``tp`` is
    not one."""
    if tp is Any or tp is object:
        flags.any = True
    elif tp in PLAIN_TYPES or tp is type(None) or tp is None:
        pass
    elif tp is datetime or tp is date or tp is Decimal:
        flags.dump_walk = flags.load_walk = True
    elif tp is UUID:
        flags.dump_walk = True
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        flags.dump_walk = True
        bad = [m for m in tp if type(m.value) not in (str, int)]
        if bad:
            raise _refuse(path, tp, f": enum values must be str or int, {bad[0]!r} is not")
    elif origin is Literal:
        bad = [a for a in args if type(a) not in (str, int, bool, type(None)) and
               not isinstance(a, enum.Enum)]
        if bad:
            raise _refuse(path, tp, f": literal {bad[0]!r}")
        if any(isinstance(a, enum.Enum) for a in args):
            flags.dump_walk = True
    else:
        return False
    return True


def _check_collection(tp: Any, o: Any, args: tuple[Any, ...], path: str, flags: Flags,
                      seen: set[Any]) -> None:
    """:func:`_check` of a list, tuple, set, frozenset or dict type (``o``: its origin)."""
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
                          f"{type_name(a)} is not (use a frozen dataclass or a tuple)")
        _check(a, f"{path}[{i if o is tuple and len(args) > 1 else ''}]", flags, seen)


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
    raise _refuse(path, tp, f": dict keys of type {type_name(k)} (MongoDB document keys are "
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


def _check_union(tp: Any, args: tuple[Any, ...], path: str, flags: Flags,
                 seen: set[Any]) -> None:
    by_kind: dict[str, Any] = {}
    for a in args:
        _check(a, path, flags, seen)
        kind = _kind(a)
        if kind is None:
            continue
        if kind in by_kind:
            raise _refuse(path, tp, f": {type_name(by_kind[kind])} and {type_name(a)} are stored "
                          "alike and could not be told apart on load; use one of them (or a "
                          "dataclass per alternative)")
        by_kind[kind] = a


