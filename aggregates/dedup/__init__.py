"""Dedup strategies (pure logic, no I/O). Chosen per aggregate type; see docs/design.md
"Dedup".

A strategy looks at the aggregate's in-memory dedup record and one message and decides:
apply, duplicate, dead-letter (with reason) or park (with reason). After an apply it
records the message so later copies are recognised.

The inbox strategy keeps the newest ids in the document and moves older ones to the
per-collection **inbox archive** (written before the document write that evicts them; kept
for the dedup horizon). What the archive holds for the messages at hand is looked up by the
store writer (one query per chunk) and handed to the record as :attr:`DedupRecord.archived`;
the decision itself stays pure.

A strategy owns everything about its record: the decision, what an applied message adds to
the in-memory record (:meth:`DedupStrategy.record`), the ``$set``/``$push`` fragment and the
archive entries of the write that stores it (:meth:`DedupStrategy.changes`), whether and
where ids that leave the document are kept (:meth:`DedupStrategy.archive`,
:meth:`DedupStrategy.needs_lookup`) and its description (``repr``). The fold, the writer and
the tools call these and never ask which strategy they hold, so a new strategy touches this
module only (plus its archive, if it keeps one).

This module is the public face: the record and the interface are in
:mod:`aggregates.dedup.core`, each strategy in its own module (:mod:`aggregates.dedup.inbox`,
:mod:`aggregates.dedup.highwater`); a new strategy is a new module like those.
"""

from __future__ import annotations

from aggregates.dedup.core import (
    APPLY,
    DUPLICATE,
    F_ARCHIVE_FLOOR,
    F_ARCHIVE_UNDATED,
    F_HW,
    F_INBOX,
    NO_CHANGES,
    ArchiveNotConsulted,
    Decision,
    DedupChanges,
    DedupRecord,
    DedupStrategy,
    InboxEntry,
    NoDedup,
    RecordArchive,
    Verdict,
    source_key,
)
from aggregates.dedup.highwater import HighWater
from aggregates.dedup.inbox import Inbox, needs_archive

__all__ = [
    "APPLY",
    "DUPLICATE",
    "F_ARCHIVE_FLOOR",
    "F_ARCHIVE_UNDATED",
    "F_HW",
    "F_INBOX",
    "NO_CHANGES",
    "ArchiveNotConsulted",
    "Decision",
    "DedupChanges",
    "DedupRecord",
    "DedupStrategy",
    "HighWater",
    "Inbox",
    "InboxEntry",
    "NoDedup",
    "RecordArchive",
    "Verdict",
    "needs_archive",
    "source_key",
]
