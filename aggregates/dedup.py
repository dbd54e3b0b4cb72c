"""Dedup strategies (pure logic, no I/O). Chosen per aggregate type; see DESIGN.md.

A strategy looks at the aggregate's in-memory dedup record and one message and decides:
apply, duplicate, dead-letter (with reason) or park (with reason). After an apply it
records the message so later copies are recognised.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from aggregates.envelope import Message
from aggregates.errors import ConfigurationError
from aggregates.fieldnames import escape_key

Verdict = Literal["apply", "duplicate", "dead_letter", "park"]

# Reason codes (stable strings: they end up in dead letters, parked entries and outcomes).
DUPLICATE_DIFFERENT_PAYLOAD = "duplicate_with_different_payload"
BEYOND_DEDUP_HORIZON = "beyond_dedup_horizon"
MISSING_SOURCE = "missing_source"
SEQUENCE_GAP = "sequence_gap"
HIGH_WATER_MAP_FULL = "high_water_map_full"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str | None = None
    detail: str | None = None


APPLY = Decision("apply")
DUPLICATE = Decision("duplicate")


@dataclass(slots=True)
class DedupRecord:
    """The dedup part of an aggregate document, in memory.

    ``inbox`` holds ``[message_id, at, payload_hash]`` entries, newest last."""

    inbox: list[list[object]] = field(default_factory=list)
    inbox_floor: datetime | None = None
    #: An entry without ``occurred_at`` was evicted: undated messages can no longer be
    #: proven new (dated ones are judged by ``inbox_floor``).
    undated_evicted: bool = False
    hw: dict[str, int] = field(default_factory=dict)
    _index: dict[str, str | None] | None = None

    def inbox_hash(self, message_id: str) -> tuple[bool, str | None]:
        if self._index is None:
            self._index = {str(e[0]): (str(e[2]) if len(e) > 2 and e[2] else None)
                           for e in self.inbox}
        if message_id in self._index:
            return True, self._index[message_id]
        return False, None

    def add_inbox(self, entry: list[object]) -> None:
        self.inbox.append(entry)
        if self._index is not None:
            self._index[str(entry[0])] = str(entry[2]) if entry[2] else None

    def evict_to(self, window: int) -> list[list[object]]:
        excess = len(self.inbox) - window
        if excess <= 0:
            return []
        evicted, self.inbox = self.inbox[:excess], self.inbox[excess:]
        if self._index is not None:
            for e in evicted:
                self._index.pop(str(e[0]), None)
        return evicted


def source_key(msg: Message) -> str | None:
    """``"<type>/<id>"`` escaped so it is safe as a field name under ``hw``."""
    if msg.source is None:
        return None
    return escape_key(f"{msg.source.type}/{msg.source.id}")


class DedupStrategy(ABC):
    """Base class. Subclasses are small immutable value objects."""

    name: str = "abstract"

    @abstractmethod
    def decide(self, rec: DedupRecord, msg: Message, payload_hash: str) -> Decision:
        """apply / duplicate / dead_letter / park for ``msg`` given the record."""

    @abstractmethod
    def record(self, rec: DedupRecord, msg: Message, at: datetime, payload_hash: str) -> None:
        """Remember an applied message in the record."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoDedup(DedupStrategy):
    """For naturally idempotent messages (absolute values, set semantics)."""

    name = "none"

    def decide(self, rec: DedupRecord, msg: Message, payload_hash: str) -> Decision:
        return APPLY

    def record(self, rec: DedupRecord, msg: Message, at: datetime, payload_hash: str) -> None:
        return None


class Inbox(DedupStrategy):
    """Keep the last ``window`` processed message ids. Ids older than the window are
    covered by ``inbox_floor``: a message that is not in the inbox but occurred at or
    before the floor cannot be proven new and is dead-lettered as ``beyond_dedup_horizon``."""

    name = "inbox"

    def __init__(self, *, window: int = 1000) -> None:
        if window < 1:
            raise ConfigurationError("Inbox(window=...) must be ≥ 1")
        self.window = window

    def decide(self, rec: DedupRecord, msg: Message, payload_hash: str) -> Decision:
        seen, first_hash = rec.inbox_hash(msg.message_id)
        if seen:
            if first_hash is not None and first_hash != payload_hash:
                return Decision(
                    "dead_letter",
                    DUPLICATE_DIFFERENT_PAYLOAD,
                    f"message id {msg.message_id!r} was already applied with a different "
                    f"payload (hash {first_hash}, now {payload_hash}); the producer reuses ids",
                )
            return DUPLICATE
        if (msg.occurred_at is None and (rec.undated_evicted or rec.inbox_floor is not None)) or (
            msg.occurred_at is not None and rec.inbox_floor is not None
            and msg.occurred_at <= rec.inbox_floor
        ):
            return Decision(
                "dead_letter",
                BEYOND_DEDUP_HORIZON,
                f"not in the inbox (window {self.window}) and occurred_at "
                f"{msg.occurred_at} is not after the inbox floor {rec.inbox_floor}: it may "
                "have been applied before and cannot be proven new. Replay it deliberately "
                "if it is new, or raise the window.",
            )
        return APPLY

    def record(self, rec: DedupRecord, msg: Message, at: datetime, payload_hash: str) -> None:
        # The entry keeps the message's own occurred_at (None when it has none): the floor
        # must only ever hold producers' times, never our processing time, or every dated
        # message older than "now" would fall behind it.
        rec.add_inbox([msg.message_id, msg.occurred_at, payload_hash])
        evicted = rec.evict_to(self.window)
        for e in evicted:
            t = e[1]
            if isinstance(t, datetime):
                if rec.inbox_floor is None or t > rec.inbox_floor:
                    rec.inbox_floor = t
            else:
                rec.undated_evicted = True

    def __repr__(self) -> str:
        return f"Inbox(window={self.window})"


class HighWater(DedupStrategy):
    """Per source aggregate keep the highest applied ``source.seq``.

    ``monotonic``: any ``seq > hw`` applies (needs per-source ordered delivery).
    ``contiguous``: only ``hw + 1`` applies; later ones are parked until the gap fills."""

    name = "high-water"

    def __init__(
        self, *, mode: Literal["monotonic", "contiguous"] = "monotonic", max_sources: int = 10_000
    ) -> None:
        if mode not in ("monotonic", "contiguous"):
            raise ConfigurationError("HighWater(mode=...) is 'monotonic' or 'contiguous'")
        if max_sources < 1:
            raise ConfigurationError("HighWater(max_sources=...) must be ≥ 1")
        self.mode = mode
        self.max_sources = max_sources

    def decide(self, rec: DedupRecord, msg: Message, payload_hash: str) -> Decision:
        key = source_key(msg)
        if key is None or msg.source is None:
            return Decision(
                "dead_letter",
                MISSING_SOURCE,
                "high-water dedup needs source {type, id, seq} on every message",
            )
        hw = rec.hw.get(key, 0)
        seq = msg.source.seq
        if seq <= hw:
            return DUPLICATE
        if key not in rec.hw and len(rec.hw) >= self.max_sources:
            return Decision(
                "dead_letter",
                HIGH_WATER_MAP_FULL,
                f"the high-water map already tracks {self.max_sources} sources; raise "
                "HighWater(max_sources=...) or use the inbox strategy for this aggregate type",
            )
        if self.mode == "contiguous" and seq != hw + 1:
            return Decision(
                "park", SEQUENCE_GAP, f"expected seq {hw + 1} from {key}, got {seq}"
            )
        return APPLY

    def record(self, rec: DedupRecord, msg: Message, at: datetime, payload_hash: str) -> None:
        key = source_key(msg)
        assert key is not None and msg.source is not None
        rec.hw[key] = max(rec.hw.get(key, 0), msg.source.seq)

    def __repr__(self) -> str:
        return f"HighWater(mode={self.mode!r}, max_sources={self.max_sources})"
