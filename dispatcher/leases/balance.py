"""Which partitions an instance should hold: the balancing rule, pure (no I/O, no clock).

Every running dispatcher instance of a collection runs the same rule in each renewal round
(docs/design.md "Scale-out: partitions and leases"), from what it just read: the live
members (heartbeat documents not expired) and the partition leases. There is no
coordinator; the instances converge because they all compute the same quotas:

- the live members (heartbeats not expired) sorted by member name, ``N`` of them (this
  instance always counts, even if its own heartbeat could not be written);
- member ``i``'s quota is ``P // N``, plus one for the first ``P % N`` members — the quotas
  add up to exactly ``P``, and none is above ``⌈P/N⌉``;
- an instance holding more than its quota releases the surplus (after it stopped
  publishing them: the hand-over waits for the previous owner to stop);
- an instance holding fewer claims free partitions (never owned, released, or expired) up
  to its quota, in the order of a rendezvous hash of (instance, partition), so instances
  claiming at the same moment mostly want different partitions (a claim is an atomic
  conditional write; losing a race just means trying another one next round).

Free partitions exist only while some instance is below its quota, so once the members
agree on the membership, every partition is held and each instance holds its quota.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

__all__ = ["LeaseView", "Plan", "fair", "plan", "quota", "valid_until"]


@dataclass(frozen=True, slots=True)
class LeaseView:
    """One partition lease as read: ``owner`` is ``None`` after a graceful release;
    ``expires_at`` is the owner's heartbeat expiry (``None``: the owner has no heartbeat
    document) — a lease is live while its owner's heartbeat is (dispatcher/leases/partlease.py)."""

    partition: int
    owner: str | None
    expires_at: datetime | None
    epoch: int = 0

    def live(self, now: datetime) -> bool:
        return self.owner is not None and self.expires_at is not None and self.expires_at > now


@dataclass(frozen=True, slots=True)
class Plan:
    """What one instance should do this round."""

    #: the live members, sorted (this instance included)
    members: tuple[str, ...]
    #: how many partitions this instance should hold
    quota: int
    #: partitions whose live lease this instance holds (and keeps)
    keep: frozenset[int]
    #: partitions to stop publishing, then release
    release: frozenset[int]
    #: free partitions to try to claim, best first (at most ``quota - len(keep)``)
    claim: tuple[int, ...]


def quota(me: str, members: Iterable[str], partitions: int) -> int:
    """This instance's share of ``partitions`` among ``members`` (``me`` counted even if
    absent)."""
    ordered = sorted(set(members) | {me})
    n = len(ordered)
    base, extra = divmod(partitions, n)
    return base + (1 if ordered.index(me) < extra else 0)


def _affinity(me: str, partition: int) -> bytes:
    return hashlib.blake2b(f"{partition}:{me}".encode("utf-8", "surrogatepass"),
                           digest_size=8).digest()


def plan(*, me: str, now: datetime, members: Mapping[str, datetime],
         leases: Mapping[int, LeaseView], partitions: int) -> Plan:
    """The rule above. ``members`` maps instance id → heartbeat expiry; ``leases`` maps
    partition → lease (a partition without a document is free)."""
    live = tuple(sorted({m for m, exp in members.items() if exp > now} | {me}))
    share = quota(me, live, partitions)
    mine = sorted(p for p, lease in leases.items()
                  if 0 <= p < partitions and lease.owner == me and lease.live(now))
    if len(mine) > share:
        # Keep the partitions this instance has the strongest affinity for: after a
        # membership change the surplus of each instance differs, which spreads the
        # hand-overs.
        ranked = sorted(mine, key=lambda p: _affinity(me, p), reverse=True)
        keep = frozenset(ranked[:share])
        return Plan(live, share, keep, frozenset(mine) - keep, ())
    free = [p for p in range(partitions)
            if (lease := leases.get(p)) is None or not lease.live(now)]
    free.sort(key=lambda p: _affinity(me, p), reverse=True)
    return Plan(live, share, frozenset(mine), frozenset(), tuple(free[:share - len(mine)]))


def fair(owned: Mapping[str, int], partitions: int) -> bool:
    """Every partition held and every member within one of the others (so none above
    ``⌈P/N⌉``)."""
    if not owned:
        return False
    counts = list(owned.values())
    return sum(counts) == partitions and max(counts) - min(counts) <= 1


def valid_until(sent: float, ttl_s: float, margin: float) -> float:
    """Until when (on the holder's monotonic clock) a lease renewed by a request *sent* at
    ``sent`` counts as held: ``ttl_s`` after sending, minus a margin — so the holder stops
    before anyone may take it over, as long as the hosts' clocks agree to within
    ``margin * ttl_s`` (the claimer compares ``expires_at`` with its own clock)."""
    return sent + ttl_s * (1.0 - margin)
