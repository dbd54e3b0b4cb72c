"""The aggregate document layout (docs/design.md "Document layout") and its in-memory
snapshot. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from aggregates.core.keys import read_hw
from aggregates.core.partitions import F_PARTITION
from aggregates.dedup import (
    F_ARCHIVE_FLOOR,
    F_ARCHIVE_UNDATED,
    F_HW,
    F_INBOX,
    DedupRecord,
)

# Field names of the aggregate document. The dispatcher imports these too.
F_ID: Final = "_id"
F_VERSION: Final = "_v"
F_STATE: Final = "state"
#: The schema version of ``state`` (absent: 1); see docs/evolving-schemas.md.
F_STATE_VERSION: Final = "_sv"
# The dedup record's fields (inbox, archive floor, hw) are defined with the strategies that
# write them, in aggregates.dedup, and re-exported here.
F_SEQ: Final = "_seq"
F_OUTBOX: Final = "outbox"
#: Pending timers (docs/design.md "Timers"): stored entries like the outbox's, plus ``timer``
#: (the key), ``due`` and ``scheduled_at``; the dispatcher finds due ones by ``timers.due``.
F_TIMERS: Final = "timers"
#: How many timers this aggregate has scheduled (absent: 0): the ``seq`` of the timers' own
#: sources. Apart from ``_seq``, so the aggregate's emits keep gapless ``source.seq``s.
F_TIMER_SEQ: Final = "_tseq"
F_BLOCKED: Final = "_blocked"
F_TYPE: Final = "_type"
#: The layout version of the whole document (absent: 1), written once, at insert; see
#: docs/design.md "Compatibility".
F_LAYOUT_VERSION: Final = "_lv"
#: The document layout this aggbox reads and writes. A document with a higher ``_lv`` was
#: written by a newer aggbox: it is neither read nor written (:func:`layout_error`).
LAYOUT_VERSION: Final = 1
# The partition (written once, at insert) is defined with its hash, in aggregates.core.partitions,
# and re-exported here.


@dataclass(slots=True)
class Snapshot:
    """What the writer knows of one aggregate document (as read, or as last written)."""

    aggregate_id: str
    version: int = 0
    state: dict[str, Any] | None = None
    dedup: DedupRecord = field(default_factory=DedupRecord)
    seq: int = 0
    outbox_ids: list[str] = field(default_factory=list)
    blocked: dict[str, Any] | None = None
    size_bytes: int = 0
    #: The pending timers as stored (``timers``), in the order they were scheduled.
    timers: list[dict[str, Any]] = field(default_factory=list)
    #: ``_tseq``: timers scheduled so far.
    timer_seq: int = 0
    #: ``_sv``: the version of the ``state`` shape as stored (1 when the field is absent).
    state_version: int = 1
    #: ``_lv``: the document layout as stored (1 when the field is absent); see
    #: :func:`layout_error`.
    layout_version: int = LAYOUT_VERSION

    @property
    def exists(self) -> bool:
        return self.version > 0


def _aware(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return None


def layout_error(layout_version: Any) -> str | None:
    """Why a document of layout ``layout_version`` (its ``_lv``, as stored) cannot be read by
    this aggbox; ``None`` when it can (1 up to :data:`LAYOUT_VERSION`)."""
    if type(layout_version) is int and 1 <= layout_version <= LAYOUT_VERSION:
        return None
    if type(layout_version) is int and layout_version > LAYOUT_VERSION:
        return (f"the document has layout version {F_LAYOUT_VERSION}={layout_version}, "
                f"written by a newer aggbox; this one knows layouts up to {LAYOUT_VERSION}: "
                "upgrade aggbox")
    return (f"the document's layout version {F_LAYOUT_VERSION}={layout_version!r} is not "
            f"a positive integer (this aggbox knows layouts up to {LAYOUT_VERSION})")


def snapshot_from_document(doc: Mapping[str, Any] | None, aggregate_id: str) -> Snapshot:
    """Turn a stored document (or ``None`` for a missing one) into a :class:`Snapshot`."""
    if doc is None:
        return Snapshot(aggregate_id=aggregate_id)
    import bson

    # A fourth element (the write version of a run stamp, aggregates.dedup.runs) is kept.
    inbox = [
        [e[0], _aware(e[1]) if len(e) > 1 else None, e[2] if len(e) > 2 else None, *e[3:4]]
        for e in doc.get(F_INBOX) or []
    ]
    outbox = doc.get(F_OUTBOX) or []
    return Snapshot(
        aggregate_id=aggregate_id,
        version=int(doc.get(F_VERSION, 0)),
        state=dict(doc.get(F_STATE) or {}),
        dedup=DedupRecord(
            inbox=inbox,
            archive_floor=_aware(doc.get(F_ARCHIVE_FLOOR)),
            archive_undated=bool(doc.get(F_ARCHIVE_UNDATED, False)),
            hw=read_hw(doc.get(F_HW)),
        ),
        seq=int(doc.get(F_SEQ, 0)),
        outbox_ids=[str(e.get("id")) for e in outbox],
        blocked=doc.get(F_BLOCKED),
        size_bytes=len(bson.encode(dict(doc))),
        timers=[dict(t) for t in doc.get(F_TIMERS) or []],
        timer_seq=int(doc.get(F_TIMER_SEQ, 0)),
        # Kept as stored (checked when the fold loads the state: a bad value is an
        # invalid_state, not a crash here).
        state_version=doc.get(F_STATE_VERSION, 1),
        # Kept as stored too: the fold refuses the document's messages (layout_error).
        layout_version=doc.get(F_LAYOUT_VERSION, LAYOUT_VERSION),
    )


__all__ = ["F_ARCHIVE_FLOOR", "F_ARCHIVE_UNDATED", "F_BLOCKED", "F_HW", "F_ID", "F_INBOX",
           "F_LAYOUT_VERSION", "F_OUTBOX", "F_PARTITION", "F_SEQ", "F_STATE", "F_STATE_VERSION",
           "F_TIMERS", "F_TIMER_SEQ", "F_TYPE", "F_VERSION", "LAYOUT_VERSION", "Snapshot",
           "layout_error", "snapshot_from_document"]
