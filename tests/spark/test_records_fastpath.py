"""The executor's batch fast path (spark/records.py ``Rows.prove``, built on
aggregates/message/fastbatch.py ``fast_messages``, or on the native parse of the Arrow
column when the native core is in use) changes no outcome: for every row of a batch,
``check_row`` returns exactly what ``check_row_exact`` (the row's own parse and checks)
returns, and what that returns with ``Message.from_dict`` alone deciding — the same
message, or the same reason with the same detail and ids — on valid envelopes, the fuzz
test's hostile lines (invalid UTF-8, lone surrogates, NaN and Infinity, out-of-range
numbers, deep nesting, huge values, ids with ``/ $ .``), Spark's reasons and Kafka trace
headers; and the rows read natively (``Rows.raw`` made lazily, sliced arrays, large
strings) are the rows the Python path reads, outcome for outcome. No Spark, no MongoDB."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregates.core.reasons import Reason
from aggregates.message.envelope import MAX_RECORD_DEPTH, json_depth
from aggregates.message.fastbatch import _SAFE_RECURSION, NATIVE_PROVE
from aggregates.message.fastpath import _plain
from spark import records
from spark.rawtext import RawColumn
from spark.records import Rows, check_row, check_row_exact
from tests.aggregates.test_envelope_fastpath import envelopes
from tests.hypo import examples
from tests.spark.test_spark_fuzz import junk_line

PROPERTY = settings(max_examples=examples(200), deadline=None,
                    suppress_health_check=list(HealthCheck))
LIMITS = [512 * 1024, 0, 300, 4096]
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
GOOD_AT = ["2026-01-01T00:00:12Z", "2026-01-01T00:00:12.345Z", "2026-01-01T00:00:12.345678Z",
           "2026-01-01T00:00:60Z", "2026-13-01T00:00:12Z", "2026-01-01T00:00:12.345678Zx"]


def common(rng: random.Random, n: int) -> str:
    """A well-formed line of the common shape (the bench's), sometimes slightly off."""
    env: dict[str, Any] = {
        "message_id": f"o-{n}", "type": "OrderCreated", "aggregate_type": "Customer",
        "aggregate_id": f"c{n // 5}", "payload": {"order_id": f"o-{n}", "amount": 100 + n},
        "occurred_at": rng.choice(GOOD_AT)}
    if rng.random() < 0.3:
        env[rng.choice(list(env))] = rng.choice(
            [" x", "x ", "", 1, None, "a" * 513, "\u2028", "é", "x\x00", {"$a": 1}, [1],
             {"a.b": 1}, {"n": 2**63}, {"f": 1e308}, {"d": {"e": [1, {"f": None}]}}])
    if rng.random() < 0.3:  # one more payload item, anywhere, maybe a bad one
        items = list(env["payload"].items()) if type(env["payload"]) is dict else []
        items.insert(rng.randrange(len(items) + 1), rng.choice(
            [("$a", 1), ("a.b", 1), ("n", 2**63), ("n", -(2**63) - 1), ("n", -(2**63)),
             ("f", 1e308), ("f", 0.5), ("b", True), ("z", None), ("l", [1, {"$x": 1}]),
             ("d", {"k": [1.5, "s"]}), ("x\x00", 1), ("s", "ü")]))
        env["payload"] = dict(items)
    if rng.random() < 0.2:
        env[rng.choice(["source", "headers", "correlation_id", "schema_version", "extra"])] = (
            rng.choice([{"type": "F", "id": "f", "seq": 1}, {"h": "v"}, "c", 2,
                        {"type": "F", "id": "f", "seq": 1, "x": [[[1]]]}, None]))
    return json.dumps(env, separators=rng.choice([(",", ":"), (", ", ": ")]),
                      ensure_ascii=rng.random() < 0.8)


def batch(lines: Sequence[bytes | str], rng: random.Random, *, spark_reasons: bool,
          trace: bool) -> Any:
    """An Arrow batch as Spark hands it over: ``_raw`` as bytes viewed as text (Arrow does
    not check UTF-8), Spark's ``_reason``/``_detail``, maybe Kafka trace headers."""
    data = [x.encode("utf-8", "surrogatepass") if isinstance(x, str) else x for x in lines]
    n = len(data)
    reasons: list[str | None] = [None] * n
    details: list[str | None] = [None] * n
    if spark_reasons:
        for i in range(n):
            if rng.random() < 0.2:
                reasons[i] = rng.choice([Reason.INVALID_JSON, Reason.UNKNOWN_MESSAGE_TYPE,
                                         Reason.PAYLOAD_TOO_LARGE, Reason.INVALID_ENVELOPE])
                details[i] = "from Spark"
    cols: dict[str, Any] = {"_raw": pa.array(data, pa.binary()).view(pa.string()),
                            "_reason": pa.array(reasons, pa.string()),
                            "_detail": pa.array(details, pa.string())}
    if trace:
        cols["_h_traceparent"] = pa.array(
            [TRACEPARENT if rng.random() < 0.3 else None for _ in range(n)], pa.string())
        cols["_h_tracestate"] = pa.array([None] * n, pa.string())
    return pa.RecordBatch.from_pydict(cols)


def outcome(result: Any) -> str:
    msg, reason, detail, ids = result
    return repr((msg, type(msg.payload) if msg else None,
                 repr(msg.occurred_at.tzinfo) if msg and msg.occurred_at else None,
                 reason, detail, ids))


def strict(rows: Rows, row: int, limit: int) -> Any:
    """``check_row_exact`` with ``Message.from_dict`` alone deciding every envelope (no
    fast path of any kind: the reference)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(records, "fast_message", lambda *_: None)
        return check_row_exact(rows, row, limit)


def python_rows(b: Any) -> Rows:
    """``Rows(b)`` read by the Python path (``to_pydict``), native core or not."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(records, "native_column", lambda _: None)
        return Rows(b)


def variant(b: Any, rng: random.Random) -> Any:
    """The batch as it is, sliced (an offset into the Arrow buffers) or with ``_raw`` as a
    large string: the same rows for the native parse."""
    how = rng.choice(["as is", "sliced", "large"])
    if how == "sliced":  # one row more in front, sliced off: the same rows at offset 1
        return pa.concat_batches([b.slice(0, 1), b]).slice(1)
    if how == "large":
        i = b.schema.get_field_index("_raw")
        return b.set_column(i, "_raw", b.column(i).cast(pa.large_string()))
    return b


def assert_same(lines: Sequence[bytes | str], seed: int) -> int:
    """Every row's outcome equal both ways, for each payload limit; how many rows the fast
    path proved (each such record within the depth limit, as its exact parse checks)."""
    rng = random.Random(seed)
    proven = 0
    for limit in LIMITS:
        b = batch(lines, rng, spark_reasons=rng.random() < 0.5, trace=rng.random() < 0.3)
        b = variant(b, rng)
        fast, exact, python = Rows(b), Rows(b), python_rows(b)
        for i in range(fast.count):
            got = outcome(check_row(fast, i, limit))
            assert got == outcome(check_row_exact(exact, i, limit)) == outcome(
                strict(exact, i, limit)) == outcome(check_row(python, i, limit)), (
                f"row {i} (seed {seed}, limit {limit}): {lines[i]!r:.300}")
        assert fast.bad_encoding == exact.bad_encoding == python.bad_encoding
        assert [fast.raw[i] for i in range(fast.count)] == python.raw
        for i, msg in enumerate(fast.proven):
            if msg is not None:
                proven += 1
                assert json_depth(fast.raw[i]) <= MAX_RECORD_DEPTH
    return proven


@contextmanager
def recursion_limit(limit: int) -> Iterator[None]:
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


@pytest.mark.parametrize("seed", range(6))
def test_fast_and_exact_rows_agree_on_the_fuzz_lines(seed: int) -> None:
    rng = random.Random(seed)
    lines: list[bytes | str] = []
    for n in range(300):
        lines.append(common(rng, n) if rng.random() < 0.5 else junk_line(rng, n))
    assert assert_same(lines, seed) > 0
    # Batches of ASCII lines without escapes, a few at a time: the inline checks of the
    # common envelope run (with and without a dot, '$' or a space anywhere in the batch).
    plain = [x for x in (common(rng, n) for n in range(600)) if _plain(x)]
    for k in range(0, len(plain), 7):
        assert_same(plain[k:k + 7], seed + k)
    if seed == 0:  # above the safe recursion limit, brackets are counted before a scan
        with recursion_limit(_SAFE_RECURSION + 1000):
            assert assert_same(lines, seed) > 0


@PROPERTY
@given(envs=st.lists(envelopes(), min_size=1, max_size=8), seed=st.integers(0, 2**32),
       ascii_only=st.booleans())
def test_fast_and_exact_rows_agree_on_hostile_envelopes(envs: list[dict[str, Any]], seed: int,
                                                        ascii_only: bool) -> None:
    assert_same([json.dumps(e, ensure_ascii=ascii_only) for e in envs], seed)


def test_the_common_lines_take_the_batch_fast_path() -> None:
    rng = random.Random(7)
    lines = [json.dumps({"message_id": f"m{n}", "type": "T", "aggregate_type": "A",
                         "aggregate_id": "a", "payload": {"k": n, "s": "v", "f": 1.5},
                         "occurred_at": rng.choice(GOOD_AT[:3])}) for n in range(50)]
    for b in (batch(lines, rng, spark_reasons=False, trace=False),):
        rows = Rows(b)
        check_row(rows, 0, 512 * 1024)
        assert all(m is not None for m in rows.proven)
        if NATIVE_PROVE is not None:  # read from the Arrow buffers: no str made for a row
            assert isinstance(rows.raw, RawColumn) and rows.raw._texts == [None] * 50
        else:
            assert rows.raw == lines


def test_the_variants_read_the_buffers_at_an_offset_and_as_large_strings() -> None:
    rng = random.Random(3)
    b = batch([common(rng, n) for n in range(20)], rng, spark_reasons=False, trace=False)
    kinds = set()
    for seed in range(40):
        v = variant(b, random.Random(seed))
        raw = v.column("_raw")
        kinds.add((raw.offset, str(raw.type)))
        assert v.to_pydict() == b.to_pydict()
    assert kinds == {(0, "string"), (1, "string"), (0, "large_string")}


def test_deep_lines_end_too_deep_whatever_the_recursion_limit() -> None:
    deep = "[" * 3000 + "]" * 3000
    deep_object = '{"message_id": "m", "payload": ' + '{"k": ' * 70 + "1" + "}" * 71
    for limit in (_SAFE_RECURSION, _SAFE_RECURSION + 10_000):
        with recursion_limit(limit):
            rows = Rows(batch([deep, deep_object], random.Random(0), spark_reasons=False,
                              trace=False))
            for i in range(2):
                msg, reason, _, _ = check_row(rows, i, 0)
                assert (msg, reason) == (None, Reason.PAYLOAD_TOO_DEEP)


def test_empty_and_null_batches_read_as_the_python_path_reads_them() -> None:
    for raw in ([], [None, None], ["", None, '{"message_id": "m"}'], [b"\xff", None]):
        b = batch([], random.Random(0), spark_reasons=False, trace=False) if not raw else None
        if b is None:
            data = [x.encode() if isinstance(x, str) else x for x in raw]
            b = pa.RecordBatch.from_pydict({
                "_raw": pa.array(data, pa.binary()).view(pa.string()),
                "_reason": pa.array([None] * len(raw), pa.string()),
                "_detail": pa.array([None] * len(raw), pa.string())})
        rows, python = Rows(b), python_rows(b)
        got = [outcome(check_row(rows, i, 0)) for i in range(rows.count)]
        assert got == [outcome(check_row(python, i, 0)) for i in range(python.count)]
        assert [rows.raw[i] for i in range(rows.count)] == python.raw
        assert rows.bad_encoding == python.bad_encoding
