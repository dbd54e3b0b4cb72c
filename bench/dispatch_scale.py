"""Dispatcher benchmark, phase (d): the same backlog drained by one dispatcher process, then
by two (bench/dispatch.py's docstring says how the clock and the CPU are taken)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from common import cpu_ticks, process_cpu_s
from dispatch_common import (
    from_beginning,
    lease_owners,
    local_mongo,
    registry,
    spawn_dispatcher,
    wait_drained,
    wait_for_leases,
    write_entries,
)
from pymongo import MongoClient

from aggbox.servers import LocalKafka, create_topic
from aggregates import AggboxSettings, StoreWriter
from aggregates.core.partitions import PARTITIONS

# (d): the instances are frozen (SIGSTOP) while the backlog is written; their partition
# leases must outlive that.
SCALE_LEASE_TTL_S = 30


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
