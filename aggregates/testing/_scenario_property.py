"""Prove handlers safe under at-least-once delivery: :func:`check_fault_tolerance` runs a
scenario once undisturbed (counting its fault points), then many times under faults placed
by hypothesis over every kind of point (:mod:`aggregates.testing._scenario_plan`), and
checks every run ends in the same states; a failure is shrunk to the fewest faults."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aggregates.core.errors import AggboxError, ConfigurationError
from aggregates.core.samevalue import same_value
from aggregates.domain.aggregate import Registry
from aggregates.domain.effects import Effects
from aggregates.testing._blame import effect_blame, first_difference
from aggregates.testing._scenario_faults import DELIVERY_FAULTS, EFFECT_FAULTS, FaultKind
from aggregates.testing._scenario_plan import (
    Coverage,
    PlannedFault,
    PlannedFaults,
    PointCounter,
    applicable,
    unique,
)
from aggregates.testing._scenario_seeds import check_hash_seeds
from aggregates.testing.scenario import Scenario

__all__ = ["FaultToleranceError", "FaultToleranceReport", "check_fault_tolerance"]

log = logging.getLogger("aggregates.testing")

_NOT_DETERMINISTIC = ("a handler is not deterministic (does it read the clock, random "
                      "numbers, uuid4 or global state, or change its state in place? use "
                      "msg.occurred_at, derive values from the message, return a new state)")


class FaultToleranceError(AggboxError):
    """Under some faults the flow ended differently than undisturbed (or failed): the
    message names the fewest faults that do it, the aggregates whose states differ, the
    coverage and the timeline. :attr:`faults`: those faults; :attr:`coverage`: where the
    runs put their faults."""

    def __init__(self, message: str, *, faults: Sequence[PlannedFault] = (),
                 coverage: Coverage | None = None) -> None:
        super().__init__(message)
        self.faults = list(faults)
        self.coverage = coverage


@dataclass(frozen=True, slots=True)
class FaultToleranceReport:
    """What a passing :func:`check_fault_tolerance` tried: ``coverage`` (``str()`` of it is
    the coverage line, also logged at INFO on the ``aggregates.testing`` logger)."""

    coverage: Coverage

    def __str__(self) -> str:
        return f"fault tolerance: no run differed; {self.coverage}"


def check_fault_tolerance(
    flow: Callable[[Scenario], object], registry: Registry, *,
    effects: Effects | None = None,
    faults: Collection[FaultKind] = DELIVERY_FAULTS + EFFECT_FAULTS,
    max_faults: int = 6, max_examples: int = 30, derandomize: bool = True,
    at_least_once: Collection[str] = (), hash_seeds: bool = False,
    **scenario_options: Any,
) -> FaultToleranceReport:
    """Run ``flow`` (a function that drives a fresh :class:`Scenario`: ``given``/``when``,
    fakes, listeners) undisturbed, then ``max_examples`` times with 1 to ``max_faults``
    faults of the kinds ``faults``, each at a point drawn stratum first (a message type
    delivered, or an effect type called; uniformly), then which of its points. Raise
    :class:`FaultToleranceError` if a run's final states differ from the undisturbed
    run's, a run fails (a handler found not deterministic, a flow that does not settle), or
    an effect without a query function and not ``idempotent=True`` reached its resource
    more often than undisturbed (list in ``at_least_once`` the effect types for which doing
    it twice is harmless). The error names the fewest faults that still fail.
    ``hash_seeds=True`` also runs the flow undisturbed in three subprocesses with other
    ``PYTHONHASHSEED`` s (``flow``, ``registry`` and ``effects`` must be module-level names)
    to find handlers that follow the iteration order of a ``set`` of strings.
    ``derandomize``: the same runs every time (reproducible in CI); ``False`` explores new
    ones. Other options go to :class:`Scenario` (``with_store`` is refused: each run needs
    a fresh store). Returns a :class:`FaultToleranceReport` (its coverage line).

    Leave ``reorder`` out of ``faults`` when the scenario's outcome legitimately depends on
    the order across aggregates (two orders competing for the same credit)."""
    try:
        from hypothesis import HealthCheck, Phase, given, settings
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
    if max_faults < 1:
        raise ConfigurationError(f"check_fault_tolerance(max_faults={max_faults}): use ≥ 1")

    def run(source: PlannedFaults | PointCounter) -> Scenario:
        sc = Scenario(registry, effects=effects, faults=source, **scenario_options)
        flow(sc)
        return sc

    counter = PointCounter()
    try:
        baseline = run(counter)
    except AggboxError as exc:
        raise FaultToleranceError(f"the undisturbed run failed: {type(exc).__name__}: {exc}"
                                  ) from exc
    expected = baseline.states()
    if hash_seeds:
        check_hash_seeds(flow, registry, effects, scenario_options, expected,
                         FaultToleranceError)
    calls = _resource_calls(baseline, effects, at_least_once)
    strata = [s for s in counter.counts if applicable(s, faults)]
    coverage = Coverage({s: counter.counts[s] for s in strata})

    def attempt(plan: Sequence[PlannedFault]) -> tuple[PlannedFaults, str | None]:
        source = PlannedFaults(plan)
        try:
            sc = run(source)
        except AggboxError as exc:
            return source, f"the flow failed: {type(exc).__name__}: {exc}"
        return source, _problem(expected, calls, sc, source, effects, at_least_once,
                                base=baseline)

    def one_fault(seed: int) -> PlannedFault:
        # hypothesis draws small integers more often; a seeded Random keeps every stratum,
        # every point of it and every fault kind equally likely (reproducible all the same)
        rnd = random.Random(seed)
        stratum = strata[rnd.randrange(len(strata))]
        return PlannedFault(stratum[0], stratum[1], rnd.randrange(coverage.points[stratum]),
                            rnd.choice(applicable(stratum, faults)))

    class Found(Exception):
        def __init__(self, plan: Sequence[PlannedFault]) -> None:
            super().__init__(", ".join(map(str, plan)))
            self.plan = plan

    @settings(max_examples=max_examples, deadline=None, database=None,
              derandomize=derandomize, suppress_health_check=list(HealthCheck),
              report_multiple_bugs=False, phases=[Phase.generate])
    @given(st.lists(st.integers(0, 2**63 - 1).map(one_fault), min_size=1,
                    max_size=max_faults, unique_by=lambda f: f.where))
    def disturbed(plan: list[PlannedFault]) -> None:
        source, problem = attempt(plan)
        coverage.add(source.injected)
        if problem is not None:
            raise Found(plan)

    failing: Sequence[PlannedFault] | None = None
    if strata:
        try:
            disturbed()
        except Found as found:
            failing = found.plan
        except Flaky as exc:  # the same faults gave different runs
            raise FaultToleranceError(
                f"the same faults gave different results in two runs: {_NOT_DETERMINISTIC} — "
                f"{exc}\n{coverage}", coverage=coverage) from exc
    if failing is not None:
        fewest = _fewest(unique(failing), faults, attempt)
        source, problem = attempt(fewest)
        what, _, timeline = (problem or "").partition("\n\ntimeline under faults:\n")
        head = (f"under {len(source.injected)} fault{'s' * (len(source.injected) > 1)} — "
                f"{_named(source)} — " if source.injected else "in a run without faults: ")
        raise FaultToleranceError(
            f"{head}{what}\n{coverage}" + (f"\n\ntimeline:\n{timeline}" if timeline else ""),
            faults=source.injected, coverage=coverage)
    report = FaultToleranceReport(coverage)
    log.info("%s", report)
    return report


def _fewest(plan: list[PlannedFault], kinds: Collection[FaultKind],
            attempt: Callable[[Sequence[PlannedFault]], tuple[PlannedFaults, str | None]]
            ) -> list[PlannedFault]:
    """A smaller plan that still fails (greedy, a few runs per fault): the faults whose
    point came, less every fault it fails without, each moved to the first point of its
    stratum and to the first fault kind that applies there if it still fails so; none if
    an undisturbed run fails too."""
    def fails(p: Sequence[PlannedFault]) -> bool:
        return attempt(p)[1] is not None

    if fails([]):  # no fault needed: the runs themselves differ
        return []
    came = attempt(plan)[0].injected
    if came and came != plan and fails(came):
        plan = list(came)
    i = 0
    while i < len(plan) and len(plan) > 1:
        fewer = plan[:i] + plan[i + 1:]
        if fails(fewer):
            plan = fewer
        else:
            i += 1
    for i, fault in enumerate(list(plan)):
        first = applicable((fault.point, fault.type), kinds)[0]
        for change in ({"index": 0}, {"kind": first}):
            simpler, others = replace(plan[i], **change), plan[:i] + plan[i + 1:]
            if (simpler != plan[i] and all(f.where != simpler.where for f in others)
                    and fails([*plan[:i], simpler, *plan[i + 1:]])):
                plan = [*plan[:i], simpler, *plan[i + 1:]]
    return plan


def _named(source: PlannedFaults) -> str:
    return ", ".join(map(str, source.injected)) or "(none of the planned points came)"


def _problem(expected: dict[tuple[str, str], Any], calls: dict[str, int], sc: Scenario,
             source: PlannedFaults, effects: Effects | None,
             at_least_once: Collection[str], base: Scenario | None = None) -> str | None:
    got = sc.states()
    if not same_value(got, expected):  # a NaN in a state is the same NaN
        # An effect that answered the same call differently is to blame, not a handler.
        blame = None if base is None else effect_blame((base.effect_calls, base.timeline),
                                                       (sc.effect_calls, sc.timeline))
        why = blame or ("a handler is not safe under at-least-once delivery" if source.injected
                        else f"even without faults: {_NOT_DETERMINISTIC}")
        return (f"the final states differ from the undisturbed run's — {why}:\n"
                f"{_diff(expected, got)}\n\ntimeline under faults:\n{sc.timeline}")
    for key, n in _resource_calls(sc, effects, at_least_once).items():
        if n > calls.get(key, 0):
            rec = next(c for c in sc.effect_calls if c.call.idempotency_key == key)
            return (f"effect {rec.type!r} reached its resource {n} times for entry {key} "
                    f"(undisturbed: {calls.get(key, 0)}): it has no query function and is not "
                    "idempotent=True, so a lost answer does the work again (pays twice) — add "
                    "@effects.query, or make the resource honour call.idempotency_key and "
                    f"declare idempotent=True, or pass at_least_once=[{rec.type!r}] if doing "
                    f"it twice is harmless\n\ntimeline under faults:\n{sc.timeline}")
    return None


def _resource_calls(sc: Scenario, effects: Effects | None,
                    at_least_once: Collection[str]) -> dict[str, int]:
    """Calls that reached the resource, by entry, of the effects declared at-least-once
    (no query function, not idempotent) and not listed in ``at_least_once``."""
    counts: dict[str, int] = {}
    for rec in sc.effect_calls:
        if (rec.answer == "query" or effects is None or rec.type not in effects
                or rec.type in at_least_once
                or effects.get(rec.type).guarantee != "at-least-once"):
            continue
        counts[rec.call.idempotency_key] = counts.get(rec.call.idempotency_key, 0) + 1
    return counts


def _diff(want: dict[tuple[str, str], Any], got: dict[tuple[str, str], Any]) -> str:
    lines = []
    for key in sorted(set(want) | set(got)):
        a, b = want.get(key, "(absent)"), got.get(key, "(absent)")
        if not same_value(a, b):
            if key in want and key in got:  # the first field that differs, then both states
                lines.append(f"  {key[0]}/{key[1]} first differs at " + first_difference(
                    a, b, "state", ("undisturbed", "under faults")))
            lines.append(f"  {key[0]}/{key[1]}: undisturbed {a!r}\n"
                         f"  {' ' * len(key[0] + key[1])}   under faults {b!r}")
    return "\n".join(lines)
