"""Bad input files: every bad record becomes a dead letter with a reason code (the detail
names the field), valid records still apply, nothing crashes and the counts add up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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
