"""JSON has no ``NaN``, ``Infinity`` or ``-Infinity``: Python's ``json`` (and Jackson with
``allowNonNumericNumbers``) accept them anyway. Every JSON text aggbox reads as input is
parsed with :func:`loads` (or a decoder given :func:`refuse_constant`), which refuses them
naming the field; values built in memory (a handler's emits, an envelope passed as a dict)
are checked with :func:`non_finite` (docs/design.md "Validate").
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

__all__ = ["NOT_JSON_HINT", "NonJSONNumber", "describe", "loads", "located", "non_finite",
           "not_json", "number_name", "refuse_constant"]

#: What to do instead (the end of every detail naming such a value).
NOT_JSON_HINT: Final = "JSON has no NaN or Infinity: send null, a string or a finite number"


class NonJSONNumber(ValueError):
    """A JSON text or value holds ``NaN``, ``Infinity`` or ``-Infinity``. ``path`` names the
    field (``payload.extra``, ``payload.items[2]``; ``"the record"`` for a bare value),
    ``decoded`` is the text's value with such numbers as :class:`_Constant` markers (for
    the ids of a record that names them; ``None`` when not from a text)."""

    def __init__(self, path: str, constant: str, decoded: Any = None) -> None:
        self.path = path
        self.constant = constant
        self.decoded = decoded
        super().__init__(describe(path, constant))


def describe(path: str, constant: str) -> str:
    """``payload.extra: NaN is not JSON (…)``."""
    return f"{path}: {not_json(constant)}"


def not_json(constant: str) -> str:
    """``NaN is not JSON (…)``."""
    return f"{constant} is not JSON ({NOT_JSON_HINT})"


def refuse_constant(name: str) -> Any:
    """A ``parse_constant`` hook: raises :class:`NonJSONNumber` (the field is found by
    :func:`loads`)."""
    raise NonJSONNumber("?", name)


class _Constant:
    """Where a non-JSON number stood in a text (see :func:`loads`)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def loads(text: str) -> Any:
    """``json.loads(text)``, but :class:`NonJSONNumber` naming the field for ``NaN``,
    ``Infinity`` and ``-Infinity`` (any other error: ``json.loads``'s)."""
    try:
        return json.loads(text, parse_constant=refuse_constant)
    except NonJSONNumber:
        pass
    raise located(text) from None


def located(text: str) -> NonJSONNumber:
    """The :class:`NonJSONNumber` of a text known to hold a non-JSON number: parsed again
    with markers, the first one in document order named."""
    decoded = json.loads(text, parse_constant=_Constant)
    found = _first(decoded, _is_marker)
    if found is None:  # only in a duplicate key's overwritten value
        return NonJSONNumber("a value", "NaN or Infinity", decoded)
    path, marker = found
    return NonJSONNumber(path, marker.name, decoded)


def non_finite(value: Any, path: str) -> NonJSONNumber | None:
    """The first ``float`` NaN or infinity in ``value`` (dicts and lists of JSON values,
    built in memory), as a :class:`NonJSONNumber` naming it under ``path``; else None."""
    found = _first(value, _is_non_finite, path)
    if found is None:
        return None
    where, number = found
    return NonJSONNumber(where, number_name(number))


def number_name(number: float) -> str:
    """How a float NaN or infinity is named in a detail (a JSON text's ``1e400`` reads as
    infinity in Python, hence the range)."""
    if number != number:
        return "NaN"
    sign = "" if number > 0 else "-"
    return f"{sign}Infinity (or a number beyond {sign}1.8e308)"


def _is_marker(value: Any) -> bool:
    return type(value) is _Constant


def _is_non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _first(value: Any, hit: Any, path: str = "") -> tuple[str, Any] | None:
    """The path and value of the first item ``hit`` accepts (depth first, in order; no
    recursion: records are deep at most ``MAX_RECORD_DEPTH`` but values built in memory may
    be deeper)."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if hit(item):
            return (where or "the record"), item
        if isinstance(item, dict):
            children = [(f"{where}.{k}" if where else str(k), v) for k, v in item.items()]
        elif isinstance(item, list | tuple):
            children = [(f"{where}[{i}]", v) for i, v in enumerate(item)]
        else:
            continue
        stack.extend(reversed(children))
    return None
