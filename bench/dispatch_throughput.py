"""Dispatcher benchmark, phases (a) and (b): the dispatcher draining a backlog to Kafka in
this process vs a raw confluent-kafka produce of the very same records (bench/dispatch.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from common import cpu_since, cpu_ticks, process_cpu_s
from dispatch_common import BenchMongo, producer_config, registry, write_entries
from pymongo import MongoClient

from aggbox.servers import LocalKafka, create_topic
from aggregates import AggboxSettings, StoreWriter
from dispatcher import Dispatcher, DispatcherSettings, OutboundRecord, build_record


def throughput(mongo: BenchMongo, kafka: LocalKafka, n_docs: int, per: int,
               record_format: str = "aggbox") -> dict[str, Any]:
    client: MongoClient[dict[str, Any]] = MongoClient(mongo.uri, tz_aware=True)
    db = client["bench_dispatch"]
    client.drop_database(db.name)
    StoreWriter(db, registry, settings=AggboxSettings(database=db.name)).ensure_indexes()
    prefix = "bench" + uuid.uuid4().hex[:6]
    # Warm up mongo-java-server (a JVM: its first thousands of operations run interpreted)
    # and the dispatcher's code paths on other documents, as bench/writer.py does; the
    # timed run below then measures steady-state throughput, like the raw produce.
    warm_docs = [f"warm-{i:06d}" for i in range(max(1, n_docs // 4))]
    write_entries(db, warm_docs, per, "warm")
    create_topic(kafka.bootstrap_servers, f"{prefix}-warm-Emitter", partitions=6)
    warm = DispatcherSettings.load(
        collections=["emitters"], publisher="kafka",
        kafka_bootstrap_servers=kafka.bootstrap_servers,
        topic_template=prefix + "-warm-{aggregate_type}", metrics_port=0)
    assert asyncio.run(Dispatcher(warm, store=AggboxSettings(
        mongodb_uri=mongo.uri, database=db.name)).run(once=True)) == 0
    docs = [f"agg-{i:06d}" for i in range(n_docs)]
    t = time.perf_counter()
    total = write_entries(db, docs, per, "tp")
    print(f"  wrote {total} entries in {n_docs} documents ({time.perf_counter() - t:.1f} s)")
    topic_a, topic_b = f"{prefix}-Emitter", f"{prefix}raw-Emitter"
    for name in (topic_a, topic_b):
        create_topic(kafka.bootstrap_servers, name, partitions=6)
    # (b)'s input: the very records the dispatcher will send, built before it runs.
    records: list[OutboundRecord] = [
        build_record(e, collection="emitters", document_id=d["_id"], source_type="Emitter",
                     topic_template=prefix + "raw-{aggregate_type}")
        for d in db.emitters.find({}, {"outbox": 1}) for e in d["outbox"]]
    settings = DispatcherSettings.load(
        collections=["emitters"], publisher="kafka",
        kafka_bootstrap_servers=kafka.bootstrap_servers, topic_template=prefix +
        "-{aggregate_type}", metrics_port=0, record_format=record_format)
    store = AggboxSettings(mongodb_uri=mongo.uri, database=db.name)
    d = Dispatcher(settings, store=store)
    servers = {"mongo": mongo.pid,
               "kafka": getattr(getattr(kafka, "_process", None), "pid", None)}
    ticks = {k: cpu_ticks(v) for k, v in servers.items()}
    cpu = process_cpu_s()
    t = time.perf_counter()
    assert asyncio.run(d.run(once=True)) == 0
    t_dispatch = time.perf_counter() - t
    cpu_dispatch = process_cpu_s() - cpu
    servers_dispatch = cpu_since(servers, ticks)
    left = sum(len(x.get("outbox") or []) for x in db.emitters.find({}, {"outbox": 1}))
    assert left == 0, f"{left} entries left"
    published = d.workers[0].stats.published
    assert published == total, (published, total)
    ticks = {k: cpu_ticks(v) for k, v in servers.items()}
    cpu = process_cpu_s()
    t_raw = raw_produce(kafka.bootstrap_servers, records)
    cpu_raw = process_cpu_s() - cpu
    servers_raw = cpu_since(servers, ticks)
    client.close()
    out = {
        "entries": total, "documents": n_docs, "per_document": per,
        "dispatch_s": round(t_dispatch, 3), "dispatch_per_s": round(total / t_dispatch),
        "raw_produce_s": round(t_raw, 3), "raw_produce_per_s": round(total / t_raw),
        "dispatch_vs_raw_produce": round(t_raw / t_dispatch, 3),
        # CPU of this process (getrusage: Python and librdkafka's threads) per entry.
        "python_cpu_us_per_msg": round(cpu_dispatch / total * 1e6, 2),
        "raw_produce_cpu_us_per_msg": round(cpu_raw / total * 1e6, 2),
        # CPU seconds of the MongoDB server and the Kafka broker during (a) and during (b):
        # on 2 shared cores, what the dispatcher's own process does not use.
        "dispatch_server_cpu_s": servers_dispatch, "raw_produce_server_cpu_s": servers_raw,
        "dispatch_cpu_s": round(cpu_dispatch, 2), "raw_produce_cpu_s": round(cpu_raw, 2),
    }
    print(f"  (a) dispatcher ({record_format}): {total} entries in {t_dispatch:.2f} s = "
          f"{out['dispatch_per_s']:,}/s")
    print(f"  (b) raw produce: {total} records in {t_raw:.2f} s = {out['raw_produce_per_s']:,}/s")
    print(f"  CPU of this process per entry: dispatcher {out['python_cpu_us_per_msg']} µs, "
          f"raw produce {out['raw_produce_cpu_us_per_msg']} µs")
    print(f"  CPU s of the servers: during (a) {servers_dispatch}, during (b) {servers_raw}")
    return out


def warm_up(bootstrap: str) -> None:
    """One idempotent produce, so the broker's coordinator is loaded before timing."""
    from confluent_kafka import Producer

    p = Producer(producer_config(bootstrap))
    p.produce("aggbox-bench-warmup", b"x")
    p.flush(60)


def raw_produce(bootstrap: str, records: list[OutboundRecord]) -> float:
    from confluent_kafka import Producer

    p = Producer(producer_config(bootstrap))
    errors: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    t = time.perf_counter()
    for r in records:
        headers = [(k, v.encode()) for k, v in r.headers.items()]
        while True:
            try:
                p.produce(r.topic, value=r.value, key=r.key.encode(), headers=headers,
                          on_delivery=report)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    p.flush(60)
    dt = time.perf_counter() - t
    assert not errors, errors[:3]
    return dt
