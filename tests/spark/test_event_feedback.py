"""Events fed back (issue 32, item 3): the dispatcher publishes an untargeted emit as the
emitter's *event* (``aggbox-kind: event``); read back by ``aggbox run`` or ``aggbox stream``
it is ``duplicate`` with reason ``aggbox_event`` — never handled, never a dead letter —
whatever handlers the receiving aggregate type has, and even when the pipeline has no such
aggregate type (README, docs/concepts.md "The outbox and ordering"). Through the CLI, on the
dispatcher's own output: JSON Lines (aggbox and CloudEvents formats) and Kafka."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from aggbox.cli import main
from aggbox.servers import LocalKafka, create_topic

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

DOMAIN = "tests.spark.eventdomain"
#: A module without the ``Wallet`` type: the events' aggregate type is unknown there.
OTHER = "tests.spark.bank"
WALLETS = ["w/1", "w.2", "w$3"]


def _deposits(directory: Path, start: int, n: int) -> Path:
    directory.mkdir()
    lines = [json.dumps({"message_id": f"dep-{i}", "type": "Deposit", "aggregate_type": "Wallet",
                         "aggregate_id": WALLETS[i % len(WALLETS)], "payload": {"amount": i}})
             for i in range(start, start + n)]
    (directory / "in.jsonl").write_text("\n".join(lines) + "\n")
    return directory / "in.jsonl"


def _common(db: Any, uri: str, aggregates: str = DOMAIN) -> list[str]:
    return ["--aggregates", aggregates, "--mongodb-uri", uri, "--database", db.name]


def _summary(rc: int, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out = capsys.readouterr().out
    assert rc == 0, out
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


def _run(db: Any, uri: str, inputs: list[str], capsys: pytest.CaptureFixture[str],
         aggregates: str = DOMAIN) -> dict[str, Any]:
    return _summary(main(["run", "--input", *inputs, *_common(db, uri, aggregates),
                          "--no-progress", "--json"]), capsys)


def _dispatch(db: Any, uri: str, *args: str) -> None:
    assert main(["dispatch", "--once", "--collection", "event_wallets", *args,
                 *_common(db, uri), "--metrics-port", "0"]) == 0


def _assert_all_events(summary: dict[str, Any], n: int, db: Any) -> None:
    assert summary["input"] == n and summary["total"] == n
    assert summary["duplicate"] == n, summary
    assert summary["applied"] == summary["dead_lettered"] == summary.get("parked", 0) == 0
    assert summary["reasons"] == {"duplicate/aggbox_event": n}, summary["reasons"]
    assert db.aggbox_dead_letters.count_documents({}) == 0


def _states(db: Any) -> dict[str, Any]:
    return {d["_id"]: d["state"] for d in db.event_wallets.find()}


def test_events_in_json_lines_are_duplicates_whatever_the_handlers(
        spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    first = _run(db, mongo_uri, [str(_deposits(tmp_path / "in0", 0, 6))], capsys)
    assert first["applied"] == 6
    out1 = tmp_path / "out1"
    _dispatch(db, mongo_uri, "--publisher", "jsonl", "--jsonl-dir", str(out1))
    second = _run(db, mongo_uri, [str(_deposits(tmp_path / "in1", 6, 3))], capsys)
    assert second["applied"] == 3
    out2 = tmp_path / "out2"  # the same kind of records as CloudEvents (structured mode)
    _dispatch(db, mongo_uri, "--publisher", "jsonl", "--jsonl-dir", str(out2),
              "--record-format", "cloudevents")
    records = [json.loads(line) for d in (out1, out2) for f in sorted(d.glob("*.jsonl"))
               for line in f.read_text().splitlines()]
    assert len(records) == 2 * 9
    aggbox = [r for r in records if "specversion" not in r]
    assert {r["type"] for r in aggbox} == {"Deposited", "Rewarded"}
    assert all(r["headers"]["aggbox-kind"] == "event" for r in aggbox)
    assert all(r["aggboxkind"] == "event" for r in records if "specversion" in r)
    before = _states(db)

    # The receiving type handles Rewarded but has no handler for Deposited.
    fed = _run(db, mongo_uri, [str(out1 / "*.jsonl"), str(out2 / "*.jsonl")], capsys)
    _assert_all_events(fed, len(records), db)
    # A pipeline without the Wallet type at all.
    other = _run(db, mongo_uri, [str(out1 / "*.jsonl"), str(out2 / "*.jsonl")], capsys,
                 aggregates=OTHER)
    _assert_all_events(other, len(records), db)
    assert _states(db) == before  # nothing handled


@pytest.mark.kafka
def test_events_over_kafka_are_duplicates_whatever_the_handlers(
        spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path, kafka_server: LocalKafka,
        capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap = kafka_server.bootstrap_servers
    topic = "events-" + uuid.uuid4().hex[:8]
    create_topic(bootstrap, topic, partitions=2)
    assert _run(db, mongo_uri, [str(_deposits(tmp_path / "in0", 0, 6))], capsys)["applied"] == 6
    _dispatch(db, mongo_uri, "--publisher", "kafka", "--bootstrap-servers", bootstrap,
              "--topic-template", topic)
    before = _states(db)
    for aggregates in (DOMAIN, OTHER):
        rc = main(["stream", "--kafka-bootstrap-servers", bootstrap, "--topic", topic,
                   *_common(db, mongo_uri, aggregates), "--checkpoint",
                   str(tmp_path / f"checkpoint-{aggregates}"), "--no-progress", "--json"])
        _assert_all_events(_summary(rc, capsys), 12, db)
    assert _states(db) == before
