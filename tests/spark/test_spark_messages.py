"""The executor's fast path (spark/messages.py) builds exactly the Message that
``Message.from_dict`` builds from the same line, and declines (``None``) whenever
``from_dict`` would raise: on hostile envelopes (the fuzz test's generators and hypothesis),
edge cases of every field, and payloads at the size bound. No Spark, no MongoDB."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.core.errors import EnvelopeError
from aggregates.message.envelope import DEFAULT_MAX_PAYLOAD_BYTES, Message
from spark.messages import fast_message
from tests.hypo import examples
from tests.spark.test_spark_fuzz import _json_values, dumps, junk_envelope, random_json

LIMITS = (DEFAULT_MAX_PAYLOAD_BYTES, 0, 300, 4096)


def base(**over: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"message_id": "m1", "type": "Deposited", "aggregate_type": "Account",
                         "aggregate_id": "a1", "payload": {"amount": 1, "note": "n"},
                         "occurred_at": "2026-01-01T00:00:12.345Z"}
    e.update(over)
    return {k: v for k, v in e.items() if v is not _DROP}


_DROP = object()


def check(raw: str, limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> Message | None:
    """Assert the fast path agrees with from_dict on ``raw``; returns the fast result."""
    try:
        decoded = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    fast = fast_message(decoded, raw, limit)
    try:
        slow: Message | None = Message.from_dict(json.loads(raw), max_payload_bytes=limit)
    except EnvelopeError:
        slow = None
    except Exception:  # from_dict's other failures: the executor's generic dead letter
        slow = None
    if fast is not None:
        assert slow is not None, f"fast path accepted what from_dict rejects: {raw[:300]!r}"
        assert fast == slow
        assert repr(fast) == repr(slow)  # key order, tzinfo, int vs float, Source
        assert type(fast) is Message and type(fast.payload) is dict
        assert list(fast.payload) == list(slow.payload)
        if fast.occurred_at is not None:
            assert slow.occurred_at is not None
            assert fast.occurred_at.tzinfo is slow.occurred_at.tzinfo
    return fast


def text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def test_the_common_envelope_takes_the_fast_path() -> None:
    for at in ("2026-01-01T00:00:12.345Z", "2026-01-01T00:00:12.345678Z", "2026-01-01T00:00:12Z",
               1767225600123, None):
        assert check(text(base(occurred_at=at))) is not None, at
    full = base(source={"type": "Feed", "id": "f1", "seq": 3, "extra": 1},
                correlation_id="c", causation_id="d", headers={"h": "v", "k": ""},
                schema_version=2, payload={"a": [1, {"b": None}], "c": -1.5, "d": True})
    assert check(text(full)) is not None
    assert check(json.dumps(base(aggregate_id="ünï", payload={"é": "\u2028"}))) is not None


EDGE_VALUES: dict[str, list[Any]] = {
    "message_id": ["", " m", "m ", "m\x00", "m" * 512, "m" * 513, "\ud800", "\udc00x", "ü",
                   "\t", 1, None, True, ["m"], {"m": 1}, "m\u2028", "\xa0m", "m\x1f"],
    "occurred_at": ["2026-01-01T00:00:00.1Z", "2026-01-01T00:00:00.1234Z",
                    "2026-01-01T00:00:00.1234567Z", "2026-02-30T00:00:00Z",
                    "2026-01-01T24:00:00Z", "2026-01-01T00:00:00ZZ", "2026-01-01T00:00:00+01:00",
                    "2026-01-01", "2026-01-01Z", "2026-01-01T00:00:00", "0001-01-01T00:00:00Z",
                    "9999-12-31T23:59:59.999999Z", "yesterday", "", 1.5, -62135596800001,
                    253402300799999, 2**70, True, [], {}, 1e300, float("nan")],
    "source": [{"type": "F", "id": "f", "seq": s} for s in (0, 1, 2**63 - 1, 2**63, -1, 1.0,
                                                             1.5, True, "1", None)]
    + [{"type": "F", "id": "f"}, {"type": "", "id": "f", "seq": 1},
       {"type": "F", "id": "\ud800", "seq": 1}, [], "s", {}, {"type": 1, "id": "f", "seq": 1}],
    "headers": [{}, [], "", 0, False, {"$h": "v"}, {"h\x00": "v"}, {"h": "v\x00"}, {"h": 1},
                {"h": None}, {"\ud800": "v"}, {"h": "\udfff"}, {"h.x": "v"}, {"": ""}, ["h"],
                {"h": "v" * 1000}],
    "schema_version": [1, 2, 0, -1, 2**31 - 1, 2**31, 1.0, 2.5, True, "1", [], None],
    "correlation_id": ["", "c", " c", "c" * 513, 1, "\ud800", None],
    "payload": [{}, [], "p", None, 1, {"$where": 1}, {"a.b": 1}, {"\x00": 1}, {"a": {"$x": 1}},
                {"a": [{"b.c": 1}]}, {"n": 2**63 - 1}, {"n": 2**63}, {"n": -(2**63)},
                {"n": -(2**63) - 1}, {"n": [2**64]}, {"n": {"m": 2**70}}, {"\ud800": 1},
                {"s": "\udc00"}, {"s": ["\ud83d"]}, {"s": "\ud83d\ude00"}, {"f": float("inf")},
                {"f": float("nan")}, {"f": -0.0}, {"1": 1}, {"": 1}, {"$": 1}, {"a$": 1}],
    "extra": ["x", None],
}


@pytest.mark.parametrize("field", sorted(EDGE_VALUES))
@pytest.mark.parametrize("limit", LIMITS)
def test_edge_values_of_every_field(field: str, limit: int) -> None:
    for value in EDGE_VALUES[field]:
        for ensure_ascii in (True, False):
            check(json.dumps(base(**{field: value}), ensure_ascii=ensure_ascii), limit)
    check(text(base(**{field: _DROP})), limit)


@pytest.mark.parametrize("depth", [1, 58, 59, 60, 61, 62, 63, 64, 65])
def test_deep_payloads(depth: int) -> None:
    inner: Any = 1
    for i in range(depth):
        inner = [inner] if i % 2 else {"k": inner}
    check(text(base(payload={"d": inner})))
    check(text(base(payload={"d": inner, "$x": 1})))


@pytest.mark.parametrize("shape", ["ones", "empty_lists", "empty_strings", "floats", "bools",
                                   "wide_chars", "keys", "int64"])
def test_payloads_at_the_size_bound_fit(shape: str) -> None:
    """Whatever the payload, when the fast path skips the exact BSON size check the payload
    does fit: the bound (BSON bytes per character of JSON text) holds for the worst shapes."""
    values: dict[str, Any] = {
        "ones": [1] * 3000, "empty_lists": [[]] * 3000, "empty_strings": [""] * 3000,
        "floats": [1e5] * 3000, "bools": [True] * 3000, "wide_chars": ["\U0001d11e"] * 3000,
        "keys": {f"{i}": 1 for i in range(3000)}, "int64": [-(2**63)] * 3000,
    }
    raw = json.dumps(base(payload={"v": values[shape]}), ensure_ascii=False,
                     separators=(",", ":"))
    for limit in (len(raw) * 16, len(raw) * 16 - 1, len(raw) * 4, len(raw)):
        fast = check(raw, limit)
        assert (fast is not None) is (limit >= len(raw) * 16)


@pytest.mark.parametrize("seed", range(8))
def test_hostile_envelopes_of_the_fuzz_test(seed: int) -> None:
    rng = random.Random(seed)
    taken = 0
    for n in range(400):
        value = junk_envelope(rng, n) if n % 4 else random_json(rng, 4)
        line = dumps(value, rng)
        try:
            raw = line.decode("utf-8")
        except UnicodeDecodeError:
            continue  # the executor dead-letters it as invalid_encoding before parsing
        taken += check(raw, rng.choice(LIMITS)) is not None
    assert taken < 400


@settings(max_examples=examples(300), deadline=None)
@given(field=st.sampled_from(["occurred_at", "source", "headers", "payload", "aggregate_id",
                              "type", "correlation_id", "schema_version", "message_id"]),
       value=_json_values, ensure_ascii=st.booleans(), limit=st.sampled_from(LIMITS))
def test_hypothesis_values_in_any_field(field: str, value: Any, ensure_ascii: bool,
                                        limit: int) -> None:
    check(json.dumps(base(**{field: value}), ensure_ascii=ensure_ascii), limit)
    check(json.dumps(base(payload={"v": value}), ensure_ascii=ensure_ascii), limit)


JSON_SAMPLES = ['{"a": 1}', ' {"a": 1}', '{"a": 1} ', '{"a": 1}\n', '\ufeff{"a": 1}', '{"a": 1}x',
                '{"a": 1}{"b": 2}', '{"a": NaN, "b": -Infinity}', '[1, 2', '', ' ', 'null', '1',
                '"s"', '{"a": "\\ud800"}', '{"a": 1, "a": 2}', '{"a": 1e400}', '01', '{"a":\t1}',
                '{"a": "\x01"}', '[' * 3000 + ']' * 3000, '{"k": ' * 50 + '1' + '}' * 50]


def loads_result(raw: str) -> tuple[str, str]:
    """The executor's parse and the reference: ``json.loads`` refusing NaN and Infinity
    (:func:`aggregates.core.jsonnumbers.loads`)."""
    from aggregates.core.jsonnumbers import loads
    from spark.messages import json_loads

    try:
        fast = repr(json_loads(raw))
    except Exception as exc:
        fast = f"{type(exc).__name__}: {exc}"
    try:
        slow = repr(loads(raw))
    except Exception as exc:
        slow = f"{type(exc).__name__}: {exc}"
    return fast, slow


@pytest.mark.parametrize("raw", JSON_SAMPLES)
def test_json_loads_is_json_loads(raw: str) -> None:
    fast, slow = loads_result(raw)
    assert fast == slow


def test_json_loads_refuses_nan_and_infinity_naming_the_field() -> None:
    fast, _ = loads_result('{"a": 1, "p": {"l": [NaN]}, "b": -Infinity}')
    assert fast.startswith("NonJSONNumber: p.l[0]: NaN is not JSON"), fast


@settings(max_examples=examples(300), deadline=None)
@given(raw=st.one_of(st.text(max_size=60), _json_values.map(json.dumps),
                     _json_values.map(lambda v: json.dumps(v) + " "),
                     st.binary(max_size=60).map(lambda b: b.decode("utf-8", "replace"))))
def test_json_loads_is_json_loads_on_any_text(raw: str) -> None:
    fast, slow = loads_result(raw)
    assert fast == slow
