"""A typed payload's JSON form (pure): what the outbox stores for ``Emit(PayloadObject(...))``.

pydantic's JSON mode writes the fields, as it would for the team's own API — including the
types it knows how to write (``datetime``, ``Decimal``, ``UUID``, ``bytes`` as UTF-8 text,
``complex`` as text). Around it, the rule of docs/design.md "JSON values"
(:mod:`aggregates.core.jsonvalue`) applies where pydantic would otherwise guess or give up:

- a value pydantic does not know (in an ``Any`` field: numpy scalars and arrays,
  ``Decimal128``, ``ObjectId``, a class of the team's) is judged by the rule (its
  ``fallback=``): written in its JSON form, or refused naming the field;
- a NaN or infinity in a field whose type pydantic infers would be written as ``null``
  (pydantic's default ``ser_json_inf_nan``): refused naming the field, as in a dict emit,
  unless the class chose ``ser_json_inf_nan`` itself;
- an error of pydantic's own (bytes that are not UTF-8) names the field the rule refuses.

The caller checks the result with :func:`aggregates.core.jsonvalue.json_payload` (numbers
outside the 64-bit range, lone surrogates, keys).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter

from aggregates.core.jsonnumbers import NOT_JSON_HINT, number_name
from aggregates.core.jsonvalue import NotJSONValue, json_value

__all__ = ["dump_json"]

Part = str | int


def dump_json(adapter: TypeAdapter[Any], obj: object, path: str, *,
              check_nulls: bool = True) -> Any:
    """``obj`` in pydantic's JSON mode with the rule around it (see the module); raises
    :class:`NotJSONValue` naming the field under ``path``, or pydantic's own error where
    the rule finds nothing to name. The common payload class (no ``Any``, no set) costs one
    dump."""
    try:
        out = adapter.dump_python(obj, mode="json", warnings="error")
    except Exception:  # a type pydantic does not know (or cannot write): by the rule
        out = _with_fallback(adapter, obj, path)
    if infers(adapter):
        _settle(_python(adapter, obj), out, path, check_nulls)
    return out


class _Refused(NotJSONValue):
    """The rule refused ``value`` inside pydantic's dump (its path: relative to it)."""

    def __init__(self, value: Any, exc: NotJSONValue) -> None:
        super().__init__(exc.path, exc.reason)
        self.value = value


def _fallback(value: Any) -> Any:
    try:
        return json_value(value, "")
    except NotJSONValue as exc:
        raise _Refused(value, exc) from None


def _with_fallback(adapter: TypeAdapter[Any], obj: object, path: str) -> Any:
    try:
        return adapter.dump_python(obj, mode="json", warnings="error", fallback=_fallback)
    except _Refused as exc:
        where = _path_of(_python(adapter, obj), exc.value, path)
        raise NotJSONValue(where + exc.path, exc.reason) from None
    except Exception:
        found = _first_refused(_python(adapter, obj), path)
        if found is None:
            raise
        raise found from None


_INFERS: dict[TypeAdapter[Any], bool] = {}
_INFERRING_TYPES = frozenset({"any", "set", "frozenset"})


def infers(adapter: TypeAdapter[Any]) -> bool:
    """Whether the payload class may hold values whose JSON form pydantic infers (``Any``,
    extra fields, a serializer function) or sets (written in their iteration order):
    then its python-mode dump is read too. Decided once per adapter, erring towards yes."""
    found = _INFERS.get(adapter)
    if found is None:
        found = _INFERS[adapter] = _scan(adapter.core_schema)
    return found


def _scan(schema: Any) -> bool:
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            kind = node.get("type")
            if (kind in _INFERRING_TYPES or str(kind).startswith("function")
                    or "allow" in (node.get("extra_behavior"),
                                   node.get("extra_fields_behavior"))):
                return True
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _python(adapter: TypeAdapter[Any], obj: object) -> Any:
    """The python-mode dump (the objects as they are), to find where a value stands."""
    try:
        return adapter.dump_python(obj, mode="python", warnings="none")
    except Exception:  # nothing to locate with: the caller names the payload
        return None


def _children(node: Any) -> list[tuple[Part, Any]]:
    if isinstance(node, Mapping):
        return [(str(k), v) for k, v in node.items()]
    if isinstance(node, list | tuple):
        return list(enumerate(node))
    if isinstance(node, set | frozenset):
        return [("", v) for v in node]
    return []


def _text(path: str, parts: list[Part]) -> str:
    for p in parts:
        path += f"[{p}]" if isinstance(p, int) else ("[]" if p == "" else f".{p}")
    return path


def _path_of(tree: Any, value: Any, path: str) -> str:
    """Where ``value`` (that very object) stands in ``tree``, as a path under ``path``."""
    stack: list[tuple[list[Part], Any]] = [([], tree)]
    while stack:
        parts, node = stack.pop()
        if node is value:
            return _text(path, parts)
        stack.extend(([*parts, p], v) for p, v in reversed(_children(node)))
    return path


def _first_refused(tree: Any, path: str) -> NotJSONValue | None:
    if tree is None:
        return None
    try:
        json_value(tree, path)
    except NotJSONValue as exc:
        return exc
    return None


def _settle(tree: Any, out: Any, path: str, check_nulls: bool) -> None:
    """Walk the JSON dump ``out`` beside the python-mode dump ``tree``: a set's list is
    sorted (as the rule writes sets: its order must not depend on hashing), a ``null``
    pydantic wrote for a NaN or infinity is refused."""
    stack: list[tuple[list[Part], Any, Any]] = [([], tree, out)]
    while stack:
        parts, node, js = stack.pop()
        if js is None:
            if check_nulls and isinstance(node, float) and not math.isfinite(node):
                raise NotJSONValue(_text(path, parts),
                                   f"{number_name(node)} is not JSON ({NOT_JSON_HINT})")
        elif type(js) is list:
            if isinstance(node, set | frozenset):
                for item in node:
                    if check_nulls and isinstance(item, float) and not math.isfinite(item):
                        raise NotJSONValue(_text(path, [*parts, ""]), f"{number_name(item)} "
                                           f"is not JSON ({NOT_JSON_HINT})")
                try:
                    js.sort()
                except TypeError:
                    js.sort(key=repr)
                continue
            if isinstance(node, list | tuple) and len(node) == len(js):
                stack.extend(([*parts, i], n, j) for i, (n, j) in
                             enumerate(zip(node, js, strict=True)))
        elif type(js) is dict and isinstance(node, Mapping):
            for k, n in node.items():
                if isinstance(k, str) and k in js:
                    stack.append(([*parts, k], n, js[k]))
