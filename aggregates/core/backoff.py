"""Exponential backoff with full jitter: the one implementation the writer and the dispatcher use.

Pure: no clock, no sleep, no I/O. The caller sleeps for the delay it gets back; the random
source is injectable so tests get exact numbers.

The delay before retry ``n`` (``n = 0`` for the first retry) is drawn uniformly from
``[0, ceiling(n))`` with ``ceiling(n) = min(maximum, initial · 2ⁿ)`` — "full jitter" in the
sense of the AWS Architecture Blog's "Exponential Backoff And Jitter": the ceiling doubles per
round up to ``maximum`` (the settings' ``backoff_max_ms`` / ``conflict_backoff_max_ms``), and
the spread over the whole interval keeps competing retriers from retrying in lock-step. The
values carry no unit: pass milliseconds, get milliseconds; pass seconds, get seconds.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

__all__ = ["Backoff", "backoff_ceiling", "backoff_delay"]

# 2**62 already exceeds every sensible ceiling; capping the exponent keeps the float finite.
_MAX_EXPONENT = 62


def backoff_ceiling(attempt: int, *, initial: float, maximum: float) -> float:
    """Upper bound of the delay before retry ``attempt`` (0-based): ``min(maximum, initial·2ⁿ)``."""
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    if initial < 0 or maximum < 0:
        raise ValueError(f"initial ({initial}) and maximum ({maximum}) must be >= 0")
    return float(min(maximum, initial * 2.0 ** min(attempt, _MAX_EXPONENT)))


def backoff_delay(
    attempt: int, *, initial: float, maximum: float, random: Callable[[], float]
) -> float:
    """The jittered delay before retry ``attempt``: ``random() · ceiling(attempt)``.

    ``random`` returns a float in ``[0, 1)`` (like :func:`random.random`)."""
    u = random()
    if not 0.0 <= u < 1.0:
        raise ValueError(f"random() must return a float in [0, 1), got {u!r}")
    return u * backoff_ceiling(attempt, initial=initial, maximum=maximum)


class Backoff:
    """Counts consecutive failures: :meth:`next` gives the next delay, :meth:`reset` starts over
    after a success."""

    def __init__(
        self, initial: float, maximum: float, *, random: Callable[[], float] | None = None
    ) -> None:
        backoff_ceiling(0, initial=initial, maximum=maximum)  # validates
        self.initial = initial
        self.maximum = maximum
        self.attempt = 0
        self._random = random if random is not None else _random.Random().random

    def next(self) -> float:
        """The delay before the next retry; each call counts one more failure."""
        d = backoff_delay(self.attempt, initial=self.initial, maximum=self.maximum,
                          random=self._random)
        self.attempt += 1
        return d

    def reset(self) -> None:
        self.attempt = 0
