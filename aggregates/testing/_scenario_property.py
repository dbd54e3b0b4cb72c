"""Prove handlers safe under at-least-once delivery: :func:`check_fault_tolerance` runs a
scenario once undisturbed, then many times under random faults (drawn by hypothesis, which
shrinks a failure to the fewest faults), and checks every run ends in the same states."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from aggregates.core.errors import AggboxError, ConfigurationError
from aggregates.domain.aggregate import Registry
from aggregates.domain.effects import Effects
from aggregates.testing._blame import effect_blame, first_difference
from aggregates.testing._scenario_faults import (
    DELIVERY_FAULTS,
    EFFECT_FAULTS,
    FaultKind,
    RandomFaults,
)
from aggregates.testing.scenario import Scenario

__all__ = ["FaultToleranceError", "check_fault_tolerance"]


class FaultToleranceError(AggboxError):
    """Under some faults the flow ended differently than undisturbed (or failed): the
    message names the faults, the aggregates whose states differ, and the timeline."""


def check_fault_tolerance(
    flow: Callable[[Scenario], object], registry: Registry, *,
    effects: Effects | None = None,
    faults: Collection[FaultKind] = DELIVERY_FAULTS + EFFECT_FAULTS,
    max_faults: int = 5, max_examples: int = 25, derandomize: bool = True,
    **scenario_options: Any,
) -> None:
    """Run ``flow`` (a function that drives a fresh :class:`Scenario`: ``given``/``when``,
    fakes, listeners) undisturbed, then ``max_examples`` times with up to ``max_faults``
    random faults of the kinds ``faults``; raise :class:`FaultToleranceError` if a run's
    final states differ from the undisturbed run's, or a run fails (a handler found not
    deterministic, a flow that does not settle). ``derandomize``: the same runs every time
    (reproducible in CI); ``False`` explores new ones. Other options go to
    :class:`Scenario` (``with_store`` is refused: each run needs a fresh store).

    Leave ``reorder`` out of ``faults`` when the scenario's outcome legitimately depends on
    the order across aggregates (two orders competing for the same credit)."""
    try:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st
        from hypothesis.errors import Flaky
    except ImportError as exc:  # a development dependency
        raise ConfigurationError("check_fault_tolerance() needs hypothesis: "
                                 "pip install hypothesis") from exc
    if "with_store" in scenario_options:
        raise ConfigurationError("check_fault_tolerance() runs in memory (every run needs a "
                                 "fresh store); drop with_store=")
    unknown = set(faults) - set(DELIVERY_FAULTS + EFFECT_FAULTS)
    if unknown:
        raise ConfigurationError(f"check_fault_tolerance(faults=...): unknown {sorted(unknown)}; "
                                 f"use {', '.join(DELIVERY_FAULTS + EFFECT_FAULTS)}")

    def run(source: RandomFaults | None) -> Scenario:
        sc = Scenario(registry, effects=effects, faults=source or (), **scenario_options)
        flow(sc)
        return sc

    try:
        baseline = run(None)
    except AggboxError as exc:
        raise FaultToleranceError(f"the undisturbed run failed: {type(exc).__name__}: {exc}"
                                  ) from exc
    expected = baseline.states()

    @settings(max_examples=max_examples, deadline=None, database=None,
              derandomize=derandomize, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def disturbed(data: Any) -> None:
        source = RandomFaults(lambda options: data.draw(st.sampled_from(options)),
                              kinds=faults, budget=max_faults)
        try:
            sc = run(source)
        except AggboxError as exc:
            raise FaultToleranceError(
                f"under faults {_faults(source)} the flow failed: {type(exc).__name__}: "
                f"{exc}") from exc
        got = sc.states()
        if got != expected:
            # An effect that answered the same call differently is to blame, not a handler.
            why = effect_blame((baseline.effect_calls, baseline.timeline),
                               (sc.effect_calls, sc.timeline)) or (
                "a handler is not safe under at-least-once delivery" if source.injected
                else "even without faults: a handler is not deterministic (does it read "
                "the clock, random numbers or global state? use msg.occurred_at, or "
                "derive values from the message)")
            raise FaultToleranceError(
                f"under faults {_faults(source)} the final states differ from the "
                f"undisturbed run's — {why}:\n"
                f"{_diff(expected, got)}\n\ntimeline under faults:\n{sc.timeline}")

    try:
        disturbed()
    except Flaky as exc:  # the same faults gave different runs
        raise FaultToleranceError(
            "the same faults gave different results in two runs: a handler is not "
            "deterministic (does it read the clock, random numbers or global state? use "
            f"msg.occurred_at, or derive values from the message) — {exc}") from exc


def _faults(source: RandomFaults) -> str:
    return ", ".join(f"{k} at {t}" for k, t in source.injected) or "(none)"


def _diff(want: dict[tuple[str, str], Any], got: dict[tuple[str, str], Any]) -> str:
    lines = []
    for key in sorted(set(want) | set(got)):
        a, b = want.get(key, "(absent)"), got.get(key, "(absent)")
        if a != b:
            if key in want and key in got:  # the first field that differs, then both states
                lines.append(f"  {key[0]}/{key[1]} first differs at " + first_difference(
                    a, b, "state", ("undisturbed", "under faults")))
            lines.append(f"  {key[0]}/{key[1]}: undisturbed {a!r}\n"
                         f"  {' ' * len(key[0] + key[1])}   under faults {b!r}")
    return "\n".join(lines)
