"""One envelope check (aggregates/message/fastpath.py): its fast path is held equal to the
strict one, ``Message.from_dict``, on any JSON object and on hostile values in every field —
both accept and build the same :class:`Message`, or both reject naming the same field. The
dispatcher's entry → envelope fast path (aggregates/wire/outbound.py), built from the same
field rules, gives the envelope ``from_dict`` gives, or declines. No MongoDB."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregates.core.errors import EnvelopeError
from aggregates.message.envelope import ENVELOPE_FIELDS, Message
from aggregates.message.fastpath import fast_message, parse_envelope
from aggregates.wire.outbound import InvalidEntry, _fast_envelope, _slow_envelope
from tests.hypo import examples

PROPERTY = settings(max_examples=examples(600), deadline=None,
                    suppress_health_check=list(HealthCheck))
LIMITS = st.sampled_from([512 * 1024, 0, 300, 4096])

#: Strings that trip some rule: white space, NUL, lone surrogates, '$' and '.', lengths.
HOSTILE_TEXT = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["", " ", "a ", " a", "\x00", "a\x00", "\ud800", "x\udfff", "$a", "a.b",
                     "\u2028", "\xa0", "é", "😀", "m" * 512, "m" * 513, "%2F", "\t"]),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats() | HOSTILE_TEXT,  # NaN and infinities too: not JSON, both refuse them
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(HOSTILE_TEXT, inner, max_size=4),
    max_leaves=16,
)
TIMES = st.one_of(
    st.sampled_from(["2026-01-01T00:00:12.345Z", "2026-01-01T00:00:12Z",
                     "2026-01-01T00:00:12.345678Z", "2026-02-30T00:00:00Z",
                     "2026-01-01T00:00:00+01:00", "0001-01-01T00:00:00Z", "yesterday",
                     1767225600123, -62135596800001, 253402300799999, 2**70, 1.5]),
    JSON_VALUES)
GOOD: dict[str, Any] = {
    "message_id": "m1", "type": "Deposited", "aggregate_type": "Account", "aggregate_id": "a1",
    "payload": {"amount": 1, "note": "ü"}, "occurred_at": "2026-01-01T00:00:12.345Z",
    "source": {"type": "Feed", "id": "f1", "seq": 3}, "correlation_id": "c",
    "causation_id": "d", "headers": {"h": "v"}, "schema_version": 2}
#: Values worth trying per field: a good one, the field's hostile forms, any JSON value.
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "message_id": HOSTILE_TEXT | JSON_VALUES,
    "type": HOSTILE_TEXT | JSON_VALUES,
    "aggregate_type": HOSTILE_TEXT | JSON_VALUES,
    "aggregate_id": HOSTILE_TEXT | JSON_VALUES,
    "payload": st.dictionaries(HOSTILE_TEXT, JSON_VALUES, max_size=4) | JSON_VALUES,
    "occurred_at": TIMES,
    "source": st.fixed_dictionaries({"type": HOSTILE_TEXT, "id": HOSTILE_TEXT,
                                     "seq": st.integers(-1, 2**64) | JSON_VALUES})
    | JSON_VALUES,
    "correlation_id": HOSTILE_TEXT | JSON_VALUES,
    "causation_id": HOSTILE_TEXT | JSON_VALUES,
    "headers": st.dictionaries(HOSTILE_TEXT, HOSTILE_TEXT | JSON_VALUES, max_size=3)
    | JSON_VALUES,
    "schema_version": st.integers(-1, 2**32) | JSON_VALUES,
}


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """An envelope whose every field is good, hostile, absent — or a field it must not have."""
    out: dict[str, Any] = {}
    for name in ENVELOPE_FIELDS:
        how = draw(st.sampled_from(["good", "good", "good", "good", "hostile", "absent"]))
        if how == "good":
            out[name] = GOOD[name]
        elif how != "absent":
            out[name] = draw(FIELD_VALUES[name])
    if draw(st.integers(0, 9)) == 0:
        out[draw(HOSTILE_TEXT)] = draw(JSON_VALUES)
    return out


def outcome(call: Any) -> tuple[str, Any]:
    """``("message", repr)`` or ``("refused", (error type, field))``."""
    try:
        return "message", repr(call())
    except EnvelopeError as exc:
        return "refused", (type(exc).__name__, exc.field)
    except Exception as exc:  # any other failure must be the same failure too
        return "refused", (type(exc).__name__, None)


def assert_same(decoded: Any, raw: str, limit: int) -> None:
    strict = outcome(lambda: Message.from_dict(json.loads(raw), max_payload_bytes=limit))
    assert outcome(lambda: parse_envelope(decoded, raw, max_payload_bytes=limit)) == strict
    fast = fast_message(decoded, raw, limit)
    if fast is not None:  # the fast path only ever accepts what the strict one accepts
        assert ("message", repr(fast)) == strict
        assert fast == Message.from_dict(json.loads(raw), max_payload_bytes=limit)


@PROPERTY
@given(env=envelopes(), ascii_only=st.booleans(), limit=LIMITS)
def test_fast_and_strict_agree_on_hostile_envelopes(env: dict[str, Any], ascii_only: bool,
                                                    limit: int) -> None:
    raw = json.dumps(env, ensure_ascii=ascii_only)
    assert_same(json.loads(raw), raw, limit)


@PROPERTY
@given(value=st.dictionaries(HOSTILE_TEXT, JSON_VALUES, max_size=12) | JSON_VALUES,
       ascii_only=st.booleans(), limit=LIMITS)
def test_fast_and_strict_agree_on_any_json_value(value: Any, ascii_only: bool,
                                                 limit: int) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only)
    assert_same(json.loads(raw), raw, limit)


def test_the_common_envelope_takes_the_fast_path() -> None:
    raw = json.dumps({**GOOD, "occurred_at": "2026-01-01T00:00:12.345Z",
                      "source": {"type": "F", "id": "f", "seq": 3}, "headers": {"h": "v"},
                      "correlation_id": "c", "schema_version": 2})
    assert fast_message(json.loads(raw), raw, 512 * 1024) is not None


# -- the dispatcher's entries ---------------------------------------------------------------
DATES = st.one_of(
    st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=5)), None])),
    st.sampled_from([datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),
                     datetime(9999, 12, 31, 23, 30, tzinfo=timezone(timedelta(hours=-1)))]),
    JSON_VALUES)


@st.composite
def entries(draw: st.DrawFn) -> dict[str, Any]:
    """An outbox entry as the writer stores it, with any field hostile or absent."""
    good: dict[str, Any] = {"type": "Tick", "payload": {"n": 1},
                            "created_at": datetime(2026, 3, 1, 12, tzinfo=UTC),
                            "source": {"type": "Emitter", "id": "agg-1", "seq": 2},
                            "correlation_id": "c-1", "causation_id": "in-1",
                            "headers": {"tenant": "t1"}, "schema_version": 1}
    hostile: dict[str, st.SearchStrategy[Any]] = {
        **FIELD_VALUES, "created_at": DATES,
        "source": FIELD_VALUES["source"] | st.fixed_dictionaries(
            {"type": st.just("E"), "id": st.just("e"), "seq": st.integers(-1, 2**64)})}
    out: dict[str, Any] = {}
    for name, value in good.items():
        how = draw(st.sampled_from(["good", "good", "good", "good", "hostile", "absent"]))
        if how == "good":
            out[name] = value
        elif how == "hostile":
            out[name] = draw(hostile[name])
    return out


@PROPERTY
@given(entry=entries(), entry_id=HOSTILE_TEXT, agg_type=HOSTILE_TEXT, agg_id=HOSTILE_TEXT)
def test_entry_fast_envelope_is_the_validated_one(entry: dict[str, Any], entry_id: str,
                                                  agg_type: str, agg_id: str) -> None:
    args = (entry, entry_id or "e", agg_type, agg_id, entry.get("source"))
    fast = _fast_envelope(*args)
    if fast is None:
        return
    try:
        slow = _slow_envelope(*args)
    except InvalidEntry as exc:  # pragma: no cover - the failure this test exists for
        raise AssertionError(f"fast path accepted an entry from_dict refuses: {exc}") from None
    assert fast == slow
    assert Message.from_dict(fast, max_payload_bytes=0) == Message.from_dict(
        slow, max_payload_bytes=0)
