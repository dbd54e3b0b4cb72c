"""The store writer: applies ordered messages to aggregate documents with one conditional
single-document write per aggregate per slice (docs/design.md "The writer").

Per chunk of aggregates: one ``find`` by ``_id $in``, handlers applied in memory, one
unordered ``bulk_write`` of conditional upserts filtered on ``{_id, _v}``. A stale ``_v``
does not match, the upsert then collides on ``_id`` and the bulk reports ``E11000`` at that
operation's index: that aggregate is re-read and re-applied (bounded retries, backoff).

Inbox dedup: after every read, the inbox archive is asked (one query per chunk) about the
messages that could have left the inbox; before every write, the ids the write evicts are
archived (docs/design.md "Dedup").
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING, UpdateOne
from pymongo.collection import Collection
from pymongo.database import Database

from aggregates import outcomes as oc
from aggregates.aggregate import AggregateType, Registry
from aggregates.archive import InboxArchive
from aggregates.bulk import bulk_write_unordered
from aggregates.deadletters import DeadLetterStore
from aggregates.dedup import Inbox, needs_archive
from aggregates.document import (
    F_ARCHIVE_FLOOR,
    F_ARCHIVE_UNDATED,
    F_BLOCKED,
    F_HW,
    F_INBOX,
    F_OUTBOX,
    F_SEQ,
    F_STATE,
    F_STATE_VERSION,
    F_TYPE,
    F_VERSION,
    Snapshot,
    snapshot_from_document,
)
from aggregates.envelope import Message
from aggregates.errors import StoreError, UnknownAggregateType
from aggregates.fold import Changes, DeadLetter, FoldResult, Parked, fold
from aggregates.outcomes import Outcome
from aggregates.parking import ParkedStore
from aggregates.settings import AggboxSettings

log = logging.getLogger("aggbox.writer")

DUPLICATE_KEY = 11000


def utc_now() -> datetime:
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def build_update(atype: AggregateType[Any], snap: Snapshot, ch: Changes) -> UpdateOne:
    """The one conditional write for one aggregate: appends only for inbox and outbox
    (invariant 2), everything conditional on the version that was read (invariant 1)."""
    set_: dict[str, Any] = {}
    if ch.state is not None:
        set_[F_STATE] = ch.state
        # The state is always written in the current shape (migrated on load if older).
        set_[F_STATE_VERSION] = atype.state_version
    if ch.seq is not None:
        set_[F_SEQ] = ch.seq
    if ch.archive_floor is not None:
        set_[F_ARCHIVE_FLOOR] = ch.archive_floor
    if ch.archive_undated:
        set_[F_ARCHIVE_UNDATED] = True
    for key, seq in ch.hw.items():
        set_[f"{F_HW}.{key}"] = seq
    if ch.blocked is not None:
        set_[F_BLOCKED] = ch.blocked
    update: dict[str, Any] = {"$inc": {F_VERSION: 1}}
    if not snap.exists:
        update["$setOnInsert"] = {F_TYPE: atype.name}
    if set_:
        update["$set"] = set_
    push: dict[str, Any] = {}
    if ch.outbox:
        push[F_OUTBOX] = {"$each": ch.outbox}
    if ch.inbox:
        # Keep the window, but never drop an entry this write adds (the same rule as
        # DedupRecord.evict, so the stored inbox equals the one in memory).
        window = getattr(atype.dedup, "window", len(ch.inbox))
        push[F_INBOX] = {"$each": ch.inbox, "$slice": -max(window, len(ch.inbox))}
    if push:
        update["$push"] = push
    # Filter on _id and _v only, equality only: with upsert=True a stale _v makes the
    # insert collide on _id (E11000 at this op's index), a missing document is inserted.
    return UpdateOne({"_id": snap.aggregate_id, F_VERSION: snap.version}, update, upsert=True)


@dataclass(slots=True)
class _Work:
    """One aggregate's messages in this chunk, written slice by slice."""

    atype: AggregateType[Any]
    aggregate_id: str
    messages: list[Message] = field(default_factory=list)
    pos: int = 0
    conflicts: int = 0
    parked: list[Parked] = field(default_factory=list)


@dataclass(slots=True)
class WriterStats:
    chunks: int = 0
    writes: int = 0
    conflicts: int = 0
    rounds: int = 0
    read_s: float = 0.0
    fold_s: float = 0.0
    write_s: float = 0.0

    def merge(self, other: WriterStats) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class StoreWriter:
    """Applies messages to aggregate documents in MongoDB. See the module docstring.

    ``db`` is a pymongo ``Database`` (mongomock's works too, for unit tests). Input must be
    ordered within each aggregate; messages of one aggregate need not be adjacent."""

    def __init__(
        self,
        db: Database[Any],
        registry: Registry,
        *,
        settings: AggboxSettings | None = None,
        clock: Callable[[], datetime] = utc_now,
        sleep: Callable[[float], None] = time.sleep,
        before_write: Callable[[list[UpdateOne]], None] | None = None,
        fault: Callable[[str], None] | None = None,
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
        would scan the collection otherwise (harmless on MongoDB)."""
        for atype in self.registry:
            coll = self.db[atype.collection]
            coll.create_index([("_id", ASCENDING), (F_VERSION, ASCENDING)], unique=True,
                              name="aggbox_id_v")
            coll.create_index([(f"{F_OUTBOX}.0", ASCENDING)], sparse=True,
                              name="aggbox_outbox_pending")
        self.dead_letters.ensure_indexes()
        self.parking.ensure_indexes()
        for atype in self.registry:
            if isinstance(atype.dedup, Inbox):
                InboxArchive(self.db, atype.collection, atype.dedup).ensure_indexes()

    # -- processing -------------------------------------------------------------------
    def process(self, messages: Iterable[Message]) -> list[Outcome]:
        """Apply all messages; return one outcome per message (and per released one)."""
        return list(self.process_iter(messages))

    def process_iter(self, messages: Iterable[Message]) -> Iterator[Outcome]:
        """Streaming variant with memory bounded by ``pipeline_depth`` chunks.

        Chunks whose aggregates are disjoint are processed concurrently (``pipeline_depth``
        threads), so one chunk's handlers run while another waits for MongoDB. Outcomes
        come out in chunk order. A chunk that shares an aggregate with one in flight waits
        for it: per aggregate, writes stay strictly ordered."""
        depth = self.settings.pipeline_depth
        if depth <= 1:
            for works, dead in self._chunks(messages):
                yield from self._flush(works, dead)
            return
        inflight: deque[tuple[Future[list[Outcome]], set[tuple[str, str]]]] = deque()
        with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="aggbox-writer") as pool:
            try:
                for works, dead in self._chunks(messages):
                    keys = {(w.atype.name, w.aggregate_id) for w in works}
                    while inflight and (len(inflight) >= depth
                                        or any(keys & k for _, k in inflight)):
                        yield from inflight.popleft()[0].result()
                    inflight.append((pool.submit(self._flush, works, dead), keys))
                while inflight:
                    yield from inflight.popleft()[0].result()
            finally:
                for fut, _ in inflight:
                    fut.cancel()

    def _chunks(self, messages: Iterable[Message]
                ) -> Iterator[tuple[list[_Work], list[DeadLetter]]]:
        """Cut the input into chunks of at most ``chunk_aggregates`` aggregates and about
        ``chunk_messages`` messages."""
        s = self.settings
        chunk: dict[tuple[str, str], _Work] = {}
        pending_dead: list[DeadLetter] = []
        n = 0
        for msg in messages:
            try:
                atype = self.registry.get(msg.aggregate_type)
            except UnknownAggregateType as exc:
                pending_dead.append(DeadLetter(msg, None, oc.UNKNOWN_AGGREGATE_TYPE, str(exc),
                                               None, msg.aggregate_type, msg.aggregate_id))
                continue
            key = (atype.name, msg.aggregate_id)
            work = chunk.get(key)
            if work is None:
                if len(chunk) >= s.chunk_aggregates or n >= s.chunk_messages:
                    yield list(chunk.values()), pending_dead
                    chunk, pending_dead, n = {}, [], 0
                work = chunk[key] = _Work(atype, msg.aggregate_id)
            work.messages.append(msg)
            n += 1
            if n >= s.chunk_messages * 4:
                # A hot aggregate: do not buffer without bound waiting for its end.
                yield list(chunk.values()), pending_dead
                chunk, pending_dead, n = {}, [], 0
        if chunk or pending_dead:
            yield list(chunk.values()), pending_dead

    def retry_parked(self, aggregate_type: str, aggregate_ids: Sequence[str]) -> list[Outcome]:
        """Process these aggregates with no new input: their parked messages are retried."""
        atype = self.registry.get(aggregate_type)
        return self._flush([_Work(atype, a) for a in aggregate_ids], [])

    # -- one chunk --------------------------------------------------------------------
    def _flush(self, works: list[_Work], dead: list[DeadLetter]) -> list[Outcome]:
        st = WriterStats(chunks=1)
        now = self.clock()
        outcomes: list[Outcome] = [
            Outcome(d.message.message_id if d.message else "", d.aggregate_type or "",
                    d.aggregate_id or "", "dead_lettered", d.reason, d.detail)
            for d in dead
        ]
        by_coll: dict[str, list[_Work]] = {}
        for w in works:
            by_coll.setdefault(w.atype.collection, []).append(w)
        parked_new: dict[str, list[Parked]] = {}
        released: dict[str, list[tuple[str, str]]] = {}
        for cname, cworks in by_coll.items():
            self._process_collection(self.db[cname], cworks, now, outcomes, dead,
                                     parked_new.setdefault(cname, []),
                                     released.setdefault(cname, []), st)
        # Side records after the aggregate writes. A crash in between leaves the input
        # unacknowledged; re-running it re-derives the same decisions (idempotent).
        if self.fault is not None:
            self.fault("before_dead_letters")
        self.dead_letters.write(dead, now=now)
        if self.fault is not None:
            self.fault("before_parked")
        for cname in by_coll:
            self.parking.apply(cname, parked_new[cname], released[cname], now=now)
        with self._stats_lock:
            self.stats.merge(st)
        return outcomes

    def _process_collection(
        self,
        coll: Collection[Any],
        works: list[_Work],
        now: datetime,
        outcomes: list[Outcome],
        dead: list[DeadLetter],
        parked_new: list[Parked],
        released: list[tuple[str, str]],
        st: WriterStats,
    ) -> None:
        s = self.settings
        ids = [w.aggregate_id for w in works]
        t0 = time.perf_counter()
        snaps = self._read(coll, ids)
        parked = self.parking.load(coll.name, ids)
        for w in works:
            w.parked = parked.get(w.aggregate_id, [])
        archive = self._archive(works[0].atype)
        if archive is not None:
            self._lookup(archive, works, snaps)
        st.read_s += time.perf_counter() - t0
        active = {w.aggregate_id: w for w in works}
        while active:
            st.rounds += 1
            ops: list[UpdateOne] = []
            op_work: list[tuple[_Work, FoldResult, int]] = []
            settled: list[_Work] = []
            t0 = time.perf_counter()
            for w in active.values():
                end = w.pos + s.slice_messages
                batch = w.messages[w.pos:end]
                res = fold(w.atype, snaps[w.aggregate_id], batch, now=now, parked=w.parked,
                           max_document_bytes=s.max_document_bytes, attempt=w.conflicts + 1)
                if res.changes.empty:
                    self._settle(w, res, len(batch), snaps, outcomes, dead, parked_new,
                                 released, wrote=False)
                    if w.pos >= len(w.messages):
                        settled.append(w)
                    continue
                op_work.append((w, res, len(batch)))
                ops.append(build_update(w.atype, snaps[w.aggregate_id], res.changes))
            for w in settled:
                del active[w.aggregate_id]
            t1 = time.perf_counter()
            st.fold_s += t1 - t0
            if not ops:
                continue
            if archive is not None:
                # Ids leaving the inbox are archived before the write that evicts them.
                archive.write([(ow.aggregate_id, e) for ow, ores, _ in op_work
                               for e in ores.changes.archive], now=now)
            if self.before_write is not None:
                self.before_write(ops)
            conflicted = self._bulk(coll, ops)
            if self.fault is not None:
                self.fault("after_write")
            st.write_s += time.perf_counter() - t1
            st.writes += len(ops) - len(conflicted)
            retry_ids: list[str] = []
            for i, (w, res, n) in enumerate(op_work):
                if i in conflicted:
                    w.conflicts += 1
                    st.conflicts += 1
                    if w.conflicts > s.max_conflict_retries:
                        self._give_up(w, outcomes, parked_new)
                        del active[w.aggregate_id]
                    else:
                        retry_ids.append(w.aggregate_id)
                    continue
                res.snapshot.version += 1
                w.conflicts = 0  # the retry budget is for conflicts in a row
                self._settle(w, res, n, snaps, outcomes, dead, parked_new, released, wrote=True)
                if w.pos >= len(w.messages):
                    del active[w.aggregate_id]
            if retry_ids:
                snaps.update(self._read(coll, retry_ids))
                if archive is not None:
                    self._lookup(archive, [active[i] for i in retry_ids], snaps)
                worst = max(active[i].conflicts for i in retry_ids)
                delay = min(s.conflict_backoff_max_ms,
                            s.conflict_backoff_ms * 2 ** min(worst - 1, 16))
                self.sleep(delay * (0.5 + self._rng.random()) / 1000.0)

    def _settle(self, w: _Work, res: FoldResult, n: int, snaps: dict[str, Snapshot],
                outcomes: list[Outcome], dead: list[DeadLetter], parked_new: list[Parked],
                released: list[tuple[str, str]], *, wrote: bool) -> None:
        """Accept a fold whose write succeeded (or that needed none)."""
        snaps[w.aggregate_id] = res.snapshot
        w.pos += n
        outcomes.extend(res.outcomes)
        dead.extend(res.dead_letters)
        parked_new.extend(res.parked)
        released.extend((w.aggregate_id, m) for m in res.released)
        # Parked messages that were retried and still wait stay parked; the ones parked by
        # this slice are candidates for the next slice of the same aggregate.
        still = {p.message.message_id for p in w.parked} - set(res.released)
        w.parked = [p for p in w.parked if p.message.message_id in still] + list(res.parked)

    def _give_up(self, w: _Work, outcomes: list[Outcome], parked_new: list[Parked]) -> None:
        detail = (f"{w.conflicts} version conflicts in a row on {w.atype.name}/"
                  f"{w.aggregate_id}; parked, retried with the aggregate's next messages")
        log.warning("giving up on %s/%s after %d conflicts", w.atype.name, w.aggregate_id,
                    w.conflicts)
        for m in w.messages[w.pos:]:
            parked_new.append(Parked(m, oc.VERSION_CONFLICT, detail))
            outcomes.append(Outcome(m.message_id, m.aggregate_type, m.aggregate_id, "parked",
                                    oc.VERSION_CONFLICT, detail, (), w.conflicts))
        w.pos = len(w.messages)

    def _archive(self, atype: AggregateType[Any]) -> InboxArchive | None:
        if not isinstance(atype.dedup, Inbox):
            return None
        return InboxArchive(self.db, atype.collection, atype.dedup)

    def _lookup(self, archive: InboxArchive, works: Sequence[_Work],
                snaps: dict[str, Snapshot]) -> None:
        """Complete freshly read snapshots with what the archive holds for the messages
        still to apply (and the parked ones). Must run after the read (docs/design.md
        "Dedup"): an id evicted by a write the read saw was archived before that write."""
        pairs: list[tuple[str, str]] = []
        for w in works:
            rec = snaps[w.aggregate_id].dedup
            for m in w.messages[w.pos:]:
                if needs_archive(rec, m):
                    pairs.append((w.aggregate_id, m.message_id))
            for p in w.parked:
                if needs_archive(rec, p.message):
                    pairs.append((w.aggregate_id, p.message.message_id))
        found = archive.lookup(pairs) if pairs else {}
        for w in works:
            snaps[w.aggregate_id].dedup.looked_up(found.get(w.aggregate_id, {}))

    def _read(self, coll: Collection[Any], ids: list[str]) -> dict[str, Snapshot]:
        found = {d["_id"]: d for d in coll.find({"_id": {"$in": ids}})}
        return {i: snapshot_from_document(found.get(i), i) for i in ids}

    def _bulk(self, coll: Collection[Any], ops: list[UpdateOne]) -> set[int]:
        """Run the unordered bulk; return the indexes that hit a version conflict."""
        conflicted: set[int] = set()
        for err in bulk_write_unordered(coll, ops):
            if err.get("code") == DUPLICATE_KEY:
                conflicted.add(int(err["index"]))
            else:
                raise StoreError(
                    f"write to {coll.name} failed at op {err.get('index')}: "
                    f"code {err.get('code')}: {err.get('errmsg')}"
                )
        return conflicted
