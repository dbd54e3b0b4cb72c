"""One entry a publisher cannot encode never jams it (issue 40, item 2), and every dead letter
the dispatcher writes is found by the entry's id (item 3).

- An entry stored some other way than by the fold (by hand, an older aggbox, a restore)
  whose payload holds BSON values: ``Decimal128`` and ``datetime`` are published in their
  JSON form (the one rule of aggregates/core/jsonvalue.py, the same in every format), bytes
  are refused — the entry dead-lettered ``invalid_outbox_entry`` naming the field — and the
  entries around it, of the same and of another aggregate, are published exactly once.
  Before, ``--publisher stdout --record-format cloudevents`` raised ``TypeError: Object of
  type Decimal128 is not JSON serializable`` for the whole batch: ``--once`` gave up with
  entries pending after printing the other aggregate's entry again and again.
- A record a publisher cannot encode for any other reason (the second line of defence) is
  that entry's dead letter alone, in the JSON Lines, stdout and Kafka publishers.
- ``aggbox deadletters show/list/dismiss`` find the dispatcher's dead letters by entry id:
  invalid outbox entries and timers, records refused for good (``message_too_large``,
  ``invalid_topic``, ``rejected_by_broker``), effects that failed for good.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from bson.decimal128 import Decimal128
from pymongo.database import Database

from aggregates import AggboxSettings, Message, Source, StoreWriter
from aggregates.core.reasons import Reason
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from dispatcher.publishers import jsonl as jsonl_module
from dispatcher.publishers import kafka as kafka_module
from dispatcher.publishers import stdout as stdout_module
from dispatcher.publishers.base import PublishResult
from dispatcher.publishers.builder import build_record
from dispatcher.publishers.record import OutboundRecord
from tests.dispatcher.helpers import ListPublisher, emit, jsonl_envelopes, pending_entries
from tests.dispatcher.timerdomain import registry as timer_registry

pytestmark = [pytest.mark.mongo]

AGGBOX = str(Path(sys.executable).with_name("aggbox"))
AT = datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)


def _entry(entry_id: str, payload: dict[str, Any], seq: int, doc: str = "a000"
           ) -> dict[str, Any]:
    return {"id": entry_id, "type": "Tick", "payload": payload, "created_at": AT,
            "source": {"type": "Emitter", "id": doc, "seq": seq}}


def _push(db: Database[Any], doc: str, *entries: dict[str, Any]) -> None:
    db.emitters.update_one({"_id": doc}, {"$push": {"outbox": {"$each": list(entries)}}})


def _env(tmp_path: Path, uri: str, database: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AGGBOX_")}
    env.update(AGGBOX_HOME=str(tmp_path / "home"), AGGBOX_LOG_FILE=str(tmp_path / "trace.log"),
               AGGBOX_MONGODB_URI=uri, AGGBOX_DATABASE=database, PYTHONUNBUFFERED="1")
    if "AGGBOX_CACHE_DIR" in os.environ:
        env["AGGBOX_CACHE_DIR"] = os.environ["AGGBOX_CACHE_DIR"]
    return env


def aggbox(tmp_path: Path, uri: str, database: str, *args: str
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGGBOX, *args], env=_env(tmp_path, uri, database), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, check=False)


def shown(tmp_path: Path, uri: str, database: str, *ids: str) -> dict[str, Any]:
    """``aggbox deadletters show IDS --json``: the answer, asserted to have found them all."""
    done = aggbox(tmp_path, uri, database, "deadletters", "show", *ids, "--json")
    answer: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == 0 and answer["missing"] == [], (done.stdout, done.stderr)
    return answer


def test_stdout_cloudevents_publishes_bson_values_as_json_and_dead_letters_bytes(
        writer: StoreWriter, ddb: Database[Any], dmongo: Any, tmp_path: Path) -> None:
    """The issue's case through the command line: before, rc 1 after --once-timeout with
    every entry still pending, the other aggregate's entry printed at every retry."""
    emitted = emit(writer, ["a000", "b000"], n=1)
    _push(ddb, "a000", _entry("dec-1", {"amount": Decimal128("2.50")}, 10),
          _entry("when-1", {"at": AT}, 11), _entry("blob-1", {"blob": b"\x00\xff"}, 12),
          _entry("after-1", {"n": 1}, 13))
    done = aggbox(tmp_path, dmongo.uri, ddb.name, "dispatch", "--once", "--collection",
                  "emitters", "--publisher", "stdout", "--record-format", "cloudevents",
                  "--once-timeout", "15", "--metrics-port", "0")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line)["value"] for line in done.stdout.splitlines()]
    printed = Counter(e["id"] for e in events)
    expected = [*emitted["a000"], *emitted["b000"], "dec-1", "when-1", "after-1"]
    assert printed == Counter(expected)  # each once; the bytes entry never
    data = {e["id"]: e["data"] for e in events}
    assert data["dec-1"] == {"amount": "2.50"}  # as a typed emit's Decimal is published
    assert data["when-1"] == {"at": "2026-01-02T03:04:05.123000Z"}
    assert pending_entries(ddb) == 0
    # Found by the entry id (item 3), the field named.
    [letter] = shown(tmp_path, dmongo.uri, ddb.name, "blob-1")["items"]
    assert letter["reason"] == Reason.INVALID_OUTBOX_ENTRY and letter["message_id"] == "blob-1"
    assert "'payload.blob': bytes are not JSON" in letter["error"], letter["error"]
    assert letter["id"] == "Emitter/a000/blob-1"
    summary = done.stderr.strip().splitlines()[-1]
    assert summary.startswith("aggbox dispatch --once: published 5,") and (
        "dead-lettered 1" in summary and "emitters: published 5, timers fired 0, left 0 "
        "entries and 0 due timers" in summary), summary


def _failing(real: Any, bad: str) -> Any:
    """``real`` (a format function taking a record first), raising for the record ``bad``."""
    def encode(record: OutboundRecord, *args: Any) -> Any:
        if record.message_id == bad:
            raise TypeError("Object of type Thing is not JSON serializable")
        return real(record, *args)
    return encode


@pytest.mark.parametrize("publisher", ["jsonl", "stdout"])
@pytest.mark.parametrize("record_format", ["aggbox", "cloudevents"])
def test_a_record_the_publisher_cannot_encode_is_dead_lettered_alone(
        publisher: str, record_format: str, writer: StoreWriter, ddb: Database[Any],
        store: AggboxSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The second line of defence: whatever the format raises for one record dead-letters
    that entry (naming what failed); the rest of the batch is published once. Before, the
    exception failed the whole batch, retried until --once gave up."""
    emitted = emit(writer, ["a000", "b000", "c000"], n=2)
    bad = emitted["b000"][0]
    if publisher == "jsonl":
        monkeypatch.setattr(jsonl_module, "json_line", _failing(jsonl_module.json_line, bad))
    else:
        monkeypatch.setattr(stdout_module, "_line", _failing(stdout_module._line, bad))
    out = tmp_path / "out"
    settings = DispatcherSettings.load(collections=["emitters"], metrics_port=0,
                                       publisher=publisher, record_format=record_format,
                                       jsonl_dir=str(out), lease_ttl_s=3, once_timeout_s=10)
    assert asyncio.run(Dispatcher(settings, store=store).run(once=True)) == 0
    if publisher == "jsonl":
        records = jsonl_envelopes(out)
    else:
        records = [json.loads(line)["value"] for line in capsys.readouterr().out.splitlines()]
    ids = Counter(r.get("message_id", r.get("id")) for r in records)
    assert ids == Counter(i for doc in emitted.values() for i in doc if i != bad)
    assert pending_entries(ddb) == 0
    letters = list(ddb[store.dead_letter_collection].find())
    assert [(d["reason"], d["message_id"]) for d in letters] == [
        (Reason.INVALID_OUTBOX_ENTRY, bad)]
    assert "cannot encode it as" in letters[0]["error"] and (
        "TypeError: Object of type Thing is not JSON serializable" in letters[0]["error"])


class _FakeProducer:
    """confluent_kafka.Producer's produce/poll/flush, acknowledging every record at once."""

    def __init__(self) -> None:
        self.produced: list[bytes] = []

    def produce(self, topic: str, *, value: bytes, key: bytes, headers: Any,
                on_delivery: Any) -> None:
        self.produced.append(key)
        on_delivery(None, None)

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0


@pytest.mark.parametrize("record_format", ["aggbox", "cloudevents"])
def test_kafka_dead_letters_the_record_it_cannot_encode_and_sends_the_rest(
        record_format: str, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [build_record({"id": f"e-{i}", "type": "Tick", "payload": {"i": i},
                             "created_at": AT, "source": {"type": "Emitter", "id": "a",
                                                          "seq": i + 1}},
                            collection="emitters", document_id="a", source_type="Emitter",
                            topic_template="t") for i in range(3)]
    monkeypatch.setattr(kafka_module, "kafka_record", _failing(kafka_module.kafka_record,
                                                               "e-1"))
    pub = kafka_module.KafkaPublisher("127.0.0.1:1", record_format=record_format)
    producer = _FakeProducer()
    pub._producer = producer
    results = asyncio.run(pub.publish(records))
    assert [r.status for r in results] == ["ok", "permanent", "ok"]
    assert results[1].reason == Reason.INVALID_OUTBOX_ENTRY and "TypeError" in str(
        results[1].error)
    assert producer.produced == [b"a", b"a"]


# -- item 3: every kind of dispatcher dead letter, found by the entry id ---------------------
_REFUSED = {"big-1": Reason.MESSAGE_TOO_LARGE, "topic-1": Reason.INVALID_TOPIC,
            "broker-1": Reason.REJECTED_BY_BROKER}


def _refuse(r: OutboundRecord) -> PublishResult | None:
    if r.message_id in _REFUSED:
        return PublishResult.permanent(_REFUSED[r.message_id], "refused by the test broker")
    if r.message_id == "effect-1":  # what the effect router reports for an effect that
        # failed for good (dispatcher/effects/runner.py)
        return PublishResult("permanent", Reason.EFFECT_REJECTED, "HTTP 400", effect=True)
    if r.envelope.get("type") == "Deadline" and r.document_id == "o-2":
        return PublishResult.permanent(Reason.INVALID_TOPIC, "no such topic")
    return None


def test_every_dispatcher_dead_letter_is_found_by_its_entry_id_through_the_cli(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings, dmongo: Any,
        tmp_path: Path) -> None:
    emitted = emit(writer, ["a000"], n=1)["a000"]
    _push(ddb, "a000", *[_entry(i, {"n": 1}, 20 + k) for k, i in enumerate(
        [*_REFUSED, "effect-1"])], _entry("nan-1", {"x": float("nan")}, 30))
    # Timers: one that forms no record (a payload holding bytes), one the broker refuses.
    tw = StoreWriter(ddb, timer_registry, settings=store)
    tw.ensure_indexes()
    tw.process([Message(f"place-{o}", "Place", "Order", o, {"ms": 0},
                        source=Source("Client", o, 1)) for o in ("o-1", "o-2")])
    ddb.torders.update_one({"_id": "o-1"}, {"$set": {"timers.0.payload": {"b": b"\x01"}}})
    timer_ids = {d["_id"]: d["timers"][0]["id"] for d in ddb.torders.find()}
    settings = DispatcherSettings.load(collections=["emitters", "torders"], metrics_port=0,
                                       lease_ttl_s=3, once_timeout_s=30)
    pub = ListPublisher(_refuse)
    assert asyncio.run(Dispatcher(settings, store=store, publisher=pub).run(once=True)) == 0
    assert [r.message_id for r in pub.records] == emitted
    assert pending_entries(ddb) == 0 and all(not d.get("timers") for d in ddb.torders.find())

    ids = [*_REFUSED, "effect-1", "nan-1", timer_ids["o-1"], timer_ids["o-2"]]
    items = {i["message_id"]: i for i in shown(tmp_path, dmongo.uri, ddb.name, *ids)["items"]}
    assert {i: items[i]["reason"] for i in ids} == {
        **_REFUSED, "effect-1": Reason.EFFECT_REJECTED,
        "nan-1": Reason.INVALID_OUTBOX_ENTRY, timer_ids["o-1"]: Reason.INVALID_OUTBOX_ENTRY,
        timer_ids["o-2"]: Reason.INVALID_TOPIC}
    assert "'payload.x': NaN is not JSON" in items["nan-1"]["error"]
    assert "'payload.b': bytes are not JSON" in items[timer_ids["o-1"]]["error"]
    assert "rejected timer 'deadline' for good" in items[timer_ids["o-2"]]["error"]
    assert items["nan-1"]["id"] == "Emitter/a000/nan-1"  # named, not an opaque raw:… id
    assert items[timer_ids["o-1"]]["id"] == f"Order/o-1/{timer_ids['o-1']}"

    listed = aggbox(tmp_path, dmongo.uri, ddb.name, "deadletters", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {i["message_id"] for i in json.loads(listed.stdout)["items"]} == set(ids)
    dismissed = aggbox(tmp_path, dmongo.uri, ddb.name, "deadletters", "dismiss", "--id",
                       "nan-1", "--id", timer_ids["o-1"], "--json")
    assert dismissed.returncode == 0, dismissed.stdout + dismissed.stderr
    answer = json.loads(dismissed.stdout)
    assert (answer["dismissed"], answer["missing"]) == (2, [])
