"""Finding the native core (native/, docs/design.md "The hot path"), one rule for every
part that uses it: the importable ``_aggbox_native`` module, unless ``AGGBOX_PURE=1``, and
only a build that has what the part needs. Not built: ``None`` (the pure-Python path, the
definition); a broken build raises."""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ["native_core"]


def native_core(*, needs: str | None = None) -> Any:
    """The ``_aggbox_native`` module, or ``None`` when ``AGGBOX_PURE=1``, when it is not
    built, or when its build predates ``needs`` (a function or class it must have)."""
    if os.environ.get("AGGBOX_PURE") == "1":
        return None
    try:
        core = importlib.import_module("_aggbox_native")
    except ModuleNotFoundError as e:  # not built: pure Python (a broken build raises)
        if e.name != "_aggbox_native":
            raise
        return None
    if needs is not None and not hasattr(core, needs):  # an older build of the core
        return None
    return core
