"""The native parse of the executor (native/src/envelope.rs, through
``aggregates.message.fastbatch``) is held to the definition: every line it proves is
exactly what ``Message.from_dict(json.loads(line))`` builds — the same field values and
types, payload key order, float bits (-0.0, subnormals, correct rounding), ints within
int64, an aware UTC ``occurred_at`` cut to milliseconds — and what Python's batch fast path
(``fast_messages``) builds where that proves it too. It proves the common envelope (tested
here: it leaves none of it to Python) and leaves everything else to Python: numbers at and
past the edges, ``1e400``, lone surrogates, NUL, ``$`` and ``.`` in keys, duplicate keys,
white space, a BOM, deep nesting, long lines, invalid UTF-8.

The native core is tested even under ``AGGBOX_PURE=1`` (initialised here when the library
does not use it); without it the tests skip only when no Rust toolchain is present, as
tests/test_native_core.py rules. No MongoDB, no Arrow."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
from array import array
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregates.core import ids
from aggregates.message import fastbatch
from aggregates.message.envelope import Message, Source
from aggregates.message.fastbatch import fast_messages, native_lines
from aggregates.message.fastpath import _MESSAGE_SLOTS
from tests.aggregates.test_envelope_fastpath import envelopes
from tests.hypo import examples

PROPERTY = settings(max_examples=examples(400), deadline=None,
                    suppress_health_check=list(HealthCheck))
LIMITS = [512 * 1024, 0, 300, 4096]
BASE = ('"message_id":"m1","type":"Deposited","aggregate_type":"Account",'
        '"aggregate_id":"a1"')


@pytest.fixture(scope="module")
def prove() -> Callable[..., Any]:
    """The native parse: the library's when it uses it, else initialised here."""
    if fastbatch.NATIVE_PROVE is not None:
        return fastbatch.NATIVE_PROVE
    if importlib.util.find_spec("_aggbox_native") is None:
        assert shutil.which("cargo") is None, (
            "cargo is on PATH but the native core is not installed: run `make native`")
        pytest.skip("no Rust toolchain here: the native core is not built (pure path only)")
    core = importlib.import_module("_aggbox_native")
    core.envelope_init(Message, _MESSAGE_SLOTS, Source, ("type", "id", "seq"))
    fn: Callable[..., Any] = core.prove_envelopes
    return fn


def shape(v: Any) -> Any:
    """``v`` with every type spelled out: dict key order, float bits, tz identity."""
    t = type(v)
    if t is dict:
        return ("dict", [(shape(k), shape(x)) for k, x in v.items()])
    if t is list:
        return ("list", [shape(x) for x in v])
    if t is float:
        return ("float", v.hex())
    if t is datetime:
        return ("datetime", v.isoformat(), v.tzinfo is UTC)
    if t is Source:
        return ("Source", shape(v.type), shape(v.id), shape(v.seq))
    return (t.__name__, v)


def message_shape(m: Any) -> Any:
    return type(m), [shape(getattr(m, n)) for n in _MESSAGE_SLOTS]


def check(prove: Callable[..., Any], lines: Sequence[str], limit: int) -> list[bool]:
    """Each line's native message (if any) against the definition and Python's fast
    path; which lines it proved."""
    native = native_lines(prove, lines, limit)
    python = fast_messages(lines, limit)
    for line, got, fast in zip(lines, native, python, strict=True):
        if got is None:
            continue
        want = Message.from_dict(json.loads(line), max_payload_bytes=limit)
        assert message_shape(got) == message_shape(want), line[:300]
        if fast is not None:
            assert message_shape(got) == message_shape(fast), line[:300]
    return [m is not None for m in native]


# -- JSON texts the native parse must read as Python's json reads them -----------------------
NUMBERS = ["0", "-0", "1", "-1", "100", "9223372036854775807", "-9223372036854775808",
           "9223372036854775808", "-9223372036854775809", "123456789012345678901234567890",
           "1e308", "1.7976931348623157e308", "1.7976931348623159e308", "5e-324",
           "4.9406564584124654e-324", "2.2250738585072014e-308", "1e-400", "0.1", "-0.0",
           "0.30000000000000004", "1e400", "-1e400", "1E2", "1.5e+3", "2.5E-3", "1e0",
           "100000000000000000000000.0", "3.141592653589793238462643383279", "01", "1.",
           ".5", "-", "+1", "1e", "0x10", "NaN", "Infinity", "-Infinity", "1_000"]
STRINGS = ['"plain"', '""', '"a b"', '" lead"', '"trail "', '"tab\\there"', '"\\u0041"',
           '"\\u00e9t\\u00e9"', '"\\ud83d\\ude00"', '"\\ud800"', '"\\udc00"',
           '"\\ud800\\u0041"', '"x\\u0000y"', '"\\/\\"\\\\\\b\\f\\n\\r\\t"', '"é😀"',
           '"\\u2028"', '"\\x41"', '"\\U0041"', '"\\u00"', '"bad\\q"', '"raw\ttab"',
           '"\u00a0nbsp"', '"nbsp\u00a0"', '"\u3000"', '"\x7f"']
KEYS = ['"k"', '""', '"$a"', '"a$"', '"a.b"', '"\\u0024a"', '"a\\u002eb"', '"x\\u0000"',
        '"\\ud800"', '"é"', '"\\u00e9"', '"k"', '"order_id"', '"credit_limit"']
TIMES = ['"2026-01-01T00:00:12Z"', '"2026-01-01T00:00:12.345Z"', '"2026-01-01T00:00:12.3Z"',
         '"2026-01-01T00:00:12.345678Z"', '"2026-01-01T00:00:12.3456789Z"',
         '"2024-02-29T23:59:59.999Z"', '"2023-02-29T00:00:00Z"', '"2026-04-31T00:00:00Z"',
         '"0000-01-01T00:00:00Z"', '"0001-01-01T00:00:00Z"', '"9999-12-31T23:59:59.999999Z"',
         '"2026-01-01T24:00:00Z"', '"2026-01-01T00:60:00Z"', '"2026-01-01T00:00:60Z"',
         '"2026-13-01T00:00:00Z"', '"2026-00-01T00:00:00Z"', '"2026-01-00T00:00:00Z"',
         '"2026-01-01t00:00:12Z"', '"2026-01-01T00:00:12z"', '"2026-01-01 00:00:12Z"',
         '"2026-01-01T00:00:12+00:00"', '"2026-01-01T00:00:12"', '"2026-1-01T00:00:12Z"',
         '"2026-01-01T00:00:1xZ"', '"\\u0032026-01-01T00:00:12Z"', "null", "1767225600123",
         "1.5", "true", '""']
WS = ["", " ", "\t", "\n", "\r", "  \n ", "\u00a0", "\x0b"]


def pick(good: list[str], bad: list[str]) -> st.SearchStrategy[str]:
    """Mostly a value the native parse reads, sometimes one it must leave to Python."""
    return st.integers(0, 7).flatmap(
        lambda i: st.sampled_from(bad if i == 0 and bad else good))


#: Of NUMBERS, STRINGS, KEYS: those in range / readable / allowed (the others are edges).
GOOD_NUMBERS = NUMBERS[:19] + NUMBERS[20:27]
BAD_NUMBERS = [n for n in NUMBERS if n not in GOOD_NUMBERS]
GOOD_STRINGS = STRINGS[:9] + STRINGS[12:16] + STRINGS[22:]
BAD_STRINGS = [x for x in STRINGS if x not in GOOD_STRINGS]
GOOD_KEYS = ['"k"', '""', '"a$"', '"é"', '"\\u00e9"', '"order_id"', '"credit_limit"']
BAD_KEYS = [k for k in KEYS if k not in GOOD_KEYS]


@st.composite
def json_texts(draw: st.DrawFn, depth: int = 0) -> str:
    """A JSON (or almost JSON) value's text, edges included."""
    kind = draw(st.sampled_from(["n", "s", "lit", "obj", "arr"] if depth < 3 else ["n", "s"]))
    if kind == "n":
        return draw(pick(GOOD_NUMBERS, BAD_NUMBERS) | st.integers(-(2**63), 2**63 - 1).map(str)
                    | st.floats(allow_nan=False, allow_infinity=False).map(repr))
    if kind == "s":
        return draw(pick(GOOD_STRINGS, BAD_STRINGS) | st.text(max_size=12).map(json.dumps)
                    | st.text(max_size=12).map(lambda t: json.dumps(t, ensure_ascii=False)))
    if kind == "lit":
        return draw(pick(["true", "false", "null"], ["True", "nul"]))
    items = draw(st.lists(st.tuples(pick(GOOD_KEYS, BAD_KEYS), json_texts(depth + 1)),
                          max_size=4))
    ws = draw(pick(WS[:2], WS[2:]))
    if kind == "arr":
        return "[" + ws + ("," + ws).join(v for _, v in items) + ws + "]"
    return "{" + ws + ("," + ws).join(f"{k}{ws}:{ws}{v}" for k, v in items) + ws + "}"


@st.composite
def envelope_texts(draw: st.DrawFn) -> str:
    """An envelope line: the required fields (sometimes broken), the optional ones in
    any order and form, duplicates, white space, a BOM."""
    items = draw(st.lists(st.tuples(pick(GOOD_KEYS, BAD_KEYS), json_texts(2)), max_size=5))
    payload = "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    fields = [("message_id", '"m1"'), ("type", '"Deposited"'), ("aggregate_type", '"Acc"'),
              ("aggregate_id", '"a1"'), ("payload", payload)]
    optional = {
        "occurred_at": pick(TIMES[:6] + TIMES[8:11] + ["null"], TIMES),
        "source": pick(['{"type":"F","id":"f","seq":3}', "null", '{"seq":1,"id":"f","type":"F"}',
                        '{"type":"F","id":"f","seq":9223372036854775807}'],
                       ['{"type":"F"}', '{"type":"F","id":"f","seq":0}',
                        '{"type":"F","id":"f","seq":1.0}', '{"type":"F","id":"f","seq":1,"x":2}']),
        "correlation_id": pick(['"c"', "null", '"\\u00e9"'], ['""', '" c"', "1"]),
        "causation_id": pick(['"d"', "null"], []) | json_texts(2),
        "headers": pick(['{"h":"v"}', "null", "{}", '{"h":"v","h":"w"}', '{"h":"v\\u0000"}',
                         '{"\\u00e9":"\\u00e9"}'],
                        ['{"$h":"v"}', '{"h":1}', '{"h\\u0000":"v"}', "[]"]),
        "schema_version": pick(["1", "2", "2147483647", "null"],
                               ["0", "-1", "2147483648", "1.0", "true", '"2"']),
        "extra": json_texts(2),
    }
    names = sorted(optional)
    for name in draw(st.lists(st.sampled_from(names), max_size=4, unique=True)):
        if name == "extra" and draw(st.integers(0, 3)):
            continue  # an unknown field: seldom
        fields.append((name, draw(optional[name])))
    if draw(st.integers(0, 5)) == 0:  # a field broken
        i = draw(st.integers(0, len(fields) - 1))
        fields[i] = (fields[i][0], draw(json_texts(1)))
    if draw(st.integers(0, 5)) == 0:  # a duplicate key, the second value wins
        name, _ = draw(st.sampled_from(fields))
        fields.insert(draw(st.integers(0, len(fields))), (name, draw(json_texts(1))))
    order = draw(st.permutations(fields))
    ws = draw(pick(WS[:2], WS[2:]))
    text = "{" + ("," + ws).join(f'"{k}"{ws}:{ws}{v}' for k, v in order) + "}"
    edge = draw(pick([""], ["\ufeff", " ", "\n", "x"]))
    return draw(st.sampled_from([text, edge + text, text + edge]))


@PROPERTY
@given(lines=st.lists(envelope_texts(), min_size=1, max_size=6),
       limit=st.sampled_from(LIMITS))
def test_native_messages_are_the_definitions_on_edge_texts(prove: Any, lines: list[str],
                                                            limit: int) -> None:
    check(prove, lines, limit)


@PROPERTY
@given(envs=st.lists(envelopes(), min_size=1, max_size=6), ascii_only=st.booleans(),
       limit=st.sampled_from(LIMITS))
def test_native_messages_are_the_definitions_on_hostile_envelopes(
        prove: Any, envs: list[dict[str, Any]], ascii_only: bool, limit: int) -> None:
    check(prove, [json.dumps(e, ensure_ascii=ascii_only) for e in envs], limit)


@pytest.mark.parametrize("value", NUMBERS + STRINGS + ["true", "false", "null", "{}", "[]"])
@pytest.mark.parametrize("key", KEYS)
def test_each_edge_value_and_key_in_the_payload(prove: Any, key: str, value: str) -> None:
    lines = [f'{{{BASE},"payload":{{{key}:{value}}}}}',
             f'{{{BASE},"payload":{{"a":1,{key}:[{value}],{key}:{value},"z":{{{key}:{value}}}}}}}']
    check(prove, lines, 0)


def test_the_common_envelope_is_proven_natively(prove: Any) -> None:
    """Everything of the common envelope is proven here, not left to Python."""
    lines = [f'{{{BASE},"payload":{{"n":{n},"s":"v","f":1.5,"b":true,"z":null,'
             f'"l":[1,{{"k":[]}}]}},"occurred_at":{at}}}'
             for n in ("0", "-9223372036854775808", "9223372036854775807", "1e308", "-0.0")
             for at in ('"2026-01-01T00:00:12Z"', '"2024-02-29T23:59:59.999999Z"', "null")]
    lines += [
        json.dumps({"message_id": "é" * 512, "type": "T\u00e9", "aggregate_type": "😀",
                    "aggregate_id": "a b", "payload": {"ü": "ü", "": "\u2028"}},
                   ensure_ascii=asc) for asc in (True, False)]
    lines += [f'{{ {BASE} ,\n"payload" : {{ }} ,\t"source":{{"type":"F","id":"f","seq":3}},'
              '"correlation_id":"c","causation_id":null,"headers":{"h":"v","g":"\\u0000"},'
              '"schema_version":2147483647}',
              f'{{{BASE},"payload":{{"k":1,"k":2}},"message_id":"m2","occurred_at":null,'
              '"headers":null,"schema_version":null,"source":null}',
              f'{{{BASE},"payload":' + '{"d":[' * 30 + "1" + "]}" * 30 + "}"]
    for limit in LIMITS:
        got = check(prove, lines, limit)
        fits = [limit == 0 or len(x) * 16 <= limit for x in lines]
        assert got == fits


def test_what_is_left_to_python(prove: Any) -> None:
    deep = '{"d":' * 62 + "1" + "}" * 62  # the payload walk stops at 60 levels under it
    lines = [f'{{{BASE},"payload":{deep}}}', f'{{{BASE},"payload":{{"n":9223372036854775808}}}}',
             f'{{{BASE},"payload":{{"f":1e400}}}}', f'{{{BASE},"payload":{{"s":"\\ud800"}}}}',
             f'{{{BASE},"payload":{{"$k":1}}}}', f'{{{BASE},"payload":{{"a.b":1}}}}',
             f'{{{BASE},"payload":{{"f":NaN}}}}', f'\ufeff{{{BASE},"payload":{{}}}}',
             f' {{{BASE},"payload":{{}}}}', f'{{{BASE},"payload":{{}}}} ',
             f'{{{BASE},"payload":{{}},"extra":1}}', f'{{{BASE},"payload":[]}}',
             f'{{{BASE},"payload":{{}},"occurred_at":"2026-01-01T00:00:12+00:00"}}',
             f'{{{BASE},"payload":{{}},"occurred_at":1767225600123}}',
             f'{{{BASE},"payload":{{}},"source":{{"type":"F","id":"f","seq":1,"x":2}}}}',
             '{"message_id":" m","type":"T","aggregate_type":"A","aggregate_id":"a",'
             '"payload":{}}', '{"message_id":"m\\u0000","type":"T","aggregate_type":"A",'
             '"aggregate_id":"a","payload":{}}', '{"message_id":"' + "é" * 513 + '","type":"T",'
             '"aggregate_type":"A","aggregate_id":"a","payload":{}}',
             f'{{{BASE},"payload":{{}},"headers":{{"h":"v","$h":"w"}}}}',
             f'{{{BASE},"payload":{{}},"schema_version":1.0}}', '[]', '{}', "", "x"]
    assert check(prove, lines, 0) == [False] * len(lines)


def test_a_column_with_nulls_bad_bytes_skips_and_long_lines(prove: Any) -> None:
    good = f'{{{BASE},"payload":{{"k":"v"}}}}'
    long = f'{{{BASE},"payload":{{"k":"{"v" * 200}"}}}}'
    rows: list[bytes | None] = [good.encode(), None, b'{"bad":"\xff"}', good.encode(),
                                b"not json", good.encode() + b"\xed\xa0\x80",
                                ("é" * 40 + good).encode(), long.encode(), b""]
    skip = [False, False, False, True, False, False, False, False, False]
    data = b"".join(r or b"" for r in rows)
    ends = array("i", [0])
    for r in rows:
        ends.append(ends[-1] + len(r or b""))
    valid = bytes([0b11111101, 0b1])
    limit = 16 * (len(good) + 40)
    proven, texts, bad, left = prove(data, ends, valid, 0, len(rows), False, limit, skip)
    assert [m is not None for m in proven] == [True] + [False] * 8
    assert texts == [None, None, None, good, "not json", None, "é" * 40 + good, long, ""]
    assert bad == [(2, b'{"bad":"\xff"}'), (5, good.encode() + b"\xed\xa0\x80")]
    assert left == [4, 6, 7, 8]  # row 7: longer than the limit allows
    # An offset into the buffers (a sliced array): the same rows, read from row 3 on.
    proven, texts, bad, left = prove(data, ends, valid, 3, 3, False, 0, None)
    assert [m is not None for m in proven] == [True, False, False]
    assert (texts, bad, left) == ([None, "not json", None], [(2, rows[5])], [1])


def test_the_library_uses_the_native_parse_when_the_core_is_in_use() -> None:
    """The probe line passed: with the core importable and ``AGGBOX_PURE`` unset, the
    executor's parse is native; with ``AGGBOX_PURE=1`` it is Python's."""
    assert (fastbatch.NATIVE_PROVE is not None) == ids.NATIVE


def test_ids_with_white_space_around_them_are_left_to_python(prove: Any) -> None:
    """``str.strip()``'s white space (every code point ``isspace``) at either end of an id
    is Python's to refuse; other characters there (zero-width, BOM, NEL's neighbours) are
    proven."""
    spaces = [chr(c) for c in range(0x3001) if chr(c).isspace()]
    others = ["\u200b", "\ufeff", "\u180e", "\x84", "\x86", "\u2027", "\u202a", "\u3001", "é"]
    for ch in spaces + others:
        lines = [json.dumps({"message_id": m, "type": "T", "aggregate_type": "A",
                             "aggregate_id": "a", "payload": {}}, ensure_ascii=asc)
                 for m in (ch + "x", "x" + ch, ch) for asc in (True, False)]
        assert check(prove, lines, 0) == [ch in others] * len(lines), repr(ch)
