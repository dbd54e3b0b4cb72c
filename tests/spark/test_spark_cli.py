"""``aggbox run`` / ``aggbox stream`` in-process (they reuse the test session's Spark):
summary table, JSON summary line, exit codes, help for every option."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from aggbox.cli import build_parser, main
from tests.spark.helpers import make_records, write_jsonl
from tests.spark.test_spark_bad_input import BAD, RAW_BAD, bad_lines, env

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

AGG = "tests.spark.domain"


def cli(db: Any, uri: str, *args: str) -> list[str]:
    return [*args, "--aggregates", AGG, "--mongodb-uri", uri, "--database", db.name,
            "--no-progress"]


def last_json(out: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def test_run_prints_a_summary_of_a_bad_input(spark_session: Any, db: Any, mongo_uri: str,
                                             tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    good = make_records(seed=50, accounts=6, ledgers=1, dup_rate=0)
    write_jsonl(tmp_path / "good.jsonl", good)
    write_jsonl(tmp_path / "bad.jsonl", bad_lines())
    (tmp_path / "empty.jsonl").write_text("")

    metrics = tmp_path / "metrics" / "aggbox.prom"
    metrics.parent.mkdir()
    rc = main(["run", *cli(db, mongo_uri, "--input", str(tmp_path / "*.jsonl"), "--json",
                           "--metrics-file", str(metrics), "--allow-dead-letters")])

    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    assert rc == 0  # --allow-dead-letters: ok, whatever was dead-lettered
    # --json: stdout is the JSON line alone (for | jq); the tables go to stderr.
    assert len(out.strip().splitlines()) == 1, out
    summary = last_json(out)
    bad = len(BAD) + len(RAW_BAD)
    assert summary["input"] == len(good) + bad and summary["ok"] is True
    assert summary["problem"] is None
    assert summary["applied"] == len(good) and summary["dead_lettered"] == bad
    assert summary["reasons"]["dead_lettered/invalid_json"] == 2
    # by_type: sums equal the counts; messages parsed carry their type, records that
    # name no type have "".
    by_type = summary["by_type"]
    for kind in ("applied", "duplicate", "dead_lettered", "parked"):
        assert sum(r["count"] for r in by_type if r["outcome"] == kind) == summary[kind], kind
    assert all(r["message_type"] for r in by_type if r["outcome"] == "applied")
    assert any(r["message_type"] == "" for r in by_type if r["reason"] == "invalid_json")
    assert "by aggregate and message type" in err
    # --metrics-file: the Prometheus text format with the same counts.
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(metrics.read_text())}
    samples = families["aggbox_pipeline_outcomes"].samples
    assert sum(s.value for s in samples) == summary["total"]
    assert families["aggbox_pipeline_input_records"].samples[0].value == summary["input"]
    assert list(metrics.parent.iterdir()) == [metrics]  # no temporary file left
    for text in ("dead_lettered", "invalid_envelope", "payload_too_large", "unknown_aggregate_type",
                 "handler_error", "total"):
        assert text in err, text


def test_fail_on_dead_letters_exit_status(spark_session: Any, db: Any, mongo_uri: str,
                                          tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", ["{not json"])
    args = cli(db, mongo_uri, "--input", str(tmp_path / "in.jsonl"))
    assert main(["run", *args]) == 3  # a dead letter: not ok by default
    assert main(["run", *args, "--max-dead-letters", "1"]) == 0
    assert main(["run", *args, "--allow-dead-letters"]) == 0
    assert main(["run", *args, "--fail-on-dead-letters"]) == 3


def test_a_run_where_every_message_failed_is_not_ok(
        spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32: every message dead-lettered → exit status 3 and "ok": false; the summary
    gives per reason the count, the first message id, the error's first line and the
    command that lists them all — and that command works."""
    write_jsonl(tmp_path / "bad.jsonl", [
        env("broken-2", type="Broken", aggregate_id="acc-f1"),
        env("broken-1", type="Broken", aggregate_id="acc-f2"),
        env("misreturns-1", type="Misreturns", aggregate_id="acc-f3")])

    rc = main(["run", *cli(db, mongo_uri, "--input", str(tmp_path / "bad.jsonl"), "--json")])

    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    assert rc == 3
    summary = last_json(out)
    assert summary["ok"] is False and summary["dead_lettered"] == 3 and summary["applied"] == 0
    assert summary["problem"].startswith("3 record(s) dead-lettered")
    rows = {r["reason"]: r for r in summary["by_reason"]}
    assert set(rows) == {"handler_error", "invalid_handler_result"}
    handler, result = rows["handler_error"], rows["invalid_handler_result"]
    assert handler["count"] == 2 and handler["first_message_id"] == "broken-1"
    assert handler["first_error"] == "ValueError: handler bug on broken-1"
    assert result["count"] == 1 and result["first_message_id"] == "misreturns-1"
    assert result["first_error"] and "\n" not in result["first_error"]
    # The text summary (stderr with --json) says the same, nothing cut at 80 columns.
    for row in (handler, result):
        assert f"dead_lettered {row['reason']}: {row['count']}, first " \
               f"{row['first_message_id']}" in err
        assert f"    {row['first_error']}\n" in err
        assert f"    all of them: {row['command']}\n" in err
    assert "invalid_handler_…" not in err and "invalid_handler_result" in err
    # The command is real: it lists exactly this run's dead letters of that reason.
    command = shlex.split(handler["command"])
    assert command[:4] == ["aggbox", "deadletters", "list", "--reason"]
    monkeypatch.setenv("AGGBOX_MONGODB_URI", mongo_uri)
    assert main([*command[1:], "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["total"] == 2
    assert {i["message_id"] for i in listed["items"]} == {"broken-1", "broken-2"}


def test_a_handler_that_cannot_import_fails_the_run_and_dead_letters_nothing(
        spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: a handler importing a module that is not installed is the deployment's
    fault, not the messages': the run fails with one line naming the module and how to ship
    it; nothing is dead-lettered and the documents stay as they were (the input is still
    there for the run after the fix)."""
    from tests.spark.domain import MISSING_MODULE

    write_jsonl(tmp_path / "open.jsonl", [env(f"open-{i}", type="Opened", aggregate_id=f"acc-m{i}",
                                              payload={"owner": "o"}) for i in range(3)])
    assert main(["run", *cli(db, mongo_uri, "--input", str(tmp_path / "open.jsonl"))]) == 0
    before = list(db.accounts.find({}, sort=[("_id", 1)]))
    write_jsonl(tmp_path / "in.jsonl", [env(f"needs-{i}", type="NeedsHelper",
                                            aggregate_id=f"acc-m{i % 3}") for i in range(6)])
    capsys.readouterr()

    rc = main(["run", *cli(db, mongo_uri, "--input", str(tmp_path / "in.jsonl"), "--json")])

    captured = capsys.readouterr()
    assert rc == 1
    # --json: stdout is one object, the error (issue 40, item 7)
    assert json.loads(captured.out)["error"] in captured.err
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("aggbox run: error: the handler of Account for 'NeedsHelper' "
                               f"cannot import module '{MISSING_MODULE}'"), lines[0]
    assert "--py-files" in lines[0] and "pip install" in lines[0]
    assert db.aggbox_dead_letters.count_documents({}) == 0
    assert list(db.accounts.find({}, sort=[("_id", 1)])) == before


def test_a_failing_job_exits_non_zero(spark_session: Any, db: Any, mongo_uri: str,
                                      tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The handler raises RetryableError on every attempt: Spark gives up after 4 attempts.
    write_jsonl(tmp_path / "in.jsonl", [env("down-1", type="Unavailable")])

    rc = main(["run", *cli(db, mongo_uri, "--input", str(tmp_path / "in.jsonl"))])

    err = capsys.readouterr().err
    assert rc == 1
    assert "the Spark job failed" in err and "downstream unavailable for down-1" in err


def test_an_unknown_aggregates_module_is_a_clear_error(
        spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "in.jsonl", [env("m1")])
    args = ["run", "--input", str(tmp_path / "in.jsonl"), "--aggregates", "no.such.module",
            "--mongodb-uri", mongo_uri, "--database", db.name]
    assert main(args) == 1
    assert "cannot import aggregates module 'no.such.module'" in capsys.readouterr().err


def test_stream_a_directory(spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    import spark.metrics_export as export

    inbox = tmp_path / "in"
    inbox.mkdir()
    a = make_records(seed=60, accounts=5, ledgers=1, prefix="x-", dup_rate=0)
    b = make_records(seed=61, accounts=5, ledgers=1, prefix="y-", dup_rate=0)
    write_jsonl(inbox / "1.jsonl", a)
    write_jsonl(inbox / "2.jsonl", b)
    # --metrics-file is rewritten after every micro-batch with the totals so far.
    written: list[str] = []
    real_write = export.write_metrics_file

    def spy(path: Any, text: str) -> None:
        written.append(text)
        real_write(path, text)

    monkeypatch.setattr(export, "write_metrics_file", spy)
    metrics = tmp_path / "aggbox.prom"

    rc = main(["stream", *cli(db, mongo_uri, "--directory", str(inbox), "--checkpoint",
                              str(tmp_path / "ckpt"), "--max-files-per-trigger", "1",
                              "--json", "--metrics-file", str(metrics))])

    captured = capsys.readouterr()
    assert rc == 0
    summary = last_json(captured.out)
    assert summary["batches"] == 2 and summary["input"] == len(a) + len(b)
    assert summary["applied"] == len(a) + len(b)
    assert "micro-batch 0: input" in captured.err and "micro-batch 1: input" in captured.err
    from prometheus_client.parser import text_string_to_metric_families

    def totals(text: str) -> tuple[float, float]:
        families = {f.name: f for f in text_string_to_metric_families(text)}
        return (families["aggbox_pipeline_input_records"].samples[0].value,
                sum(s.value for s in families["aggbox_pipeline_outcomes"].samples))

    first, second = (totals(t) for t in written)
    assert first in ((len(a), len(a)), (len(b), len(b)))  # one file per micro-batch
    assert second == (len(a) + len(b), len(a) + len(b))
    assert metrics.read_text() == written[-1]


def test_stream_exit_status_follows_the_same_rule(spark_session: Any, db: Any, mongo_uri: str,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``aggbox stream``: a dead letter → exit status 3 with the reason listed; a handler
    that cannot import a module → exit status 1, one line, nothing dead-lettered, and the
    micro-batch is not committed: the stream started again reads it again."""
    from tests.spark.domain import MISSING_MODULE

    junk = tmp_path / "junk"
    junk.mkdir()
    write_jsonl(junk / "1.jsonl", ["{not json"])
    args = cli(db, mongo_uri, "--directory", str(junk), "--checkpoint", str(tmp_path / "c1"),
               "--json")
    assert main(["stream", *args]) == 3
    summary = last_json(capsys.readouterr().out)
    assert summary["ok"] is False and summary["by_reason"][0]["reason"] == "invalid_json"

    needs = tmp_path / "needs"
    needs.mkdir()
    write_jsonl(needs / "1.jsonl", [env("needs-s1", type="NeedsHelper", aggregate_id="acc-s")])
    args = cli(db, mongo_uri, "--directory", str(needs), "--checkpoint", str(tmp_path / "c2"))
    for _attempt in range(2):  # the failed micro-batch was not committed: read again
        assert main(["stream", *args]) == 1
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("aggbox stream:")]
        assert len(errors) == 1 and f"cannot import module '{MISSING_MODULE}'" in errors[0], err
    assert db.aggbox_dead_letters.count_documents({"message_id": "needs-s1"}) == 0


def test_stream_without_checkpoint_is_refused(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["stream", "--directory", str(tmp_path), "--aggregates", AGG])
    assert rc == 1
    assert "needs --checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "stream"])
def test_help_explains_every_option(command: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices[command]
    for action in p._actions:
        assert action.help and len(action.help) > 10, action.option_strings
    text = p.format_help()
    assert "exit status" in text and "--aggregates" in text
