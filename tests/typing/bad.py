"""Handlers and emits ``mypy --strict`` must reject (tests/typing/test_mypy.py): the line
after each ``# error: <text>`` comment must get a mypy error containing <text>, and no other
line any. Never imported."""

from __future__ import annotations

from dataclasses import dataclass

from aggregates import AggregateType, Emit, Handled, Message


@dataclass(frozen=True)
class Order:
    amount: int = 0


@dataclass(frozen=True)
class Customer:
    reserved: int = 0


@dataclass(frozen=True)
class PlaceOrder:
    amount: int


@dataclass(frozen=True)
class CancelOrder:
    reason: str


orders = AggregateType("Order", state=Order)
customers = AggregateType("Customer", state=Customer)


# error: incompatible type "Callable[[Order, PlaceOrder, Message], Customer]"
@orders.handles(PlaceOrder)
def returns_the_wrong_state(state: Order, cmd: PlaceOrder, msg: Message) -> Customer:
    return Customer()


# error: "Callable[[Order, CancelOrder, Message], Order]"; expected "Callable[[Order, PlaceOrder,
@orders.handles(PlaceOrder, type="p2")
def wrong_payload_class(state: Order, cmd: CancelOrder, msg: Message) -> Order:
    return state


# error: "Callable[[Order, Message], Order]"; expected "Callable[[Order, PlaceOrder,
@orders.handles(PlaceOrder, type="p3")
def untyped_signature(state: Order, msg: Message) -> Order:
    return state


# error: incompatible type "Callable[[Order, Message], int]"
@orders.handles("Cancel")
def returns_an_int(state: Order, msg: Message) -> int:
    return 1


# error: Value of type variable "P" of "handles" of "AggregateType" cannot be "int"
@orders.handles(int)
def not_a_payload_class(state: Order, cmd: int, msg: Message) -> Order:
    return state


@orders.handles("Place")
def wrong_to(state: Order, msg: Message) -> Handled[Order]:
    # error: No overload variant of "Emit" matches argument types "PlaceOrder", "str"
    return state, [Emit(PlaceOrder(1), to="Customer")]


@orders.handles("Place2")
def wrong_to_type(state: Order, msg: Message) -> Handled[Order]:
    # error: "AggregateType[Customer]"
    return state, [Emit("X", {}, to=customers)]


@orders.handles("Place3")
def dict_without_type(state: Order, msg: Message) -> Handled[Order]:
    # error: No overload variant of "Emit" matches argument type "dict[str, int]"
    return state, [Emit({"amount": 1})]


@orders.handles("Place4")
def wrong_emit_list(state: Order, msg: Message) -> Handled[Order]:
    # error: List item 0 has incompatible type "str"; expected "Emit | Schedule | Cancel"
    return state, ["X"]


def scenario_state_is_typed() -> None:
    from aggregates import Registry
    from aggregates.testing import Scenario

    sc = Scenario(Registry([orders]))
    # error: "Order" has no attribute "reserved"
    print(sc.state(orders, "o-1").reserved)
