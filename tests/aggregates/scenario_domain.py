"""Domains for the scenario tests (tests/aggregates/test_scenario*.py).

- ``shipping``: an order that books a shipment through an effect (the side-effects docs'
  domain) with a real effect function calling an in-memory carrier, publishes ``Placed``
  (an event, no ``to=``) and takes a v1 ``PlaceOrder`` through an upcaster.
- ``planted(...)``: a copy of the example domain (aggbox/examples/orders) whose credit
  reservation is not idempotent-safe: it reads a global counter or the wall clock.
- ``loop``: two aggregates that answer each other for ever.
- ``gaps``: contiguous high-water dedup (parks a gap)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from aggbox.examples.orders import domain as example
from aggregates import (
    AggregateType,
    EffectCall,
    Effects,
    Emit,
    Handled,
    HighWater,
    Message,
    PermanentEffectError,
    Registry,
)

# -- shipping: an effect round trip ----------------------------------------------------------


@dataclass(frozen=True)
class Shipment:
    status: str = "new"
    address: str = ""
    tracking: str = ""
    failure: str = ""
    results: int = 0


@dataclass(frozen=True)
class PlaceOrder:  # version 2: v1 had "addr"
    address: str


shipments = AggregateType("Shipment", state=Shipment, collection="shipments")


@shipments.upcaster("PlaceOrder", from_version=1)
def _v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {"address": payload.pop("addr")}


@shipments.handles(PlaceOrder)
def place(state: Shipment, p: PlaceOrder, msg: Message) -> Handled[Shipment]:
    if state.status != "new":
        return state
    return replace(state, status="placed", address=p.address), [
        Emit("BookShipment", {"order_id": msg.aggregate_id, "address": p.address}),
        Emit("Placed", {"order_id": msg.aggregate_id})]


@shipments.handles("ShipmentBooked")
def booked(state: Shipment, msg: Message) -> Shipment:
    return replace(state, status="shipping", tracking=msg.payload["tracking"],
                   results=state.results + 1)


@shipments.handles("ShipmentFailed")
def not_booked(state: Shipment, msg: Message) -> Shipment:
    return replace(state, status="needs_attention", failure=msg.payload["reason"],
                   results=state.results + 1)


class Carrier:
    """A carrier service that honours the idempotency key (books once per key)."""

    def __init__(self) -> None:
        self.bookings: dict[str, str] = {}
        self.requests = 0

    def book(self, key: str, order_id: str, address: str) -> str:
        self.requests += 1
        if not address:
            raise PermanentEffectError("address_rejected", "no address")
        return self.bookings.setdefault(key, f"T-{order_id}")


carrier = Carrier()
effects = Effects()


@effects.effect("BookShipment", on_success="ShipmentBooked", on_failure="ShipmentFailed",
                max_attempts=3, idempotent=True)
def book(call: EffectCall) -> dict[str, Any]:
    p = call.payload
    return {"tracking": carrier.book(call.idempotency_key, str(p["order_id"]), str(p["address"]))}


shipping = Registry([shipments])

# -- the example domain with a planted non-idempotent handler ---------------------------------


@dataclass(frozen=True)
class StampedCustomer:
    name: str = ""
    credit_limit: int = 0
    reserved: int = 0
    reservation_no: int = 0
    reserved_at: datetime | None = None


_numbers = itertools.count(1)


def planted(kind: str) -> Registry:
    """The example domain with ``Customer`` replaced by a copy whose credit reservation
    numbers reservations from a global counter (``kind="counter"``) or stamps them with the
    wall clock (``"clock"``) — instead of deriving them from the message."""
    customers = AggregateType("Customer", state=StampedCustomer, collection="customers",
                              dedup=example.customers.dedup)

    @customers.handles("CustomerRegistered")
    def register(state: StampedCustomer, msg: Message) -> StampedCustomer:
        return replace(state, name=msg.payload["name"],
                       credit_limit=int(msg.payload["credit_limit"]))

    @customers.handles(example.OrderCreated)
    def reserve(state: StampedCustomer, created: example.OrderCreated,
                msg: Message) -> Handled[StampedCustomer]:
        to = example.orders.ref(created.order_id)
        if state.reserved + created.amount > state.credit_limit:
            return state, [Emit(example.CreditLimitExceeded(created.order_id, msg.aggregate_id,
                                                            created.amount), to=to)]
        if kind == "counter":
            new = replace(state, reservation_no=next(_numbers))
        else:
            now = datetime.now(UTC)
            new = replace(state, reserved_at=now.replace(microsecond=now.microsecond // 1000
                                                         * 1000))
        return replace(new, reserved=state.reserved + created.amount), [
            Emit(example.CreditReserved(created.order_id, msg.aggregate_id, created.amount),
                 to=to)]

    return Registry([customers, example.orders])


# -- a loop between two aggregates -------------------------------------------------------------


@dataclass(frozen=True)
class Counter:
    n: int = 0


pingers = AggregateType("Pinger", state=Counter, collection="pingers")
pongers = AggregateType("Ponger", state=Counter, collection="pongers")


@pingers.handles("Pong", "Start")
def ping(state: Counter, msg: Message) -> Handled[Counter]:
    return replace(state, n=state.n + 1), [Emit("Ping", {}, to=pongers.ref("b"))]


@pongers.handles("Ping")
def pong(state: Counter, msg: Message) -> Handled[Counter]:
    return replace(state, n=state.n + 1), [Emit("Pong", {}, to=pingers.ref("a"))]


loop = Registry([pingers, pongers])

# -- contiguous high-water: gaps park --------------------------------------------------------

ledgers = AggregateType("Ledger", state=Counter, collection="ledgers",
                        dedup=HighWater(mode="contiguous"))


@ledgers.handles("Add")
def add(state: Counter, msg: Message) -> Counter:
    return replace(state, n=state.n * 10 + int(msg.payload["digit"]))


gaps = Registry([ledgers])
