"""The high-water dedup strategy (pure): per source, the highest applied ``source.seq``
(docs/design.md "Dedup")."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from aggregates.core.errors import ConfigurationError
from aggregates.core.reasons import Reason
from aggregates.dedup.core import (
    APPLY,
    DUPLICATE,
    F_HW,
    NO_CHANGES,
    Decision,
    DedupChanges,
    DedupRecord,
    DedupStrategy,
    source_key,
)
from aggregates.message.envelope import Message

__all__ = ["HighWater"]


class HighWater(DedupStrategy):
    """Per source aggregate keep the highest applied ``source.seq``.

    ``monotonic``: any ``seq > hw`` applies (needs per-source ordered delivery).
    ``contiguous``: only ``hw + 1`` applies; later ones are parked until the gap fills."""

    name = "high-water"
    duplicate_means_applied = False

    def __init__(
        self, *, mode: Literal["monotonic", "contiguous"] = "monotonic", max_sources: int = 10_000
    ) -> None:
        if mode not in ("monotonic", "contiguous"):
            raise ConfigurationError("HighWater(mode=...) is 'monotonic' or 'contiguous'")
        if max_sources < 1:
            raise ConfigurationError("HighWater(max_sources=...) must be ≥ 1")
        self.mode = mode
        self.max_sources = max_sources

    def decide(self, rec: DedupRecord, msg: Message, payload_hash: str, now: datetime
               ) -> Decision:
        key = source_key(msg)
        if key is None or msg.source is None:
            return Decision(
                "dead_letter",
                Reason.MISSING_SOURCE,
                "high-water dedup needs source {type, id, seq} on every message",
            )
        hw = rec.hw.get(key, 0)
        seq = msg.source.seq
        if seq <= hw:
            return DUPLICATE
        if key not in rec.hw and len(rec.hw) >= self.max_sources:
            return Decision(
                "dead_letter",
                Reason.HIGH_WATER_MAP_FULL,
                f"the high-water map already tracks {self.max_sources} sources; raise "
                "HighWater(max_sources=...) or use the inbox strategy for this aggregate type",
            )
        if self.mode == "contiguous" and seq != hw + 1:
            return Decision(
                "park", Reason.SEQUENCE_GAP, f"expected seq {hw + 1} from {key}, got {seq}"
            )
        return APPLY

    def record(self, rec: DedupRecord, msg: Message, payload_hash: str) -> None:
        key = source_key(msg)
        assert key is not None and msg.source is not None
        mark = rec.hw.get(key, 0)
        if rec.run is not None and key not in rec.run.before:
            rec.run.before[key] = mark  # run stamps: the mark before this fold raised it
        rec.hw[key] = max(mark, msg.source.seq)
        rec.hw_changed[key] = None

    def claim_key(self, msg: Message) -> str | None:
        key = source_key(msg)
        return None if key is None or msg.source is None else f"{key}#{msg.source.seq}"

    def written_by(self, rec: DedupRecord, msg: Message) -> tuple[str, str] | None:
        key = source_key(msg)
        if rec.run is None or key is None or msg.source is None:
            return None
        label = rec.run.by_mark(key, msg.source.seq)
        return None if label is None else (f"{key}#{msg.source.seq}", label)

    def changes(self, rec: DedupRecord) -> DedupChanges:
        if not rec.hw_changed:
            return NO_CHANGES
        return DedupChanges({f"{F_HW}.{key}": rec.hw[key] for key in rec.hw_changed})

    def __repr__(self) -> str:
        return f"HighWater(mode={self.mode!r}, max_sources={self.max_sources})"
