"""When to try again: the backoff after failures and the documents kept for a retry.

One per collection worker. A failure (store error, publishing failed) schedules the next
attempt ``Backoff.next()`` seconds ahead (:mod:`aggregates.core.backoff`: exponential, full
jitter); progress resets the backoff. Documents whose publication failed retryably are kept
here and read again once the pause is over, before anything new.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aggregates.core.backoff import Backoff
from dispatcher.core.timing import Timing

__all__ = ["Retries"]


class Retries:
    def __init__(self, *, initial_s: float, max_s: float, timing: Timing) -> None:
        self.backoff = Backoff(initial_s, max_s, random=timing.random)
        self._monotonic = timing.monotonic
        self._keys: dict[Any, None] = {}  # insertion-ordered set
        self.retry_at = 0.0
        #: pauses scheduled so far (each failure counts one)
        self.count = 0

    def failed(self) -> float:
        """Count a failure: the next attempt waits the returned number of seconds."""
        delay = self.backoff.next()
        self.retry_at = self._monotonic() + delay
        self.count += 1
        return delay

    def succeeded(self) -> None:
        self.backoff.reset()

    def wait_s(self) -> float:
        """Seconds until the next attempt may start (0: now)."""
        return max(0.0, self.retry_at - self._monotonic())

    def keep(self, keys: Iterable[Any]) -> None:
        """Documents to read and publish again (order kept, no duplicates)."""
        for key in keys:
            self._keys.setdefault(key, None)

    def take(self) -> list[Any]:
        keys = list(self._keys)
        self._keys.clear()
        return keys

    @property
    def pending(self) -> bool:
        return bool(self._keys)

    def reset(self) -> None:
        """Start afresh (a worker becoming active)."""
        self._keys.clear()
        self.retry_at = 0.0
        self.backoff.reset()
