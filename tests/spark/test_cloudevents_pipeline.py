"""CloudEvents end to end (docs/design.md "CloudEvents"): the dispatcher publishes as
CloudEvents — binary content mode on the real Kafka broker, structured mode in JSON Lines
files — and the pipeline reads them back with the same outcomes as the aggbox format;
malformed CloudEvents are dead letters naming the attribute, one outcome per record."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from aggbox.cli import main
from aggbox.servers import LocalKafka, create_topic
from aggregates.core.settings import AggboxSettings
from aggregates.message.envelope import Message
from aggregates.wire import cloudevents
from spark.pipeline import Pipeline, RunResult
from spark.settings import SparkSettings
from spark.sources import KafkaSource

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

AGG = "tests.spark.bank"
INITIAL = 1000
#: Account ids with '/', '%', '$', '.', spaces and Unicode (they become ce_source segments).
NAMES = ["acct/0.x$", "acct %2F 1", "konto-ü/2", "😀 3", "..", "a+b=4"]
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _round0(tmp_path: Path, transfers: int = 40) -> tuple[Path, list[tuple[str, str, int]]]:
    """Accounts opened, then transfers (each emits a CreditRequested to the payee)."""
    rng = random.Random(12)
    now = datetime.now(UTC)
    lines = [json.dumps({"message_id": f"open-{i}", "type": "Opened",
                         "aggregate_type": "BankAccount", "aggregate_id": n,
                         "payload": {"initial": INITIAL},
                         "occurred_at": (now - timedelta(hours=2)).isoformat()})
             for i, n in enumerate(NAMES)]
    done: list[tuple[str, str, int]] = []
    for t in range(transfers):
        payer, payee = rng.sample(NAMES, 2)
        amount = rng.randint(1, 50)
        done.append((payer, payee, amount))
        lines.append(json.dumps({
            "message_id": f"t-{t}", "type": "TransferRequested", "aggregate_type": "BankAccount",
            "aggregate_id": payer, "payload": {"amount": amount, "payee": payee},
            "occurred_at": (now - timedelta(seconds=rng.randint(0, 3600))).isoformat(),
            "correlation_id": f"corr-{t}", "headers": {"traceparent": TRACE, "x-tenant": "ü"}}))
    path = tmp_path / "round0.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, done


def _pipeline(spark: Any, uri: str, database: str) -> Pipeline:
    return Pipeline(spark, aggregates=AGG, mongodb_uri=uri,
                    settings=AggboxSettings.load(mongodb_uri=uri, database=database),
                    spark_settings=SparkSettings.load(shuffle_partitions=3))


def _expected(transfers: list[tuple[str, str, int]]) -> dict[str, int]:
    out = dict.fromkeys(NAMES, INITIAL)
    for payer, payee, amount in transfers:
        out[payer] -= amount
        out[payee] += amount
    return out


def _outcomes(result: RunResult) -> dict[str, tuple[str, str | None]]:
    assert result.outcomes is not None
    return {r["message_id"]: (r["outcome"], r["reason"])
            for r in result.outcomes.select("message_id", "outcome", "reason").collect()}


def _consume(bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic`` (read from the beginning until it is quiet; at most
    ``_MAX_POLLS`` polls, then the test fails: a topic that never goes quiet)."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    out: list[Any] = []
    idle = 0
    try:
        for _poll in range(_MAX_POLLS):
            if idle >= 4 and out:
                break
            msg = c.poll(0.5)
            if msg is None or msg.error():
                idle += 1
                if idle > 120:
                    break
                continue
            idle = 0
            out.append(msg)
        else:
            pytest.fail(f"{topic}: still delivering after {_MAX_POLLS} polls "
                        f"({len(out)} records so far)")
    finally:
        c.close()
    return out


#: Polls of :func:`_consume` (of 0.5 s at most each): far more than the few hundred records
#: of a topic here need.
_MAX_POLLS = 5000


def _bad_records() -> list[tuple[bytes | None, list[tuple[str, bytes]], str]]:
    """Malformed binary-mode CloudEvents: (value, headers, the attribute the detail names)."""
    good = [("ce_specversion", b"1.0"), ("ce_id", b"bad-x"), ("ce_source", b"/aggbox/T/x"),
            ("ce_type", b"CreditRequested"), ("ce_subject", NAMES[0].encode()),
            ("ce_aggregatetype", b"BankAccount"), ("content-type", b"application/json")]

    def without(name: str, *extra: tuple[str, bytes], mid: str) -> list[tuple[str, bytes]]:
        return [(k, mid.encode() if k == "ce_id" else v) for k, v in good if k != name] \
            + list(extra)

    def payload(n: int) -> bytes:
        return b'{"amount": %d}' % n

    return [
        (payload(1), [h for h in good if h[0] != "ce_id"], "ce_id"),
        # the same value as the first, other headers: a dead letter of its own
        (payload(1), without("ce_specversion", ("ce_specversion", b"0.3"), mid="bad-v"),
         "ce_specversion"),
        (b"not json {", without("", mid="bad-json"), "data"),
        (None, without("", mid="bad-none"), "data"),
        (payload(3), without("ce_source", ("ce_source", b"/aggbox/T/a/b"),
                             ("ce_sourceseq", b"3"), mid="bad-src"), "ce_source"),
        (payload(4), without("", ("ce_sourceseq", b"99999999999999999999"), mid="bad-seq"),
         "ce_sourceseq"),
        (payload(5), without("ce_subject", ("ce_subject", b"\xff\xfeacct"), mid="bad-utf8"),
         "ce_subject"),
        (payload(6), without("", ("ce_time", b"yesterday"), mid="bad-time"), "ce_time"),
        (b"[1, 2]", without("", mid="bad-data"), "data"),
    ]


@pytest.mark.kafka
def test_cloudevents_over_kafka_give_the_outcomes_of_the_aggbox_format(
    spark_session: Any, db: Any, mongo_uri: str, mongo_client: MongoClient[Any],
    kafka_server: LocalKafka, tmp_path: Path,
) -> None:
    """Two databases, the same round 0; one dispatches in the aggbox format, the other as
    CloudEvents (binary mode), each to its topic; each reads its topic back."""
    from confluent_kafka import Producer

    bootstrap = kafka_server.bootstrap_servers
    prefix = "ce" + uuid.uuid4().hex[:8]
    formats = {"aggbox": f"{prefix}-native", "cloudevents": f"{prefix}-ce"}
    for topic in formats.values():
        create_topic(bootstrap, topic, partitions=2)
    db2 = mongo_client[db.name[:50] + "_ce"]
    databases = {"aggbox": db, "cloudevents": db2}
    round0, transfers = _round0(tmp_path)
    try:
        results: dict[str, RunResult] = {}
        for fmt, database in databases.items():
            pipe = _pipeline(spark_session, mongo_uri, database.name)
            first = pipe.run_batch([str(round0)])
            assert first.counts["applied"] == len(NAMES) + len(transfers)
            rc = main(["dispatch", "--once", "--publisher", "kafka", "--record-format", fmt,
                       "--bootstrap-servers", bootstrap, "--topic-template", formats[fmt],
                       "--collection", "bank_accounts", "--aggregates", AGG,
                       "--mongodb-uri", mongo_uri, "--database", database.name,
                       "--metrics-port", "0"])
            assert rc == 0
            if fmt == "cloudevents":
                producer = Producer({"bootstrap.servers": bootstrap})
                for value, headers, _ in _bad_records():
                    producer.produce(formats[fmt], key=b"bad", value=value, headers=headers)
                assert producer.flush(30) == 0
                del producer
            results[fmt] = pipe.run_stream(
                KafkaSource(bootstrap, formats[fmt]), trigger="availableNow",
                checkpoint_location=str(tmp_path / f"checkpoint-{fmt}"))
        native, ce = results["aggbox"], results["cloudevents"]
        assert native.counts["applied"] == len(transfers)
        bad = _bad_records()
        assert ce.input_count == native.input_count + len(bad)
        assert ce.counts["applied"] == native.counts["applied"]
        assert ce.counts["dead_lettered"] == len(bad)
        assert ce.reasons == {("dead_lettered", "invalid_cloudevent"): len(bad)}

        # Same state in both databases, and the balances money conservation demands.
        def state(database: Any) -> dict[str, Any]:
            return {d["_id"]: d["state"] for d in database.bank_accounts.find()}

        assert state(db2) == state(db)
        assert {k: s["balance"] for k, s in state(db2).items()} == _expected(transfers)

        letters = list(db2.aggbox_dead_letters.find())
        assert len(letters) == len(bad)
        for value, headers, attribute in bad:
            mid = dict(headers).get("ce_id", b"").decode()
            match = [d for d in letters if f"attribute '{attribute}'" in d["error"]
                     and (not mid or d["message_id"] == mid)]
            assert len(match) == 1, (attribute, sorted(d["error"] for d in letters))
            if value is not None:  # the record value is kept as it came
                assert match[0]["raw"] == value.decode()
            # and the headers that carried the attributes, as bytes
            assert [(h["key"], h["value"]) for h in match[0]["record_headers"]] == headers

        # Every CloudEvent record maps back to exactly the envelope of its aggbox twin.
        native_records = {json.loads(r.value())["message_id"]: r
                          for r in _consume(bootstrap, formats["aggbox"])}
        ce_records = [r for r in _consume(bootstrap, formats["cloudevents"])
                      if r.key() != b"bad"]
        assert len(ce_records) == len(native_records) == len(transfers)
        for r in ce_records:
            envelope = cloudevents.from_binary(r.headers(), r.value())
            twin = native_records[envelope["message_id"]]
            ours, theirs = Message.from_dict(envelope), Message.from_dict(json.loads(twin.value()))
            assert ours.occurred_at is not None  # each database wrote its entries at its time
            assert replace(ours, occurred_at=None) == replace(theirs, occurred_at=None)
            assert r.key() == twin.key()
            assert ours.headers.get("traceparent") == TRACE  # the input's trace continues
    finally:
        mongo_client.drop_database(db2.name)


def test_structured_cloudevents_in_json_lines_feed_aggbox_run(
    spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``aggbox dispatch --publisher jsonl --record-format cloudevents`` writes one
    structured-mode event per line; ``aggbox run`` applies them (again: duplicates)."""
    from cloudevents.core.formats.json import JSONFormat

    round0, transfers = _round0(tmp_path)

    def run(*patterns: str) -> dict[str, Any]:
        rc = main(["run", "--input", *patterns, "--aggregates", AGG, "--mongodb-uri",
                   mongo_uri, "--database", db.name, "--no-progress", "--json"])
        out = capsys.readouterr().out
        assert rc == 0, out
        summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return summary

    assert run(str(round0))["applied"] == len(NAMES) + len(transfers)
    out = tmp_path / "out"
    assert main(["dispatch", "--once", "--publisher", "jsonl", "--record-format", "cloudevents",
                 "--jsonl-dir", str(out), "--collection", "bank_accounts", "--aggregates", AGG,
                 "--mongodb-uri", mongo_uri, "--database", db.name, "--metrics-port", "0"]) == 0
    lines = [x for f in sorted(out.glob("*.jsonl")) for x in f.read_text().splitlines() if x]
    events = [json.loads(x) for x in lines]
    assert Counter(e["type"] for e in events) == {"CreditRequested": len(transfers)}
    for line, e in zip(lines, events, strict=True):
        assert e["specversion"] == "1.0" and e["datacontenttype"] == "application/json"
        assert e["source"].startswith("/aggbox/BankAccount/") and e["subject"] in NAMES
        assert e["traceparent"] == TRACE and e["aggboxkind"] == "input"
        assert int(e["sourceseq"]) >= 1 and e["correlationid"].startswith("corr-")
        sdk = JSONFormat().read(None, line.encode())  # the SDK reads every line
        assert sdk.get_id() == e["id"] and sdk.get_data() == e["data"]

    first = run(str(out / "*.jsonl"))
    assert first["applied"] == len(transfers) and first["dead_lettered"] == 0
    again = run(str(out / "*.jsonl"), str(round0))
    assert again["duplicate"] == again["input"]
    balances = {d["_id"]: d["state"]["balance"] for d in db.bank_accounts.find()}
    assert balances == _expected(transfers)


@pytest.mark.kafka
def test_structured_cloudevents_over_kafka(
    spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path, kafka_server: LocalKafka,
) -> None:
    """Structured-mode events as Kafka record values (as another system's producer writes
    them, ``content-type: application/cloudevents+json``): the pipeline applies them, a
    second copy of each is a duplicate."""
    from confluent_kafka import Producer

    round0, transfers = _round0(tmp_path)
    pipe = _pipeline(spark_session, mongo_uri, db.name)
    assert pipe.run_batch([str(round0)]).counts["applied"] == len(NAMES) + len(transfers)
    out = tmp_path / "out"
    assert main(["dispatch", "--once", "--publisher", "jsonl", "--record-format", "cloudevents",
                 "--jsonl-dir", str(out), "--collection", "bank_accounts", "--aggregates", AGG,
                 "--mongodb-uri", mongo_uri, "--database", db.name, "--metrics-port", "0"]) == 0
    lines = [x for f in sorted(out.glob("*.jsonl")) for x in f.read_text().splitlines() if x]
    assert len(lines) == len(transfers)
    topic = "ces" + uuid.uuid4().hex[:8]
    create_topic(kafka_server.bootstrap_servers, topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_server.bootstrap_servers})
    for line in lines + lines:  # every event delivered twice
        producer.produce(topic, key=json.loads(line)["subject"].encode(), value=line.encode(),
                         headers=[("content-type", b"application/cloudevents+json")])
    assert producer.flush(30) == 0
    result = pipe.run_stream(KafkaSource(kafka_server.bootstrap_servers, topic),
                             trigger="availableNow",
                             checkpoint_location=str(tmp_path / "checkpoint"))
    assert result.input_count == 2 * len(lines)
    assert result.counts["applied"] == len(transfers)
    assert result.counts["duplicate"] == len(transfers)
    balances = {d["_id"]: d["state"]["balance"] for d in db.bank_accounts.find()}
    assert balances == _expected(transfers)
