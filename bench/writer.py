"""Store-writer benchmark against the local server (or AGGBOX_MONGODB_URI), one run, same data.

(a) the writer (find per chunk, handlers in memory, one unordered bulk of conditional
    updates); (b) a naive per-message loop (find, apply, conditional update — measured on a
    subset of aggregates, the rate is per message); (c) raw unconditional bulk upserts of the
    documents the writer produced (no read, no dedup, no condition): the floor of what any
    writer must pay to store them.

Last line of output is JSON. Usage: python bench/writer.py [--aggregates 20000] [--per 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
import uuid
from pathlib import Path
from typing import Any

from pymongo import MongoClient, ReplaceOne

from aggbox.servers import start_local_mongodb
from aggregates import AggboxSettings, Message, StoreWriter
from aggregates.document import snapshot_from_document
from aggregates.fold import fold
from aggregates.writer import build_update, utc_now
from examples.orders import customers, registry


def make_messages(n_aggs: int, per: int) -> list[Message]:
    out: list[Message] = []
    for a in range(n_aggs):
        cid = f"c{a}"
        out.append(Message.from_dict({
            "message_id": f"reg-{a}", "type": "CustomerRegistered", "aggregate_type": "Customer",
            "aggregate_id": cid, "payload": {"name": f"Customer {a}", "credit_limit": 1000},
            "occurred_at": "2026-01-01T00:00:00Z"}))
        for k in range(per - 1):
            out.append(Message.from_dict({
                "message_id": f"o-{a}-{k}", "type": "OrderCreated", "aggregate_type": "Customer",
                "aggregate_id": cid, "payload": {"order_id": f"o-{a}-{k}", "amount": 100 + k},
                "occurred_at": f"2026-01-01T00:00:{k + 1:02d}Z"}))
    return out


class CpuMeter:
    """CPU seconds used by this Python process and by the server process (when this run
    started it: /proc/<pid>/stat), to tell a CPU-bound run from an I/O-bound one."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid

    def _server(self) -> float:
        if self.server_pid is None:
            return float("nan")
        try:
            fields = Path(f"/proc/{self.server_pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def snapshot(self) -> tuple[float, float]:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime, self._server()

    def since(self, start: tuple[float, float]) -> str:
        py, srv = self.snapshot()
        return f"CPU: python {py - start[0]:.2f} s, server {srv - start[1]:.2f} s"


METER = CpuMeter(None)


def run_writer(db: Any, messages: list[Message]) -> float:
    w = StoreWriter(db, registry, settings=AggboxSettings())
    w.ensure_indexes()
    cpu = METER.snapshot()
    t = time.perf_counter()
    n = sum(1 for _ in w.process_iter(messages))
    dt = time.perf_counter() - t
    assert n == len(messages)
    st = w.stats
    print(f"    writer: {dt:.2f} s wall, {METER.since(cpu)}; phases (summed over threads): "
          f"read {st.read_s:.2f} s, fold {st.fold_s:.2f} s, write {st.write_s:.2f} s, "
          f"{st.writes} writes, {st.conflicts} conflicts")
    return dt


def run_naive(db: Any, messages: list[Message]) -> float:
    coll = db[customers.collection]
    StoreWriter(db, registry, settings=AggboxSettings()).ensure_indexes()
    t = time.perf_counter()
    for m in messages:
        doc = coll.find_one({"_id": m.aggregate_id})
        snap = snapshot_from_document(doc, m.aggregate_id)
        res = fold(customers, snap, [m], now=utc_now())
        if not res.changes.empty:
            op = build_update(customers, snap, res.changes)
            coll.update_one(op._filter, op._doc, upsert=True)
    return time.perf_counter() - t


def run_raw(db: Any, docs: list[dict[str, Any]]) -> float:
    coll = db["raw_customers"]
    cpu = METER.snapshot()
    t = time.perf_counter()
    for i in range(0, len(docs), 1000):
        coll.bulk_write([ReplaceOne({"_id": d["_id"]}, d, upsert=True)
                         for d in docs[i:i + 1000]], ordered=False)
    dt = time.perf_counter() - t
    print(f"    raw: {dt:.2f} s wall, {METER.since(cpu)}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--aggregates", type=int, default=20_000)
    ap.add_argument("--per", type=int, default=5, help="messages per aggregate")
    ap.add_argument("--naive-fraction", type=float, default=0.1,
                    help="share of the aggregates the slow naive loop processes")
    args = ap.parse_args()
    messages = make_messages(args.aggregates, args.per)
    n = len(messages)
    with start_local_mongodb() as server:
        METER.server_pid = server.pid
        client: MongoClient[dict[str, Any]] = MongoClient(server.uri)
        db = client[f"bench_writer_{uuid.uuid4().hex[:6]}"]
        try:
            # Warm the server up (mongo-java-server is a JVM: its first operations run
            # interpreted) with every kind of operation, on other collections.
            warm = make_messages(2000, args.per)
            run_writer(client[db.name + "_warm"], warm)
            run_raw(client[db.name + "_warm"], list(client[db.name + "_warm"].customers.find()))
            run_naive(client[db.name + "_warm2"], warm[:1000])
            t_writer = run_writer(db, messages)
            docs = list(db[customers.collection].find())
            t_raw = run_raw(db, docs)
            naive_msgs = messages[: int(n * args.naive_fraction)]
            t_naive = run_naive(client[db.name + "_naive"], naive_msgs)
        finally:
            client.drop_database(db.name)
            for suffix in ("_naive", "_warm", "_warm2"):
                client.drop_database(db.name + suffix)
        kind = server.kind
    writer_rate = n / t_writer
    raw_rate = n / t_raw
    naive_rate = len(naive_msgs) / t_naive
    print(f"server: {kind}; {args.aggregates} aggregates × {args.per} messages = {n}")
    print(f"machine: {platform.machine()} {platform.system()}, python {platform.python_version()}")
    print(f"(a) writer: {t_writer:8.2f} s  {writer_rate:10.0f} msgs/s")
    print(f"(b) naive:  {t_naive:8.2f} s  {naive_rate:10.0f} msgs/s  ({len(naive_msgs)} msgs)")
    print(f"(c) raw:    {t_raw:8.2f} s  {raw_rate:10.0f} msgs/s  ({len(docs)} documents)")
    print(json.dumps({
        "writer_msgs_per_s": round(writer_rate), "naive_msgs_per_s": round(naive_rate),
        "raw_msgs_per_s": round(raw_rate), "writer_vs_raw": round(writer_rate / raw_rate, 3),
        "writer_vs_naive": round(writer_rate / naive_rate, 2), "server": kind,
        "messages": n,
    }))


if __name__ == "__main__":
    main()
