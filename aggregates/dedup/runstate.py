"""The run stamp's data (pure): :class:`RunStamp` (who writes) and :class:`RunState` (the
stamp of one document in memory), read from the stored ``_run`` field. What the dedup
strategies do with it is :mod:`aggregates.dedup.runs` (docs/design.md "Counts that survive
retries"); this module sits below :mod:`aggregates.dedup.core`, which keeps a
:class:`RunState` on each dedup record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["F_RUN", "RunStamp", "RunState", "read_run"]

#: The run stamp's field in the aggregate document (docs/design.md "Document layout").
F_RUN: Final = "_run"


@dataclass(frozen=True, slots=True)
class RunStamp:
    """Who writes: ``run`` (the same for every attempt of one run; a new run must never
    reuse it) and ``attempt`` (a label unique among the run's attempts, shown in the
    outcome's detail, e.g. Spark's ``task 3.1 in stage 2.0 (TID 17)``)."""

    run: str
    attempt: str


@dataclass(slots=True)
class RunState:
    """The run stamp of one document in memory: the writer's ``stamp`` (``None``: the
    writer has none), the stored ``_run`` (``stored_id``, ``segments``), the writer's
    ``claimed`` keys of this document, and what the current fold adds (``before``:
    high-water marks before the fold first raised them; ``unapplied``: claim keys recorded
    without being applied; ``write_version``: the ``_v`` the fold's write will have)."""

    stamp: RunStamp | None
    stored_id: str | None = None
    segments: list[dict[str, Any]] = field(default_factory=list)
    claimed: set[str] = field(default_factory=set)
    before: dict[str, int] = field(default_factory=dict)
    unapplied: list[str] = field(default_factory=list)
    write_version: int = 0
    #: The inbox entries' write versions by message id, built by the first lookup of a fold
    #: (entries the fold adds have none yet: they are the writer's own).
    inbox_tags: dict[str, object] | None = None

    @property
    def own(self) -> bool:
        """Whether the stored stamp is this writer's run."""
        return self.stamp is not None and self.stored_id == self.stamp.run

    def copy(self) -> RunState:
        """For a new fold: the stored stamp and the claims; nothing of a previous fold."""
        return RunState(self.stamp, self.stored_id, self.segments, set(self.claimed))

    def by_version(self, version: Any) -> str | None:
        """The attempt of this run that wrote an inbox entry tagged ``version``."""
        if not self.own or type(version) is not int:
            return None
        label = None
        for seg in self.segments:
            if version >= seg["v"]:
                label = str(seg["a"])
        return label

    def by_mark(self, key: str, seq: int) -> str | None:
        """The attempt of this run that raised source ``key``'s high-water mark past
        ``seq`` (the last segment that found it below ``seq``)."""
        if not self.own:
            return None
        label = None
        for seg in self.segments:
            for k, mark in seg.get("hw") or ():
                if k == key and seq > mark:
                    label = str(seg["a"])
        return label


def read_run(stored: Any, stamp: RunStamp | None,
             claimed: set[str] | None = None) -> RunState | None:
    """The :class:`RunState` of a document whose ``_run`` is ``stored`` (``None`` when
    absent), for a writer with ``stamp``; ``None`` when neither has one (no cost)."""
    if stamp is None and stored is None:
        return None
    if isinstance(stored, Mapping) and isinstance(stored.get("id"), str):
        segments = [dict(s) for s in stored.get("w") or () if isinstance(s, Mapping)
                    and "a" in s and type(s.get("v")) is int]
        return RunState(stamp, stored["id"], segments, claimed if claimed is not None else set())
    return RunState(stamp, None, [], claimed if claimed is not None else set())
