"""Timers fired by the real dispatcher against the local MongoDB: due timers publish once
(as addressed input with their timer id) and leave the document only after the broker
acknowledged them; future ones wait; cancelled ones never fire; replaced ones fire once at
their new time; a kill -9 on either side of the publish loses nothing and a re-fire is a
duplicate at the receiver; two instances fire timers of every partition between them."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from aggbox.servers import LocalMongo
from aggregates import TIMER_HEADER, AggboxSettings, Message, Source, StoreWriter
from aggregates.core.partitions import PARTITIONS, partition_of
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from dispatcher.publishers.base import PublishResult
from dispatcher.publishers.record import H_KIND, KIND_INPUT, OutboundRecord
from tests.dispatcher.helpers import (
    ListPublisher,
    jsonl_envelopes,
    quick_settings,
    run_while,
    spawn,
    wait_for,
)
from tests.dispatcher.timerdomain import registry

pytestmark = [pytest.mark.mongo]

DOMAIN = "tests.dispatcher.timerdomain"
COLLECTION = {"Order": "torders", "HwOrder": "thworders"}


def settings(**over: Any) -> DispatcherSettings:
    return quick_settings(DOMAIN, once_timeout_s=60, **over)


@pytest.fixture
def twriter(ddb: Database[Any], store: AggboxSettings) -> StoreWriter:
    w = StoreWriter(ddb, registry, settings=store)
    w.ensure_indexes()
    return w


_n = Counter[str]()


def send(writer: StoreWriter, mtype: str, ids: Sequence[str], *, atype: str = "Order",
         **payload: Any) -> None:
    msgs = []
    for i in ids:
        _n[i] += 1
        msgs.append(Message(f"{mtype}-{i}-{_n[i]}", mtype, atype, i, dict(payload),
                            source=Source("Client", i, _n[i])))
    assert [o.outcome for o in writer.process(msgs)] == ["applied"] * len(ids)


def timers(db: Database[Any], atype: str = "Order") -> dict[str, list[dict[str, Any]]]:
    return {d["_id"]: d.get("timers", []) for d in db[COLLECTION[atype]].find({})}


def deliver(writer: StoreWriter, envelopes: Sequence[dict[str, Any]]) -> Counter[str]:
    """Feed published envelopes back to the writer, as a pipeline reading the topic would."""
    outcomes = writer.process([Message.from_dict(e) for e in envelopes])
    return Counter(o.outcome for o in outcomes)


class TimedPublisher(ListPublisher):
    """Records when each record was acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[str, datetime] = {}

    async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]:
        out = await super().publish(records)
        now = datetime.now(UTC)
        for r in records:
            self.at.setdefault(r.message_id, now)
        return out


@pytest.mark.parametrize("atype", ["Order", "HwOrder"])
def test_once_fires_due_timers_once_and_keeps_the_future_ones(
        atype: str, twriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    due_ids = [f"d{i}/.$" for i in range(30)]
    later_ids = [f"l{i}" for i in range(10)]
    send(twriter, "Place", due_ids, atype=atype, ms=0)
    send(twriter, "Place", later_ids, atype=atype, ms=3_600_000)
    before = timers(ddb, atype)
    expected = {t["id"] for i in due_ids for t in before[i]}
    versions = {d["_id"]: d["_v"] for d in ddb[COLLECTION[atype]].find({})}
    pub = ListPublisher()
    assert asyncio.run(Dispatcher(settings(), store=store, publisher=pub).run(once=True)) == 0
    assert sorted(r.message_id for r in pub.records) == sorted(expected)
    for r in pub.records:
        assert r.headers[H_KIND] == KIND_INPUT and r.envelope["headers"][TIMER_HEADER] == \
            "deadline"
        assert (r.message.aggregate_type, r.message.aggregate_id) == (atype, r.document_id)
    after = timers(ddb, atype)
    assert all(after[i] == [] for i in due_ids)
    assert all(after[i] == before[i] for i in later_ids)
    # The removal moved _v on, so a writer that read the document before cannot put back a
    # fired timer (its conditional write fails and it reads again).
    assert all(d["_v"] == versions[d["_id"]] + (d["_id"] in due_ids)
               for d in ddb[COLLECTION[atype]].find({}))
    # The receiver handles each once; the same messages again are duplicates.
    envelopes = [r.envelope for r in pub.records]
    assert deliver(twriter, envelopes) == Counter(applied=len(due_ids))
    assert deliver(twriter, envelopes) == Counter(duplicate=len(due_ids))
    states = {d["_id"]: d["state"] for d in ddb[COLLECTION[atype]].find({})}
    assert all(states[i]["deadlines"] == 1 and states[i]["status"] == "expired"
               for i in due_ids)
    again = ListPublisher()
    assert asyncio.run(Dispatcher(settings(), store=store, publisher=again).run(
        once=True)) == 0
    assert again.records == []


@pytest.mark.parametrize("mode", ["stream", "poll"])
def test_a_running_dispatcher_fires_on_time_never_a_cancelled_timer_and_a_replaced_one_once(
        mode: str, twriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    pub = TimedPublisher()
    d = Dispatcher(settings(mode=mode), store=store, publisher=pub)

    async def body() -> None:
        await asyncio.to_thread(send, twriter, "Place", ["a", "b", "c"], ms=1500)
        await asyncio.to_thread(send, twriter, "Confirm", ["b"])
        await asyncio.to_thread(send, twriter, "Postpone", ["c"], ms=3000)
        await asyncio.to_thread(send, twriter, "Remind", ["r"], customer="cust/1", ms=500)
        pending = timers(ddb)
        due = {i: ts[0]["due"].replace(tzinfo=UTC) for i, ts in pending.items() if ts}
        assert sorted(due) == ["a", "c", "r"]
        ids = {i: pending[i][0]["id"] for i in due}
        await wait_for(lambda: set(pub.at) == set(ids.values()), 30, "three timers fired")
        await wait_for(lambda: all(not ts for ts in timers(ddb).values()), 10,
                       "the fired timers removed")
        for i, tid in ids.items():
            assert pub.at[tid] >= due[i], f"{i} fired before it was due"
        assert Counter(r.message_id for r in pub.records) == Counter(ids.values())
        remind = next(r for r in pub.records if r.message_id == ids["r"])
        assert (remind.message.aggregate_type, remind.message.aggregate_id) == ("Customer",
                                                                              "cust/1")
        c = next(r for r in pub.records if r.message_id == ids["c"])
        assert c.message.payload == {"n": 2}

    asyncio.run(run_while(d, body))
    lag = d.metrics.registry.get_sample_value("aggbox_dispatcher_timer_lag_seconds_count",
                                              {"collection": "torders"})
    assert d.metrics.registry.get_sample_value("aggbox_dispatcher_timers_fired_total",
                                               {"collection": "torders"}) == 3 == lag


@pytest.mark.parametrize("point", ["timer_before_publish", "timer_after_publish"])
def test_kill_9_around_firing_loses_nothing_and_a_refire_is_a_duplicate(
        point: str, twriter: StoreWriter, ddb: Database[Any], dmongo: LocalMongo,
        tmp_path: Path) -> None:
    ids = ["k-1", "k/2", "k.$3"]
    send(twriter, "Place", ids, ms=0)
    expected = {t["id"] for ts in timers(ddb).values() for t in ts}
    out = tmp_path / "out"
    log = tmp_path / "dispatch.log"
    args = ["--aggregates", DOMAIN, "--publisher", "jsonl", "--jsonl-dir", str(out),
            "--metrics-port", "0", "--once"]
    crashed = spawn(args, mongodb_uri=dmongo.uri, database=ddb.name, log=log,
                    fault=f"{point}:kill")
    assert crashed.wait(120) == -signal.SIGKILL, log.read_text()
    first = jsonl_envelopes(out) if out.exists() else []
    assert len(first) == (3 if point == "timer_after_publish" else 0)
    assert {t["id"] for ts in timers(ddb).values() for t in ts} == expected  # none lost
    finished = spawn(args, mongodb_uri=dmongo.uri, database=ddb.name, log=log)
    assert finished.wait(120) == 0, log.read_text()
    envelopes = jsonl_envelopes(out)
    assert Counter(e["message_id"] for e in envelopes) == Counter(
        {i: 2 if first else 1 for i in expected})
    assert all(not ts for ts in timers(ddb).values())
    assert deliver(twriter, envelopes) == Counter(
        applied=3, **({"duplicate": 3} if first else {}))
    assert all(d["state"]["deadlines"] == 1 for d in ddb.torders.find({}))


def test_two_instances_fire_the_timers_of_every_partition_between_them(
        twriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    pub_a, pub_b = ListPublisher(), ListPublisher()
    over = dict(lease_ttl_s=3, takeover_grace_s=0.2)
    a = Dispatcher(settings(instance_id="A", **over), store=store, publisher=pub_a)
    b = Dispatcher(settings(instance_id="B", **over), store=store, publisher=pub_b)
    ids = [f"p{i}" for i in range(300)]

    def publishing(d: Dispatcher) -> frozenset[int]:
        w = next((w for w in d.workers if w.name == "torders"), None)
        return w.selection.partitions if w is not None and w.mode != "standby" else frozenset()

    async def body() -> None:
        task_b = asyncio.create_task(b.run())
        try:
            await wait_for(lambda: len(publishing(a)) + len(publishing(b)) == PARTITIONS
                           and bool(publishing(a)) and bool(publishing(b)), 30, "a split")
            await asyncio.to_thread(send, twriter, "Place", ids, ms=1000)
            expected = {t["id"] for ts in timers(ddb).values() for t in ts}
            await wait_for(lambda: {r.message_id for r in pub_a.records + pub_b.records}
                           == expected, 30, "every timer fired")
            # Each fired by the instance holding its aggregate's partition, once.
            for pub, d in ((pub_a, a), (pub_b, b)):
                assert {partition_of(r.document_id) for r in pub.records} <= publishing(d)
            assert pub_a.records and pub_b.records
            assert len(pub_a.records) + len(pub_b.records) == len(expected)
        finally:
            b.request_stop()
            assert await asyncio.wait_for(task_b, 60) == 0

    asyncio.run(run_while(a, body))


def test_a_graceful_stop_finishes_the_round_in_progress(
        twriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    """Stopped while the broker is slow to acknowledge: the stop waits for the round, so the
    acknowledged timers are removed (a cancelled round would leave them to be published
    again by the next instance)."""
    send(twriter, "Place", [f"g{i}" for i in range(20)], ms=0)
    pub = ListPublisher(delay=1.5)
    d = Dispatcher(settings(), store=store, publisher=pub)

    async def body() -> None:
        await wait_for(lambda: pub.calls >= 1, 30, "a publish in progress")

    asyncio.run(run_while(d, body))
    acked = {r.message_id for r in pub.records}
    stored = {t["id"] for ts in timers(ddb).values() for t in ts}
    assert acked and not acked & stored
    assert len(acked) + len(stored) == 20


def test_due_timers_fire_earliest_first_page_after_page(
        twriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    """More due timers than one page: the earliest go first (not the collection's natural
    order, where an overdue timer could wait behind any number of later ones)."""
    for k in range(15):  # inserted, and by id, in the opposite order of their due times
        send(twriter, "Place", [f"z{k:02d}"], ms=200 * (14 - k))
    due = {i: ts[0]["due"] for i, ts in timers(ddb).items()}
    assert sorted(due, key=due.__getitem__) == sorted(due, reverse=True)
    time.sleep(3.0)  # every one is due
    pub = ListPublisher()
    assert asyncio.run(Dispatcher(settings(batch_size=5), store=store, publisher=pub).run(
        once=True)) == 0
    order = [due[r.document_id] for r in pub.records]
    assert len(order) == 15 and order == sorted(order)
