"""What ``aggbox dispatch-status`` reports of one collection (pure data): its instances,
their partitions, the pending entries per partition, the last hand-over and the last
``--once`` run; :meth:`DispatchStatus.as_dict` is the ``--json`` form. Read by
:mod:`dispatcher.status.report`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aggregates.core.partitions import PARTITIONS
from dispatcher.status.text import compress_ranges

__all__ = ["DispatchStatus", "Handover", "InstanceStatus", "OnceRun", "PartitionLag"]


@dataclass(slots=True)
class PartitionLag:
    """The pending entries of one partition."""

    partition: int
    entries: int
    documents: int
    #: age of the oldest pending entry (the earliest first entry of a pending document)
    oldest_age_s: float
    #: owner of the partition's live lease, ``None`` when unowned
    owner: str | None = None


@dataclass(slots=True)
class Handover:
    """How the current owner of a partition got it."""

    partition: int
    previous: str | None
    #: ``None``: released by ``previous`` when it stopped, not taken by anyone yet
    owner: str | None
    #: ``released`` (gracefully by ``previous``) or ``expired`` (``previous``'s lease ran out)
    kind: str
    at: datetime
    epoch: int | None = None


@dataclass(slots=True)
class InstanceStatus:
    """One dispatcher instance of the collection."""

    instance: str
    host: str | None = None
    pid: int | None = None
    #: its member document has not expired
    live: bool = False
    #: when its heartbeat (and with it every lease it holds) expires
    expires_at: datetime | None = None
    heartbeat_age_s: float | None = None
    started_at: datetime | None = None
    published: int | None = None
    #: partitions whose live lease it holds (authoritative)
    partitions: list[int] = field(default_factory=list)
    #: partitions its member document listed at the last heartbeat
    reported: list[int] = field(default_factory=list)
    pending_entries: int = 0
    pending_documents: int = 0
    oldest_age_s: float | None = None
    #: the effect types it executes (from its heartbeat)
    effects: list[str] = field(default_factory=list)
    #: not live, and its process (host, pid) now runs as this live instance (a heartbeat
    #: that lapsed, e.g. while the process was paused, rejoins under a new name: ``X#2``)
    replaced_by: str | None = None


@dataclass(slots=True)
class OnceRun:
    """The last ``aggbox dispatch --once`` of a collection (dispatcher/leases/partlease.py
    ``note_once``)."""

    at: datetime
    instance: str | None = None
    published: int | None = None
    timers_fired: int | None = None


@dataclass(slots=True)
class DispatchStatus:
    """The dispatch state of one collection at ``now``."""

    database: str
    collection: str
    now: datetime
    partitions: int = PARTITIONS
    instances: list[InstanceStatus] = field(default_factory=list)
    #: partitions without a live lease
    unowned: list[int] = field(default_factory=list)
    #: partitions with pending entries, the oldest pending entry first
    lag: list[PartitionLag] = field(default_factory=list)
    last_handover: Handover | None = None
    #: every partition held, live instances within one partition of each other
    fair: bool = False
    #: the last ``--once`` run, if any
    last_once: OnceRun | None = None

    @property
    def running(self) -> bool:
        """Some instance is live (a dispatcher runs on this collection)."""
        return any(i.live for i in self.instances)

    @property
    def scope(self) -> str:
        return f"{self.database}.{self.collection}"

    @property
    def pending_entries(self) -> int:
        return sum(p.entries for p in self.lag)

    @property
    def pending_documents(self) -> int:
        return sum(p.documents for p in self.lag)

    @property
    def oldest_age_s(self) -> float | None:
        return max((p.oldest_age_s for p in self.lag), default=None)

    @property
    def effects_disagree(self) -> dict[str, list[str]]:
        """Live instance → the effect types other live instances execute and it lacks (only
        instances that lack some): their entries wait there (dispatcher/effects/guard.py)."""
        live = [i for i in self.instances if i.live]
        everywhere = {t for i in live for t in i.effects}
        return {i.instance: sorted(everywhere - set(i.effects)) for i in live
                if everywhere - set(i.effects)}

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (datetimes as ISO 8601 strings)."""
        return {
            "database": self.database,
            "collection": self.collection,
            "scope": self.scope,
            "now": self.now.isoformat(),
            "partitions": self.partitions,
            "fair": self.fair,
            "running": self.running,
            "last_once": None if self.last_once is None else {
                "at": _iso(self.last_once.at), "instance": self.last_once.instance,
                "published": self.last_once.published,
                "timers_fired": self.last_once.timers_fired},
            "pending_entries": self.pending_entries,
            "pending_documents": self.pending_documents,
            "oldest_age_s": self.oldest_age_s,
            "instances": [{
                "instance": i.instance, "host": i.host, "pid": i.pid, "live": i.live,
                "heartbeat_age_s": i.heartbeat_age_s,
                "started_at": _iso(i.started_at), "published": i.published,
                "owned": len(i.partitions), "partitions": list(i.partitions),
                "ranges": compress_ranges(i.partitions), "reported": list(i.reported),
                "pending_entries": i.pending_entries,
                "pending_documents": i.pending_documents, "oldest_age_s": i.oldest_age_s,
                "effects": list(i.effects), "replaced_by": i.replaced_by,
            } for i in self.instances],
            "effects_missing": self.effects_disagree,
            "unowned": list(self.unowned),
            "lag": [{"partition": p.partition, "owner": p.owner, "entries": p.entries,
                     "documents": p.documents, "oldest_age_s": p.oldest_age_s}
                    for p in self.lag],
            "last_handover": None if self.last_handover is None else {
                "partition": self.last_handover.partition,
                "previous": self.last_handover.previous,
                "owner": self.last_handover.owner,
                "kind": self.last_handover.kind,
                "at": _iso(self.last_handover.at),
                "epoch": self.last_handover.epoch,
            },
        }




def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
