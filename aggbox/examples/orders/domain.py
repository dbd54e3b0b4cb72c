"""Customers with credit limits; orders that reserve credit.

    PlaceOrder ─▶ Order (pending) ──OrderCreated──▶ Customer
                                                       │ reserves credit
    Order (approved | rejected) ◀─ CreditReserved | CreditLimitExceeded

The handlers are typed (``@orders.handles(PlaceOrder)``: the payload arrives validated as a
``PlaceOrder``, and emits carry payload objects addressed with ``orders.ref(...)``), except
``register``, which is kept untyped on purpose to show that style: it reads
``msg.payload``, a dict.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from aggregates import AggregateType, Emit, Handled, HighWater, Inbox, Message, Registry


@dataclass(frozen=True)
class Customer:
    name: str = ""
    credit_limit: int = 0
    reserved: int = 0


@dataclass(frozen=True)
class Order:
    customer_id: str = ""
    amount: int = 0
    status: str = "new"  # new → pending → approved | rejected


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
    return (replace(state, customer_id=order.customer_id, amount=order.amount, status="pending"),
            [Emit(created, to=customers.ref(order.customer_id))])


@orders.handles(CreditReserved)
def approve(state: Order, reply: CreditReserved, msg: Message) -> Order:
    return replace(state, status="approved")


@orders.handles(CreditLimitExceeded)
def reject(state: Order, reply: CreditLimitExceeded, msg: Message) -> Order:
    return replace(state, status="rejected")


registry = Registry([customers, orders])
