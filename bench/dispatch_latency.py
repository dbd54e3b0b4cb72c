"""Dispatcher benchmark, phase (c): commit → publish latency at a steady rate, the
dispatcher running as its own process in stream or polling mode (bench/dispatch.py)."""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from common import cpu_since, cpu_ticks
from dispatch_common import (
    BenchMongo,
    from_beginning,
    registry,
    spawn_dispatcher,
    wait_for_leases,
    write_entries,
)
from pymongo import MongoClient

from aggbox.servers import LocalKafka, create_topic
from aggregates import AggboxSettings, StoreWriter


def latency(mongo: BenchMongo, kafka: LocalKafka, mode: str, rate: int, seconds: float,
            tmp: Path, warmup_s: float = 3.0) -> dict[str, Any]:
    """The steady load for ``warmup_s`` first (not counted: the server is a JVM, its first
    seconds under a new kind of load are spent compiling — CPU that is not the mode's),
    then ``seconds`` measured."""
    client: MongoClient[dict[str, Any]] = MongoClient(mongo.uri, tz_aware=True)
    db = client["bench_latency_" + mode]
    client.drop_database(db.name)
    StoreWriter(db, registry, settings=AggboxSettings(database=db.name)).ensure_indexes()
    prefix = "lat" + uuid.uuid4().hex[:6]
    topic = f"{prefix}-Emitter"
    create_topic(kafka.bootstrap_servers, topic, partitions=3,
                 config={"message.timestamp.type": "LogAppendTime"})
    log = tmp / f"dispatcher-{mode}-{prefix}.log"
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
        warm = time.monotonic()
        for tick in range(int(warmup_s * ticks_per_s)):
            docs = [pool[(tick * per_tick + j) % len(pool)] for j in range(per_tick)]
            write_entries(db, docs, 1, f"w{tick}")  # not measured (consume_latencies)
            sleep = warm + (tick + 1) / ticks_per_s - time.monotonic()
            if sleep > 0:
                time.sleep(sleep)
        # CPU seconds of the server, the broker and the dispatcher over the steady load: on
        # a 2-core machine the stream's server-side cost (mongo-java-server's updateLookup
        # scans the collection per update event) is what its latency waits for.
        pids = {"mongo": mongo.pid, "dispatcher": proc.pid,
                "kafka": getattr(getattr(kafka, "_process", None), "pid", None)}
        ticks = {k: cpu_ticks(v) for k, v in pids.items()}
        start = time.monotonic()
        writes_ms: list[float] = []
        for tick in range(n_ticks):
            docs = [pool[(tick * per_tick + j) % len(pool)] for j in range(per_tick)]
            t_write = time.monotonic()
            write_entries(db, docs, 1, f"t{tick}")
            writes_ms.append((time.monotonic() - t_write) * 1000)
            sleep = start + (tick + 1) / ticks_per_s - time.monotonic()
            if sleep > 0:
                time.sleep(sleep)
        achieved = expected / (time.monotonic() - start)
        consumer.join(120)
        cpu = cpu_since(pids, ticks)
    finally:
        proc.terminate()
        proc.wait(60)
        client.close()
    lat = sorted(result.get("latencies_ms", []))
    if len(lat) < expected:
        raise RuntimeError(f"{mode}: consumed {len(lat)} of {expected}; log: {log}")
    q = statistics.quantiles(lat, n=100)
    out = {"p50_ms": round(q[49], 1), "p99_ms": round(q[98], 1), "max_ms": round(lat[-1], 1),
           "rate_per_s": round(achieved), "entries": expected, "cpu_s": cpu,
           # the server's CPU per entry over the load and the drain: the writer's writes (the
           # same in both modes) plus what the dispatcher asks of it
           "mongo_cpu_us_per_entry": None if cpu.get("mongo") is None
           else round(cpu["mongo"] / expected * 1e6, 1),
           "dispatcher_cpu_us_per_entry": None if cpu.get("dispatcher") is None
           else round(cpu["dispatcher"] / expected * 1e6, 1),
           # the writer's own time per tick (its entries' created_at is taken at its start:
           # part of every entry's latency before the dispatcher can see it)
           "write_ms_p50": round(statistics.median(writes_ms), 1),
           "write_ms_p99": round(statistics.quantiles(writes_ms, n=100)[98], 1)
           if len(writes_ms) >= 2 else None}
    print(f"  (c) {mode}: {expected} entries at {achieved:.0f}/s: p50 {out['p50_ms']} ms, "
          f"p99 {out['p99_ms']} ms, max {out['max_ms']} ms; CPU s {cpu}; MongoDB "
          f"{out['mongo_cpu_us_per_entry']} µs per entry; a write of {per_tick} "
          f"p50 {out['write_ms_p50']} ms, p99 {out['write_ms_p99']} ms")
    return out


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
        if not str(env.get("causation_id", "")).startswith("t"):
            continue  # the warm-up's (its inputs are w<tick>-<doc>)
        created = datetime.fromisoformat(env["occurred_at"]).timestamp() * 1000
        seen.setdefault(env["message_id"], ts_ms - created)
    c.close()
    out["latencies_ms"] = list(seen.values())
