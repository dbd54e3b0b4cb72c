"""BSON normalisation of dumped state (what ``bson.encode`` accepts, exactly; see the table in
:mod:`aggregates.codec`) and the helpers that separate stored fields a state type does not
know from a pydantic ``ValidationError``."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal, Inexact, InvalidOperation
from typing import Any, Final, cast
from uuid import UUID

import bson
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from pydantic import ValidationError

from aggregates.core.jsonvalue import INT64_MAX, INT64_MIN

__all__ = ["PLAIN_TYPES", "Unstorable", "from_bson", "path_text", "to_bson", "unknown_in",
           "unstorable_at", "validation_summary", "without"]

#: Types stored as themselves.
PLAIN_TYPES: Final = frozenset({str, int, float, bool, type(None), bytes})
_EXTRA_ERRORS: Final = frozenset({"extra_forbidden", "unexpected_keyword_argument"})


class Unstorable(Exception):
    """A value that cannot be stored; ``path`` is filled (innermost first) on the way out."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str | int] = []


def to_bson(v: Any) -> Any:
    t = type(v)
    if t in PLAIN_TYPES:
        if t is int and not INT64_MIN <= v <= INT64_MAX:
            raise Unstorable(_int_reason(v))
        return v
    if t is dict:
        out = {}
        for k, x in v.items():
            key = _key(k)
            try:
                out[key] = to_bson(x)
            except Unstorable as exc:
                exc.path.append(key)
                raise
        return out
    if t is list or t is tuple:
        return _seq(v)
    if t is datetime:
        return _datetime(v)
    if isinstance(v, enum.Enum):
        return to_bson(v.value)
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
            raise Unstorable(f"Decimal {v} cannot be stored exactly as Decimal128 (at most "
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
                return to_bson(cast(Any, base)(v))
    if isinstance(v, Mapping):
        return to_bson(dict(v))
    if isinstance(v, list | tuple):
        return _seq(v)
    if isinstance(v, set | frozenset):
        return to_bson(frozenset(v))
    if t.__module__ == "numpy" and hasattr(v, "tolist"):  # scalars and arrays, by value
        plain = v.tolist()
        if type(plain) is not t:  # an object array's element that is itself numpy: refused
            return to_bson(plain)
    raise Unstorable(f"a value of type {t.__name__} cannot be stored in MongoDB")


def _int_reason(v: int) -> str:
    shown = v if abs(v) < 10**30 else f"~{float(v):.3e}"
    return (f"the integer {shown} is outside MongoDB's 64-bit range (-2**63 .. 2**63-1); "
            "store it as a string or a Decimal")


def _seq(v: Any) -> list[Any]:
    out = []
    for i, x in enumerate(v):
        try:
            out.append(to_bson(x))
        except Unstorable as exc:
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
    raise Unstorable(f"dict key {k!r} of type {type(k).__name__}: MongoDB document keys "
                      "are strings")


def _datetime(v: datetime) -> datetime:
    off = v.utcoffset()
    if off is None:
        raise Unstorable(f"datetime {v.isoformat()} is naive; store timezone-aware datetimes "
                          "(e.g. datetime.now(UTC) or msg.occurred_at)")
    if v.microsecond % 1000:
        raise Unstorable(f"datetime {v.isoformat()} has sub-millisecond precision; MongoDB "
                          "stores milliseconds: truncate it first, e.g. "
                          "v.replace(microsecond=v.microsecond // 1000 * 1000)")
    return v if not off else v.astimezone(UTC)


def unstorable_at(doc: Any, path: str) -> str | None:
    """Where in ``doc`` (a document about to be BSON-encoded) the first value is that BSON
    cannot encode, and why (``state.v: the integer ... is outside ...``); ``None`` if none
    is found. For a message whose write failed to encode: names the field."""
    stack: list[tuple[str, Any]] = [(path, doc)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, Mapping):
            for k in reversed(list(v)):
                if type(k) is not str or "\x00" in k:
                    return f"{where}.{k!r}: document keys are strings without NUL"
                stack.append((f"{where}.{k}", v[k]))
        elif type(v) is list or type(v) is tuple:
            stack.extend((f"{where}[{i}]", x) for i, x in reversed(list(enumerate(v))))
        elif isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX:
            return f"{where}: {_int_reason(v)}"
        else:
            try:
                bson.encode({"v": v})
            except Exception as exc:
                reason = ("the text holds a lone surrogate, which is not UTF-8"
                          if isinstance(v, str) else
                          f"a value of type {type(v).__name__} cannot be stored in MongoDB "
                          f"({' '.join(str(exc).split())[:200]})")
                return f"{where}: {reason}"
    return None


def from_bson(v: Any) -> Any:
    t = type(v)
    if t in PLAIN_TYPES:
        return v
    if t is dict or isinstance(v, Mapping):
        return {k: from_bson(x) for k, x in v.items()}
    if t is list:
        return [from_bson(x) for x in v]
    if isinstance(v, datetime):
        return v if v.tzinfo is not None else v.replace(tzinfo=UTC)
    if t is Decimal128:
        return v.to_decimal()
    if t is Binary and v.subtype == 4:
        return v.as_uuid()
    return v


# -- unknown stored fields ----------------------------------------------------------------
def unknown_in(exc: ValidationError, data: Any) -> list[tuple[tuple[str | int, ...], Any]]:
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


def without(data: Any, paths: list[tuple[str | int, ...]]) -> Any:
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


def path_text(name: str, path: tuple[str | int, ...]) -> str:
    out = name
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def validation_summary(exc: ValidationError) -> str:
    errs = exc.errors()
    parts = [f"{'.'.join(str(x) for x in e['loc']) or '(state)'}: {e['msg']}" for e in errs[:3]]
    more = f" (and {len(errs) - 3} more)" if len(errs) > 3 else ""
    return "; ".join(parts) + more


