"""Per-message outcomes: every input message ends in exactly one (docs/design.md
"Invariants", 6)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

OutcomeKind = Literal["applied", "duplicate", "dead_lettered", "parked"]
OUTCOME_KINDS: Final[tuple[OutcomeKind, ...]] = ("applied", "duplicate", "dead_lettered", "parked")

# Reason codes produced outside the dedup strategies.
HANDLER_ERROR: Final = "handler_error"
INVALID_STATE: Final = "invalid_state"
INVALID_EMIT: Final = "invalid_emit"
#: A typed handler's payload does not validate into its payload class.
INVALID_PAYLOAD: Final = "invalid_payload"
#: A message's ``schema_version`` is newer than the latest its aggregate type knows.
UNKNOWN_SCHEMA_VERSION: Final = "unknown_schema_version"
#: An upcaster (docs/evolving-schemas.md) raised or returned something not a payload dict.
UPCAST_FAILED: Final = "upcast_failed"
INVALID_RESULT: Final = "invalid_handler_result"
UNKNOWN_MESSAGE_TYPE: Final = "unknown_message_type"
UNKNOWN_AGGREGATE_TYPE: Final = "unknown_aggregate_type"
INVALID_ENVELOPE: Final = "invalid_envelope"
OUTBOX_FULL: Final = "outbox_full"
DOCUMENT_TOO_LARGE: Final = "document_size_budget"
AGGREGATE_BLOCKED: Final = "aggregate_blocked"
VERSION_CONFLICT: Final = "version_conflict_retries_exhausted"
#: A ``duplicate`` whose record is an event the aggregate itself published (an untargeted
#: emit fed back as input): its effect is already in the aggregate.
AGGBOX_EVENT: Final = "aggbox_event"
# Hostile input (docs/design.md "The pipeline"): never retried, never parked.
INVALID_ENCODING: Final = "invalid_encoding"  # a record that is not valid UTF-8
PAYLOAD_TOO_DEEP: Final = "payload_too_deep"  # nested deeper than envelope.MAX_RECORD_DEPTH
# One handler step that can never fit, however far the dispatcher drains the outbox.
EMITS_EXCEED_OUTBOX_LIMIT: Final = "emits_exceed_outbox_limit"
STATE_TOO_LARGE: Final = "state_too_large"
EMITS_TOO_LARGE: Final = "emits_exceed_document_budget"


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
