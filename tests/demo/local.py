"""A pipeline round without Spark, for tests of the loop and the checks: what the Spark job
does per record, in one process — bad JSON and invalid envelopes become dead letters, the
rest goes to the real :class:`StoreWriter` ordered within each aggregate."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aggbox.demo.model import OutcomeRow, read_records
from aggregates.core.errors import EnvelopeError
from aggregates.core.ids import raw_message_id
from aggregates.core.reasons import Reason
from aggregates.core.settings import AggboxSettings
from aggregates.domain.aggregate import Registry
from aggregates.fold import DeadLetter
from aggregates.message.envelope import Message
from aggregates.message.outcomes import OUTCOME_KINDS, Outcome
from aggregates.store.deadletters import DeadLetterStore
from aggregates.store.writer import StoreWriter, utc_now


class LocalRound:
    def __init__(self, db: Any, registry: Registry, settings: AggboxSettings) -> None:
        self.writer = StoreWriter(db, registry, settings=settings)
        self.writer.ensure_indexes()
        self.dead = DeadLetterStore(db, collection=settings.dead_letter_collection)

    def __call__(self, number: int, inputs: Sequence[Path]
                 ) -> tuple[dict[str, int], list[OutcomeRow]]:
        messages: list[tuple[int, Message]] = []
        letters: list[DeadLetter] = []
        outcomes: list[Outcome] = []
        for pos, line in enumerate(read_records(list(inputs))):
            try:
                messages.append((pos, Message.from_dict(json.loads(line))))
                continue
            except ValueError as exc:  # json.JSONDecodeError, or EnvelopeError (a ValueError)
                reason = (Reason.INVALID_ENVELOPE if isinstance(exc, EnvelopeError)
                          else "invalid_json")
            letters.append(DeadLetter(None, line, reason, "bad row"))
            outcomes.append(Outcome(raw_message_id(line), "", "", "dead_lettered", reason))
        # Spark's order within an aggregate: source.seq, occurred_at, input position.
        messages.sort(key=lambda pm: (pm[1].aggregate_key,
                                      pm[1].source.seq if pm[1].source else 0,
                                      pm[1].occurred_at.isoformat() if pm[1].occurred_at
                                      else "", pm[0]))
        outcomes += self.writer.process(m for _, m in messages)
        self.dead.write(letters, now=utc_now())
        counts: dict[str, int] = {k: 0 for k in OUTCOME_KINDS}
        for o in outcomes:
            if not o.from_parked:
                counts[o.outcome] += 1
        return counts, [OutcomeRow.from_mapping(o.to_dict()) for o in outcomes]
