"""The batch pipeline end to end on real Spark (local[2, 4]) and the local MongoDB server:
files → pipeline → documents equal to an independent oracle fold; outcomes add up; faults
(task retries, re-runs, concurrent pipelines) change nothing."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from spark.pipeline import RunResult
from tests.spark.conftest import PipelineFactory
from tests.spark.helpers import (
    assert_matches_oracle,
    make_records,
    oracle,
    outcome_rows,
    write_jsonl,
    write_parquet,
)

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

# Small chunks and slices so one run exercises chunking, slicing and Arrow-batch carry-over.
SMALL = {"chunk_aggregates": 16, "chunk_messages": 64, "slice_messages": 4}


def unique_count(records: list[dict[str, Any]]) -> int:
    return len({r["message_id"] for r in records})


def test_files_to_documents_equal_the_oracle(pipeline: PipelineFactory, db: Any,
                                             tmp_path: Path) -> None:
    records = make_records(seed=1, accounts=60, per_account=7, ledgers=12, per_ledger=9)
    third = len(records) // 3
    write_jsonl(tmp_path / "a.jsonl", records[:third])
    write_jsonl(tmp_path / "b.jsonl", records[third:2 * third])
    write_parquet(tmp_path / "c.parquet", records[2 * third:])

    result = pipeline(**SMALL).run_batch([str(tmp_path / "*.jsonl"), str(tmp_path / "c.parquet")])

    assert_matches_oracle(db, records)
    unique = unique_count(records)
    assert result.input_count == len(records)
    assert result.counts["applied"] == unique
    assert result.counts["duplicate"] == len(records) - unique
    assert result.counts["dead_lettered"] == result.counts["parked"] == 0
    assert result.ok and result.total == len(records)
    # One outcome row per input record; applied rows carry the emitted ids of the oracle.
    rows = outcome_rows(result)
    assert len(rows) == len(records)
    expected = oracle(records)
    emitted = {r["message_id"]: r["emitted_ids"] for r in rows if r["outcome"] == "applied"}
    assert sorted(i for ids in emitted.values() for i in ids) == sorted(
        i for e in expected.values() for i in e.outbox)
    assert {r["message_id"] for r in rows} == {r["message_id"] for r in records}


def test_outcomes_are_written_as_parquet(pipeline: PipelineFactory, spark_session: Any,
                                         tmp_path: Path) -> None:
    records = make_records(seed=2, accounts=10, ledgers=2)
    write_jsonl(tmp_path / "in.jsonl", records)
    audit = tmp_path / "outcomes"

    result = pipeline().run_batch([str(tmp_path / "in.jsonl")], outcomes_path=str(audit),
                                  run_id="r1")

    assert result.outcomes_path == f"{audit}/run_id=r1"
    back = spark_session.read.parquet(str(audit))  # the audit log, as a notebook reads it
    assert back.count() == len(records)
    assert set(back.columns) >= {"message_id", "aggregate_type", "aggregate_id", "outcome",
                                 "reason", "emitted_ids", "attempt", "run_id"}
    assert back.where("run_id = 'r1' AND outcome = 'applied'").count() == result.counts["applied"]


def test_running_the_same_input_twice_changes_nothing(pipeline: PipelineFactory, db: Any,
                                                       tmp_path: Path) -> None:
    records = make_records(seed=3, accounts=30, ledgers=5)
    write_jsonl(tmp_path / "in.jsonl", records)
    p = pipeline(**SMALL)

    first = p.run_batch([str(tmp_path / "in.jsonl")])
    versions = {d["_id"]: d["_v"] for d in db.accounts.find()}
    second = p.run_batch([str(tmp_path / "in.jsonl")])

    assert first.counts["applied"] == unique_count(records)
    assert second.counts["applied"] == 0
    assert second.counts["duplicate"] == len(records) and second.ok
    assert {d["_id"]: d["_v"] for d in db.accounts.find()} == versions
    assert_matches_oracle(db, records)


def test_failed_tasks_are_retried_without_effect(pipeline: PipelineFactory, db: Any,
                                                  tmp_path: Path) -> None:
    # "Flaky" handlers raise RetryableError on the first attempt of their Spark task: the
    # task fails after writing part of its partition; Spark runs it again.
    records = make_records(seed=4, accounts=40, per_account=6, ledgers=6, flaky=6)
    write_jsonl(tmp_path / "in.jsonl", records)

    result = pipeline(**SMALL).run_batch([str(tmp_path / "in.jsonl")])

    rows = outcome_rows(result)
    assert {r["task_attempt"] for r in rows} >= {1}, "no task was retried"
    flaky = [r for r in rows if "-flaky" in r["message_id"]]
    assert all(r["task_attempt"] >= 1 for r in flaky)
    applied = sorted(r["message_id"] for r in flaky if r["outcome"] == "applied")
    assert applied == sorted({r["message_id"] for r in records if "-flaky" in r["message_id"]})
    assert len(applied) == 6
    assert result.ok and result.input_count == len(records)
    # Each message applied once, and counted so: what a failed attempt wrote is `applied`
    # (reason earlier_attempt) for the retry, not `duplicate` (docs/design.md "Counts that
    # survive retries").
    assert result.counts["applied"] == unique_count(records)
    assert result.counts["duplicate"] == len(records) - unique_count(records)
    earlier = [r for r in rows if r["reason"] == "earlier_attempt"]
    assert earlier and {r["outcome"] for r in earlier} == {"applied"}
    assert all(r["task_attempt"] >= 1 and "(TID " in r["detail"] for r in earlier)
    assert_matches_oracle(db, records)


def test_two_pipelines_on_overlapping_aggregates_at_once(
        pipeline: PipelineFactory, spark_session: Any, db: Any, tmp_path: Path) -> None:
    only_a = make_records(seed=5, accounts=25, ledgers=4, prefix="a-")
    shared = make_records(seed=6, accounts=40, ledgers=6, prefix="s-")
    only_b = make_records(seed=7, accounts=25, ledgers=4, prefix="b-")
    fa = write_jsonl(tmp_path / "1.jsonl", only_a)
    fs = write_jsonl(tmp_path / "2.jsonl", shared)
    fb = write_jsonl(tmp_path / "3.jsonl", only_b)
    results: dict[str, RunResult] = {}
    errors: list[BaseException] = []

    def run(name: str, inputs: list[Path]) -> None:
        try:
            spark_session.sparkContext.setLocalProperty("spark.scheduler.pool", name)
            results[name] = pipeline(**SMALL).run_batch([str(p) for p in inputs])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=("A", [fa, fs])),
               threading.Thread(target=run, args=("B", [fs, fb]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert not errors, errors
    assert_matches_oracle(db, only_a + shared + only_b)
    a, b = results["A"], results["B"]
    assert a.ok and b.ok
    assert a.counts["parked"] == b.counts["parked"] == 0
    # Every distinct message was applied exactly once, by one pipeline or the other.
    distinct = unique_count(only_a) + unique_count(shared) + unique_count(only_b)
    assert a.counts["applied"] + b.counts["applied"] == distinct
