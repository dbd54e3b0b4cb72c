"""One chunk's aggregates of one collection, written until every slice is settled
(docs/design.md "The writer", steps 2–6).

Read the documents (and the parked messages, and the dedup archive's answer), fold each
aggregate's next slice, send one unordered bulk of conditional upserts, settle what was
written, re-read and re-fold what conflicted, back off, and repeat. :meth:`CollectionPass.run`
returns a :class:`PassResult`; the side records it lists are written by the caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pymongo.collection import Collection

from aggregates.core.backoff import backoff_delay
from aggregates.core.bulk import WriteError, bulk_write_unordered
from aggregates.core.reasons import Reason
from aggregates.core.settings import AggboxSettings
from aggregates.core.storeerrors import is_transient
from aggregates.dedup import RecordArchive
from aggregates.dedup.runs import F_RUN, RunStamp, read_run
from aggregates.fold import fold
from aggregates.fold.document import Snapshot, snapshot_from_document
from aggregates.fold.result import DeadLetter, FoldResult, Parked
from aggregates.message.outcomes import Outcome
from aggregates.store.chunks import Work
from aggregates.store.parking import ParkedStore
from aggregates.store.update import WriteOp, build_update

__all__ = ["CollectionPass", "PassContext", "PassResult", "Pending", "WriterStats"]

log = logging.getLogger("aggbox.writer")


@dataclass(slots=True)
class WriterStats:
    chunks: int = 0
    writes: int = 0
    conflicts: int = 0
    rounds: int = 0
    read_s: float = 0.0
    fold_s: float = 0.0
    write_s: float = 0.0
    #: Slices folded by the native core / by the definition (docs/design.md "The batch
    #: fold").
    native_slices: int = 0
    definition_slices: int = 0

    def merge(self, other: WriterStats) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True, slots=True)
class PassContext:
    """What a pass takes from its writer (read when the chunk starts)."""

    settings: AggboxSettings
    parking: ParkedStore
    sleep: Callable[[float], None]
    #: Uniform in [0, 1): the backoff's jitter.
    random: Callable[[], float]
    before_write: Callable[[list[WriteOp]], None] | None = None
    fault: Callable[[str], None] | None = None
    #: The writer's run stamp and its claims, per (collection, aggregate id): kept across
    #: chunks, so each message an earlier attempt of the run applied is counted once
    #: (aggregates.dedup.runs).
    run: RunStamp | None = None
    claims: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    #: The store's clock at the chunk's start, when it is not the writer's (TTL fields).
    store_now: datetime | None = None


@dataclass(slots=True)
class PassResult:
    """What a pass decided: one outcome per message (and per released parked one), and the
    side records to write after the aggregate writes."""

    outcomes: list[Outcome] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    parked: list[Parked] = field(default_factory=list)
    #: ``(aggregate_id, message_id)`` of parked messages that no longer wait.
    released: list[tuple[str, str]] = field(default_factory=list)
    stats: WriterStats = field(default_factory=WriterStats)

    def absorb(self, aggregate_id: str, res: FoldResult) -> None:
        self.outcomes.extend(res.outcomes)
        if res.dead_letters:  # per aggregate: the side lists are mostly empty
            self.dead_letters.extend(res.dead_letters)
        if res.parked:
            self.parked.extend(res.parked)
        if res.released:
            self.released.extend((aggregate_id, m) for m in res.released)


@dataclass(frozen=True, slots=True)
class Pending:
    """One aggregate's slice folded in this round, with the write that stores it."""

    work: Work
    #: The fold's result: a FoldResult, or the native core's (read the same way:
    #: aggregates/store/native_pass.py)
    result: Any
    size: int  # messages in the slice


class CollectionPass:
    """Processes ``works`` (aggregates of one collection) for one chunk."""

    def __init__(self, coll: Collection[Any], works: list[Work], archive: RecordArchive | None,
                 *, now: datetime, ctx: PassContext) -> None:
        self.coll = coll
        self.works = works
        self.archive = archive
        self.now = now
        self.ctx = ctx
        self.result = PassResult()
        self.snaps: dict[str, Any] = {}

    def run(self) -> PassResult:
        st = self.result.stats
        t0 = time.perf_counter()
        self._load()
        st.read_s += time.perf_counter() - t0
        active = {w.aggregate_id: w for w in self.works}
        while active:
            st.rounds += 1
            t0 = time.perf_counter()
            pending = self._fold_round(active)
            t1 = time.perf_counter()
            st.fold_s += t1 - t0
            if not pending:
                continue
            errors = self._write(pending)
            st.write_s += time.perf_counter() - t1
            retry = self._after_write(pending, errors, active)
            if retry:
                self._reread(retry)
                self._back_off(max(max(w.conflicts, w.transient) for w in retry))
        return self.result

    # -- reading ----------------------------------------------------------------------
    def _load(self) -> None:
        ids = [w.aggregate_id for w in self.works]
        self.snaps = self._read(ids)
        parked = self.ctx.parking.load(self.coll.name, ids)
        for w in self.works:
            w.parked = parked.get(w.aggregate_id, [])
        self._lookup(self.works)

    def _read(self, ids: list[str]) -> dict[str, Any]:
        found = {d["_id"]: d for d in self.coll.find({"_id": {"$in": ids}})}
        return {i: self._snapshot(i, found.get(i)) for i in ids}

    def _snapshot(self, aggregate_id: str, doc: dict[str, Any] | None) -> Snapshot:
        """The snapshot of a document as read (None: missing), with its run stamp."""
        snap = snapshot_from_document(doc, aggregate_id)
        stored = doc.get(F_RUN) if doc is not None else None
        stamp = self.ctx.run
        if stamp is not None or stored is not None:  # run stamps (aggregates.dedup.runs)
            snap.dedup.run = read_run(stored, stamp,
                                      self.ctx.claims.get((self.coll.name, aggregate_id)))
        return snap

    def _reread(self, works: list[Work]) -> None:
        self.snaps.update(self._read([w.aggregate_id for w in works]))
        self._lookup(works)

    def _lookup(self, works: Sequence[Work]) -> None:
        """Complete freshly read snapshots with what the dedup archive holds for the
        messages still to apply (and the parked ones). Must run after the read
        (docs/design.md "Dedup"): an id evicted by a write the read saw was archived before
        that write."""
        if self.archive is None:
            return
        pairs: list[tuple[str, str]] = []
        for w in works:
            pairs.extend(self._pairs(w, self.snaps[w.aggregate_id]))
        found, tags = self.archive.lookup_tagged(pairs) if pairs else ({}, {})
        for w in works:
            self.snaps[w.aggregate_id].dedup.looked_up(found.get(w.aggregate_id, {}),
                                                       tags.get(w.aggregate_id))

    @staticmethod
    def _pairs(w: Work, snap: Snapshot) -> list[tuple[str, str]]:
        """The (aggregate, message) pairs of ``w`` the archive must be asked about."""
        rec, strategy = snap.dedup, w.atype.dedup
        if not strategy.may_need_lookup(rec):
            return []
        pairs = [(w.aggregate_id, m.message_id) for m in w.messages[w.pos:]
                 if strategy.needs_lookup(rec, m)]
        pairs.extend((w.aggregate_id, p.message.message_id) for p in w.parked
                     if strategy.needs_lookup(rec, p.message))
        return pairs

    # -- one round --------------------------------------------------------------------
    def _fold_round(self, active: dict[str, Work]) -> list[Pending]:
        """Fold each active aggregate's next slice; settle (and retire) the ones that need
        no write; return the ones that do."""
        s = self.ctx.settings
        pending: list[Pending] = []
        for w in list(active.values()):
            n = min(s.slice_messages, len(w.messages) - w.pos)
            res = self._fold(w, n)
            if res.changes.empty:
                self._settle(w, res, n)
                if w.done:
                    del active[w.aggregate_id]
            else:
                pending.append(Pending(w, res, n))
        return pending

    def _fold(self, w: Work, n: int) -> Any:
        """The fold of ``w``'s next ``n`` messages (the definition; the batch fold's pass
        folds natively where it can: :mod:`aggregates.store.native_pass`)."""
        s = self.ctx.settings
        self.result.stats.definition_slices += 1
        return fold(w.atype, self.snaps[w.aggregate_id], w.messages[w.pos:w.pos + n],
                    now=self.now, parked=w.parked, max_document_bytes=s.max_document_bytes,
                    attempt=w.conflicts + 1)

    def _op(self, p: Pending) -> Any:
        """The conditional write of a folded slice."""
        return build_update(p.work.atype, self.snaps[p.work.aggregate_id], p.result.changes)

    def _evicted(self, p: Pending) -> Sequence[Any]:
        """The dedup entries leaving the document with ``p``'s write."""
        res: FoldResult = p.result
        return res.changes.dedup.archive

    def _write(self, pending: list[Pending]) -> list[WriteError]:
        """Archive what leaves the documents, then send the round's conditional writes."""
        ops = [self._op(p) for p in pending]
        if self.archive is not None:
            # Ids leaving the dedup record are archived before the write that evicts them.
            self.archive.write([(p.work.aggregate_id, e) for p in pending
                                for e in self._evicted(p)], now=self.now,
                               store_now=self.ctx.store_now)
        if self.ctx.before_write is not None:
            self.ctx.before_write(ops)
        errors = bulk_write_unordered(self.coll, ops)
        if self.ctx.fault is not None:
            self.ctx.fault("after_write")
        return errors

    def _after_write(self, pending: list[Pending], errors: list[WriteError],
                     active: dict[str, Work]) -> list[Work]:
        """Settle the written slices; return the aggregates to re-read and fold again."""
        conflicted, transient = self._classify(errors)
        st = self.result.stats
        st.writes += len(pending) - len(conflicted) - len(transient)
        retry: list[Work] = []
        for i, p in enumerate(pending):
            w = p.work
            if i in conflicted:
                w.conflicts += 1
                st.conflicts += 1
                if w.conflicts > self.ctx.settings.max_conflict_retries:
                    self._give_up(w)
                    del active[w.aggregate_id]
                else:
                    retry.append(w)
            elif i in transient:
                w.transient += 1
                if w.transient > self.ctx.settings.max_conflict_retries:
                    raise transient[i].store_error(f"write to {self.coll.name} (after "
                                                   f"{w.transient - 1} retries)")
                retry.append(w)
            else:
                w.conflicts = w.transient = 0  # the retry budgets are for failures in a row
                self._written(p)
                if w.done:
                    del active[w.aggregate_id]
        return retry

    def _classify(self, errors: list[WriteError]) -> tuple[set[int], dict[int, WriteError]]:
        """Version conflicts (``E11000`` on ``{_id, _v}``) and transient failures (the
        server's code or labels say a retry may succeed: the operation did not apply, so
        re-reading and folding again is safe), by operation index. Anything else raises
        :class:`~aggregates.core.errors.StoreError`: the batch fails and is retried as a whole."""
        conflicted: set[int] = set()
        transient: dict[int, WriteError] = {}
        for err in errors:
            if err.duplicate_key:
                conflicted.add(err.index)
            elif is_transient(err.failure()):
                transient[err.index] = err
            else:
                raise err.store_error(f"write to {self.coll.name}")
        return conflicted, transient

    def _back_off(self, failures: int) -> None:
        s = self.ctx.settings
        delay_ms = backoff_delay(failures - 1, initial=s.conflict_backoff_ms,
                                 maximum=s.conflict_backoff_max_ms, random=self.ctx.random)
        self.ctx.sleep(delay_ms / 1000.0)

    # -- settling ---------------------------------------------------------------------
    def _written(self, p: Pending) -> None:
        """Settle a slice whose write succeeded."""
        p.result.snapshot.version += 1
        self._settle(p.work, p.result, p.size)

    def _settle(self, w: Work, res: FoldResult, n: int) -> None:
        """Accept a fold whose write succeeded (or that needed none)."""
        snap = res.snapshot
        self.snaps[w.aggregate_id] = snap
        run = snap.dedup.run if isinstance(snap, Snapshot) else None
        if run is not None and run.claimed:
            self.ctx.claims[(self.coll.name, w.aggregate_id)] = run.claimed
        w.pos += n
        self.result.absorb(w.aggregate_id, res)
        # Parked messages that were retried and still wait stay parked; the ones parked by
        # this slice are candidates for the next slice of the same aggregate.
        if w.parked:
            still = {p.message.message_id for p in w.parked} - set(res.released)
            w.parked = [p for p in w.parked if p.message.message_id in still] + list(res.parked)
        elif res.parked:
            w.parked = list(res.parked)

    def _give_up(self, w: Work) -> None:
        detail = (f"{w.conflicts} version conflicts in a row on {w.atype.name}/"
                  f"{w.aggregate_id}; parked, retried with the aggregate's next messages")
        log.warning("giving up on %s/%s after %d conflicts", w.atype.name, w.aggregate_id,
                    w.conflicts)
        for m in w.messages[w.pos:]:
            self.result.parked.append(Parked(m, Reason.VERSION_CONFLICT_RETRIES_EXHAUSTED, detail))
            self.result.outcomes.append(Outcome(
                m.message_id, m.aggregate_type, m.aggregate_id, "parked",
                Reason.VERSION_CONFLICT_RETRIES_EXHAUSTED, detail, (), w.conflicts))
        w.pos = len(w.messages)
