"""A bank for the planted-bug tests of check_fault_tolerance (tests/aggregates/
test_scenario_planted.py, issue 33): accounts opened with a balance (and a monthly fee
timer), transfers debited on the source account (idempotent: the transfer ids are kept)
and credited on the target by a ``CreditRequested`` message, payouts through a ``Pay``
effect.

``bank(bug)`` builds the registry with one planted bug (``""``: none):

- ``double_credit`` — ``NoDedup`` and a credit that adds on every delivery;
- ``uuid`` / ``counter`` / ``clock`` — the debit stamps the account with ``uuid4()``, a
  global counter or the wall clock;
- ``mutate`` — the debit appends to the old state's list in place (``replace`` copies the
  list's reference only).

``pay_effects(bug)``: the ``Pay`` effect, safe (``""``: the bank honours the idempotency key,
``idempotent=True``) or ``pays_twice`` (pays on every call, no query function).
``watch`` / ``watch_sorted`` (module-level, for the hash-seed subprocesses): an account
opening announces its watchers in the order of a ``set`` of strings (or sorted)."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from aggregates import (
    AggregateType,
    EffectCall,
    Effects,
    Emit,
    Handled,
    Message,
    NoDedup,
    Registry,
    Schedule,
)
from aggregates.testing import Scenario, message


@dataclass(frozen=True)
class Account:
    opened: bool = False
    balance: int = 0
    debited: tuple[str, ...] = ()
    stamp: str = ""
    paid: int = 0
    log: list[str] = field(default_factory=list)


_counter = itertools.count(1)


def bank(bug: str = "") -> Registry:
    accounts = AggregateType("Account", state=Account, collection="accounts",
                             dedup=NoDedup() if bug == "double_credit" else None)

    @accounts.handles("OpenAccount")
    def open_account(state: Account, msg: Message) -> Handled[Account]:
        if state.opened:
            return state
        return replace(state, opened=True, balance=int(msg.payload["balance"])), [
            Schedule(Emit("MonthlyFee", {"fee": 1}), key="fee", after=timedelta(days=30))]

    @accounts.handles("MonthlyFee")
    def fee(state: Account, msg: Message) -> Account:
        return replace(state, balance=state.balance - int(msg.payload["fee"]))

    @accounts.handles("TransferRequested")
    def transfer(state: Account, msg: Message) -> Handled[Account]:
        p = msg.payload
        tid, amount = str(p["transfer_id"]), int(p["amount"])
        if tid in state.debited or state.balance < amount:
            return state
        stamp = {"uuid": lambda: str(uuid.uuid4()), "counter": lambda: str(next(_counter)),
                 "clock": lambda: datetime.now(UTC).isoformat()}.get(bug, lambda: tid)()
        log = state.log
        if bug == "mutate":
            log.append(tid)  # the bug: the previous state's list changes too
        else:
            log = [*log, tid]
        new = replace(state, balance=state.balance - amount, debited=(*state.debited, tid),
                      stamp=stamp, log=log)
        emits = [Emit("CreditRequested", {"transfer_id": tid, "amount": amount},
                      to=accounts.ref(str(p["to"])))]
        if p.get("payout"):
            emits.append(Emit("Pay", {"transfer_id": tid, "amount": amount}))
        return new, emits

    @accounts.handles("CreditRequested")
    def credit(state: Account, msg: Message) -> Account:
        return replace(state, balance=state.balance + int(msg.payload["amount"]))

    @accounts.handles("Paid")
    def paid(state: Account, msg: Message) -> Account:
        return replace(state, paid=state.paid + 1)

    @accounts.handles("PayFailed")
    def not_paid(state: Account, msg: Message) -> Account:
        return state

    return Registry([accounts])


#: What the payout service paid: (idempotency key, amount), one per payment made.
payments: list[tuple[str, int]] = []


def pay_effects(bug: str = "") -> Effects:
    effects = Effects()

    @effects.effect("Pay", on_success="Paid", on_failure="PayFailed", max_attempts=3,
                    idempotent=bug != "pays_twice")
    def pay(call: EffectCall) -> dict[str, Any]:
        if bug == "pays_twice" or all(k != call.idempotency_key for k, _ in payments):
            payments.append((call.idempotency_key, int(call.payload["amount"])))
        return {"ok": True}

    return effects


def bank_flow(sc: Scenario, *, accounts: int = 12, transfers: int = 30,
              payout: bool = False) -> None:
    """``accounts`` accounts opened (100 each) first, then ``transfers`` transfers among
    them (every third a payout, if ``payout``)."""
    atype = sc.registry.get("Account")
    sc.given(*(message("OpenAccount", {"balance": 100}, to=atype, id=f"a-{i:02}",
                       message_id=f"open-{i}") for i in range(accounts)))
    sc.when(*(message("TransferRequested",
                      {"transfer_id": f"t-{k}", "amount": 5 + k % 4,
                       "to": f"a-{(k + 1 + k % (accounts - 1)) % accounts:02}",
                       "payout": payout and k % 3 == 0},
                      to=atype, id=f"a-{k % accounts:02}", message_id=f"tr-{k}")
              for k in range(transfers)))


def payout_flow(sc: Scenario) -> None:
    bank_flow(sc, payout=True)


def fee_flow(sc: Scenario) -> None:
    """A few transfers, then a month: every account's ``MonthlyFee`` timer fires."""
    bank_flow(sc, accounts=4, transfers=8)
    sc.advance(timedelta(days=31))


# -- string-set order ----------------------------------------------------------------------


@dataclass(frozen=True)
class Board:
    names: tuple[str, ...] = ()


def _watch(ordered: bool) -> Registry:
    teams = AggregateType("Team", state=Board, collection="teams")
    boards = AggregateType("Board", state=Board, collection="boards")

    @teams.handles("Announce")
    def announce(state: Board, msg: Message) -> Handled[Board]:
        members = set(msg.payload["members"])
        order = sorted(members) if ordered else members  # the bug: a set's order
        return state, [Emit("Watch", {"name": m}, to=boards.ref("b-1")) for m in order]

    @boards.handles("Watch")
    def watch_(state: Board, msg: Message) -> Board:
        return replace(state, names=(*state.names, str(msg.payload["name"])))

    return Registry([teams, boards])


watch = _watch(ordered=False)
watch_sorted = _watch(ordered=True)


def watch_flow(sc: Scenario) -> None:
    sc.when(message("Announce", {"members": ["ada", "bo", "cy", "dee", "eve", "fay"]},
                    to=sc.registry.get("Team"), id="team-1", message_id="announce-1"))
