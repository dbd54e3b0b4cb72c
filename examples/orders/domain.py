"""Customers with credit limits; orders that reserve credit.

    PlaceOrder ─▶ Order (pending) ──OrderCreated──▶ Customer
                                                       │ reserves credit
    Order (approved | rejected) ◀─ CreditReserved | CreditLimitExceeded
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


customers = AggregateType("Customer", state=Customer, collection="customers",
                          dedup=Inbox(window=1000))
orders = AggregateType("Order", state=Order, collection="orders",
                       dedup=HighWater(mode="monotonic"))


@customers.handles("CustomerRegistered")
def register(state: Customer, msg: Message) -> Customer:
    return replace(state, name=msg.payload["name"], credit_limit=int(msg.payload["credit_limit"]))


@customers.handles("OrderCreated")
def reserve_credit(state: Customer, msg: Message) -> Handled[Customer]:
    order_id, amount = msg.payload["order_id"], int(msg.payload["amount"])
    reply = {"order_id": order_id, "customer_id": msg.aggregate_id, "amount": amount}
    if state.reserved + amount > state.credit_limit:
        return state, [Emit("CreditLimitExceeded", reply, to=("Order", order_id))]
    return (replace(state, reserved=state.reserved + amount),
            [Emit("CreditReserved", reply, to=("Order", order_id))])


@orders.handles("PlaceOrder")
def place(state: Order, msg: Message) -> Handled[Order]:
    customer_id, amount = msg.payload["customer_id"], int(msg.payload["amount"])
    if amount <= 0:
        raise ValueError(f"order amount must be positive, got {amount}")
    created = {"order_id": msg.aggregate_id, "amount": amount}
    return (replace(state, customer_id=customer_id, amount=amount, status="pending"),
            [Emit("OrderCreated", created, to=("Customer", customer_id))])


@orders.handles("CreditReserved")
def approve(state: Order, msg: Message) -> Order:
    return replace(state, status="approved")


@orders.handles("CreditLimitExceeded")
def reject(state: Order, msg: Message) -> Order:
    return replace(state, status="rejected")


registry = Registry([customers, orders])
