"""One publish cycle: documents → records → publisher → dead letters → ``$pull``
(docs/design.md "The dispatcher", steps 2, 3 and 6).

Per document the entries go out in outbox order. After the publisher reports:

- acknowledged entries, and entries rejected for good (dead-lettered first), are removed
  with ``$pull: {outbox: {id: {$in: [...]}}}`` — exactly those ids, ``_v`` untouched
  (invariant 2: appends by the writer and our pulls commute);
- from the first entry that failed *retryably* on, nothing of that document is pulled; the
  document is handed back for a retry after backoff.

A crash anywhere in between leaves the entries in the outbox: they are published again,
with the same ids (at-least-once, never lost).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pymongo import UpdateOne
from pymongo.asynchronous.collection import AsyncCollection

from aggregates.core.reasons import Reason
from aggregates.fold import DeadLetter
from aggregates.fold.document import F_OUTBOX, F_TYPE
from aggregates.store.deadletters import dead_letter_update
from dispatcher.core.faults import Faults
from dispatcher.core.timing import REAL_TIME, Timing
from dispatcher.observe.metrics import Metrics
from dispatcher.observe.tracing import publish_spans
from dispatcher.outbox.fenced import Pull, _Doc, still_fenced
from dispatcher.outbox.inflight import InFlight
from dispatcher.outbox.pull import pull_entries
from dispatcher.outbox.results import CycleResult
from dispatcher.publishers.base import Publisher, PublishResult
from dispatcher.publishers.builder import record_builder
from dispatcher.publishers.letters import invalid_letter, rejected_letter
from dispatcher.publishers.native import ScannedDoc, decoded_entry, raw_builder
from dispatcher.publishers.record import H_FENCE, InvalidEntry, OutboundRecord

__all__ = ["INVALID_OUTBOX_ENTRY", "Cycle", "CycleResult"]

log = logging.getLogger("aggbox.dispatcher")

#: Dead-letter reason of an entry that cannot form a valid envelope.
INVALID_OUTBOX_ENTRY = Reason.INVALID_OUTBOX_ENTRY


class Cycle:
    """Publishes batches of documents of one collection."""

    def __init__(
        self,
        coll: AsyncCollection[Any],
        *,
        publisher: Publisher,
        inflight: InFlight,
        dead_letters: AsyncCollection[Any],
        topic_template: str,
        max_batch_records: int,
        metrics: Metrics,
        faults: Faults,
        lease_held: Callable[[], bool],
        source_type: str | None = None,
        fence: Callable[[Mapping[str, Any]], str | None] | None = None,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
        timing: Timing = REAL_TIME,
    ) -> None:
        self.coll = coll
        self.collection = coll.name
        self.publisher = publisher
        self.inflight = inflight
        self.dead_letters = dead_letters
        self.topic_template = topic_template
        self.max_batch_records = max_batch_records
        self.metrics = metrics
        self.faults = faults
        self.lease_held = lease_held
        #: a document → the ``fence`` header of its records: its lease now (None: no header,
        #: the lease is not held)
        self.fence = fence
        self.source_type = source_type or coll.name
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.timing = timing
        self._pulling: asyncio.Task[None] | None = None  # the last pull started
        self._behind: asyncio.Task[None] | None = None  # the one before it
        self._pull_errors: list[Exception] = []
        #: pulls started, and the last one done (in order): a stream batch's token is saved
        #: once the pull started with it is done
        self.pulls_started = 0
        self.pulls_done = 0
        c = self.collection
        self._m_published = metrics.published.labels(c)
        self._m_stale = metrics.stale_skipped.labels(c)
        self._m_batches = metrics.batches.labels(c)
        self._m_latency = metrics.latency.labels(c)
        self._m_permanent = metrics.failed.labels(c, "permanent")
        self._m_retryable = metrics.failed.labels(c, "retryable")

    async def run(self, docs: Sequence[Mapping[str, Any]], *, wait: bool = True
                  ) -> CycleResult:
        """Publish the pending entries of ``docs`` (current views of the documents).

        Chunks are pipelined: the ``$pull`` of one chunk runs while the next one is
        published. With ``wait=False`` the last pull may still be running on return (the
        sweep overlaps it with reading its next page); :meth:`drain` waits for it."""
        total = CycleResult()
        chunk: list[_Doc] = []
        n = 0
        try:
            for doc in docs:
                if not self.lease_held():
                    total.lease_lost = True
                    break
                prepared = self._prepare(doc)
                if prepared is None:
                    continue
                chunk.append(prepared)
                n += len(prepared.records)
                if n >= self.max_batch_records:
                    batch, chunk, n = chunk, [], 0
                    total.add(await self._send(batch))
            if chunk:
                batch, chunk = chunk, []
                total.add(await self._send(batch))  # releases its claims if the lease is gone
        finally:
            for d in chunk:  # claimed but never handed to the publisher (an error above)
                self.inflight.finish(d.key, (), self._ids(d.records))
        if wait:
            await self.drain()
        return total

    async def drain(self) -> None:
        """Wait for the ``$pull``s still running, if any (raises the first error of one)."""
        task, self._pulling, self._behind = self._pulling, None, None
        if task is not None:
            await task
        self._raise_pull_error()

    async def drain_if_done(self) -> None:
        """Raise the error of a ``$pull`` that failed; :meth:`drain` when all are over."""
        if self._pulling is not None and self._pulling.done():
            await self.drain()
        self._raise_pull_error()

    def _prepare(self, doc: Mapping[str, Any]) -> _Doc | None:
        key = doc.get("_id")
        if type(doc) is ScannedDoc:  # read as raw BSON: its entries' ids and bytes
            outbox: Any = doc.entries
            if not outbox:
                return None
            claim = self.inflight.claim(key, outbox, ids=[eid for eid, _ in outbox])
        else:
            outbox = doc.get(F_OUTBOX) or []
            if not isinstance(outbox, list) or not outbox:
                return None
            claim = self.inflight.claim(key, outbox)
        if claim.malformed:
            log.error("%s/%r: %d outbox entries without an id are ignored (they cannot be "
                      "pulled by id; remove them by hand)", self.collection, key,
                      claim.malformed, extra={"collection": self.collection})
        if not claim.fresh and not claim.stale:
            return None
        source_type = str(doc.get(F_TYPE) or self.source_type)
        build = (raw_builder(self.collection, source_type, self.topic_template)
                 if type(doc) is ScannedDoc
                 else record_builder(self.collection, source_type, self.topic_template).build)
        records: list[OutboundRecord | InvalidEntry] = []
        for entry in claim.fresh:
            try:
                records.append(build(entry, key))
            except InvalidEntry as exc:
                records.append(exc)
            except Exception as exc:  # e.g. a hand-edited entry with out-of-range values
                # Dead-letter it like any other invalid entry: an exception here would leave
                # the document claimed (in flight) for the life of the process.
                if type(doc) is ScannedDoc:
                    entry = decoded_entry(entry)
                records.append(InvalidEntry(str(entry.get("id")) if isinstance(entry, Mapping)
                                            else repr(entry),
                                            f"{type(exc).__name__}: {exc}", entry=entry))
        fence = self.fence(doc) if self.fence is not None else None
        if fence is not None:
            for r in records:
                if isinstance(r, OutboundRecord):
                    r.headers[H_FENCE] = fence
        return _Doc(key, records, claim.stale, fence, doc)

    async def _send(self, docs: list[_Doc]) -> CycleResult:
        """Publish one chunk and write its dead letters; its pull is started in the
        background once the previous chunk's pull is done."""
        result = CycleResult(documents=len(docs))
        if not self.lease_held():
            for d in docs:
                self.inflight.finish(d.key, (), self._ids(d.records))
            result.lease_lost = True
            return result
        records = [r for d in docs for r in d.records if isinstance(r, OutboundRecord)]
        self.faults.hit("before_publish")
        outcomes = await self._publish(docs, records)
        by_record = dict(zip((id(r) for r in records), outcomes, strict=True))
        now = datetime.now(UTC)
        letters: list[DeadLetter] = []
        pulls: list[Pull] = []
        for d in docs:
            done, released, doc_letters = self._settle(d, by_record, now, result)
            letters.extend(doc_letters)
            result.stale += len(d.stale)
            pulls.append((d, done, released))
        result.dead_lettered = len(letters)
        try:
            if letters:
                await self._write_letters(letters, now)
            self.faults.hit("after_publish")
        except BaseException:
            self._release(pulls)
            raise
        # The documents stay claimed until their pull is done (their newer entries wait:
        # a pull that fails or comes too late — "Fencing" — republishes them, and nothing
        # newer of the document may have gone out before that). Other documents are
        # published while this pull runs.
        # Pulls run one at a time, in order, each after the one before it (chained: the
        # next batch is read and published meanwhile); at most two wait.
        prev = self._pulling
        try:
            if prev is not None and self._behind is not None and not self._behind.done():
                await asyncio.wait([self._behind])
        except BaseException:
            self._release(pulls)
            raise
        # Executed effects have their own metrics (dispatcher.effects): the published
        # counter counts only what a broker acknowledged.
        self.pulls_started += 1
        self._behind = prev
        self._pulling = asyncio.create_task(self._chained(
            prev, pulls, result.published - result.executed, self.pulls_started))
        self._raise_pull_error()
        return result

    async def _chained(self, prev: asyncio.Task[None] | None,
                       pulls: list[Pull], published: int,
                       seq: int) -> None:
        """This pull once the one before it is over; its error is kept for :meth:`drain`
        (the next pull goes ahead: its entries are published too)."""
        if prev is not None:
            await asyncio.wait([prev])
        try:
            await self._complete(pulls, published, seq)
        except Exception as exc:
            self._pull_errors.append(exc)

    def _raise_pull_error(self) -> None:
        if self._pull_errors:
            error = self._pull_errors[0]
            self._pull_errors.clear()
            raise error

    async def _publish(self, docs: list[_Doc], records: list[OutboundRecord]
                       ) -> list[PublishResult]:
        """The publisher's outcome per record; an exception fails the whole batch
        (retryably)."""
        if not records:
            return []
        spans = publish_spans(self.publisher, records)  # None: no tracer provider
        outcomes: list[PublishResult] = []
        try:
            outcomes = await self.publisher.publish(records)
            if len(outcomes) != len(records):
                raise RuntimeError(f"publisher {self.publisher.name} returned "
                                   f"{len(outcomes)} results for {len(records)} records")
        except asyncio.CancelledError:
            for d in docs:
                self.inflight.finish(d.key, (), self._ids(d.records))
            if spans is not None:
                spans.finish([])
            raise
        except Exception as exc:  # the whole batch failed: retry it
            log.warning("publisher %s failed: %s", self.publisher.name, exc,
                        extra={"collection": self.collection})
            outcomes = [PublishResult.retryable(f"{type(exc).__name__}: {exc}")] * len(records)
        if spans is not None:
            spans.finish(outcomes)
        return outcomes

    def _settle(self, d: _Doc, by_record: dict[int, PublishResult], now: datetime,
                result: CycleResult) -> tuple[list[str], list[str], list[DeadLetter]]:
        """One document's outcome: ids to pull (published or dead-lettered), ids released
        for a retry (from the first retryable failure on), and its dead letters. Counts
        into ``result``."""
        done: list[str] = []
        released: list[str] = []
        letters: list[DeadLetter] = []
        for r in d.records:
            rid = r.message_id if isinstance(r, OutboundRecord) else r.entry_id
            if released:
                released.append(rid)
                continue
            if isinstance(r, InvalidEntry):
                letters.append(self._letter_invalid(r, d))
                self._m_permanent.inc()
                self.metrics.dead_lettered.labels(self.collection, INVALID_OUTBOX_ENTRY).inc()
                done.append(rid)
                continue
            res = by_record[id(r)]
            if res.status == "ok":
                done.append(rid)
                result.published += 1
                result.executed += res.effect
                if r.created_at is not None:
                    self._m_latency.observe(max(0.0, (now - r.created_at).total_seconds()))
            elif res.status == "permanent":
                letters.append(self._letter_rejected(r, res))
                self._m_permanent.inc()
                self.metrics.dead_lettered.labels(self.collection, res.reason or "rejected").inc()
                log.error("dead-lettered %s (%s/%r → %s): %s: %s", rid,
                          self.collection, d.key, _target(r, res), res.reason, res.error,
                          extra={"collection": self.collection, "message_id": rid,
                                 "reason": res.reason, "alert": True})
                done.append(rid)
            else:
                released.append(rid)
                self._m_retryable.inc()
                result.retry_error = result.retry_error or res.error
        if released:
            result.retry.append(d.key)
        return done, released, letters

    def _release(self, pulls: list[Pull]) -> None:
        for d, _done, _released in pulls:  # published but not pulled: sent again later
            self.inflight.finish(d.key, (), self._ids(d.records))

    async def _complete(self, pulls: list[Pull],
                        published: int, seq: int = 0) -> None:
        pulls = self._still_fenced(pulls)
        try:
            await pull_entries(self.coll, [(d.key, done + d.stale) for d, done, _ in pulls
                                            if done or d.stale],
                               initial_s=self.backoff_initial_s,
                               max_s=self.backoff_max_s, timing=self.timing)
        except BaseException:
            self._release(pulls)
            raise
        self.faults.hit("after_pull")
        stale = 0
        for d, done, released in pulls:
            self.inflight.finish(d.key, done, released)
            stale += len(d.stale)
        self.pulls_done = max(self.pulls_done, seq)
        if published:
            self._m_published.inc(published)
        if stale:
            self._m_stale.inc(stale)
        self._m_batches.inc()

    def _still_fenced(self, pulls: list[Pull]) -> list[Pull]:
        keep, late = still_fenced(pulls, fence=self.fence, lease_held=self.lease_held,
                                  collection=self.collection)
        self._release(late)
        return keep

    @staticmethod
    def _ids(records: Sequence[OutboundRecord | InvalidEntry]) -> list[str]:
        return [r.message_id if isinstance(r, OutboundRecord) else r.entry_id for r in records]

    def _letter_rejected(self, r: OutboundRecord, res: PublishResult) -> DeadLetter:
        return rejected_letter(r, res, self.publisher.name)

    def _letter_invalid(self, exc: InvalidEntry, d: _Doc) -> DeadLetter:
        log.error("dead-lettered invalid outbox entry in %s/%r: %s", self.collection, d.key,
                  exc, extra={"collection": self.collection, "message_id": exc.entry_id,
                              "alert": True})
        return invalid_letter(exc, aggregate_type=str(d.doc.get(F_TYPE) or self.source_type),
                              aggregate_id=str(d.key))

    async def _write_letters(self, letters: list[DeadLetter], now: datetime) -> None:
        ops = [UpdateOne(*dead_letter_update(dl, now=now), upsert=True) for dl in letters]
        await self.dead_letters.bulk_write(ops, ordered=False)


def _target(r: OutboundRecord, res: PublishResult) -> str:
    """Where a record went, for a log line: its effect, or its topic."""
    return f"effect {r.envelope.get('type')}" if res.effect else f"topic {r.topic}"
