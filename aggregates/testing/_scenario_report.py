"""What :func:`~aggregates.testing.check_fault_tolerance` tells a person (pure but for the
optional timeline file): :class:`FaultToleranceError` — the head (the fault, the aggregate,
the message, the field), how it was found, the coverage, then at most about 40 lines of the
failing run's timeline around the fault; the whole timeline on the exception
(:attr:`FaultToleranceError.timeline`) and, on request, in a file — and
:class:`FaultToleranceReport` for a pass."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from aggregates.core.errors import AggboxError
from aggregates.testing._scenario_plan import Coverage, PlannedFault
from aggregates.testing._scenario_timeline import Exchange, Timeline
from aggregates.testing._scenario_verdict import Problem

__all__ = ["FaultToleranceError", "FaultToleranceReport", "excerpt", "failure"]

#: Lines of the timeline a failure message shows, at most.
EXCERPT_LINES = 40


class FaultToleranceError(AggboxError):
    """Under some faults the flow ended differently than undisturbed (or failed, or an
    effect did its work more often): the message names the fewest faults that do it, the
    aggregates whose states differ, the coverage and the timeline around the fault.
    :attr:`faults`: those faults; :attr:`coverage`: where the runs put their faults;
    :attr:`timeline`: the failing run's whole timeline (``None`` if the undisturbed run
    itself failed)."""

    def __init__(self, message: str, *, faults: Sequence[PlannedFault] = (),
                 coverage: Coverage | None = None, timeline: Timeline | None = None) -> None:
        super().__init__(message)
        self.faults = list(faults)
        self.coverage = coverage
        self.timeline = timeline


@dataclass(frozen=True, slots=True)
class FaultToleranceReport:
    """What a passing :func:`check_fault_tolerance` tried: ``sweeps`` (each ``(kind,
    points)``: one run with that fault at every point), ``random_runs`` and ``coverage``
    (``str()`` of the report is its line, also logged at INFO on the ``aggregates.testing``
    logger)."""

    coverage: Coverage
    sweeps: list[tuple[str, int]] = field(default_factory=list)
    random_runs: int = 0

    def __str__(self) -> str:
        swept = ", ".join(f"{kind} ({n})" for kind, n in self.sweeps) or "none"
        return (f"fault tolerance: no run differed; sweeps over every point: {swept}; "
                f"{self.random_runs} random runs; {self.coverage}")


def failure(problem: Problem, injected: Sequence[PlannedFault], coverage: Coverage, *,
            found_by: str, timeline_file: str | os.PathLike[str] | None) -> FaultToleranceError:
    """The error for a failing run: ``injected`` — the faults that came (already the
    fewest); ``found_by`` — how (a sweep and its narrowing, or random runs)."""
    timeline = problem.timeline
    fault_lines = [e for e in timeline if e.kind == "fault"]
    if injected:
        named, used = [], set()
        for f in injected:  # each fault with the timeline line it left (if it acted)
            e = next((x for x in fault_lines if x.step not in used and x.type == f.type
                      and f.kind in (x.outcome, x.reason)), None)
            if e is None:
                named.append(str(f))
                continue
            used.add(e.step)
            named.append(f"{f} ({_where(f, e, timeline)})")
        head = (f"under {len(injected)} fault{'s' * (len(injected) > 1)} — "
                f"{', '.join(named)} — ")
    else:
        head = "in a run without faults: "
    shown, n, total = excerpt(timeline, [e.step for e in fault_lines], problem.focus)
    where = ""
    if timeline_file is not None:
        with open(timeline_file, "w", encoding="utf-8") as out:
            out.write(f"{timeline}\n")
        where = f"; the whole timeline is in {os.fspath(timeline_file)}"
    text = "\n".join([
        head + problem.what, *problem.details, f"found by: {found_by}", str(coverage), "",
        f"timeline ({n} of {total} exchanges; all of them: err.timeline{where}):", shown])
    return FaultToleranceError(text, faults=injected, coverage=coverage, timeline=timeline)


def _where(fault: PlannedFault, e: Exchange, timeline: Timeline) -> str:
    """Where a fault hit: the effect entry and its aggregate, or the receiving aggregate,
    which of its messages of that type it was, the message id, and the step."""
    if fault.point == "effect":
        return f"entry {e.message_id} of {e.sender}, step {e.step}"
    nth = sum(1 for x in timeline if x.step < e.step and x.kind in _DELIVERED
              and x.type == e.type and x.receiver == e.receiver and x.note not in _COPIES) or 1
    return (f"{e.receiver}'s {_ordinal(nth)} {e.type}, message {e.message_id}, "
            f"step {e.step}")


_DELIVERED = ("input", "message", "reply")
_COPIES = ("duplicate", "redelivered", "redelivered late", "replayed")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def excerpt(timeline: Timeline, steps: Iterable[int], focus: set[str],
            limit: int = EXCERPT_LINES) -> tuple[str, int, int]:
    """At most ``limit`` lines (``…`` for each gap included) of ``timeline``: a few around
    each of ``steps`` (the faults), then the exchanges of the ``focus`` aggregates (or
    effect entries), nearest to the first fault first. Returns the text, the number of
    exchanges shown and the timeline's length."""
    items = list(timeline)
    if not items:
        return "(no exchanges)", 0, 0
    index = {e.step: i for i, e in enumerate(items)}
    marks = [index[s] for s in steps if s in index][:3]
    anchor = marks[0] if marks else len(items) - 1
    wanted = [j for i in marks for j in range(max(0, i - 4), min(len(items), i + 6))]
    touching = [i for i, e in enumerate(items) if _touches(e, focus)]
    touching.sort(key=lambda i: (i < anchor, abs(i - anchor)))
    chosen: list[int] = []
    for i in [*wanted, *touching, *range(len(items) - 1, -1, -1)]:
        if i in chosen:
            continue
        if _lines([*chosen, i], len(items)) > limit:
            if len(chosen) >= limit // 2:
                break
            continue
        chosen.append(i)
    lines = [_HEAD]
    last = -1
    for i in sorted(chosen):
        if i != last + 1:
            lines.append("   …")
        lines.append(str(items[i]))
        last = i
    if last != len(items) - 1:
        lines.append("   …")
    return "\n".join(lines), len(chosen), len(items)


def _lines(chosen: list[int], n: int) -> int:
    """The lines ``chosen`` exchanges take, with a ``…`` for each gap."""
    ordered = sorted(chosen)
    gaps = sum(1 for a, b in zip([-1, *ordered], ordered, strict=False) if b != a + 1)
    return len(ordered) + gaps + (ordered[-1] != n - 1)


_HEAD = str(Timeline([Exchange(0, "input", "x", "x")])).splitlines()[0]


def _touches(e: Exchange, focus: set[str]) -> bool:
    return ((e.receiver or "") in focus or (e.sender or "").split(" ")[0] in focus
            or e.message_id in focus)
