"""The store writer: applies ordered messages to aggregate documents with one conditional
single-document write per aggregate per slice (docs/design.md "The writer").

Per chunk of aggregates: one ``find`` by ``_id $in``, handlers applied in memory, one
unordered ``bulk_write`` of conditional upserts filtered on ``{_id, _v}``. A stale ``_v``
does not match, the upsert then collides on ``_id`` and the bulk reports ``E11000`` at that
operation's index: that aggregate is re-read and re-applied (bounded retries, backoff).

Dedup archives (the inbox's): after every read, the archive is asked (one query per chunk)
about the messages that could have left the document; before every write, the entries the
write evicts are archived (docs/design.md "Dedup").

This module runs chunks (pipelined) and writes their side records; the parts are
:mod:`aggregates.store.chunks` (cutting the input), :mod:`aggregates.store.write_pass` (one
collection of one chunk: read, fold, write, conflicts), :mod:`aggregates.store.update` (the
conditional write) and :mod:`aggregates.core.bulk` (the unordered bulk and its errors).
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING
from pymongo.database import Database

from aggregates.core.gcpause import gc_paused
from aggregates.core.settings import AggboxSettings
from aggregates.dedup.runs import RunStamp
from aggregates.domain.aggregate import Registry
from aggregates.fold.document import F_OUTBOX, F_PARTITION, F_TIMERS, F_VERSION
from aggregates.fold.result import DeadLetter, Parked
from aggregates.message.envelope import Message
from aggregates.message.outcomes import Outcome
from aggregates.store.chunks import Work, chunks
from aggregates.store.deadletters import DeadLetterStore
from aggregates.store.native_pass import NativePass
from aggregates.store.nativefold import spec_of
from aggregates.store.parking import ParkedStore
from aggregates.store.tracing import chunk_trace, tracer
from aggregates.store.update import WriteOp, build_update
from aggregates.store.write_pass import CollectionPass, PassContext, WriterStats

__all__ = ["StoreWriter", "WriterStats", "build_update", "utc_now"]


def utc_now() -> datetime:
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


class StoreWriter:
    """Applies messages to aggregate documents in MongoDB. See the module docstring.

    ``db`` is a pymongo ``Database`` (in unit tests: :func:`aggregates.testing.memory_database`,
    with ``pipeline_depth=1``). Input must be ordered within each aggregate; messages of one
    aggregate need not be adjacent."""

    def __init__(
        self,
        db: Database[Any],
        registry: Registry,
        *,
        settings: AggboxSettings | None = None,
        clock: Callable[[], datetime] = utc_now,
        sleep: Callable[[float], None] = time.sleep,
        before_write: Callable[[list[WriteOp]], None] | None = None,
        fault: Callable[[str], None] | None = None,
        run: RunStamp | None = None,
        store_clock: Callable[[], datetime] | None = None,
        native: bool = True,
    ) -> None:
        self.db = db
        self.registry = registry
        self.settings = settings or AggboxSettings.load()
        self.clock = clock
        self.sleep = sleep
        self.before_write = before_write  # test hook: inject concurrent writers
        #: Test hook: called at "after_write" (a round's aggregate writes are done),
        #: "before_dead_letters" and "before_parked"; raising there simulates a crash.
        self.fault = fault
        #: Who writes (the pipeline's run and task attempt): documents are stamped, and a
        #: message an earlier attempt of the same run applied is counted ``applied`` once
        #: (reason ``earlier_attempt``), not ``duplicate`` (aggregates.dedup.runs).
        self.run = run
        #: The clock the store compares TTL fields with (its own): the inbox archive's
        #: expiry is put as far ahead of it as of ``clock``. ``None``: ``clock`` (both are
        #: the wall clock in production); a test with a fixed clock passes ``utc_now``.
        self.store_clock = store_clock
        #: Fold with the native core where it can (docs/design.md "The batch fold"): on a
        #: MongoDB server (it reads and writes BSON; not the in-memory test double). False:
        #: the definition alone (the same writes and outcomes, slower).
        self.native = native and isinstance(db, Database)
        self._claims: dict[tuple[str, str], set[str]] = {}
        self.dead_letters = DeadLetterStore(db, collection=self.settings.dead_letter_collection)
        self.parking = ParkedStore(db, collection=self.settings.parked_collection)
        self.stats = WriterStats()
        self._stats_lock = threading.Lock()
        self._rng = random.Random()

    # -- set-up -----------------------------------------------------------------------
    def ensure_indexes(self) -> None:
        """Create the indexes the writer needs. Idempotent.

        ``{_id: 1, _v: 1}`` unique: MongoDB answers ``{_id, _v}`` from the ``_id`` index
        anyway; mongo-java-server only uses an index whose keys equal the filter's keys and
        would scan the collection otherwise (harmless on MongoDB). ``{"outbox.0": 1}`` and
        ``{_p: 1, "outbox.0": 1}`` (sparse): the dispatcher's sweeps, of all documents and of
        one partition's; ``{"timers.due": 1}`` and ``{_p: 1, "timers.due": 1}`` (sparse,
        multikey): the dispatcher's due timers."""
        for atype in self.registry:
            coll = self.db[atype.collection]
            coll.create_index([("_id", ASCENDING), (F_VERSION, ASCENDING)], unique=True,
                              name="aggbox_id_v")
            coll.create_index([(f"{F_OUTBOX}.0", ASCENDING)], sparse=True,
                              name="aggbox_outbox_pending")
            # The dispatcher's sweep of one partition's pending outboxes. Sparse: a
            # document is indexed when any key exists, i.e. every document with a _p.
            coll.create_index([(F_PARTITION, ASCENDING), (f"{F_OUTBOX}.0", ASCENDING)],
                              sparse=True, name="aggbox_partition_pending")
            # The dispatcher's due timers (dispatcher/timers/firer.py), of all documents and of
            # one partition's: multikey on each pending timer's due time.
            coll.create_index([(f"{F_TIMERS}.due", ASCENDING)], sparse=True,
                              name="aggbox_timers_due")
            coll.create_index([(F_PARTITION, ASCENDING), (f"{F_TIMERS}.due", ASCENDING)],
                              sparse=True, name="aggbox_partition_timers_due")
        self.dead_letters.ensure_indexes()
        self.parking.ensure_indexes()
        for atype in self.registry:
            archive = atype.dedup.archive(self.db, atype.collection)
            if archive is not None:
                archive.ensure_indexes()

    # -- processing -------------------------------------------------------------------
    def process(self, messages: Iterable[Message]) -> list[Outcome]:
        """Apply all messages; return one outcome per message (and per released one)."""
        out: list[Outcome] = []
        for part in self._outcome_lists(messages):  # a list at a time, not an outcome
            out.extend(part)
        return out

    def process_iter(self, messages: Iterable[Message]) -> Iterator[Outcome]:
        """Streaming variant with memory bounded by ``pipeline_depth`` chunks.

        Chunks whose aggregates are disjoint are processed concurrently (``pipeline_depth``
        threads), so one chunk's handlers run while another waits for MongoDB. Outcomes
        come out in chunk order. A chunk that shares an aggregate with one in flight waits
        for it: per aggregate, writes stay strictly ordered."""
        parts = self._outcome_lists(messages)
        try:
            for part in parts:
                yield from part
        finally:
            parts.close()  # closing this closes the chunks in flight too, as before

    def _outcome_lists(self, messages: Iterable[Message]) -> Generator[list[Outcome], None, None]:
        """:meth:`process_iter`'s outcomes, a list at a time (per chunk)."""
        depth = self.settings.pipeline_depth
        if depth <= 1:
            for works, dead, events in chunks(messages, self.registry, self.settings):
                yield events  # aggbox events of types not registered here: duplicate
                yield self._flush(works, dead)
            return
        inflight: deque[tuple[Future[list[Outcome]], set[tuple[str, str]]]] = deque()
        with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="aggbox-writer") as pool:
            try:
                for works, dead, events in chunks(messages, self.registry, self.settings):
                    yield events
                    keys = {(w.atype.name, w.aggregate_id) for w in works}
                    while inflight and (len(inflight) >= depth
                                        or any(keys & k for _, k in inflight)):
                        yield inflight.popleft()[0].result()
                    inflight.append((pool.submit(self._flush, works, dead), keys))
                while inflight:
                    yield inflight.popleft()[0].result()
            finally:
                for fut, _ in inflight:
                    fut.cancel()

    def retry_parked(self, aggregate_type: str, aggregate_ids: Sequence[str]) -> list[Outcome]:
        """Process these aggregates with no new input: their parked messages are retried."""
        atype = self.registry.get(aggregate_type)
        return self._flush([Work(atype, a) for a in aggregate_ids], [])

    # -- one chunk --------------------------------------------------------------------
    def _flush(self, works: list[Work], dead: list[DeadLetter]) -> list[Outcome]:
        if tracer() is None:  # no tracer provider configured: no spans (the hot path)
            return self._flush_chunk(works, dead)
        messages = [m for w in works for m in w.messages]
        messages.extend(d.message for d in dead if d.message is not None)
        with chunk_trace(messages, per_message=self.settings.tracing == "messages",
                         types=[w.atype.name for w in works]) as trace:
            outcomes = self._flush_chunk(works, dead)
            if trace is not None:
                trace.finish(outcomes)
        return outcomes

    def _flush_chunk(self, works: list[Work], dead: list[DeadLetter]) -> list[Outcome]:
        # The collector paused for the chunk (aggregates/core/gcpause.py: ~27k
        # instructions per message were collections walking the chunk's live objects).
        with gc_paused():
            return self._flush_chunk_paused(works, dead)

    def _flush_chunk_paused(self, works: list[Work], dead: list[DeadLetter]
                            ) -> list[Outcome]:
        now = self.clock()
        outcomes: list[Outcome] = [
            Outcome(d.message.message_id if d.message else "", d.aggregate_type or "",
                    d.aggregate_id or "", "dead_lettered", d.reason, d.detail)
            for d in dead
        ]
        by_coll: dict[str, list[Work]] = {}
        for w in works:
            by_coll.setdefault(w.atype.collection, []).append(w)
        ctx = PassContext(self.settings, self.parking, self.sleep, self._rng.random,
                          self.before_write, self.fault, self.run, self._claims,
                          store_now=self.store_clock() if self.store_clock else None)
        st = WriterStats(chunks=1)
        side: dict[str, tuple[list[Parked], list[tuple[str, str]]]] = {}
        for cname, cworks in by_coll.items():
            atype = cworks[0].atype
            archive = atype.dedup.archive(self.db, atype.collection)
            spec = spec_of(atype) if self.native else None
            if spec is not None:  # the batch fold (aggregates/store/native_pass.py)
                res = NativePass(self.db[cname], cworks, archive, now=now, ctx=ctx,
                                 spec=spec).run()
            else:
                res = CollectionPass(self.db[cname], cworks, archive, now=now, ctx=ctx).run()
            outcomes.extend(res.outcomes)
            dead = dead + res.dead_letters
            side[cname] = (res.parked, res.released)
            st.merge(res.stats)
        # Side records after the aggregate writes. A crash in between leaves the input
        # unacknowledged; re-running it re-derives the same decisions (idempotent).
        if self.fault is not None:
            self.fault("before_dead_letters")
        self.dead_letters.write(dead, now=now)
        if self.fault is not None:
            self.fault("before_parked")
        for cname, (parked, released) in side.items():
            self.parking.apply(cname, parked, released, now=now)
        with self._stats_lock:
            self.stats.merge(st)
        return outcomes
