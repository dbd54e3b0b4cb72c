"""The dispatcher with the real Kafka broker: ordering and headers, kill -9 at the worst
moments, partitions shared by several processes through kill -9, a join and a graceful
stop, a broker outage, permanent rejections.

Delivery is always checked from the consumer side: every emitted entry arrives at least
once, duplicates carry identical ids, and per aggregate the first occurrences are in
emission order."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from aggbox.servers import LocalKafka, LocalMongo, create_topic
from aggregates import AggboxSettings, Message, StoreWriter, parse_fence
from aggregates.core.partitions import PARTITIONS, partition_of
from aggregates.ops import DeadLetterStore
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from dispatcher.leases.balance import fair
from dispatcher.publishers.kafka import KafkaPublisher
from dispatcher.publishers.record import H_FENCE, HEADER_NAMES
from tests.dispatcher.helpers import (
    check_delivery,
    emit,
    merge,
    pending_entries,
    run_while,
    spawn,
    wait_for,
    wait_sync,
)

pytestmark = [pytest.mark.mongo, pytest.mark.kafka]

Consumed = tuple[str, str, int]


@pytest.fixture
def topic(kafka_server: LocalKafka) -> str:
    """A fresh 3-partition topic; the dispatcher's template renders to it."""
    prefix = "t" + uuid.uuid4().hex[:10]
    create_topic(kafka_server.bootstrap_servers, f"{prefix}-Emitter", partitions=3)
    return prefix


def template(prefix: str) -> str:
    return prefix + "-{aggregate_type}"


def consume(bootstrap: str, topic: str, expected: set[str], *, timeout: float = 60.0,
            grace: float = 1.0) -> list[tuple[Consumed, Any]]:
    """Read ``topic`` from the beginning until every expected id was seen (plus ``grace``
    seconds for late duplicates). Returns ((aggregate, id, seq), message) in order."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        out: list[tuple[Consumed, Any]] = []
        seen: set[str] = set()
        deadline = time.monotonic() + timeout
        complete_at: float | None = None
        while time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None or msg.error():
                if complete_at is not None and time.monotonic() - complete_at >= grace:
                    break
                continue
            h = _headers(msg)
            out.append(((h["source_id"], h["message_id"], int(h["source_seq"])), msg))
            seen.add(h["message_id"])
            if complete_at is None and expected <= seen:
                complete_at = time.monotonic()
        return out
    finally:
        c.close()


def _headers(msg: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in (msg.headers() or [])}


def delivered(bootstrap: str, prefix: str, emitted: dict[str, list[str]]) -> dict[str, int]:
    expected = {m for ids in emitted.values() for m in ids}
    got = consume(bootstrap, f"{prefix}-Emitter", expected)
    return check_delivery([c for c, _ in got], emitted)


def settings(prefix: str, kafka: LocalKafka, **over: Any) -> DispatcherSettings:
    base: dict[str, Any] = dict(
        collections=["emitters"], publisher="kafka",
        kafka_bootstrap_servers=kafka.bootstrap_servers, topic_template=template(prefix),
        metrics_port=0, pacing_ms=10, lease_ttl_s=3, backoff_initial_ms=100,
        backoff_max_ms=2000, batch_size=20, max_batch_records=50)
    base.update(over)
    return DispatcherSettings.load(**base)


def cli(prefix: str, kafka: LocalKafka, *extra: str) -> list[str]:
    return ["--collection", "emitters", "--publisher", "kafka",
            "--bootstrap-servers", kafka.bootstrap_servers, "--topic-template",
            template(prefix), "--metrics-port", "0", "--pacing-ms", "10", "--batch-size", "10",
            "--max-batch-records", "10", "--lease-ttl", "2", *extra]


def docs(n: int, prefix: str = "a") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(n)]


def test_records_are_keyed_ordered_and_carry_the_headers(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        kafka_server: LocalKafka, topic: str) -> None:
    d = Dispatcher(settings(topic, kafka_server), store=store)
    rounds: list[dict[str, list[str]]] = []

    async def body() -> None:
        for _ in range(4):
            rounds.append(await asyncio.to_thread(emit, writer, docs(10), n=3, to=True))
        await wait_for(lambda: pending_entries(ddb) == 0, 60, "drain")

    asyncio.run(run_while(d, body))
    emitted = merge(*rounds)
    got = consume(kafka_server.bootstrap_servers, f"{topic}-Emitter",
                  {m for ids in emitted.values() for m in ids})
    assert check_delivery([c for c, _ in got], emitted)["duplicates"] == 0
    for (agg, mid, seq), msg in got:
        assert msg.key().decode() == agg  # keyed by the emitting aggregate
        headers = _headers(msg)
        assert set(HEADER_NAMES) <= set(headers)
        m = Message.from_dict(json.loads(msg.value()))  # a valid input envelope
        assert m.message_id == mid and m.source is not None and m.source.seq == seq
        assert (m.aggregate_type, m.aggregate_id) == ("Target", f"t-{agg}")  # addressed
        assert headers["aggregate_id"] == f"t-{agg}" and headers["type"] == "Tick"
        assert headers["causation_id"] == m.causation_id
    partitions = {msg.partition() for _, msg in got}
    assert len(partitions) > 1  # keys spread, order still holds per aggregate


@pytest.mark.parametrize("fault", ["after_publish:kill@2", "after_pull:kill@3"])
def test_kill_9_between_publish_pull_and_checkpoint_loses_nothing(
        fault: str, writer: StoreWriter, ddb: Database[Any], dmongo: LocalMongo,
        kafka_server: LocalKafka, topic: str, tmp_path: Path) -> None:
    log = tmp_path / "dispatcher.log"
    rounds: list[dict[str, list[str]]] = []
    if fault.startswith("after_publish"):
        rounds.append(emit(writer, docs(20), n=5))  # swept at start-up in several batches
    proc = spawn(cli(topic, kafka_server, "--instance-id", "victim"), mongodb_uri=dmongo.uri,
                 database=ddb.name, log=log, fault=fault)
    try:
        if fault.startswith("after_pull"):
            # Written while the dispatcher follows the stream: batches pulled, then
            # checkpointed — it dies between the two.
            wait_sync(lambda: ddb.aggbox_dispatcher_partitions.count_documents(
                {"owner": "victim"}) == PARTITIONS, 30, "every partition")
            for _ in range(8):
                if proc.poll() is not None:
                    break
                rounds.append(emit(writer, docs(4), n=3))
                time.sleep(0.15)
        assert proc.wait(60) == -signal.SIGKILL, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "fault injection: kill" in log.read_text()
    rounds.append(emit(writer, docs(3, prefix="b"), n=2))  # written while it is dead
    again = spawn(cli(topic, kafka_server, "--once"), mongodb_uri=dmongo.uri,
                  database=ddb.name, log=log)
    assert again.wait(120) == 0, log.read_text()
    assert pending_entries(ddb) == 0
    counts = delivered(kafka_server.bootstrap_servers, topic, merge(*rounds))
    if fault.startswith("after_publish"):
        assert counts["duplicates"] >= 1  # the acknowledged-but-unpulled batch came again


def _owners(ddb: Database[Any]) -> dict[str, int]:
    """Live partition leases per instance."""
    now, scope = datetime.now(UTC), f"{ddb.name}.emitters"
    # A lease is live while its owner's heartbeat is (dispatcher/leases/partlease.py).
    live = [m["member"] for m in ddb.aggbox_dispatcher_members.find(
        {"scope": scope, "expires_at": {"$gt": now}})]
    return dict(Counter(d["owner"] for d in ddb.aggbox_dispatcher_partitions.find(
        {"scope": scope, "owner": {"$in": live}})))


def _evenly_spread(ddb: Database[Any], instances: set[str]) -> bool:
    owners = _owners(ddb)
    return set(owners) == instances and fair(owners, PARTITIONS)


def test_instances_share_partitions_through_kill_join_and_graceful_stop(
        writer: StoreWriter, ddb: Database[Any], dmongo: LocalMongo,
        kafka_server: LocalKafka, topic: str, tmp_path: Path) -> None:
    """Three instances under continuous writes; one is killed (-9), a fourth joins, one stops
    gracefully. Every entry arrives, a republish carries the same id, per aggregate the
    topic never goes backwards except to republish entries of the killed instance's
    partitions, and the partitions end evenly spread."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    rounds: list[dict[str, list[str]]] = []
    stop_writing = threading.Event()

    def start(name: str) -> None:
        procs[name] = spawn(cli(topic, kafka_server, "--instance-id", name,
                                "--takeover-grace", "0.5"),
                            mongodb_uri=dmongo.uri, database=ddb.name,
                            log=tmp_path / f"{name}.log")

    def logs() -> str:
        return "\n".join(f"--- {n}\n" + (tmp_path / f"{n}.log").read_text() for n in procs)

    def write_continuously() -> None:
        while not stop_writing.is_set():
            rounds.append(emit(writer, docs(40), n=2))
            time.sleep(0.05)

    try:
        for name in ("A", "B", "C"):
            start(name)
        wait_sync(lambda: _evenly_spread(ddb, {"A", "B", "C"}), 60, "A, B, C to share")
        writer_thread = threading.Thread(target=write_continuously)
        writer_thread.start()
        def more_rounds(k: int) -> None:  # the writer has written k more rounds
            n = len(rounds)
            wait_sync(lambda: len(rounds) >= n + k, 60, f"{k} more rounds written")

        try:
            more_rounds(10)
            killed = {d["partition"] for d in ddb.aggbox_dispatcher_partitions.find(
                {"scope": f"{ddb.name}.emitters", "owner": "B"})}
            procs["B"].kill()  # kill -9: no release, its leases must expire
            assert procs["B"].wait(10) == -signal.SIGKILL
            start("D")
            wait_sync(lambda: _evenly_spread(ddb, {"A", "C", "D"}), 60,
                      "A, C, D to share after B's leases expired")
            more_rounds(5)
            procs["C"].send_signal(signal.SIGTERM)
            assert procs["C"].wait(30) == 0, logs()
            wait_sync(lambda: _evenly_spread(ddb, {"A", "D"}), 60, "A and D to share")
            more_rounds(5)
        finally:
            stop_writing.set()
            writer_thread.join(60)
        wait_sync(lambda: pending_entries(ddb) == 0, 60, "the outboxes to empty")
        assert _evenly_spread(ddb, {"A", "D"})
        for name in ("A", "D"):
            procs[name].send_signal(signal.SIGTERM)
            assert procs[name].wait(30) == 0, logs()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    emitted = merge(*rounds)
    expected = {m for ids in emitted.values() for m in ids}
    got = consume(kafka_server.bootstrap_servers, f"{topic}-Emitter", expected)
    check_delivery([c for c, _ in got], emitted)  # all there, first copies in order
    id_of: dict[tuple[str, int], str] = {}
    newest: dict[str, int] = {}
    fences: dict[str, int] = {}
    scope = (ddb.name, "emitters")
    for (agg, mid, seq), msg in got:
        assert id_of.setdefault((agg, seq), mid) == mid  # a republish has the same id
        # The lease epoch in the fence header never goes back for one aggregate: no record
        # of a previous holder arrived after one of the next holder.
        fence = parse_fence(_headers(msg)[H_FENCE])
        epoch = fence.epoch
        assert (fence.database, fence.collection) == scope, fence
        assert fence.partition == partition_of(agg) and epoch >= fences.get(agg, 0), (agg, epoch)
        fences[agg] = epoch
        if seq < newest.get(agg, 0):
            # Backwards only to republish what the killed instance had published but not
            # yet pulled, in the partitions it held.
            assert partition_of(agg) in killed, (agg, seq, newest[agg])
        newest[agg] = max(newest.get(agg, 0), seq)
    assert "Traceback" not in logs()


def test_broker_down_for_30s_then_back_delivers_everything(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        kafka_server: LocalKafka, topic: str) -> None:
    d = Dispatcher(settings(topic, kafka_server, kafka_delivery_timeout_s=4,
                            backoff_initial_ms=250, backoff_max_ms=3000), store=store)
    rounds: list[dict[str, list[str]]] = []

    async def body() -> None:
        rounds.append(await asyncio.to_thread(emit, writer, docs(5), n=2))
        await wait_for(lambda: pending_entries(ddb) == 0, 30, "delivery before the outage")
        await asyncio.to_thread(kafka_server.stop, keep_data=True)
        try:
            rounds.append(await asyncio.to_thread(emit, writer, docs(5), n=3))
            stopped_at = time.monotonic()
            while time.monotonic() - stopped_at < 30:
                assert pending_entries(ddb) == 15  # nothing pulled while the broker is down
                await asyncio.sleep(1)
        finally:
            await asyncio.to_thread(kafka_server.start)
        await wait_for(lambda: pending_entries(ddb) == 0, 60, "delivery after the outage")

    asyncio.run(run_while(d, body))
    w = d.workers[0]
    assert w.stats.backoffs >= 2  # failed batches were retried after pauses
    assert w.stats.backoffs <= 20  # … not in a loop
    delivered(kafka_server.bootstrap_servers, topic, merge(*rounds))


def test_too_large_and_invalid_topic_are_dead_lettered_and_unblock_the_aggregate(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        kafka_server: LocalKafka, topic: str) -> None:
    ok1 = emit(writer, ["big", "bad"], n=1)
    huge = emit(writer, ["big"], n=1, size=1_200_000)  # above the broker's 1 MiB
    invalid = emit(writer, ["bad"], n=1, topic="not a topic!")
    ok2 = emit(writer, ["big", "bad"], n=2)
    d = Dispatcher(settings(topic, kafka_server), store=store)
    assert asyncio.run(d.run(once=True)) == 0
    assert pending_entries(ddb) == 0
    good = merge(ok1, ok2)
    delivered(kafka_server.bootstrap_servers, topic, good)
    letters = {dl["message_id"]: dl for dl in DeadLetterStore(
        ddb, collection=store.dead_letter_collection).list()}
    assert letters[huge["big"][0]]["reason"] == "message_too_large"
    assert letters[invalid["bad"][0]]["reason"] == "invalid_topic"
    assert "not a topic!" in letters[invalid["bad"][0]]["error"]
    assert len(letters) == 2
    assert d.metrics.registry.get_sample_value(
        "aggbox_dispatcher_failed_total", {"collection": "emitters", "kind": "permanent"}) == 2


def test_kafka_publisher_reports_each_record(kafka_server: LocalKafka, topic: str) -> None:
    from dispatcher.publishers.builder import build_record

    entries = [{"id": f"k-{i}", "type": "Tick", "payload": {"i": i}, "key": "x",
                "source": {"type": "Emitter", "id": "x", "seq": i + 1}} for i in range(3)]
    records = [build_record(e, collection="emitters", document_id="x", source_type="Emitter",
                            topic_template=template(topic)) for e in entries]
    pub = KafkaPublisher(kafka_server.bootstrap_servers, delivery_timeout_s=10)

    async def go() -> list[str]:
        await pub.start()
        try:
            return [r.status for r in await pub.publish(records)]
        finally:
            await pub.close()

    assert asyncio.run(go()) == ["ok", "ok", "ok"]
