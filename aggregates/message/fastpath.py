"""The envelope check's fast path: the common, valid envelope proven valid with cheap tests.

:meth:`aggregates.message.envelope.Message.from_dict` is the one definition of a valid
envelope. :func:`parse_envelope` is how every reader of envelopes applies it: first
:func:`fast_message`, which returns exactly what ``from_dict`` returns when it can prove,
with type-identity and plain string tests, that every check of ``from_dict`` passes;
otherwise ``from_dict`` itself, which builds the message or raises the one error naming the
field. The fast path never raises and never decides a failure, so reason codes and details
come from one place. The same field rules (:func:`id_ok`, :func:`plain_payload`,
:func:`source_ok`, :func:`headers_ok`, :func:`schema_version_ok`) prove the envelopes the
dispatcher builds from outbox entries (:mod:`aggregates.wire.outbound`).

What the fast path accepts is narrower than ``from_dict`` (``tests/aggregates/
test_envelope_fastpath.py`` holds the two equal on any JSON object and hostile values):

- the decoded record is a ``dict`` whose keys are envelope fields;
- ids and names are ``str``: non-empty, no surrounding white space, at most
  :data:`~aggregates.message.envelope.MAX_ID_LENGTH` characters, no NUL;
- strings can only hold a lone surrogate when the raw text has a ``\\u`` escape or is not
  ASCII; then each string is checked;
- the payload is a ``dict`` of JSON values whose keys pass the field-name rules, whose
  integers fit BSON's int64, whose floats are finite (NaN and infinity are not JSON), at
  most 60 levels deep, and whose raw record is small enough that its BSON size cannot
  exceed ``max_payload_bytes`` (a BSON element takes at most :data:`_BSON_PER_CHAR` bytes
  per character of its JSON text), so ``bson.encode`` is not needed to prove it fits;
- ``occurred_at`` is absent, ``YYYY-MM-DDTHH:MM:SS[.fff[fff]]Z`` or anything
  :func:`~aggregates.message.envelope.parse_time` accepts; ``source``, ``headers`` and
  ``schema_version`` are absent or of their plain form.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final, TypeGuard

from aggregates.core.errors import EnvelopeError
from aggregates.core.fastbuild import slot_builder, utf8_encodable
from aggregates.core.jsonnumbers import refuse_constant
from aggregates.message.envelope import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    ENVELOPE_FIELDS,
    MAX_ID_LENGTH,
    MAX_SCHEMA_VERSION,
    MAX_SEQ,
    Message,
    Source,
    parse_time,
)

__all__ = ["fast_message", "headers_ok", "id_ok", "parse_envelope", "plain_payload",
           "schema_version_ok", "source_ok"]

_FIELDS: Final = frozenset(ENVELOPE_FIELDS)
#: An upper bound of BSON bytes per character of a payload's JSON text (the worst case is
#: an array of one-digit numbers: 2 characters, "1," → type, index key, NUL, int32 — at
#: most 18 bytes while the index has at most 8 digits; strings take at most 4 UTF-8 bytes
#: per character). Records longer than ``max_payload_bytes / _BSON_PER_CHAR`` characters
#: take the exact path.
_BSON_PER_CHAR: Final = 16
#: Deepest payload nesting checked here (``check_field_names`` allows 64); deeper: exact path.
_MAX_WALK_DEPTH: Final = 60
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
#: occurred_at in the form producers write (UTC, no fraction or 3 or 6 digits of it): parsed
#: by ``datetime.fromisoformat`` as ``parse_time`` parses it (then cut to milliseconds).
_ISO_UTC: Final = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3}(?:\d{3})?)?Z")
_fromisoformat: Final = datetime.fromisoformat
#: A text of at most this many characters holds no string longer than ``MAX_ID_LENGTH``.
_SHORT_LINE: Final = MAX_ID_LENGTH + 2
#: ``json.loads``'s scan of one value at an offset (as ``spark.messages.json_loads`` scans);
#: NaN, Infinity and -Infinity raise (not JSON).
_make_scanner: Any = json.scanner.make_scanner  # typeshed types it as the class it is
_scan_once: Final[Any] = _make_scanner(json.JSONDecoder(parse_constant=refuse_constant))

_MESSAGE_SLOTS: Final = ("message_id", "type", "aggregate_type", "aggregate_id", "payload",
                         "occurred_at", "source", "correlation_id", "causation_id", "headers",
                         "schema_version")
#: ``Message(...)`` with every field given, positionally: the same object (Message has no
#: ``__post_init__``), slots filled directly (:func:`aggregates.core.fastbuild.slot_builder`
#: checks the field order).
_slot_message: Callable[..., Message] = slot_builder(Message, _MESSAGE_SLOTS)
#: Message's slots on a class that is not frozen: an instance filled with plain attribute
#: stores, then made a Message (``__class__`` assignment, allowed between classes of the
#: same slots) — the object ``Message(...)`` builds, at a third of the cost of one
#: descriptor call per slot (:func:`_twin_message`).
_Unfrozen: Final[Any] = type("_UnfrozenMessage", (), {"__slots__": _MESSAGE_SLOTS})
_new: Final = object.__new__


def _twin_message(mid: str, mtype: str, atype: str, aid: str, payload: dict[str, Any],
                  occurred_at: datetime | None, source: Source | None,
                  correlation_id: str | None, causation_id: str | None,
                  headers: dict[str, str], version: int) -> Message:
    o = _new(_Unfrozen)
    o.message_id = mid
    o.type = mtype
    o.aggregate_type = atype
    o.aggregate_id = aid
    o.payload = payload
    o.occurred_at = occurred_at
    o.source = source
    o.correlation_id = correlation_id
    o.causation_id = causation_id
    o.headers = headers
    o.schema_version = version
    o.__class__ = Message
    msg: Message = o
    return msg


def _message_builder() -> Callable[..., Message]:
    """:func:`_twin_message` when it builds what ``Message(...)`` builds here (a Message
    whose layout differs, e.g. compiled, refuses the ``__class__`` assignment), else the
    slot builder."""
    probe = ("m", "t", "A", "a", {"k": 1}, None, Source("S", "s", 1), "c", "d", {"h": "v"}, 2)
    try:
        twin = _twin_message(*probe)
    except TypeError:
        return _slot_message
    built = Message(*probe)
    same = type(twin) is Message and all(
        getattr(twin, n) is getattr(built, n) for n in _MESSAGE_SLOTS)
    return _twin_message if same else _slot_message


_new_message: Final = _message_builder()


def parse_envelope(decoded: Any, raw: str | None = None, *,
                   max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> Message:
    """``Message.from_dict(decoded, max_payload_bytes=...)``: the same message or the same
    :class:`~aggregates.core.errors.EnvelopeError`; through :func:`fast_message` when
    ``raw``, the JSON text ``decoded`` was parsed from, is given."""
    if raw is not None:
        msg = fast_message(decoded, raw, max_payload_bytes)
        if msg is not None:
            return msg
    return Message.from_dict(decoded, max_payload_bytes=max_payload_bytes)


# -- the field rules: True only when from_dict's check of the field passes ---------------------
def id_ok(value: Any, escapes: bool) -> TypeGuard[str]:
    """An id or name that ``from_dict`` keeps unchanged. ``escapes``: the string may hold a
    lone surrogate (then it is checked)."""
    return (type(value) is str and 0 < len(value) <= MAX_ID_LENGTH and value.strip() == value
            and "\x00" not in value and (not escapes or utf8_encodable(value)))


def plain_payload(value: Any, escapes: bool, depth: int = 0) -> bool:
    """``check_field_names`` passes (no NaN or infinity either) and ``bson.encode`` can
    encode ``value`` (a dict or list of JSON values)."""
    if depth > _MAX_WALK_DEPTH:
        return False
    items = value.items() if type(value) is dict else enumerate(value)
    for key, item in items:
        if type(key) is str and (key[:1] == "$" or "." in key or "\x00" in key
                                 or (escapes and not utf8_encodable(key))):
            return False
        t = type(item)
        if t is str:
            if escapes and not utf8_encodable(item):
                return False
        elif t is int:
            if not _INT64_MIN <= item <= _INT64_MAX:
                return False
        elif t is dict or t is list:
            if not plain_payload(item, escapes, depth + 1):
                return False
        elif t is float:
            if item - item != 0.0:  # NaN or infinity (inf - inf is NaN): not JSON
                return False
        elif t is not bool and item is not None:
            return False
    return True


def source_ok(source: Any, escapes: bool) -> bool:
    """A ``source`` (not ``None``) that ``from_dict`` accepts as ``Source(type, id, seq)``."""
    if type(source) is not dict:
        return False
    seq = source.get("seq")
    return (type(seq) is int and 1 <= seq <= MAX_SEQ and id_ok(source.get("type"), escapes)
            and id_ok(source.get("id"), escapes))


def headers_ok(headers: Any, escapes: bool) -> bool:
    """``headers`` (not ``None``) that ``from_dict`` keeps as they are."""
    if type(headers) is not dict:
        return False
    for k, v in headers.items():
        if (type(k) is not str or type(v) is not str or k[:1] == "$" or "\x00" in k
                or (escapes and not (utf8_encodable(k) and utf8_encodable(v)))):
            return False
    return True


def schema_version_ok(version: Any) -> bool:
    """A ``schema_version`` (not ``None``) that ``from_dict`` keeps as it is."""
    return type(version) is int and 1 <= version <= MAX_SCHEMA_VERSION


def _time(value: Any) -> tuple[bool, datetime | None]:
    if value is None:
        return True, None
    if type(value) is str and _ISO_UTC.fullmatch(value):
        try:
            dt = datetime.fromisoformat(value)
        except ValueError:
            return False, None
        if dt.microsecond % 1000:
            dt = dt.replace(microsecond=dt.microsecond // 1000 * 1000)
        return True, dt
    try:
        return True, parse_time(value, "occurred_at")
    except (EnvelopeError, OverflowError):  # OverflowError: an int beyond a float's range
        return False, None


# -- the fast path -----------------------------------------------------------------------------
def fast_message(decoded: Any, raw: str, max_payload_bytes: int) -> Message | None:
    """``Message.from_dict(decoded, max_payload_bytes=max_payload_bytes)`` when that
    certainly succeeds (``decoded`` is ``json.loads(raw)``), else ``None``."""
    if type(decoded) is not dict:
        return None
    if max_payload_bytes and len(raw) * _BSON_PER_CHAR > max_payload_bytes:
        return None
    return _checked(decoded, _plain(raw), len(raw) <= _SHORT_LINE)


def _plain(raw: str) -> bool:
    """Every string ``json.loads(raw)`` holds is ASCII without NUL (so no lone surrogate):
    no ``\\u`` escape, no NUL and no other character than ASCII in the text (the strict
    decoder refuses raw control characters in strings; ``\\b\\f\\n\\r\\t`` are
    ASCII)."""
    return raw.isascii() and "\\u" not in raw and "\x00" not in raw


def _checked(d: dict[str, Any], plain: bool, short: bool) -> Message | None:
    """``fast_message``'s checks of a decoded object; ``plain``: :func:`_plain` of its
    text (every string ASCII without NUL: neither is checked per string then); ``short``:
    the text is at most :data:`_SHORT_LINE` characters (no string in it is longer than
    ``MAX_ID_LENGTH``)."""
    try:
        mid, mtype = d["message_id"], d["type"]
        atype, aid, payload = d["aggregate_type"], d["aggregate_id"], d["payload"]
    except KeyError:
        return None
    if type(payload) is not dict:
        return None
    if plain:
        if not (type(mid) is str and type(mtype) is str and type(atype) is str
                and type(aid) is str
                and (mid and mtype and atype and aid if short else
                     0 < len(mid) <= MAX_ID_LENGTH and 0 < len(mtype) <= MAX_ID_LENGTH
                     and 0 < len(atype) <= MAX_ID_LENGTH and 0 < len(aid) <= MAX_ID_LENGTH)
                and mid.strip() == mid and mtype.strip() == mtype
                and atype.strip() == atype and aid.strip() == aid):
            return None
        for key, item in payload.items():  # the first level inline; deeper: plain_payload
            if type(key) is not str or key[:1] == "$" or "." in key:
                return None
            t = type(item)
            if t is str or t is bool or item is None:
                continue
            if t is int:
                if not _INT64_MIN <= item <= _INT64_MAX:
                    return None
            elif t is float:
                if item - item != 0.0:  # NaN or infinity (inf - inf is NaN): not JSON
                    return None
            elif t is dict or t is list:
                if not plain_payload(item, False, 1):
                    return None
            else:
                return None
    elif not (id_ok(mid, True) and id_ok(mtype, True) and id_ok(atype, True)
              and id_ok(aid, True) and (not payload or plain_payload(payload, True))):
        return None
    at = d.get("occurred_at")
    occurred_at: datetime | None
    if at is None:
        occurred_at = None
    elif type(at) is str and len(at) == 20 and at[4:20:3] == "--T::Z":
        # YYYY-MM-DDTHH:MM:SSZ (see _utc_form), no fraction to cut
        try:
            occurred_at = _fromisoformat(at)
        except ValueError:
            return None
    elif type(at) is str and _utc_form(at):
        try:
            dt = _fromisoformat(at)
        except ValueError:
            return None
        us = dt.microsecond
        occurred_at = dt.replace(microsecond=us - us % 1000) if us % 1000 else dt
    else:
        ok, occurred_at = _time(at)
        if not ok:
            return None
    n = len(d)
    if n == 5 or (n == 6 and "occurred_at" in d):
        # the five required fields are there (read above): no optional one to check
        return _new_message(mid, mtype, atype, aid, payload, occurred_at, None, None, None,
                            {}, 1)
    return _optional(d, plain, mid, mtype, atype, aid, payload, occurred_at)


def _utc_form(at: str) -> bool:
    """``at`` has the separators of ``YYYY-MM-DDTHH:MM:SS[.fff[fff]]Z`` where that form has
    them. ``datetime.fromisoformat`` then parses it only if every other character is an
    ASCII digit (the date and time are read digit by digit) — exactly when
    :data:`_ISO_UTC` matches, at a third of its cost."""
    n = len(at)
    if n == 20:
        return at[4:20:3] == "--T::Z"
    return (n == 24 or n == 27) and at[-1] == "Z" and at[4:20:3] == "--T::."


def _optional(d: dict[str, Any], plain: bool, mid: str, mtype: str, atype: str, aid: str,
              payload: dict[str, Any], occurred_at: datetime | None) -> Message | None:
    """The message of an envelope with optional fields (or None, see ``fast_message``)."""
    if not d.keys() <= _FIELDS:
        return None
    escapes = not plain
    source = d.get("source")
    if source is not None:
        if not source_ok(source, escapes) or (len(source) != 3 and any(
                type(v) is dict or type(v) is list for v in source.values())):
            # nested extra keys: deep, maybe (fastbatch proves the depth by shape)
            return None
        source = Source(source["type"], source["id"], source["seq"])
    correlation_id, causation_id = d.get("correlation_id"), d.get("causation_id")
    if ((correlation_id is not None and not id_ok(correlation_id, escapes))
            or (causation_id is not None and not id_ok(causation_id, escapes))):
        return None
    headers = d.get("headers")
    if headers is None:
        headers = {}
    elif headers_ok(headers, escapes):
        headers = dict(headers)
    else:
        return None
    version = d.get("schema_version")
    if version is None:
        version = 1
    elif not schema_version_ok(version):
        return None
    return _new_message(mid, mtype, atype, aid, payload, occurred_at, source, correlation_id,
                        causation_id, headers, version)
