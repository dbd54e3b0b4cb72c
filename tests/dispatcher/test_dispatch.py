"""The dispatcher against the local MongoDB (change streams), in-process and as a process:
draining, concurrent writers, polling mode, lost resume tokens, broker failures, dead
letters, leases, metrics, graceful shutdown."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from aggbox.servers import LocalMongo
from aggregates import AggboxSettings, StoreWriter
from aggregates.core.partitions import PARTITIONS, partition_of
from aggregates.ops import DeadLetterStore
from dispatcher.core.faults import Faults
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from dispatcher.publishers.base import PublishResult
from dispatcher.publishers.record import OutboundRecord
from tests.dispatcher.domain import registry
from tests.dispatcher.helpers import (
    FakeTime,
    ListPublisher,
    check_delivery,
    emit,
    jsonl_envelopes,
    merge,
    pending_entries,
    run_while,
    spawn,
    wait_for,
    wait_sync,
)

pytestmark = [pytest.mark.mongo]


def settings(**over: Any) -> DispatcherSettings:
    base: dict[str, Any] = dict(
        collections=["emitters"], metrics_port=0, pacing_ms=10, poll_interval_ms=50,
        lease_ttl_s=3, backoff_initial_ms=50, backoff_max_ms=400, sweep_interval_s=30,
        batch_size=50, max_batch_records=40,
    )
    base.update(over)
    return DispatcherSettings.load(**base)


def docs(n: int, prefix: str = "a") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(n)]


def test_once_drains_in_order_and_pulls_exactly_the_published_ids(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings, tmp_path: Path) -> None:
    emitted = merge(emit(writer, docs(25), n=3), emit(writer, docs(25), n=2))
    versions = {d["_id"]: d["_v"] for d in ddb.emitters.find()}
    out = tmp_path / "out"
    d = Dispatcher(settings(jsonl_dir=str(out), batch_size=7), store=store)
    assert asyncio.run(d.run(once=True)) == 0
    envelopes = jsonl_envelopes(out)
    counts = check_delivery([(e["source"]["id"], e["message_id"], e["source"]["seq"])
                             for e in envelopes], emitted)
    assert counts["duplicates"] == 0 and counts["distinct"] == 125
    assert len(list(out.glob("*.jsonl"))) >= 4  # several batches (max_batch_records=40)
    assert pending_entries(ddb) == 0
    # $pull never touches _v (invariant 2): the writer's versions are unchanged.
    assert {d["_id"]: d["_v"] for d in ddb.emitters.find()} == versions
    assert ddb.emitters.count_documents({}) == 25  # documents stay, only entries go


@pytest.mark.parametrize("mode", ["stream", "poll"])
def test_writer_appending_while_the_dispatcher_pulls_loses_and_resurrects_nothing(
        mode: str, ddb: Database[Any], store: AggboxSettings) -> None:
    # The writer reads, then (after a pause that lets the dispatcher pull in between)
    # appends with a write conditional on _v; the publisher is slow, so appends also land
    # between the dispatcher's read and its pull. Pulls by id and appends commute.
    slow = StoreWriter(ddb, registry, settings=store, before_write=lambda ops: time.sleep(0.02))
    slow.ensure_indexes()
    pub = ListPublisher(delay=0.02)
    d = Dispatcher(settings(mode=mode), store=store, publisher=pub)
    emitted: list[dict[str, list[str]]] = []

    async def body() -> None:
        for _ in range(12):
            emitted.append(await asyncio.to_thread(emit, slow, docs(8), n=2))
        await wait_for(lambda: pending_entries(ddb) == 0, 60, "the outbox to drain")

    asyncio.run(run_while(d, body))
    counts = check_delivery(pub.delivered(), merge(*emitted))
    assert counts["distinct"] == 8 * 12 * 2
    assert counts["duplicates"] == 0  # a resurrected entry would have been published again
    assert d.workers[0].last_active_mode == mode


def test_history_lost_while_following_means_new_stream_and_full_sweep(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        caplog: pytest.LogCaptureFixture) -> None:
    pub = ListPublisher()
    faults = Faults()
    d = Dispatcher(settings(), store=store, publisher=pub, faults=faults)
    first: dict[str, list[str]] = {}
    second: dict[str, list[str]] = {}

    async def body() -> None:
        first.update(await asyncio.to_thread(emit, writer, docs(5), n=2))
        await wait_for(lambda: len(pub.records) == 10, 30, "first entries")
        faults.add("stream_read", "history_lost")  # ChangeStreamHistoryLost (code 286)
        second.update(await asyncio.to_thread(emit, writer, docs(5), n=3))
        await wait_for(lambda: len(pub.records) >= 25 and pending_entries(ddb) == 0, 30,
                       "entries written around the loss")

    with caplog.at_level(logging.WARNING, logger="aggbox.dispatcher"):
        asyncio.run(run_while(d, body))
    check_delivery(pub.delivered(), merge(first, second))
    assert d.workers[0].stats.stream_restarts == 1
    sample = d.metrics.registry.get_sample_value(
        "aggbox_dispatcher_stream_restarts_total",
        {"collection": "emitters", "reason": "history_lost"})
    assert sample == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("cannot resume" in m and "286" in m for m in messages)
    assert any("history_lost sweep done" in m and "entries published" in m for m in messages)


@pytest.mark.parametrize("damage", ["history_lost", "garbage_token"])
def test_unusable_saved_token_at_start_recovers_by_sweep(
        damage: str, writer: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    pub = ListPublisher()
    first: dict[str, list[str]] = {}

    d1 = Dispatcher(settings(), store=store, publisher=pub)

    async def body1() -> None:
        await wait_for(lambda: d1.workers[0].mode == "stream", 10, "the stream to be open")
        first.update(await asyncio.to_thread(emit, writer, docs(4), n=2))
        await wait_for(lambda: pending_entries(ddb) == 0, 30, "drain")

    asyncio.run(run_while(d1, body1))
    checkpoint = ddb.aggbox_dispatcher_checkpoints.find_one({"_id": f"{ddb.name}.emitters"})
    assert checkpoint is not None and checkpoint["token"]
    # While no dispatcher runs: more entries, and the token becomes unusable.
    second = emit(writer, docs(4), n=3)
    faults = Faults()
    if damage == "history_lost":
        faults.add("stream_open", "history_lost")
    else:
        ddb.aggbox_dispatcher_checkpoints.update_one(
            {"_id": checkpoint["_id"]}, {"$set": {"token": {"_data": "not-a-token"}}})
    d2 = Dispatcher(settings(), store=store, publisher=pub, faults=faults)

    async def body2() -> None:
        await wait_for(lambda: pending_entries(ddb) == 0, 30, "drain after restart")

    asyncio.run(run_while(d2, body2))
    check_delivery(pub.delivered(), merge(first, second))
    assert d2.workers[0].stats.stream_restarts == 1


def test_broker_failure_backs_off_pulls_nothing_then_delivers_in_order(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    broker_down = threading.Event()
    broker_down.set()
    pub = ListPublisher(lambda r: PublishResult.retryable("broker down")
                        if broker_down.is_set() else None)
    emitted = emit(writer, docs(6), n=3)
    # The worker is parked at its 6th pause: 6 attempts, each followed by one backoff pause.
    clock = FakeTime(random=0.5, hold_after=5)
    d = Dispatcher(settings(backoff_initial_ms=100, backoff_max_ms=400), store=store,
                   publisher=pub, timing=clock.timing)

    async def body() -> None:
        try:
            await asyncio.wait_for(clock.held.wait(), 30)
            assert pending_entries(ddb) == 18  # nothing pulled while the broker refuses
            # Exponential backoff, (injected) jitter 0.5: ceilings 0.1, 0.2, 0.4, 0.4, ...
            assert clock.sleeps == pytest.approx([0.05, 0.1, 0.2, 0.2, 0.2])
            assert pub.calls == 6 and d.workers[0].stats.backoffs == 6  # one per pause
            broker_down.clear()
        finally:
            clock.release()
        await wait_for(lambda: pending_entries(ddb) == 0, 30, "delivery after recovery")
        assert pub.calls == 7  # the retry after the last pause delivered everything

    asyncio.run(run_while(d, body))
    assert check_delivery(pub.delivered(), emitted)["duplicates"] == 0


def test_a_retryable_failure_mid_document_keeps_the_rest_of_it_pending(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    emitted = emit(writer, docs(3), n=4)
    victim = emitted["a001"][1]
    failures = {victim: 2}

    def fail(r: OutboundRecord) -> PublishResult | None:
        if failures.get(r.message_id, 0) > 0:
            failures[r.message_id] -= 1
            return PublishResult.retryable("flaky")
        return None

    pub = ListPublisher(fail)
    assert asyncio.run(Dispatcher(settings(), store=store, publisher=pub).run(once=True)) == 0
    counts = check_delivery(pub.delivered(), emitted)
    assert counts["duplicates"] == 0  # a001's first entry was pulled, not published again
    assert pending_entries(ddb) == 0


def test_permanent_rejections_are_dead_lettered_pulled_and_do_not_block(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    emitted = emit(writer, docs(2), n=4)
    rejected = {emitted["a000"][1], emitted["a001"][2]}
    # A corrupted entry (no type) cannot even form an envelope.
    ddb.emitters.update_one({"_id": "a001"}, {"$push": {"outbox": {
        "id": "corrupt-1", "payload": {}, "source": {"type": "Emitter", "id": "a001",
                                                     "seq": 99}}}})
    pub = ListPublisher(lambda r: PublishResult.permanent("message_too_large", "1.2 MB > 1 MB")
                        if r.message_id in rejected else None)
    d = Dispatcher(settings(), store=store, publisher=pub)
    assert asyncio.run(d.run(once=True)) == 0
    assert pending_entries(ddb) == 0  # nothing blocks the aggregates
    delivered = {m for _a, m, _s in pub.delivered()}
    assert delivered == {m for ids in emitted.values() for m in ids} - rejected
    letters = {dl["message_id"] or dl["raw"]: dl for dl in DeadLetterStore(
        ddb, collection=store.dead_letter_collection).list()}
    assert len(letters) == 3
    for mid in rejected:
        dl = letters[mid]
        assert dl["reason"] == "message_too_large" and "1.2 MB" in dl["error"]
        assert dl["message"]["message_id"] == mid and dl["aggregate_type"] == "Emitter"
        assert dl["status"] == "open" and dl["attempts"] == 1
    corrupt = letters["corrupt-1"]  # found by its entry id (issue 40, item 3)
    assert corrupt["reason"] == "invalid_outbox_entry" and "corrupt-1" in corrupt["raw"]
    assert corrupt["_id"] == "Emitter/a001/corrupt-1"
    assert d.metrics.registry.get_sample_value(
        "aggbox_dispatcher_dead_lettered_total",
        {"collection": "emitters", "reason": "message_too_large"}) == 2


@pytest.mark.parametrize("mode", ["stream", "poll"])
def test_two_instances_share_the_partitions_and_a_lost_lease_stops_publishing(
        mode: str, writer: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    pub_a, pub_b = ListPublisher(), ListPublisher()
    over = dict(lease_ttl_s=3.0, takeover_grace_s=0.2, mode=mode)
    a = Dispatcher(settings(instance_id="A", **over), store=store, publisher=pub_a)
    b = Dispatcher(settings(instance_id="B", **over), store=store, publisher=pub_b)
    leases = ddb.aggbox_dispatcher_partitions
    scope = f"{ddb.name}.emitters"

    members = ddb.aggbox_dispatcher_members

    def owned() -> dict[str, int]:
        # A lease is live while its owner's heartbeat is (dispatcher/leases/partlease.py).
        live = {m["member"] for m in members.find({"scope": scope,
                                                   "expires_at": {"$gt": _in(0)}})}
        return dict(Counter(d["owner"] for d in leases.find(
            {"scope": scope, "owner": {"$in": sorted(live)}})))

    def publishing(d: Dispatcher) -> frozenset[int]:
        w = d.workers[0]
        return w.selection.partitions if w.mode != "standby" else frozenset()

    async def body() -> None:
        await wait_for(lambda: len(publishing(a)) == PARTITIONS, 10, "A on every partition")
        task_b = asyncio.create_task(b.run())
        try:
            half = PARTITIONS // 2
            await wait_for(lambda: owned() == {"A": half, "B": half}
                           and len(publishing(a)) == half == len(publishing(b)), 20,
                           "an even split")
            assert not publishing(a) & publishing(b)
            first = await asyncio.to_thread(emit, writer, docs(40), n=2)
            await wait_for(lambda: pending_entries(ddb) == 0, 20, "both publish")
            # Each entry was published by the instance holding its aggregate's partition.
            for pub, d in ((pub_a, a), (pub_b, b)):
                assert {partition_of(r.key) for r in pub.records} <= publishing(d)
            counts = check_delivery(pub_a.delivered() + pub_b.delivered(), first)
            assert counts["duplicates"] == 0 and pub_a.records and pub_b.records
            # Someone else takes one partition (as after a long pause of its holder): the
            # holder stops publishing it at its next round, and so does everybody else.
            p = partition_of("a000")
            holder = a if p in publishing(a) else b
            members.insert_one({"_id": "intruder", "scope": scope, "member": "intruder",
                                "instance": "intruder", "expires_at": _in(3600)})
            leases.update_one({"scope": scope, "partition": p},
                              {"$set": {"owner": "intruder"}, "$inc": {"epoch": 1}})
            await wait_for(lambda: p not in publishing(holder), 10, "the holder lets go")
            sent = len(pub_a.records) + len(pub_b.records)
            held = await asyncio.to_thread(emit, writer, ["a000"], n=1)
            rounds = holder.workers[0].balancer.rounds
            await wait_for(lambda: holder.workers[0].balancer.rounds >= rounds + 2, 10,
                           "two more lease rounds")
            assert pending_entries(ddb) == 1  # nobody publishes a partition it does not hold
            assert len(pub_a.records) + len(pub_b.records) == sent
            # The intruder's lease expires: the instance below its quota takes it back.
            members.update_one({"_id": "intruder"}, {"$set": {"expires_at": _in(-1)}})
            await wait_for(lambda: pending_entries(ddb) == 0, 20, "takeover")
            check_delivery(pub_a.delivered() + pub_b.delivered(), merge(first, held))
            lease = leases.find_one({"scope": scope, "partition": p})
            assert lease is not None and lease["owner"] == holder.instance_id
            assert lease["handover"] == "expired" and lease["previous"] == "intruder"
        finally:
            b.request_stop()
            assert await task_b == 0

    asyncio.run(run_while(a, body))
    # Graceful stops release every lease at once (nobody need wait for an expiry) and
    # remove the heartbeats.
    assert leases.count_documents({"scope": scope}) == PARTITIONS
    assert all(d["owner"] is None and d["released_by"] in ("A", "B")
               for d in leases.find({"scope": scope}))
    # the intruder's heartbeat is still there (expired): only its own instance removes it,
    # or anyone once it expired for longer than the retention (dispatcher/leases/partlease.py)
    assert {m["member"] for m in members.find({"scope": scope})} == {"intruder"}


def _in(seconds: float) -> Any:
    from datetime import UTC, datetime, timedelta

    return datetime.now(UTC) + timedelta(seconds=seconds)


def test_metrics_and_health_endpoints(writer: StoreWriter, ddb: Database[Any],
                                      store: AggboxSettings) -> None:
    pub = ListPublisher()
    emit(writer, docs(3), n=2)
    d = Dispatcher(settings(metrics_port=_free_port(), metrics_interval_s=0.2), store=store,
                   publisher=pub)

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}{path}") as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    async def body() -> None:
        await wait_for(lambda: pending_entries(ddb) == 0, 20, "drain")
        await asyncio.to_thread(emit, writer, docs(2, prefix="late"), n=1)
        await wait_for(lambda: pending_entries(ddb) == 0, 20, "late entries published")
        await wait_for(lambda: d.metrics.registry.get_sample_value(
            "aggbox_dispatcher_published_total", {"collection": "emitters"}) == 8, 20,
            "the counter")
        status, text = await asyncio.to_thread(get, "/metrics")
        assert status == 200
        assert 'aggbox_dispatcher_published_total{collection="emitters"}' in text
        assert 'aggbox_dispatcher_lease_active{collection="emitters"} 1.0' in text
        for name in ("backlog_entries", "oldest_pending_age_seconds", "stream_lag_seconds",
                     "failed_total", "commit_to_publish_seconds_bucket"):
            assert f"aggbox_dispatcher_{name}" in text, name
        status, text = await asyncio.to_thread(get, "/healthz")
        assert status == 200
        report = json.loads(text)
        assert report["status"] == "ok"
        assert report["collections"]["emitters"]["role"] == "active"
        assert (await asyncio.to_thread(get, "/nope"))[0] == 404

    asyncio.run(run_while(d, body))
    published = d.metrics.registry.get_sample_value(
        "aggbox_dispatcher_published_total", {"collection": "emitters"})
    assert published == 8


def test_backlog_gauges_measure_pending_entries_and_their_age(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    emit(writer, docs(3), n=4)
    d = Dispatcher(settings(), store=store, publisher=ListPublisher())

    async def measure() -> Any:
        client = d._client = await d._client_for()
        from dispatcher.worker import CollectionWorker

        w = CollectionWorker(db=client[store.database], collection="emitters",
                             settings=d.settings, publisher=d.publisher,
                             dead_letter_collection="dl", metrics=d.metrics, health=d.health,
                             faults=d.faults, stop=asyncio.Event(), owner="x")
        w._select(frozenset({partition_of("a001")}))  # a share: only its documents count
        share = await w.measure_backlog()
        w._select(())  # standby: nothing of its own
        idle = await w.measure_backlog()
        w._select(frozenset(range(PARTITIONS)))  # as when it holds every partition
        out = await w.measure_backlog()
        await client.close()
        return out, share, idle

    out, share, idle = asyncio.run(measure())
    in_share = sum(partition_of(a) == partition_of("a001") for a in docs(3))
    assert (share["entries"], share["documents"]) == (4 * in_share, in_share)
    assert (idle["entries"], idle["documents"]) == (0, 0)
    assert (out["entries"], out["documents"]) == (12, 3)
    assert 0 <= out["oldest_age_s"] < 600
    assert d.metrics.registry.get_sample_value(
        "aggbox_dispatcher_backlog_entries", {"collection": "emitters"}) == 12


def test_stop_finishes_the_publish_in_flight_and_pulls_it(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    class Slow(ListPublisher):
        async def publish(self, records: Any) -> list[PublishResult]:
            started.set()
            await release.wait()  # "at the broker" until the test lets it answer
            return await super().publish(records)

    emitted = emit(writer, docs(4), n=2)
    pub = Slow()
    d = Dispatcher(settings(), store=store, publisher=pub)

    async def main() -> int:
        task = asyncio.create_task(d.run())
        await asyncio.wait_for(started.wait(), 20)
        d.request_stop()  # what SIGTERM does, while the batch is at the broker
        await asyncio.sleep(0)
        assert not task.done()  # waiting for the publish in flight
        release.set()
        return await task

    assert asyncio.run(main()) == 0
    check_delivery(pub.delivered(), emitted)
    assert pending_entries(ddb) == 0  # finished and pulled, not abandoned


def test_sigterm_stops_the_process_gracefully_with_exit_code_0(
        writer: StoreWriter, ddb: Database[Any], dmongo: LocalMongo, tmp_path: Path) -> None:
    out = tmp_path / "out"
    log = tmp_path / "dispatcher.log"
    proc = spawn(["--collection", "emitters", "--publisher", "jsonl", "--jsonl-dir", str(out),
                  "--metrics-port", "0", "--pacing-ms", "10", "--instance-id", "proc-1"],
                 mongodb_uri=dmongo.uri, database=ddb.name, log=log)
    try:
        wait_sync(lambda: ddb.aggbox_dispatcher_partitions.count_documents(
                      {"owner": "proc-1"}) == PARTITIONS
                  or proc.poll() is not None, 30, "the dispatcher to take every partition")
        assert proc.poll() is None, log.read_text()
        emitted = emit(writer, docs(5), n=3)
        wait_sync(lambda: pending_entries(ddb) == 0, 30, "publication")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    check_delivery([(e["source"]["id"], e["message_id"], e["source"]["seq"])
                    for e in jsonl_envelopes(out)], emitted)
    text = log.read_text()
    assert "SIGTERM received" in text and "stopped" in text
    assert ddb.aggbox_dispatcher_partitions.count_documents(
        {"scope": f"{ddb.name}.emitters", "owner": None}) == PARTITIONS  # released
    assert ddb.aggbox_dispatcher_checkpoints.find_one({"_id": f"{ddb.name}.emitters"})


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_without_change_streams_auto_mode_falls_back_to_polling(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    faults = Faults()
    faults.add("stream_open", "no_change_streams")  # what a standalone mongod answers
    pub = ListPublisher()
    d = Dispatcher(settings(mode="auto"), store=store, publisher=pub, faults=faults)

    async def body() -> dict[str, list[str]]:
        emitted = await asyncio.to_thread(emit, writer, docs(4), n=2)
        await wait_for(lambda: pending_entries(ddb) == 0, 30, "drain by polling")
        return emitted

    emitted = asyncio.run(run_while(d, body))
    assert check_delivery(pub.delivered(), emitted)["duplicates"] == 0
    assert d.workers[0].last_active_mode == "poll"


def test_an_idle_stream_is_paced_and_swept_periodically(
        ddb: Database[Any], store: AggboxSettings) -> None:
    clock = FakeTime(hold_after=40)  # parked at the 41st pause
    d = Dispatcher(settings(pacing_ms=50, sweep_interval_s=0.3), store=store,
                   publisher=ListPublisher(), timing=clock.timing)

    async def body() -> None:
        try:
            await check()
        finally:
            clock.release()

    async def check() -> None:
        w = d.workers[0]
        await asyncio.wait_for(clock.held.wait(), 60)
        # Every empty read pauses for the pacing interval (mongo-java-server answers getMore
        # at once, so an unpaced loop would spin): 41 reads, 40 pauses of 50 ms so far.
        assert w.follower.reads == 41
        assert clock.sleeps == [pytest.approx(0.05)] * 40
        # A safety sweep each time the clock passed sweep_interval_s since the last one.
        ends = w.sweeps.completed_at
        assert ends[0] == 1000.0  # the start-up sweep, before any pause
        gaps = [b - a for a, b in itertools.pairwise(ends)]
        assert len(gaps) >= 5 and all(0.3 - 1e-9 <= g <= 0.35 + 1e-9 for g in gaps), gaps
        assert clock.now - ends[-1] < 0.3 + 1e-9  # none overdue
        assert w.stats.sweeps == len(ends)

    asyncio.run(run_while(d, body))
    assert (d.metrics.registry.get_sample_value(
        "aggbox_dispatcher_sweeps_total", {"collection": "emitters", "reason": "periodic"})
        or 0) >= 5


def test_once_to_stdout_with_json_logs(writer: StoreWriter, ddb: Database[Any],
                                       dmongo: LocalMongo) -> None:
    import os
    import subprocess
    import sys

    emitted = emit(writer, docs(3), n=2)
    env = {**os.environ, "AGGBOX_MONGODB_URI": dmongo.uri, "AGGBOX_DATABASE": ddb.name}
    done = subprocess.run(
        [sys.executable, "-m", "aggbox.commands.dispatch", "--log-json", "--collection",
         "emitters", "--publisher", "stdout", "--once"],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, timeout=60,
        check=False)
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(x) for x in done.stdout.decode().splitlines()]
    check_delivery([(x["key"], x["value"]["message_id"], x["value"]["source"]["seq"])
                    for x in lines], emitted)
    logs = [json.loads(x) for x in done.stderr.decode().splitlines() if x.strip()]
    assert logs and all({"ts", "level", "logger", "msg"} <= set(x) for x in logs)
    assert any(x.get("collection") == "emitters" for x in logs)  # structured fields
    # --once's summary is one of the JSON lines, not plain text among them
    assert any(x["msg"].startswith("aggbox dispatch --once: published 6") for x in logs)
    assert pending_entries(ddb) == 0
