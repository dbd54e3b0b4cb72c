"""One collection's share of partitions, kept and balanced while the worker runs
(docs/design.md "Scale-out: partitions and leases").

A round, every renewal interval (sooner while the share is not settled): heartbeat, renew
the leases this instance owns, read members and leases, apply :func:`dispatcher.leases.balance.plan`
— claim free partitions up to the quota, or ask the worker to stop publishing the surplus
and release it once stopped (:meth:`Balancer.handover`). The worker publishes
:meth:`Balancer.active` — the partitions held, past their takeover grace and not being
handed over — and restarts its stream and sweep whenever that set changes.

A store error in a round is logged and the round tried again at the next interval; the
leases then lapse by themselves (the worker stops publishing what it no longer holds). A
fatal one (:func:`dispatcher.core.errors.check_fatal`) ends the round loop, and the worker with
it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from pymongo.errors import PyMongoError

from aggregates.core.storeerrors import is_fatal
from dispatcher.core.errors import RateLimitedLog, check_fatal, describe_store_error
from dispatcher.core.timing import Timing
from dispatcher.leases.balance import plan
from dispatcher.leases.partlease import HeartbeatLapsed, PartitionLeases
from dispatcher.observe.metrics import Health, Metrics

__all__ = ["Balancer"]


log = logging.getLogger("aggbox.dispatcher")

#: A lease round slower than this fraction of the TTL is reported (a round that takes half
#: of it leaves the heartbeat no time to be renewed before it lapses).
SLOW_ROUND_FRACTION = 0.25

#: Round period while the share is not settled (partitions to claim that others still
#: hold, or a hand-over in progress), so joining instances get their share quickly.
_UNSETTLED_S = 0.5


class Balancer:
    def __init__(self, leases: PartitionLeases, *, name: str, interval_s: float,
                 health: Health, metrics: Metrics, stop: asyncio.Event, timing: Timing,
                 on_contact: Callable[[], None], on_error: Callable[[str], None],
                 published: Callable[[], int] = lambda: 0,
                 publishing: Callable[[], frozenset[int]] = frozenset,
                 on_members: Callable[[PartitionLeases], None] | None = None,
                 eager: bool = False) -> None:
        self.leases = leases
        #: claim in the first round when no other instance is live (--once)
        self.eager = eager
        #: called after each read of the members (the fleet's effect types)
        self._on_members = on_members
        self.name = name
        self.interval_s = interval_s
        self.health = health
        self.metrics = metrics
        self.stop = stop
        self.timing = timing
        self._contact = on_contact
        self._error = on_error
        self._published = published
        #: what the worker publishes right now (a surplus outside it is released at once)
        self._publishing = publishing
        #: partitions the worker must stop publishing before they are released
        self.release_wanted: frozenset[int] = frozenset()
        #: set after each round that changed something the worker should look at
        self.changed = asyncio.Event()
        self.rounds = 0
        #: partitions no live member held after the last round (nor claimed by it)
        self.unowned: frozenset[int] = frozenset()
        self.quota = 0
        self.members: tuple[str, ...] = ()
        self._settled = False
        self._task: asyncio.Task[None] | None = None
        #: monotonic time lease rounds began to be too slow or to fail (None: they are fine)
        self.trouble_since: float | None = None
        #: loop time of the last tick of :meth:`_tick`; the longest loop stall since the
        #: last round's report
        self._tick_at: float | None = None
        self._stall_s = 0.0
        self._stall_cause: str | None = None
        self._loud = RateLimitedLog(log, every_s=30.0, collection=name, clock=timing.monotonic)

    # -- what the worker reads ---------------------------------------------------------------
    def active(self) -> frozenset[int]:
        """Partitions to publish now."""
        return self.leases.publishable() - self.release_wanted

    def holds(self, partitions: frozenset[int]) -> bool:
        return self.leases.holds(partitions)

    def complete(self, publishing: frozenset[int]) -> bool:
        """Whether every partition is held by a live member and this instance publishes all
        it holds (``publishing``): ``--once`` ends only then. A partition nobody holds (a
        member that died before claiming still counts toward the quotas until its heartbeat
        expires) or one of ours still in its takeover grace would be left behind."""
        return (self.rounds > 0 and not self.unowned
                and frozenset(self.leases.held) <= publishing)

    async def next_round(self) -> None:
        """Until the next lease round has read the leases (or the rounds ended)."""
        n = self.rounds
        while (self.rounds == n and not self.stop.is_set() and self._task is not None
               and not self._task.done()):
            await asyncio.sleep(0.05)

    def check(self) -> None:
        """Raise the round loop's fatal error, if it ended with one."""
        task = self._task
        if task is not None and task.done() and not task.cancelled():
            exc = task.exception()
            if exc is not None:
                raise exc

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"balance-{self.name}")

    async def close(self) -> None:
        """Stop the rounds and leave: release every lease, remove the heartbeat."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        try:
            await self.leases.leave()
        except PyMongoError as exc:
            if is_fatal(exc):  # the error that ended the worker: reported once, by it
                return
            log.warning("%s: could not release the partition leases (%s); they expire by "
                        "themselves", self.name, describe_store_error(exc),
                        extra={"collection": self.name})
        self.metrics.partitions_owned.labels(self.name).set(0)

    async def wait_active(self) -> frozenset[int] | None:
        """Until there is something to publish (the set) or stop is requested (``None``).
        Pending hand-overs are done meanwhile (nothing is published here)."""
        announced = False
        while not self.stop.is_set():
            self.check()
            if self.release_wanted:
                await self.handover()
            active = self.active()
            if active:
                return active
            self.health.beat(self.name, role="standby", mode="standby")
            if not announced and self.rounds:
                log.info("%s: no partition to publish (quota %d among %d instance(s))",
                         self.name, self.quota, len(self.members),
                         extra={"collection": self.name})
                announced = True
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), self.interval_s)
        return None

    async def handover(self) -> None:
        """Release the partitions the last round asked for. Call only once nothing of them
        is being published (the worker left its active loop and drained)."""
        parts, self.release_wanted = self.release_wanted, frozenset()
        await self._release(parts)

    async def _release(self, parts: frozenset[int]) -> None:
        if not parts:
            return
        try:
            await self.leases.release(parts)
        except PyMongoError as exc:
            check_fatal(exc, f"{self.name}: lease release")
            log.warning("%s: releasing %d partition(s) failed (%s); they expire by themselves",
                        self.name, len(parts), exc, extra={"collection": self.name})
            self.leases.forget_some(parts)
            return
        self.metrics.handovers.labels(self.name, "released").inc(len(parts))
        self.metrics.partitions_owned.labels(self.name).set(len(self.leases.held))
        log.info("%s: handed over %d partition(s)", self.name, len(parts),
                 extra={"collection": self.name, "released": len(parts)})

    # -- rounds ------------------------------------------------------------------------------
    async def _tick(self) -> None:
        """Notes how late the event loop wakes it: a pause of the process shows as a gap."""
        tick = max(0.05, self.leases.ttl_s / 20)
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if self._tick_at is not None:
                self._stall_s = max(self._stall_s, now - self._tick_at - tick)
            self._tick_at = now
            await asyncio.sleep(tick)

    def _stalled_for(self) -> float:
        """The longest time the event loop did not run since the last round's report."""
        if self._tick_at is None:
            return 0.0
        late = asyncio.get_running_loop().time() - self._tick_at - max(
            0.05, self.leases.ttl_s / 20)
        return max(self._stall_s, late, 0.0)

    async def _run(self) -> None:
        ticker = asyncio.create_task(self._tick(), name=f"balance-tick-{self.name}")
        try:
            await self._rounds()
        finally:
            ticker.cancel()

    async def _rounds(self) -> None:
        while not self.stop.is_set():
            try:
                await self._watched_round()
            except PyMongoError as exc:
                check_fatal(exc, f"{self.name}: partition leases")
                self._error(describe_store_error(exc))
                self._loud.warning("failed", "%s: partition lease round failed: %s",
                                   self.name, describe_store_error(exc), exc=exc)
                self._trouble(True)
                self._settled = True  # back to the normal period: no tight retry loop
            await asyncio.sleep(self._next_delay())

    async def _watched_round(self) -> None:
        """A round, watched: one still running after a quarter of the TTL is trouble from
        its start on (so /healthz turns while a round hangs, not only after it ended)."""
        started = self.timing.monotonic()
        limit = self.leases.ttl_s * SLOW_ROUND_FRACTION
        task = asyncio.ensure_future(self.round())
        try:
            done, _ = await asyncio.wait({task}, timeout=limit)
            if not done:
                self._trouble(True, since=started)
            if not done and self._stalled_for() <= limit:  # else: this process stalled
                self._loud.warning("hanging", "%s: lease round still running after %.2f s "
                                   "(lease_ttl_s %.4g): the store answers slowly",
                                   self.name, self.timing.monotonic() - started,
                                   self.leases.ttl_s)
            await task
        finally:
            if not task.done():
                task.cancel()

    def _next_delay(self) -> float:
        delay = self.interval_s if self._settled else min(self.interval_s, _UNSETTLED_S)
        grace_end = self.leases.next_grace_end()
        if grace_end is not None:
            delay = min(delay, max(0.0, grace_end - self.timing.monotonic()) + 0.01)
        return delay

    async def round(self) -> None:
        """One round (public for tests)."""
        leases = self.leases
        before = self.active()
        started = self.timing.monotonic()
        await leases.ensure()
        lapsed = await leases.heartbeat(published=self._published())
        members, views = await leases.read()
        self._contact()
        if self._on_members is not None:
            self._on_members(leases)
        self.rounds += 1
        lost = leases.confirm(views)
        self._report_round(self.timing.monotonic() - started, lapsed)
        if lost and lapsed is None:
            self.metrics.handovers.labels(self.name, "lost").inc(len(lost))
            log.warning("%s: %d partition(s) taken over by others after our lease expired",
                        self.name, len(lost), extra={"collection": self.name})
        decided = plan(me=leases.owner, now=leases.now(), members=members, leases=views,
                       partitions=leases.partitions)
        self.quota, self.members = decided.quota, decided.members
        surplus = self.release_wanted | decided.release
        # What the worker does not publish (e.g. claimed, still in its grace) goes at once;
        # the rest once the worker stopped publishing it (handover).
        idle = surplus - self._publishing()
        self.release_wanted = surplus - idle
        await self._release(idle)
        # The first round only announces this instance: instances that start together see
        # each other in their second round (0.5 s later) and claim toward their fair
        # share, instead of the first one to finish a round claiming everything. A --once
        # run that finds itself alone claims at once (``eager``): the claims are
        # compare-and-set, an instance starting with it only costs a hand-over.
        alone = self.eager and decided.members == (leases.owner,)
        claim = decided.claim if self.rounds > 1 or alone else ()
        claimed = await leases.claim(claim, views) if claim else []
        now = leases.now()
        self.unowned = frozenset(p for p in range(leases.partitions)
                                 if p not in views or not views[p].live(now)) - {
            c.partition for c in claimed}
        for c in claimed:
            self.metrics.handovers.labels(self.name, f"claimed_{c.handover}").inc()
        if any(c.handover != "new" for c in claimed):
            log.info("%s: took over %d partition(s) (%s)", self.name,
                     sum(c.handover != "new" for c in claimed),
                     ", ".join(sorted({f"{c.handover} from {c.previous}" if c.previous
                                       else c.handover for c in claimed})),
                     extra={"collection": self.name})
        held = len(leases.held)
        self._settled = (self.rounds > 1 and held == decided.quota
                         and not self.release_wanted)
        self.metrics.partitions_owned.labels(self.name).set(held)
        if self.active() != before or self.release_wanted:
            self.changed.set()

    # -- lease health --------------------------------------------------------------------------
    def _report_round(self, took_s: float, lapsed: HeartbeatLapsed | None) -> None:
        """Round-trip figures, and loud words when the store is too slow for the leases:
        a round that takes a quarter of the TTL leaves no room for the next renewal."""
        leases, ttl = self.leases, self.leases.ttl_s
        self.metrics.lease_round_seconds.labels(self.name).observe(took_s)
        now = self.timing.monotonic()
        until = leases.lease_valid_until()
        slow = took_s > ttl * SLOW_ROUND_FRACTION
        stalled = self._stalled_for()
        # The event loop itself did not run (SIGSTOP, a VM or container pause, swapping):
        # the process is to blame for a slow round, not the store.
        cause = (f"this process did not run for {stalled:.1f} s (paused, suspended or "
                 "starved of CPU), the store is not to blame: check the host or raise "
                 "lease_ttl_s" if stalled > ttl * SLOW_ROUND_FRACTION else None)
        # the round after a stall is the one that finds the heartbeat lapsed
        cause, self._stall_cause = cause or (self._stall_cause if lapsed else None), cause
        if cause is not None and lapsed is None:
            self._loud.error("stalled", "%s: lease round took %.2f s; %s", self.name, took_s,
                             cause)
        elif lapsed is not None:
            self.metrics.lease_lapses.labels(self.name).inc()
            since = ("never renewed" if lapsed.since_last_s is None
                     else f"{lapsed.since_last_s:.1f} s since the last renewal")
            self._loud.error(
                "lapsed", "%s: heartbeat lapsed (%s, lease_ttl_s %.4g): %d partition(s) "
                "dropped, continuing as %s; %s", self.name, since, ttl, lapsed.held,
                lapsed.rejoined, cause or "lease rounds were too slow or failing: relieve "
                "the store or raise lease_ttl_s")
        elif until is not None and until <= now:
            self._loud.error(
                "expired", "%s: lease round took %.2f s, longer than the leases stay valid "
                "(%.2f s of lease_ttl_s %.4g): nothing is published until a round is quicker; "
                "relieve the store or raise lease_ttl_s", self.name, took_s,
                ttl * (1 - leases.margin), ttl)
        elif slow:
            self._loud.warning(
                "slow", "%s: lease round took %.2f s, over a quarter of lease_ttl_s (%.4g s); "
                "leases lapse when rounds near half of it: relieve the store or raise "
                "lease_ttl_s", self.name, took_s, ttl)
        trouble = lapsed is not None or slow or (until is not None and until <= now)
        self._trouble(trouble)
        self._stall_s = 0.0  # the next report looks at the stalls from here on

    def _trouble(self, trouble: bool, *, since: float | None = None) -> None:
        now = self.timing.monotonic()
        if trouble:
            if self.trouble_since is None:
                self.trouble_since = now if since is None else since
        elif self.trouble_since is not None:
            log.info("%s: lease rounds are quick again (%.1f s after trouble began)",
                     self.name, now - self.trouble_since, extra={"collection": self.name})
            self.trouble_since = None
        self.health.lease_trouble(self.name, self.trouble_since)
