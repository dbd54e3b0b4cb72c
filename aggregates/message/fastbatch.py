"""The envelope fast path for a whole batch of JSON lines (the Spark executor's parse).

:func:`fast_messages` gives, for each line, what :func:`aggregates.message.fastpath.
fast_message` gives for it (the message ``Message.from_dict`` builds, or None: the caller's
exact path decides the line and names its failure), at a fraction of the cost per line:

- the tests of the text are made once, on the batch's lines joined: no ``\\u`` escape, no
  NUL, nothing but ASCII (no string can hold a lone surrogate or a NUL); then no ``"$``
  (no key starts with ``$``) and no ``.`` (no key holds one); no backslash and no quote
  next to a space (no string starts or ends with white space: JSON spells every other
  white space character with a backslash);
- the common envelope — the five required fields and ``occurred_at`` as
  ``YYYY-MM-DDTHH:MM:SS[.fff[fff]]Z`` or null or absent — is checked inline, the payload's
  first level too, and the message built on an unfrozen twin of Message's slots
  (:func:`aggregates.message.fastpath._twin_message`); any other line goes through
  ``fast_message``'s own checks;
- no line is read twice, no bracket is counted (see :func:`fast_messages` on depth).

``tests/spark/test_records_fastpath.py`` holds the executor's outcomes equal with and
without this path on the fuzz test's lines and hostile envelopes.

The native core (native/src/envelope.rs, when :data:`aggregates.core.ids.NATIVE`) proves
the common envelope — its optional fields too — straight from an Arrow column's buffers
(:func:`native_prove`, used by :mod:`spark.records`); the lines it leaves go through
:func:`fast_messages`. ``tests/aggregates/test_envelope_native.py`` holds its messages equal
to Python's on the same corpus.
"""

from __future__ import annotations

import gc
import json
import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Final

from aggregates.core import ids
from aggregates.core.gcpause import gc_paused
from aggregates.core.native_core import native_core
from aggregates.message.envelope import MAX_ID_LENGTH, MAX_RECORD_DEPTH, Message, Source
from aggregates.message.fastpath import (
    _BSON_PER_CHAR,
    _INT64_MAX,
    _INT64_MIN,
    _MESSAGE_SLOTS,
    _SHORT_LINE,
    _checked,
    _fromisoformat,
    _new_message,
    _plain,
    _scan_once,
    _twin_message,
    _Unfrozen,
    _utc_form,
    plain_payload,
)

__all__ = ["NATIVE_PROVE", "fast_messages", "native_lines", "native_prove"]

#: Longest line parsed here when no payload limit bounds it (1 MiB).
_MAX_FAST_CHARS: Final = 1 << 20
#: Highest recursion limit under which a JSON scan (``json``'s C scanner recurses once per
#: nesting level, failing at the recursion limit) is safe on any line: a small C stack.
_SAFE_RECURSION: Final = 4000
_new: Final = object.__new__


def fast_messages(lines: Sequence[Any], max_payload_bytes: int) -> list[Message | None]:
    """For each line (a ``str``, or None: not to be parsed here), what
    ``fast_message(json.loads(line), line, max_payload_bytes)`` returns when the line is
    one JSON object from its first to its last character and small enough for the fast
    path; None for any other line (the caller's exact path decides it).

    Depth: a message proven here nests at most 62 levels (the payload walk stops at 60
    under the payload; every other field is flat), so its record is never too deep. The
    lines are scanned without counting their brackets first while the recursion limit
    bounds the scan's C recursion to a small stack (:data:`_SAFE_RECURSION`); above it a
    line with more than ``MAX_RECORD_DEPTH`` brackets is left to the exact path unread.
    The garbage collector is paused during the loop (it would walk the batch's new
    objects again and again; they hold no cycle)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _loop(lines, max_payload_bytes)
    finally:
        if enabled:
            gc.enable()


def _loop(lines: Sequence[Any], max_payload_bytes: int) -> list[Message | None]:
    out: list[Message | None] = [None] * len(lines)
    limit = max_payload_bytes // _BSON_PER_CHAR if max_payload_bytes else _MAX_FAST_CHARS
    count_brackets = sys.getrecursionlimit() > _SAFE_RECURSION
    try:
        text = "".join(lines)
    except TypeError:  # rows left to the exact path (None)
        text = "".join([x for x in lines if type(x) is str])
    # Searches for one character (memchr) where they can stand for two.
    escapes = "\\" in text
    plain = (text.isascii() and "\x00" not in text
             and not (escapes and "\\u" in text))  # as _plain(line) for each line
    # Then: no key starts with $ or holds a dot (a JSON text spells them so or with \u);
    keys_ok = plain and "." not in text and ("$" not in text or '"$' not in text)
    # no string starts or ends with white space (JSON spells any but " " with a backslash).
    bare = plain and not escapes and " " not in text
    del text
    scan = _scan_once
    common = plain and _new_message is _twin_message
    for i, raw in enumerate(lines):
        if type(raw) is not str:
            continue
        n = len(raw)
        if n > limit or (count_brackets
                         and raw.count("[") + raw.count("{") > MAX_RECORD_DEPTH):
            continue
        try:
            d, end = scan(raw, 0)
        except (StopIteration, ValueError, RecursionError):
            continue  # not JSON at 0 (or NaN/Infinity): the exact path says why
        if end != n or type(d) is not dict:
            continue
        try:
            if common:
                msg = _common(d, keys_ok, bare, n <= _SHORT_LINE)
                if msg is not None:
                    out[i] = msg
                    continue
            out[i] = _checked(d, plain or _plain(raw), n <= _SHORT_LINE)
        except Exception:  # never expected: the exact path reports it for this row
            out[i] = None
    return out


def _common(d: dict[str, Any], keys_ok: bool, bare: bool, short: bool) -> Message | None:
    """The message of the common envelope, or None (not proven: ``_checked`` decides).
    Every string of the text is ASCII without NUL; ``keys_ok``: no key starts with ``$``
    or holds a dot; ``bare``: no string has white space around it; ``short``: none is
    longer than ``MAX_ID_LENGTH``."""
    try:
        mid, mtype = d["message_id"], d["type"]
        atype, aid, payload = d["aggregate_type"], d["aggregate_id"], d["payload"]
    except KeyError:
        return None
    if not (type(mid) is str and type(mtype) is str and type(atype) is str
            and type(aid) is str and mid and mtype and atype and aid
            and type(payload) is dict):
        return None
    if not (short or (len(mid) <= MAX_ID_LENGTH and len(mtype) <= MAX_ID_LENGTH
                      and len(atype) <= MAX_ID_LENGTH and len(aid) <= MAX_ID_LENGTH)):
        return None
    if not (bare or (mid.strip() == mid and mtype.strip() == mtype
                     and atype.strip() == atype and aid.strip() == aid)):
        return None
    if not keys_ok:
        for key in payload:
            if key[:1] == "$" or "." in key:
                return None
    for item in payload.values():
        t = type(item)
        if t is int:
            if not _INT64_MIN <= item <= _INT64_MAX:
                return None
        elif t is str or t is bool or item is None:
            pass
        elif t is float:
            if item - item != 0.0:  # NaN or infinity (inf - inf is NaN): not JSON
                return None
        elif t is dict or t is list:
            if not plain_payload(item, False, 1):
                return None
        else:
            return None
    nf = len(d)
    if nf == 5:
        at = None
    elif nf == 6:
        try:
            at = d["occurred_at"]
        except KeyError:
            return None
        if at is not None:
            if type(at) is not str:
                return None
            try:
                if len(at) == 20 and at[4:20:3] == "--T::Z":  # no fraction to cut
                    at = _fromisoformat(at)
                elif _utc_form(at):
                    at = _fromisoformat(at)
                    us = at.microsecond
                    if us % 1000:
                        at = at.replace(microsecond=us - us % 1000)
                else:
                    return None
            except ValueError:  # not a date (2026-02-30): _checked does not prove it either
                return None
    else:
        return None
    o = _new(_Unfrozen)
    o.message_id = mid
    o.type = mtype
    o.aggregate_type = atype
    o.aggregate_id = aid
    o.payload = payload
    o.occurred_at = at
    o.source = None
    o.correlation_id = None
    o.causation_id = None
    o.headers = {}
    o.schema_version = 1
    o.__class__ = Message
    msg: Message = o
    return msg



# -- the native parse --------------------------------------------------------------------------
#: ``(proven, texts, bad, left)`` of one Arrow string column (see :func:`native_prove`).
NativeResult = tuple[list[Message | None], list[str | None], list[tuple[int, bytes]], list[int]]
#: A line every field of which the native parse builds: checked against Python's message
#: when the core is loaded.
_PROBE: Final = (
    '{"message_id":"m\\u00e9","type":"T","aggregate_type":"A","aggregate_id":"a",'
    '"payload":{"k":[1,-2.5e-3,"s\\n",null,true,{"x":{}}],"k":0,"big":-9223372036854775808},'
    '"occurred_at":"2026-01-02T03:04:05.678901Z","source":{"type":"S","id":"s","seq":3},'
    '"correlation_id":"c","causation_id":"d","headers":{"h":"v"},"schema_version":2}')


def _native_prove() -> Callable[..., NativeResult] | None:
    """``_aggbox_native.prove_envelopes`` when the native core is in use
    (:data:`aggregates.core.ids.NATIVE`: importable, ``AGGBOX_PURE`` not set) and builds
    for :data:`_PROBE` exactly the message Python builds; else None (the Python path)."""
    if not ids.NATIVE:
        return None
    core = native_core(needs="prove_envelopes")  # a core built before the parse: None
    if core is None:
        return None
    prove: Callable[..., NativeResult] = core.prove_envelopes
    try:  # Message's layout is read from its slots' descriptors
        core.envelope_init(Message, _MESSAGE_SLOTS, Source, ("type", "id", "seq"))
    except (TypeError, ValueError):  # not plain slots (e.g. compiled): the Python path
        return None  # (tests/aggregates/test_envelope_native.py fails on it)
    got = native_lines(prove, [_PROBE], 0)[0]
    want = Message.from_dict(json.loads(_PROBE), max_payload_bytes=0)
    same = type(got) is Message and all(
        repr(getattr(got, n)) == repr(getattr(want, n)) for n in _MESSAGE_SLOTS)
    return prove if same else None


def native_prove(data: Any, offsets: Any, validity: Any, offset: int, length: int, large: bool,
                 max_payload_bytes: int, skip: list[bool] | None) -> NativeResult:
    """One Arrow string column (its ``data``, ``offsets`` and ``validity`` buffers, the
    array's ``offset`` and ``length``; ``large``: 64-bit offsets) parsed by the native core:
    ``(proven, texts, bad, left)`` — each row's message, as :func:`fast_messages` builds it,
    or None; each row's ``str`` where it has no message (None: proven, null, or not UTF-8);
    the rows that are not valid UTF-8 as ``(row, bytes)``; the rows neither proven nor
    skipped (``skip[row]``: not to be parsed here) — which then went through
    :func:`fast_messages`, their message set in ``proven`` where it proved one. Only when
    :data:`NATIVE_PROVE` is set."""
    assert NATIVE_PROVE is not None
    with gc_paused():  # the batch's new objects hold no cycle (see fast_messages)
        proven, texts, bad, left = NATIVE_PROVE(data, offsets, validity, offset, length, large,
                                                max_payload_bytes, skip)
        if left:
            for row, msg in zip(left, _loop([texts[i] for i in left], max_payload_bytes),
                                strict=True):
                if msg is not None:
                    proven[row] = msg
    return proven, texts, bad, left


def native_lines(prove: Callable[..., NativeResult], lines: Sequence[str | None],
                 max_payload_bytes: int) -> list[Message | None]:
    """What ``prove`` (the native parse alone: no :func:`fast_messages` after it) proves of
    ``lines`` (None: a null row; lone surrogates are written as UTF-8 would, so such a line
    is no valid UTF-8), as one column."""
    data = [b"" if x is None else x.encode("utf-8", "surrogatepass") for x in lines]
    ends = array("q", [0])
    for b in data:
        ends.append(ends[-1] + len(b))
    valid = bytearray((len(lines) + 7) // 8)
    for i, x in enumerate(lines):
        if x is not None:
            valid[i >> 3] |= 1 << (i & 7)
    proven: list[Message | None] = prove(b"".join(data), ends, bytes(valid), 0, len(lines),
                                         True, max_payload_bytes, None)[0]
    return proven


#: The native parse (``_aggbox_native.prove_envelopes``), or None: the Python path only.
NATIVE_PROVE: Final = _native_prove()
