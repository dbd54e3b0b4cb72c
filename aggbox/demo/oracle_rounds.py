"""What each pipeline round must report (:mod:`aggbox.demo.oracle`): its outcome counts,
from the input lines, the oracle's answer and the ids earlier rounds applied."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from aggbox.demo.oracle import Expected, classify
from aggregates.core.reasons import Reason
from aggregates.domain.aggregate import Registry

__all__ = ["RoundCounts", "expected_round_counts"]


@dataclass(frozen=True, slots=True)
class RoundCounts:
    """Outcome counts of one pipeline round."""

    input: int = 0
    applied: int = 0
    duplicate: int = 0
    dead_lettered: int = 0
    parked: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"input": self.input, "applied": self.applied, "duplicate": self.duplicate,
                "dead_lettered": self.dead_lettered, "parked": self.parked}


def expected_round_counts(lines: Sequence[str], registry: Registry, expected: Expected, *,
                          seen: set[str]) -> RoundCounts:
    """What one round over ``lines`` must report, given the ids applied by earlier rounds
    (``seen``, updated in place): the first copy of a new message is applied, later copies
    and earlier rounds' messages are duplicates, bad rows and messages whose handler fails
    are dead letters, nothing is parked."""
    n: Counter[str] = Counter()
    for line in lines:
        c = classify(line, registry)
        if c.reason is not None or expected.dead.get(c.key) == Reason.HANDLER_ERROR:
            n["dead_lettered"] += 1
        elif c.key in seen:
            n["duplicate"] += 1
        else:
            seen.add(c.key)
            n["applied"] += 1
    return RoundCounts(input=len(lines), applied=n["applied"], duplicate=n["duplicate"],
                       dead_lettered=n["dead_lettered"])
