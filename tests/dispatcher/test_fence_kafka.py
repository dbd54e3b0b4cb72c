"""The ``fence`` header on a topic shared by two collections, with a late copy actually
produced (docs/design.md "Fencing").

Two collections — one with a name full of the separators (``.``, ``/``, ``:``) — publish to
ONE topic (a fixed ``topic_template``). Instance A owns every partition and is stopped for
longer than its lease (fault ``before_publish:pause``) right after its last lease check,
with a batch in hand; B claims the partitions (epoch + 1) and publishes everything still in
the outboxes; A wakes up and sends its batch under the old epoch: late copies. A consumer
applying the documented rule over every record of the topic — per Kafka partition, per
(database, collection, partition), drop a record whose epoch is below the highest seen —
must end with every entry of both collections, and must have dropped the late copies, each
of which was also published under a higher epoch of the same lease."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections import defaultdict
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from aggbox.servers import LocalKafka, LocalMongo, create_topic
from aggregates import (
    AggboxSettings,
    AggregateType,
    Message,
    Registry,
    StoreWriter,
    parse_fence,
)
from aggregates.core.partitions import partition_of
from dispatcher.publishers.record import H_FENCE
from tests.dispatcher import domain
from tests.dispatcher.domain import Ticker
from tests.dispatcher.helpers import pending_entries, spawn, wait_sync
from tests.dispatcher.test_kafka import _headers, consume

pytestmark = [pytest.mark.mongo, pytest.mark.kafka]

#: a collection name a naive split on '.', '/' or ':' gets wrong
OTHER = "ticks.v2/eu:1"
others: AggregateType[Ticker] = AggregateType(
    "Other", state=Ticker, collection=OTHER, max_outbox=100_000)
others.handles("Emit")(domain.emit)
registry = Registry([domain.emitters, others])

TTL_S, GRACE_S = 2, 0.5
PAUSE_S = 14  # > TTL + grace + B's start-up and its publishing of every pending entry
_ids = count(1)


def emit(writer: StoreWriter, aggregate_type: str, docs: list[str], n: int
         ) -> dict[str, list[str]]:
    msgs = [Message(message_id=f"in-{aggregate_type}-{next(_ids)}", type="Emit",
                    aggregate_type=aggregate_type, aggregate_id=d, payload={"n": n})
            for d in docs]
    out: dict[str, list[str]] = defaultdict(list)
    for o in writer.process(msgs):
        assert o.outcome == "applied", o
        out[o.aggregate_id].extend(o.emitted_ids)
    return dict(out)


def cli(topic: str, kafka: LocalKafka, name: str) -> list[str]:
    return ["--collection", "emitters", "--collection", OTHER, "--publisher", "kafka",
            "--bootstrap-servers", kafka.bootstrap_servers, "--topic-template", topic,
            "--metrics-port", "0", "--pacing-ms", "10", "--batch-size", "10",
            "--max-batch-records", "10", "--lease-ttl", str(TTL_S),
            "--takeover-grace", str(GRACE_S), "--instance-id", name]


def test_late_copies_on_a_topic_shared_by_two_collections_are_told_apart(
        ddb: Database[Any], dmongo: LocalMongo, store: AggboxSettings,
        kafka_server: LocalKafka, tmp_path: Path) -> None:
    topic = "t" + uuid.uuid4().hex[:10] + "-shared"
    create_topic(kafka_server.bootstrap_servers, topic, partitions=3)
    writer = StoreWriter(ddb, registry, settings=store)
    writer.ensure_indexes()
    collections = {"Emitter": "emitters", "Other": OTHER}
    emitted: dict[str, set[str]] = {c: set() for c in collections.values()}

    def write(prefix: str, docs: int, n: int) -> None:
        for agg_type, coll in collections.items():
            ids = emit(writer, agg_type, [f"{prefix}{i:03d}" for i in range(docs)], n)
            emitted[coll].update(m for ms in ids.values() for m in ms)

    def pending() -> int:
        return sum(pending_entries(ddb, c) for c in collections.values())

    write("a", 30, 3)  # 180 entries: A is in the middle of its start-up sweeps at the pause
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def log(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text()

    def logs() -> str:
        return "\n".join(f"--- {n}\n{log(n)}" for n in procs)

    try:
        procs["A"] = spawn(cli(topic, kafka_server, "A"), mongodb_uri=dmongo.uri,
                           database=ddb.name, log=tmp_path / "A.log",
                           fault=f"before_publish:pause={PAUSE_S}@3")
        wait_sync(lambda: "fault injection: pause at before_publish" in log("A"), 60,
                  "A to stop with a batch in hand")
        procs["B"] = spawn(cli(topic, kafka_server, "B"), mongodb_uri=dmongo.uri,
                           database=ddb.name, log=tmp_path / "B.log")
        # B takes A's expired leases and publishes everything, A's batch included, while A
        # stands still — the late copies A then sends come after B's records.
        wait_sync(lambda: pending() == 0, PAUSE_S - 1, "B to empty the outboxes")
        assert "pause at before_publish ended" not in log("A"), logs()
        wait_sync(lambda: "pause at before_publish ended" in log("A"), 60, "A to wake up")
        for r in range(10):  # both instances publish afterwards: A rejoins, B hands over
            write(f"b{r}-", 5, 2)
            time.sleep(0.3)
        wait_sync(lambda: pending() == 0, 60, "the outboxes to empty")
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for name, p in procs.items():
            assert p.wait(30) == 0, (name, logs())
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    # A did not pull what it sent after its lease ended: it left it to the next owner.
    assert "left in the outbox" in log("A"), logs()
    assert "Traceback" not in logs()

    expected = emitted["emitters"] | emitted[OTHER]
    got = consume(kafka_server.bootstrap_servers, topic, expected, grace=2.0)

    # The documented rule, over every record of the topic in the order it was read (per
    # Kafka partition, offset order).
    highest: dict[tuple[int, tuple[str, str, int]], int] = {}
    kept: dict[str, set[str]] = defaultdict(set)
    late: list[tuple[str, tuple[str, str, int], int]] = []
    epochs: dict[tuple[tuple[str, str, int], str], set[int]] = defaultdict(set)
    for (agg, mid, _seq), msg in got:
        fence = parse_fence(_headers(msg)[H_FENCE])
        assert fence.database == ddb.name and fence.collection in emitted, fence
        assert fence.partition == partition_of(agg)
        epochs[fence.lease, mid].add(fence.epoch)
        key = (msg.partition(), fence.lease)
        if fence.epoch < highest.get(key, 0):
            late.append((mid, fence.lease, fence.epoch))  # a late copy: dropped
            continue
        highest[key] = fence.epoch
        kept[fence.collection].add(mid)

    for coll, ids in emitted.items():  # nothing lost, in either collection
        missing = ids - kept[coll]
        assert not missing, (coll, len(missing), sorted(missing)[:3])
    # The late copies were produced and recognised (A's batch, sent after B had published
    # everything: A's log says so above), each id also published under a higher epoch of
    # the same lease. A's epoch is 1 unless its lease rounds lapsed before the pause (a
    # loaded machine; it then rejoined under a new name and claimed again); an instance
    # whose rounds lapse later adds late copies of its own, which the rule covers too.
    assert late, "no late copy was produced"
    for mid, lease, epoch in late:
        assert max(epochs[lease, mid]) > epoch, (mid, lease, epochs[lease, mid])
    assert {lease[1] for _mid, lease, _e in late} <= set(emitted)
