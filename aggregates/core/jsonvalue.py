"""What an outbox payload may hold: JSON values, judged by value (docs/design.md "JSON
values"). One rule for every payload that is published — a handler's dict emits, the dumped
payload objects of typed emits, a timer's message, an effect's entry — applied by the fold
where the value enters (a refused value dead-letters the message ``invalid_emit`` /
``invalid_timer`` naming the field) and by the dispatcher to entries stored some other way
(``invalid_outbox_entry``), so every publisher and record format sees the same JSON.

:func:`json_payload` returns the payload with every value in its JSON form:

- ``None``, ``bool``, ``str`` (valid UTF-8: no lone surrogate), ``int`` in MongoDB's 64-bit
  range and finite ``float``, as they are; subclasses of these (``IntEnum``, a ``float``
  subclass, ``bson.Int64``) and numpy scalars and arrays as their plain values
  (``.tolist()``), judged again;
- mappings as dicts (keys: strings, not starting with ``$``, without ``.`` or NUL), lists and
  tuples as lists, sets as sorted lists;
- ``datetime``, ``date``, ``time``, ``timedelta``, ``Decimal`` and ``UUID`` as the text
  pydantic's JSON mode gives them — what a typed payload's field of that type is published
  as (``2026-01-01T00:00:00Z``, ``"1.10"``) — ``Decimal128`` as its decimal's text,
  ``ObjectId`` as its hex text, an ``Enum`` as its value;
- refused (:class:`NotJSONValue` naming the field and saying what to send instead): a float
  NaN or infinity, an int outside ``-2**63 .. 2**63-1``, ``bytes`` (no single text form),
  a string that is not UTF-8, anything nested deeper than :data:`MAX_DEPTH`, any other type.

Pure; no I/O. The common payload (plain JSON types all the way) is returned as it came.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final
from uuid import UUID

from aggregates.core.jsonnumbers import NOT_JSON_HINT, number_name

__all__ = ["INT64_MAX", "INT64_MIN", "MAX_DEPTH", "NotJSONValue", "json_payload",
           "json_value"]

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
#: Containers nested deeper than this are refused (as ``check_field_names`` does).
MAX_DEPTH: Final = 64

_PLAIN: Final = frozenset({str, int, float, bool, type(None)})


class NotJSONValue(ValueError):
    """A value an outbox payload cannot carry. ``path`` names the field
    (``payload.amount``, ``payload.items[2]``), ``reason`` says why and what to send instead."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def json_payload(payload: Mapping[str, Any], path: str = "payload") -> dict[str, Any]:
    """``payload`` with every value in its JSON form (see the module); the same dict when it
    already is plain JSON, else a converted copy. Raises :class:`NotJSONValue`."""
    if type(payload) is dict and _plain(payload, 0):
        return payload
    out = json_value(payload, path)
    if type(out) is not dict:
        raise NotJSONValue(path, f"must be an object; got {type(payload).__name__}")
    return out


def json_value(value: Any, path: str, depth: int = 0) -> Any:
    """One value in its JSON form (a new container where one is converted); raises
    :class:`NotJSONValue` naming ``path``."""
    t = type(value)
    if t is str:
        if not value.isascii():
            _check_text(value, path)
        return value
    if t is bool or value is None:
        return value
    if t is int:
        if INT64_MIN <= value <= INT64_MAX:
            return value
        raise NotJSONValue(path, _int_reason(value))
    if t is float:
        if value - value == 0.0:
            return value
        raise NotJSONValue(path, f"{number_name(value)} is not JSON ({NOT_JSON_HINT})")
    if depth >= MAX_DEPTH:
        raise NotJSONValue(path, f"nested deeper than {MAX_DEPTH} levels")
    if t is dict or isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = _key(key, path)
            out[name] = json_value(item, f"{path}.{name}", depth + 1)
        return out
    if t is list or t is tuple:
        return [json_value(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(value)]
    return _converted(value, path, depth)


def _converted(value: Any, path: str, depth: int) -> Any:
    """Values that are not plain JSON types: their JSON form, or refused."""
    if isinstance(value, enum.Enum):
        return json_value(value.value, path, depth + 1)
    if isinstance(value, int):  # IntEnum handled above; Int64 and other subclasses
        return json_value(int(value), path, depth)
    if isinstance(value, float):
        return json_value(float(value), path, depth)
    if isinstance(value, str):
        return json_value(str.__str__(value), path, depth)
    if isinstance(value, bytes | bytearray | memoryview):
        raise NotJSONValue(path, "bytes are not JSON and have no single text form; send "
                                 "text (e.g. base64.b64encode(value).decode())")
    if isinstance(value, datetime | date | time | timedelta | Decimal | UUID):
        from pydantic_core import to_jsonable_python  # pydantic's JSON mode, as typed payloads

        return to_jsonable_python(value)
    module = type(value).__module__
    if module.startswith("bson"):
        from bson.decimal128 import Decimal128
        from bson.objectid import ObjectId

        if isinstance(value, Decimal128):
            return str(value.to_decimal())
        if isinstance(value, ObjectId):
            return str(value)
    elif module == "numpy" and hasattr(value, "tolist"):  # scalars and arrays, by value
        plain = value.tolist()
        if type(plain) is type(value):  # an object array's element that is itself numpy
            raise NotJSONValue(path, f"a value of type numpy.{type(value).__name__} is not "
                                     "JSON")
        return json_value(plain, path, depth + 1)
    if isinstance(value, set | frozenset):
        items = [json_value(x, f"{path}[]", depth + 1) for x in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(value, list | tuple):
        return [json_value(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(value)]
    raise NotJSONValue(path, f"a value of type {type(value).__name__} is not JSON; send a "
                             "string, number, bool, null, list or object")


def _key(raw: Any, path: str) -> str:
    key: str
    if type(raw) is str:
        key = raw
    else:
        if isinstance(raw, enum.Enum) and isinstance(raw.value, str):
            key = str.__str__(raw.value)
        elif isinstance(raw, str):
            key = str.__str__(raw)
        else:
            raise NotJSONValue(f"{path}.{raw!r}", "keys must be strings")
    if key[:1] == "$" or "." in key or "\x00" in key:
        raise NotJSONValue(f"{path}.{key}", "field names must not start with '$' or contain "
                                            "'.' or NUL (operator injection)")
    if not key.isascii():
        _check_text(key, f"{path}.{key!r}")
    return key


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise NotJSONValue(path, "text holds a lone surrogate, which is not UTF-8; send "
                                 "valid Unicode text") from None


def _int_reason(value: int) -> str:
    return (f"the integer {value if abs(value) < 10**30 else f'~{float(value):.3e}'} is "
            "outside MongoDB's 64-bit range (-2**63 .. 2**63-1); send it as a string")


def _plain(value: Any, depth: int) -> bool:
    """Whether ``value`` (a dict or list) is plain JSON all the way down, nothing to convert
    or refuse. Cheap: exact type tests, the common payload's only cost."""
    if depth >= MAX_DEPTH:
        return False
    items = value.values() if type(value) is dict else value
    if type(value) is dict:
        for key in value:
            if (type(key) is not str or key[:1] == "$" or "." in key or "\x00" in key
                    or not key.isascii()):
                return False
    for item in items:
        t = type(item)
        if t is str:
            if not item.isascii():
                return False
        elif t is int:
            if not INT64_MIN <= item <= INT64_MAX:
                return False
        elif t is float:
            if item - item != 0.0:
                return False
        elif t is bool or item is None:
            continue
        elif t is dict or t is list:
            if not _plain(item, depth + 1):
                return False
        else:
            return False
    return True
