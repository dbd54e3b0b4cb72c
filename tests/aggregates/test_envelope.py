"""Envelope validation: every bad input names the field and the reason."""

from __future__ import annotations

from typing import Any

import pytest

from aggregates import EnvelopeError, Message


def raw(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"message_id": "m1", "type": "Add", "aggregate_type": "Counter",
                            "aggregate_id": "a1", "payload": {"n": 1}}
    base.update(over)
    return {k: v for k, v in base.items() if v is not ...}


def test_valid_envelope_round_trips() -> None:
    m = Message.from_dict(raw(occurred_at="2026-01-02T03:04:05.123456Z",
                              source={"type": "Up", "id": "u1", "seq": 7},
                              correlation_id="c", headers={"h": "v"}))
    assert m.occurred_at is not None and m.occurred_at.microsecond == 123000  # BSON ms
    assert m.source is not None and m.source.seq == 7
    assert Message.from_dict(m.to_dict()) == m


@pytest.mark.parametrize(
    ("bad", "field", "reason"),
    [
        (raw(message_id=...), "message_id", "is required"),
        (raw(message_id=5), "message_id", "must be a string, got int"),
        (raw(message_id=" x"), "message_id", "non-empty"),
        (raw(type=""), "type", "non-empty"),
        (raw(aggregate_id=None), "aggregate_id", "is required"),
        (raw(payload=...), "payload", "is required"),
        (raw(payload=[1, 2]), "payload", "must be a JSON object, got list"),
        (raw(payload="{}"), "payload", "must be a JSON object, got str"),
        (raw(payload={"$set": 1}), "payload.$set", "operator injection"),
        (raw(payload={"a": {"b.c": 1}}), "payload.a.b.c", "operator injection"),
        (raw(payload={"a": [{"$x": 1}]}), "payload.a[0].$x", "operator injection"),
        (raw(occurred_at="yesterday"), "occurred_at", "not an ISO-8601 time"),
        (raw(occurred_at=True), "occurred_at", "must be an ISO-8601 string"),
        (raw(source={"type": "Up", "id": "u"}), "source.seq", "integer ≥ 1"),
        (raw(source={"type": "Up", "id": "u", "seq": 0}), "source.seq", "integer ≥ 1"),
        (raw(source={"id": "u", "seq": 1}), "source.type", "is required"),
        (raw(source="Up/u/1"), "source", "must be an object"),
        (raw(headers={"a": 1}), "headers", "string → string"),
        (raw(extra=1), "extra", "unknown envelope field"),
        ("not an object", "<envelope>", "expected a JSON object, got str"),
        (raw(message_id="x" * 600), "message_id", "longer than"),
        (raw(occurred_at="0001-01-01T00:00:00+01:00"), "occurred_at", "out of range"),
        (raw(occurred_at=1e300), "occurred_at", "out of range"),
        (raw(source={"type": "Up", "id": "u", "seq": 2**70}), "source.seq", "int64"),
        (raw(source={"type": "Up", "id": "u\x00", "seq": 1}), "source.id", "NUL"),
        (raw(aggregate_id="a\x00b"), "aggregate_id", "NUL"),
    ],
)
def test_invalid_envelopes_name_the_field(bad: Any, field: str, reason: str) -> None:
    with pytest.raises(EnvelopeError) as info:
        Message.from_dict(bad)
    assert info.value.field == field
    assert reason in info.value.reason
    assert field in str(info.value)


def test_huge_payload_is_rejected_with_the_limit() -> None:
    with pytest.raises(EnvelopeError) as info:
        Message.from_dict(raw(payload={"blob": "x" * 2_000_000}))
    assert info.value.field == "payload"
    assert "524288" in info.value.reason
    assert Message.from_dict(raw(payload={"blob": "x" * 2_000_000}), max_payload_bytes=4_000_000)


def test_epoch_millis_and_naive_times_become_utc() -> None:
    m = Message.from_dict(raw(occurred_at=1_767_225_600_000))
    assert m.occurred_at is not None and m.occurred_at.isoformat() == "2026-01-01T00:00:00+00:00"
    n = Message.from_dict(raw(occurred_at="2026-01-01T00:00:00"))
    assert n.occurred_at == m.occurred_at


@pytest.mark.parametrize(
    ("over", "field", "reason"),
    [
        ({"aggregate_id": "a\ud800"}, "aggregate_id", "lone surrogate"),
        ({"message_id": "\udfff"}, "message_id", "lone surrogate"),
        ({"type": "T\ud83d"}, "type", "lone surrogate"),
        ({"correlation_id": "c\ud800"}, "correlation_id", "lone surrogate"),
        ({"source": {"type": "U", "id": "u\ud800", "seq": 1}}, "source.id", "lone surrogate"),
        ({"headers": {"h": "\ud800"}}, "headers", "value of 'h' is not valid Unicode"),
        ({"headers": {"\ud800": "v"}}, "headers", "is not valid Unicode"),
        ({"headers": {"a\x00": "v"}}, "headers", "NUL"),
        ({"headers": {"$set": "v"}}, "headers", "'$'"),
        ({"payload": {"s": "\ud800"}}, "payload", "cannot be stored"),
        ({"occurred_at": 1772355600000000000}, "occurred_at", "253402300799999"),
        ({"occurred_at": -62135596800001}, "occurred_at", "-62135596800000"),
        ({"occurred_at": 2**70}, "occurred_at", "epoch milliseconds out of range"),
        ({"payload": {"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
            [1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}},
         "payload.a", "nested deeper than 64"),
    ],
)
def test_hostile_strings_and_numbers_name_the_field(over: dict[str, Any], field: str,
                                                    reason: str) -> None:
    with pytest.raises(EnvelopeError) as info:
        Message.from_dict(raw(**over))
    assert info.value.field.startswith(field), info.value
    assert reason in info.value.reason
    str(info.value).encode("utf-8")  # the detail itself is storable


def test_epoch_millis_at_the_ends_of_the_range_are_accepted() -> None:
    assert Message.from_dict(raw(occurred_at=253402300799999)).occurred_at is not None
    assert Message.from_dict(raw(occurred_at=-62135596800000)).occurred_at is not None


def test_json_depth_counts_brackets_outside_strings_without_recursion() -> None:
    from aggregates.message.envelope import MAX_RECORD_DEPTH, json_depth

    assert json_depth('{"a": [1, {"b": 2}]}') <= MAX_RECORD_DEPTH
    assert json_depth("[" * 100_000) == 100_000
    assert json_depth('{"s": "' + "[{" * 500 + '", "t": "\\\\", "u": "\\"[["}') == 1
    assert json_depth('{"a": ' * 70 + "1" + "}" * 70) == 70


def test_errors_with_a_reason_of_their_own_carry_its_code() -> None:
    """The pipeline tells payload_too_large / payload_too_deep by the error's code, never by
    its text (spark/records.py _envelope_reason)."""
    base: dict[str, Any] = {"message_id": "m", "type": "T", "aggregate_type": "A",
                            "aggregate_id": "a"}
    with pytest.raises(EnvelopeError) as big:
        Message.from_dict({**base, "payload": {"x": "y" * 500}}, max_payload_bytes=100)
    assert (big.value.field, big.value.code) == ("payload", "payload_too_large")
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(80):
        node["n"] = {}
        node = node["n"]
    with pytest.raises(EnvelopeError) as nested:
        Message.from_dict({**base, "payload": deep})
    assert nested.value.field.startswith("payload") and nested.value.code == "payload_too_deep"
    with pytest.raises(EnvelopeError) as plain:
        Message.from_dict({**base, "payload": {"$set": 1}})
    assert plain.value.code is None
