"""What a collection worker (:mod:`dispatcher.worker`) makes of each cycle's result and of
each failure: the counts, the backoff (:class:`~dispatcher.outbox.retries.Retries`), the metrics,
the health entry, one rate-limited line per failure, and when it last got anywhere
(``progress_at``, what ``--once`` watches)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pymongo.errors import PyMongoError

from dispatcher.core.errors import RateLimitedLog, describe_store_error, one_line
from dispatcher.core.timing import Timing
from dispatcher.observe.metrics import Health, Metrics
from dispatcher.outbox.results import CycleResult
from dispatcher.outbox.retries import Retries

__all__ = ["LeaseLost", "Outcomes", "WorkerStats"]

log = logging.getLogger("aggbox.dispatcher")


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


class LeaseLost(Exception):
    """Partitions were lost, gained or are being handed over: the worker starts over."""


class Outcomes:
    """One worker's results and failures."""

    def __init__(self, name: str, *, retries: Retries, metrics: Metrics, health: Health,
                 timing: Timing) -> None:
        self.name = name
        self.retries, self.metrics, self.health, self.timing = retries, metrics, health, timing
        self.counts = WorkerStats()
        #: last time the worker got anywhere (``--once`` gives up after once_timeout_s
        #: without): a server answer while standby, published entries or a completed sweep
        self.progress_at = timing.monotonic()
        self.last_error: str | None = None
        #: retried failures: one line each, at most one per minute per cause
        self.warn = RateLimitedLog(log, every_s=60.0, collection=name, clock=timing.monotonic)

    def failure_summary(self) -> str:
        """The last error, shortened to one line (for ``--once`` giving up)."""
        if not self.last_error or not self.last_error.strip():
            return "no error reported"
        return "last error: " + one_line(self.last_error, limit=200)

    def progress(self) -> None:
        self.progress_at = self.timing.monotonic()

    def failed(self, cause: str, exc: BaseException) -> None:
        """A step failed (``cause``: ``store`` or ``error``): back off."""
        delay = self.retries.failed()
        self.metrics.backoffs.labels(self.name, cause).inc()
        self.health.beat(self.name)
        text = describe_store_error(exc) if cause == "store" else one_line(exc)
        self.last_error = self.health.workers[self.name].error = text
        self.warn.warning(cause, "%s: %s failure (%s); retrying in %.2fs", self.name, cause,
                          text, delay, exc=exc, extra={"cause": cause})

    def timers_failed(self, exc: Exception) -> None:
        """A round of the timer firer failed. It tries again by itself a second later, so
        the outbox side does not back off for it; counted and logged (rate-limited)."""
        self.metrics.backoffs.labels(self.name, "timers").inc()
        text = describe_store_error(exc) if isinstance(exc, PyMongoError) else one_line(exc)
        self.last_error = self.health.workers[self.name].error = text
        self.warn.warning("timers", "%s: firing due timers failed (%s); trying again in a "
                          "second", self.name, text, exc=exc, extra={"cause": "timers"})

    def pull_failed(self, exc: PyMongoError) -> None:
        """The last ``$pull`` failed as the worker stopped publishing: its entries stay
        pending and are published again (``aggbox_dispatcher_pull_failures_total``)."""
        self.metrics.pull_failures.labels(self.name).inc()
        self.warn.warning("pull", "%s: removing published entries from the outbox failed "
                          "(%s); they stay pending and are published again", self.name,
                          describe_store_error(exc), exc=exc, extra={"cause": "pull"})

    def absorb(self, res: CycleResult) -> None:
        """Count a cycle's result; keep its failed documents for a retry after backoff.
        Raises :class:`LeaseLost` when the cycle found the lease gone."""
        c = self.counts
        c.published += res.published
        c.dead_lettered += res.dead_lettered
        c.stale += res.stale
        if res.retry:
            self.retries.keep(res.retry)
            delay = self.retries.failed()
            self.metrics.backoffs.labels(self.name, "broker").inc()
            self.last_error = f"publishing failed: {res.retry_error}"
            self.warn.warning("broker", "%s: publishing failed (%s); %d document(s) kept "
                              "pending, retry in %.2fs", self.name,
                              one_line(res.retry_error or "no error text"), len(res.retry),
                              delay, extra={"cause": "broker"})
        elif res.published or res.dead_lettered:
            self.warn.reset()  # the next failure is news again
            self.progress()
            self.retries.succeeded()
            if self.name in self.health.workers:
                self.health.workers[self.name].error = None
        if res.lease_lost:
            raise LeaseLost()
