"""Dispatcher benchmark: local MongoDB (or AGGBOX_MONGODB_URI) and a local Kafka broker,
one run.

(a) dispatcher throughput: N documents × k pending entries (written by the StoreWriter),
    drained to Kafka by ``Dispatcher.run(once=True)`` in this process;
(b) raw confluent-kafka produce of the same records (same value, key, headers, producer
    settings: idempotent, acks=all) from one process — the floor;
(c) commit → publish latency at a steady rate (default 1,000 entries/s), the dispatcher
    running as its own process (``python -m aggbox.commands.dispatch``) with default
    settings, in stream mode and in polling mode. "Publish" is the broker's LogAppendTime of
    the record; "commit" the entry's ``created_at`` (taken by the writer just before its write).
(d) scale-out: the same backlog (``--scale-docs`` × ``--scale-per`` entries, written by the
    StoreWriter) drained by ONE dispatcher process, then — on a fresh server, database and
    topic — by TWO processes (default settings but ``--instance-id``, ``--lease-ttl 30``, the
    publisher and topic). The processes are started on an empty collection first; only when
    the partition leases are split evenly (1: 256, 2: 128 each, read from
    ``aggbox_dispatcher_partitions``) and a warm-up backlog (a quarter of the size) is drained
    are they frozen (SIGSTOP), the backlog written, and released (SIGCONT): the clock runs
    from the release to the broker LogAppendTime of the last record, so neither the
    hand-over nor the write is timed. CPU seconds (``/proc/<pid>/stat`` utime+stime) of each
    instance, of the MongoDB server, of the Kafka broker and of this process are taken over
    release → outbox empty: on a 2-core machine the ratio is bounded by CPU, not by the
    dispatcher's design; these show where the time goes. ``--skip-scale`` leaves (d) out.

Last line of output is JSON: ``dispatch_vs_raw_produce`` (throughput (a)/(b)),
``latency_p50_ms``, ``latency_p99_ms`` (stream mode), ``poll_latency_p50_ms``,
``poll_latency_p99_ms``, ``python_cpu_us_per_msg`` (CPU-µs per entry of this process —
Python and librdkafka's threads, from getrusage — during (a); ``raw_produce_cpu_us_per_msg``
the same for (b)), ``scale_2_vs_1`` (entries/s of (d) with 2 instances ÷ with 1),
``scale_entries_per_s_1``, ``scale_entries_per_s_2``, ``scale_cpu_s_per_instance`` (CPU
seconds of each of the 2 instances during (d)), and the raw figures.

Usage: python bench/dispatcher.py [--docs 2000] [--per 10] [--rate 1000] [--seconds 8]
       [--scale-docs 2000] [--scale-per 10] [--skip-scale]
       python bench/dispatcher.py --only formats [--docs 2000] [--per 10]
           # (a) with record_format aggbox and cloudevents, alternating, twice each
"""
# ruff: noqa: E402  (the path fix below must precede the project imports)

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's directory comes first on sys.path and its name would shadow
# the ``dispatcher`` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]

import argparse
import asyncio
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from pymongo import MongoClient

from aggbox.servers import (
    LocalKafka,
    LocalMongo,
    create_topic,
    start_local_kafka,
    start_local_mongodb,
)
from aggregates import AggboxSettings, AggregateType, Emit, Handled, Message, Registry, StoreWriter
from aggregates.core.partitions import PARTITIONS
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from dispatcher.publishers.kafka import KafkaPublisher
from dispatcher.publishers.record import OutboundRecord, build_record

ROOT = Path(__file__).resolve().parents[1]
# (d): the instances are frozen (SIGSTOP) while the backlog is written; their partition
# leases must outlive that.
SCALE_LEASE_TTL_S = 30


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


@contextmanager
def local_mongo() -> Iterator[LocalMongo]:
    """A fresh local server (mongo-java-server scans its whole oplog per getMore, so each
    phase gets its own), or AGGBOX_MONGODB_URI when set."""
    with start_local_mongodb() as server:
        yield server


def write_entries(db: Any, docs: list[str], n: int, tag: str) -> int:
    w = StoreWriter(db, registry, settings=AggboxSettings(database=db.name))
    msgs = [Message(message_id=f"{tag}-{d}", type="Emit", aggregate_type="Emitter",
                    aggregate_id=d, payload={"n": n}) for d in docs]
    return sum(len(o.emitted_ids) for o in w.process(msgs))


def producer_config(bootstrap: str) -> dict[str, Any]:
    return {k: v for k, v in KafkaPublisher(bootstrap).config.items()}


def process_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def throughput(mongo: LocalMongo, kafka: LocalKafka, n_docs: int, per: int,
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
    servers_dispatch = _cpu_since(servers, ticks)
    left = sum(len(x.get("outbox") or []) for x in db.emitters.find({}, {"outbox": 1}))
    assert left == 0, f"{left} entries left"
    published = d.workers[0].stats.published
    assert published == total, (published, total)
    ticks = {k: cpu_ticks(v) for k, v in servers.items()}
    cpu = process_cpu_s()
    t_raw = raw_produce(kafka.bootstrap_servers, records)
    cpu_raw = process_cpu_s() - cpu
    servers_raw = _cpu_since(servers, ticks)
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


def latency(mongo: LocalMongo, kafka: LocalKafka, mode: str, rate: int, seconds: float,
            tmp: Path) -> dict[str, float]:
    client: MongoClient[dict[str, Any]] = MongoClient(mongo.uri, tz_aware=True)
    db = client["bench_latency_" + mode]
    client.drop_database(db.name)
    StoreWriter(db, registry, settings=AggboxSettings(database=db.name)).ensure_indexes()
    prefix = "lat" + uuid.uuid4().hex[:6]
    topic = f"{prefix}-Emitter"
    create_topic(kafka.bootstrap_servers, topic, partitions=3,
                 config={"message.timestamp.type": "LogAppendTime"})
    log = tmp / f"dispatcher-{mode}.log"
    proc = spawn_dispatcher(mongo, kafka.bootstrap_servers, db.name, prefix, log, "--mode",
                            mode)
    try:
        wait_for_leases(db, {}, [proc], log)
        time.sleep(1.0)
        # Steady load: every tick, `per_tick` documents emit one entry each.
        ticks_per_s = 20
        per_tick = max(1, rate // ticks_per_s)
        pool = [f"agg-{i:05d}" for i in range(per_tick * 10)]
        n_ticks = int(seconds * ticks_per_s)
        expected = n_ticks * per_tick
        result: dict[str, Any] = {}
        consumer = threading.Thread(target=consume_latencies,
                                    args=(kafka.bootstrap_servers, topic, expected, result))
        consumer.start()
        start = time.monotonic()
        for tick in range(n_ticks):
            docs = [pool[(tick * per_tick + j) % len(pool)] for j in range(per_tick)]
            write_entries(db, docs, 1, f"t{tick}")
            sleep = start + (tick + 1) / ticks_per_s - time.monotonic()
            if sleep > 0:
                time.sleep(sleep)
        achieved = expected / (time.monotonic() - start)
        consumer.join(120)
    finally:
        proc.terminate()
        proc.wait(60)
        client.close()
    lat = sorted(result.get("latencies_ms", []))
    if len(lat) < expected:
        raise RuntimeError(f"{mode}: consumed {len(lat)} of {expected}; log: {log}")
    q = statistics.quantiles(lat, n=100)
    out = {"p50_ms": round(q[49], 1), "p99_ms": round(q[98], 1), "max_ms": round(lat[-1], 1),
           "rate_per_s": round(achieved), "entries": expected}
    print(f"  (c) {mode}: {expected} entries at {achieved:.0f}/s: p50 {out['p50_ms']} ms, "
          f"p99 {out['p99_ms']} ms, max {out['max_ms']} ms")
    return out


def spawn_dispatcher(mongo: LocalMongo, bootstrap: str, database: str, prefix: str,
                     log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``python -m aggbox.commands.dispatch`` on ``emitters`` with default settings but for
    the publisher, topic template, metrics port and ``extra``; output to ``log``."""
    env = {**os.environ, "AGGBOX_MONGODB_URI": mongo.uri, "AGGBOX_DATABASE": database}
    return subprocess.Popen(
        [sys.executable, "-m", "aggbox.commands.dispatch", "--log-level",
         os.environ.get("BENCH_DISPATCHER_LOG_LEVEL", "INFO"), "--collection", "emitters",
         "--publisher", "kafka", "--bootstrap-servers", bootstrap, "--topic-template",
         prefix + "-{aggregate_type}", "--metrics-port", "0", *extra],
        cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def lease_owners(db: Any) -> dict[str, int]:
    """Partitions of ``emitters`` per owner whose heartbeat has not expired (a lease is
    live while its owner's heartbeat is: dispatcher/leases/partlease.py)."""
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


def cpu_ticks(pid: int | None) -> int | None:
    """utime + stime of ``pid`` in clock ticks (all its threads), from /proc/<pid>/stat."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # fields from the 3rd (state) on
    return int(fields[11]) + int(fields[12])


def _cpu_since(pids: dict[str, int | None], ticks: dict[str, int | None]
               ) -> dict[str, float | None]:
    """CPU seconds each process used since ``ticks`` (None when unknown)."""
    hz = os.sysconf("SC_CLK_TCK")
    out: dict[str, float | None] = {}
    for name, pid in pids.items():
        now, before = cpu_ticks(pid), ticks.get(name)
        out[name] = round((now - before) / hz, 2) if now is not None and before is not None \
            else None
    return out


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


def append_times(bootstrap: str, topic: str, expected: int) -> list[int]:
    """The broker LogAppendTime (ms) of every record of ``topic`` (``expected`` of them)."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

    c = from_beginning(bootstrap, topic)
    times: list[int] = []
    deadline = time.monotonic() + 120
    while len(times) < expected and time.monotonic() < deadline:
        for msg in c.consume(1000, 0.5):
            if msg.error():
                continue
            kind, ts_ms = msg.timestamp()
            assert kind == TIMESTAMP_LOG_APPEND_TIME, kind
            times.append(ts_ms)
    c.close()
    return times


def scale_run(kafka: LocalKafka, n_inst: int, n_docs: int, per: int,
              tmp: Path) -> dict[str, Any]:
    """(d) for ``n_inst`` dispatcher processes: returns entries/s and CPU seconds."""
    with local_mongo() as mongo:
        client: MongoClient[dict[str, Any]] = MongoClient(mongo.uri, tz_aware=True)
        db = client[f"bench_scale_{n_inst}"]
        client.drop_database(db.name)
        StoreWriter(db, registry, settings=AggboxSettings(database=db.name)).ensure_indexes()
        prefix = f"scale{n_inst}" + uuid.uuid4().hex[:6]
        topic = f"{prefix}-Emitter"
        create_topic(kafka.bootstrap_servers, topic, partitions=6,
                     config={"message.timestamp.type": "LogAppendTime"})
        ids = [f"{prefix}-{i}" for i in range(n_inst)]
        logs = [tmp / f"dispatcher-scale{n_inst}-{i}.log" for i in range(n_inst)]
        # The lease TTL bounds how long a partition of a stopped (SIGSTOP) instance stays
        # its own: it must outlast the write below, so it is not the 3 s of a quick test.
        procs = [spawn_dispatcher(mongo, kafka.bootstrap_servers, db.name, prefix, log,
                                  "--instance-id", iid,
                                  "--lease-ttl", str(SCALE_LEASE_TTL_S))
                 for iid, log in zip(ids, logs, strict=True)]
        try:
            share = PARTITIONS // n_inst
            split_s = wait_for_leases(db, dict.fromkeys(ids, share), procs, logs[0])
            print(f"  (d) {n_inst} instance(s): leases split ({share} partitions per "
                  f"instance) after {split_s:.1f} s")
            # Warm-up on other documents (JVM of the server, the instances' code paths).
            warm = [f"warm-{i:06d}" for i in range(max(1, n_docs // 4))]
            write_entries(db, warm, per, "warm")
            wait_drained(db, procs, logs[0])
            warm_records = len(warm) * per
            # Freeze the instances while the backlog is written, so that neither the write
            # nor its CPU is in the timed window and every entry is pending when it starts.
            for p in procs:
                p.send_signal(signal.SIGSTOP)
            docs = [f"agg-{i:06d}" for i in range(n_docs)]
            t = time.perf_counter()
            total = write_entries(db, docs, per, "scale")
            write_s = time.perf_counter() - t
            if any(lease_owners(db).get(i, 0) != share for i in ids):
                print(f"  (d) warning: leases changed during the write: {lease_owners(db)}")
            pids = {**{i: p.pid for i, p in zip(ids, procs, strict=True)},
                    "mongo": mongo.pid,
                    "kafka": getattr(getattr(kafka, "_process", None), "pid", None)}
            cpu0 = {k: cpu_ticks(v) for k, v in pids.items()}
            self0 = process_cpu_s()
            t0 = time.time()
            for p in procs:
                p.send_signal(signal.SIGCONT)
            t_empty = wait_drained(db, procs, logs[0])
            cpu1 = {k: cpu_ticks(v) for k, v in pids.items()}
            self_s = process_cpu_s() - self0
            wall = t_empty - t0
        finally:
            for p in procs:
                p.send_signal(signal.SIGCONT)
                p.terminate()
            codes = [p.wait(60) for p in procs]
            client.close()
    times = append_times(kafka.bootstrap_servers, topic, warm_records + total)
    if len(times) < warm_records + total:
        raise RuntimeError(f"(d): consumed {len(times)} of {warm_records + total}")
    times = sorted(times)[warm_records:]  # the warm-up's records come first
    last = times[-1] / 1000
    elapsed = last - t0  # release of the frozen instances → broker append of the last entry
    tick = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    for k in pids:
        before, after = cpu0[k], cpu1[k]
        if before is not None and after is not None:
            cpu[k] = (after - before) / tick
    inst_cpu = [round(cpu[i], 2) for i in ids]
    out: dict[str, Any] = {
        "instances": n_inst, "entries": total, "documents": n_docs, "per_document": per,
        "write_s": round(write_s, 2), "leases_split_s": round(split_s, 1),
        "elapsed_s": round(elapsed, 3), "entries_per_s": round(total / elapsed),
        "first_to_last_append_s": round((times[-1] - times[0]) / 1000, 3),
        "drained_s": round(wall, 3), "cpu_s_per_instance": inst_cpu,
        "cpu_ms_per_1000_entries_per_instance": [round(c / total * 1e6, 1) for c in inst_cpu],
        "cpu_s_instances": round(sum(inst_cpu), 2),
        "cpu_s_mongo": round(cpu["mongo"], 2) if "mongo" in cpu else None,
        "cpu_s_kafka": round(cpu["kafka"], 2) if "kafka" in cpu else None,
        "cpu_s_bench": round(self_s, 2), "exit_codes": codes,
    }
    busy = sum(cpu.values()) + self_s
    print(f"  (d) {n_inst} instance(s): {total} entries in {elapsed:.2f} s = "
          f"{out['entries_per_s']:,}/s (first→last append {out['first_to_last_append_s']} s, "
          f"outbox empty after {wall:.2f} s; backlog written in {write_s:.1f} s)")
    print(f"      CPU s over {wall:.2f} s (2 cores = {2 * wall:.2f} CPU-s): instances "
          f"{inst_cpu} ({out['cpu_ms_per_1000_entries_per_instance']} ms per 1,000 entries), "
          f"mongo {out['cpu_s_mongo']}, kafka {out['cpu_s_kafka']}, bench {out['cpu_s_bench']}"
          f" — total {busy:.2f}; dispatchers exited {codes}")
    return out


def scale(kafka: LocalKafka, n_docs: int, per: int, tmp: Path) -> dict[str, Any]:
    """(d): the same backlog drained by one instance, then by two."""
    one = scale_run(kafka, 1, n_docs, per, tmp)
    two = scale_run(kafka, 2, n_docs, per, tmp)
    ratio = round(two["entries_per_s"] / one["entries_per_s"], 3)
    print(f"  (d) scale 2 vs 1: {ratio}")
    return {"scale_2_vs_1": ratio, "one": one, "two": two}


def consume_latencies(bootstrap: str, topic: str, expected: int, out: dict[str, Any]) -> None:
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

    c = from_beginning(bootstrap, topic)
    seen: dict[str, float] = {}
    deadline = time.monotonic() + 120
    while len(seen) < expected and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is None or msg.error():
            continue
        kind, ts_ms = msg.timestamp()
        assert kind == TIMESTAMP_LOG_APPEND_TIME, kind
        env = json.loads(msg.value())
        created = datetime.fromisoformat(env["occurred_at"]).timestamp() * 1000
        seen.setdefault(env["message_id"], ts_ms - created)
    c.close()
    out["latencies_ms"] = list(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--per", type=int, default=10)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--scale-docs", type=int, default=2000, help="(d): documents")
    ap.add_argument("--scale-per", type=int, default=10, help="(d): entries per document")
    ap.add_argument("--skip-scale", action="store_true", help="leave (d) out")
    ap.add_argument("--only", choices=["throughput", "stream", "poll", "scale", "formats"],
                    default=None,
                    help="run one phase only (for profiling); formats: (a) in the aggbox "
                    "record format and as CloudEvents, twice each, alternating — "
                    "cloudevents_vs_aggbox_cpu is the ratio of the best CPU-µs per entry")
    args = ap.parse_args()
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"aggbox-bench-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs")
    nothing: dict[str, Any] = {}
    tp, stream, poll, sc = nothing, nothing, nothing, nothing
    with start_local_kafka() as kafka:
        warm_up(kafka.bootstrap_servers)
        if args.only in (None, "throughput"):
            with local_mongo() as mongo:
                print(f"mongo: {mongo.kind}, kafka {kafka.bootstrap_servers}")
                tp = throughput(mongo, kafka, args.docs, args.per)
        if args.only == "formats":
            runs: dict[str, list[dict[str, Any]]] = {"aggbox": [], "cloudevents": []}
            with local_mongo() as mongo:
                for _ in range(2):
                    for fmt in runs:
                        runs[fmt].append(throughput(mongo, kafka, args.docs, args.per, fmt))
            cpu = {f: min(r["python_cpu_us_per_msg"] for r in v) for f, v in runs.items()}
            rate = {f: max(r["dispatch_per_s"] for r in v) for f, v in runs.items()}
            print(json.dumps({"cloudevents_vs_aggbox_cpu": round(cpu["cloudevents"]
                                                                 / cpu["aggbox"], 3),
                              "cloudevents_vs_aggbox_rate": round(rate["cloudevents"]
                                                                  / rate["aggbox"], 3),
                              "cpu_us_per_entry": cpu, "entries_per_s": rate}))
            return
        if args.only in (None, "stream"):
            with local_mongo() as mongo:
                stream = latency(mongo, kafka, "stream", args.rate, args.seconds, tmp)
        if args.only in (None, "poll"):
            with local_mongo() as mongo:
                poll = latency(mongo, kafka, "poll", args.rate, args.seconds, tmp)
        if args.only == "scale" or (args.only is None and not args.skip_scale):
            sc = scale(kafka, args.scale_docs, args.scale_per, tmp)
    print(f"dispatcher logs: {tmp}")
    result = {
        "dispatch_vs_raw_produce": tp.get("dispatch_vs_raw_produce"),
        "latency_p50_ms": stream.get("p50_ms"),
        "latency_p99_ms": stream.get("p99_ms"),
        "poll_latency_p50_ms": poll.get("p50_ms"),
        "poll_latency_p99_ms": poll.get("p99_ms"),
        "python_cpu_us_per_msg": tp.get("python_cpu_us_per_msg"),
        "scale_2_vs_1": sc.get("scale_2_vs_1"),
        "scale_entries_per_s_1": sc.get("one", {}).get("entries_per_s"),
        "scale_entries_per_s_2": sc.get("two", {}).get("entries_per_s"),
        "scale_cpu_s_per_instance": sc.get("two", {}).get("cpu_s_per_instance"),
        "throughput": tp, "stream": stream, "poll": poll, "scale": sc,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
