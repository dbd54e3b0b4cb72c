"""The dispatcher benchmark's shared parts (bench/dispatch.py and its scenario modules):
the ``Emitter`` domain whose ``Emit`` message writes N outbox entries, the local MongoDB per
phase, the writer of entries, the dispatcher as its own process, and waits on its partition
leases and on the outbox."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aggbox.servers import start_local_mongodb
from aggregates import AggboxSettings, AggregateType, Emit, Handled, Message, Registry, StoreWriter
from dispatcher import DispatcherSettings, create_publisher

ROOT = Path(__file__).resolve().parents[1]

@dataclass(frozen=True)
class Ticker:
    emitted: int = 0


emitters: AggregateType[Ticker] = AggregateType("Emitter", state=Ticker, collection="emitters",
                                                max_outbox=100_000)


@emitters.handles("Emit")
def _emit(state: Ticker, msg: Message) -> Handled[Ticker]:
    n = int(msg.payload["n"])
    return (replace(state, emitted=state.emitted + n),
            [Emit("Tick", {"i": state.emitted + i + 1, "note": "benchmark entry"})
             for i in range(n)])


registry = Registry([emitters])


@dataclass(frozen=True)
class BenchMongo:
    """The server of one phase: its URI, kind and process id (None: not ours)."""

    uri: str
    kind: str
    pid: int | None


@contextmanager
def local_mongo(server: str = "memory") -> Iterator[BenchMongo]:
    """A fresh server per phase, or AGGBOX_MONGODB_URI when set: ``memory`` the throw-away
    mongo-java-server (its stock oplog is read whole per getMore, so each phase gets its
    own), ``local`` the persistent local server of ``aggbox local start`` (H2, aggbox's
    bounded oplog) in a temporary ``AGGBOX_HOME``, deleted afterwards."""
    if server == "local" and not os.environ.get("AGGBOX_MONGODB_URI", "").strip():
        from aggbox.servers import persistent

        saved = os.environ.get("AGGBOX_HOME")
        os.environ["AGGBOX_HOME"] = tempfile.mkdtemp(prefix="aggbox-bench-home-")
        try:
            state, _started = persistent.start_persistent_mongodb()
            try:
                yield BenchMongo(state.uri, state.kind, state.pid)
            finally:
                persistent.stop_persistent_mongodb(delete_data=True)
        finally:
            if saved is None:
                os.environ.pop("AGGBOX_HOME", None)
            else:
                os.environ["AGGBOX_HOME"] = saved
        return
    with start_local_mongodb() as mem:
        yield BenchMongo(mem.uri, mem.kind, mem.pid)


def write_entries(db: Any, docs: list[str], n: int, tag: str) -> int:
    w = StoreWriter(db, registry, settings=AggboxSettings(database=db.name))
    msgs = [Message(message_id=f"{tag}-{d}", type="Emit", aggregate_type="Emitter",
                    aggregate_id=d, payload={"n": n}) for d in docs]
    return sum(len(o.emitted_ids) for o in w.process(msgs))


def producer_config(bootstrap: str) -> dict[str, Any]:
    """The Kafka producer settings the dispatcher's publisher uses (idempotent, acks=all)."""
    publisher = create_publisher(DispatcherSettings.load(
        publisher="kafka", kafka_bootstrap_servers=bootstrap, metrics_port=0))
    return dict(publisher.config)  # type: ignore[attr-defined]  # KafkaPublisher's


def spawn_dispatcher(mongo: BenchMongo, bootstrap: str, database: str, prefix: str,
                     log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``python -m aggbox.commands.dispatch`` on ``emitters`` with default settings but for
    the publisher, topic template, metrics port and ``extra``; output to ``log``."""
    env = {**os.environ, "AGGBOX_MONGODB_URI": mongo.uri, "AGGBOX_DATABASE": database}
    return subprocess.Popen(
        [sys.executable, "-m", "aggbox.commands.dispatch", "--log-level",
         os.environ.get("BENCH_DISPATCHER_LOG_LEVEL", "INFO"), "--collection", "emitters",
         "--publisher", "kafka", "--bootstrap-servers", bootstrap, "--topic-template",
         prefix + "-{aggregate_type}", "--metrics-port", "0", *extra],
        # Not the checkout as cwd: the code imported is the one on PYTHONPATH, else the
        # installed one (a run against another revision sets PYTHONPATH to its tree).
        cwd=log.parent, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def lease_owners(db: Any) -> dict[str, int]:
    """Partitions of ``emitters`` per owner whose heartbeat has not expired (a lease is
    live while its owner's heartbeat is: dispatcher/partlease.py)."""
    now, scope = datetime.now(UTC), f"{db.name}.emitters"
    live = {m["member"] for m in db.aggbox_dispatcher_members.find(
        {"scope": scope, "expires_at": {"$gt": now}}, {"member": 1})}
    owners: dict[str, int] = {}
    for d in db.aggbox_dispatcher_partitions.find(
            {"scope": scope, "owner": {"$in": sorted(live)}}, {"owner": 1}):
        owners[d["owner"]] = owners.get(d["owner"], 0) + 1
    return owners


def wait_for_leases(db: Any, expected: dict[str, int], procs: list[subprocess.Popen[bytes]],
                    log: Path, timeout: float = 60.0) -> float:
    """Until the partition leases are held as ``expected`` (owner → count; empty: any owner
    holds one); returns the seconds it took."""
    t = time.monotonic()
    while True:
        owners = lease_owners(db)
        if (owners == expected) if expected else owners:
            return time.monotonic() - t
        if time.monotonic() - t > timeout or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"dispatcher(s) did not take their partitions (held: "
                               f"{owners}, wanted {expected or 'any'}); log: {log}")
        time.sleep(0.05)


def outbox_left(db: Any) -> int:
    return int(db.emitters.count_documents({"outbox.0": {"$exists": True}}))


def wait_drained(db: Any, procs: list[subprocess.Popen[bytes]], log: Path,
                 timeout: float = 300.0, every: float = 0.1) -> float:
    """Until no document has a pending entry; returns time.time() when seen empty."""
    deadline = time.monotonic() + timeout
    while outbox_left(db):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"outbox not drained ({outbox_left(db)} documents left); "
                               f"log: {log}")
        time.sleep(every)
    return time.time()


def from_beginning(bootstrap: str, topic: str) -> Any:
    """A consumer assigned to every partition of ``topic`` from its first offset."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False})
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    return c
