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
``idempotent=True``), ``pays_twice`` (pays on every call, no query function),
``wrong_key_query`` (pays on every call; its query looks the payment up by the transfer id,
while payments are kept by idempotency key, so it never finds one — and the ``Paid``
handler ignores the receipt, so the final states agree) or ``claims_idempotent`` (pays on
every call but is declared ``idempotent=True``: out of the check's reach by design).

``ledger(bug)`` (issue 43): accounts that opted out of dedup (``NoDedup``) because every
handler is idempotent by itself — it keeps the ids (and months) it applied — with a monthly
fee timer that schedules the next month. Bugs: ``quarter_fee`` — the third firing (the
quarter's end) of a business account (the flow has one of 24) charges a statement fee
without looking at the months already charged;
``priority`` — a priority transfer (the flow has one: #431 of 450) takes a path that does
not record its id.
``watch`` / ``watch_sorted`` (module-level, for the hash-seed subprocesses): an account
opening announces its watchers in the order of a ``set`` of strings (or sorted).
``stamped`` / ``stamp_flow``: a deterministic handler that keeps ``msg.occurred_at``, fed
messages built without ids or times."""

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
_paid_keys: set[str] = set()


def pay_effects(bug: str = "") -> Effects:
    effects = Effects()

    @effects.effect("Pay", on_success="Paid", on_failure="PayFailed", max_attempts=3,
                    idempotent=bug in ("", "claims_idempotent"))
    def pay(call: EffectCall) -> dict[str, Any]:
        if bug or call.idempotency_key not in _paid_keys:
            _paid_keys.add(call.idempotency_key)
            payments.append((call.idempotency_key, int(call.payload["amount"])))
        return {"ok": True, "receipt": f"r-{call.idempotency_key[:8]}"}

    if bug == "wrong_key_query":
        @effects.query("Pay")
        def find(call: EffectCall) -> dict[str, Any] | None:
            wrong = str(call.payload["transfer_id"])  # the bug: payments are kept by key
            if wrong in _paid_keys:
                return {"ok": True, "receipt": f"r-{wrong}"}
            return None

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


#: The counter bug at module level (for the hash-seed subprocesses).
counting = bank("counter")


def payout_flow(sc: Scenario) -> None:
    bank_flow(sc, payout=True)


def fee_flow(sc: Scenario) -> None:
    """A few transfers, then a month: every account's ``MonthlyFee`` timer fires."""
    bank_flow(sc, accounts=4, transfers=8)
    sc.advance(timedelta(days=31))


# -- a ledger without dedup: idempotent handlers, one path that is not (issue 43) ----------


@dataclass(frozen=True)
class Ledger:
    opened: bool = False
    balance: int = 0
    debited: tuple[str, ...] = ()
    credited: tuple[str, ...] = ()
    months: tuple[int, ...] = ()
    plan: str = ""


def ledger(bug: str = "") -> Registry:
    accounts = AggregateType("Account", state=Ledger, collection="ledger", dedup=NoDedup())

    def next_fee(month: int) -> Schedule:
        return Schedule(Emit("MonthlyFee", {"month": month, "fee": 1}), key="fee",
                        after=timedelta(days=30))

    @accounts.handles("OpenAccount")
    def open_account(state: Ledger, msg: Message) -> Handled[Ledger]:
        if state.opened:
            return state
        return replace(state, opened=True, balance=int(msg.payload["balance"]),
                       plan=str(msg.payload.get("plan", ""))), [next_fee(1)]

    @accounts.handles("MonthlyFee")
    def fee(state: Ledger, msg: Message) -> Handled[Ledger]:
        month, charge = int(msg.payload["month"]), int(msg.payload["fee"])
        if bug == "quarter_fee" and month % 3 == 0 and state.plan == "business":
            charge += 2  # the quarter's statement fee; the bug: no look at the months charged
        elif month in state.months:
            return state
        return replace(state, balance=state.balance - charge,
                       months=(*state.months, month)), [next_fee(month + 1)]

    @accounts.handles("TransferRequested")
    def transfer(state: Ledger, msg: Message) -> Handled[Ledger]:
        p = msg.payload
        tid, amount = str(p["transfer_id"]), int(p["amount"])
        if bug == "priority" and p.get("priority"):  # the bug: the id is not recorded
            new = replace(state, balance=state.balance - amount)
        elif tid in state.debited or state.balance < amount:
            return state
        else:
            new = replace(state, balance=state.balance - amount, debited=(*state.debited, tid))
        return new, [Emit("CreditRequested", {"transfer_id": tid, "amount": amount},
                          to=accounts.ref(str(p["to"])))]

    @accounts.handles("CreditRequested")
    def credit(state: Ledger, msg: Message) -> Ledger:
        tid = str(msg.payload["transfer_id"])
        if tid in state.credited:
            return state
        # sorted: credits come from many senders, in no promised order
        return replace(state, balance=state.balance + int(msg.payload["amount"]),
                       credited=tuple(sorted((*state.credited, tid))))

    return Registry([accounts])


def ledger_flow(sc: Scenario, *, accounts: int = 50, transfers: int = 450,
                priority: int | None = 430, business: int | None = None,
                months: int = 0) -> None:
    """``accounts`` accounts opened (100 each; the ``business``-th a business account),
    ``transfers`` transfers among them (the ``priority``-th, from 0, a priority one), then
    ``months`` months of fees."""
    atype = sc.registry.get("Account")
    sc.given(*(message("OpenAccount", {"balance": 100, "plan": "business" if i == business
                                       else "personal"},
                       to=atype, id=f"a-{i:02}", message_id=f"open-{i}")
               for i in range(accounts)))
    sc.when(*(message("TransferRequested",
                      {"transfer_id": f"t-{k}", "amount": 5 + k % 4,
                       "to": f"a-{(k + 1 + k % (accounts - 1)) % accounts:02}",
                       "priority": k == priority},
                      to=atype, id=f"a-{k % accounts:02}", message_id=f"tr-{k}")
              for k in range(transfers)))
    for _ in range(months):
        sc.advance(timedelta(days=31))


def quarter_flow(sc: Scenario) -> None:
    """24 accounts (a-11 a business account), 60 transfers, then three months: 72 fee
    firings, the third of each account's at the quarter's end."""
    ledger_flow(sc, accounts=24, transfers=60, priority=None, business=11, months=3)


# -- a handler that keeps msg.occurred_at (deterministic: the false positive of issue 43) --


@dataclass(frozen=True)
class Notes:
    seen: tuple[str, ...] = ()


def _stamped() -> Registry:
    notes = AggregateType("Note", state=Notes, collection="notes")

    @notes.handles("Noted")
    def noted(state: Notes, msg: Message) -> Notes:
        return replace(state, seen=(*state.seen, str(msg.occurred_at)))

    return Registry([notes])


stamped = _stamped()


def stamp_flow(sc: Scenario) -> None:
    """Four notes built without ids or times (message() numbers them)."""
    sc.when(*(message("Noted", {}, to=sc.registry.get("Note"), id=f"n-{i % 2}")
              for i in range(4)))


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
