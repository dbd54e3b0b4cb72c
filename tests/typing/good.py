"""Typed handlers, emits and references that must pass ``mypy --strict``
(tests/typing/test_mypy.py). Also importable: it defines a working domain."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from aggregates import (
    AggregateRef,
    AggregateType,
    Cancel,
    Emit,
    Handled,
    Handler,
    Message,
    MessageHandler,
    Schedule,
)


@dataclass(frozen=True)
class Order:
    amount: int = 0
    status: str = "new"


@dataclass(frozen=True)
class Customer:
    reserved: int = 0


@dataclass(frozen=True)
class PlaceOrder:
    customer_id: str
    amount: int


class OrderCreated(BaseModel):
    order_id: str
    amount: int


orders = AggregateType("Order", state=Order)
customers = AggregateType("Customer", state=Customer)


@orders.handles(PlaceOrder)
def place(state: Order, cmd: PlaceOrder, msg: Message) -> Handled[Order]:
    created = OrderCreated(order_id=msg.aggregate_id, amount=cmd.amount)
    to: AggregateRef = customers.ref(cmd.customer_id)
    return replace(state, amount=cmd.amount, status="pending"), [Emit(created, to=to)]


@orders.handles(PlaceOrder, type="place-order-timed")
def place_timed(state: Order, cmd: PlaceOrder, msg: Message) -> Handled[Order]:
    deadline = Schedule(Emit("CreditDeadline", {"order_id": msg.aggregate_id}), key="credit",
                        after=timedelta(minutes=30))
    created = Emit(OrderCreated(order_id=msg.aggregate_id, amount=1))
    return replace(state, status="pending"), [created, deadline, Cancel("reminder")]


@orders.handles(PlaceOrder, type="place-order-v2")
def place_v2(state: Order, cmd: PlaceOrder, msg: Message) -> Order:
    return replace(state, amount=cmd.amount)


@customers.handles(OrderCreated)
def reserve(state: Customer, created: OrderCreated, msg: Message) -> Handled[Customer]:
    reply = {"order_id": created.order_id, "amount": created.amount}
    emits = [Emit("CreditReserved", reply, to=("Order", created.order_id)),
             Emit(created, type="Seen", to=orders.ref(created.order_id), key="k",
                  headers={"h": "v"})]
    return replace(state, reserved=state.reserved + created.amount), emits


@orders.handles("Approve", "Approved")  # untyped: (state, msg)
def approve(state: Order, msg: Message) -> Order:
    return replace(state, status=str(msg.payload.get("status", "approved")))


typed: Handler[Order, PlaceOrder] = place
untyped: MessageHandler[Order] = approve
called: Handled[Order] = orders.handler_for("PlaceOrder")(Order(), Message.from_dict({
    "message_id": "m-1", "type": "PlaceOrder", "aggregate_type": "Order", "aggregate_id": "o-1",
    "payload": {"customer_id": "c-1", "amount": 3}, "occurred_at": "2026-01-01T00:00:00Z"}))
ref: tuple[str, str] = orders.ref("o-1")


@orders.upcaster("Approve", from_version=1)  # evolving schemas: payload dict → dict
def approve_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "status": payload.get("status", "approved")}


version: int = orders.message_version("Approve")
emit_v2 = Emit("Approve", {"status": "ok"}, to=orders.ref("o-1"), schema_version=2)


# A scenario test (docs/testing.md): states come back typed.
def scenario_test() -> None:
    from aggregates import Registry
    from aggregates.testing import Answer, Fault, Scenario, Timeline, message

    sc = Scenario(Registry([orders, customers]), faults=[Fault.duplicate("OrderCreated")])
    sc.fake_effect("Book", Answer.ok({"id": "b-1"}), on_success="Booked",
                   on_failure="NotBooked")
    sc.given(message("PlaceOrder", {"customer_id": "c-1", "amount": 3}, to=orders, id="o-1"))
    steps: Timeline = sc.when(message("Approve", {}, to=orders, id="o-1"))
    order: Order = sc.state(orders, "o-1")
    reserved: int = sc.state(customers, "c-1").reserved
    assert order.status == "approved" and reserved >= 0 and steps.types()
    assert [e.outcome for e in sc.timeline] and sc.outcome("m-1").reason is None
