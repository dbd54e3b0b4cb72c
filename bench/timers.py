"""Timer lag (issue 27): from a timer's due time to the publisher's acknowledgement of its
record, at a steady schedule rate, on the local server.

- The local server: ``aggbox local start``'s mongo-java-server with H2
  (:func:`aggbox.servers.persistent.start_persistent_mongodb`) in a temporary ``AGGBOX_HOME``,
  stopped (and its data deleted) at the end; or ``AGGBOX_MONGODB_URI`` when set (left
  running).
- The domain (defined here): ``Job`` (collection ``tjobs``); its ``Place`` message with
  payload ``{"ms": N}`` schedules a ``Deadline`` for the job itself N ms later (key
  ``deadline``).
- The writer: a thread calls ``StoreWriter.process`` with one batch of ``Place`` messages
  (``--rate`` / 10 of them, each for a new job) every 0.1 s, each with ``--delay-ms``; a
  late batch is written at once, none is skipped, so the achieved rate is what the writer
  managed. ``--warmup`` seconds of it first (the server's JVM, the code paths; those timers
  are not counted), then ``--seconds`` measured. Job ids are random (``--ids random``) or
  ascending with time (``sequential``): mongo-java-server returns documents in ``_id``
  order, and the firer's page of due documents is not sorted, so with a backlog the ids
  decide which due timers go first.
- The dispatcher: one :class:`dispatcher.daemon.Dispatcher` in this process's event loop
  (default settings but the collection, no metrics port and ``--mode``), with an in-memory
  publisher that acknowledges every record at once and notes the wall-clock time — the
  broker costs nothing, the lag is the dispatcher's and the store's. Its MongoDB client is
  made here as the dispatcher would make it, with a command listener that times its round
  trips by kind (the firer's due page, its next-due look-up, the removals, the change
  stream, the rest).

Lag of a timer = its acknowledgement time − its due time (the stored ``due``, which the
record carries as ``created_at`` / the envelope's ``occurred_at``). Only the measured
window's timers count. Lost = scheduled (the writer's outcome ``applied``) but not
acknowledged by the end of the drain (every timer acknowledged, or ``--drain-seconds``
after the last one was due); duplicates = acknowledgements of an already acknowledged
message id. After the stop: documents still holding a timer, and how many of those were
acknowledged (published but not removed: the next dispatcher would publish them again) —
right when ``run()`` returned and once the server has settled.

CPU over the measured feed plus the drain: ``getrusage`` of this process and
``/proc/<pid>/stat`` of the server; the dispatcher's share is the process's minus the
writer thread's (``time.thread_time`` in that thread). Writer and dispatcher share this
process's GIL: a busy writer delays the event loop.

Printed: achieved schedule rate, timers scheduled/fired/lost/duplicates, lag p50/p90/p99/max
(ms) overall and per 10 s of due time, publish calls, round trips, CPU; with ``--json`` the
last line is one JSON object of these figures. Exit status 1 when a measured timer was lost.

``--drain N`` (issue 42: the firer on the same footing as the outbox's throughput): N
timers are scheduled first (N new jobs, due at once), then the dispatcher starts; fired
timers per second = N ÷ the time from its activation (leases held) to the last
acknowledgement — the firer's rate, not the writer's. Printed: that rate, lost and
duplicates, the firer's round trips and the server's CPU per timer.

Usage: python bench/timers.py [--rate 1000] [--seconds 30] [--delay-ms 2000] [--warmup 5]
       [--drain-seconds 30] [--ids random|sequential] [--mode auto|stream|poll]
       [--log-level WARNING] [--json]
       python bench/timers.py --drain 20000 [--mode ...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from common import cpu_ticks, process_cpu_s, quantile
from pymongo import AsyncMongoClient, MongoClient, monitoring

from aggbox.servers import persistent
from aggregates import (
    AggboxSettings,
    AggregateType,
    Emit,
    Handled,
    Message,
    Registry,
    Schedule,
    StoreWriter,
)
from dispatcher import Dispatcher, DispatcherSettings, OutboundRecord, PublishResult

DATABASE = "bench_timers"
COLLECTION = "tjobs"
BATCH_INTERVAL_S = 0.1
WINDOW_S = 10.0  # lag figures per this many seconds of due time


# -- the domain ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    status: str = "new"
    deadlines: int = 0


jobs: AggregateType[Job] = AggregateType("Job", state=Job, collection=COLLECTION)


@jobs.handles("Place")
def _place(state: Job, msg: Message) -> Handled[Job]:
    return replace(state, status="waiting"), [
        Schedule(Emit("Deadline", {}), key="deadline",
                 after=timedelta(milliseconds=int(msg.payload["ms"])))]


@jobs.handles("Deadline")
def _deadline(state: Job, msg: Message) -> Job:
    return replace(state, status="expired", deadlines=state.deadlines + 1)


registry = Registry([jobs])


# -- the publisher -------------------------------------------------------------------------
class AckClock:
    """An in-memory publisher: acknowledges every record and notes when (wall clock, s)."""

    name = "ackclock"

    def __init__(self) -> None:
        #: (message id, document id, due, acknowledged, publish call number)
        self.acks: list[tuple[str, str, float, float, int]] = []
        self.calls = 0

    async def start(self) -> None:
        return None

    async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]:
        self.calls += 1
        now = time.time()
        for r in records:
            due = r.created_at.timestamp() if r.created_at is not None else float("nan")
            self.acks.append((r.message_id, str(r.document_id), due, now, self.calls))
        return [PublishResult.ok() for _ in records]

    async def close(self) -> None:
        return None


# -- the dispatcher's server round trips --------------------------------------------------
class RoundTrips(monitoring.CommandListener):
    """Durations of the dispatcher client's commands while ``active``, by what they are: the
    firer's due page (``find`` on ``timers.due $lte``), its next-due look-up (the same,
    sorted), the removal of fired timers (``update`` with ``$pull`` of ``timers``;
    statements counted), the outbox side (change stream, sweeps) and the rest. A
    ``getMore`` counts under the command that opened its cursor."""

    def __init__(self) -> None:
        self.active = False
        self.ms: dict[str, list[float]] = {}
        self.statements: dict[str, int] = {}
        self._open: dict[int, str] = {}
        self._cursors: dict[int, str] = {}  # cursor id → what opened it

    @staticmethod
    def _kind(name: str, cmd: Mapping[str, Any]) -> str:
        target = cmd.get(name)
        if name == "find" and target == COLLECTION:
            due = (cmd.get("filter") or {}).get("timers.due")
            if due is not None:  # the next due time: {$exists}, limit 1; the due page: $lte
                return ("timers: next due" if isinstance(due, Mapping) and "$exists" in due
                        else "timers: due page")
            return "outbox: find"
        if name == "update" and target == COLLECTION:
            first = (cmd.get("updates") or [{}])[0].get("u") or {}
            return ("timers: removal" if "timers" in (first.get("$pull") or {})
                    else "outbox: update")
        if name == "aggregate":
            stages = cmd.get("pipeline") or [{}]
            if "$changeStream" in stages[0]:
                return "outbox: change stream"
        return f"{name} {target}" if isinstance(target, str) else name

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        name, cmd = event.command_name, event.command
        if name == "getMore":
            what = self._cursors.get(int(cmd.get("getMore") or 0), "getMore ?") + " (getMore)"
        else:
            what = self._kind(name, cmd)
        if name == "update" and self.active:
            self.statements[what] = self.statements.get(what, 0) + len(cmd.get("updates") or ())
        self._open[event.request_id] = what

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        what = self._open.pop(event.request_id, None)
        if what is None:
            return
        cursor = event.reply.get("cursor")
        if isinstance(cursor, Mapping) and cursor.get("id"):
            self._cursors[int(cursor["id"])] = what.removesuffix(" (getMore)")
        if self.active:
            self.ms.setdefault(what, []).append(event.duration_micros / 1000)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._open.pop(event.request_id, None)

    def figures(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for what, ms in sorted(self.ms.items(), key=lambda kv: -sum(kv[1])):
            s = sorted(ms)
            out[what] = {"calls": len(s), "total_s": round(sum(s) / 1000, 2),
                         "p50_ms": round(quantile(s, 0.5), 1), "max_ms": round(s[-1], 1)}
            if what in self.statements:
                out[what]["statements"] = self.statements[what]
        return out


# -- the writer thread ---------------------------------------------------------------------
@dataclass
class Feed:
    """What the writer thread did (read after it ended)."""

    scheduled: dict[str, list[str]] = field(default_factory=dict)  # phase → job ids
    started: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)
    batch_ms: list[float] = field(default_factory=list)  # measured phase: process() time
    late_batches: int = 0  # measured phase: started > one interval after their slot
    thread_cpu_s: float = 0.0  # measured phase
    error: BaseException | None = None


def feed(writer: StoreWriter, out: Feed, *, rate: float, warmup_s: float, seconds: float,
         delay_ms: int, sequential: bool) -> None:
    """Write Place messages: ``warmup_s`` then ``seconds`` at ``rate`` per second, each for
    a new job: random ids, or ``sequential`` ones (ascending with time)."""
    per_batch = max(1, round(rate * BATCH_INTERVAL_S))
    interval = per_batch / rate
    numbers = itertools.count()

    def new_id() -> str:
        return f"job-{next(numbers):09d}" if sequential else uuid.uuid4().hex

    try:
        for phase, span in (("warm", warmup_s), ("measured", seconds)):
            ids: list[str] = out.scheduled.setdefault(phase, [])
            batches = round(span / interval)
            cpu0 = time.thread_time()
            t0 = out.started[phase] = time.monotonic()
            for k in range(batches):
                slot = t0 + k * interval
                wait = slot - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                elif phase == "measured" and -wait > interval:
                    out.late_batches += 1
                msgs = [Message(f"place-{job}", "Place", "Job", job, {"ms": delay_ms})
                        for job in (new_id() for _ in range(per_batch))]
                t = time.perf_counter()
                outcomes = writer.process(msgs)
                if phase == "measured":
                    out.batch_ms.append((time.perf_counter() - t) * 1000)
                ids.extend(o.aggregate_id for o in outcomes if o.outcome == "applied")
            out.ended[phase] = time.monotonic()
            if phase == "measured":
                out.thread_cpu_s = time.thread_time() - cpu0
    except BaseException as exc:  # reported by the caller
        out.error = exc


# -- measuring -----------------------------------------------------------------------------
def lag_figures(lags_ms: Sequence[float]) -> dict[str, float]:
    s = sorted(lags_ms)
    return {"p50_ms": round(quantile(s, 0.50), 1), "p90_ms": round(quantile(s, 0.90), 1),
            "p99_ms": round(quantile(s, 0.99), 1), "max_ms": round(s[-1], 1) if s else float("nan"),
            "min_ms": round(s[0], 1) if s else float("nan")}


@contextlib.contextmanager
def local_server(home: Path) -> Iterator[tuple[str, int | None, str]]:
    """(uri, server pid, kind): ``AGGBOX_MONGODB_URI``, else the local server in ``home``."""
    uri = os.environ.get("AGGBOX_MONGODB_URI", "").strip()
    if uri:
        yield uri, None, "external (AGGBOX_MONGODB_URI)"
        return
    saved = os.environ.get("AGGBOX_HOME")
    os.environ["AGGBOX_HOME"] = str(home)
    try:
        state, _started = persistent.start_persistent_mongodb()
        try:
            yield state.uri, state.pid, state.kind
        finally:
            persistent.stop_persistent_mongodb(delete_data=True)
    finally:
        if saved is None:
            os.environ.pop("AGGBOX_HOME", None)
        else:
            os.environ["AGGBOX_HOME"] = saved


# -- the run -------------------------------------------------------------------------------
async def run(args: argparse.Namespace, uri: str, server_pid: int | None) -> dict[str, Any]:
    client: MongoClient[dict[str, Any]] = MongoClient(uri, tz_aware=True)
    client.drop_database(DATABASE)
    writer = StoreWriter(client[DATABASE], registry,
                         settings=AggboxSettings.load(mongodb_uri=uri, database=DATABASE))
    writer.ensure_indexes()
    pub = AckClock()
    settings = DispatcherSettings.load(collections=[COLLECTION], metrics_port=0,
                                       mode=args.mode)
    trips = RoundTrips()
    # The client the dispatcher would make itself (dispatcher/daemon.py), plus the listener.
    aclient: AsyncMongoClient[Any] = AsyncMongoClient(
        uri, tz_aware=True, appname="aggbox-dispatcher", event_listeners=[trips],
        serverSelectionTimeoutMS=10_000)
    dispatcher = Dispatcher(settings, store=AggboxSettings.load(mongodb_uri=uri,
                                                                database=DATABASE),
                            publisher=pub, client=aclient)
    task = asyncio.create_task(dispatcher.run())
    out = Feed()
    mode = "?"
    try:
        await asyncio.wait_for(dispatcher.started.wait(), 60)
        t = time.monotonic()
        while dispatcher.workers[0].mode == "standby":
            if task.done() or time.monotonic() - t > 60:
                raise RuntimeError("the dispatcher did not become active within 60 s")
            await asyncio.sleep(0.05)
        mode = dispatcher.workers[0].mode
        print(f"dispatcher active ({mode} mode) after {time.monotonic() - t:.1f} s; "
              f"feeding {args.rate:g} timers/s, delay {args.delay_ms} ms: {args.warmup:g} s "
              f"warm-up, {args.seconds:g} s measured", flush=True)
        feeder = threading.Thread(target=feed, name="feeder", args=(writer, out), kwargs=dict(
            rate=args.rate, warmup_s=args.warmup, seconds=args.seconds,
            delay_ms=args.delay_ms, sequential=args.ids == "sequential"))
        ticks = os.sysconf("SC_CLK_TCK")
        feeder.start()
        while "measured" not in out.started and feeder.is_alive():
            await asyncio.sleep(0.01)
        cpu0, server0, wall0 = process_cpu_s(), cpu_ticks(server_pid), time.monotonic()
        trips.active = True
        while feeder.is_alive():
            await asyncio.sleep(0.1)
        feeder.join()
        if out.error is not None:
            raise RuntimeError(f"the writer thread failed: {out.error!r}") from out.error
        expected = set(out.scheduled["measured"])
        everything = expected | set(out.scheduled["warm"])
        # Drain: until every timer (warm-up too) is acknowledged, or the last one is overdue
        # by --drain-seconds.
        deadline = time.monotonic() + args.delay_ms / 1000 + args.drain_seconds
        while time.monotonic() < deadline:
            if everything <= {a[1] for a in pub.acks}:
                break
            await asyncio.sleep(0.1)
        trips.active = False
        wall = time.monotonic() - wall0
        cpu = process_cpu_s() - cpu0
        server1 = cpu_ticks(server_pid)
        server_cpu = ((server1 - server0) / ticks
                      if server0 is not None and server1 is not None else None)
    finally:
        dispatcher.request_stop()
        rc = await asyncio.wait_for(task, 120)
        await aclient.close()
    coll = client[DATABASE][COLLECTION]

    def pending_now() -> set[str]:
        return {d["_id"] for d in coll.find({"timers.0": {"$exists": True}}, {"_id": 1})}

    # Right after run() returned, then once the server has settled (a removal the stop
    # cancelled client-side may still be running on the server).
    pending_at_stop = pending = pending_now()
    for _ in range(20):
        await asyncio.sleep(0.5)
        again = pending_now()
        if again == pending:
            break
        pending = again
    documents = client[DATABASE][COLLECTION].estimated_document_count()
    client.close()

    first: dict[str, tuple[str, float, float, int]] = {}  # message id → (doc, due, ack, call)
    duplicates = 0
    for mid, doc, due, ack, call in pub.acks:
        if mid in first:
            duplicates += 1
        else:
            first[mid] = (doc, due, ack, call)
    mine = [v for v in first.values() if v[0] in expected]
    measured = [(due, ack) for _, due, ack, _ in mine]
    fired_docs = {v[0] for v in mine}
    lags = [(ack - due) * 1000 for due, ack in measured]
    calls_measured = len({call for *_, call in mine})
    per_window: list[dict[str, Any]] = []
    if measured:
        start = min(due for due, _ in measured)
        n_win = int((max(due for due, _ in measured) - start) // WINDOW_S) + 1
        for w in range(n_win):
            win = [(ack - due) * 1000 for due, ack in measured
                   if w <= (due - start) / WINDOW_S < w + 1]
            if win:
                per_window.append({"due_from_s": round(w * WINDOW_S), "timers": len(win),
                                   **lag_figures(win)})
    # The last batch's slot ends one interval after it starts: a writer that keeps up has
    # written rate × seconds in ``seconds``.
    span = max(out.ended["measured"] - out.started["measured"], args.seconds)
    batch = sorted(out.batch_ms)
    scheduled = len(expected)
    dispatcher_cpu = cpu - out.thread_cpu_s
    return {
        "rate_target": args.rate, "seconds": args.seconds, "delay_ms": args.delay_ms,
        "mode": mode, "ids": args.ids, "feed_s": round(span, 1),
        "rate_achieved": round(scheduled / span, 1) if span > 0 else None,
        "scheduled": scheduled, "fired": len(measured),
        "lost": len(expected - fired_docs), "duplicates": duplicates,
        "lag": lag_figures(lags), "lag_per_10s_of_due_time": per_window,
        "publish_calls": calls_measured,
        "records_per_call": round(len(measured) / calls_measured, 1) if calls_measured else 0,
        "writer_batch_ms": {"p50": round(quantile(batch, 0.5), 1),
                            "p99": round(quantile(batch, 0.99), 1),
                            "max": round(batch[-1], 1) if batch else None},
        "writer_late_batches": out.late_batches,
        "cpu_window_s": round(wall, 1),
        "cpu_s_process": round(cpu, 2), "cpu_s_writer_thread": round(out.thread_cpu_s, 2),
        "cpu_s_dispatcher": round(dispatcher_cpu, 2),
        "dispatcher_cpu_share": round(dispatcher_cpu / wall, 3) if wall else None,
        "cpu_s_server": round(server_cpu, 2) if server_cpu is not None else None,
        "timers_pending_at_end": len(pending),
        # acknowledged, yet still in their documents after the dispatcher stopped: they
        # would be published again by the next dispatcher (duplicates for the receiver)
        "acked_still_stored": len(pending & {v[0] for v in first.values()}),
        "acked_still_stored_at_stop": len(pending_at_stop & {v[0] for v in first.values()}),
        "round_trips": trips.figures(), "documents": documents,
        "warmup_timers": len(out.scheduled.get("warm", [])),
        "warmup_lost": len(set(out.scheduled.get("warm", [])) - {v[0] for v in first.values()}),
        "dispatcher_exit": rc,
    }


async def drain_run(args: argparse.Namespace, uri: str, server_pid: int | None
                    ) -> dict[str, Any]:
    """``--drain N``: N due timers, then the dispatcher; how fast it fires them."""
    client: MongoClient[dict[str, Any]] = MongoClient(uri, tz_aware=True)
    client.drop_database(DATABASE)
    writer = StoreWriter(client[DATABASE], registry,
                         settings=AggboxSettings.load(mongodb_uri=uri, database=DATABASE))
    writer.ensure_indexes()
    jobs = [uuid.uuid4().hex if args.ids == "random" else f"job-{i:09d}"
            for i in range(args.drain)]
    t = time.monotonic()
    for k in range(0, len(jobs), 500):
        writer.process([Message(f"place-{j}", "Place", "Job", j, {"ms": 0})
                        for j in jobs[k:k + 500]])
    print(f"scheduled {len(jobs):,} due timers in {time.monotonic() - t:.1f} s", flush=True)
    pub = AckClock()
    settings = DispatcherSettings.load(collections=[COLLECTION], metrics_port=0,
                                       mode=args.mode)
    trips = RoundTrips()
    aclient: AsyncMongoClient[Any] = AsyncMongoClient(
        uri, tz_aware=True, appname="aggbox-dispatcher", event_listeners=[trips],
        serverSelectionTimeoutMS=10_000)
    dispatcher = Dispatcher(settings, store=AggboxSettings.load(mongodb_uri=uri,
                                                                database=DATABASE),
                            publisher=pub, client=aclient)
    # When the worker leaves standby (it holds its partitions and starts firing), on the
    # acks' clock: this loop shares the dispatcher's event loop, and a small drain can be
    # over before the loop below sees the mode change.
    active_at: list[float] = []
    set_mode = dispatcher.metrics.set_mode

    def noting(collection: str, mode: str) -> None:
        if mode != "standby" and not active_at:
            active_at.append(time.time())
        set_mode(collection, mode)

    dispatcher.metrics.set_mode = noting  # type: ignore[method-assign]
    task = asyncio.create_task(dispatcher.run())
    expected = set(jobs)
    try:
        await asyncio.wait_for(dispatcher.started.wait(), 60)
        while dispatcher.workers[0].mode == "standby" and not task.done():
            await asyncio.sleep(0.01)
        mode = dispatcher.workers[0].mode
        cpu0, server0, wall0 = process_cpu_s(), cpu_ticks(server_pid), time.monotonic()
        trips.active = True
        deadline = wall0 + args.drain_seconds + args.drain / 100
        while time.monotonic() < deadline and not task.done():
            if len({a[1] for a in pub.acks}) >= len(expected):
                break
            await asyncio.sleep(0.02)
        # From the worker leaving standby to its last ack.
        began = active_at[0] if active_at else time.time()
        wall = max((a[3] for a in pub.acks), default=began) - began
        trips.active = False
        cpu = process_cpu_s() - cpu0
        server1 = cpu_ticks(server_pid)
        server_cpu = ((server1 - server0) / os.sysconf("SC_CLK_TCK")
                      if server0 is not None and server1 is not None else None)
    finally:
        dispatcher.request_stop()
        rc = await asyncio.wait_for(task, 120)
        await aclient.close()
        client.close()
    fired = {a[1] for a in pub.acks} & expected
    return {
        "drain": len(jobs), "mode": mode, "ids": args.ids, "fired": len(fired),
        "lost": len(expected - fired), "duplicates": len(pub.acks) - len({a[0] for a in
                                                                          pub.acks}),
        "drain_s": round(wall, 2),
        "fired_per_s": round(len(fired) / wall, 1) if wall > 0 else None,
        "publish_calls": pub.calls,
        "cpu_s_dispatcher": round(cpu, 2),
        "cpu_s_server": round(server_cpu, 2) if server_cpu is not None else None,
        "server_cpu_us_per_timer": round(server_cpu / len(fired) * 1e6, 1)
        if server_cpu is not None and fired else None,
        "round_trips": trips.figures(), "dispatcher_exit": rc,
    }


def drain_report(r: dict[str, Any]) -> None:
    print(f"fired {r['fired']:,} of {r['drain']:,} due timers in {r['drain_s']} s = "
          f"{r['fired_per_s'] or 0:,}/s ({r['mode']} mode, {r['ids']} ids); lost {r['lost']}, "
          f"duplicates {r['duplicates']}; {r['publish_calls']} publish calls")
    print(f"CPU: dispatcher {r['cpu_s_dispatcher']} s, server {r['cpu_s_server']} s "
          f"({r['server_cpu_us_per_timer']} µs per timer)")
    for what, f in r["round_trips"].items():
        extra = f", {f['statements']:,} statements" if "statements" in f else ""
        print(f"  {what}: {f['calls']:,}{extra}, {f['total_s']} s, p50 {f['p50_ms']} ms, "
              f"max {f['max_ms']} ms")


def report(r: dict[str, Any]) -> None:
    lag = r["lag"]
    print(f"schedule rate: {r['rate_achieved']:,}/s achieved of {r['rate_target']:g}/s "
          f"({r['scheduled']:,} timers in {r['feed_s']:g} s, {r['ids']} ids; writer batch of "
          f"{max(1, round(r['rate_target'] * BATCH_INTERVAL_S))}: p50 "
          f"{r['writer_batch_ms']['p50']} ms, p99 {r['writer_batch_ms']['p99']} ms, "
          f"{r['writer_late_batches']} late batches)")
    print(f"timers: fired {r['fired']:,}, lost {r['lost']}, duplicates {r['duplicates']} "
          f"({r['warmup_timers']:,} warm-up timers not counted: {r['warmup_lost']} of them "
          f"lost); after the dispatcher stopped, {r['timers_pending_at_end']} documents still "
          f"hold a timer, {r['acked_still_stored']} of them already acknowledged "
          f"({r['acked_still_stored_at_stop']} right when it returned)")
    print(f"lag due → ack ({r['mode']} mode): p50 {lag['p50_ms']} ms, p90 {lag['p90_ms']} ms, "
          f"p99 {lag['p99_ms']} ms, max {lag['max_ms']} ms (min {lag['min_ms']} ms)")
    for w in r["lag_per_10s_of_due_time"]:
        print(f"  due +{w['due_from_s']:>3} s: {w['timers']:>6,} timers, p50 {w['p50_ms']} ms, "
              f"p99 {w['p99_ms']} ms, max {w['max_ms']} ms")
    print(f"publish calls: {r['publish_calls']:,} ({r['records_per_call']} records per call)")
    print("dispatcher round trips (count, total, p50, max):")
    for what, f in r["round_trips"].items():
        extra = f", {f['statements']:,} statements" if "statements" in f else ""
        print(f"  {what}: {f['calls']:,}{extra}, {f['total_s']} s, p50 {f['p50_ms']} ms, "
              f"max {f['max_ms']} ms")
    print(f"CPU over {r['cpu_window_s']} s (feed + drain): process {r['cpu_s_process']} s, "
          f"writer thread {r['cpu_s_writer_thread']} s, dispatcher (the rest) "
          f"{r['cpu_s_dispatcher']} s = {r['dispatcher_cpu_share']:.0%} of one core; "
          f"server {r['cpu_s_server']} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0, help="timers scheduled per second")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured feeding time")
    ap.add_argument("--delay-ms", type=int, default=2000, help="each timer's `after`")
    ap.add_argument("--warmup", type=float, default=5.0,
                    help="seconds of feeding before the measured window (not counted)")
    ap.add_argument("--drain-seconds", type=float, default=30.0,
                    help="how long after the last due time a timer may still fire")
    ap.add_argument("--mode", choices=["auto", "stream", "poll"], default="auto",
                    help="the dispatcher's mode (its outbox side; timers fire the same way)")
    ap.add_argument("--ids", choices=["random", "sequential"], default="random",
                    help="job ids: random (uuid4), or ascending with time — the order "
                    "mongo-java-server returns documents in (by _id)")
    ap.add_argument("--drain", type=int, default=0, metavar="N",
                    help="instead: N timers due at once, then the dispatcher; fired per "
                    "second")
    ap.add_argument("--log-level", default="WARNING", help="the dispatcher's log level")
    ap.add_argument("--json", action="store_true", help="last line: the figures as JSON")
    args = ap.parse_args()
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.rate <= 0 or args.seconds <= 0 or args.delay_ms < 0:
        ap.error("--rate and --seconds must be positive, --delay-ms not negative")
    home = Path(tempfile.mkdtemp(prefix="aggbox-bench-timers-"))
    try:
        with local_server(home) as (uri, pid, kind):
            print(f"server: {kind} (pid {pid}); {os.cpu_count()} CPUs; load average "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
            result = asyncio.run(drain_run(args, uri, pid) if args.drain
                                 else run(args, uri, pid))
            result["server"] = kind
    finally:
        shutil.rmtree(home, ignore_errors=True)
    result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.drain:
        drain_report(result)
        if args.json:
            print(json.dumps(result))
        return 0 if result["lost"] == 0 and result["dispatcher_exit"] == 0 else 1
    report(result)
    if args.json:
        print(json.dumps(result))
    return 0 if result["lost"] == 0 and result["dispatcher_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
