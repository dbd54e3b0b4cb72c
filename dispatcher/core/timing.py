"""Time as the dispatcher sees it: a monotonic clock, a sleep and a random source, injected.

Production uses :data:`REAL_TIME`. Tests pass a :class:`Timing` whose ``monotonic`` is a fake
clock advanced by its ``sleep`` (which records every pause), so backoff sequences, pacing and
sweep schedules are asserted exactly instead of by sleeping and counting.
"""

from __future__ import annotations

import asyncio
import contextlib
import random as _random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["REAL_TIME", "Timing", "pause"]


@dataclass(frozen=True, slots=True)
class Timing:
    #: seconds, monotonic (only differences matter)
    monotonic: Callable[[], float] = time.monotonic
    #: pause for so many seconds; ``None``: real time, woken early by the stop event
    sleep: Callable[[float], Awaitable[None]] | None = None
    #: floats in [0, 1) for the backoff's jitter
    random: Callable[[], float] = field(default_factory=lambda: _random.Random().random)


REAL_TIME = Timing()


async def pause(timing: Timing, seconds: float, stop: asyncio.Event | None = None) -> None:
    """Pause ``seconds`` (nothing when ``<= 0`` or already stopping). In real time the pause
    ends early when ``stop`` is set; an injected sleep is simply awaited."""
    if seconds <= 0 or (stop is not None and stop.is_set()):
        return
    if timing.sleep is not None:
        await timing.sleep(seconds)
        return
    if stop is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
