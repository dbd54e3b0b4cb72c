"""``aggbox dispatch-status``: who dispatches which partitions of a collection, how far
behind each partition is, and the last hand-over (docs/operations.md, "Dispatcher status").

Read-only and synchronous (``pymongo``): :func:`read_status` reads the partition leases
(``partition_collection``, authoritative for ownership: a partition belongs to the owner
of its *live* lease), the member documents (``member_collection``: host, pid, heartbeat)
and, with ONE aggregation on the collection, the pending outbox entries per partition.
:func:`format_status` turns the result into a compact text table (pure);
:meth:`DispatchStatus.as_dict` is the ``--json`` form.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from pymongo.collection import Collection
from pymongo.database import Database

from aggregates.core.partitions import F_PARTITION, PARTITIONS
from aggregates.fold.document import F_OUTBOX
from dispatcher.leases.balance import fair
from dispatcher.outbox.sweep import PENDING
from dispatcher.status.model import (
    DispatchStatus,
    Handover,
    InstanceStatus,
    OnceRun,
    PartitionLag,
)
from dispatcher.status.text import columns, compress_ranges, format_age, pending_text

__all__ = ["DEFAULT_MEMBER_COLLECTION", "DEFAULT_PARTITION_COLLECTION", "DispatchStatus",
           "Handover", "InstanceStatus", "OnceRun", "PartitionLag", "compress_ranges",
           "format_age", "format_status", "read_status"]

#: The defaults of the dispatcher settings ``partition_collection`` and ``member_collection``.
DEFAULT_PARTITION_COLLECTION = "aggbox_dispatcher_partitions"
DEFAULT_MEMBER_COLLECTION = "aggbox_dispatcher_members"

#: How many partitions the text form lists by lag.
TOP_LAGGING = 10

#: Pending documents grouped by partition (documents without the field: partition 0).
_LAG_PIPELINE: list[dict[str, Any]] = [
    {"$match": PENDING},
    {"$project": {"part": {"$ifNull": [f"${F_PARTITION}", 0]},
                  "n": {"$size": f"${F_OUTBOX}"},
                  "first": {"$arrayElemAt": [f"${F_OUTBOX}.created_at", 0]}}},
    {"$group": {"_id": "$part", "n": {"$sum": "$n"}, "docs": {"$sum": 1},
                "oldest": {"$min": "$first"}}},
]


# -- reading ---------------------------------------------------------------------------------
def read_status(db: Database[Any], collection: str, *,
                partition_collection: str = DEFAULT_PARTITION_COLLECTION,
                member_collection: str = DEFAULT_MEMBER_COLLECTION,
                now: datetime | None = None, partitions: int = PARTITIONS) -> DispatchStatus:
    """The dispatch state of ``collection`` in ``db``: three reads (members, leases, one
    aggregation of the pending documents). ``now`` (default: this host's clock) decides
    which leases and members are live and the ages."""
    now = _utc(now) if now is not None else datetime.now(UTC)
    scope = f"{db.name}.{collection}"
    status = DispatchStatus(database=db.name, collection=collection, now=now,
                            partitions=partitions)
    instances, status.last_once = _read_members(db[member_collection], scope, now)
    owners, status.last_handover = _read_leases(db[partition_collection], scope, instances,
                                                partitions)
    status.unowned = [p for p in range(partitions) if p not in owners]
    for p, owner in sorted(owners.items()):
        instances.setdefault(owner, InstanceStatus(instance=owner)).partitions.append(p)
    lags = _read_lag(db[collection], owners, now)
    for lag in lags.values():  # each owner's share of the backlog
        if lag.owner is not None:
            inst = instances[lag.owner]
            inst.pending_entries += lag.entries
            inst.pending_documents += lag.documents
            inst.oldest_age_s = max(inst.oldest_age_s or 0.0, lag.oldest_age_s)
    status.lag = sorted(lags.values(), key=lambda x: (-x.oldest_age_s, -x.entries, x.partition))
    status.instances = sorted(instances.values(), key=lambda i: i.instance)
    running: dict[tuple[Any, Any], str] = {(i.host, i.pid): i.instance
                                           for i in status.instances if i.live and i.pid}
    for i in status.instances:
        i.replaced_by = None if i.live else running.get((i.host, i.pid))
    # The balancing rule's own test: every partition held by a live instance, shares
    # within one of each other.
    status.fair = fair({i.instance: len(i.partitions) for i in status.instances if i.live},
                       partitions)
    return status


def _read_members(coll: Collection[Any], scope: str, now: datetime
                  ) -> tuple[dict[str, InstanceStatus], OnceRun | None]:
    """Read 1: the instances (member heartbeats) of ``scope``, by name; live while their
    heartbeat has not expired; and the note of the last ``--once`` run."""
    instances: dict[str, InstanceStatus] = {}
    once: OnceRun | None = None
    for doc in coll.find({"scope": scope}):
        at = _opt_utc(doc.get("once_at"))
        if at is not None and "member" not in doc and "instance" not in doc:
            by, published, fired = (doc.get("once_by"), doc.get("published"),
                                    doc.get("timers_fired"))
            once = OnceRun(at, by if isinstance(by, str) else None,
                           published if isinstance(published, int) else None,
                           fired if isinstance(fired, int) else None)
            continue
        member = _member(doc, now)
        if member is not None:
            instances[member.instance] = member
            member.live = member.expires_at is not None and member.expires_at > now
    return instances, once


_LEASE_FIELDS: Final = {f: 1 for f in ("partition", "owner", "epoch", "previous", "handover",
                                       "handed_at", "since", "released_by", "released_at")}


def _read_leases(coll: Collection[Any], scope: str, instances: Mapping[str, InstanceStatus],
                 partitions: int) -> tuple[dict[int, str], Handover | None]:
    """Read 2: the owner of each partition whose lease is live — a lease is live while its
    owner's heartbeat is (dispatcher/leases/partlease.py) — and the latest handover."""
    owners: dict[int, str] = {}  # partition → owner of its live lease
    latest: Handover | None = None
    for doc in coll.find({"scope": scope}, _LEASE_FIELDS):
        p = doc.get("partition")
        if not isinstance(p, int) or not 0 <= p < partitions:
            continue
        owner = doc.get("owner")
        if isinstance(owner, str) and owner in instances and instances[owner].live:
            owners[p] = owner
        handover = _handover(doc, p, owner)
        if handover is not None and (latest is None or handover.at > latest.at):
            latest = handover
    return owners, latest


def _handover(doc: Mapping[str, Any], partition: int, owner: Any) -> Handover | None:
    """The last handover of one lease — a release by a stopping owner included, with no
    owner yet; ``None`` when it was never handed over."""
    if owner is None and isinstance(doc.get("released_by"), str):
        at = _opt_utc(doc.get("released_at"))
        return None if at is None else Handover(partition, doc["released_by"], None,
                                                "released", at)
    kind = doc.get("handover")
    at = _opt_utc(doc.get("handed_at")) or _opt_utc(doc.get("since"))
    if kind in (None, "new") or at is None or not isinstance(owner, str):
        return None
    epoch, previous = doc.get("epoch"), doc.get("previous")
    return Handover(partition=partition,
                    previous=previous if isinstance(previous, str) else None,
                    owner=owner, kind=str(kind), at=at,
                    epoch=epoch if isinstance(epoch, int) else None)


def _read_lag(coll: Collection[Any], owners: Mapping[int, str], now: datetime
              ) -> dict[int, PartitionLag]:
    """Read 3: the pending outbox entries per partition (one aggregation)."""
    lags: dict[int, PartitionLag] = {}
    for row in coll.aggregate(_LAG_PIPELINE):
        p = _lag_partition(row.get("_id"))
        lag = lags.setdefault(p, PartitionLag(partition=p, entries=0, documents=0,
                                              oldest_age_s=0.0, owner=owners.get(p)))
        lag.entries += int(row.get("n") or 0)
        lag.documents += int(row.get("docs") or 0)
        lag.oldest_age_s = max(lag.oldest_age_s,
                               _age(_opt_utc(row.get("oldest")), now) or 0.0)
    return lags


def _lag_partition(value: Any) -> int:
    """The partition a lag row counts for: its ``_p``; a document without a partition number
    counts as partition 0."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        return 0
    return value


def _member(doc: Mapping[str, Any], now: datetime) -> InstanceStatus | None:
    """One member document (an instance's heartbeat), or None when it names no member."""
    name = doc.get("member", doc.get("instance"))
    if not isinstance(name, str):
        return None
    pid, published = doc.get("pid"), doc.get("published")
    reported, effects = doc.get("partitions"), doc.get("effects")
    return InstanceStatus(
        instance=name, host=doc.get("host"), pid=pid if isinstance(pid, int) else None,
        expires_at=_opt_utc(doc.get("expires_at")),
        heartbeat_age_s=_age(_opt_utc(doc.get("heartbeat_at")), now),
        started_at=_opt_utc(doc.get("started_at")),
        published=published if isinstance(published, int) else None,
        reported=sorted(x for x in reported if isinstance(x, int))
        if isinstance(reported, list) else [],
        effects=sorted(x for x in effects if isinstance(x, str))
        if isinstance(effects, list) else [])


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _opt_utc(value: Any) -> datetime | None:
    return _utc(value) if isinstance(value, datetime) else None


def _age(value: datetime | None, now: datetime) -> float | None:
    return None if value is None else max(0.0, (now - value).total_seconds())


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


# -- formatting (pure) -----------------------------------------------------------------------
def format_status(status: DispatchStatus, *, top: int = TOP_LAGGING) -> str:
    """The text form: a header, one line per instance, the unowned partitions, the ``top``
    partitions with the oldest pending entries and the last hand-over."""
    live = [i for i in status.instances if i.live]
    # Fairness is a question for running instances: with none, the partitions are simply
    # not held (a cron-style --once run left them, as it should).
    share = (f"{len(live)} live instance{'' if len(live) == 1 else 's'}, "
             f"{'fair' if status.fair else 'NOT fair'}" if live else "no dispatcher running")
    once = status.last_once
    if once is not None:
        share += (f"; last --once at {once.at.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%SZ')}"
                  f" ({format_age(_age(once.at, status.now))} ago)")
    lines = [
        f"{status.scope}: {status.partitions} partitions, {share}; pending: "
        f"{pending_text(status.pending_entries, status.pending_documents)}, oldest: "
        f"{format_age(status.oldest_age_s)}"]
    rows: list[list[str]] = []
    for i in status.instances:
        where = f"{i.host or '?'}:{i.pid if i.pid is not None else '?'}"
        ranges = compress_ranges(i.partitions)
        owned = f"partitions: {len(i.partitions)}" + (f" ({ranges})" if ranges else "")
        if i.reported != i.partitions and (i.live or i.reported):
            owned += f" [reported {len(i.reported)}]"
        beat = ("heartbeat: -" if i.heartbeat_age_s is None
                else f"heartbeat: {format_age(i.heartbeat_age_s)} ago")
        state = "live" if i.live else (f"now {i.replaced_by}" if i.replaced_by else "DEAD")
        rows.append([i.instance, state, where, beat,  # the long partition list last
                     f"pending: {pending_text(i.pending_entries, i.pending_documents)}",
                     f"oldest: {format_age(i.oldest_age_s)}", owned])
    if rows:
        lines.extend("  " + line for line in columns(rows))
    else:
        lines.append("  no instances")
    unowned = compress_ranges(status.unowned)
    lines.append(f"unowned: {len(status.unowned)} ({unowned})" if unowned else "unowned: none")
    effects = sorted({t for i in live for t in i.effects})
    if effects:
        lines.append(f"effects: {', '.join(effects)}")
    for name, lacking in status.effects_disagree.items():
        lines.append(f"  EFFECTS MISSING on {name}: {', '.join(lacking)} (their entries wait "
                     "there; run every instance with the same effects)")
    if status.lag:
        shown = status.lag[:top]
        lines.append(f"lagging partitions ({len(shown)} of {len(status.lag)} with pending "
                     "entries, oldest first):")
        lines.extend("  " + line for line in columns([
            [f"partition {p.partition}", f"owner: {p.owner or 'NONE'}",
             f"pending: {pending_text(p.entries, p.documents)}",
             f"oldest: {format_age(p.oldest_age_s)}"] for p in shown]))
    else:
        lines.append("lagging partitions: none (no pending entries)")
    h = status.last_handover
    if h is None:
        lines.append("last hand-over: none")
    else:
        ago = format_age(_age(h.at, status.now))
        lines.append(f"last hand-over: partition {h.partition}, {h.previous or '?'} → "
                     f"{h.owner or 'nobody yet'} ({h.kind}) at "
                     f"{h.at.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%SZ')} ({ago} ago)")
    return "\n".join(lines)
