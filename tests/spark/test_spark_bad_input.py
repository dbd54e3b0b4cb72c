"""Bad input files: every bad record becomes a dead letter with a reason code (the detail
names the field), valid records still apply, nothing crashes and the counts add up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aggregates import AggregateType, Emit, Message, Registry
from aggregates.core.settings import AggboxSettings
from spark.pipeline import Pipeline
from spark.settings import SparkSettings
from tests.spark.conftest import PipelineFactory
from tests.spark.helpers import assert_matches_oracle, at, make_records, write_jsonl

pytestmark = [pytest.mark.spark, pytest.mark.mongo]


def env(mid: str, **over: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"message_id": mid, "type": "Deposited", "aggregate_type": "Account",
                         "aggregate_id": "acc-bad", "payload": {"amount": 1},
                         "occurred_at": at(1)}
    e.update(over)
    return {k: v for k, v in e.items() if v is not None}


#: message id (or a marker for records without one) → (reason, text the detail contains)
BAD: dict[str, tuple[str, str]] = {
    "wrong-payload": ("invalid_envelope", "'payload': must be a JSON object, got list"),
    "no-type": ("invalid_envelope", "'type': is required"),
    "int-aggregate-id": ("invalid_envelope", "'aggregate_id': must be a string, got int"),
    "blank-aggregate-id": ("invalid_envelope", "'aggregate_id': must be non-empty"),
    "bad-time": ("invalid_envelope", "'occurred_at': not an ISO-8601 time"),
    "bad-seq": ("invalid_envelope", "'source.seq': must be an integer"),
    "extra-field": ("invalid_envelope", "'extra': unknown envelope field"),
    "bad-header": ("invalid_envelope", "'headers'"),
    "dollar-key": ("invalid_envelope", "'payload.$where'"),
    "unknown-atype": ("unknown_aggregate_type", "unknown aggregate type 'Nope'"),
    "unknown-mtype": ("unknown_message_type", "no handler for message type 'Teleported'"),
    "one-mb": ("payload_too_large", "larger than the limit"),
    "three-mb": ("payload_too_large", "payloads are limited to"),
    "broken-handler": ("handler_error", "ValueError: handler bug on broken-handler"),
}
RAW_BAD = {  # records without a usable message id
    '{"message_id": "truncated", "type": "Deposited", "aggregate_ty': "invalid_json",
    "[1, 2, 3]": "invalid_envelope",
    "just text": "invalid_json",
}


def bad_lines() -> list[str]:
    lines = [
        json.dumps(env("wrong-payload", payload=[1, 2])),
        json.dumps(env("no-type", type=None)),
        json.dumps(env("int-aggregate-id", aggregate_id=17)),
        json.dumps(env("blank-aggregate-id", aggregate_id=" ")),
        json.dumps(env("bad-time", occurred_at="yesterday")),
        json.dumps(env("bad-seq", source={"type": "F", "id": "f", "seq": "3"})),
        json.dumps({**env("extra-field"), "extra": 1}),
        json.dumps(env("bad-header", headers={"h": 1})),
        json.dumps(env("dollar-key", payload={"$where": "1"})),
        json.dumps(env("unknown-atype", aggregate_type="Nope")),
        json.dumps(env("unknown-mtype", type="Teleported")),
        json.dumps(env("one-mb", payload={"blob": "x" * (1024 * 1024)})),
        json.dumps(env("three-mb", payload={"blob": "y" * (3 * 1024 * 1024)})),
        json.dumps(env("broken-handler", type="Broken", aggregate_id="acc-broken")),
    ]
    return lines + list(RAW_BAD)


def test_bad_records_become_dead_letters(pipeline: PipelineFactory, db: Any,
                                         tmp_path: Path) -> None:
    good = make_records(seed=11, accounts=8, ledgers=2, dup_rate=0)
    write_jsonl(tmp_path / "a-good.jsonl", good[:20])
    write_jsonl(tmp_path / "b-bad.jsonl", bad_lines())
    write_jsonl(tmp_path / "c-good.jsonl", good[20:])
    (tmp_path / "d-empty.jsonl").write_text("")
    (tmp_path / "e-blank.jsonl").write_text("\n   \n\n")

    result = pipeline().run_batch([str(tmp_path)])

    bad_count = len(BAD) + len(RAW_BAD)
    assert result.input_count == len(good) + bad_count
    assert result.ok
    assert result.counts["applied"] == len(good)
    assert result.counts["dead_lettered"] == bad_count
    rows = {r["message_id"]: r for r in (x.asDict() for x in result.outcomes.collect())}
    for mid, (reason, text) in BAD.items():
        assert rows[mid]["outcome"] == "dead_lettered", mid
        assert rows[mid]["reason"] == reason, (mid, rows[mid]["detail"])
        assert text in rows[mid]["detail"], (mid, rows[mid]["detail"])
    raw_rows = [r for m, r in rows.items() if m.startswith("raw:")]
    assert sorted(r["reason"] for r in raw_rows) == sorted(RAW_BAD.values())
    # The dead-letter collection holds one document per bad record, with the reason.
    letters = list(db.aggbox_dead_letters.find())
    assert len(letters) == bad_count
    by_reason: dict[str, int] = {}
    for d in letters:
        by_reason[d["reason"]] = by_reason.get(d["reason"], 0) + 1
    expected: dict[str, int] = {}
    for reason in [r for r, _ in BAD.values()] + list(RAW_BAD.values()):
        expected[reason] = expected.get(reason, 0) + 1
    assert by_reason == expected
    big = next(d for d in letters if d["message_id"] == "one-mb" or "one-mb" in (d["raw"] or ""))
    assert len(big["raw"]) < 70 * 1024, "raw text of huge records is truncated"
    assert_matches_oracle_without(db, good, "acc-broken", "acc-bad")


def assert_matches_oracle_without(db: Any, good: list[dict[str, Any]], *ids: str) -> None:
    for i in ids:  # aggregates only touched by bad records
        db.accounts.delete_many({"_id": i})
    assert_matches_oracle(db, good)


def test_a_second_run_counts_the_same_dead_letters_again(pipeline: PipelineFactory, db: Any,
                                                         tmp_path: Path) -> None:
    write_jsonl(tmp_path / "bad.jsonl", bad_lines())
    p = pipeline()
    first = p.run_batch([str(tmp_path / "bad.jsonl")])
    second = p.run_batch([str(tmp_path / "bad.jsonl")])

    assert first.counts == second.counts
    assert second.counts["dead_lettered"] == len(BAD) + len(RAW_BAD)
    # Dead letters are idempotent: same documents, attempts counted.
    assert db.aggbox_dead_letters.count_documents({}) == len(BAD) + len(RAW_BAD)
    assert {d["attempts"] for d in db.aggbox_dead_letters.find()} == {2}


# -- hostile input: one record never fails the job --------------------------------------------


def _run_with_good(pipeline: PipelineFactory, tmp_path: Path, bad: list[bytes | str],
                   **settings: Any) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
    """Run good records plus ``bad`` lines; returns the result, the outcome rows of the bad
    lines (those not from the good records) and the good records."""
    good = make_records(seed=5, accounts=4, ledgers=1, dup_rate=0)
    write_jsonl(tmp_path / "a-good.jsonl", good)
    with (tmp_path / "b-bad.jsonl").open("wb") as fh:
        for line in bad:
            fh.write((line.encode() if isinstance(line, str) else line) + b"\n")
    result = pipeline(**settings).run_batch([str(tmp_path)])
    result.raise_for_accounting()
    rows = [r.asDict() for r in result.outcomes.collect()]
    good_ids = {g["message_id"] for g in good}
    assert {r["message_id"]: r["outcome"] for r in rows if r["message_id"] in good_ids} \
        == dict.fromkeys(good_ids, "applied")
    bad_rows = [r for r in rows if r["message_id"] not in good_ids]
    assert result.input_count == len(good) + len(bad)
    assert len(bad_rows) == len(bad)
    return result, bad_rows, good


@pytest.mark.parametrize("value", [1772355600000000000, 1e20, 1e300, 2**70, -1e20,
                                   253402300800000])
def test_numeric_occurred_at_outside_the_millisecond_range(
        pipeline: PipelineFactory, db: Any, tmp_path: Path, value: Any) -> None:
    line = json.dumps(env("far-time", occurred_at=value))
    _, rows, _ = _run_with_good(pipeline, tmp_path, [line])
    assert rows[0]["outcome"] == "dead_lettered"
    assert rows[0]["reason"] == "invalid_envelope", rows[0]["detail"]
    assert "'occurred_at'" in rows[0]["detail"] and "253402300799999" in rows[0]["detail"]
    assert db.aggbox_dead_letters.count_documents({"reason": "invalid_envelope"}) == 1


def test_invalid_utf8_bytes_are_dead_letters(pipeline: PipelineFactory, db: Any,
                                             tmp_path: Path) -> None:
    valid = json.dumps(env("utf8-in-string", aggregate_id="acc-utf8")).encode()
    bad = [
        valid.replace(b"acc-utf8", b"acc-\xff-utf8"),        # inside a string of valid JSON
        valid.replace(b'"utf8-in-string"', b'"ok\xc3"'),    # truncated sequence in the id
        b"\xfe\xff\x00garbage \x80\x81",                       # not JSON at all
        b"\xed\xa0\x80",                                       # an encoded surrogate
    ]
    _, rows, _ = _run_with_good(pipeline, tmp_path, bad)
    assert [r["reason"] for r in rows] == ["invalid_encoding"] * len(bad)
    assert all("byte offset" in r["detail"] for r in rows), [r["detail"] for r in rows]
    offsets = {r["detail"].split("byte offset ")[1].split(" ")[0] for r in rows}
    assert str(valid.index(b"acc-utf8") + 4) in offsets
    letters = list(db.aggbox_dead_letters.find())
    assert len(letters) == len(bad) and {d["reason"] for d in letters} == {"invalid_encoding"}
    assert any("\\xff" in d["raw"] for d in letters)


SURROGATE_FIELDS = {
    "aggregate_id": lambda e: e.update(aggregate_id="acc-\ud800"),
    "message_id": lambda e: e.update(message_id="mid-\udfff"),
    "type": lambda e: e.update(type="Deposited\ud83d"),
    "aggregate_type": lambda e: e.update(aggregate_type="Account\ud800"),
    "source.id": lambda e: e.update(source={"type": "Feed", "id": "f\ud800", "seq": 1}),
    "source.type": lambda e: e.update(source={"type": "F\udc00", "id": "f", "seq": 1}),
    "correlation_id": lambda e: e.update(correlation_id="\ud800"),
    "causation_id": lambda e: e.update(causation_id="c\ud800c"),
    "headers": lambda e: e.update(headers={"h": "\ud800"}),
    "payload": lambda e: e.update(payload={"amount": 1, "note": "\ud800"}),
}


def test_lone_surrogates_in_any_string_field(pipeline: PipelineFactory, db: Any,
                                             tmp_path: Path) -> None:
    lines = []
    for i, change in enumerate(SURROGATE_FIELDS.values()):
        e = env(f"surrogate-{i}", aggregate_id=f"acc-s{i}")
        change(e)
        lines.append(json.dumps(e))  # ensure_ascii: the surrogate is a \ud800 escape
    _, rows, _ = _run_with_good(pipeline, tmp_path, lines)
    by_field = {}
    for r in rows:
        assert r["outcome"] == "dead_lettered" and r["reason"] == "invalid_envelope", r
        by_field[r["detail"].split("field '")[1].split("'")[0]] = r["detail"]
    assert set(by_field) >= set(SURROGATE_FIELDS) - {"headers", "payload"}
    assert any(f.startswith("headers") for f in by_field)
    assert any(f.startswith("payload") for f in by_field)
    assert db.aggbox_dead_letters.count_documents({}) == len(lines)


def test_deeply_nested_records_are_dead_letters(pipeline: PipelineFactory, db: Any,
                                                tmp_path: Path) -> None:
    def nest(n: int) -> str:  # as text: json.dumps itself recurses
        return "[" * n + "1" + "]" * n

    def with_field(mid: str, name: str, value: str) -> str:
        return json.dumps(env(mid, **{name: "VALUE"})).replace('"VALUE"', value)

    lines = [with_field(f"deep-{n}", "payload", f'{{"a": {nest(n)}}}') for n in (100, 990, 2000)]
    lines += [
        with_field("deep-source", "source", nest(500)),
        with_field("deep-headers", "headers", f'{{"h": {nest(300)}}}'),
        with_field("deep-object", "payload", '{"a": ' * 1000 + "1" + "}" * 1000),
        '{"message_id": "deep-truncated", "payload": ' + "[" * 5000,
        "[" * 3000 + "]" * 3000,
        json.dumps(env("deep-in-string", payload={"amount": 1, "s": "[{" * 900})),  # applies
    ]
    _, rows, _ = _run_with_good(pipeline, tmp_path, lines)
    by_id = {r["message_id"]: r for r in rows}
    assert by_id.pop("deep-in-string")["outcome"] == "applied"
    assert [r["reason"] for r in by_id.values()] == ["payload_too_deep"] * (len(lines) - 1)
    assert all("levels deep; at most 66" in r["detail"] for r in by_id.values())
    assert db.aggbox_dead_letters.count_documents({"reason": "payload_too_deep"}) \
        == len(lines) - 1


def test_a_twenty_megabyte_record_is_payload_too_large(pipeline: PipelineFactory,
                                                       tmp_path: Path) -> None:
    line = json.dumps(env("twenty-mb", payload={"blob": "z" * (20 * 1024 * 1024)}))
    _, rows, _ = _run_with_good(pipeline, tmp_path, [line])
    assert rows[0]["reason"] == "payload_too_large", rows[0]["detail"]
    assert "payloads are limited to" in rows[0]["detail"]


def test_a_byte_order_mark_at_the_start_of_any_line_is_ignored(
        pipeline: PipelineFactory, db: Any, tmp_path: Path) -> None:
    bom = "\ufeff"
    lines = [bom + json.dumps(env(f"bom-{i}", aggregate_id="acc-bom")) for i in range(3)]
    lines.insert(1, json.dumps(env("no-bom", aggregate_id="acc-bom")))
    lines.append(bom)  # a line holding only a BOM is blank: not a record
    path = tmp_path / "bom.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = pipeline().run_batch([str(path)])
    assert result.input_count == 4
    assert result.counts["applied"] == 4, outcome_rows_of(result)


def outcome_rows_of(result: Any) -> list[dict[str, Any]]:
    return [r.asDict() for r in result.outcomes.collect()]


# -- handler output that can never be stored: dead-lettered at the handler's step ------------
# This module doubles as the aggregates module of these tests (executors import it by name).

emitters: AggregateType[dict[str, Any]] = AggregateType("Emitter", state=dict,
                                                        collection="emitters", max_outbox=5)
registry = Registry([emitters])
_BAD_EMIT: dict[str, Any] = {
    "to-one": {"to": ("Bad",)},
    "headers-str": {"headers": "abc"},
    "headers-int": {"headers": {"h": 1}},
}


@emitters.handles("Emit")
def _emit(state: dict[str, Any], msg: Message) -> Any:
    p = msg.payload
    new = {**state, "n": state.get("n", 0) + 1}
    if "blob" in p:
        new["blob"] = "x" * int(p["blob"])
    if "bad" in p:
        return new, [Emit("E", {}, **_BAD_EMIT[p["bad"]])]
    return new, [Emit("E", {"i": i}) for i in range(int(p.get("count", 0)))]


def _emitter_pipeline(spark_session: Any, db: Any, mongo_uri: str) -> Pipeline:
    settings = AggboxSettings.load(mongodb_uri=mongo_uri, database=db.name,
                                   max_document_bytes=64 * 1024)
    return Pipeline(spark_session, aggregates="tests.spark.test_spark_bad_input",
                    settings=settings, spark_settings=SparkSettings.load(shuffle_partitions=3),
                    mongodb_uri=mongo_uri)


def _emitter_run(spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path,
                 payloads: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    lines = [{"message_id": mid, "type": "Emit", "aggregate_type": "Emitter",
              "aggregate_id": "e1", "payload": p, "occurred_at": at(i)}
             for i, (mid, p) in enumerate(payloads.items())]
    write_jsonl(tmp_path / "emits.jsonl", lines)
    result = _emitter_pipeline(spark_session, db, mongo_uri).run_batch([str(tmp_path)])
    result.raise_for_accounting()
    assert result.input_count == len(lines)
    return {r["message_id"]: r for r in (x.asDict() for x in result.outcomes.collect())}


def test_a_malformed_emit_is_an_invalid_emit_dead_letter(spark_session: Any, db: Any,
                                                         mongo_uri: str, tmp_path: Path) -> None:
    payloads: dict[str, dict[str, Any]] = {"first": {"count": 1}}
    payloads.update({f"bad-{k}": {"bad": k} for k in _BAD_EMIT})
    payloads["last"] = {"count": 1}
    rows = _emitter_run(spark_session, db, mongo_uri, tmp_path, payloads)
    assert rows["first"]["outcome"] == rows["last"]["outcome"] == "applied"
    for k in _BAD_EMIT:
        assert (rows[f"bad-{k}"]["outcome"], rows[f"bad-{k}"]["reason"]) \
            == ("dead_lettered", "invalid_emit"), rows[f"bad-{k}"]
    doc = db.emitters.find_one({"_id": "e1"})
    assert doc["state"]["n"] == 2 and len(doc["outbox"]) == 2
    assert db.aggbox_dead_letters.count_documents({"reason": "invalid_emit"}) == len(_BAD_EMIT)


def test_steps_that_can_never_fit_are_dead_letters_not_parked(
        spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path) -> None:
    rows = _emitter_run(spark_session, db, mongo_uri, tmp_path, {
        "first": {"count": 1},
        "too-many": {"count": 6},
        "huge-state": {"blob": 70 * 1024},
        "last": {"count": 1},
    })
    assert rows["first"]["outcome"] == rows["last"]["outcome"] == "applied"
    assert (rows["too-many"]["outcome"], rows["too-many"]["reason"]) \
        == ("dead_lettered", "emits_exceed_outbox_limit")
    assert (rows["huge-state"]["outcome"], rows["huge-state"]["reason"]) \
        == ("dead_lettered", "state_too_large")
    assert all("never" in rows[m]["detail"] for m in ("too-many", "huge-state"))
    assert db.aggbox_parked.count_documents({}) == 0


#: Where the fuzz corpus puts its numbers (tests/spark/test_spark_fuzz.py, case 8) and more:
#: field the detail names → the record's text around the number ``@N@``.
_NUMBER_PLACES = {
    "payload.extra": '"payload": {"amount": 1, "extra": @N@}',
    "payload.items[1].v": '"payload": {"amount": 1, "items": [1, {"v": @N@}]}',
    "occurred_at": '"payload": {"amount": 1}, "occurred_at": @N@',
    "source.seq": '"payload": {"amount": 1}, "source": {"type": "F", "id": "f", "seq": @N@}',
}


def test_nan_and_infinity_anywhere_are_invalid_json_naming_the_field(
        pipeline: PipelineFactory, db: Any, tmp_path: Path) -> None:
    from tests.spark.test_spark_fuzz import RAW_NUMBERS

    constants = [n for n in RAW_NUMBERS if n.lstrip("-") in ("NaN", "Infinity")]
    assert constants == ["NaN", "Infinity", "-Infinity"]
    lines: list[str] = []
    expected: dict[str, str] = {}  # message id → what the detail says
    for i, (field, place) in enumerate(_NUMBER_PLACES.items()):
        for j, const in enumerate(constants):
            mid = f"num-{i}-{j}"
            lines.append(f'{{"message_id": "{mid}", "type": "Deposited", "aggregate_type": '
                         f'"Account", "aggregate_id": "acc-num", {place.replace("@N@", const)}}}')
            expected[mid] = f"{field}: {const} is not JSON"
    # A number beyond a double's range reads as infinity in Python: refused the same way.
    lines.append('{"message_id": "num-big", "type": "Deposited", "aggregate_type": "Account", '
                 '"aggregate_id": "acc-num", "payload": {"amount": 1e400}}')
    expected["num-big"] = "'payload.amount': Infinity (or a number beyond 1.8e308) is not JSON"

    result, rows, good = _run_with_good(pipeline, tmp_path, lines)

    assert result.input_count == len(good) + len(lines) == result.total
    assert result.counts["applied"] == len(good)
    assert result.counts["dead_lettered"] == len(lines)
    by_id = {r["message_id"]: r for r in rows}
    assert set(by_id) == set(expected)  # the record's own id, though it did not parse
    for mid, text in expected.items():
        row = by_id[mid]
        assert (row["outcome"], row["reason"]) == ("dead_lettered", "invalid_json"), row
        assert text in row["detail"], (mid, row["detail"])
    letters = list(db.aggbox_dead_letters.find({"reason": "invalid_json"}))
    assert sorted(d["message_id"] for d in letters) == sorted(expected)
    assert db.accounts.count_documents({"_id": "acc-num"}) == 0
