"""The systematic part of :func:`~aggregates.testing.check_fault_tolerance` (pure): sweeps
that put one fault kind at *every* point of the flow in one run, and the bisection that
narrows a failing sweep to the points that matter.

A bug that one redelivery exposes — a handler wrong on a timer's third firing, on transfer
#431 of 450 — hides among thousands of points, where a random draw finds it only by luck. A
sweep tries them all at once: a handful of runs whatever the flow's length, one per sweep
that passes. When one fails, :func:`narrow` bisects its set of points — a run with the first
half, then (if that passes) with the second — down to the one point that fails on its own:
about ``log2(points)`` runs; faults that fail only together are kept together (each half is
narrowed with the other one applied), so the result is a smallest set that still fails."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from aggregates.testing._scenario_faults import FaultKind, FaultPoint, kinds_at
from aggregates.testing._scenario_plan import PlannedFault

__all__ = ["SWEEPS", "Sweep", "narrow", "sweep_plan"]

_DELIVERIES: tuple[FaultPoint, ...] = ("deliver", "timer", "reply")


@dataclass(frozen=True, slots=True)
class Sweep:
    """One fault ``kind`` at every point of the ``points`` kinds; ``what``: how the report
    says it."""

    kind: FaultKind
    what: str
    points: tuple[FaultPoint, ...] = _DELIVERIES


#: The sweeps, in the order they run (each only if its kind is among the check's faults).
SWEEPS: tuple[Sweep, ...] = (
    Sweep("duplicate", "every delivery (inputs, messages, timer firings, replies) delivered "
                       "twice at once"),
    Sweep("late", "every delivery redelivered after the rest of the flow"),
    Sweep("effect_lost", "every effect call's answer lost", ("effect",)),
    Sweep("swap", "every message swapped with the next one to its aggregate from another "
                  "sender", ("deliver", "timer")),
)


def sweep_plan(sweep: Sweep, order: Sequence[tuple[FaultPoint, str, int]]
               ) -> list[PlannedFault]:
    """The sweep's fault at every point of ``order`` (the undisturbed run's points, in the
    order it reached them) where it can happen."""
    return [PlannedFault(point, type, index, sweep.kind) for point, type, index in order
            if point in sweep.points and sweep.kind in kinds_at(point)]


def narrow(plan: Sequence[PlannedFault], fails: Callable[[Sequence[PlannedFault]], bool]
           ) -> list[PlannedFault]:
    """A smallest part of ``plan`` (which fails) that still fails, by bisection: the
    earliest single point when one fails alone (about ``log2(len(plan))`` runs of
    ``fails``)."""
    return _narrow([], list(plan), fails)


def _narrow(fixed: list[PlannedFault], candidates: list[PlannedFault],
            fails: Callable[[Sequence[PlannedFault]], bool]) -> list[PlannedFault]:
    """The least part of ``candidates`` that fails together with ``fixed`` (given that all
    of them do)."""
    if len(candidates) <= 1:
        return candidates
    half = len(candidates) // 2
    first, second = candidates[:half], candidates[half:]
    if fails(fixed + first):
        return _narrow(fixed, first, fails)
    if fails(fixed + second):
        return _narrow(fixed, second, fails)
    # neither half fails alone: some faults of each are needed
    needed_first = _narrow(fixed + second, first, fails)
    return needed_first + _narrow(fixed + needed_first, second, fails)


def wanted(sweeps: Sequence[Sweep], kinds: Collection[FaultKind]) -> list[Sweep]:
    """The sweeps whose kind is among ``kinds``."""
    return [s for s in sweeps if s.kind in set(kinds)]
