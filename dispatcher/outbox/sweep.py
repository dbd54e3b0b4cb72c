"""Sweeps: find every document with a pending outbox and publish it.

Used at start-up (after the change stream is open, so nothing written meanwhile is missed),
after the stream lost its history, periodically as a safety net, and as the whole loop in
polling mode. Pages by ``_id`` (aggregate ids are strings), so a sweep over a large
collection holds no cursor open while it publishes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from aggregates.fold.document import F_OUTBOX, F_PARTITION, F_TYPE
from dispatcher.core.settings import DispatcherSettings
from dispatcher.core.timing import Timing, pause
from dispatcher.observe.metrics import Metrics
from dispatcher.outbox.cycle import Cycle
from dispatcher.outbox.results import CycleResult
from dispatcher.publishers.native import scan

__all__ = ["PENDING", "SweepResult", "Sweeps", "poll", "sweep"]

log = logging.getLogger("aggbox.dispatcher")

#: Documents whose outbox has at least one entry (the writer indexes ``outbox.0``).
PENDING: dict[str, Any] = {f"{F_OUTBOX}.0": {"$exists": True}}


@dataclass(slots=True)
class SweepResult:
    documents: int = 0
    cycle: CycleResult = field(default_factory=CycleResult)
    #: every pending document was handled (no retryable failure, lease kept, not stopped)
    complete: bool = True


async def sweep(coll: AsyncCollection[Any], cycle: Cycle, *, page_size: int,
                stop: asyncio.Event | None = None,
                where: Mapping[str, Any] | None = None,
                learn: Callable[[Mapping[str, Any]], None] | None = None) -> SweepResult:
    """Publish every pending document (of the partitions ``where`` selects, if given).
    ``learn`` sees each document read (the stream remembers their ``_type`` and ``_p``)."""
    out = SweepResult()
    base = {**PENDING, **(where or {})}

    async def read(after: Any) -> list[Mapping[str, Any]]:
        query = base if after is None else {**base, "_id": {"$gt": after}}
        # raw where the native builder takes it (dispatcher/publishers/native.py)
        return [scan(d) for d in await coll.find(
            query, {F_OUTBOX: 1, F_TYPE: 1, F_PARTITION: 1}).sort(
            "_id", 1).limit(page_size).to_list()]

    ahead: asyncio.Task[list[Mapping[str, Any]]] | None = None
    try:
        page = await read(None)
        while page:
            out.documents += len(page)
            if learn is not None:
                for doc in page:
                    learn(doc)
            # The next page is read while this one is published (other documents: _id
            # after this page's), and this page's pull overlaps with both.
            ahead = (asyncio.create_task(read(page[-1]["_id"]))
                     if len(page) >= page_size else None)
            res = await cycle.run(page, wait=False)
            out.cycle.add(res)
            if res.retry or res.lease_lost or (stop is not None and stop.is_set()):
                out.complete = False
                break
            if ahead is None:
                break
            page, ahead = await ahead, None
    finally:
        if ahead is not None:
            ahead.cancel()
            await asyncio.gather(ahead, return_exceptions=True)
        await cycle.drain()
    return out


async def poll(coll: AsyncCollection[Any], cycle: Cycle, settings: DispatcherSettings,
               stop: asyncio.Event, metrics: Metrics, timing: Timing, where: Mapping[str, Any],
               learn: Callable[[Mapping[str, Any]], None], on_contact: Callable[[], None],
               absorb: Callable[[CycleResult], None]) -> None:
    """One step of polling mode: a sweep (``absorb`` takes its result: it may raise, e.g.
    lease lost), then the poll interval's pause when it found nothing."""
    metrics.sweeps.labels(coll.name, "poll").inc()
    res = await sweep(coll, cycle, page_size=settings.batch_size, stop=stop, where=where,
                      learn=learn)
    on_contact()
    absorb(res.cycle)
    if res.documents == 0:
        await pause(timing, settings.poll_interval_ms / 1000, stop)


class Sweeps:
    """When a worker sweeps, and the log line and totals of each complete sweep.

    A sweep is requested with a reason (``startup``, ``history_lost``, ``invalid_token``,
    ``invalidated``, ``once``) or falls due every ``interval_s`` in stream mode
    (``periodic``). A sweep cut short (retryable failure, lost lease, stop) stays requested:
    the next one starts over and the totals add up until one completes."""

    def __init__(self, coll: AsyncCollection[Any], cycle: Cycle, *, name: str, page_size: int,
                 interval_s: float, stop: asyncio.Event, metrics: Metrics, timing: Timing,
                 where: Callable[[], Mapping[str, Any]] = dict,
                 learn: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        self.coll = coll
        self._learn = learn
        self._where = where
        self.cycle = cycle
        self.name = name
        self.page_size = page_size
        self.interval_s = interval_s
        self.stop = stop
        self.metrics = metrics
        self._monotonic = timing.monotonic
        self.reason: str | None = None
        self.next_at = 0.0
        self.count = 0
        #: totals of the last complete sweep
        self.last: CycleResult | None = None
        #: monotonic times at which complete sweeps ended (tests check the schedule)
        self.completed_at: list[float] = []
        self._partial: CycleResult | None = None

    def request(self, reason: str | None) -> None:
        self.reason = reason

    def due(self, *, periodic: bool) -> bool:
        if self.reason is None and periodic and self._monotonic() >= self.next_at:
            self.reason = "periodic"
        return self.reason is not None

    async def run(self, absorb: Callable[[CycleResult], None],
                  on_contact: Callable[[], None]) -> bool:
        """One sweep; ``absorb`` takes its result (it may raise, e.g. lease lost). ``True``
        when the sweep completed."""
        reason = self.reason or "periodic"
        self.metrics.sweeps.labels(self.name, reason).inc()
        self.count += 1
        res = await sweep(self.coll, self.cycle, page_size=self.page_size, stop=self.stop,
                          where=self._where(), learn=self._learn)
        on_contact()
        if self._partial is None:
            self._partial = CycleResult()
        self._partial.add(res.cycle)
        absorb(res.cycle)
        if not res.complete:
            return False  # retried after the backoff (or after the restart when stopping)
        total, self._partial = self._partial, None
        self.last = total
        self.reason = None
        now = self._monotonic()
        self.completed_at.append(now)
        self.next_at = now + self.interval_s
        self._log(reason, total)
        return True

    def _log(self, reason: str, total: CycleResult) -> None:
        level = logging.WARNING if reason in ("history_lost", "invalid_token") else logging.INFO
        if reason in ("periodic", "once") and not total.published and not total.dead_lettered:
            level = logging.DEBUG  # --once ends with an empty sweep: one INFO line per drain
        log.log(level, "%s: %s sweep done: %d entries published, %d effects executed, "
                "%d dead-lettered, %d stale", self.name, reason,
                total.published - total.executed, total.executed, total.dead_lettered,
                total.stale, extra={"collection": self.name, "sweep": reason,
                                    "published": total.published - total.executed,
                                    "executed": total.executed,
                                    "dead_lettered": total.dead_lettered})
