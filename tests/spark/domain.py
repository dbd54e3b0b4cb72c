"""Aggregate types for the Spark pipeline tests (imported by the executors as
``tests.spark.domain``: the test session puts the repository on PYTHONPATH).

State carries an order-sensitive ``digest`` (a hash chain over applied message ids), so the
oracle comparison also checks that every aggregate saw its messages in the right order."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from aggregates import AggregateType, Emit, Handled, HighWater, Inbox, Message, Registry
from aggregates.core.errors import RetryableError


def chain(digest: str, message_id: str) -> str:
    return hashlib.sha1(f"{digest}|{message_id}".encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Account:
    owner: str = ""
    balance: int = 0
    count: int = 0
    digest: str = ""


@dataclass(frozen=True)
class Ledger:
    entries: int = 0
    last_seq: int = 0
    digest: str = ""


accounts = AggregateType("Account", state=Account, collection="accounts",
                         dedup=Inbox(window=10_000))
ledgers = AggregateType("Ledger", state=Ledger, collection="ledgers",
                        dedup=HighWater(mode="monotonic"))


@accounts.handles("Opened")
def opened(state: Account, msg: Message) -> Account:
    return replace(state, owner=str(msg.payload["owner"]), digest=chain(state.digest,
                                                                        msg.message_id))


@accounts.handles("Deposited")
def deposited(state: Account, msg: Message) -> Handled[Account]:
    amount = int(msg.payload["amount"])
    new = replace(state, balance=state.balance + amount, count=state.count + 1,
                  digest=chain(state.digest, msg.message_id))
    if amount >= 90:
        return new, [Emit("LargeDeposit", {"account": msg.aggregate_id, "amount": amount},
                          to=("Audit", "audit-1"))]
    return new


@accounts.handles("Flaky")
def flaky(state: Account, msg: Message) -> Account:
    """Fails on the first attempt of a Spark task (a transient error), works on the retry.
    Outside Spark (the oracle) it never fails."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() == 0:
        raise RetryableError(f"injected transient failure for {msg.message_id} "
                             f"(task {ctx.taskAttemptId()}, first attempt)")
    return replace(state, count=state.count + 1, digest=chain(state.digest, msg.message_id))


@accounts.handles("Unavailable")
def unavailable(state: Account, msg: Message) -> Account:
    """A dependency that stays down: every attempt fails, the Spark job fails."""
    raise RetryableError(f"downstream unavailable for {msg.message_id}")


@accounts.handles("Broken")
def broken(state: Account, msg: Message) -> Account:
    raise ValueError(f"handler bug on {msg.message_id}")


@accounts.handles("Misreturns")
def misreturns(state: Account, msg: Message) -> dict[str, int]:
    """Returns a dict instead of the state: dead-lettered ``invalid_handler_result``."""
    return {"balance": 1}


#: A module no environment has: a handler importing it was deployed without its dependency.
MISSING_MODULE = "aggbox_test_missing_helpers"


@accounts.handles("NeedsHelper")
def needs_helper(state: Account, msg: Message) -> Account:
    """Imports a helper package that was not shipped (issue 32): never dead-lettered, the
    Spark task fails."""
    import importlib

    importlib.import_module(MISSING_MODULE)
    return state


@ledgers.handles("Entry")
def entry(state: Ledger, msg: Message) -> Handled[Ledger]:
    assert msg.source is not None
    new = replace(state, entries=state.entries + 1, last_seq=msg.source.seq,
                  digest=chain(state.digest, msg.message_id))
    if msg.source.seq % 4 == 0:
        return new, [Emit("Checkpointed", {"seq": msg.source.seq}),
                     Emit("Audited", {"seq": msg.source.seq})]
    return new


registry = Registry([accounts, ledgers])
