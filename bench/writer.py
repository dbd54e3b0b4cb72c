"""Store-writer benchmark against the local server (or AGGBOX_MONGODB_URI), one run, same data.

(a) the writer (find per chunk, handlers in memory, one unordered bulk of conditional
    updates); (b) a naive per-message loop (find, apply, conditional update — measured on a
    subset of aggregates, the rate is per message); (c) raw unconditional bulk upserts of the
    documents the writer produced (no read, no dedup, no condition): the floor of what any
    writer must pay to store them.

Last line of output is JSON: the ratios ``writer_vs_raw`` and ``writer_vs_naive``, and the
figures to steer by (bench/measure.py has the instruments):

- ``python_cpu_us_per_msg``: CPU-µs per message of this process (getrusage, all threads)
  during the writer run, the handlers' own CPU excluded;
- ``handler_cpu_us_per_msg``: the handlers' own CPU (thread CPU around each call of the
  registered handler functions), per message;
- ``server_ops_per_msg``: server operations the writer requested per message — write
  statements (each update/insert/delete in a bulk counts one) plus read commands — counted
  by a pymongo command listener; ``naive_server_ops_per_msg`` and ``raw_server_ops_per_msg``
  the same for (b) and (c).

Usage: python bench/writer.py [--aggregates 20000] [--per 5]
       python bench/writer.py --tracing [--aggregates 20000]
           # the writer with OpenTelemetry spans (SDK provider, batch span processor, an
           # exporter that counts) vs without a provider, same messages (each with a
           # sampled traceparent), alternating off / tracing="messages" / "chunks" /
           # "messages" with unsampled inputs, twice: ``tracing_*_vs_off`` are the ratios of
           # the best rates, with the best CPU-µs per message of each
       python bench/writer.py --instructions [--instr-sizes 2000,4000] [--instr-repeat 2]
           # instructions per message of each component of the writer's hot loop
           # (parse, handlers, dedup, outbox ids, fold, update, BSON, pymongo, the whole
           # writer), counted with valgrind's callgrind: bench/instructions.py
       python bench/writer.py --aggregates 5000 --profile 30 [--profile-clock wall]
           # cProfile of the writer, pipeline_depth=1 (all work on the main thread), by
           # wall time (default) or this thread's CPU time: top 30 entries
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import platform
import pstats
import time
import uuid
from typing import Any

import instructions
from common import pid_cpu_s, process_cpu_s
from instructions_writer import message_dicts
from measure import HandlerTimer, OpCounter, calibrate_timer
from pymongo import MongoClient, ReplaceOne

from aggbox.examples.orders import customers, registry
from aggbox.servers import start_local_mongodb
from aggregates import AggboxSettings, Message, StoreWriter
from aggregates.fold import fold
from aggregates.fold.document import snapshot_from_document
from aggregates.store.writer import build_update, utc_now


def make_messages(n_aggs: int, per: int) -> list[Message]:
    return [Message.from_dict(d) for d in message_dicts(n_aggs, per)]


class CpuMeter:
    """CPU seconds used by this Python process and by the server process (when this run
    started it: /proc/<pid>/stat), to tell a CPU-bound run from an I/O-bound one."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid

    def snapshot(self) -> tuple[float, float]:
        server = pid_cpu_s(self.server_pid)
        return process_cpu_s(), float("nan") if server is None else server

    def since(self, start: tuple[float, float]) -> str:
        py, srv = self.snapshot()
        return f"CPU: python {py - start[0]:.2f} s, server {srv - start[1]:.2f} s"


METER = CpuMeter(None)
#: The handlers of ``registry`` are wrapped with a thread-CPU timer (bench only).
HANDLERS = HandlerTimer()
#: CPU-ns per handler call the timer adds inside / outside the timed interval.
TIMER_INSIDE_NS, TIMER_OUTSIDE_NS = 0.0, 0.0
#: Listens to the bench's client: server operations requested during a timed run.
OPS = OpCounter()


class Counted:
    """CPU, handler CPU and server operations of one timed run."""

    def __enter__(self) -> Counted:
        self._h = HANDLERS.snapshot()
        self._ops = OPS.snapshot()
        OPS.active = True
        self._cpu = process_cpu_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu_s = process_cpu_s() - self._cpu
        OPS.active = False
        h = HANDLERS.snapshot()
        ops = OPS.snapshot()
        self.handler_calls = h[1] - self._h[1]
        # The timer's own cost (calibrated at start) is neither handler nor aggbox work.
        self.handler_s = max(0.0, (h[0] - self._h[0]) / 1e9
                             - self.handler_calls * TIMER_INSIDE_NS / 1e9)
        self.cpu_s -= self.handler_calls * (TIMER_INSIDE_NS + TIMER_OUTSIDE_NS) / 1e9
        self.writes = ops[0] - self._ops[0]
        self.reads = ops[1] - self._ops[1]

    def per_msg(self, n: int) -> dict[str, float]:
        return {"python_cpu_us_per_msg": round((self.cpu_s - self.handler_s) / n * 1e6, 2),
                "handler_cpu_us_per_msg": round(self.handler_s / n * 1e6, 2),
                "server_ops_per_msg": round((self.writes + self.reads) / n, 4),
                "server_writes_per_msg": round(self.writes / n, 4),
                "server_reads_per_msg": round(self.reads / n, 4)}


def run_writer(db: Any, messages: list[Message], *, depth: int | None = None,
               tracing: str = "messages") -> tuple[float, Counted]:
    settings = AggboxSettings(tracing=tracing, **({} if depth is None
                                                  else {"pipeline_depth": depth}))
    w = StoreWriter(db, registry, settings=settings)
    w.ensure_indexes()
    cpu = METER.snapshot()
    t = time.perf_counter()
    with Counted() as c:
        n = sum(1 for _ in w.process_iter(messages))
    dt = time.perf_counter() - t
    assert n == len(messages)
    st = w.stats
    print(f"    writer: {dt:.2f} s wall, {METER.since(cpu)} (handlers {c.handler_s:.2f} s in "
          f"{c.handler_calls} calls); phases (summed over threads): "
          f"read {st.read_s:.2f} s, fold {st.fold_s:.2f} s, write {st.write_s:.2f} s, "
          f"{st.writes} writes, {st.conflicts} conflicts; server: {c.writes} write "
          f"statements, {c.reads} read commands")
    return dt, c


def run_naive(db: Any, messages: list[Message]) -> tuple[float, Counted]:
    coll = db[customers.collection]
    StoreWriter(db, registry, settings=AggboxSettings()).ensure_indexes()
    t = time.perf_counter()
    with Counted() as c:
        for m in messages:
            doc = coll.find_one({"_id": m.aggregate_id})
            snap = snapshot_from_document(doc, m.aggregate_id)
            res = fold(customers, snap, [m], now=utc_now())
            if not res.changes.empty:
                coll.bulk_write([build_update(customers, snap, res.changes)])
    return time.perf_counter() - t, c


def run_raw(db: Any, docs: list[dict[str, Any]]) -> tuple[float, Counted]:
    coll = db["raw_customers"]
    cpu = METER.snapshot()
    t = time.perf_counter()
    with Counted() as c:
        for i in range(0, len(docs), 1000):
            coll.bulk_write([ReplaceOne({"_id": d["_id"]}, d, upsert=True)
                             for d in docs[i:i + 1000]], ordered=False)
    dt = time.perf_counter() - t
    print(f"    raw: {dt:.2f} s wall, {METER.since(cpu)}; server: {c.writes} write statements")
    return dt, c


def profile_writer(client: Any, db_name: str, messages: list[Message], top: int,
                   clock: str, dump: str | None = None) -> None:
    """cProfile of ``StoreWriter.process_iter`` with ``pipeline_depth=1`` (all the writer's
    work on this thread; handlers not wrapped with the bench's timer), after a warm-up run
    on other collections; top entries by tottime and by cumulative time. ``clock``: "cpu"
    (``time.thread_time``: this thread's CPU, waiting for the server costs nothing) or
    "wall" (cProfile's default). The profiler inflates per-call costs: read it for where
    the time goes, not for the totals."""
    run_writer(client[db_name + "_pwarm"], make_messages(2000, 5), depth=1)
    w = StoreWriter(client[db_name], registry, settings=AggboxSettings(pipeline_depth=1))
    w.ensure_indexes()
    prof = (cProfile.Profile(time.thread_time) if clock == "cpu" else cProfile.Profile())
    cpu = process_cpu_s()
    prof.enable()
    n = sum(1 for _ in w.process_iter(messages))
    prof.disable()
    cpu = process_cpu_s() - cpu
    if dump:
        prof.dump_stats(dump)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    print(out.getvalue())
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    print(out.getvalue())
    print(f"profiled ({clock} clock): {n} messages, {cpu:.2f} CPU-s under the profiler "
          f"({cpu / n * 1e6:.1f} µs per message, handlers included)")


def traced_messages(n_aggs: int, per: int, *, sampled: bool = True) -> list[Message]:
    """:func:`make_messages`, each with a ``traceparent`` (one trace per aggregate), sampled
    or not (flags 01 / 00)."""
    out = []
    flags = "01" if sampled else "00"
    for m in make_messages(n_aggs, per):
        trace = uuid.uuid5(uuid.NAMESPACE_URL, m.aggregate_id).hex
        span = uuid.uuid5(uuid.NAMESPACE_URL, m.message_id).hex[:16]
        out.append(dataclasses.replace(
            m, headers={"traceparent": f"00-{trace}-{span}-{flags}"}))
    return out


def tracing_compare(client: Any, db_name: str, messages: list[Message],
                    unsampled: list[Message], rounds: int = 2) -> None:
    """The writer without a tracer provider and with the SDK's (spans batched to an exporter
    that only counts them), alternating, on fresh collections each run."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Counting(SpanExporter):
        spans = 0

        def export(self, spans: Any) -> SpanExportResult:
            Counting.spans += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Counting(), max_queue_size=100_000))
    n = len(messages)
    # off: no provider; messages / chunks: the setting, sampled inputs; unsampled:
    # tracing = "messages" with inputs whose traceparent says not sampled.
    modes = ("off", "messages", "chunks", "unsampled")
    runs: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    run_writer(client[db_name + "_warm"], messages[:5000])
    try:
        for r in range(rounds):
            for mode in modes:
                trace._TRACER_PROVIDER = None if mode == "off" else provider
                print(f"  round {r + 1}, tracing {mode}:")
                dt, c = run_writer(client[f"{db_name}_{mode}{r}"],
                                   unsampled if mode == "unsampled" else messages,
                                   tracing="chunks" if mode == "chunks" else "messages")
                runs[mode].append((n / dt, (c.cpu_s - c.handler_s) / n * 1e6))
                provider.force_flush()
    finally:
        trace._TRACER_PROVIDER = None
        for name in client.list_database_names():
            if name.startswith(db_name):
                client.drop_database(name)
    best = {mode: max(r[0] for r in v) for mode, v in runs.items()}
    cpu = {mode: min(r[1] for r in v) for mode, v in runs.items()}
    for mode in modes:
        print(f"tracing {mode}: {best[mode]:.0f} msgs/s, {cpu[mode]:.1f} CPU-µs/msg")
    print(f"{Counting.spans} spans exported")
    print(json.dumps({
        "tracing_messages_vs_off": round(best["messages"] / best["off"], 3),
        "tracing_chunks_vs_off": round(best["chunks"] / best["off"], 3),
        "tracing_unsampled_vs_off": round(best["unsampled"] / best["off"], 3),
        **{f"{m}_msgs_per_s": round(best[m]) for m in modes},
        **{f"{m}_python_cpu_us_per_msg": round(cpu[m], 2) for m in modes},
        "spans_exported": Counting.spans, "messages": n}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--aggregates", type=int, default=20_000)
    ap.add_argument("--per", type=int, default=5, help="messages per aggregate")
    ap.add_argument("--naive-fraction", type=float, default=0.1,
                    help="share of the aggregates the slow naive loop processes")
    ap.add_argument("--profile", type=int, metavar="TOP", default=0,
                    help="instead of the benchmark: cProfile the writer (pipeline_depth=1) "
                         "and print the TOP entries by tottime and by cumulative time")
    ap.add_argument("--profile-clock", choices=["cpu", "wall"], default="wall",
                    help="the profiler's clock: wall (default; cheap to read) or this thread's CPU "
                         "time (a system call per event: inflates small calls several-fold)")
    ap.add_argument("--tracing", action="store_true",
                    help="instead of the benchmark: the writer with OpenTelemetry spans vs "
                         "without a tracer provider")
    ap.add_argument("--profile-out", metavar="FILE", default=None,
                    help="also write the profile's raw stats to FILE (pstats format)")
    instructions.add_arguments(ap)
    args = ap.parse_args()
    if args.instructions:
        with start_local_mongodb() as server:  # components pymongo and writer need one
            instructions.from_arguments("writer", args, server.uri)
        return
    global TIMER_INSIDE_NS, TIMER_OUTSIDE_NS
    TIMER_INSIDE_NS, TIMER_OUTSIDE_NS = calibrate_timer()
    print(f"handler timer overhead per call: {TIMER_INSIDE_NS / 1e3:.2f} µs inside, "
          f"{TIMER_OUTSIDE_NS / 1e3:.2f} µs outside the timed interval (subtracted)")
    messages = make_messages(args.aggregates, args.per)
    n = len(messages)
    with start_local_mongodb() as server:
        METER.server_pid = server.pid
        client: MongoClient[dict[str, Any]] = MongoClient(server.uri, event_listeners=[OPS])
        db = client[f"bench_writer_{uuid.uuid4().hex[:6]}"]
        if args.tracing:
            HANDLERS.install(registry)
            tracing_compare(client, db.name, traced_messages(args.aggregates, args.per),
                            traced_messages(args.aggregates, args.per, sampled=False))
            return
        if args.profile:
            try:
                profile_writer(client, db.name, messages, args.profile, args.profile_clock,
                               args.profile_out)
            finally:
                client.drop_database(db.name)
                client.drop_database(db.name + "_pwarm")
            return
        HANDLERS.install(registry)
        try:
            # Warm the server up (mongo-java-server is a JVM: its first operations run
            # interpreted) with every kind of operation, on other collections.
            warm = make_messages(2000, args.per)
            run_writer(client[db.name + "_warm"], warm)
            run_raw(client[db.name + "_warm"], list(client[db.name + "_warm"].customers.find()))
            run_naive(client[db.name + "_warm2"], warm[:1000])
            t_writer, c_writer = run_writer(db, messages)
            docs = list(db[customers.collection].find())
            t_raw, c_raw = run_raw(db, docs)
            naive_msgs = messages[: int(n * args.naive_fraction)]
            t_naive, c_naive = run_naive(client[db.name + "_naive"], naive_msgs)
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
        "writer_vs_naive": round(writer_rate / naive_rate, 2),
        **c_writer.per_msg(n),
        "naive_server_ops_per_msg": c_naive.per_msg(len(naive_msgs))["server_ops_per_msg"],
        "raw_server_ops_per_msg": c_raw.per_msg(n)["server_ops_per_msg"],
        "raw_python_cpu_us_per_msg": c_raw.per_msg(n)["python_cpu_us_per_msg"],
        "handler_timer_us_per_call": [round(TIMER_INSIDE_NS / 1e3, 2),
                                      round(TIMER_OUTSIDE_NS / 1e3, 2)],
        "server": kind, "messages": n,
    }))


if __name__ == "__main__":
    main()
