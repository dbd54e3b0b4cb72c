"""Fencing in the dispatcher (docs/design.md "Fencing"): records carry the lease they were
published under, and an owner whose lease ended before the publisher answered does not pull
what it sent — the next owner publishes it again, under a higher epoch, so a consumer that
drops late copies loses nothing."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.database import Database

from aggregates import AggboxSettings, StoreWriter, parse_fence
from aggregates.core.partitions import partition_of
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from dispatcher.publishers.base import PublishResult
from dispatcher.publishers.record import H_FENCE
from tests.dispatcher.helpers import (
    ListPublisher,
    check_delivery,
    emit,
    pending_entries,
    run_while,
    wait_for,
)

pytestmark = [pytest.mark.mongo]


def _in(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def test_entries_acknowledged_after_the_lease_ended_are_left_to_the_next_owner(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        caplog: pytest.LogCaptureFixture) -> None:
    started, answer = asyncio.Event(), asyncio.Event()

    class Slow(ListPublisher):
        async def publish(self, records: Any) -> list[PublishResult]:
            if not answer.is_set():
                started.set()
                await answer.wait()  # "at the broker" until the test lets it answer
            return await super().publish(records)

    emitted = emit(writer, [f"a{i:03d}" for i in range(10)], n=2)
    stolen = "a000"
    p = partition_of(stolen)
    scope = f"{ddb.name}.emitters"
    pub = Slow()
    d = Dispatcher(DispatcherSettings.load(
        collections=["emitters"], metrics_port=0, pacing_ms=10, poll_interval_ms=50,
        lease_ttl_s=1.5, takeover_grace_s=0.2, backoff_initial_ms=50, backoff_max_ms=400,
        batch_size=50, max_batch_records=40, instance_id="A"), store=store, publisher=pub)
    members, leases = ddb.aggbox_dispatcher_members, ddb.aggbox_dispatcher_partitions
    in_p = {a for a in emitted if partition_of(a) == p}

    def outboxes() -> dict[str, list[str]]:
        return {d["_id"]: [e["id"] for e in d["outbox"]]
                for d in ddb.emitters.find({"outbox.0": {"$exists": True}}, {"outbox": 1})}

    async def body() -> None:
        await asyncio.wait_for(started.wait(), 20)
        worker = d.workers[0]
        assert worker.leases.epochs.get(p) == 1
        # While the batch is at the broker, another instance takes partition p (as after a
        # pause of A past its lease): A learns it at its next lease round.
        members.insert_one({"_id": "intruder", "scope": scope, "member": "intruder",
                            "instance": "intruder", "expires_at": _in(3600)})
        leases.update_one({"scope": scope, "partition": p},
                          {"$set": {"owner": "intruder"}, "$inc": {"epoch": 1}})
        await wait_for(lambda: not worker.leases.holds((p,)), 10, "A to lose partition p")
        answer.set()  # the acknowledgement comes after the lease ended
        # What A still holds is pulled; nothing of p is: its entries wait for the
        # partition's owner …
        await wait_for(lambda: outboxes() == {a: emitted[a] for a in emitted if a in in_p},
                       10, "the other partitions' entries to be pulled")
        rounds = worker.balancer.rounds
        await wait_for(lambda: worker.balancer.rounds >= rounds + 2, 10, "two lease rounds")
        assert outboxes() == {a: emitted[a] for a in in_p}
        # … who publishes them again under its own epoch (here A again, once the intruder
        # is gone: epoch 3).
        members.update_one({"_id": "intruder"}, {"$set": {"expires_at": _in(-1)}})
        await wait_for(lambda: pending_entries(ddb) == 0, 20, "the takeover")

    with caplog.at_level(logging.WARNING, logger="aggbox.dispatcher"):
        asyncio.run(run_while(d, body))
    check_delivery(pub.delivered(), emitted)  # nothing lost
    fences: dict[str, list[int]] = {}
    for r in pub.records:
        fence = parse_fence(r.headers[H_FENCE])
        assert fence.scope == scope and fence.partition == partition_of(str(r.document_id))
        fences.setdefault(r.message_id, []).append(fence.epoch)
    for a in in_p:
        for mid in emitted[a]:
            assert fences[mid] == [1, 3], fences[mid]  # the late copy, then the next owner's
    for a in set(emitted) - in_p:
        for mid in emitted[a]:
            assert fences[mid] == [1], fences[mid]  # pulled at once: published once
    assert any(f"{2 * len(in_p)} published entries of {len(in_p)} document(s) left in the "
               "outbox" in r.getMessage() for r in caplog.records)
