"""How :func:`~aggregates.testing.check_fault_tolerance` judges one run against the
undisturbed one (pure): the final states, and each effect's work counted at the resource —
the calls that did the work (answered, or answered and lost on the way back), per
idempotency key. A run under faults that made more such calls for a key than the undisturbed
run fails even when the final states agree (a payment made twice leaves no trace in a
state whose handler ignores the receipt), unless the effect is declared ``idempotent=True``
(the resource does the work once per key: out of this check's sight by design) or listed in
``at_least_once``."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from aggregates.core.samevalue import same_value
from aggregates.domain.effects import Effects
from aggregates.testing._blame import effect_blame, first_difference
from aggregates.testing._scenario_timeline import Timeline
from aggregates.testing.scenario import Scenario

__all__ = ["Problem", "judge", "resource_calls"]

#: The answers of a call that reached the resource and did the work.
_WORKED = ("ok", "lost")
_STATE_CHARS = 240


@dataclass(frozen=True, slots=True)
class Problem:
    """What is wrong with a run: ``what`` (one sentence), ``details`` (lines: the first
    differing field of each aggregate, its two states), ``focus`` (the aggregates
    ``Type/id`` and effect entries the timeline excerpt shows first) and the run's
    ``timeline``."""

    what: str
    details: list[str] = field(default_factory=list)
    focus: set[str] = field(default_factory=set)
    timeline: Timeline = field(default_factory=Timeline)


def judge(expected: dict[tuple[str, str], Any], calls: dict[str, int], sc: Scenario,
          effects: Effects | None, at_least_once: Collection[str], *, faulted: bool,
          base: Scenario) -> Problem | None:
    """The problem of run ``sc`` (``faulted``: faults were injected), or ``None``."""
    got = sc.states()
    if not same_value(got, expected):  # a NaN in a state is the same NaN
        # An effect that answered the same call differently is to blame, not a handler.
        blame = effect_blame((base.effect_calls, base.timeline), (sc.effect_calls, sc.timeline))
        if blame is not None:
            what = f"the final states differ from the undisturbed run's — {blame}"
        elif faulted:
            what = ("the final states differ from the undisturbed run's — a handler is not "
                    "safe under at-least-once delivery")
        else:
            what = ("the final states differ between two runs with no fault injected "
                    "(each run builds the same messages) — a handler reads something besides "
                    "its state and the message that changes from run to run (the clock, "
                    "random numbers, uuid4, a global counter or other state kept between "
                    "runs)")
        keys = sorted(k for k in set(expected) | set(got)
                      if not same_value(expected.get(k), got.get(k)))
        labels = ("undisturbed", "under faults") if faulted else ("in one run", "in another")
        return Problem(what, state_diff(expected, got, keys, labels),
                       {"/".join(k) for k in keys}, sc.timeline)
    for k, n in resource_calls(sc, effects, at_least_once).items():
        if n > calls.get(k, 0):
            return _twice(sc, k, n, calls.get(k, 0), effects)
    return None


def _twice(sc: Scenario, k: str, n: int, before: int, effects: Effects | None) -> Problem:
    rec = next(c for c in sc.effect_calls if c.call.idempotency_key == k)
    effect = effects.get(rec.type) if effects is not None else None
    where = f"{rec.call.aggregate_type}/{rec.call.aggregate_id}"
    if effect is not None and effect.query is not None:
        why = ("after an answer was lost its query function found nothing, so the call was "
               "made again — the query must find the first call's work by "
               "call.idempotency_key; or make the resource honour the key and declare "
               f"idempotent=True, or pass at_least_once=[{rec.type!r}] if doing it twice is "
               "harmless")
    else:
        why = ("it has no query function and is not idempotent=True, so a lost answer does "
               "the work again (pays twice) — add @effects.query, or make the resource honour "
               "call.idempotency_key and declare idempotent=True, or pass "
               f"at_least_once=[{rec.type!r}] if doing it twice is harmless")
    return Problem(f"effect {rec.type!r} reached its resource {n} times for entry {k} of "
                   f"{where} (undisturbed: {before}); the final states agree, the resource "
                   f"does not: {why}", [], {where, k}, sc.timeline)


def resource_calls(sc: Scenario, effects: Effects | None,
                   at_least_once: Collection[str]) -> dict[str, int]:
    """Calls that reached the resource and did the work, by entry, of the registered
    effects not declared ``idempotent=True`` and not listed in ``at_least_once`` (a fake
    stands in for the resource: its calls are not counted)."""
    counts: dict[str, int] = {}
    if effects is None:
        return counts
    fakes = sc._desk.fakes
    for rec in sc.effect_calls:
        if (rec.answer not in _WORKED or rec.type in fakes or rec.type not in effects
                or rec.type in at_least_once or effects.get(rec.type).idempotent):
            continue
        counts[rec.call.idempotency_key] = counts.get(rec.call.idempotency_key, 0) + 1
    return counts


def state_diff(want: dict[tuple[str, str], Any], got: dict[tuple[str, str], Any],
               keys: list[tuple[str, str]], labels: tuple[str, str], *, most: int = 3
               ) -> list[str]:
    """For each differing aggregate (at most ``most``): its first differing field, then
    both states (each cut at a few lines' length)."""
    lines = []
    for t, i in keys[:most]:
        a, b = want.get((t, i), "(absent)"), got.get((t, i), "(absent)")
        if (t, i) in want and (t, i) in got:
            lines.append(f"  {t}/{i} first differs at " + first_difference(
                a, b, "state", labels))
        pad = " " * (len(t + i) + 4 + len(labels[0]) - len(labels[1]))
        lines.append(f"  {t}/{i}: {labels[0]} {_cut(a)}\n  {pad}{labels[1]} {_cut(b)}")
    if len(keys) > most:
        lines.append(f"  … and {len(keys) - most} more aggregates differ: "
                     + ", ".join("/".join(k) for k in keys[most:most + 10])
                     + (", …" if len(keys) > most + 10 else ""))
    return lines


def _cut(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _STATE_CHARS else text[:_STATE_CHARS] + f"… ({len(text)} chars)"
