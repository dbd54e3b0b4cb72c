"""The collection worker's parts, each without the others and without a server: lease
rounds, sweep schedule, the error model of a worker step — time injected."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from pymongo.errors import AutoReconnect, OperationFailure

from dispatcher.core.errors import FatalStoreError, check_fatal, one_line
from dispatcher.core.faults import Faults
from dispatcher.core.settings import DispatcherSettings
from dispatcher.leases.balance import LeaseView
from dispatcher.leases.balancer import Balancer
from dispatcher.leases.partlease import Claimed
from dispatcher.observe.metrics import Health, Metrics
from dispatcher.outbox.sweep import Sweeps
from dispatcher.worker import CollectionWorker
from tests.dispatcher.helpers import FakeTime, ListPublisher

AUTH_FAILED = OperationFailure("Authentication failed.", code=18,
                               details={"ok": 0, "code": 18, "codeName": "AuthenticationFailed"})


class ScriptedLeases:
    """A store of partition leases in memory whose heartbeat answers from a script (None:
    fine, or an exception to raise); every lease is free and claims always succeed."""

    def __init__(self, *answers: Exception | None, partitions: int = 4) -> None:
        self.answers = list(answers)
        self.owner = "me"
        self.partitions = partitions
        self.held: dict[int, float] = {}
        self.released: list[int] = []
        self.left = False
        self.ttl_s, self.margin = 3600.0, 0.2

    async def ensure(self) -> None:
        return None

    async def heartbeat(self, *, published: int = 0) -> None:
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer

    def lease_valid_until(self) -> float:
        return time.monotonic() + 3600

    async def read(self) -> tuple[dict[str, datetime], dict[int, LeaseView]]:
        return {}, {p: LeaseView(p, self.owner if p in self.held else None, _FAR)
                    for p in range(self.partitions)}

    def confirm(self, leases: Any) -> set[int]:
        return set()

    async def claim(self, wanted: Any, seen: Any) -> list[Claimed]:
        got = [Claimed(p, 1, "new", None) for p in wanted]
        self.held.update({c.partition: time.monotonic() + 3600 for c in got})
        return got

    async def release(self, partitions: Any) -> None:
        self.released += list(partitions)

    async def leave(self) -> None:
        self.left = True

    def publishable(self) -> frozenset[int]:
        return frozenset(self.held)

    def holds(self, partitions: Any) -> bool:
        return set(partitions) <= set(self.held)

    def next_grace_end(self) -> float | None:
        return None

    def now(self) -> datetime:
        return datetime.now(UTC)


_FAR = datetime(2100, 1, 1, tzinfo=UTC)


def balancer(leases: ScriptedLeases) -> tuple[Balancer, list[str]]:
    errors: list[str] = []
    b = Balancer(leases, name="orders", interval_s=0.01, health=Health(),  # type: ignore[arg-type]
                 metrics=Metrics(), stop=asyncio.Event(), timing=FakeTime().timing,
                 on_contact=lambda: None, on_error=errors.append)
    return b, errors


def test_lease_rounds_survive_transient_errors_and_claim_the_whole_share() -> None:
    async def main() -> None:
        leases = ScriptedLeases(AutoReconnect("reset"), AutoReconnect("again"))
        b, errors = balancer(leases)
        b.start()
        try:
            assert await asyncio.wait_for(b.wait_active(), 10) == frozenset(range(4))
        finally:
            await b.close()
        assert errors == ["AutoReconnect: reset", "AutoReconnect: again"]
        assert b.quota == 4 and leases.left

    asyncio.run(main())


def test_a_wrong_password_in_a_lease_round_is_fatal() -> None:
    async def main() -> None:
        b, _ = balancer(ScriptedLeases(AUTH_FAILED))
        b.start()
        try:
            with pytest.raises(FatalStoreError,
                               match=r"orders: partition leases: .*code 18.*password"):
                await asyncio.wait_for(b.wait_active(), 10)
        finally:
            await b.close()

    asyncio.run(main())


def test_sweeps_fall_due_every_interval_on_the_injected_clock() -> None:
    clock = FakeTime()
    s = Sweeps(None, None, name="orders", page_size=10, interval_s=30,  # type: ignore[arg-type]
               stop=asyncio.Event(), metrics=Metrics(), timing=clock.timing)
    assert s.due(periodic=False) is False
    assert s.due(periodic=True) and s.reason == "periodic"  # never swept yet
    s.request(None)
    s.next_at = clock.now + 30
    clock.now += 29.9
    assert not s.due(periodic=True)
    clock.now += 0.1
    assert s.due(periodic=True)
    s.request("history_lost")
    assert s.due(periodic=False) and s.reason == "history_lost"


def worker(clock: FakeTime) -> CollectionWorker:
    # A client that never connects: the steps below raise before any I/O.
    client: AsyncMongoClient[Any] = AsyncMongoClient("mongodb://127.0.0.1:9/?connect=false")
    settings = DispatcherSettings.load(collections=["orders"], backoff_initial_ms=100,
                                       backoff_max_ms=1000)
    health = Health()
    health.beat("orders")
    return CollectionWorker(db=client["shop"], collection="orders", settings=settings,
                            publisher=ListPublisher(), dead_letter_collection="dl",
                            metrics=Metrics(), health=health, faults=Faults(),
                            stop=asyncio.Event(), owner="me", timing=clock.timing)


def test_a_transient_store_error_in_a_step_backs_off() -> None:
    async def main() -> None:
        clock = FakeTime(random=0.5)
        w = worker(clock)

        async def step() -> bool:
            raise AutoReconnect("connection reset")

        assert await w._guarded(step) is True
        assert await w._guarded(step) is True
        assert w.stats.backoffs == 2 and w.retries.wait_s() == pytest.approx(0.1)
        assert w.last_error == "AutoReconnect: connection reset"

    asyncio.run(main())


def test_a_failed_timer_round_is_logged_and_counted_without_backing_off_the_outbox(
        ) -> None:
    async def main() -> None:
        w = worker(FakeTime(random=0.5))
        w.timers.on_error(AutoReconnect("connection reset"))
        assert w.retries.wait_s() == 0  # the outbox side goes on
        assert w.last_error == "AutoReconnect: connection reset"
        assert w.metrics.registry.get_sample_value(
            "aggbox_dispatcher_backoffs_total", {"collection": "orders", "cause": "timers"}) == 1

    asyncio.run(main())


def test_a_fatal_store_error_in_a_step_ends_the_worker() -> None:
    async def main() -> None:
        w = worker(FakeTime())

        async def step() -> bool:
            raise OperationFailure("not authorized on shop to execute command { find }",
                                   code=13)

        with pytest.raises(FatalStoreError, match=r"code 13.*grant") as info:
            await w._guarded(step)
        assert isinstance(info.value.__cause__, OperationFailure)
        assert w.stats.backoffs == 0

    asyncio.run(main())


def test_fatal_messages_are_one_line_without_credentials() -> None:
    from pymongo.errors import InvalidURI

    exc = InvalidURI("bad host in mongodb://alice:hunter2@db:x/\nmore")
    with pytest.raises(FatalStoreError) as info:
        check_fatal(exc, "MongoDB URI")
    text = str(info.value)
    assert "hunter2" not in text and "\n" not in text and text.startswith("MongoDB URI:")
    assert one_line("a, full error: {'ok': 0}") == "a"


# -- stream mode, with a scripted change stream ---------------------------------------------
class FakeAdmin:
    async def command(self, name: str) -> dict[str, Any]:
        from bson import Timestamp

        return {"ok": 1, "operationTime": Timestamp(1_700_000_000, 1)}


class FakeDb:
    class client:  # mimics db.client.admin
        admin = FakeAdmin()


class ScriptedFollower:
    """A change stream answering ``read`` from a script (a StreamBatch or an exception)."""

    def __init__(self, *reads: Any) -> None:
        self.reads = list(reads)
        self.opened: list[dict[str, Any]] = []
        self.is_open = False
        self.resume_token: dict[str, Any] | None = {"_data": "t0"}

    async def open(self, **kwargs: Any) -> None:
        self.opened.append({k: v for k, v in kwargs.items() if v is not None})
        self.is_open = True

    async def read(self) -> Any:
        item = self.reads.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def end(self) -> Any:
        raise AssertionError("not used")

    async def close(self) -> None:
        self.is_open = False


class MemoryCheckpoints:
    def __init__(self, token: dict[str, Any] | None = None) -> None:
        self.token = token
        self.saved: list[Any] = []

    async def load(self) -> dict[str, Any] | None:
        return self.token

    async def save(self, token: Any, *, owner: str) -> bool:
        self.saved.append(token)
        return True


def stream_mode(follower: ScriptedFollower, checkpoints: MemoryCheckpoints,
                retry_pending: bool = False) -> tuple[Any, list[str], list[Any]]:
    from dispatcher.outbox.streammode import StreamMode

    sweeps: list[str] = []
    published: list[Any] = []

    async def publish(docs: list[Any]) -> None:
        published.extend(docs)

    mode = StreamMode(FakeDb(), follower, checkpoints, name="orders",  # type: ignore[arg-type]
                      owner="me", faults=Faults(), metrics=Metrics(),
                      timing=FakeTime().timing, request_sweep=sweeps.append, publish=publish,
                      retry_pending=lambda: retry_pending, on_contact=lambda: None)
    return mode, sweeps, published


def test_stream_starts_from_the_checkpoint_and_saves_after_a_published_batch() -> None:
    from dispatcher.outbox.stream import StreamBatch

    async def main() -> None:
        doc = {"_id": "o1", "outbox": [{"id": "m1"}]}
        follower = ScriptedFollower(StreamBatch([doc], 1, None))
        cps = MemoryCheckpoints({"_data": "saved"})
        mode, sweeps, published = stream_mode(follower, cps)
        await mode.start()
        assert follower.opened == [{"resume_after": {"_data": "saved"}}]
        assert sweeps == ["startup"]
        assert await mode.step() is True
        assert published == [doc] and cps.saved == [{"_data": "t0"}]

    asyncio.run(main())


def test_no_checkpoint_while_a_retry_is_pending() -> None:
    from dispatcher.outbox.stream import StreamBatch

    async def main() -> None:
        follower = ScriptedFollower(StreamBatch([{"_id": "o1", "outbox": [{}]}], 1, None))
        cps = MemoryCheckpoints()
        mode, _, _ = stream_mode(follower, cps, retry_pending=True)
        await mode.start()
        assert "start_at" in follower.opened[0]  # no checkpoint: at the server's time
        await mode.step()
        assert cps.saved == []

    asyncio.run(main())


def test_history_lost_while_reading_means_a_new_stream_and_a_full_sweep() -> None:
    async def main() -> None:
        lost = OperationFailure("history lost", code=286)
        follower = ScriptedFollower(lost)
        mode, sweeps, _ = stream_mode(follower, MemoryCheckpoints())
        await mode.start()
        assert await mode.step() is True
        assert mode.restarts == 1 and sweeps == ["startup", "history_lost"]
        assert len(follower.opened) == 2 and "start_at" in follower.opened[1]

    asyncio.run(main())


def test_invalidate_reopens_after_the_event_with_a_sweep() -> None:
    from dispatcher.outbox.stream import StreamBatch

    async def main() -> None:
        ended = StreamBatch([], 1, None, ended=True, end_token={"_data": "inv"})
        follower = ScriptedFollower(ended)
        mode, sweeps, _ = stream_mode(follower, MemoryCheckpoints())
        await mode.start()
        await mode.step()
        assert mode.invalidations == 1 and sweeps[-1] == "invalidated"
        assert follower.opened[-1] == {"start_after": {"_data": "inv"}}

    asyncio.run(main())


def test_with_pulls_a_batch_token_is_saved_only_after_its_pull() -> None:
    """The pull of a batch runs on while the next batches are read and published; a batch's
    token is saved once its pull is done, and a failed pull is raised before anything new
    is published (no checkpoint past it)."""
    from dispatcher.outbox.stream import StreamBatch
    from dispatcher.outbox.streammode import StreamMode

    class Pulls:  # the worker's cycle, as far as stream mode looks
        def __init__(self) -> None:
            self.pulls_started = self.pulls_done = 0
            self.failing = False
            self.running = False

        async def drain(self) -> None:
            await self.drain_if_done()

        async def drain_if_done(self) -> None:
            if self.failing:
                self.failing = False
                raise AutoReconnect("pull failed")

    async def main() -> None:
        doc = {"_id": "o1", "outbox": [{"id": "m1"}]}
        follower = ScriptedFollower(*[StreamBatch([doc], 1, None) for _ in range(3)])
        cps = MemoryCheckpoints()
        published: list[Any] = []
        pulls = Pulls()

        async def publish(docs: list[Any]) -> None:
            published.extend(docs)
            pulls.pulls_started += 1  # the batch's pull starts, and runs on

        mode = StreamMode(FakeDb(), follower, cps, name="orders",  # type: ignore[arg-type]
                          owner="me", faults=Faults(), metrics=Metrics(),
                          timing=FakeTime().timing, request_sweep=lambda _: None,
                          publish=publish, retry_pending=lambda: False,
                          on_contact=lambda: None, pulls=pulls)
        await mode.start()
        await mode.step()  # published; its pull still runs: no checkpoint yet
        assert len(published) == 1 and cps.saved == []
        follower.resume_token = {"_data": "t1"}
        await mode.step()  # the second batch is published while the first pull runs
        assert len(published) == 2 and cps.saved == []
        pulls.pulls_done = 1  # the first pull is done: its batch's token is saved
        follower.resume_token = {"_data": "t2"}
        pulls.failing = True  # … and the second one failed
        with pytest.raises(AutoReconnect):
            await mode.step()
        assert len(published) == 2 and cps.saved == [{"_data": "t0"}]

    asyncio.run(main())


def test_a_read_returns_what_one_getmore_brought() -> None:
    from collections import deque

    from dispatcher.outbox.stream import StreamFollower

    class Stream:  # pymongo's AsyncChangeStream, as far as read() looks
        def __init__(self, *batches: list[dict[str, Any]]) -> None:
            self.batches = list(batches)
            self.buffer: deque[dict[str, Any]] = deque()
            self.alive = True
            self.resume_token: dict[str, Any] = {"_data": "s"}
            self.getmores = 0

        async def try_next(self) -> dict[str, Any] | None:
            if not self.buffer:
                self.getmores += 1
                self.buffer.extend(self.batches.pop(0) if self.batches else [])
            if not self.buffer:
                return None
            event = self.buffer.popleft()
            # The change streams specification: the event's own token while the batch
            # lasts, the batch's postBatchResumeToken after its last event.
            self.resume_token = (event["_id"] if self.buffer
                                 else {"_data": f"pbrt-{self.getmores}"})
            return event

    def event(i: int) -> dict[str, Any]:
        return {"_id": {"_data": str(i)}, "operationType": "update",
                "fullDocument": {"_id": f"d{i}", "outbox": [{"id": f"m{i}"}]}}

    stream = Stream([event(1), event(2)], [event(3)])
    follower = StreamFollower(None, batch_size=10, pacing_s=0.001)  # type: ignore[arg-type]
    follower._stream = stream  # type: ignore[assignment]
    first = asyncio.run(follower.read())
    assert [d["_id"] for d in first.documents] == ["d1", "d2"] and stream.getmores == 1
    second = asyncio.run(follower.read())
    assert [d["_id"] for d in second.documents] == ["d3"] and stream.getmores == 2


def test_a_read_without_batch_ends_stops_pacing_s_after_its_first_event() -> None:
    """mongo-java-server sends no postBatchResumeToken, so a read cannot tell where the
    server's batch ended; under a steady load every getMore brings something and reading on
    until an empty one made the batch grow to batch_size (issue 35: stream p50 354 ms at
    1,000 entries/s, polling 95 ms). What came within pacing_s of the first event goes out."""
    from dispatcher.core.timing import Timing
    from dispatcher.outbox.stream import StreamFollower

    now = [0.0]

    class Stream:  # a getMore takes 10 ms and always brings one event; no batch end known
        alive = True

        def __init__(self) -> None:
            self.getmores = 0
            self.resume_token: dict[str, Any] | None = None

        async def try_next(self) -> dict[str, Any]:
            self.getmores += 1
            now[0] += 0.01
            event: dict[str, Any] = {"_id": {"_data": str(self.getmores)},
                                     "operationType": "update",
                     "fullDocument": {"_id": f"d{self.getmores}",
                                      "outbox": [{"id": f"m{self.getmores}"}]}}
            self.resume_token = event["_id"]  # the event's own token: the batch goes on
            return event

    follower = StreamFollower(None, batch_size=500, pacing_s=0.025,  # type: ignore[arg-type]
                              timing=Timing(monotonic=lambda: now[0]))
    stream = Stream()
    follower._stream = stream  # type: ignore[assignment]
    batch = asyncio.run(follower.read())
    # first event at 10 ms; the events of 20 and 30 ms come within 25 ms of it, the one of
    # 40 ms is past it: four events, not 500.
    assert [d["_id"] for d in batch.documents] == ["d1", "d2", "d3", "d4"]
    assert stream.getmores == 4
