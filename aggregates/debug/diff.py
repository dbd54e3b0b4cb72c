"""A compact diff of two state documents (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aggregates.core.samevalue import same_value

_MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>"})()

#: Stands for a field that does not exist on one side of a diff.
MISSING: Any = _MISSING


def state_diff(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None,
               *, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """``field → (before, after)`` for every field that differs. Nested mappings are
    compared field by field (``"address.city"``); lists and other values as a whole. A
    field present on one side only has :data:`MISSING` on the other."""
    a = before or {}
    b = after or {}
    out: dict[str, tuple[Any, Any]] = {}
    for key in [*a, *(k for k in b if k not in a)]:
        old = a.get(key, MISSING)
        new = b.get(key, MISSING)
        path = f"{prefix}{key}"
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            out.update(state_diff(old, new, prefix=path + "."))
        elif _changed(old, new):
            out[path] = (old, new)
    return out


def _changed(old: Any, new: Any) -> bool:
    """A NaN that stays NaN is no change; ``0.0`` → ``-0.0`` is (it is stored so); ``1`` →
    ``1.0`` is not (the same number)."""
    if isinstance(old, float) and isinstance(new, float):
        return not same_value(old, new)
    return not same_value(old, new, strict=False) or (type(old) is not type(new)
                                                      and not _same_number(old, new))


def _same_number(a: Any, b: Any) -> bool:
    numbers = (int, float)
    return (isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool)
            and not isinstance(b, bool) and a == b)
