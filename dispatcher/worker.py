"""One collection's dispatcher: standby until it holds partitions, then stream (or poll) mode
on them, started over whenever its set of partitions changes.

The worker only decides *what* to do next; each part is its own object, testable alone:

- :class:`~dispatcher.leases.balancer.Balancer` — the partition leases: heartbeat, renewal,
  claims and hand-overs (the worker publishes :meth:`~dispatcher.leases.balancer.Balancer.active`,
  selected by :class:`~dispatcher.outbox.selection.Selection`, and starts over when it changes);
- :class:`~dispatcher.outbox.streammode.StreamMode` — the change stream, its restarts and the
  resume-token checkpoints (docs/design.md "The dispatcher", steps 1, 3, 4);
- :class:`~dispatcher.outbox.sweep.Sweeps` — start-up, recovery, periodic and ``--once``
  sweeps; :class:`~dispatcher.outbox.retries.Retries` — backoff, documents kept for a retry;
- :class:`~dispatcher.outbox.cycle.Cycle` — publishing, dead letters, ``$pull``;
  :class:`~dispatcher.timers.firer.TimerFirer` — due timers, beside the outbox;
- :class:`~dispatcher.outbox.outcomes.Outcomes` — counts, backoff, one line per failure;
  :func:`~dispatcher.outbox.backlog.measure_backlog` — the backlog gauges;
  :mod:`~dispatcher.leases.once` — ``--once``'s note, and its idle start without leases.

Mode choice (:meth:`~dispatcher.outbox.streammode.StreamMode.choose`): ``auto`` opens a
change stream, polling (sweep, publish, pause when idle) when the server has none. Both
back off after failures without pulling anything and
stop publishing as soon as the lease is lost. A fatal store error (wrong password, missing
privilege: :mod:`aggregates.core.storeerrors`) ends the worker with
:class:`~dispatcher.core.errors.FatalStoreError`; every other failure is retried after backoff.

Time is injected (:class:`~dispatcher.core.timing.Timing`: clock, pauses, backoff jitter). Each
MongoDB round trip is reported to :class:`~dispatcher.observe.metrics.Health`; ``--once`` watches
``progress_at`` and ends when its entries and due timers are done, each partition held by
a live instance and its own all published (none in takeover).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError

from aggregates.wire.fence import fence_scope
from dispatcher.core.errors import FatalStoreError, check_fatal
from dispatcher.core.faults import Faults
from dispatcher.core.settings import DispatcherSettings
from dispatcher.core.timing import REAL_TIME, Timing, pause
from dispatcher.effects.guard import FleetEffects
from dispatcher.leases.balancer import Balancer
from dispatcher.leases.once import note_once, nothing_to_do
from dispatcher.leases.partlease import PartitionLeases
from dispatcher.observe.metrics import Health, Metrics
from dispatcher.outbox.backlog import measure_backlog
from dispatcher.outbox.cycle import Cycle
from dispatcher.outbox.inflight import InFlight
from dispatcher.outbox.outcomes import LeaseLost, Outcomes, WorkerStats
from dispatcher.outbox.retries import Retries
from dispatcher.outbox.selection import Selection
from dispatcher.outbox.stream import Checkpoints, StreamFollower
from dispatcher.outbox.streammode import StreamMode
from dispatcher.outbox.sweep import Sweeps, poll
from dispatcher.publishers.base import Publisher
from dispatcher.publishers.native import NATIVE, RAW
from dispatcher.timers.firer import TimerFirer

__all__ = ["CollectionWorker", "WorkerStats"]

log = logging.getLogger("aggbox.dispatcher")


class CollectionWorker:
    """Dispatches one collection until ``stop`` is set (or, with ``once``, until drained)."""

    def __init__(self, *, db: AsyncDatabase[Any], collection: str,
                 settings: DispatcherSettings, publisher: Publisher,
                 dead_letter_collection: str, metrics: Metrics, health: Health,
                 faults: Faults, stop: asyncio.Event, owner: str,
                 source_type: str | None = None, once: bool = False,
                 timing: Timing = REAL_TIME, fleet: FleetEffects | None = None) -> None:
        s = self.settings = settings
        self.db, self.coll, self.name = db, db[collection], collection
        self.metrics, self.health, self.faults = metrics, health, faults
        self.stop, self.once, self.timing = stop, once, timing
        self.scope = key = f"{db.name}.{collection}"
        #: ``<database>.<collection>``, checked to parse back (aggregates/wire/fence.py)
        self._fence_scope = fence_scope(db.name, collection)
        self.leases = PartitionLeases(db[s.partition_collection], db[s.member_collection],
                                      database=db.name, collection=collection, owner=owner,
                                      ttl_s=s.lease_ttl_s, grace_s=s.takeover_grace_s,
                                      effect_types=fleet.local if fleet else ())
        self.fleet = fleet
        self.balancer = Balancer(self.leases, name=collection, interval_s=s.renew_interval_s,
                                 health=health, metrics=metrics, stop=stop, timing=timing,
                                 on_contact=self._contact,
                                 on_error=lambda text: setattr(self.outcomes, "last_error", text),
                                 published=lambda: self.outcomes.counts.published,
                                 publishing=lambda: self.selection.partitions,
                                 on_members=self._on_members if fleet else None, eager=once)
        #: the partitions published in the current activation (empty while standby)
        self.selection = Selection()
        self.selection.set(())
        self.inflight = InFlight(done_capacity=s.done_cache_size)
        self.retries = Retries(initial_s=s.backoff_initial_ms / 1000,
                               max_s=s.backoff_max_ms / 1000, timing=timing)
        self.cycle = Cycle(
            self.coll, publisher=publisher, inflight=self.inflight,
            dead_letters=db[dead_letter_collection], topic_template=s.topic_template,
            max_batch_records=s.max_batch_records, metrics=metrics, faults=faults,
            lease_held=lambda: self.balancer.holds(self.selection.partitions),
            source_type=source_type, fence=self._fence,
            backoff_initial_s=s.backoff_initial_ms / 1000,
            backoff_max_s=s.backoff_max_ms / 1000, timing=timing)
        self.timers = TimerFirer(
            self.coll, publisher=publisher, dead_letters=db[dead_letter_collection],
            metrics=metrics, where=self.selection.query, fence=self._fence,
            lease_held=lambda: self.balancer.holds(self.selection.partitions),
            source_type=source_type, topic_template=s.topic_template,
            page_size=s.batch_size, faults=faults,
            on_error=lambda exc: self.outcomes.timers_failed(exc))
        #: pages read as raw BSON where the native core builds records (publishers/native.py)
        self.read_coll = self.coll.with_options(codec_options=RAW) if NATIVE else self.coll
        self.follower = StreamFollower(self.coll, batch_size=s.batch_size,
                                       pacing_s=s.pacing_ms / 1000, timing=timing,
                                       where=self.selection.stream_match,
                                       partitions=self.selection.held,
                                       read_coll=self.read_coll)
        self.sweeps = Sweeps(self.read_coll, self.cycle, name=collection, page_size=s.batch_size,
                             interval_s=s.sweep_interval_s, stop=stop, metrics=metrics,
                             timing=timing, where=self.selection.query,
                             learn=self.follower.meta.learn)
        self.stream = StreamMode(
            db, self.follower, Checkpoints(db[s.checkpoint_collection], key), name=collection,
            owner=owner, faults=faults, metrics=metrics, timing=timing,
            request_sweep=self.sweeps.request, publish=self._publish_streamed,
            retry_pending=lambda: self.retries.pending, on_contact=self._contact,
            pulls=self.cycle)
        self.mode: str = "standby"
        self.last_active_mode: str | None = None
        self._drained = False
        self.once_pending: str | None = None  #: --once: what it still works on
        #: counts, backoff and progress; its failure lines are rate-limited
        self.outcomes = Outcomes(collection, retries=self.retries, metrics=metrics,
                                 health=health, timing=timing)

    @property
    def progress_at(self) -> float:
        """Last time this worker got anywhere (``--once`` gives up after once_timeout_s
        without): a server answer while standby, published entries or a completed sweep."""
        return self.outcomes.progress_at

    @property
    def last_error(self) -> str | None:
        return self.outcomes.last_error

    @property
    def stats(self) -> WorkerStats:
        c = self.outcomes.counts
        return WorkerStats(published=c.published, dead_lettered=c.dead_lettered, stale=c.stale,
                           sweeps=self.sweeps.count, stream_restarts=self.stream.restarts,
                           stream_invalidations=self.stream.invalidations,
                           backoffs=self.retries.count, activations=c.activations)

    # -- lifecycle ----------------------------------------------------------------------
    def _on_members(self, leases: PartitionLeases) -> None:
        """After a lease round's read: the effect types other live instances execute and
        this one does not (their entries wait here: dispatcher/effects/guard.py)."""
        assert self.fleet is not None
        missing = self.fleet.update(self.name, leases.member_effects, me=leases.owner,
                                    now=leases.now())
        self.metrics.effects_missing.labels(self.name).set(len(missing))

    async def run(self) -> None:
        """Wait for partitions, publish them, start over whenever the set changes … until
        stopped. Raises :class:`FatalStoreError` on a store error no retry can fix."""
        self._set_standby()
        # --once with nothing to publish claims nothing (issue 44: no lease round to lapse)
        idle = self._drained = self.once and await nothing_to_do(self.coll)
        if not idle:
            self.balancer.start()
        try:
            while not self.stop.is_set() and not self._drained:
                partitions = await self.balancer.wait_active()
                if partitions is None:
                    break
                self._select(partitions)
                if not await self._hold():
                    continue  # a store error while starting: backed off, try again
                self._select(())
                self._set_standby()
        finally:
            await self._shutdown(leases=not idle)

    def _select(self, partitions: frozenset[int] | tuple[()]) -> None:
        """Publish these partitions from now on (the stream, sweeps, retries and gauges
        select them). The resume token is kept only for the whole collection: a share of it
        starts its stream now (with the sweep that always accompanies a new stream)."""
        self.selection.set(partitions)
        self.stream.checkpoints.key = self.scope if self.selection.full else None

    async def _hold(self) -> bool:
        """Active while the partition set holds. ``False`` after a store error (backed
        off)."""
        try:
            await self._active()
        except LeaseLost:
            pass
        except PyMongoError as exc:  # e.g. the server went away while starting
            check_fatal(exc, self.name)
            self.outcomes.failed("store", exc)
            await pause(self.timing, self.retries.wait_s(), self.stop)
            return False
        finally:
            pull_error = await self._drain_pull()
            await self.stream.close()
            # Nothing of this set is being published any more: the surplus may go now.
            await self.balancer.handover()
            if pull_error is not None:
                check_fatal(pull_error, self.name)  # a fatal one ends the worker
        return True

    async def _drain_pull(self) -> PyMongoError | None:
        """Wait for the last ``$pull``. A failed one is logged (rate-limited) and counted
        (``aggbox_dispatcher_pull_failures_total``): its entries stay pending and are published
        again. The error is returned: a fatal one ends the worker after the clean-up."""
        try:
            await self.cycle.drain()
        except PyMongoError as exc:
            self.outcomes.pull_failed(exc)
            return exc
        return None

    def _set_standby(self) -> None:
        self.metrics.lease_active.labels(self.name).set(0)
        self.metrics.set_mode(self.name, "standby")
        self.mode = "standby"

    async def _note_once(self) -> None:
        """--once ended: a note for dispatch-status (dispatcher/leases/once.py)."""
        await note_once(self.db[self.settings.member_collection], database=self.db.name,
                        collection=self.name, instance=self.leases.instance,
                        now=self.leases.now(), published=self.outcomes.counts.published,
                        registry=self.metrics.registry)

    async def _shutdown(self, *, leases: bool = True) -> None:
        if self.once and self._drained:
            await self._note_once()
        await self.stream.close()
        if leases:  # (an idle --once took none)
            await self.balancer.close()
        self.metrics.lease_active.labels(self.name).set(0)
        self.health.beat(self.name, role="stopped")

    def _fence(self, doc: Mapping[str, Any]) -> str | None:
        return self.leases.fence(doc, self._fence_scope)

    def _contact(self) -> None:
        self.health.contact(self.name)
        if self.mode == "standby":  # a server answer is all the progress a standby makes
            self.outcomes.progress()

    def _keep_going(self) -> bool:
        if self.stop.is_set() or self._drained:
            return False
        self.balancer.check()  # a fatal error in a lease round
        b = self.balancer
        if b.release_wanted or b.active() != self.selection.partitions:
            raise LeaseLost()  # lost, gained or handing over partitions: start over
        return True

    # -- active: mode choice ------------------------------------------------------------
    async def _active(self) -> None:
        self.outcomes.counts.activations += 1
        self.metrics.lease_active.labels(self.name).set(1)
        self.health.beat(self.name, role="active")
        self.retries.reset()
        if self.once:
            await self._run_once()
            return
        mode = await self.stream.choose(self.settings.mode)
        self.mode = self.last_active_mode = mode
        self.metrics.set_mode(self.name, mode)
        self.health.beat(self.name, role="active", mode=mode)
        n = len(self.selection.partitions)
        log.info("%s: active (%s mode) on %s", self.name, mode,
                 "every partition" if self.selection.full else f"{n} partition(s)",
                 extra={"collection": self.name, "mode": mode, "partitions": n})
        # Due timers fire beside the outbox, for the same partitions (dispatcher/timers/firer.py).
        async with self.timers.firing(lambda: not self.stop.is_set()
                                      and self.balancer.active() == self.selection.partitions):
            if mode == "stream":
                await self._loop(self.stream.step)
                await self.stream.final_checkpoint(
                    sweep_pending=self.sweeps.reason is not None)
            else:
                self.sweeps.request(None)
                await self._loop(self._poll_step)

    async def _loop(self, step: Callable[[], Awaitable[bool]]) -> None:
        while self._keep_going():
            self.health.beat(self.name)
            if await self._guarded(self._pending):
                continue
            await self._guarded(step)

    async def _guarded(self, step: Callable[[], Awaitable[bool]]) -> bool:
        """Run one step of a loop; store/broker failures back off instead of ending the
        worker (fatal store errors do end it). Returns what the step returned (``True``: it
        did something)."""
        try:
            return bool(await step())
        except (LeaseLost, asyncio.CancelledError, FatalStoreError):
            raise
        except PyMongoError as exc:
            check_fatal(exc, self.name)
            self.outcomes.failed("store", exc)
        except Exception as exc:
            log.exception("%s: unexpected error: %s", self.name, exc,
                          extra={"collection": self.name})
            self.outcomes.failed("error", exc)
        return True

    async def _publish(self, docs: list[Mapping[str, Any]]) -> None:
        self.outcomes.absorb(await self.cycle.run(docs))

    async def _publish_streamed(self, docs: list[Mapping[str, Any]]) -> None:
        """Stream mode: the batch's ``$pull`` runs on while the next batch is read (stream
        mode waits for it before it publishes again or saves the checkpoint)."""
        self.outcomes.absorb(await self.cycle.run(docs, wait=False))

    # -- what to do before reading anything new -----------------------------------------
    async def _pending(self) -> bool:
        """Backoff waits, retries, dirty documents and due sweeps. ``True`` if it did
        anything (the caller loops again before reading new changes)."""
        wait = self.retries.wait_s()
        if wait > 0:
            await pause(self.timing, wait, self.stop)
            return True
        for keys in (self.retries.take(), self.inflight.take_dirty()):
            if keys:
                await self._run_keys_or_keep(keys)
                return True
        if self.sweeps.due(periodic=self.mode == "stream"):
            if await self.sweeps.run(self.outcomes.absorb, self._contact):
                self.outcomes.progress()
            return True
        return False

    async def _run_keys_or_keep(self, keys: list[Any]) -> None:
        """Run these documents again; if that fails, keep them for the next attempt instead
        of leaving them to the periodic sweep (and never checkpoint past them)."""
        try:
            # on _id alone (any server answers it from the _id index; mongo-java-server uses
            # an index only for a filter of exactly its keys): the pending outbox and the
            # partition are checked here
            docs = await self.follower.fetch(keys)
            self._contact()
            await self._publish(docs)
        except BaseException:
            self.retries.keep(keys)
            raise

    # -- polling and once ---------------------------------------------------------------
    async def _poll_step(self) -> bool:
        await poll(self.read_coll, self.cycle, self.settings, self.stop, self.metrics,
                   self.timing, self.selection.query(), self.follower.meta.learn,
                   self._contact, self.outcomes.absorb)
        return True

    async def _run_once(self) -> None:
        """Sweep until a complete sweep finds nothing left to do, then fire due timers until
        none is left (failures retried as the outbox's: the watchdog ends a stuck run), until
        every partition is held and published (:meth:`Balancer.complete`)."""
        self.mode, self.once_pending = "once", "entries still pending"
        self.health.beat(self.name, role="active", mode="once")
        self.sweeps.request("once")
        while self._keep_going():
            self.health.beat(self.name)
            if self.sweeps.reason is None:
                last = self.sweeps.last
                if last is not None and not (last.published or last.dead_lettered):
                    self.once_pending = "due timers still pending"
                    if not await self.timers.fire_all_due(
                            self._keep_going, on_progress=self.outcomes.progress,
                            stop=self.stop):
                        raise LeaseLost()  # start over once the partitions are held again
                    if self.balancer.complete(self.selection.partitions):
                        self._drained, self.once_pending = not self.stop.is_set(), None
                        break
                    self.once_pending = "partitions no instance publishes yet"  # claimed in
                    await self.balancer.next_round()  # the next rounds: LeaseLost, start over
                    self.outcomes.progress()  # the store answered a lease round
                    continue
                self.sweeps.request("once")
            await self._guarded(self._pending)

    async def measure_backlog(self) -> Mapping[str, Any]:
        """Pending entries, documents and the oldest entry's age, into the gauges."""
        out = await measure_backlog(self.coll, self.metrics, self.name,
                                    where=self.selection.query())
        self._contact()
        return out
