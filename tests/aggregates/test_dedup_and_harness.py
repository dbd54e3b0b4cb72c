"""Pure logic: dedup decisions, outbox id derivation, the in-memory testing harness."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from aggregates import (
    AggboxError,
    AggregateType,
    ConfigurationError,
    Emit,
    HandlerError,
    HighWater,
    Inbox,
    Message,
    NoDedup,
    Registry,
    UnknownAggregateType,
    emitted_message_id,
)
from aggregates.core.ids import payload_hash, uuid5
from aggregates.dedup import (
    F_ARCHIVE_FLOOR,
    F_ARCHIVE_UNDATED,
    F_HW,
    F_INBOX,
    NO_CHANGES,
    DedupChanges,
    DedupRecord,
)
from aggregates.testing import AggregateHarness, message
from tests.aggregates.domain import counters, msg

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_emitted_ids_are_deterministic_and_distinct() -> None:
    a = emitted_message_id("Order", "o1", "m1", 0)
    assert a == emitted_message_id("Order", "o1", "m1", 0)
    others = {emitted_message_id(*k) for k in [("Order", "o1", "m1", 1), ("Order", "o2", "m1", 0),
                                                ("Order", "o1", "m2", 0), ("Orde", "ro1", "m1", 0)]}
    assert a not in others and len(others) == 4


@pytest.mark.parametrize("name", ["", "a", "Order/o-1/m-1/0", "ünïcødé/" * 20])
def test_fast_uuid5_equals_the_standard_one(name: str) -> None:
    ns = uuid.UUID("5b1f3c8e-9a47-5d0e-8c3b-2f6a9e41d7c0")
    assert uuid5(ns, name) == str(uuid.uuid5(ns, name))
    assert uuid5(uuid.NAMESPACE_DNS, name) == str(uuid.uuid5(uuid.NAMESPACE_DNS, name))


def test_payload_hash_ignores_key_order() -> None:
    assert payload_hash({"a": 1, "b": [1, 2]}) == payload_hash({"b": [1, 2], "a": 1})
    assert payload_hash({"a": 1}) != payload_hash({"a": 2})


def test_inbox_decisions() -> None:
    inbox = Inbox(window=2)
    rec = DedupRecord()
    now = T0.replace(hour=1)
    m1, m2, m3 = msg("m1"), msg("m2", at="2026-01-01T00:00:05Z"), msg("m3")
    assert inbox.decide(rec, m1, "h1", now).verdict == "apply"
    inbox.record(rec, m1, "h1")
    assert inbox.decide(rec, m1, "h1", now).verdict == "duplicate"
    assert inbox.decide(rec, m1, "h2", now).verdict == "dead_letter"
    inbox.record(rec, m2, "h")
    inbox.record(rec, m3, "h")
    # Three pending (unwritten) entries: none may leave before it is stored.
    assert rec.evict(inbox.window) == []
    rec.pending = 0  # as after the write
    assert [e[0] for e in rec.evict(inbox.window)] == ["m1"]
    assert rec.archive_floor == m1.occurred_at and rec.archived == {"m1": "h1"}
    assert [e[0] for e in rec.inbox] == ["m2", "m3"]
    # The evicted id is still known (archived by this process): a duplicate, not refused.
    assert inbox.decide(rec, m1, "h1", now).verdict == "duplicate"
    # An older, never-seen message needs the archive; without a lookup that is a bug.
    late = msg("m0", at="2025-12-31T23:00:00Z")
    with pytest.raises(AggboxError, match="archive"):
        inbox.decide(rec, late, "h", now)
    rec.looked_up({})  # the archive does not have it: new, within the horizon
    assert inbox.decide(rec, late, "h", now).verdict == "apply"
    # … unless it is older than the horizon (7 days by default).
    ancient = msg("m-old", at="2025-12-01T00:00:00Z")
    assert inbox.decide(rec, ancient, "h", now).reason == "beyond_dedup_horizon"


def test_high_water_decisions() -> None:
    rec = DedupRecord()
    mono, cont = HighWater(), HighWater(mode="contiguous")
    m = msg("s2", source=("Up", "u", 2))
    assert mono.decide(rec, m, "h", T0).verdict == "apply"
    assert cont.decide(rec, m, "h", T0).reason == "sequence_gap"
    assert mono.decide(rec, msg("x"), "h", T0).reason == "missing_source"
    mono.record(rec, m, "h")
    assert mono.decide(rec, msg("s1", source=("Up", "u", 1)), "h", T0).verdict == "duplicate"
    assert NoDedup().decide(rec, m, "h", T0).verdict == "apply"
    with pytest.raises(ConfigurationError):
        HighWater(mode="sometimes")  # type: ignore[arg-type]


def test_each_strategy_makes_its_own_part_of_the_write() -> None:
    """A strategy's ``changes`` is the dedup record's whole part of the conditional write:
    the fold and ``build_update`` know no strategy (docs/design.md "Dedup")."""
    inbox = Inbox(window=2)
    rec = DedupRecord(inbox=[["old1", T0, "h"], ["old2", None, "h"]])
    assert inbox.changes(rec) == NO_CHANGES  # nothing applied: nothing to write
    for m in (msg("m1"), msg("m2"), msg("m3")):
        inbox.record(rec, m, "h")
    ch = inbox.changes(rec)
    # The three new entries are pushed (none may leave before it is stored); the two old
    # ones leave the document with this write, archived before it.
    assert [e[0] for e in ch.push[F_INBOX]["$each"]] == ["m1", "m2", "m3"]
    assert ch.push[F_INBOX]["$slice"] == -3
    assert [e[0] for e in ch.archive] == ["old1", "old2"]
    assert ch.set == {F_ARCHIVE_FLOOR: T0, F_ARCHIVE_UNDATED: True}
    hw = HighWater()
    rec = DedupRecord(hw={"keep": 7})
    assert hw.changes(rec) == NO_CHANGES
    hw.record(rec, msg("s", source=("Up", "u", 3)), "")
    assert hw.changes(rec) == DedupChanges({f"{F_HW}.Up/u": 3})
    assert NoDedup().changes(DedupRecord()) == NO_CHANGES
    assert not NO_CHANGES and hw.archive(None, "c") is None  # type: ignore[arg-type]
    assert (Inbox().duplicate_means_applied, hw.duplicate_means_applied) == (True, False)


def test_registry_errors_say_what_to_do() -> None:
    reg = Registry([counters])
    with pytest.raises(UnknownAggregateType) as info:
        reg.get("Nope")
    assert "registered types: ['Counter']" in str(info.value)
    with pytest.raises(ConfigurationError, match="already has a handler"):
        counters.handles("Add")(lambda s, m: s)
    with pytest.raises(ConfigurationError, match="registered twice"):
        reg.register(AggregateType("Counter", state=dict))
    with pytest.raises(ConfigurationError, match="share the collection 'counters'"):
        reg.register(AggregateType("Tally", state=dict, collection="counters"))


# -- the harness ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Account:
    balance: int = 0


accounts = AggregateType("Account", state=Account)


@accounts.handles("Deposited")
def deposited(state: Account, m: Message) -> Account:
    return replace(state, balance=state.balance + m.payload["amount"])


@accounts.handles("Withdrawn")
def withdrawn(state: Account, m: Message) -> tuple[Account, list[Emit]]:
    amount = m.payload["amount"]
    if amount > state.balance:
        return state, [Emit("WithdrawalRefused", {"amount": amount})]
    return replace(state, balance=state.balance - amount), []


def test_harness_given_when_then() -> None:
    h = AggregateHarness(accounts, aggregate_id="acc-1")
    h.given(message("Deposited", {"amount": 50}, to=accounts, id="acc-1"))
    refused = message("Withdrawn", {"amount": 80}, to=accounts, id="acc-1")
    step = h.when(refused)
    assert step.outcome == "applied"
    assert step.emitted_types == ["WithdrawalRefused"]
    assert step.emitted[0]["id"] == emitted_message_id("Account", "acc-1", refused.message_id, 0)
    assert h.state.balance == 50
    assert h.when(refused).outcome == "duplicate"  # same rules as the real writer
    assert [e["type"] for e in h.dispatch()] == ["WithdrawalRefused"]
    assert h.version == 2


def test_harness_catches_impure_handlers() -> None:
    counter = {"n": 0}
    impure = AggregateType("Impure", state=dict)

    @impure.handles("Tick")
    def tick(state: dict[str, int], m: Message) -> dict[str, int]:
        counter["n"] += 1
        return {"n": counter["n"]}  # depends on outside state: not deterministic

    h = AggregateHarness(impure)
    with pytest.raises(HandlerError, match="not deterministic"):
        h.when(message("Tick", to=impure, id="test-1"))

    mutating = AggregateType("Mutating", state=dict)

    @mutating.handles("Tick")
    def mutate(state: dict[str, int], m: Message) -> dict[str, int]:
        state["n"] = state.get("n", 0) + 1
        return state

    h2 = AggregateHarness(mutating)
    h2.snapshot.state = {"n": 1}
    with pytest.raises(HandlerError, match="mutated"):
        h2.when(message("Tick", to=mutating, id="test-1"))


def test_harness_given_fails_loudly() -> None:
    h = AggregateHarness(accounts, aggregate_id="acc-1")
    with pytest.raises(Exception, match="was dead_lettered"):
        h.given(message("Nope", to=accounts, id="acc-1"))


def test_write_concern_errors_fail_the_batch() -> None:
    """A write-concern error means the write may not be durable: never count it as done."""
    from pymongo.errors import BulkWriteError

    from aggregates import StoreError
    from aggregates.core.bulk import bulk_write_unordered

    class FakeColl:
        name = "fake"

        def bulk_write(self, ops: Any, ordered: bool) -> None:
            raise BulkWriteError({"writeErrors": [], "writeConcernErrors": [
                {"code": 64, "errmsg": "waiting for replication timed out"}],
                "errorLabels": ["RetryableWriteError"]})

    with pytest.raises(StoreError, match=r"write concern not satisfied.*replication timed out"
                       ) as info:
        bulk_write_unordered(FakeColl(), [object()])  # type: ignore[arg-type,list-item]
    # The server's code and labels are kept, not flattened into the text.
    assert info.value.code == 64
    assert info.value.labels == frozenset({"RetryableWriteError"})
    assert isinstance(info.value.__cause__, BulkWriteError)


def test_store_error_survives_pickling_with_code_and_labels() -> None:
    import pickle

    from aggregates import StoreError

    err = pickle.loads(pickle.dumps(StoreError("x", code=91, labels={"RetryableWriteError"})))
    assert (str(err), err.code, err.labels) == ("x", 91, frozenset({"RetryableWriteError"}))


def _flaky_bulk(db: Any, collection: str, *, code: int, times: int) -> list[int]:
    """Make ``collection``'s next ``times`` bulk writes fail at op 0 with ``code`` (and
    apply nothing); returns the list the calls are counted in."""
    from pymongo.errors import BulkWriteError

    coll = db[collection]
    real = coll.bulk_write
    calls: list[int] = []

    def flaky(requests: Any, ordered: bool = True, **kw: Any) -> Any:
        calls.append(len(requests))
        if len(calls) <= times:
            raise BulkWriteError({"writeErrors": [{"index": 0, "code": code,
                                                   "errmsg": "shutdown in progress"}],
                                  "writeConcernErrors": []})
        return real(requests, ordered=ordered, **kw)

    coll.bulk_write = flaky
    return calls


def test_transient_write_errors_are_retried_after_a_re_read() -> None:
    """A write error the server's code calls transient (91 ShutdownInProgress) did not
    apply: the writer re-reads, folds again and writes, after a backoff."""
    from aggregates.testing import memory_database
    from tests.aggregates.contract import msg, writer

    db = memory_database()
    sleeps: list[float] = []
    w = writer(db)
    w.sleep = sleeps.append
    calls = _flaky_bulk(db, "counters", code=91, times=2)
    out = w.process([msg("m1", 1), msg("m2", 2)])
    assert [o.outcome for o in out] == ["applied", "applied"]
    assert len(calls) == 3 and len(sleeps) == 2
    assert w.stats.conflicts == 0
    assert db.counters.find_one()["state"]["total"] == 3


def test_transient_write_errors_that_persist_fail_the_batch_with_their_code() -> None:
    from aggregates import StoreError
    from aggregates.testing import memory_database
    from tests.aggregates.contract import msg, writer

    db = memory_database()
    w = writer(db, max_conflict_retries=2)
    calls = _flaky_bulk(db, "counters", code=91, times=100)
    with pytest.raises(StoreError) as info:
        w.process([msg("m1", 1)])
    assert info.value.code == 91 and len(calls) == 3


def test_other_write_errors_fail_the_batch_at_once() -> None:
    from aggregates import StoreError
    from aggregates.testing import memory_database
    from tests.aggregates.contract import msg, writer

    db = memory_database()
    w = writer(db)
    calls = _flaky_bulk(db, "counters", code=13, times=100)  # Unauthorized
    with pytest.raises(StoreError) as info:
        w.process([msg("m1", 1)])
    assert info.value.code == 13 and len(calls) == 1
