"""A domain whose handlers publish events — untargeted emits, ``aggbox-kind: event`` — for
the event feedback tests (tests/spark/test_event_feedback.py; imported by Spark executors
and by the dispatcher as ``tests.spark.eventdomain``).

``Deposit`` publishes ``Deposited`` (no aggregate type here handles it) and ``Rewarded``
(``Wallet`` itself handles it, when it is addressed input)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from aggregates import AggregateType, Emit, Handled, Message, Registry


@dataclass(frozen=True)
class Wallet:
    balance: int = 0
    rewards: int = 0


wallets = AggregateType("Wallet", state=Wallet, collection="event_wallets")


@wallets.handles("Deposit")
def deposit(state: Wallet, msg: Message) -> Handled[Wallet]:
    amount = int(msg.payload["amount"])
    return replace(state, balance=state.balance + amount), [
        Emit("Deposited", {"amount": amount}), Emit("Rewarded", {"points": 1})]


@wallets.handles("Rewarded")
def rewarded(state: Wallet, msg: Message) -> Wallet:
    return replace(state, rewards=state.rewards + int(msg.payload["points"]))


registry = Registry([wallets])
