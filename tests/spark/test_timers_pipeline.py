"""Timers end to end through the commands: ``aggbox run`` applies messages that schedule
timers, ``aggbox dispatch --once`` publishes the due ones, and ``aggbox run`` over the
dispatcher's output handles each fired timer as an ordinary input message — once; the
same output again is all duplicates."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from aggbox.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

AGG = "tests.dispatcher.timerdomain"


def _line(mid: str, mtype: str, agg: str, payload: dict[str, Any]) -> str:
    return json.dumps({"message_id": mid, "type": mtype, "aggregate_type": "Order",
                       "aggregate_id": agg, "payload": payload,
                       "occurred_at": datetime.now(UTC).isoformat()})


def _run(db: Any, uri: str, pattern: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    rc = main(["run", "--input", pattern, "--aggregates", AGG, "--mongodb-uri", uri,
               "--database", db.name, "--no-progress", "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


def test_fired_timers_come_back_through_the_pipeline_once(
        spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    due = [f"due/{i}.$" for i in range(6)]
    later = [f"later-{i}" for i in range(3)]
    lines = [_line(f"place-{a}", "Place", a, {"ms": 0}) for a in due]
    lines += [_line(f"place-{a}", "Place", a, {"ms": 3_600_000}) for a in later]
    lines += [_line("confirm-due/0.$", "Confirm", "due/0.$", {})]  # cancelled before due
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(lines) + "\n")
    first = _run(db, mongo_uri, str(tmp_path / "in" / "*.jsonl"), capsys)
    assert first["applied"] == len(lines) and first["dead_lettered"] == 0

    out = tmp_path / "out"
    rc = main(["dispatch", "--once", "--publisher", "jsonl", "--jsonl-dir", str(out),
               "--aggregates", AGG, "--mongodb-uri", mongo_uri, "--database", db.name,
               "--metrics-port", "0"])
    assert rc == 0
    capsys.readouterr()
    fired = [json.loads(x) for f in sorted(out.glob("*.jsonl"))
             for x in f.read_text().splitlines() if x]
    assert sorted(e["aggregate_id"] for e in fired) == sorted(due[1:])
    assert all(e["type"] == "Deadline" and e["causation_id"] == f"place-{e['aggregate_id']}"
               and e["headers"]["aggbox-timer"] == "deadline" for e in fired)

    back = _run(db, mongo_uri, str(out / "*.jsonl"), capsys)
    assert back["applied"] == len(due) - 1 and back["dead_lettered"] == 0
    again = _run(db, mongo_uri, str(out / "*.jsonl"), capsys)
    assert again["applied"] == 0 and again["duplicate"] == len(due) - 1
    states = {d["_id"]: d["state"] for d in db.torders.find({})}
    assert states["due/0.$"] == {"status": "confirmed", "deadlines": 0, "reminded": 0}
    assert all(states[a]["status"] == "expired" and states[a]["deadlines"] == 1
               for a in due[1:])
    assert all(states[a]["status"] == "waiting" for a in later)
    assert all(len(d.get("timers", [])) == (d["_id"] in later) for d in db.torders.find({}))
