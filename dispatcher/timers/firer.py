"""Firing due timers (docs/design.md "Timers"): one collection's, for the partitions this
instance holds, while it holds them.

Each round reads the documents with a timer due by now — ``{timers.due: {$lte: now}}`` in
the worker's partitions, served by the index ``{_p: 1, timers.due: 1}`` (no scan) — in
pages, publishes their due timers as records built exactly like outbox entries'
(:func:`dispatcher.publishers.builder.build_record`, with the ``fence`` header of the lease),
and only for the records the publisher acknowledged removes them::

    update_one({_id}, {$pull: {timers: {id: {$in: acked}}}, $inc: {_v: 1}})

The ``$inc`` of ``_v`` makes a writer that read the document before this removal fail its
conditional write and read again, so it cannot put a fired timer back. A crash between the
publish and the removal publishes the timer again later with the same id: a duplicate for
its receiver. A record the broker refuses for good (or the publisher cannot encode) is
dead-lettered and removed, as a timer that forms no record is; a retryable failure leaves
the timer for the next round and is reported (``on_error``: the worker logs it, and it is
the last error ``--once`` names). Between rounds the firer sleeps until the next due time
(read from the same index) or ``idle_s``, whichever is sooner.

``--once`` (:meth:`TimerFirer.fire_all_due`) follows the outbox's rule: it fires rounds until
a complete round leaves no due timer in the worker's partitions, trying again after a
failed round (a retryable publish, a store error) as long as it takes — the run's watchdog
ends a run that makes no progress for ``once_timeout_s`` with exit status 1 — and hands a
lease it no longer holds back to the worker, which starts over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import UpdateOne
from pymongo.asynchronous.collection import AsyncCollection

from aggregates.fold import DeadLetter
from aggregates.fold.document import F_PARTITION, F_TIMERS, F_TYPE, F_VERSION
from aggregates.store.deadletters import dead_letter_update
from aggregates.wire.outbound import InvalidEntry
from dispatcher.core.errors import check_fatal
from dispatcher.core.faults import Faults
from dispatcher.core.timing import REAL_TIME, pause
from dispatcher.observe.metrics import Metrics
from dispatcher.publishers.base import Publisher, PublishResult
from dispatcher.publishers.builder import build_record
from dispatcher.publishers.letters import invalid_letter, rejected_letter
from dispatcher.publishers.record import H_FENCE, OutboundRecord

__all__ = ["FireResult", "TimerFirer", "TimersNotPublished"]

log = logging.getLogger("aggbox.dispatcher")

@dataclass(slots=True)
class FireResult:
    fired: int = 0
    dead_lettered: int = 0
    retryable: int = 0
    documents: int = 0
    #: the first retryable failure's text
    error: str | None = None
    #: the lease was not held: nothing was read or published
    lease_lost: bool = False


class TimersNotPublished(Exception):
    """A round's due timers (some of them) were not published: the publisher's retryable
    failure. They stay and are fired again next round."""

    def __init__(self, collection: str, count: int, error: str | None) -> None:
        self.count = count
        super().__init__(f"publishing {count} due timer(s) of {collection} failed: "
                         f"{error or 'no error text'}")


class TimerFirer:
    """Fires one collection's due timers; :meth:`run` until ``keep_going`` says stop."""

    def __init__(self, coll: AsyncCollection[Any], *, publisher: Publisher,
                 dead_letters: AsyncCollection[Any], metrics: Metrics,
                 where: Callable[[], dict[str, Any]], fence: Callable[[Mapping[str, Any]],
                                                                   str | None],
                 lease_held: Callable[[], bool], source_type: str | None,
                 topic_template: str, page_size: int = 100, idle_s: float = 1.0,
                 on_error: Callable[[Exception], None] = lambda exc: None,
                 faults: Faults | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.coll, self.publisher, self.dead_letters = coll, publisher, dead_letters
        self.name = coll.name
        self.metrics, self.where, self.fence = metrics, where, fence
        self.lease_held, self.source_type = lease_held, source_type
        self.topic_template, self.page_size, self.idle_s = topic_template, page_size, idle_s
        self.clock, self.on_error, self.faults = clock, on_error, faults or Faults()
        self._m_fired = metrics.timers_fired.labels(self.name)
        self._m_lag = metrics.timer_lag.labels(self.name)

    @contextlib.asynccontextmanager
    async def firing(self, keep_going: Callable[[], bool]) -> AsyncIterator[None]:
        """Fire in the background while the block runs (and ``keep_going()``); at its end
        the round in progress finishes — its acknowledged timers removed — before this
        returns (at most a minute; then it is cancelled)."""
        done = asyncio.Event()
        task = asyncio.create_task(self.run(done, keep_going))
        try:
            yield
        finally:
            done.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), 60)
            task.cancel()

    async def run(self, stop: asyncio.Event, keep_going: Callable[[], bool]) -> None:
        """Fire rounds until ``stop`` is set or ``keep_going()`` is false; a round in
        progress is finished first (its acknowledged timers removed), so a graceful stop
        republishes nothing. A failed round is handed to ``on_error`` (the worker logs and
        counts it) and tried again after ``idle_s``: nothing was removed that was not
        published."""
        while keep_going() and not stop.is_set():
            try:
                res = await self.fire_due()
                if res.retryable:
                    raise TimersNotPublished(self.name, res.retryable, res.error)
                if (res.documents >= self.page_size and (res.fired or res.dead_lettered)):
                    continue  # a full page moved on: more may be due right now
                wait = await self._idle_for()
            except Exception as exc:
                self.on_error(exc)
                wait = self.idle_s
            # Due times are wall-clock times: real pauses, whatever the worker's injected
            # timing (its fake clocks drive backoff and pacing, not this).
            await pause(REAL_TIME, wait, stop)

    async def fire_all_due(self, keep_going: Callable[[], bool], *,
                           on_progress: Callable[[], None] = lambda: None,
                           stop: asyncio.Event | None = None) -> bool:
        """``--once``: fire rounds until one finds no due timer left in the partitions
        (``True``; also when ``keep_going()`` turns false). A failed round — some records
        retryable, an exception — goes to ``on_error`` and is tried again after ``idle_s``,
        for as long as it takes (the ``--once`` watchdog ends a run without progress);
        ``on_progress`` is called after each round that fired or dead-lettered anything.
        ``False`` when the lease was not held: the caller starts over."""
        while keep_going():
            try:
                res = await self.fire_due()
            except Exception as exc:
                check_fatal(exc, self.name)  # a wrong password or privilege ends the run
                self.on_error(exc)
                await pause(REAL_TIME, self.idle_s, stop)
                continue
            if res.lease_lost:
                return False
            if res.fired or res.dead_lettered:
                on_progress()
            if res.retryable:
                self.on_error(TimersNotPublished(self.name, res.retryable, res.error))
                await pause(REAL_TIME, self.idle_s, stop)
                continue
            if res.documents < self.page_size or not (res.fired or res.dead_lettered):
                return True  # every due timer of the page went: none is left (or only
                # malformed ones, which no round can fire)
        return True

    async def due_left(self) -> int:
        """How many timers of the whole collection (every partition) are due by now and
        not fired: what ``--once`` leaves behind (its summary says it)."""
        now = self.clock()
        n = 0
        async for d in self.coll.find({f"{F_TIMERS}.due": {"$lte": now}},
                                      {f"{F_TIMERS}.due": 1}):
            n += sum(1 for t in d.get(F_TIMERS) or [] if isinstance(t, Mapping)
                     and isinstance(t.get("due"), datetime) and _aware(t["due"]) <= now)
        return n

    async def _idle_for(self) -> float:
        """Seconds until the next pending timer is due (at most ``idle_s``)."""
        nxt = await self.coll.find_one({**self.where(), f"{F_TIMERS}.due": {"$exists": True}},
                                       {f"{F_TIMERS}.due": 1},
                                       sort=[(f"{F_TIMERS}.due", 1)])
        dues: list[datetime] = [t["due"] for t in (nxt or {}).get(F_TIMERS) or []
                                if isinstance(t, Mapping) and isinstance(t.get("due"), datetime)]
        if not dues:
            return self.idle_s
        wait = (_aware(min(dues)) - self.clock()).total_seconds()
        return max(0.0, min(self.idle_s, wait))

    async def fire_due(self) -> FireResult:
        """One round: every timer due by now in one page of documents."""
        now = self.clock()
        result = FireResult()
        docs = await self.coll.find(
            {**self.where(), f"{F_TIMERS}.due": {"$lte": now}},
            {F_TIMERS: 1, F_TYPE: 1, F_PARTITION: 1}
        ).sort([(f"{F_TIMERS}.due", 1)]).limit(self.page_size).to_list()  # earliest first
        result.documents = len(docs)
        self.metrics.timers_overdue.labels(self.name).set(
            0 if not docs else sum(1 for d in docs for t in _timers(d)
                                   if _aware(t["due"]) <= now - timedelta(seconds=60)))
        if not docs:
            return result
        if not self.lease_held():  # no publishing; the caller pauses (documents = 0)
            return FireResult(lease_lost=True)
        batch: list[tuple[Mapping[str, Any], dict[str, Any], OutboundRecord]] = []
        letters: list[tuple[Mapping[str, Any], dict[str, Any], DeadLetter]] = []
        for doc in docs:
            fence = self.fence(doc)
            for t in _timers(doc):
                if _aware(t["due"]) > now:
                    continue
                atype = str(doc.get(F_TYPE) or self.source_type)
                try:
                    rec = build_record(t, collection=self.name, document_id=doc["_id"],
                                       source_type=atype, topic_template=self.topic_template)
                except Exception as exc:  # a hand-edited timer: dead-letter, never retry
                    exc = exc if isinstance(exc, InvalidEntry) else InvalidEntry(
                        str(t.get("id")), f"{type(exc).__name__}: {exc}", entry=t)
                    letters.append((doc, t, invalid_letter(exc, aggregate_type=atype,
                                                           aggregate_id=str(doc["_id"]))))
                    continue
                if fence is not None:
                    rec.headers[H_FENCE] = fence
                batch.append((doc, t, rec))
        outcomes: list[PublishResult] = []
        if batch:
            self.faults.hit("timer_before_publish")
            outcomes = await self._publish([r for _, _, r in batch])
            self.faults.hit("timer_after_publish")
        done: dict[Any, list[str]] = {}
        for (doc, t, rec), res in zip(batch, outcomes, strict=True):
            if res.status == "ok":
                done.setdefault(doc["_id"], []).append(str(t["id"]))
                result.fired += 1
                self._m_lag.observe(max(0.0, (self.clock() - _aware(t["due"])).total_seconds()))
            elif res.status == "permanent":
                letters.append((doc, t, rejected_letter(rec, res, self.publisher.name,
                                                        what=f"timer {t.get('timer')!r}")))
            else:
                result.retryable += 1
                result.error = result.error or res.error
        if result.fired:  # counted once acknowledged (a crash before the removal re-fires)
            self._m_fired.inc(result.fired)
        if letters:
            await self.dead_letters.bulk_write(
                [UpdateOne(*dead_letter_update(dl, now=now), upsert=True)
                 for _, _, dl in letters], ordered=False)
            for doc, t, dl in letters:
                done.setdefault(doc["_id"], []).append(str(t.get("id")))
                self.metrics.dead_lettered.labels(self.name, dl.reason).inc()
                log.error("dead-lettered timer %r of %s/%r: %s", t.get("timer"), self.name,
                          doc["_id"], dl.detail, extra={"collection": self.name,
                                                        "alert": True})
            result.dead_lettered = len(letters)
        if done:
            await self.coll.bulk_write([
                UpdateOne({"_id": key}, {"$pull": {F_TIMERS: {"id": {"$in": ids}}},
                                         "$inc": {F_VERSION: 1}})
                for key, ids in done.items()], ordered=False)
        return result

    async def _publish(self, records: list[OutboundRecord]) -> list[PublishResult]:
        try:
            return await self.publisher.publish(records)
        except Exception as exc:  # the whole batch failed: retried next round
            log.warning("%s: publishing %d due timer(s) failed: %s", self.name, len(records),
                        exc, extra={"collection": self.name})
            return [PublishResult.retryable(f"{type(exc).__name__}: {exc}") for _ in records]


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _timers(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The document's well-formed timers (an id and a due date), in due order."""
    out = [t for t in doc.get(F_TIMERS) or [] if isinstance(t, dict)
           and isinstance(t.get("due"), datetime) and isinstance(t.get("id"), str)]
    return sorted(out, key=lambda t: (_aware(t["due"]), t["id"]))
