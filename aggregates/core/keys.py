"""Keys built from user strings (pure): docs/design.md "Document layout", "Dedup" and
"Parking and blocking".

Every key that combines several user strings must be **unambiguous**: two different tuples
never give the same key (``"x/y" + "z"`` ≠ ``"x" + "y/z"``). Two encodings are used:

- *Length prefixing* (inbox archive ``_id``): ``f"{len(a)}:{a}{b}"``.
- *Escaped paths* (parked and dead-letter ``_id``, ``hw`` keys): each part is
  percent-encoded — ``%`` → ``%25`` and ``/`` → ``%2F`` (``hw`` keys, which are field names,
  also ``.`` → ``%2E``, ``$`` → ``%24`` and NUL → ``%00``) — and the parts are joined with
  ``/``. An encoded part contains no ``/``, so a key splits back into exactly its parts.

  A part without ``/`` or ``%`` (and, in ``hw`` keys, ``.``/``$``) encodes to itself, so the
  ids stay readable (``Order/o-1/m-17``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "archive_key",
    "dead_letter_key",
    "decode_hw_key",
    "hw_key",
    "hw_label",
    "join_parts",
    "parked_key",
    "read_hw",
    "split_parts",
]


# -- length prefixing ------------------------------------------------------------------------
def archive_key(aggregate_id: str, message_id: str) -> str:
    """The inbox-archive ``_id`` of one (aggregate, message) pair: ``"ab"`` + ``"c"`` is
    ``"2:abc"``, ``"a"`` + ``"bc"`` is ``"1:abc"``."""
    return f"{len(aggregate_id)}:{aggregate_id}{message_id}"


# -- escaped paths ---------------------------------------------------------------------------
_PATH_ESCAPES = {"%": "%25", "/": "%2F"}
_FIELD_ESCAPES = {"%": "%25", "/": "%2F", ".": "%2E", "$": "%24", "\x00": "%00"}
_PATH_RE = re.compile("[%/]")
_FIELD_RE = re.compile("[%/.$\x00]")
_UNESCAPES = {v: k for k, v in _FIELD_ESCAPES.items()}
_UNESCAPE_RE = re.compile("%(?:25|2F|2E|24|00)")


def _escape_part(part: str) -> str:
    return _PATH_RE.sub(lambda m: _PATH_ESCAPES[m.group()], part)


def _escape_field_part(part: str) -> str:
    return _FIELD_RE.sub(lambda m: _FIELD_ESCAPES[m.group()], part)


def _unescape(text: str) -> str:
    # One pass: an escaped text's every '%' starts an escape, so none is decoded twice.
    return _UNESCAPE_RE.sub(lambda m: _UNESCAPES[m.group()], text)


def join_parts(*parts: str) -> str:
    """``parts`` percent-encoded (``%``, ``/``) and joined with ``/``; see the module doc."""
    return "/".join(_escape_part(p) for p in parts)


def split_parts(key: str) -> list[str]:
    """The parts of a :func:`join_parts` key."""
    return [_unescape(p) for p in key.split("/")]


def parked_key(collection: str, aggregate_id: str, message_id: str) -> str:
    """The ``_id`` of a parked message (``aggbox_parked``)."""
    return join_parts(collection, aggregate_id, message_id)


def dead_letter_key(aggregate_type: str, aggregate_id: str, message_id: str) -> str:
    """The ``_id`` of the dead letter of a message (``aggbox_dead_letters``)."""
    return join_parts(aggregate_type, aggregate_id, message_id)


# -- hw: high-water keys (field names) -------------------------------------------------------
def hw_key(source_type: str, source_id: str) -> str:
    """The field name under ``hw`` of one source aggregate: both parts escaped (``%``, ``/``,
    ``.``, ``$``, NUL), joined by the one ``/`` of the key. Safe as a field-name segment."""
    return f"{_escape_field_part(source_type)}/{_escape_field_part(source_id)}"


def decode_hw_key(key: str) -> tuple[str, str] | None:
    """``(source type, source id)`` of an :func:`hw_key`; ``None`` for a key with no or
    several ``/`` (not written by :func:`hw_key`)."""
    if key.count("/") != 1:
        return None
    t, i = key.split("/")
    return _unescape(t), _unescape(i)


def read_hw(stored: Mapping[str, Any] | None) -> dict[str, int]:
    """The ``hw`` map of a stored document, in memory: :func:`hw_key` → the source's mark."""
    return {str(k): int(v) for k, v in (stored or {}).items()}


def hw_label(key: str) -> str:
    """A stored ``hw`` key for people: ``"<source type>/<source id>"``, the parts decoded but
    for ``/`` and ``%`` (:func:`join_parts`), so the label stays unambiguous
    (``Tab/pos.1``, ``Shop%2Fx/web``). A key :func:`hw_key` did not write is shown
    unescaped."""
    parts = decode_hw_key(key)
    return join_parts(*parts) if parts else _unescape(key)
