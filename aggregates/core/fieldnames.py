"""Guard against operator injection: keys from payloads or handler state must never be able
to become MongoDB operators or update paths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aggregates.core.errors import EnvelopeError, InvalidFieldName
from aggregates.core.jsonnumbers import NonJSONNumber, not_json, number_name
from aggregates.core.reasons import Reason

MAX_DEPTH = 64


def check_field_names(value: Any, path: str, *, envelope: bool = False, depth: int = 0,
                      finite: bool | None = None) -> None:
    """Raise if any key (at any depth) is not a string, starts with ``$`` or contains ``.``.

    ``envelope=True`` raises :class:`EnvelopeError` (input validation), otherwise
    :class:`InvalidFieldName` (handler output). ``finite`` (default: ``envelope``): a float
    NaN or infinity is refused too, as not JSON — :class:`EnvelopeError` with code
    ``invalid_json``, or :class:`~aggregates.core.jsonnumbers.NonJSONNumber`."""
    if finite is None:
        finite = envelope
    if depth > MAX_DEPTH:
        _fail(path, envelope, f"nested deeper than {MAX_DEPTH} levels",
              code=Reason.PAYLOAD_TOO_DEEP)
    if isinstance(value, dict | Mapping):  # dict first: the ABC check is slow
        for key, item in value.items():
            if type(key) is not str:
                _fail(f"{path}.{key!r}", envelope, "keys must be strings")
            if key[:1] == "$" or "." in key or "\x00" in key:
                _fail(
                    f"{path}.{key}",
                    envelope,
                    "field names must not start with '$' or contain '.' (operator injection)",
                )
            if type(item) in _SCALARS:
                if finite and type(item) is float and item - item != 0.0:  # NaN, ±inf
                    _not_json(f"{path}.{key}", item, envelope)
                continue
            if isinstance(item, dict | list | tuple | Mapping):
                check_field_names(item, f"{path}.{key}", envelope=envelope, depth=depth + 1,
                                  finite=finite)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if type(item) in _SCALARS:
                if finite and type(item) is float and item - item != 0.0:  # NaN, ±inf
                    _not_json(f"{path}[{i}]", item, envelope)
                continue
            if isinstance(item, dict | list | tuple | Mapping):
                check_field_names(item, f"{path}[{i}]", envelope=envelope, depth=depth + 1,
                                  finite=finite)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _not_json(path: str, number: float, envelope: bool) -> None:
    if envelope:
        raise EnvelopeError(path, not_json(number_name(number)), code=Reason.INVALID_JSON)
    raise NonJSONNumber(path, number_name(number))


def _fail(path: str, envelope: bool, reason: str, *, code: str | None = None) -> None:
    if envelope:
        raise EnvelopeError(path, reason, code=code)
    raise InvalidFieldName(path)


def escape_key(key: str) -> str:
    """Make an arbitrary string safe as one MongoDB field-name segment (``%`` is escaped too,
    so two different strings never give the same segment)."""
    return key.replace("%", "%25").replace(".", "%2E").replace("$", "%24")
