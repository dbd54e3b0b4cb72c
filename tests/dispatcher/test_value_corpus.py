"""The number and type corpus (tests/corpus.py) through every publisher × record format
(issue 40): Kafka (aggbox; CloudEvents binary), JSON Lines (aggbox; CloudEvents structured),
stdout (aggbox; CloudEvents structured).

Every value of the corpus goes into an outbox entry's payload (``{"v": value}``) twice:

- ``json``: as the fold stores it — its JSON form (``json_payload``; values the fold refuses
  are never stored, so they have no such entry);
- ``raw``: stored by hand as the raw value (by an older aggbox, a script, a restore), i.e.
  what BSON gives back for it (Decimal128, datetime, bytes, NaN, Int64, …) where BSON can
  hold it at all.

Each entry sits in its own document, followed by a plain entry of the same aggregate, beside
a document of another aggregate with a plain entry. One dispatcher run per publisher ×
format takes them all. Each entry is either published once with the value's documented JSON
form (the record decoded and compared with ``same()``) or dead-lettered
``invalid_outbox_entry`` naming the field and found by its entry id; the run ends with
status 0 and an empty outbox, every plain entry published exactly once.

With ``AGGBOX_CORPUS_REPORT=<file>`` each run appends what it saw per value (JSON lines):
the table of the issue's closing note.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bson
import pytest
from pymongo.database import Database

from aggbox.servers import LocalKafka, create_topic
from aggregates import AggboxSettings, Message, StoreWriter
from aggregates.core.jsonvalue import json_payload
from aggregates.core.reasons import Reason
from aggregates.ops import DeadLetterStore
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from tests.corpus import CORPUS, REFUSED, same
from tests.dispatcher.helpers import jsonl_envelopes, pending_entries

pytestmark = [pytest.mark.mongo]

AGGBOX = str(Path(sys.executable).with_name("aggbox"))
AT = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

#: Values BSON cannot store at all (so no entry holds them raw): numpy values, Python's
#: Decimal, date, timedelta, UUID (without a uuid representation), sets, enums, custom
#: types, lone surrogates, integers beyond int64.
RAW_UNSTORABLE = frozenset({
    "2**63", "2**70", "-2**70", "numpy.float32", "numpy.int64", "numpy.uint64 max",
    "numpy.bool_", "numpy array", "numpy array nan", "Decimal", "Decimal NaN", "date",
    "timedelta", "uuid.UUID", "Enum", "lone surrogate", "set", "frozenset of str",
    "custom class", "complex"})
#: Where the value BSON gives back publishes otherwise than the corpus' emit column: BSON
#: dates are UTC milliseconds (naive ones read as UTC).
RAW_PUBLISHED: dict[str, Any] = {
    "datetime +02:00": "2026-01-02T03:04:05.123000Z",
    "datetime naive": "2026-01-02T03:04:05Z",
    "datetime µs": "2026-01-02T00:00:00Z",
}


@dataclasses.dataclass(frozen=True)
class Case:
    entry_id: str
    name: str
    storage: str  # json | raw
    stored: Any
    expected: Any  # the published JSON form of "v", or REFUSED


def _cases() -> list[Case]:
    cases: list[Case] = []
    storable: set[str] = set()
    for k, c in enumerate(CORPUS):
        value = c.make()
        if c.emit is not REFUSED:
            cases.append(Case(f"j{k:02d}", c.name, "json", json_payload({"v": value})["v"],
                              c.emit))
        try:
            bson.encode({"v": value})
        except (bson.errors.InvalidDocument, OverflowError, UnicodeEncodeError, ValueError):
            continue
        storable.add(c.name)
        cases.append(Case(f"r{k:02d}", c.name, "raw", value, RAW_PUBLISHED.get(c.name, c.emit)))
    assert {c.name for c in CORPUS} - storable == RAW_UNSTORABLE
    return cases


CASES = _cases()


def _seed(writer: StoreWriter, db: Database[Any]) -> set[str]:
    """The documents: per case ``v-<id>`` (a plain entry, the case's entry, a plain one
    after it) and ``p-<id>`` (another aggregate, a plain entry). Returns the plain ids."""
    docs = [f"{p}-{c.entry_id}" for c in CASES for p in ("v", "p")]
    outcomes = writer.process([Message(f"in-{d}", "Emit", "Emitter", d, {"n": 1})
                               for d in docs])
    assert {o.outcome for o in outcomes} == {"applied"}
    plain = {i for o in outcomes for i in o.emitted_ids}
    for c in CASES:
        doc = f"v-{c.entry_id}"
        db.emitters.update_one({"_id": doc}, {"$push": {"outbox": {"$each": [
            {"id": c.entry_id, "type": "Tick", "payload": {"v": c.stored}, "created_at": AT,
             "source": {"type": "Emitter", "id": doc, "seq": 100}},
            {"id": f"after-{c.entry_id}", "type": "Tick", "payload": {"i": 2},
             "created_at": AT, "source": {"type": "Emitter", "id": doc, "seq": 101}}]}}})
        plain.add(f"after-{c.entry_id}")
    return plain


def _check(published: list[tuple[str, Any]], plain: set[str], db: Database[Any],
           store: AggboxSettings, run: str) -> None:
    """``published``: (entry id, the record's payload) in publishing order."""
    ids = Counter(i for i, _ in published)
    refused = {c.entry_id for c in CASES if c.expected is REFUSED}
    assert ids == Counter(plain | {c.entry_id for c in CASES} - refused), run
    assert pending_entries(db) == 0
    payload = dict(published)
    letters = DeadLetterStore(db, collection=store.dead_letter_collection)
    found = {d["message_id"]: d for d in letters.get(sorted(refused))}  # by entry id
    assert set(found) == refused and len(letters.list(limit=0)) == len(refused)
    for c in CASES:
        if c.expected is REFUSED:
            letter = found[c.entry_id]
            assert letter["reason"] == Reason.INVALID_OUTBOX_ENTRY, letter
            assert "field 'payload.v': " in letter["error"], (c, letter["error"])
            _report(run, c, {"dead_lettered": letter["error"].split("field 'payload.v': ")[1]})
        else:
            got = payload[c.entry_id]
            assert set(got) == {"v"} and same(c.expected, got["v"]), (run, c, got)
            _report(run, c, {"published": got["v"]})


def _report(run: str, c: Case, what: dict[str, Any]) -> None:
    path = os.environ.get("AGGBOX_CORPUS_REPORT")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"run": run, "name": c.name, "storage": c.storage, **what},
                                default=repr) + "\n")


def _env(tmp_path: Path, uri: str, database: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AGGBOX_")}
    env.update(AGGBOX_HOME=str(tmp_path / "home"), AGGBOX_LOG_FILE=str(tmp_path / "trace.log"),
               AGGBOX_MONGODB_URI=uri, AGGBOX_DATABASE=database, PYTHONUNBUFFERED="1")
    return env


def _dispatch(tmp_path: Path, uri: str, database: str, *args: str
              ) -> subprocess.CompletedProcess[str]:
    """``aggbox dispatch --once ARGS`` on the ``emitters`` collection."""
    done = subprocess.run(
        [AGGBOX, "dispatch", "--once", "--collection", "emitters", "--metrics-port", "0",
         "--lease-ttl", "3", "--once-timeout", "60", *args],
        env=_env(tmp_path, uri, database), cwd=tmp_path, capture_output=True, text=True,
        timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize("record_format", ["aggbox", "cloudevents"])
def test_stdout(record_format: str, writer: StoreWriter, ddb: Database[Any],
                store: AggboxSettings, dmongo: Any, tmp_path: Path) -> None:
    plain = _seed(writer, ddb)
    done = _dispatch(tmp_path, dmongo.uri, ddb.name, "--publisher", "stdout",
                     "--record-format", record_format)
    lines = [json.loads(line)["value"] for line in done.stdout.splitlines()]
    if record_format == "aggbox":
        published = [(v["message_id"], v["payload"]) for v in lines]
    else:  # structured mode
        published = [(v["id"], v["data"]) for v in lines]
    _check(published, plain, ddb, store, f"stdout/{record_format}")
    # The command line finds every dead letter by its entry id.
    refused = [c.entry_id for c in CASES if c.expected is REFUSED]
    shown = subprocess.run([AGGBOX, "deadletters", "show", *refused, "--json"],
                           env=_env(tmp_path, dmongo.uri, ddb.name), cwd=tmp_path,
                           capture_output=True, text=True, timeout=600, check=False)
    answer = json.loads(shown.stdout)
    assert shown.returncode == 0 and answer["missing"] == [], shown.stdout + shown.stderr
    assert {i["message_id"] for i in answer["items"]} == set(refused)


@pytest.mark.parametrize("record_format", ["aggbox", "cloudevents"])
def test_jsonl(record_format: str, writer: StoreWriter, ddb: Database[Any],
               store: AggboxSettings, tmp_path: Path) -> None:
    plain = _seed(writer, ddb)
    out = tmp_path / "out"
    settings = DispatcherSettings.load(collections=["emitters"], metrics_port=0,
                                       publisher="jsonl", jsonl_dir=str(out),
                                       record_format=record_format, lease_ttl_s=3,
                                       once_timeout_s=60)
    assert asyncio.run(Dispatcher(settings, store=store).run(once=True)) == 0
    lines = jsonl_envelopes(out)
    if record_format == "aggbox":
        published = [(v["message_id"], v["payload"]) for v in lines]
    else:  # structured mode
        published = [(v["id"], v["data"]) for v in lines]
    _check(published, plain, ddb, store, f"jsonl/{record_format}")


def _consume(bootstrap: str, topic: str, count: int) -> list[tuple[str, Any]]:
    """Every record of ``topic`` (at least ``count``; a second more for any extra copy):
    (message id from the headers, the value as JSON)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[tuple[str, Any]] = []
        complete_at: float | None = None
        deadline = time.monotonic() + 120  # a hang guard, not a time limit
        while time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None or msg.error():
                if complete_at is not None and time.monotonic() - complete_at >= 1.0:
                    break
                continue
            headers = {k: v.decode() for k, v in msg.headers() or []}
            out.append((headers.get("message_id") or headers["ce_id"], json.loads(msg.value())))
            if complete_at is None and len(out) >= count:
                complete_at = time.monotonic()
        return out
    finally:
        c.close()


@pytest.mark.kafka
@pytest.mark.parametrize("record_format", ["aggbox", "cloudevents"])
def test_kafka(record_format: str, kafka_server: LocalKafka, writer: StoreWriter,
               ddb: Database[Any], store: AggboxSettings, dmongo: Any, tmp_path: Path) -> None:
    plain = _seed(writer, ddb)
    prefix = "corpus" + uuid.uuid4().hex[:10]
    create_topic(kafka_server.bootstrap_servers, f"{prefix}-Emitter", partitions=3)
    _dispatch(tmp_path, dmongo.uri, ddb.name, "--publisher", "kafka", "--record-format",
              record_format, "--bootstrap-servers", kafka_server.bootstrap_servers,
              "--topic-template", prefix + "-{aggregate_type}")
    expected = len(plain) + sum(c.expected is not REFUSED for c in CASES)
    records = _consume(kafka_server.bootstrap_servers, f"{prefix}-Emitter", expected)
    # CloudEvents binary mode: the value is the payload
    published = ([(i, v["payload"]) for i, v in records] if record_format == "aggbox"
                 else records)
    _check(published, plain, ddb, store, f"kafka/{record_format}")


def test_the_corpus_has_entries_of_both_kinds_and_both_outcomes() -> None:
    """The cases above cover what the issue asks for: BSON values stored raw (Decimal128,
    datetime, bytes, NaN, Int64 …), each published or refused."""
    raw = {c.name: c for c in CASES if c.storage == "raw"}
    for name in ("Decimal128", "datetime aware", "bytes", "nan", "2**63-1", "bson.Int64",
                 "Binary uuid", "inf"):
        assert name in raw, name
    assert type(bson.decode(bson.encode({"v": raw["2**63-1"].stored}))["v"]) is bson.int64.Int64
    assert any(c.expected is REFUSED for c in CASES) and any(
        c.expected is not REFUSED for c in CASES)
    assert all(not (isinstance(c.expected, float) and math.isnan(c.expected)) for c in CASES)
