"""The partition balancing rule (:mod:`dispatcher.leases.balance`): hand-made cases, then a model of
the instances' rounds checked with hypothesis.

The model (:class:`Cluster`) simulates, in memory, the I/O around :func:`plan` described in
docs/design.md "Scale-out: partitions and leases": a true time ``T`` (the monotonic clock of
every instance), a wall clock per instance skewed by at most ``margin * ttl / 2`` (so two
clocks differ by at most ``margin * ttl``), a lease table (owner, epoch), a member table
(heartbeat expiry, extended only while more than the margin is left on the member's own
clock; a lapsed member rejoins under a new name) and, per instance, the partitions it
counts as held (partition → ``valid_until`` of its last heartbeat on its monotonic clock).
A round's claims are compare-and-sets on what it read, and may land after other instances'
rounds (``begin`` / ``finish``, ``overlap``): without the margin on the heartbeat's
renewal this model finds two holders of one partition. Each
action is atomic (each store write is). Time is counted in ticks of 1/64 s: exact both as
binary floats and as microseconds, so comparisons at the exact bounds are exact; skews are
drawn mostly at the bounds, and a "jump" action advances to (a tick around) the next instant
a lease lapses or expires on some clock.

After every action: no partition is held by two instances at once, a held partition's lease
names its holder, and lease epochs never decrease and grow at every claim (an epoch is never
given to two owners). At the end of each example the cluster settles (no more joins or
crashes, everything of the departed instances expired, rounds at most ``ttl / 3`` apart):
every partition must then be held by exactly one live instance, each holding its quota.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.leases.balance import LeaseView, Plan, fair, plan, quota, valid_until
from tests.hypo import examples

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TTL = 10.0
MARGIN = 0.2


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def lease(p: int, owner: str | None, expires_in: float, epoch: int = 1) -> LeaseView:
    return LeaseView(p, owner, at(expires_in), epoch)


# -- quota / fair / valid_until ----------------------------------------------------------------

def test_quota_eight_partitions_three_members_by_sorted_id() -> None:
    members = ["c", "a", "b"]
    assert [quota(m, members, 8) for m in ("a", "b", "c")] == [3, 3, 2]
    # the order they are given in does not matter, duplicates neither
    assert [quota(m, ["b", "c", "a", "b"], 8) for m in ("a", "b", "c")] == [3, 3, 2]


def test_quota_counts_me_even_if_absent() -> None:
    assert quota("a", ["b", "c"], 8) == 3
    assert quota("c", ["a", "b"], 8) == 2
    assert quota("a", [], 8) == 8


def test_quota_more_members_than_partitions() -> None:
    assert [quota(m, "abc", 2) for m in "abc"] == [1, 1, 0]


@given(st.sets(st.text(min_size=1, max_size=4), min_size=1, max_size=12),
       st.integers(1, 300))
@settings(max_examples=examples(200), deadline=None, database=None)
def test_quotas_add_up_and_differ_by_at_most_one(members: set[str], partitions: int) -> None:
    shares = {m: quota(m, members, partitions) for m in members}
    assert sum(shares.values()) == partitions
    assert max(shares.values()) - min(shares.values()) <= 1
    assert fair(shares, partitions)


def test_fair() -> None:
    assert fair({"a": 3, "b": 3, "c": 2}, 8)
    assert fair({"a": 2, "b": 3, "c": 3}, 8)  # within one, whoever has the extra one
    assert not fair({"a": 4, "b": 2, "c": 2}, 8)  # all held, but not balanced
    assert not fair({"a": 3, "b": 3, "c": 1}, 8)  # balanced, but one not held
    assert not fair({}, 8)
    assert fair({"a": 1, "b": 1, "c": 0}, 2)


def test_valid_until_is_ttl_minus_margin_after_sending() -> None:
    assert valid_until(100.0, TTL, MARGIN) == pytest.approx(108.0)
    assert valid_until(0.0, 30.0, 0.1) == pytest.approx(27.0)


# -- plan: hand-made cases -------------------------------------------------------------------

NOW = at(0)
LIVE3 = {"a": at(5), "b": at(5), "c": at(5)}


def test_plan_single_instance_claims_everything() -> None:
    decided = plan(me="a", now=NOW, members={"a": at(5)}, leases={}, partitions=8)
    assert decided == Plan(("a",), 8, frozenset(), frozenset(), decided.claim)
    assert sorted(decided.claim) == list(range(8))


def test_plan_releases_the_surplus_and_claims_nothing() -> None:
    leases = {p: lease(p, "a", 3) for p in range(6)}
    leases[6] = lease(6, "b", 3)
    decided = plan(me="a", now=NOW, members=LIVE3, leases=leases, partitions=8)
    assert decided.members == ("a", "b", "c")
    assert decided.quota == 3
    assert len(decided.keep) == 3 and len(decided.release) == 3
    assert decided.keep | decided.release == set(range(6))
    assert not decided.keep & decided.release
    assert decided.claim == ()  # partition 7 is free, but a is above its quota


def test_plan_surplus_kept_by_affinity_is_stable() -> None:
    # the partitions kept do not depend on the order the leases were read in
    leases = {p: lease(p, "a", 3) for p in range(8)}
    reversed_leases = dict(reversed(list(leases.items())))
    one = plan(me="a", now=NOW, members=LIVE3, leases=leases, partitions=8)
    two = plan(me="a", now=NOW, members=LIVE3, leases=reversed_leases, partitions=8)
    assert one == two
    # another instance with the same surplus keeps (in general) other partitions
    other = {p: lease(p, "b", 3) for p in range(8)}
    assert plan(me="b", now=NOW, members=LIVE3, leases=other, partitions=8).keep != one.keep


def test_plan_claims_are_limited_to_the_deficit() -> None:
    leases = {0: lease(0, "a", 3), 1: lease(1, "b", 3), 2: lease(2, "c", 3)}
    decided = plan(me="a", now=NOW, members=LIVE3, leases=leases, partitions=8)
    assert decided.quota == 3
    assert decided.keep == {0}
    assert decided.release == frozenset()
    assert len(decided.claim) == 2  # 5 are free, a lacks 2
    assert set(decided.claim) <= {3, 4, 5, 6, 7}
    # at its quota: nothing to claim although partitions are free
    leases |= {3: lease(3, "a", 3), 4: lease(4, "a", 3)}
    full = plan(me="a", now=NOW, members=LIVE3, leases=leases, partitions=8)
    assert full.keep == {0, 3, 4} and full.claim == () and full.release == frozenset()


def test_plan_expired_and_released_leases_are_free() -> None:
    leases = {
        0: lease(0, "b", 0),          # expires exactly now: expired
        1: lease(1, "b", -4),         # expired
        2: lease(2, None, 8),         # released (expiry left in the future)
        3: LeaseView(3, "b", None),   # owner without expiry: not live
        4: lease(4, "b", 0.001),      # live
        5: lease(5, "c", 9),          # live
        # 6, 7: no document
    }
    decided = plan(me="a", now=NOW, members={"a": at(5)}, leases=leases, partitions=8)
    assert decided.quota == 8  # b and c have no heartbeat
    assert sorted(decided.claim) == [0, 1, 2, 3, 6, 7]


def test_plan_own_expired_lease_is_not_kept_but_claimable() -> None:
    leases = {0: lease(0, "a", -1), 1: lease(1, "a", 1)}
    decided = plan(me="a", now=NOW, members=LIVE3, leases=leases, partitions=8)
    assert decided.keep == {1}
    assert len(decided.claim) == 2
    assert set(decided.claim) <= {0, *range(2, 8)}


def test_plan_counts_me_when_absent_from_members() -> None:
    members = {"b": at(5), "c": at(5)}
    decided = plan(me="a", now=NOW, members=members, leases={}, partitions=8)
    assert decided.members == ("a", "b", "c")
    assert decided.quota == 3
    assert len(decided.claim) == 3
    # even with its own heartbeat expired
    decided = plan(me="a", now=NOW, members=members | {"a": at(-1)}, leases={}, partitions=8)
    assert decided.members == ("a", "b", "c") and decided.quota == 3


def test_plan_ignores_members_with_expired_heartbeat() -> None:
    members = {"a": at(5), "b": at(0), "c": at(5), "d": at(-30)}  # b: expires exactly now
    decided = plan(me="a", now=NOW, members=members, leases={}, partitions=8)
    assert decided.members == ("a", "c")
    assert decided.quota == 4
    assert len(decided.claim) == 4


def test_plan_ignores_partitions_out_of_range() -> None:
    leases = {9: lease(9, "a", 3), -1: lease(-1, "a", 3)}
    decided = plan(me="a", now=NOW, members={"a": at(5)}, leases=leases, partitions=8)
    assert decided.keep == frozenset() and decided.release == frozenset()
    assert sorted(decided.claim) == list(range(8))


def test_claim_order_differs_between_instances() -> None:
    members = {"a": at(5), "b": at(5)}
    a = plan(me="a", now=NOW, members=members, leases={}, partitions=8)
    b = plan(me="b", now=NOW, members=members, leases={}, partitions=8)
    assert a.quota == b.quota == 4
    assert a.claim != b.claim
    # each one's full preference order is a permutation of the free set, and differs
    alone_a = plan(me="a", now=NOW, members={}, leases={}, partitions=8).claim
    alone_b = plan(me="b", now=NOW, members={}, leases={}, partitions=8).claim
    assert sorted(alone_a) == sorted(alone_b) == list(range(8))
    assert alone_a != alone_b
    assert a.claim == alone_a[:4] and b.claim == alone_b[:4]
    # over many partitions, two instances' first choices overlap about by chance only
    many_a = set(plan(me="a", now=NOW, members=members, leases={}, partitions=256).claim)
    many_b = set(plan(me="b", now=NOW, members=members, leases={}, partitions=256).claim)
    assert len(many_a) == len(many_b) == 128
    assert len(many_a & many_b) < 100


# -- the model -------------------------------------------------------------------------------

TICK_US = 15_625  # 1/64 s
TICKS_PER_S = 64
MAX_SKEW = int(MARGIN * TTL / 2 * TICKS_PER_S)  # ±1 s: clocks agree within margin * ttl
TTL_D = timedelta(seconds=TTL)
MAX_LIVE = 6
#: between two rounds of one instance while settling (renewal period < ttl * (1 - margin))
ROUND_PERIOD = int(TTL / 3 * TICKS_PER_S)
#: from a departure until its lease and heartbeat expired on every clock (+ skews)
EXPIRED_EVERYWHERE = int(TTL * (1 + MARGIN) * TICKS_PER_S) + 1


@dataclass
class Lease:
    owner: str | None
    epoch: int


@dataclass
class Pending:
    """A round between its read and its claims (the claims are compare-and-sets on what was
    read, sent later)."""

    views: dict[int, LeaseView]
    claim: tuple[int, ...]


@dataclass
class Instance:
    name: str
    skew: int  # ticks
    #: the member name it holds leases under (``name``, then ``name#2`` … after a lapse)
    owner: str = ""
    incarnation: int = 1
    registered: bool = False
    #: monotonic time its last successful heartbeat was sent
    sent: float | None = None
    held: dict[int, float] = field(default_factory=dict)
    pending: Pending | None = None

    def __post_init__(self) -> None:
        self.owner = self.owner or self.name


class ModelError(AssertionError):
    pass


class Cluster:
    """The store as dispatcher/leases/partlease.py uses it: one heartbeat per member, extended
    only while more than ``margin · ttl`` is left on the member's clock; leases with an
    owner and an epoch, live while the owner's heartbeat is; claims are compare-and-sets on
    (owner, epoch) as read, possibly sent long after the read (``begin`` / ``finish``)."""

    def __init__(self, partitions: int, *, renew_margin: float = MARGIN) -> None:
        self.partitions = partitions
        #: the margin the heartbeat's renewal condition keeps (dispatcher/leases/partlease.py);
        #: 0 only in the test that shows the model catches its absence
        self.renew_margin = renew_margin
        self.t = 0  # ticks of true time
        self.leases: dict[int, Lease] = {p: Lease(None, 0) for p in range(partitions)}
        self.members: dict[str, datetime] = {}
        self.live: dict[str, Instance] = {}
        self.joined = 0
        self.lapses = 0
        self.trace: list[str] = [f"P={partitions}"]
        self._last: dict[int, tuple[str | None, int]] = {}
        self._epoch_owner: dict[tuple[int, int], str] = {}

    # -- clocks ---------------------------------------------------------------------------
    @property
    def mono(self) -> float:
        return self.t / TICKS_PER_S

    def wall(self, inst: Instance) -> datetime:
        return T0 + timedelta(microseconds=(self.t + inst.skew) * TICK_US)

    def log(self, line: str) -> None:
        self.trace.append(f"T={self.mono:9.4f} {line}")

    def fail(self, message: str) -> ModelError:
        return ModelError(message + "\ntrace:\n" + "\n".join(self.trace[-400:]))

    def pick(self, index: int) -> Instance | None:
        if not self.live:
            return None
        return list(self.live.values())[index % len(self.live)]

    # -- actions --------------------------------------------------------------------------
    def join(self, skew: int) -> None:
        if len(self.live) >= MAX_LIVE:
            return
        k = self.joined
        self.joined += 1
        # ids that do not sort in joining order (the quota's extra ones go to the first)
        name = f"{'kdhamq'[k % 6]}{k}"
        self.live[name] = Instance(name, skew)
        self.log(f"join {name} skew={skew / TICKS_PER_S:+.4f}")

    def advance(self, ticks: int) -> None:
        self.t += ticks
        self.log(f"advance {ticks / TICKS_PER_S:.4f}")

    def ticks(self, when: datetime) -> int:
        return ((when - T0) // timedelta(microseconds=1)) // TICK_US

    def upcoming(self) -> list[int]:
        """The coming instants (ticks) at which something changes: a held lease lapses, a
        heartbeat expires (or nears its margin) on some live instance's clock."""
        events = {int(until * TICKS_PER_S) for inst in self.live.values()
                  for until in inst.held.values()}
        margin = int(MARGIN * TTL * TICKS_PER_S)
        events |= {self.ticks(exp) - inst.skew - m for exp in self.members.values()
                   for inst in self.live.values() for m in (0, margin)}
        return sorted(e for e in events if e > self.t)

    def jump(self, index: int, offset: int) -> None:
        """Advance to one of the coming changes, or a tick before or after it."""
        events = self.upcoming()
        if events:
            self.advance(max(0, events[index % len(events)] + offset - self.t))

    def set_skew(self, inst: Instance, skew: int) -> None:
        inst.skew = skew
        self.log(f"clock step {inst.name} skew={skew / TICKS_PER_S:+.4f}")

    def crash(self, inst: Instance) -> None:
        del self.live[inst.name]
        self.log(f"crash {inst.name} (held {sorted(inst.held)})")

    def leave(self, inst: Instance) -> None:
        inst.held.clear()  # stop publishing everything
        for lz in self.leases.values():
            if lz.owner == inst.owner:
                lz.owner = None
        self.members.pop(inst.owner, None)
        del self.live[inst.name]
        self.log(f"leave {inst.name}")

    def heartbeat(self, inst: Instance) -> None:
        mono, now = self.mono, self.wall(inst)
        if inst.registered:
            exp = self.members.get(inst.owner)
            if exp is not None and exp > now + timedelta(seconds=self.renew_margin * TTL):
                self.members[inst.owner] = now + TTL_D
                inst.sent = mono
                return
            # lapsed: everything dropped, a new member name
            inst.held.clear()
            inst.incarnation += 1
            inst.owner = f"{inst.name}#{inst.incarnation}"
            self.lapses += 1
            self.log(f"lapse {inst.name}: now {inst.owner}")
        self.members[inst.owner] = now + TTL_D
        inst.registered = True
        inst.sent = mono

    def views(self) -> dict[int, LeaseView]:
        return {p: LeaseView(p, lz.owner, self.members.get(lz.owner) if lz.owner else None,
                             lz.epoch) for p, lz in self.leases.items()}

    def begin(self, inst: Instance) -> None:
        """Heartbeat, read, confirm, plan, release; the claims are left pending."""
        self.heartbeat(inst)
        me, now = inst.owner, self.wall(inst)
        assert inst.sent is not None
        until = valid_until(inst.sent, TTL, MARGIN)
        views = self.views()
        members = dict(self.members)
        inst.held = {p: until for p, v in views.items() if v.owner == me}
        decided = plan(me=me, now=now, members=members, leases=views,
                       partitions=self.partitions)
        self.check_plan(decided, me, now, members, views)
        for p in sorted(decided.release):
            inst.held.pop(p, None)  # stop publishing first
            lz = self.leases[p]
            if lz.owner == me:
                lz.owner = None
        inst.pending = Pending(views, decided.claim)
        self.log(f"begin {inst.name} as {me}: members={','.join(decided.members)} "
                 f"quota={decided.quota} keep={sorted(decided.keep)} "
                 f"release={sorted(decided.release)} claim={list(decided.claim)}")

    def finish(self, inst: Instance) -> None:
        """The pending claims: compare-and-set on (owner, epoch) as read."""
        pending, inst.pending = inst.pending, None
        if pending is None or inst.sent is None:
            return
        until = valid_until(inst.sent, TTL, MARGIN)
        if until <= self.mono:
            return  # no heartbeat to hold them under (PartitionLeases.claim)
        claimed = []
        for p in pending.claim:
            seen, lz = pending.views[p], self.leases[p]
            if lz.owner == seen.owner and lz.epoch == seen.epoch:
                lz.owner = inst.owner
                lz.epoch += 1
                inst.held[p] = until
                claimed.append(p)
        self.log(f"finish {inst.name}: claimed={claimed} held={sorted(inst.held)}")

    def round(self, inst: Instance) -> None:
        self.begin(inst)
        self.finish(inst)

    # -- checks ---------------------------------------------------------------------------
    def check_plan(self, decided: Plan, me: str, now: datetime, members: dict[str, datetime],
                   views: dict[int, LeaseView]) -> None:
        live = tuple(sorted({m for m, exp in members.items() if exp > now} | {me}))
        mine = {p for p, v in views.items() if v.owner == me and v.live(now)}
        free = {p for p in range(self.partitions) if p not in views or not views[p].live(now)}
        problems = []
        if decided.members != live:
            problems.append(f"members {decided.members} != {live}")
        if decided.quota != quota(me, live, self.partitions):
            problems.append("quota")
        if decided.keep | decided.release != mine or decided.keep & decided.release:
            problems.append("keep/release do not split the leases held")
        if decided.release and (len(decided.keep) != decided.quota or decided.claim):
            problems.append("released below the quota, or released and claimed")
        if (not set(decided.claim) <= free or len(set(decided.claim)) != len(decided.claim)
                or len(decided.claim) != min(len(free),
                                             max(0, decided.quota - len(decided.keep)))):
            problems.append(f"claim {decided.claim} (free {sorted(free)})")
        if problems:
            raise self.fail(f"plan of {me} wrong: {'; '.join(problems)}: {decided}")

    def check(self) -> None:
        """Invariants after every action."""
        holders: dict[int, str] = {}
        for inst in self.live.values():
            for p, held_until in inst.held.items():
                if held_until <= self.mono:
                    continue
                if p in holders:
                    raise self.fail(f"(a) partition {p} held by {holders[p]} and {inst.name}")
                holders[p] = inst.name
                lz = self.leases.get(p)
                if lz is None or lz.owner != inst.owner:
                    raise self.fail(f"(a) {inst.name} holds {p} but the lease is {lz}")
        for p, lz in self.leases.items():
            owner, epoch = self._last.get(p, (None, 0))
            if lz.epoch < epoch:
                raise self.fail(f"(b) epoch of {p} went down: {epoch} -> {lz.epoch}")
            if lz.owner is not None and lz.owner != owner and lz.epoch <= epoch:
                raise self.fail(f"(b) owner of {p} changed {owner} -> {lz.owner} "
                                f"with epoch {epoch} -> {lz.epoch}")
            if lz.owner is not None:
                first = self._epoch_owner.setdefault((p, lz.epoch), lz.owner)
                if first != lz.owner:
                    raise self.fail(f"(b) epoch {lz.epoch} of {p} given to {first} and "
                                    f"{lz.owner}")
            self._last[p] = (lz.owner, lz.epoch)

    def holdings(self) -> dict[int, list[str]]:
        return {p: [i.name for i in self.live.values() if i.held.get(p, 0.0) > self.mono]
                for p in range(self.partitions)}

    def converged(self) -> bool:
        names = [i.owner for i in self.live.values()]
        counts = dict.fromkeys(names, 0)
        for holders in self.holdings().values():
            if len(holders) != 1:
                return False
            counts[self.live[holders[0]].owner] += 1
        if any(counts[n] != quota(n, names, self.partitions) for n in names):
            return False
        if not fair(counts, self.partitions):
            raise self.fail(f"every instance at its quota, yet not fair: {counts}")
        return True

    def settle(self, step: int) -> None:
        """No more joins or crashes: wait until everything of the departed expired, then
        round-robin rounds at most ``ROUND_PERIOD`` apart per instance."""
        self.log("settle")
        if not self.live:
            self.join(0)
        self.advance(EXPIRED_EVERYWHERE)
        self.check()
        order = list(self.live.values())
        step = min(step, ROUND_PERIOD // len(order))
        cycles = 2 * self.partitions + 10
        for cycle in range(cycles):
            self.cycle(order, step)
            if self.converged():
                self.log(f"converged after {cycle + 1} cycle(s)")
                break
        else:
            raise self.fail(f"not converged after {cycles} cycles: {self.holdings()}")
        # and stays so, without any hand-over
        before = {p: (lz.owner, lz.epoch) for p, lz in self.leases.items()}
        for _ in range(3):
            self.cycle(order, step)
            if not self.converged():
                raise self.fail(f"converged, then not: {self.holdings()}")
        after = {p: (lz.owner, lz.epoch) for p, lz in self.leases.items()}
        if after != before:
            raise self.fail("leases changed hands after convergence")

    def cycle(self, order: list[Instance], step: int) -> None:
        for inst in order:
            self.round(inst)
            self.check()
            self.advance(step)
            self.check()


Action = tuple[str, int, int]

skews = st.one_of(st.sampled_from([-MAX_SKEW, MAX_SKEW, 0]),  # the bounds, most of all
                  st.integers(-MAX_SKEW, MAX_SKEW))
who = st.integers(0, MAX_LIVE - 1)
steps = st.one_of(
    st.integers(0, 4 * TICKS_PER_S),                      # within a renewal period
    st.integers(int(TTL * (1 - MARGIN) - 1) * TICKS_PER_S,  # around the margin and the ttl
                int(TTL * (1 + MARGIN) + 1) * TICKS_PER_S),
    st.integers(0, 3 * int(TTL) * TICKS_PER_S),            # anything, beyond the ttl too
)
rounds = st.tuples(st.sampled_from(["round", "round", "begin", "finish"]), who, st.just(0))
actions: st.SearchStrategy[Action] = st.one_of(
    rounds,
    st.tuples(st.just("advance"), steps, st.just(0)),
    st.tuples(st.just("jump"), st.integers(0, 3), st.integers(-1, 1)),
    rounds,
    st.tuples(st.just("jump"), st.integers(0, 3), st.integers(-1, 1)),
    rounds,
    # a claim sent after another instance's round: the read-then-compare-and-set race
    st.tuples(st.just("overlap"), who, who),
    st.tuples(st.just("join"), skews, st.just(0)),
    st.tuples(st.just("leave"), who, st.just(0)),
    st.tuples(st.just("crash"), who, st.just(0)),
    st.tuples(st.just("skew"), who, skews),
    rounds,
)


def run(cluster: Cluster, script: list[Action]) -> None:
    for kind, a, b in script:
        if kind == "join":
            cluster.join(a)
        elif kind == "advance":
            cluster.advance(a)
        elif kind == "jump":
            cluster.jump(a, b)
        elif kind == "overlap":
            first, second = cluster.pick(a), cluster.pick(b)
            if first is None or second is None or first is second:
                continue
            cluster.begin(first)
            cluster.check()
            cluster.round(second)
            cluster.check()
            cluster.finish(first)
        else:
            inst = cluster.pick(a)
            if inst is None:
                continue
            if kind == "round":
                cluster.round(inst)
            elif kind == "begin":
                cluster.begin(inst)
            elif kind == "finish":
                cluster.finish(inst)
            elif kind == "leave":
                cluster.leave(inst)
            elif kind == "crash":
                cluster.crash(inst)
            elif kind == "skew":
                cluster.set_skew(inst, b)
        cluster.check()


@given(partitions=st.integers(1, 24),
       initial=st.lists(skews, min_size=1, max_size=MAX_LIVE),
       script=st.lists(actions, min_size=10, max_size=80),
       settle_step=st.integers(0, ROUND_PERIOD))
@settings(max_examples=examples(200), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
def test_model_safe_and_converges(partitions: int, initial: list[int], script: list[Action],
                                  settle_step: int) -> None:
    cluster = Cluster(partitions)
    for skew in initial:
        cluster.join(skew)
    cluster.check()
    run(cluster, script)
    cluster.settle(settle_step)


def test_model_takeover_at_the_exact_clock_bound() -> None:
    """The worst case the margin covers: the holder's clock 1 s behind, the claimer's 1 s
    ahead; the claim succeeds exactly when the holder stops counting the lease."""
    cluster = Cluster(1)
    cluster.join(-MAX_SKEW)
    cluster.join(+MAX_SKEW)
    holder, claimer = cluster.live["k0"], cluster.live["d1"]
    cluster.round(holder)
    assert holder.held == {0: valid_until(0.0, TTL, MARGIN)}
    cluster.crash(holder)  # or paused: it no longer renews
    cluster.advance(int(TTL * (1 - MARGIN) * TICKS_PER_S) - 1)
    cluster.round(claimer)
    assert claimer.held == {}  # still live on the claimer's clock
    cluster.advance(1)
    cluster.round(claimer)
    assert list(claimer.held) == [0]
    assert cluster.leases[0].owner == "d1" and cluster.leases[0].epoch == 2
    assert holder.held[0] <= cluster.mono  # the holder had stopped counting it just now
    cluster.check()


def test_model_a_paused_holder_cannot_extend_a_heartbeat_a_claimer_saw_expired() -> None:
    """The race of a claim sent after its read: the claimer reads the holder's heartbeat
    expired (its clock ahead), the holder (clock behind) tries to renew before the claim
    lands — the renewal is refused (less than the margin left on its own clock), so the
    holder lapses and rejoins under a new name holding nothing, and the claim succeeds."""
    cluster = Cluster(1)
    cluster.join(-MAX_SKEW)
    cluster.join(+MAX_SKEW)
    holder, claimer = cluster.live["k0"], cluster.live["d1"]
    cluster.round(holder)
    cluster.advance(int(TTL * (1 - MARGIN) * TICKS_PER_S))  # paused till its lease lapsed
    cluster.begin(claimer)  # reads the holder expired, wants partition 0
    assert cluster.live["d1"].pending is not None and claimer.pending is not None
    assert claimer.pending.claim == (0,)
    cluster.round(holder)  # renewal refused: lapsed, rejoins as k0#2
    assert holder.owner == "k0#2" and holder.held == {} and cluster.lapses == 1
    cluster.check()
    cluster.finish(claimer)
    assert list(claimer.held) == [0] and cluster.leases[0].owner == "d1"
    cluster.check()
    cluster.settle(40)


def test_without_the_renewal_margin_the_model_finds_two_holders() -> None:
    """The same race with a renewal that only asks for an unexpired heartbeat: the holder
    extends it after the claimer read it expired, and both hold the partition — the model
    would catch the margin's removal."""
    cluster = Cluster(2, renew_margin=0.0)
    cluster.join(-MAX_SKEW)
    cluster.join(+MAX_SKEW)
    holder, claimer = cluster.live["k0"], cluster.live["d1"]
    cluster.round(holder)
    cluster.advance(int(TTL * (1 - MARGIN) * TICKS_PER_S))
    cluster.begin(claimer)
    cluster.round(holder)  # renewed (no lapse without the margin); keeps its half
    assert holder.owner == "k0" and len(holder.held) == 1
    cluster.finish(claimer)
    with pytest.raises(ModelError, match=r"\(a\)"):
        cluster.check()


def test_model_join_leave_crash_scenario() -> None:
    cluster = Cluster(8)
    for skew in (0, 30, -50):
        cluster.join(skew)
    cluster.settle(40)
    assert sorted(len(i.held) for i in cluster.live.values()) == [2, 3, 3]
    cluster.join(10)
    cluster.settle(40)
    assert sorted(len(i.held) for i in cluster.live.values()) == [2, 2, 2, 2]
    first, second = list(cluster.live.values())[:2]
    cluster.leave(first)
    cluster.crash(second)
    cluster.check()
    cluster.settle(40)
    assert sorted(len(i.held) for i in cluster.live.values()) == [4, 4]
