"""Whether two values are the same value (pure): the comparison of the testing tools'
determinism and round-trip checks and of the debugging diffs.

Python's ``==`` says a NaN differs from itself (so a state holding one would look changed,
or non-deterministic, every time) and that ``-0.0`` equals ``0.0`` and ``1`` equals
``1.0`` (which are stored, and published, differently). :func:`same_value` compares by the
value's representation instead: NaN equals NaN (a float's and a ``Decimal``'s);
``strict`` (the default) also tells ``-0.0`` from ``0.0``, ``Decimal("1.10")`` from
``Decimal("1.1")`` and a bool from an int from a float; dataclasses, pydantic models,
mappings, lists and tuples are compared field by field (a dataclass with ``eq=False``
keeps its identity), anything else with ``==``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

__all__ = ["same_value"]


def same_value(a: Any, b: Any, *, strict: bool = True) -> bool:
    """``a`` and ``b`` hold the same value (see the module); ``strict=False`` keeps
    ``==``'s numbers (``-0.0 == 0.0``, ``1 == 1.0``) and only makes NaN equal NaN."""
    if a is b:
        return True
    if isinstance(a, float) and isinstance(b, float):
        if a != a or b != b:
            return a != a and b != b
        return a == b and (not strict or math.copysign(1.0, a) == math.copysign(1.0, b))
    if isinstance(a, Decimal) and isinstance(b, Decimal):  # Decimal128 keeps the exponent
        if a.is_nan() or b.is_nan():
            return a.is_nan() and b.is_nan() and a.is_snan() == b.is_snan()
        return a.as_tuple() == b.as_tuple() if strict else a == b
    if strict and _family(a) is not _family(b):
        return False
    if (dataclasses.is_dataclass(a) and not isinstance(a, type)
            and a.__dataclass_params__.eq):  # type: ignore[attr-defined]  # eq=False: ==
        return type(a) is type(b) and all(
            same_value(getattr(a, f.name), getattr(b, f.name), strict=strict)
            for f in dataclasses.fields(a) if f.compare)
    fields = getattr(type(a), "model_fields", None)
    if isinstance(fields, dict) and hasattr(a, "model_dump"):
        return type(a) is type(b) and all(
            same_value(getattr(a, k), getattr(b, k), strict=strict) for k in fields)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k], strict=strict) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return (isinstance(a, list) == isinstance(b, list) and len(a) == len(b)
                and all(same_value(x, y, strict=strict) for x, y in zip(a, b, strict=True)))
    try:
        return bool(a == b)
    except Exception:  # e.g. numpy arrays: == gives an array
        return False


def _family(value: Any) -> type:
    """The kind of value as stored: bool, int (with its subclasses, e.g. ``bson.Int64``),
    float, or the exact type."""
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return int
    if isinstance(value, float):
        return float
    return type(value)
