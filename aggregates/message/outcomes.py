"""Per-message outcomes: every input message ends in exactly one (docs/design.md
"Invariants", 6)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from aggregates.core.fastbuild import slot_builder

OutcomeKind = Literal["applied", "duplicate", "dead_lettered", "parked"]
OUTCOME_KINDS: Final[tuple[OutcomeKind, ...]] = ("applied", "duplicate", "dead_lettered", "parked")

# Reason codes are the members of aggregates.core.reasons.Reason (docs/reasons.md).


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one message. ``from_parked`` marks a message released from parking
    in this run (it was counted as ``parked`` by the run that parked it)."""

    message_id: str
    aggregate_type: str
    aggregate_id: str
    outcome: OutcomeKind
    reason: str | None = None
    detail: str | None = None
    emitted_ids: tuple[str, ...] = ()
    attempt: int = 1
    from_parked: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "aggregate_type": self.aggregate_type,
            "aggregate_id": self.aggregate_id,
            "outcome": self.outcome,
            "reason": self.reason,
            "detail": self.detail,
            "emitted_ids": list(self.emitted_ids),
            "attempt": self.attempt,
            "from_parked": self.from_parked,
        }


#: ``Outcome(...)`` with every field given, positionally, for the fold's per-message loop:
#: the same object, slots filled directly (:func:`aggregates.core.fastbuild.slot_builder`).
new_outcome: Callable[[str, str, str, OutcomeKind, str | None, str | None, tuple[str, ...],
                       int, bool], Outcome] = slot_builder(
    Outcome, ("message_id", "aggregate_type", "aggregate_id", "outcome", "reason", "detail",
              "emitted_ids", "attempt", "from_parked"))


@dataclass(slots=True)
class OutcomeCounts:
    """Counts by outcome; ``released`` counts previously parked messages settled now."""

    counts: Counter[str] = field(default_factory=Counter)
    released: Counter[str] = field(default_factory=Counter)

    def add(self, outcomes: Iterable[Outcome]) -> OutcomeCounts:
        for o in outcomes:
            (self.released if o.from_parked else self.counts)[o.outcome] += 1
        return self

    @property
    def total(self) -> int:
        return sum(self.counts[k] for k in OUTCOME_KINDS)

    def as_dict(self) -> dict[str, int]:
        out: dict[str, int] = {k: self.counts[k] for k in OUTCOME_KINDS}
        out["total"] = self.total
        out.update({f"released_{k}": self.released[k] for k in OUTCOME_KINDS if self.released[k]})
        return out
