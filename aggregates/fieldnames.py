"""Guard against operator injection: keys from payloads or handler state must never be able
to become MongoDB operators or update paths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aggregates.errors import EnvelopeError, InvalidFieldName

MAX_DEPTH = 64


def check_field_names(value: Any, path: str, *, envelope: bool = False, depth: int = 0) -> None:
    """Raise if any key (at any depth) is not a string, starts with ``$`` or contains ``.``.

    ``envelope=True`` raises :class:`EnvelopeError` (input validation), otherwise
    :class:`InvalidFieldName` (handler output)."""
    if depth > MAX_DEPTH:
        _fail(path, envelope, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                _fail(f"{path}.{key!r}", envelope, "keys must be strings")
            if key.startswith("$") or "." in key or "\x00" in key:
                _fail(
                    f"{path}.{key}",
                    envelope,
                    "field names must not start with '$' or contain '.' (operator injection)",
                )
            if isinstance(item, Mapping | list | tuple):
                check_field_names(item, f"{path}.{key}", envelope=envelope, depth=depth + 1)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if isinstance(item, Mapping | list | tuple):
                check_field_names(item, f"{path}[{i}]", envelope=envelope, depth=depth + 1)


def _fail(path: str, envelope: bool, reason: str) -> None:
    if envelope:
        raise EnvelopeError(path, reason)
    raise InvalidFieldName(path)


def escape_key(key: str) -> str:
    """Make an arbitrary string safe as one MongoDB field-name segment (reversible)."""
    return key.replace("%", "%25").replace(".", "%2E").replace("$", "%24")


def unescape_key(key: str) -> str:
    return key.replace("%24", "$").replace("%2E", ".").replace("%25", "%")
