"""The OLD definitions of tests/aggregates/test_evolving.py: an order whose state and
``PlaceOrder`` payload are at version 1 (``registry``, for the pipeline's --aggregates)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from aggregates import AggregateType, Emit, Handled, Message, Registry


@dataclass(frozen=True)
class Order:
    customer: str = ""  # v2: renamed customer_id
    address: str = ""  # v2: split into street and city ("street, city")
    total: int = 0
    lines: int = 0


orders = AggregateType("Order", state=Order, collection="orders")


@orders.handles("PlaceOrder")
def place(state: Order, msg: Message) -> Handled[Order]:
    p: dict[str, Any] = msg.payload
    new = replace(state, customer=p["customer"], address=p["address"])
    return new, [Emit("OrderPlaced", {"customer": p["customer"]})]


@orders.handles("AddLine")
def add_line(state: Order, msg: Message) -> Handled[Order]:
    amount = int(msg.payload["amount"])
    new = replace(state, total=state.total + amount, lines=state.lines + 1)
    return new, [Emit("LineAdded", {"amount": amount})]


registry = Registry([orders])
