"""``--json`` conventions of the command line (issue 24): with ``--json`` stdout holds JSON
only (``| jq`` works), the tables go to stderr."""

from __future__ import annotations

import json
from typing import Any

import pytest

import aggbox.commands.run
from aggbox.cli import main


class _Result:
    run_id = "r-1"
    ok = True
    seconds = 0.25
    outcomes_path = None
    input_count = 2

    def __init__(self) -> None:
        self.counts = {"applied": 1, "dead_lettered": 1}
        self.reasons = {("dead_lettered", "handler_error"): 1}
        self.by_type = {("Order", "PlaceOrder", "applied", ""): 1,
                        ("Order", "PlaceOrder", "dead_lettered", "handler_error"): 1}
        self.samples = {("dead_lettered", "handler_error"): ("m-2", "RuntimeError: boom\nmore")}

    def summary(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "input": self.input_count, **self.counts}


class _Pipeline:
    def run_batch(self, inputs: Any, **options: Any) -> _Result:
        return _Result()


@pytest.mark.parametrize("as_json", [True, False])
def test_run_json_prints_only_json_on_stdout(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str],
                                             as_json: bool) -> None:
    monkeypatch.setattr(aggbox.commands.run._Context, "start", lambda self: None)
    monkeypatch.setattr(aggbox.commands.run._Context, "pipeline", lambda self: _Pipeline())
    argv = ["run", "--input", "in.jsonl", "--aggregates", "aggbox.examples.orders",
            "--no-progress", "--mongodb-uri", "mongodb://127.0.0.1:9/"]
    rc = main([*argv, "--json"] if as_json else argv)
    out, err = capsys.readouterr()
    assert rc == 3  # a dead letter: not ok (docs/operations.md "Exit status")
    if as_json:
        summary = json.loads(out)  # the whole of stdout
        assert summary["applied"] == 1 and summary["reasons"] == {
            "dead_lettered/handler_error": 1}
        assert summary["ok"] is False and "1 record(s) dead-lettered" in summary["problem"]
        [row] = summary["by_reason"]
        assert row["first_message_id"] == "m-2" and row["first_error"] == "RuntimeError: boom"
        assert row["command"].startswith("aggbox deadletters list --reason handler_error")
        assert "aggbox run r-1" in err  # the table went to stderr
        assert "all of them: aggbox deadletters list --reason handler_error" in err
    else:
        assert "aggbox run r-1" in out and "{" not in out
        assert "    RuntimeError: boom\n" in out and "more" not in out
    assert main([*argv, "--allow-dead-letters"]) == 0
    assert main([*argv, "--max-dead-letters", "1"]) == 0
