"""Where :func:`~aggregates.testing.check_fault_tolerance` puts its faults (pure).

An undisturbed run is counted first (:class:`PointCounter`): how many fault points of each
*stratum* — a point kind and a message type, ``("deliver", "CreditRequested")``,
``("timer", "MonthlyFee")``, ``("reply", "Paid")`` or ``("effect", "Pay")`` — the flow
passes, and their order (:attr:`PointCounter.order`, for the sweeps of
:mod:`aggregates.testing._scenario_sweeps`). A plan is then :class:`PlannedFault` s, each
naming its stratum, the index of the point within it and a fault kind that applies there;
:class:`PlannedFaults` injects them when a run reaches those points. A sweep plans one
kind at every point; a random plan draws the stratum first (uniformly) and the index
second, which spreads faults over every kind of point in proportion, whatever the flow's
length.

:class:`Coverage` says where the faults went (the report's coverage line)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from aggregates.testing._scenario_faults import FaultKind, FaultPoint, kinds_at

__all__ = ["Coverage", "PlannedFault", "PlannedFaults", "PointCounter", "Stratum",
           "applicable", "stratum_name"]

#: A kind of fault point: (``"deliver"`` or ``"effect"``, message or effect type).
Stratum = tuple[FaultPoint, str]


def applicable(stratum: Stratum, kinds: Iterable[FaultKind]) -> list[FaultKind]:
    """The fault kinds of ``kinds`` that can happen at a point of ``stratum``."""
    wanted = set(kinds)
    return [k for k in kinds_at(stratum[0]) if k in wanted]


def stratum_name(stratum: Stratum) -> str:
    """``CreditRequested``, ``timer MonthlyFee``, ``reply Paid``, ``effect Pay``."""
    return stratum[1] if stratum[0] == "deliver" else f"{stratum[0]} {stratum[1]}"


class PointCounter:
    """A fault source that injects nothing and counts the points of each stratum;
    :attr:`order` lists every point ``(point kind, type, index)`` in the order the run
    reached it."""

    def __init__(self) -> None:
        self.counts: dict[Stratum, int] = {}
        self.order: list[tuple[FaultPoint, str, int]] = []

    def pick(self, point: FaultPoint, message_type: str) -> FaultKind | None:
        key = (point, message_type)
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        self.order.append((point, message_type, n))
        return None


@dataclass(frozen=True, order=True, slots=True)
class PlannedFault:
    """The fault ``kind`` at the ``index``-th (from 0) point of ``point`` kind and
    ``type`` that a run reaches."""

    point: FaultPoint
    type: str
    index: int
    kind: FaultKind

    @property
    def where(self) -> tuple[FaultPoint, str, int]:
        return self.point, self.type, self.index

    def __str__(self) -> str:
        return f"{self.kind} at {stratum_name((self.point, self.type))} #{self.index + 1}"


class PlannedFaults:
    """Injects a plan's faults at their points (a :class:`FaultSource`); one fault per
    point, the first planned wins. :attr:`injected`: the faults whose point came."""

    def __init__(self, plan: Iterable[PlannedFault]) -> None:
        self.plan: dict[tuple[FaultPoint, str, int], PlannedFault] = {}
        for f in plan:
            self.plan.setdefault(f.where, f)
        self._seen: dict[Stratum, int] = {}
        self.injected: list[PlannedFault] = []

    def pick(self, point: FaultPoint, message_type: str) -> FaultKind | None:
        key = (point, message_type)
        index = self._seen.get(key, 0)
        self._seen[key] = index + 1
        fault = self.plan.get((point, message_type, index))
        if fault is None:
            return None
        self.injected.append(fault)
        return fault.kind


def unique(plan: Sequence[PlannedFault]) -> list[PlannedFault]:
    """``plan`` without repeated points (the first fault at a point is the one used)."""
    return list(PlannedFaults(plan).plan.values())


@dataclass(slots=True)
class Coverage:
    """Where the runs put their faults: ``points`` — the fault points of each stratum in
    the undisturbed run; ``tried`` — the distinct points that got a fault in some run;
    ``faults`` — faults injected in all runs; ``runs`` — disturbed runs."""

    points: Mapping[Stratum, int]
    tried: dict[Stratum, set[int]] = field(default_factory=dict)
    faults: int = 0
    runs: int = 0

    def add(self, injected: Iterable[PlannedFault]) -> None:
        self.runs += 1
        for f in injected:
            self.faults += 1
            self.tried.setdefault((f.point, f.type), set()).add(f.index)

    @property
    def points_total(self) -> int:
        return sum(self.points.values())

    @property
    def points_tried(self) -> int:
        return sum(len(v) for v in self.tried.values())

    def __str__(self) -> str:
        parts = [f"{stratum_name(s)} {len(self.tried.get(s, ()))}/{n}"
                 for s, n in self.points.items()]
        return (f"faults tried at {self.points_tried} of {self.points_total} points "
                f"({self.faults} faults in {self.runs} run{'s' * (self.runs != 1)}): "
                + ", ".join(parts))
