"""Prove handlers safe under at-least-once delivery: :func:`check_fault_tolerance` runs a
scenario once undisturbed (counting its fault points), then sweeps — one fault kind at every
point, a run each (:mod:`aggregates.testing._scenario_sweeps`) — then random runs that
combine faults (:mod:`aggregates.testing._scenario_plan`), and checks that every run ends in
the same states with no effect doing its work more often
(:mod:`aggregates.testing._scenario_verdict`). A failure is narrowed to the fewest faults
and told as :mod:`aggregates.testing._scenario_report` says."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from aggregates.core.errors import AggboxError, ConfigurationError
from aggregates.domain.aggregate import Registry
from aggregates.domain.effects import Effects
from aggregates.testing._numbering import numbered_run
from aggregates.testing._scenario_engine import STEPS_BASE
from aggregates.testing._scenario_faults import DELIVERY_FAULTS, EFFECT_FAULTS, FaultKind
from aggregates.testing._scenario_plan import (
    Coverage,
    PlannedFault,
    PlannedFaults,
    PointCounter,
    applicable,
    unique,
)
from aggregates.testing._scenario_report import (
    FaultToleranceError,
    FaultToleranceReport,
    failure,
)
from aggregates.testing._scenario_seeds import check_hash_seeds
from aggregates.testing._scenario_sweeps import SWEEPS, narrow, sweep_plan, wanted
from aggregates.testing._scenario_verdict import Problem, judge, resource_calls
from aggregates.testing.scenario import Scenario

__all__ = ["FaultToleranceError", "FaultToleranceReport", "check_fault_tolerance"]

log = logging.getLogger("aggregates.testing")

Attempt = Callable[[Sequence[PlannedFault]], tuple[PlannedFaults, Problem | None]]


def check_fault_tolerance(
    flow: Callable[[Scenario], object], registry: Registry, *,
    effects: Effects | None = None,
    faults: Collection[FaultKind] = DELIVERY_FAULTS + EFFECT_FAULTS,
    max_faults: int = 6, max_examples: int = 6, derandomize: bool = True,
    at_least_once: Collection[str] = (), hash_seeds: bool = False,
    timeline_file: str | os.PathLike[str] | None = None,
    **scenario_options: Any,
) -> FaultToleranceReport:
    """Run ``flow`` (a function that drives a fresh :class:`Scenario`: ``given``/``when``,
    fakes, listeners; the copies of ``late`` faults come after it) undisturbed, then the
    sweeps — one run each with ``duplicate``, ``late``, ``effect_lost`` and ``swap`` at every
    point where it can happen (those of ``faults``) — then ``max_examples`` random runs with
    1 to ``max_faults`` faults of the kinds ``faults``, each at a point drawn stratum first
    (a message type delivered, a timer fired, a reply, an effect type called), then which of
    its points. Raise :class:`FaultToleranceError` if a run's final states differ from the
    undisturbed run's, a run fails (a handler found not deterministic, a flow that does not
    settle), or an effect not declared ``idempotent=True`` did its work (a call answered,
    even if the answer was lost) more often for one entry than undisturbed — list in
    ``at_least_once`` the effect types for which doing it twice is harmless. The error names
    the fewest faults that still fail, about 40 lines of timeline around them, and keeps the
    failing run's whole timeline (``err.timeline``; also written to ``timeline_file`` if
    given). ``hash_seeds=True`` also runs the flow undisturbed in three subprocesses with
    other ``PYTHONHASHSEED`` s (``flow``, ``registry`` and ``effects`` must be module-level
    names) to find handlers that follow the iteration order of a ``set`` of strings.
    ``derandomize``: the same runs every time (reproducible in CI); ``False`` explores new
    ones. Other options go to :class:`Scenario` (``with_store`` is refused: each run needs
    a fresh store). Each run builds its messages afresh: :func:`message` numbers ids and
    times from 1 in every run. Returns a :class:`FaultToleranceReport`.

    Leave ``reorder`` and ``swap`` out of ``faults`` when the scenario's outcome
    legitimately depends on the order of messages from different senders (two orders
    competing for the same credit)."""
    try:
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import strategies as st
        from hypothesis.errors import Flaky
    except ImportError as exc:  # a development dependency
        raise ConfigurationError("check_fault_tolerance() needs hypothesis: "
                                 "pip install hypothesis") from exc
    _validate(faults, max_faults, scenario_options)

    def run(source: PlannedFaults | PointCounter, *, floor: int = 0
            ) -> tuple[Scenario, AggboxError | None]:
        options = dict(scenario_options)
        if floor:  # runs under faults: their handlings were checked undisturbed
            options["check_determinism"] = False
        sc = Scenario(registry, effects=effects, faults=source, **options)
        sc._steps_floor = floor
        try:
            with numbered_run():
                flow(sc)
            sc.deliver_late()
        except AggboxError as exc:
            return sc, exc
        return sc, None

    counter = PointCounter()
    baseline, err = run(counter)
    if err is not None:
        raise FaultToleranceError(f"the undisturbed run failed: {type(err).__name__}: {err}"
                                  ) from err
    expected = baseline.states()
    if hash_seeds:
        check_hash_seeds(flow, registry, effects, scenario_options, expected,
                         FaultToleranceError)
    calls = resource_calls(baseline, effects, at_least_once)
    strata = [s for s in counter.counts if applicable(s, faults)]
    coverage = Coverage({s: counter.counts[s] for s in strata})
    floor = 4 * baseline.peak_steps + STEPS_BASE  # what faults may add to a call's steps

    def attempt(plan: Sequence[PlannedFault]) -> tuple[PlannedFaults, Problem | None]:
        source = PlannedFaults(plan)
        sc, exc = run(source, floor=floor)
        if exc is not None:
            return source, Problem(f"the flow failed: {type(exc).__name__}: {exc}",
                                   timeline=sc.timeline)
        return source, judge(expected, calls, sc, effects, at_least_once,
                             faulted=bool(source.injected), base=baseline)

    def fail(plan: Sequence[PlannedFault], found_by: str) -> FaultToleranceError:
        source, problem = attempt(plan)
        if problem is None:  # cannot happen for a deterministic flow; say what was seen
            problem = Problem("a run under these faults failed once and passed when run "
                              "again: the flow is not deterministic")
        return failure(problem, source.injected, coverage, found_by=found_by,
                       timeline_file=timeline_file)

    runs = [0]  # runs under faults so far

    def fails(plan: Sequence[PlannedFault]) -> bool:
        runs[0] += 1
        return attempt(plan)[1] is not None

    sweeps: list[tuple[str, int]] = []
    for sweep in wanted(SWEEPS, faults):
        plan = sweep_plan(sweep, counter.order)
        if not plan:
            continue
        source, problem = attempt(plan)
        coverage.add(source.injected)
        sweeps.append((sweep.kind, len(plan)))
        if problem is None:
            continue
        if fails([]):
            raise fail([], "two runs without faults (after a failing sweep)")
        before = runs[0]
        fewest = narrow(plan, fails)
        raise fail(fewest, f"the sweep '{sweep.what}' ({len(plan)} points, 1 run), narrowed "
                           f"in {runs[0] - before} runs")

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

    random_runs = [0]

    @settings(max_examples=max_examples, deadline=None, database=None,
              derandomize=derandomize, suppress_health_check=list(HealthCheck),
              report_multiple_bugs=False, phases=[Phase.generate])
    @given(st.lists(st.integers(0, 2**63 - 1).map(one_fault), min_size=1,
                    max_size=max_faults, unique_by=lambda f: f.where))
    def disturbed(plan: list[PlannedFault]) -> None:
        source, problem = attempt(plan)
        coverage.add(source.injected)
        random_runs[0] += 1
        if problem is not None:
            raise Found(plan)

    if strata and max_examples > 0:
        try:
            disturbed()
        except Found as found:
            fewest = _fewest(unique(found.plan), faults, attempt)
            raise fail(fewest, f"random runs ({random_runs[0]}), then shrunk") from None
        except Flaky as exc:  # the same faults gave different runs
            raise FaultToleranceError(
                f"the same faults gave different results in two runs: the flow is not "
                f"deterministic — {exc}\n{coverage}", coverage=coverage) from exc
    report = FaultToleranceReport(coverage, sweeps, random_runs[0])
    log.info("%s", report)
    return report


def _validate(faults: Collection[FaultKind], max_faults: int,
              scenario_options: dict[str, Any]) -> None:
    if "with_store" in scenario_options:
        raise ConfigurationError("check_fault_tolerance() runs in memory (every run needs a "
                                 "fresh store); drop with_store=")
    unknown = set(faults) - set(DELIVERY_FAULTS + EFFECT_FAULTS)
    if unknown:
        raise ConfigurationError(f"check_fault_tolerance(faults=...): unknown {sorted(unknown)}; "
                                 f"use {', '.join(DELIVERY_FAULTS + EFFECT_FAULTS)}")
    if max_faults < 1:
        raise ConfigurationError(f"check_fault_tolerance(max_faults={max_faults}): use ≥ 1")


def _fewest(plan: list[PlannedFault], kinds: Collection[FaultKind], attempt: Attempt
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
