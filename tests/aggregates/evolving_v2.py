"""The NEW definitions of tests/aggregates/test_evolving.py: the order state at version 3
(``customer`` renamed ``customer_id``, ``address`` split into ``street`` and ``city``, a new
required ``currency``) and ``PlaceOrder`` at version 2 (a typed payload with an upcaster).
``AddLine`` is unchanged (version 1, untyped)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from aggregates import AggregateType, Emit, Handled, Message, Registry


@dataclass(frozen=True)
class Order:
    currency: str  # new, required: state migration 2 → 3 sets it
    customer_id: str = ""
    street: str = ""
    city: str = ""
    total: int = 0
    lines: int = 0


def new_order() -> Order:
    return Order(currency="EUR")


class PlaceOrder(BaseModel):  # version 2
    customer_id: str
    street: str
    city: str
    currency: str


orders = AggregateType("Order", state=new_order, collection="orders", state_version=3)


@orders.upcaster("PlaceOrder", from_version=1)
def place_order_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    street, city = payload.pop("address").split(", ")  # no ", ": raises → upcast_failed
    payload["customer_id"] = payload.pop("customer")
    return {**payload, "street": street, "city": city, "currency": "EUR"}


@orders.state_migration(from_version=1)
def rename_and_split(doc: dict[str, Any]) -> dict[str, Any]:
    street, _, city = doc.pop("address").partition(", ")  # no address: raises
    doc["customer_id"] = doc.pop("customer")
    return {**doc, "street": street, "city": city}


@orders.state_migration(from_version=2)
def add_currency(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "currency": "EUR"}


@orders.handles(PlaceOrder)
def place(state: Order, p: PlaceOrder, msg: Message) -> Handled[Order]:
    new = replace(state, customer_id=p.customer_id, street=p.street, city=p.city,
                  currency=p.currency)
    return new, [Emit("OrderPlaced", {"customer_id": p.customer_id})]


@orders.handles("AddLine")
def add_line(state: Order, msg: Message) -> Handled[Order]:
    amount = int(msg.payload["amount"])
    new = replace(state, total=state.total + amount, lines=state.lines + 1)
    return new, [Emit("LineAdded", {"amount": amount})]


registry = Registry([orders])
