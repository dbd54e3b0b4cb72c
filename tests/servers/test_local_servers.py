"""The local servers really work: what the rest of aggbox relies on, end to end.

MongoDB: whatever ``mongo_server`` is (AGGBOX_MONGODB_URI, mongod or mongo-java-server).
Kafka: a real KRaft broker, including a crash (SIGKILL) and a graceful restart.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from confluent_kafka import Consumer, Producer
from pymongo import MongoClient, UpdateOne
from pymongo.database import Database
from pymongo.errors import BulkWriteError

from aggbox.servers import (
    LocalKafka,
    LocalMongo,
    ServerError,
    _process,
    create_topic,
    resolve_classpath,
    server_operation_time,
)
from aggbox.servers import maven as maven_mod

Doc = dict[str, Any]

# --------------------------------------------------------------------------- MongoDB


@pytest.mark.mongo
def test_server_kind_and_uri(mongo_server: LocalMongo) -> None:
    assert mongo_server.kind in ("external", "mongod", "mongo-java-server")
    assert mongo_server.capabilities.change_streams
    if mongo_server.kind == "mongo-java-server":
        assert "directConnection=true" in mongo_server.uri
        assert not mongo_server.capabilities.enforces_16mb
        assert mongo_server.log_path is not None and mongo_server.log_path.is_file()


@pytest.mark.mongo
def test_insert_update_find(db: Database[Doc]) -> None:
    coll = db.items
    coll.insert_one({"_id": "a", "_v": 1, "state": {"n": 1}})
    result = coll.update_one({"_id": "a", "_v": 1}, {"$inc": {"_v": 1, "state.n": 5}})
    assert result.matched_count == 1 and result.modified_count == 1
    assert coll.find_one({"_id": "a"}) == {"_id": "a", "_v": 2, "state": {"n": 6}}
    # a stale version does not match
    assert coll.update_one({"_id": "a", "_v": 1}, {"$set": {"x": 1}}).matched_count == 0
    # operator queries used by the dispatcher's sweep
    coll.insert_one({"_id": "b", "_v": 1, "outbox": [{"id": "m1"}]})
    assert [d["_id"] for d in coll.find({"outbox.0": {"$exists": True}})] == ["b"]


@pytest.mark.mongo
def test_push_each_slice_and_pull(db: Database[Doc]) -> None:
    coll = db.items
    coll.insert_one({"_id": "a", "inbox": [], "outbox": []})
    for start in (0, 3):
        coll.update_one(
            {"_id": "a"},
            {
                "$push": {
                    "inbox": {
                        "$each": [[f"m{i}", i] for i in range(start, start + 3)],
                        "$slice": -4,
                    },
                    "outbox": {"$each": [{"id": f"o{i}"} for i in range(start, start + 3)]},
                }
            },
        )
    doc = coll.find_one({"_id": "a"})
    assert doc is not None
    assert doc["inbox"] == [["m2", 2], ["m3", 3], ["m4", 4], ["m5", 5]]
    assert [e["id"] for e in doc["outbox"]] == ["o0", "o1", "o2", "o3", "o4", "o5"]
    coll.update_one({"_id": "a"}, {"$pull": {"outbox": {"id": {"$in": ["o0", "o1", "o4"]}}}})
    doc = coll.find_one({"_id": "a"})
    assert doc is not None
    assert [e["id"] for e in doc["outbox"]] == ["o2", "o3", "o5"]


@pytest.mark.mongo
def test_unordered_bulk_reports_stale_version_at_its_index(db: Database[Doc]) -> None:
    coll = db.items
    coll.create_index([("_id", 1), ("_v", 1)], unique=True)
    coll.insert_many([{"_id": "a", "_v": 1, "n": 0}, {"_id": "b", "_v": 3, "n": 0}])

    def write(agg_id: str, expected_v: int) -> UpdateOne:
        return UpdateOne(
            {"_id": agg_id, "_v": expected_v},
            {"$set": {"_v": expected_v + 1}, "$inc": {"n": 1}},
            upsert=True,
        )

    ops = [write("a", 1), write("b", 2), write("c", 0), write("d", 7)]  # b is stale
    with pytest.raises(BulkWriteError) as caught:
        coll.bulk_write(ops, ordered=False)
    details = caught.value.details
    assert [(e["index"], e["code"]) for e in details["writeErrors"]] == [(1, 11000)]
    assert details["nModified"] == 1  # a
    assert sorted(u["index"] for u in details["upserted"]) == [2, 3]  # c, d inserted
    docs = {d["_id"]: (d["_v"], d["n"]) for d in coll.find()}
    assert docs == {"a": (2, 1), "b": (3, 0), "c": (1, 1), "d": (8, 1)}


@pytest.mark.mongo
def test_change_stream_from_operation_time_with_update_lookup(
    db: Database[Doc], mongo_client: MongoClient[Doc]
) -> None:
    coll = db.aggregates
    coll.insert_one({"_id": "a", "_v": 1, "outbox": []})
    start = server_operation_time(mongo_client)  # taken before the change, as the dispatcher does
    coll.update_one({"_id": "a"}, {"$push": {"outbox": {"id": "o1"}}, "$inc": {"_v": 1}})
    with coll.watch(
        start_at_operation_time=start, full_document="updateLookup", batch_size=100
    ) as stream:
        # only operationType and fullDocument are reliable on every server kind
        # (docs/design.md "Where mongo-java-server differs");
        # try_next() with our own pacing, as getMore does not wait on mongo-java-server
        deadline = time.monotonic() + 20
        update: Doc | None = None
        while update is None and time.monotonic() < deadline:
            change = stream.try_next()
            if change is None:
                time.sleep(0.05)
            elif change["operationType"] == "update":
                update = change
        assert update is not None, "no update event within 20 s"
        assert update["fullDocument"] == {"_id": "a", "_v": 2, "outbox": [{"id": "o1"}]}
        assert stream.resume_token is not None


@pytest.mark.mongo
def test_local_server_exits_when_its_parent_dies() -> None:
    """A server started by a process that is SIGKILLed goes away (no orphans after a crash)."""
    # without AGGBOX_MONGODB_URI the child starts a local server of its own
    env = {k: v for k, v in os.environ.items() if k != "AGGBOX_MONGODB_URI"}
    script = (
        "import time\n"
        "from aggbox.servers import start_local_mongodb\n"
        "m = start_local_mongodb()\n"
        "print(m.uri, m.work_dir, flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert len(line.split()) == 2, f"child printed {line!r} instead of '<uri> <work dir>'"
        uri, work_dir = line.split()
        port = urlparse(uri).port
        assert port is not None, uri
        assert _process.port_accepts(port)
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 20
    while _process.port_accepts(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _process.port_accepts(port), "the server outlived its parent"
    shutil.rmtree(work_dir, ignore_errors=True)  # nobody else will: its owner was killed


def test_sidecar_stops_a_server_that_does_not_watch_stdin(tmp_path: Path) -> None:
    """The mechanism used for mongod: a sidecar terminates it when its owner is SIGKILLed."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from aggbox.servers._process import ServerProcess\n"
        "p = ServerProcess('sleeper', ['sleep', '600'], Path(sys.argv[1]), watch_stdin=False)\n"
        "p.start()\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "sleeper.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        pid = int(child.stdout.readline())
        os.kill(pid, 0)  # running
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the server outlived its owner"


def _alive(pid: int) -> bool:
    """Running and not a zombie (an orphan's zombie lingers until its new parent reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --------------------------------------------------------------------------- Maven cache


def test_resolved_classpath_is_cached() -> None:
    jars = resolve_classpath("mongo-java-server")
    assert any(j.name.startswith("de.bwaldvogel.mongo-java-server-") for j in jars)
    started = time.monotonic()
    assert resolve_classpath("mongo-java-server") == jars
    assert time.monotonic() - started < 0.5  # no Maven run the second time


def test_missing_maven_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGGBOX_CACHE_DIR", str(tmp_path))  # empty cache: Maven is needed
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn, no java
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(ServerError, match="apt-get install openjdk-17-jdk-headless maven"):
        resolve_classpath("kafka")
    with pytest.raises(ServerError, match="Java 17"):
        maven_mod.java_executable()


# --------------------------------------------------------------------------- Kafka


def _produce(bootstrap: str, topic: str, count: int, tag: str) -> list[tuple[str, str]]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    sent: list[tuple[str, str]] = []
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    for i in range(count):
        key, value = f"agg-{i % 7}", f"{tag}-{i}"
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
        sent.append((key, value))
    assert producer.flush(30) == 0, "messages still in flight after 30 s"
    assert not failures, failures
    return sent


def _consume(bootstrap: str, topic: str, count: int) -> list[tuple[str, str]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    received: list[tuple[str, str]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(received) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            key, value = msg.key(), msg.value()
            assert isinstance(key, bytes) and isinstance(value, bytes)
            received.append((key.decode(), value.decode()))
    finally:
        consumer.close()
    return received


def _by_key(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = defaultdict(list)
    for key, value in pairs:
        grouped[key].append(value)
    return dict(grouped)


@pytest.mark.kafka
def test_kafka_keyed_messages_come_back_in_order(kafka_server: LocalKafka) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_server.bootstrap_servers, topic, partitions=3)
    sent = _produce(kafka_server.bootstrap_servers, topic, 100, "m")
    received = _consume(kafka_server.bootstrap_servers, topic, 100)
    assert len(received) == 100
    assert _by_key(received) == _by_key(sent)  # per key (= per partition) order kept


@pytest.mark.kafka
def test_kafka_single_partition_total_order(kafka_server: LocalKafka) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_server.bootstrap_servers, topic, partitions=1)
    sent = _produce(kafka_server.bootstrap_servers, topic, 100, "m")
    assert _consume(kafka_server.bootstrap_servers, topic, 100) == sent


@pytest.mark.kafka
def test_kafka_survives_crash_and_restart(kafka_server: LocalKafka) -> None:
    bootstrap = kafka_server.bootstrap_servers
    topic = f"t-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=2)
    before = _produce(bootstrap, topic, 50, "before")

    kafka_server.kill()  # crash: no controlled shutdown
    assert not kafka_server.is_running
    kafka_server.start()  # same ports, same data
    assert kafka_server.bootstrap_servers == bootstrap
    after_crash = _produce(bootstrap, topic, 50, "after-crash")

    kafka_server.restart()  # graceful stop + start
    after_restart = _produce(bootstrap, topic, 50, "after-restart")

    received = _consume(bootstrap, topic, 150)
    assert _by_key(received) == _by_key(before + after_crash + after_restart)
    assert kafka_server.is_running


@pytest.mark.kafka
def test_create_topic_exist_ok(kafka_server: LocalKafka) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_server.bootstrap_servers, topic, partitions=2)
    create_topic(kafka_server.bootstrap_servers, topic, partitions=2, exist_ok=True)
    with pytest.raises(ServerError, match="already exists"):
        create_topic(kafka_server.bootstrap_servers, topic, partitions=2)


def test_kafka_cluster_ids_never_look_like_options() -> None:
    """The storage tool parses a cluster id starting with '-' as an option (a flaky start)."""
    from aggbox.servers.kafka import _cluster_id

    ids = {_cluster_id() for _ in range(3000)}
    assert len(ids) == 3000
    assert not any(i.startswith("-") for i in ids)
    assert all(len(i) == 22 for i in ids)
