"""One collection's dispatcher: standby until it holds the lease, then stream (or poll) mode.

Stream mode (docs/design.md "The dispatcher", step 1): open the change stream first —
from the saved resume token, else at the server's current time — then sweep every document
with a pending outbox, then follow the stream. After each published batch the resume token is
saved. An unusable token (history lost, code 286, or invalid) means: new stream at the
current time, full sweep, a warning with counts. An ``invalidate`` event (the collection was
dropped or renamed) ends the stream: a new one is opened ``start_after`` it (else at the
current time), with a full sweep at once.

Polling mode (servers without change streams): sweep, publish, pause when idle. Same
guarantees; higher latency.

Both modes sweep periodically as a safety net, back off (exponentially, with jitter) after
failures without pulling anything, and stop publishing as soon as the lease is lost.

Every successful MongoDB round trip is reported to :class:`~dispatcher.metrics.Health`
(``contact``): a worker that only retries failing calls is not healthy. ``progress_at``
is what ``--once`` watches (:attr:`CollectionWorker.progress_at`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import OperationFailure, PyMongoError

from aggregates.document import F_OUTBOX, F_TYPE
from dispatcher.cycle import Cycle, CycleResult
from dispatcher.faults import Faults, InjectedInvalidate
from dispatcher.inflight import InFlight
from dispatcher.lease import Lease
from dispatcher.metrics import Health, Metrics
from dispatcher.publishers.base import Publisher
from dispatcher.settings import DispatcherSettings
from dispatcher.stream import (
    CHANGE_STREAMS_UNSUPPORTED,
    TOKEN_UNUSABLE,
    Checkpoints,
    StreamFollower,
    latest_documents,
    server_time,
)
from dispatcher.sweep import PENDING, sweep

__all__ = ["Backoff", "CollectionWorker", "WorkerStats"]

log = logging.getLogger("aggbox.dispatcher")

_IDLE_CHECKPOINT_S = 1.0


class Backoff:
    """Exponential backoff with jitter: the n-th delay is uniform in [d/2, d] with
    ``d = min(max, initial · 2ⁿ)`` — never zero, so a failing loop never spins."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next(self) -> float:
        d = min(self.max_s, self.initial_s * 2 ** min(self.attempt, 30))
        self.attempt += 1
        return float(d / 2 + self._rng.random() * d / 2)

    def reset(self) -> None:
        self.attempt = 0


@dataclass(slots=True)
class WorkerStats:
    published: int = 0
    dead_lettered: int = 0
    stale: int = 0
    sweeps: int = 0
    stream_restarts: int = 0
    stream_invalidations: int = 0
    backoffs: int = 0
    activations: int = 0


class _LeaseLost(Exception):
    pass


class CollectionWorker:
    """Dispatches one collection until ``stop`` is set (or, with ``once``, until drained)."""

    def __init__(
        self,
        *,
        db: AsyncDatabase[Any],
        collection: str,
        settings: DispatcherSettings,
        publisher: Publisher,
        dead_letter_collection: str,
        metrics: Metrics,
        health: Health,
        faults: Faults,
        stop: asyncio.Event,
        owner: str,
        source_type: str | None = None,
        once: bool = False,
    ) -> None:
        self.db = db
        self.coll = db[collection]
        self.name = collection
        self.settings = settings
        self.metrics = metrics
        self.health = health
        self.faults = faults
        self.stop = stop
        self.once = once
        key = f"{db.name}.{collection}"
        self.lease = Lease(db[settings.lease_collection], key, owner, ttl_s=settings.lease_ttl_s)
        self.checkpoints = Checkpoints(db[settings.checkpoint_collection], key)
        self.inflight = InFlight(done_capacity=settings.done_cache_size)
        self.backoff = Backoff(settings.backoff_initial_ms / 1000, settings.backoff_max_ms / 1000)
        self.cycle = Cycle(
            self.coll, publisher=publisher, inflight=self.inflight,
            dead_letters=db[dead_letter_collection], topic_template=settings.topic_template,
            max_batch_records=settings.max_batch_records, metrics=metrics, faults=faults,
            lease_held=lambda: self.lease.held, source_type=source_type,
            backoff_s=lambda n: min(settings.backoff_max_ms,
                                    settings.backoff_initial_ms * 2 ** n) / 1000,
        )
        self.follower = StreamFollower(self.coll, batch_size=settings.batch_size,
                                       pacing_s=settings.pacing_ms / 1000)
        self.stats = WorkerStats()
        self.mode: str = "standby"
        self.last_active_mode: str | None = None
        self._retry: dict[Any, None] = {}
        self._retry_at = 0.0
        self._sweep_reason: str | None = None
        self._sweep_started: CycleResult | None = None
        self._next_sweep = 0.0
        self._last_idle_checkpoint = 0.0
        self._drained = False
        self._last_sweep: CycleResult | None = None
        self._start_after: Mapping[str, Any] | None = None  # reopen after an invalidate
        #: last time this worker got anywhere (``--once`` gives up after once_timeout_s
        #: without): a server answer while standby, published entries or a completed sweep
        #: while active
        self.progress_at = time.monotonic()
        self.last_error: str | None = None

    # -- lifecycle ----------------------------------------------------------------------
    async def run(self) -> None:
        self.metrics.lease_active.labels(self.name).set(0)
        self.metrics.set_mode(self.name, "standby")
        try:
            while not self.stop.is_set() and not self._drained:
                if not await self._wait_for_lease():
                    break
                renew = asyncio.create_task(self._renew_loop(), name=f"lease-{self.name}")
                try:
                    await self._active()
                except _LeaseLost:
                    pass
                except PyMongoError as exc:  # e.g. the server went away while starting
                    self._failed("store", exc)
                    await self._sleep(self._retry_at - time.monotonic())
                    continue
                finally:
                    renew.cancel()
                    await asyncio.gather(renew, return_exceptions=True)
                    await self.follower.close()
                if not self.stop.is_set() and not self._drained:
                    log.warning("%s: lease lost; publishing stopped, back to standby", self.name,
                                extra={"collection": self.name})
                self.metrics.lease_active.labels(self.name).set(0)
                self.metrics.set_mode(self.name, "standby")
                self.mode = "standby"
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        await self.follower.close()
        if self.lease.holder == self.lease.owner:
            try:
                await self.lease.release()
            except PyMongoError as exc:
                log.warning("%s: could not release the lease (%s); it expires by itself",
                            self.name, exc, extra={"collection": self.name})
        self.metrics.lease_active.labels(self.name).set(0)
        self.health.beat(self.name, role="stopped")

    def _contact(self) -> None:
        self.health.contact(self.name)

    def _progress(self) -> None:
        self.progress_at = time.monotonic()

    def failure_summary(self) -> str:
        """The last error, shortened to one line (for ``--once`` giving up)."""
        if not self.last_error:
            return "no error reported"
        text = self.last_error.splitlines()[0] if self.last_error.strip() else ""
        text = text.split(", Timeout: ")[0]  # pymongo appends the whole topology
        return "last error: " + (text if len(text) <= 200 else text[:197] + "...")

    async def _sleep(self, seconds: float) -> None:
        """Sleep, waking early when stop is requested."""
        if seconds <= 0 or self.stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def _wait_for_lease(self) -> bool:
        announced = False
        while not self.stop.is_set():
            try:
                acquired = await self.lease.acquire()
                self._contact()
                self._progress()
                if acquired:
                    return True
            except PyMongoError as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("%s: lease check failed: %s", self.name, exc,
                            extra={"collection": self.name})
            self.health.beat(self.name, role="standby", mode="standby")
            if not announced:
                log.info("%s: standby; lease held by %s", self.name, self.lease.holder,
                         extra={"collection": self.name, "holder": self.lease.holder})
                announced = True
            await self._sleep(self.settings.renew_interval_s)
        return False

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.renew_interval_s)
            try:
                acquired = await self.lease.acquire()
                self._contact()
                if not acquired:
                    log.warning("%s: lease taken over by %s", self.name, self.lease.holder,
                                extra={"collection": self.name})
                    self.lease.forget()
                    return
            except PyMongoError as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("%s: lease renewal failed (%s); valid for now: %s", self.name, exc,
                            self.lease.held, extra={"collection": self.name})

    def _keep_going(self) -> bool:
        if self.stop.is_set() or self._drained:
            return False
        if not self.lease.held:
            raise _LeaseLost()
        return True

    # -- active ---------------------------------------------------------------------------
    async def _active(self) -> None:
        self.stats.activations += 1
        self.metrics.lease_active.labels(self.name).set(1)
        self.health.beat(self.name, role="active")
        self._retry.clear()
        self._retry_at = 0.0
        self.backoff.reset()
        if self.once:
            await self._run_once()
            return
        mode = self.settings.mode
        if mode in ("auto", "stream"):
            try:
                await self._start_stream()
                mode = "stream"
            except OperationFailure as exc:
                if exc.code not in CHANGE_STREAMS_UNSUPPORTED or self.settings.mode == "stream":
                    raise
                log.warning("%s: the server has no change streams (%s); polling mode",
                            self.name, exc, extra={"collection": self.name})
                mode = "poll"
        self.mode = self.last_active_mode = mode
        self.metrics.set_mode(self.name, mode)
        self.health.beat(self.name, role="active", mode=mode)
        log.info("%s: active (%s mode)", self.name, mode, extra={"collection": self.name,
                                                                 "mode": mode})
        if mode == "stream":
            await self._follow()
        else:
            self._sweep_reason = None
            await self._poll()

    async def _guarded(self, step: Any) -> bool:
        """Run one step of a loop; store/broker failures back off instead of ending the
        worker. Returns what the step returned (``True``: it did something)."""
        try:
            return bool(await step())
        except (_LeaseLost, asyncio.CancelledError):
            raise
        except PyMongoError as exc:
            self._failed("store", exc)
        except Exception as exc:
            log.exception("%s: unexpected error: %s", self.name, exc,
                          extra={"collection": self.name})
            self._failed("error", exc)
        return True

    def _failed(self, cause: str, exc: BaseException) -> None:
        delay = self.backoff.next()
        self._retry_at = time.monotonic() + delay
        self.stats.backoffs += 1
        self.metrics.backoffs.labels(self.name, cause).inc()
        self.health.beat(self.name)
        self.last_error = self.health.workers[self.name].error = f"{type(exc).__name__}: {exc}"
        log.warning("%s: %s failure (%s); retrying in %.2fs", self.name, cause, exc, delay,
                    extra={"collection": self.name, "cause": cause})

    def _absorb(self, res: CycleResult) -> None:
        self.stats.published += res.published
        self.stats.dead_lettered += res.dead_lettered
        self.stats.stale += res.stale
        if res.retry:
            for key in res.retry:
                self._retry[key] = None
            delay = self.backoff.next()
            self._retry_at = time.monotonic() + delay
            self.stats.backoffs += 1
            self.metrics.backoffs.labels(self.name, "broker").inc()
            self.last_error = f"publishing failed: {res.retry_error}"
            log.warning("%s: publishing failed (%s); %d document(s) kept pending, retry in "
                        "%.2fs", self.name, res.retry_error, len(res.retry), delay,
                        extra={"collection": self.name, "cause": "broker"})
        elif res.published or res.dead_lettered:
            self._progress()
            self.backoff.reset()
            if self.name in self.health.workers:
                self.health.workers[self.name].error = None
        if res.lease_lost:
            raise _LeaseLost()

    async def _run_keys_or_keep(self, keys: list[Any]) -> None:
        """Run these documents again; if that fails, keep them for the next attempt instead
        of leaving them to the periodic sweep (and never checkpoint past them)."""
        try:
            await self._run_keys(keys)
        except BaseException:
            for key in keys:
                self._retry.setdefault(key, None)
            raise

    async def _pending(self) -> bool:
        """Backoff waits, retries, dirty documents and due sweeps. ``True`` if it did
        anything (the caller loops again before reading new changes)."""
        now = time.monotonic()
        if self._retry_at > now:
            await self._sleep(self._retry_at - now)
            return True
        if self._retry:
            keys = list(self._retry)
            self._retry.clear()
            await self._run_keys_or_keep(keys)
            return True
        dirty = self.inflight.take_dirty()
        if dirty:
            await self._run_keys_or_keep(dirty)
            return True
        if self._sweep_reason is None and self.mode == "stream" and now >= self._next_sweep:
            self._sweep_reason = "periodic"
        if self._sweep_reason is not None:
            await self._sweep()
            return True
        return False

    async def _run_keys(self, keys: list[Any]) -> None:
        docs = await self.coll.find({"_id": {"$in": keys}, **PENDING},
                                    {F_OUTBOX: 1, F_TYPE: 1}).to_list()
        self._contact()
        self._absorb(await self.cycle.run(docs))

    async def _sweep(self) -> None:
        reason = self._sweep_reason or "periodic"
        self.metrics.sweeps.labels(self.name, reason).inc()
        self.stats.sweeps += 1
        res = await sweep(self.coll, self.cycle, page_size=self.settings.batch_size,
                          stop=self.stop)
        self._contact()
        if self._sweep_started is None:
            self._sweep_started = CycleResult()
        self._sweep_started.add(res.cycle)
        self._absorb(res.cycle)
        if not res.complete:
            return  # retried after the backoff (or after the restart when stopping)
        total, self._sweep_started = self._sweep_started, None
        self._progress()
        self._last_sweep = total
        self._sweep_reason = None
        self._next_sweep = time.monotonic() + self.settings.sweep_interval_s
        level = logging.WARNING if reason in ("history_lost", "invalid_token") else logging.INFO
        if reason == "periodic" and not total.published and not total.dead_lettered:
            level = logging.DEBUG
        log.log(level, "%s: %s sweep done: %d entries published, %d dead-lettered, %d stale",
                self.name, reason, total.published, total.dead_lettered, total.stale,
                extra={"collection": self.name, "sweep": reason, "published": total.published,
                       "dead_lettered": total.dead_lettered})

    # -- stream mode ----------------------------------------------------------------------
    async def _start_stream(self) -> None:
        """Open the stream (from the checkpoint when there is one) and schedule the start-up
        sweep. The stream is opened *before* the sweep, so nothing is missed."""
        token = await self.checkpoints.load()
        if token is not None:
            try:
                self.faults.hit("stream_open")
                await self.follower.open(resume_after=token)
                self._sweep_reason = "startup"
                return
            except OperationFailure as exc:
                if exc.code in CHANGE_STREAMS_UNSUPPORTED:
                    raise
                await self._restart_stream(exc)
                return
        await self._open_at_now("startup")

    async def _open_at_now(self, reason: str) -> None:
        start = await server_time(self.db)
        self.faults.hit("stream_open")
        await self.follower.open(start_at=start)
        self._sweep_reason = reason

    async def _restart_stream(self, exc: OperationFailure) -> None:
        reason = "history_lost" if exc.code == 286 else "invalid_token"
        self.stats.stream_restarts += 1
        self.metrics.stream_restarts.labels(self.name, reason).inc()
        log.warning("%s: change stream cannot resume (%s, code %s); new stream from now and a "
                    "full sweep", self.name, exc, exc.code,
                    extra={"collection": self.name, "reason": reason})
        await self.follower.close()
        for _ in range(3):
            try:
                await self._open_at_now(reason)
                return
            except OperationFailure as again:
                if again.code in CHANGE_STREAMS_UNSUPPORTED:
                    raise
                log.warning("%s: opening a new stream failed: %s", self.name, again,
                            extra={"collection": self.name})
        await self._open_at_now(reason)

    async def _follow(self) -> None:
        while self._keep_going():
            self.health.beat(self.name)
            if await self._guarded(self._pending):
                continue
            await self._guarded(self._stream_step)
        await self._final_checkpoint()

    async def _stream_step(self) -> bool:
        if not self.follower.is_open:  # reopening failed (store error): try again
            if self._start_after is not None:
                await self._reopen_after_invalidate()
            else:
                await self._start_stream()  # from the checkpoint, with a sweep
            return True
        started = time.monotonic()
        try:
            self.faults.hit("stream_read")
            batch = await self.follower.read()
        except InjectedInvalidate:
            batch = self.follower.end()
        except OperationFailure as exc:
            if exc.code in TOKEN_UNUSABLE:
                await self._restart_stream(exc)
                return True
            await self._reopen()  # the cursor is dead after a server error
            raise
        except PyMongoError:
            await self._reopen()
            raise
        if not batch.ended:
            self._contact()
        if batch.newest is not None:
            self.metrics.stream_lag.labels(self.name).set(max(0.0, time.time() - batch.newest.time))
        elif batch.events == 0:
            self.metrics.stream_lag.labels(self.name).set(0)
        if batch.documents:
            # An insert event carries the document as inserted and a looked-up one may
            # predate our last pull: entries published already are recognised by the
            # in-flight set (pulled again, not republished).
            docs = latest_documents(batch.documents)
            read_done = time.monotonic()
            self._absorb(await self.cycle.run(docs))
            log.debug("%s: %d events, %d documents: read %.1f ms, published in %.1f ms",
                      self.name, batch.events, len(docs), (read_done - started) * 1000,
                      (time.monotonic() - read_done) * 1000)
            if not self._retry and not batch.ended:
                await self._checkpoint()
        elif (not self._retry and not batch.ended
              and time.monotonic() - self._last_idle_checkpoint > _IDLE_CHECKPOINT_S):
            self._last_idle_checkpoint = time.monotonic()
            await self._checkpoint()
        if batch.ended:
            await self._invalidated(batch.end_token)
        return batch.events > 0

    async def _invalidated(self, token: Mapping[str, Any] | None) -> None:
        """The stream is over (``invalidate``: the collection was dropped or renamed, or the
        server closed the cursor): a new stream after it, and a full sweep at once."""
        self.stats.stream_invalidations += 1
        self.metrics.stream_invalidations.labels(self.name).inc()
        log.warning("%s: change stream invalidated (collection dropped or renamed?); new "
                    "stream after it and a full sweep", self.name,
                    extra={"collection": self.name, "reason": "invalidated"})
        await self.follower.close()
        self._start_after = token
        self._sweep_reason = "invalidated"
        await self._reopen_after_invalidate()

    async def _reopen_after_invalidate(self) -> None:
        """``start_after`` the invalidate event's token (MongoDB ≥ 4.2; mongo-java-server
        treats it like ``resume_after``); if the server refuses it, or there is no token, a
        new stream at the current time — the sweep that follows covers the gap. A store
        error propagates (backoff); the next step tries again."""
        token = self._start_after
        if token is not None:
            try:
                self.faults.hit("stream_open")
                await self.follower.open(start_after=token)
                self._start_after = None
                self._contact()
                return
            except OperationFailure as exc:
                if exc.code in CHANGE_STREAMS_UNSUPPORTED:
                    raise
                log.warning("%s: cannot start a stream after the invalidate event (%s, code "
                            "%s); new stream from now", self.name, exc, exc.code,
                            extra={"collection": self.name})
        await self._open_at_now("invalidated")
        self._start_after = None
        self._contact()

    async def _reopen(self) -> None:
        """After a connection error: reopen from the in-memory token (or the saved one)."""
        token = self.follower.resume_token
        try:
            if token is not None:
                await self.follower.open(resume_after=token)
            else:
                await self._start_stream()
        except OperationFailure as exc:
            if exc.code in TOKEN_UNUSABLE:
                await self._restart_stream(exc)
        except PyMongoError:
            pass  # retried after the backoff by the next read

    async def _checkpoint(self) -> None:
        if await self.checkpoints.save(self.follower.resume_token, owner=self.lease.owner):
            self._contact()
            self.faults.hit("after_checkpoint")

    async def _final_checkpoint(self) -> None:
        if self._retry or self._sweep_reason is not None:
            return
        try:
            await self._checkpoint()
        except PyMongoError as exc:
            log.warning("%s: final checkpoint failed: %s", self.name, exc,
                        extra={"collection": self.name})

    # -- polling mode ---------------------------------------------------------------------
    async def _poll(self) -> None:
        while self._keep_going():
            self.health.beat(self.name)
            if await self._guarded(self._pending):
                continue
            await self._guarded(self._poll_step)

    async def _poll_step(self) -> bool:
        self.metrics.sweeps.labels(self.name, "poll").inc()
        res = await sweep(self.coll, self.cycle, page_size=self.settings.batch_size,
                          stop=self.stop)
        self._contact()
        self._absorb(res.cycle)
        if res.documents == 0:
            await self._sleep(self.settings.poll_interval_ms / 1000)
        return True

    # -- once -----------------------------------------------------------------------------
    async def _run_once(self) -> None:
        self.mode = "once"
        self.health.beat(self.name, role="active", mode="once")
        self._sweep_reason = "once"
        while self._keep_going():
            self.health.beat(self.name)
            if self._sweep_reason is None:
                last = self._last_sweep
                if last is not None and not (last.published or last.dead_lettered):
                    self._drained = True  # a complete sweep found nothing left to do
                    break
                self._sweep_reason = "once"
            await self._guarded(self._pending)

    # -- metrics --------------------------------------------------------------------------
    async def measure_backlog(self) -> Mapping[str, Any]:
        """Pending entries, documents and the oldest entry's age, into the gauges."""
        pipeline: list[dict[str, Any]] = [
            {"$match": PENDING},
            {"$project": {"n": {"$size": f"${F_OUTBOX}"},
                          "first": {"$arrayElemAt": [f"${F_OUTBOX}.created_at", 0]}}},
            {"$group": {"_id": None, "n": {"$sum": "$n"}, "docs": {"$sum": 1},
                        "oldest": {"$min": "$first"}}},
        ]
        rows = await (await self.coll.aggregate(pipeline)).to_list()
        self._contact()
        row = rows[0] if rows else {"n": 0, "docs": 0, "oldest": None}
        age = 0.0
        oldest = row.get("oldest")
        if isinstance(oldest, datetime):
            if oldest.tzinfo is None:
                oldest = oldest.replace(tzinfo=UTC)
            age = max(0.0, (datetime.now(UTC) - oldest).total_seconds())
        self.metrics.backlog.labels(self.name).set(float(row.get("n") or 0))
        self.metrics.backlog_documents.labels(self.name).set(float(row.get("docs") or 0))
        self.metrics.oldest_pending_age.labels(self.name).set(age)
        return {"entries": row.get("n", 0), "documents": row.get("docs", 0),
                "oldest_age_s": age}
