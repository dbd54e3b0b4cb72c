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
  ids stay readable (``Order/o-1/m-17``) and every key aggbox wrote before this encoding
  (parts simply joined with ``/``) is still the right key whenever no part contained
  ``/`` or ``%``. The others are rewritten by ``aggbox migrate keys``; until then they are
  read compatibly (see :func:`read_hw` and :class:`aggregates.store.parking.ParkedStore`).
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
    "legacy_hw_sources",
    "legacy_path",
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


def legacy_path(*parts: str) -> str:
    """How aggbox joined parts before these encodings (ambiguous): plain ``/``."""
    return "/".join(parts)


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
    several ``/`` (a legacy key, see :func:`legacy_hw_sources`)."""
    if key.count("/") != 1:
        return None
    t, i = key.split("/")
    return _unescape(t), _unescape(i)


def legacy_hw_sources(key: str) -> list[tuple[str, str]]:
    """The sources an ``hw`` key written before this encoding may stand for.

    Such a key is ``escape_key(f"{type}/{id}")``: ``/`` inside a type or id was not escaped.
    With one ``/`` it is exactly :func:`hw_key` of its source; with several, every split is
    possible (``"x/y/z"``: ``("x", "y/z")`` or ``("x/y", "z")``) — the residual ambiguity of
    old data. Without any ``/`` it is no high-water key at all: ``[]``."""
    text = _unescape(key)
    return [(text[:i], text[i + 1:]) for i, c in enumerate(text) if c == "/"]


def read_hw(stored: Mapping[str, Any] | None) -> dict[str, int]:
    """The ``hw`` map of a stored document, in memory, keyed by :func:`hw_key`.

    A legacy key with several ``/`` (written before this encoding; see
    :func:`legacy_hw_sources`) is read as a mark for *each* source it may stand for, so no
    message the old key deduplicated is ever applied again (the conservative choice: a
    source that never sent anything may find its first seqs reported ``duplicate``, as
    before). Keys without ``/`` are kept as they are. When a key appears twice (a legacy
    key and the new one written since), the higher mark wins."""
    out: dict[str, int] = {}
    for k, v in (stored or {}).items():
        key, seq = str(k), int(v)
        slashes = key.count("/")
        keys = [key] if slashes <= 1 else [hw_key(t, i) for t, i in legacy_hw_sources(key)]
        for nk in keys:
            if seq > out.get(nk, -1):
                out[nk] = seq
    return out


def hw_label(key: str) -> str:
    """A stored ``hw`` key for people: ``"<source type>/<source id>"``, the parts decoded but
    for ``/`` and ``%`` (:func:`join_parts`), so the label stays unambiguous
    (``Tab/pos.1``, ``Shop%2Fx/web``). A legacy key with several ``/`` is shown unescaped."""
    parts = decode_hw_key(key)
    return join_parts(*parts) if parts else _unescape(key)
