"""What the partition leases cost the store, and what the dispatcher does when the store is
too slow for them (docs/design.md "Scale-out: partitions and leases", issue "days").

- An idle dispatcher writes one document per lease round — its heartbeat — however many
  partitions it holds; lease documents are written only when they change hands. Counted
  with a pymongo command listener on the dispatcher's own client, and as oplog growth.
- A store made slow (a loopback proxy that delays every request, longer than the lease
  TTL) makes the dispatcher say so — an ERROR/WARNING line with the measured round, the
  lease metrics, /healthz 503 after ``unhealthy_after_s`` — and it publishes again by
  itself once the store is quick again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
from pymongo import AsyncMongoClient
from pymongo.database import Database
from pymongo.monitoring import CommandListener, CommandStartedEvent

from aggbox.servers import LocalMongo
from aggregates import AggboxSettings, StoreWriter
from aggregates.core.partitions import PARTITIONS
from dispatcher.daemon import Dispatcher
from dispatcher.status.report import format_status, read_status
from tests.dispatcher.helpers import (
    ListPublisher,
    check_delivery,
    dead_port,
    emit,
    healthz,
    pending_entries,
    run_while,
    wait_for,
)
from tests.dispatcher.slowproxy import SlowProxy
from tests.dispatcher.test_liveness import settings

pytestmark = [pytest.mark.mongo]

_WRITES = {"insert": "documents", "update": "updates", "delete": "deletes"}


class WriteCounter(CommandListener):
    """Documents written per collection (inserts, updates, deletes; findAndModify as one)."""

    def __init__(self) -> None:
        self.docs: Counter[str] = Counter()
        self._lock = threading.Lock()

    def started(self, event: CommandStartedEvent) -> None:
        name = event.command_name
        if name in _WRITES:
            n = len(event.command.get(_WRITES[name]) or ())
        elif name == "findAndModify":
            n = 1
        else:
            return
        with self._lock:
            self.docs[str(event.command.get(name))] += n

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.docs)

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass


def test_an_idle_dispatcher_writes_one_document_per_lease_round(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        dmongo: LocalMongo) -> None:
    counter = WriteCounter()
    client: AsyncMongoClient[Any] = AsyncMongoClient(dmongo.uri, tz_aware=True,
                                                     event_listeners=[counter])
    d = Dispatcher(settings(lease_ttl_s=1.5), store=store, publisher=ListPublisher(),
                   client=client)
    oplog = ddb.client.local["oplog.rs"]
    figures: dict[str, float] = {}

    async def body() -> None:
        w = d.workers[0]
        await wait_for(lambda: w.mode == "stream" and len(w.leases.held) == PARTITIONS, 15,
                       "stream mode on every partition")
        emitted = await asyncio.to_thread(emit, writer, ["a000", "a001"], n=2)
        await wait_for(lambda: pending_entries(ddb) == 0, 15, "published")
        check_delivery(d.publisher.delivered(), emitted)  # type: ignore[attr-defined]
        await asyncio.sleep(1.0)  # the last pull and checkpoint are done
        before, rounds = counter.snapshot(), w.balancer.rounds
        entries = await asyncio.to_thread(oplog.count_documents, {})
        await asyncio.sleep(4.0)  # about 12 renewal rounds at lease_ttl_s / 3 = 0.5 s
        after, done = counter.snapshot(), w.balancer.rounds - rounds
        grown = await asyncio.to_thread(oplog.count_documents, {}) - entries
        written = after - before
        figures.update(rounds=done, oplog=grown, **{k: float(v) for k, v in written.items()})
        assert done >= 4, figures
        # One heartbeat per round, no lease document touched while nothing changes hands.
        assert written["aggbox_dispatcher_partitions"] == 0, figures
        assert done - 1 <= written["aggbox_dispatcher_members"] <= done + 1, figures
        assert sum(written.values()) <= done + 2, figures
        # Before: one lease update per partition held (256) per round.
        assert grown <= 2 * done + 2, figures

    try:
        asyncio.run(run_while(d, body))
    finally:
        asyncio.run(client.close())
    print(f"idle dispatcher: {figures}")


def test_a_store_slower_than_the_lease_ttl_is_reported_and_survived(
        writer: StoreWriter, ddb: Database[Any], dmongo: LocalMongo,
        caplog: pytest.LogCaptureFixture) -> None:
    target = urlsplit(dmongo.uri)
    assert target.hostname is not None and target.port is not None
    with SlowProxy(target.hostname, target.port) as proxy:
        uri = dmongo.uri.replace(f"{target.hostname}:{target.port}",
                                 f"127.0.0.1:{proxy.port}", 1)
        store = AggboxSettings.load(mongodb_uri=uri, database=ddb.name)
        pub = ListPublisher()
        d = Dispatcher(settings(lease_ttl_s=2, unhealthy_after_s=3, metrics_port=dead_port(),
                                backoff_max_ms=200),
                       store=store, publisher=pub)
        seen: dict[str, Any] = {}

        async def body() -> None:
            w = d.workers[0]
            await wait_for(lambda: w.mode != "standby", 15, "active")
            first = await asyncio.to_thread(emit, writer, ["a000", "a001"], n=2)
            await wait_for(lambda: pending_entries(ddb) == 0, 15, "published")
            # The store slows down: every request waits 2.5 s, more than the 2 s TTL.
            proxy.delay_s = 2.5
            started = time.monotonic()
            status = 200
            while time.monotonic() - started < 30 and status == 200:
                status, report = await asyncio.to_thread(healthz, d.metrics_port)
                await asyncio.sleep(0.5)
            seen["unhealthy_after_s"] = time.monotonic() - started
            assert status == 503, report
            seen["report"] = report["collections"]["emitters"]
            held_while_slow = len(w.leases.publishable())
            # It recovers by itself: the store is quick again, new entries get published.
            proxy.delay_s = 0.0
            recovered = time.monotonic()
            later = await asyncio.to_thread(emit, writer, ["b000", "b001"], n=2)
            await wait_for(lambda: pending_entries(ddb) == 0, 60, "published after recovery")
            seen["recovered_s"] = time.monotonic() - recovered
            check_delivery(pub.delivered(), {**first, **later})
            await wait_for(lambda: asyncio.to_thread(lambda: healthz(d.metrics_port)[0] == 200),
                           30, "healthy again")
            seen["held_while_slow"] = held_while_slow

        with caplog.at_level(logging.INFO, logger="aggbox.dispatcher"):
            asyncio.run(run_while(d, body))
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    slow = [x for x in lines if "lease round took" in x or "heartbeat lapsed" in x]
    assert slow, lines
    assert any("raise lease_ttl_s" in x for x in slow), slow
    assert all("\n" not in x and len(x) < 400 for x in slow), slow
    assert len(slow) <= 12, slow  # rate-limited: one line per kind per 30 s at most
    assert seen["report"]["seconds_of_lease_trouble"] > 3, seen
    assert any("quick again" in r.getMessage() for r in caplog.records), lines
    text = d.metrics.render().decode()
    slow_rounds = _sample(text, 'aggbox_dispatcher_lease_round_seconds_bucket{'
                                'collection="emitters",le="0.5"}')
    all_rounds = _sample(text, 'aggbox_dispatcher_lease_round_seconds_count{'
                               'collection="emitters"}')
    assert all_rounds > slow_rounds, text  # some rounds took longer than 0.5 s
    assert "aggbox_dispatcher_partitions_owned" in text
    print(f"slow store: {seen} lines={len(slow)} rounds={all_rounds} "
          f"under 0.5 s={slow_rounds}")


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the metrics")


def test_instances_starting_together_claim_their_fair_share_from_the_first_claim(
        ddb: Database[Any], dmongo: LocalMongo) -> None:
    """The first round only announces an instance, so two that start together each claim
    half — before, the first to finish a round claimed all 256 and the other idled until
    hand-overs at later rounds."""
    from dispatcher.core.timing import REAL_TIME
    from dispatcher.leases.balancer import Balancer
    from dispatcher.leases.partlease import PartitionLeases
    from dispatcher.observe.metrics import Health, Metrics

    async def main() -> dict[str, Any]:
        client: AsyncMongoClient[Any] = AsyncMongoClient(dmongo.uri, tz_aware=True)
        db = client[ddb.name]
        try:
            balancers = {}
            for name in ("a", "b"):
                leases = PartitionLeases(db.aggbox_dispatcher_partitions,
                                         db.aggbox_dispatcher_members, database=ddb.name,
                                         collection="emitters", owner=name, ttl_s=30)
                balancers[name] = Balancer(
                    leases, name="emitters", interval_s=10, health=Health(),
                    metrics=Metrics(), stop=asyncio.Event(), timing=REAL_TIME,
                    on_contact=lambda: None, on_error=lambda _: None)
            a, b = balancers["a"], balancers["b"]
            await a.round()  # announces a; claims nothing yet
            assert a.leases.held == {}
            await b.round()  # announces b
            await a.round()  # sees a and b: claims its half
            await b.round()
            await a.round()
            await b.round()  # settled: nothing changes hands
            held = {n: len(x.leases.held) for n, x in balancers.items()}
            released = {n: x.metrics.registry.get_sample_value(
                "aggbox_dispatcher_partition_handovers_total",
                {"collection": "emitters", "kind": "released"}) or 0.0
                for n, x in balancers.items()}
            # A killed instance's heartbeat, expired an hour ago: removed by the next round
            # (dispatch-status shows it DEAD only for the retention).
            await db.aggbox_dispatcher_members.insert_one(
                {"_id": "killed", "scope": f"{ddb.name}.emitters", "member": "killed",
                 "instance": "killed", "expires_at": datetime.now(UTC) - timedelta(hours=1)})
            # a stops gracefully: b takes its half over, and the hand-over names a.
            await a.close()
            await b.round()
            await b.round()
            status = await asyncio.to_thread(read_status, ddb, "emitters")
            for x in balancers.values():
                await x.leases.leave()
            return {"held": held, "released": released, "status": status}
        finally:
            await client.close()

    result = asyncio.run(main())
    assert result["held"] == {"a": PARTITIONS // 2, "b": PARTITIONS // 2}, result
    assert result["released"] == {"a": 0, "b": 0}, result
    status = result["status"]
    assert [i.instance for i in status.instances] == ["b"]  # a left, "killed" removed
    assert status.fair and len(status.instances[0].partitions) == PARTITIONS
    h = status.last_handover
    assert h is not None and (h.previous, h.owner, h.kind) == ("a", "b", "released"), h
    assert "a → b (released)" in format_status(status)
