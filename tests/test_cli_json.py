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


# -- one JSON object whatever happens (issue 40, item 7) -------------------------------------
#: Every command with --json, failing: MongoDB not reachable (a port nobody listens on), or
#: what else makes it fail first; each must still print exactly one JSON object on stdout.
DEAD_URI = "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=300"
ORDERS = ("--aggregates", "aggbox.examples.orders")
FAILING: dict[str, tuple[list[str], str]] = {
    "run": (["run", "--input", "in.jsonl", *ORDERS, "--no-progress"], "not reachable"),
    "stream": (["stream", "--directory", ".", "--checkpoint", "ck", *ORDERS, "--no-progress"],
               "not reachable"),
    "dispatch-status": (["dispatch-status"], "no collections to dispatch"),
    "check-store": (["check-store"], "not reachable"),
    "deadletters list": (["deadletters", "list"], "not reachable"),
    "deadletters show": (["deadletters", "show", "x"], "not reachable"),
    "deadletters replay": (["deadletters", "replay", *ORDERS],
                           "say which dead letters to replay"),
    "deadletters dismiss": (["deadletters", "dismiss", "--id", "x"], "not reachable"),
    "parked list": (["parked", "list"], "not reachable"),
    "parked release": (["parked", "release", "--aggregate", "Order/1", *ORDERS],
                       "not reachable"),
    "effects list": (["effects", "list"], "not reachable"),
    "timers list": (["timers", "list", *ORDERS], "not reachable"),
    "migrate partitions": (["migrate", "partitions", *ORDERS], "not reachable"),
    "show": (["show", "Order", "1", *ORDERS], "not reachable"),
    "outcomes": (["outcomes", "no-such-audit-log"], "cannot read the audit log"),
    # not failing, but a status other than 0: its own object stays the only one
    "local status": (["local", "status"], ""),
}


def _json_commands() -> set[str]:
    """The commands whose parser has --json, read from the command line itself."""
    import argparse

    from aggbox.cli import build_parser

    found: set[str] = set()

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*words, name])
            elif "--json" in action.option_strings:
                found.add(" ".join(words))

    walk(build_parser(), [])
    return found


def test_every_json_command_is_checked() -> None:
    assert _json_commands() == set(FAILING)


@pytest.fixture(scope="module")
def failed_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each command of FAILING run once with --json, all at once (each waits for a server
    that is not there)."""
    import os
    import subprocess
    import sys

    work = tmp_path_factory.mktemp("json")
    (work / "in.jsonl").write_text("{}\n")
    env = {**os.environ, "AGGBOX_MONGODB_URI": DEAD_URI, "AGGBOX_HOME": str(work / "home"),
           "AGGBOX_LOG_FILE": str(work / "aggbox.log")}
    env.pop("AGGBOX_CONFIG", None)
    procs = {name: subprocess.Popen([sys.executable, "-m", "aggbox.cli", *argv, "--json"],
                                    cwd=work, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, (argv, _) in FAILING.items()}
    return {name: (p.wait(), *p.communicate()) for name, p in procs.items()}


@pytest.mark.parametrize("command", sorted(FAILING))
def test_a_failing_json_command_prints_one_object(command: str,
                                                  failed_runs: dict[str, Any]) -> None:
    rc, out, err = failed_runs[command]
    said = FAILING[command][1]
    assert rc != 0, err
    obj = json.loads(out)  # the whole of stdout is one JSON object
    assert isinstance(obj, dict), out
    if not said:  # local status: its own object
        assert obj == {"running": False} and rc == 3
        return
    assert obj["exit_status"] == rc and said in obj["error"], out
    # the same line as on stderr, without its prefix
    assert f"aggbox {command.split()[0]}: error: {obj['error']}" in err, err


def test_a_usage_error_with_json_is_one_object(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["show", "--json"])  # the aggregate is missing: argparse's usage error
    out, err = capsys.readouterr()
    assert rc == 2
    obj = json.loads(out)
    assert obj["exit_status"] == 2
    assert obj["error"] == "the following arguments are required: TYPE, ID"
    assert "usage: aggbox show" in err
