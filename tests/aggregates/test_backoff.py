"""aggregates.core.backoff: exponential ceiling, full jitter, injectable random source."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregates.core.backoff import Backoff, backoff_ceiling, backoff_delay


def test_ceiling_doubles_up_to_the_maximum() -> None:
    assert [backoff_ceiling(n, initial=200, maximum=1500) for n in range(5)] == [
        200, 400, 800, 1500, 1500]


def test_ceiling_of_a_huge_attempt_stays_finite() -> None:
    assert backoff_ceiling(10_000, initial=0.2, maximum=30.0) == 30.0


def test_delay_is_random_times_ceiling() -> None:
    assert backoff_delay(2, initial=100, maximum=10_000, random=lambda: 0.25) == 100.0
    assert backoff_delay(2, initial=100, maximum=10_000, random=lambda: 0.0) == 0.0


@given(st.integers(0, 200), st.floats(0, 1e4), st.floats(0, 1e6), st.floats(0, 1, exclude_max=True))
def test_delay_stays_in_the_full_jitter_interval(n: int, initial: float, maximum: float,
                                                 u: float) -> None:
    d = backoff_delay(n, initial=initial, maximum=maximum, random=lambda: u)
    assert 0.0 <= d <= backoff_ceiling(n, initial=initial, maximum=maximum) <= maximum


def test_delays_spread_over_the_whole_interval() -> None:
    rng = random.Random(7)
    draws = [backoff_delay(0, initial=1.0, maximum=1.0, random=rng.random) for _ in range(2000)]
    assert min(draws) < 0.05 and max(draws) > 0.95   # full jitter, not [d/2, d]
    assert 0.45 < sum(draws) / len(draws) < 0.55


def test_backoff_counts_failures_and_resets() -> None:
    b = Backoff(0.2, 1.0, random=lambda: 0.5)
    assert [b.next() for _ in range(4)] == [0.1, 0.2, 0.4, 0.5]
    assert b.attempt == 4
    b.reset()
    assert b.attempt == 0 and b.next() == 0.1


def test_default_random_source_is_used() -> None:
    b = Backoff(1.0, 1.0)
    assert all(0.0 <= b.next() < 1.0 for _ in range(50))


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_random_outside_unit_interval_is_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="random"):
        backoff_delay(0, initial=1, maximum=1, random=lambda: bad)


def test_negative_arguments_are_rejected() -> None:
    with pytest.raises(ValueError):
        backoff_ceiling(-1, initial=1, maximum=1)
    with pytest.raises(ValueError):
        Backoff(-1.0, 1.0)
