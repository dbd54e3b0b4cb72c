"""A bank-transfer domain for the feedback test (imported by Spark executors and by the
dispatcher as ``tests.spark.bank``): a transfer debits the payer and emits a credit to the
payee; money is conserved only if every credit is applied exactly once.

The inbox window is tiny on purpose: every payee receives far more credits than it keeps
ids, from many payers whose write times interleave (docs/design.md "Dedup")."""

from __future__ import annotations

from dataclasses import dataclass, replace

from aggregates import AggregateType, Emit, Handled, Inbox, Message, Registry


@dataclass(frozen=True)
class BankAccount:
    balance: int = 0
    credits: int = 0
    debits: int = 0


accounts = AggregateType("BankAccount", state=BankAccount, collection="bank_accounts",
                         dedup=Inbox(window=3))


@accounts.handles("Opened")
def opened(state: BankAccount, msg: Message) -> BankAccount:
    return replace(state, balance=state.balance + int(msg.payload["initial"]))


@accounts.handles("TransferRequested")
def transfer(state: BankAccount, msg: Message) -> Handled[BankAccount]:
    amount, payee = int(msg.payload["amount"]), str(msg.payload["payee"])
    return replace(state, balance=state.balance - amount, debits=state.debits + 1), [
        Emit("CreditRequested", {"amount": amount, "transfer": msg.message_id},
             to=("BankAccount", payee))]


@accounts.handles("CreditRequested")
def credit(state: BankAccount, msg: Message) -> BankAccount:
    return replace(state, balance=state.balance + int(msg.payload["amount"]),
                   credits=state.credits + 1)


registry = Registry([accounts])
