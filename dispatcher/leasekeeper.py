"""Waiting for a collection's lease (standby) and renewing it while active
(docs/design.md "The dispatcher", step 5; the lease itself is :mod:`dispatcher.lease`).

A store error while checking or renewing is logged and tried again at the next interval —
unless it is fatal (:func:`dispatcher.errors.check_fatal`), which ends the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pymongo.errors import PyMongoError

from dispatcher.errors import check_fatal
from dispatcher.lease import Lease
from dispatcher.metrics import Health
from dispatcher.timing import Timing, pause

__all__ = ["LeaseKeeper"]

log = logging.getLogger("aggbox.dispatcher")


class LeaseKeeper:
    def __init__(self, lease: Lease, *, name: str, interval_s: float, health: Health,
                 stop: asyncio.Event, timing: Timing,
                 on_contact: Callable[[], None], on_error: Callable[[str], None]) -> None:
        self.lease = lease
        self.name = name
        self.interval_s = interval_s
        self.health = health
        self.stop = stop
        self.timing = timing
        self._contact = on_contact
        self._error = on_error
        #: lease checks answered by the server (standby and renewals)
        self.checks = 0

    async def _acquire(self, what: str) -> bool | None:
        """One acquire/renew round trip: its answer, or ``None`` after a (non-fatal) error."""
        try:
            acquired = await self.lease.acquire()
        except PyMongoError as exc:
            check_fatal(exc, f"{self.name}: {what}")
            self._error(f"{type(exc).__name__}: {exc}")
            log.warning("%s: %s failed: %s", self.name, what, exc,
                        extra={"collection": self.name})
            return None
        self.checks += 1
        self._contact()
        return acquired

    async def wait(self) -> bool:
        """Until the lease is ours (``True``) or stop is requested (``False``)."""
        announced = False
        while not self.stop.is_set():
            if await self._acquire("lease check"):
                return True
            self.health.beat(self.name, role="standby", mode="standby")
            if not announced:
                log.info("%s: standby; lease held by %s", self.name, self.lease.holder,
                         extra={"collection": self.name, "holder": self.lease.holder})
                announced = True
            await pause(self.timing, self.interval_s, self.stop)
        return False

    async def renew(self) -> None:
        """Renew every interval until another instance took the lease over (returns; the
        lease no longer counts as held). Run as a task while active."""
        while True:
            await asyncio.sleep(self.interval_s)  # real time: the lease expires in real time
            acquired = await self._acquire("lease renewal")
            if acquired is False:
                log.warning("%s: lease taken over by %s", self.name, self.lease.holder,
                            extra={"collection": self.name})
                self.lease.forget()
                return
            if acquired is None:
                log.warning("%s: lease still valid for now: %s", self.name, self.lease.held,
                            extra={"collection": self.name})
