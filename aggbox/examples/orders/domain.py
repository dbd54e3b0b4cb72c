"""Customers with credit limits; orders that reserve credit.

    PlaceOrder ─▶ Order (pending) ──OrderCreated──▶ Customer
                   │                                   │ reserves credit
                   │ timer "credit", 30 min            │
                   │                                   ▼
                   │   Order (approved | rejected) ◀─ CreditReserved | CreditLimitExceeded
                   │                                  (the timer is cancelled)
                   ▼
    CreditDeadline ─▶ Order (cancelled), if still pending

A placed order waits for the customer's credit answer at most 30 minutes: ``place``
schedules a ``CreditDeadline`` for the order itself (timer key ``credit``), ``approve`` and
``reject`` cancel it. If the deadline comes first, the still-pending order is cancelled; a
deadline that finds the order answered changes nothing. An answer that arrives after the
cancellation does not revive the order: it stays ``cancelled`` (the credit a late
``CreditReserved`` stands for stays reserved — releasing it would be a message to the
customer, which this small domain leaves out).

The handlers are typed (``@orders.handles(PlaceOrder)``: the payload arrives validated as a
``PlaceOrder``, and emits carry payload objects addressed with ``orders.ref(...)``), except
``register``, which is kept untyped on purpose to show that style: it reads
``msg.payload``, a dict.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Final

from aggregates import (
    AggregateType,
    Cancel,
    Emit,
    Handled,
    HighWater,
    Inbox,
    Message,
    Registry,
    Schedule,
)

#: How long a placed order waits for the customer's credit answer.
CREDIT_DEADLINE: Final = timedelta(minutes=30)


@dataclass(frozen=True)
class Customer:
    name: str = ""
    credit_limit: int = 0
    reserved: int = 0


@dataclass(frozen=True)
class Order:
    customer_id: str = ""
    amount: int = 0
    status: str = "new"  # new → pending → approved | rejected | cancelled


# Message payloads (the message type is the class name).


@dataclass(frozen=True)
class PlaceOrder:
    customer_id: str
    amount: int


@dataclass(frozen=True)
class OrderCreated:
    order_id: str
    amount: int


@dataclass(frozen=True)
class CreditReserved:
    order_id: str
    customer_id: str
    amount: int


@dataclass(frozen=True)
class CreditLimitExceeded:
    order_id: str
    customer_id: str
    amount: int


@dataclass(frozen=True)
class CreditDeadline:
    """The order's timer ``credit``: the credit answer did not come in time."""

    order_id: str


customers = AggregateType("Customer", state=Customer, collection="customers",
                          dedup=Inbox(window=1000))
orders = AggregateType("Order", state=Order, collection="orders",
                       dedup=HighWater(mode="monotonic"))


@customers.handles("CustomerRegistered")  # untyped on purpose: msg.payload is a dict
def register(state: Customer, msg: Message) -> Customer:
    return replace(state, name=msg.payload["name"], credit_limit=int(msg.payload["credit_limit"]))


@customers.handles(OrderCreated)
def reserve_credit(state: Customer, created: OrderCreated, msg: Message) -> Handled[Customer]:
    order = orders.ref(created.order_id)
    if state.reserved + created.amount > state.credit_limit:
        exceeded = CreditLimitExceeded(created.order_id, msg.aggregate_id, created.amount)
        return state, [Emit(exceeded, to=order)]
    reserved = CreditReserved(created.order_id, msg.aggregate_id, created.amount)
    return replace(state, reserved=state.reserved + created.amount), [Emit(reserved, to=order)]


@orders.handles(PlaceOrder)
def place(state: Order, order: PlaceOrder, msg: Message) -> Handled[Order]:
    if order.amount <= 0:
        raise ValueError(f"order amount must be positive, got {order.amount}")
    created = OrderCreated(order_id=msg.aggregate_id, amount=order.amount)
    deadline = CreditDeadline(order_id=msg.aggregate_id)  # to the order itself
    # The ignores: ``Handled`` lists only ``Emit`` so far, not ``Schedule`` and ``Cancel``.
    return (replace(state, customer_id=order.customer_id, amount=order.amount, status="pending"),
            [Emit(created, to=customers.ref(order.customer_id)),
             Schedule(Emit(deadline), key="credit", after=CREDIT_DEADLINE)])


def _answer(state: Order, status: str) -> Order:
    """The order with the credit answer's ``status`` — unless the deadline cancelled it
    first: a late answer does not revive it."""
    return state if state.status == "cancelled" else replace(state, status=status)


@orders.handles(CreditReserved)
def approve(state: Order, reply: CreditReserved, msg: Message) -> Handled[Order]:
    return _answer(state, "approved"), [Cancel("credit")]


@orders.handles(CreditLimitExceeded)
def reject(state: Order, reply: CreditLimitExceeded, msg: Message) -> Handled[Order]:
    return _answer(state, "rejected"), [Cancel("credit")]


@orders.handles(CreditDeadline)
def expire(state: Order, deadline: CreditDeadline, msg: Message) -> Order:
    return replace(state, status="cancelled") if state.status == "pending" else state


registry = Registry([customers, orders])
