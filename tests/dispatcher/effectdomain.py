"""A small order domain with side effects, for the effect runner's tests: ``PlaceOrder``
makes an order emit a ``BookShipment`` effect entry (unless ``ship`` is false; and, when
asked, an ordinary ``Placed`` event after it and a ``SendConfirmation`` e-mail effect); the
results come back as
``ShipmentBooked`` / ``ShipmentFailed`` and ``ConfirmationSent`` / ``ConfirmationFailed``.
The state counts every result it applies, so a test sees "exactly one result applied".

Two aggregate types with the same handlers: ``Order`` (inbox dedup) and ``HwOrder``
(high-water dedup: replies carry their own source, docs/design.md "Side effects")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from aggregates import AggregateType, Emit, Handled, HighWater, Inbox, Message, Registry


@dataclass(frozen=True)
class Order:
    status: str = "new"
    tracking: str = ""
    failure: str = ""
    results: int = 0
    mails: int = 0


orders: AggregateType[Order] = AggregateType("Order", state=Order, collection="eorders",
                                             dedup=Inbox(window=1000))
hw_orders: AggregateType[Order] = AggregateType("HwOrder", state=Order, collection="hworders",
                                                dedup=HighWater(mode="monotonic"))


def place(state: Order, msg: Message) -> Handled[Order]:
    p = msg.payload
    emits = []
    if p.get("ship", True):
        emits.append(Emit("BookShipment", {"order_id": msg.aggregate_id,
                                           "weight": int(p.get("weight", 1))}))
    if p.get("event_after"):
        emits.append(Emit("Placed", {"order_id": msg.aggregate_id}))
    if p.get("email"):
        emits.append(Emit("SendConfirmation", {"order_id": msg.aggregate_id,
                                               "email": str(p["email"])}))
    return replace(state, status="placed"), emits


def booked(state: Order, msg: Message) -> Order:
    body: Any = msg.payload.get("body")
    tracking = (body.get("tracking") if isinstance(body, dict)
                else msg.payload.get("tracking", ""))
    return replace(state, status="booked", tracking=str(tracking or ""),
                   results=state.results + 1)


def failed(state: Order, msg: Message) -> Order:
    return replace(state, status="failed", failure=str(msg.payload.get("reason")),
                   results=state.results + 1)


def mailed(state: Order, msg: Message) -> Order:
    return replace(state, mails=state.mails + 1)


for _t in (orders, hw_orders):
    _t.handles("PlaceOrder")(place)
    _t.handles("ShipmentBooked")(booked)
    _t.handles("ShipmentFailed")(failed)
    _t.handles("ConfirmationSent", "ConfirmationFailed")(mailed)

registry = Registry([orders, hw_orders])
