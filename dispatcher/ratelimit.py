"""Log lines that repeat while a condition lasts, at most once per period per kind.

A dispatcher that cannot reach its store, or whose lease rounds are too slow, would
otherwise write the same line every round for as long as it lasts. :class:`RateLimited`
logs the first line of a kind at once, then at most one per ``every_s`` seconds, saying how
many were left out meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["RateLimited"]


class RateLimited:
    """Rate-limited WARNING/ERROR lines of one logger, per kind (a short key)."""

    def __init__(self, logger: logging.Logger, *, every_s: float,
                 collection: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.every_s = every_s
        self.collection = collection
        self._clock = clock
        #: kind → (monotonic time logged last, lines left out since)
        self._last: dict[str, tuple[float, int]] = {}

    def warning(self, kind: str, msg: str, *args: Any) -> bool:
        return self._log(logging.WARNING, kind, msg, args)

    def error(self, kind: str, msg: str, *args: Any) -> bool:
        return self._log(logging.ERROR, kind, msg, args)

    def _log(self, level: int, kind: str, msg: str, args: tuple[Any, ...]) -> bool:
        """Log now or count it as left out; True when logged."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last[0] < self.every_s:
            self._last[kind] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            msg += f" ({last[1]} more like this in the last {now - last[0]:.0f} s)"
        self._last[kind] = (now, 0)
        extra = {"collection": self.collection} if self.collection is not None else None
        self.logger.log(level, msg, *args, extra=extra)
        return True

    def reset(self, kind: str) -> None:
        """The condition ended: the next line of this kind is logged at once."""
        self._last.pop(kind, None)
