"""What the testing tools say when two runs that should agree do not (issue 33): the first
field where they differ — a handling's state, emits or timers, an effect's result — and
whom to blame: the handler (with the aggregate, the message id and the step) or the effect
(by name). Pure; used by :class:`~aggregates.testing.AggregateHarness` and
:func:`~aggregates.testing.check_fault_tolerance`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from aggregates.core.samevalue import same_value
from aggregates.fold.result import Changes
from aggregates.testing._scenario_effects import EffectCallRecord
from aggregates.testing._scenario_timeline import Timeline

__all__ = ["effect_blame", "first_difference", "run_difference"]

#: How the two runs of one handling are called in a message.
RUNS = ("in the first run", "in the second")


def first_difference(a: Any, b: Any, path: str,
                     labels: tuple[str, str] = ("before", "after"), *,
                     strict: bool = True) -> str:
    """Where ``a`` and ``b`` first differ, as text: the field's path and both values. Values
    are compared with :func:`~aggregates.core.samevalue.same_value` (NaN equals NaN; with
    ``strict``, ``-0.0`` differs from ``0.0``)."""
    if type(a) is not type(b):
        return (f"{path}: {type(a).__name__} {a!r:.80} {labels[0]}, {type(b).__name__} "
                f"{b!r:.80} {labels[1]}")

    def differ(x: Any, y: Any) -> bool:
        return not same_value(x, y, strict=strict) or type(x) is not type(y)

    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if differ(x, y):
                return first_difference(x, y, f"{path}.{f.name}", labels, strict=strict)
    elif hasattr(a, "model_fields") and hasattr(a, "model_dump"):
        for k in type(a).model_fields:
            x, y = getattr(a, k), getattr(b, k)
            if differ(x, y):
                return first_difference(x, y, f"{path}.{k}", labels, strict=strict)
    elif isinstance(a, Mapping):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}.{k}: {'only ' + labels[0] if k in a else 'only ' + labels[1]}"
            if differ(a[k], b[k]):
                return first_difference(a[k], b[k], f"{path}.{k}", labels, strict=strict)
    elif isinstance(a, list | tuple) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if differ(x, y):
                return first_difference(x, y, f"{path}[{i}]", labels, strict=strict)
    return f"{path}: {a!r:.80} {labels[0]}, {b!r:.80} {labels[1]}"


def run_difference(first: Changes, second: Changes) -> str | None:
    """Where two runs of the same handling differ first (``None``: they agree): the state
    (``state.<field>``), an emitted entry (``emit[i] (<type>).<field>``) or the timers.
    Compared by value as stored (:func:`~aggregates.core.samevalue.same_value`): a NaN
    is the same NaN in both runs, ``-0.0`` is not ``0.0``."""
    if not same_value(first.state, second.state):
        return first_difference(first.state, second.state, "state", RUNS)
    a, b = first.outbox, second.outbox
    if not same_value(a, b):
        if len(a) != len(b):
            return (f"emits: {[e.get('type') for e in a]} {RUNS[0]}, "
                    f"{[e.get('type') for e in b]} {RUNS[1]}")
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if not same_value(x, y):
                return first_difference(x, y, f"emit[{i}] ({x.get('type')})", RUNS)
    if not same_value(first.timers, second.timers):
        return first_difference(first.timers, second.timers, "timers", RUNS)
    return None


def effect_blame(undisturbed: tuple[Sequence[EffectCallRecord], Timeline],
                 disturbed: tuple[Sequence[EffectCallRecord], Timeline]) -> str | None:
    """The first effect that gave two different results for the same call (one
    idempotency key) — between two attempts of one run, or between the undisturbed run and
    the disturbed one — as one sentence naming it; ``None`` if every effect agreed."""
    base, got = _results(undisturbed[0]), _results(disturbed[0])
    for (calls, timeline), label in ((undisturbed, "undisturbed"), (disturbed, "under faults")):
        for recs in _results(calls).values():
            for later in recs[1:]:
                if not same_value(later.result, recs[0].result):
                    return _blame(recs[0], later, timeline,
                                  (f"at its first attempt ({label})",
                                   f"at attempt {later.call.attempt} ({label})"))
    for k, recs in got.items():
        if k in base and not same_value(base[k][0].result, recs[0].result):
            return _blame(base[k][0], recs[0], disturbed[1], ("undisturbed", "under faults"))
    return None


def _results(calls: Sequence[EffectCallRecord]
             ) -> dict[tuple[str, str], list[EffectCallRecord]]:
    """The calls that produced a result (answered, lost on the way back, or found by the
    query), by effect type and idempotency key, in order."""
    out: dict[tuple[str, str], list[EffectCallRecord]] = {}
    for c in calls:
        if c.result is not None and c.answer in ("ok", "lost", "query"):
            out.setdefault((c.type, c.call.idempotency_key), []).append(c)
    return out


def _blame(a: EffectCallRecord, b: EffectCallRecord, timeline: Timeline,
           labels: tuple[str, str]) -> str:
    c = a.call
    step = next((e.step for e in timeline
                 if e.kind == "effect" and e.message_id == c.idempotency_key), None)
    where = first_difference(dict(a.result or {}), dict(b.result or {}), "result", labels)
    return (f"the effect {c.type!r} is not idempotent: its call for "
            f"{c.aggregate_type}/{c.aggregate_id} (entry {c.idempotency_key}, step {step}) "
            f"gave different results, first at {where}; make it return the same result "
            "for the same call.idempotency_key (pass it to the resource), or give it a "
            "query that finds the first result")
