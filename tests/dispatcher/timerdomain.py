"""A small order domain with timers, for the dispatcher's timer tests: ``Place`` schedules a
``Deadline`` for the order itself ``ms`` milliseconds later (key ``deadline``), ``Postpone``
replaces it, ``Confirm`` cancels it, ``Remind`` schedules a ``Reminded`` message for the
customer (another aggregate). The state counts the deadlines it handled, so a test sees
"exactly once"."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta

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


@dataclass(frozen=True)
class Order:
    status: str = "new"
    deadlines: int = 0
    reminded: int = 0


def _deadline(msg: Message, n: int) -> Schedule:
    return Schedule(Emit("Deadline", {"n": n}), key="deadline",
                    after=timedelta(milliseconds=msg.payload["ms"]))


def _define(atype: AggregateType[Order]) -> AggregateType[Order]:
    @atype.handles("Place")
    def place(state: Order, msg: Message) -> Handled[Order]:
        return replace(state, status="waiting"), [_deadline(msg, 1)]

    @atype.handles("Postpone")
    def postpone(state: Order, msg: Message) -> Handled[Order]:
        return state, [_deadline(msg, 2)]

    @atype.handles("Confirm")
    def confirm(state: Order, msg: Message) -> Handled[Order]:
        return replace(state, status="confirmed"), [Cancel("deadline")]

    @atype.handles("Deadline")
    def deadline(state: Order, msg: Message) -> Order:
        status = "expired" if state.status == "waiting" else state.status
        return replace(state, status=status, deadlines=state.deadlines + 1)

    @atype.handles("Remind")
    def remind(state: Order, msg: Message) -> Handled[Order]:
        return state, [Schedule(Emit("Reminded", {}, to=("Customer", msg.payload["customer"])),
                                key="remind", after=timedelta(milliseconds=msg.payload["ms"]))]

    return atype


orders = _define(AggregateType("Order", state=Order, collection="torders",
                               dedup=Inbox(window=1000)))
hw_orders = _define(AggregateType("HwOrder", state=Order, collection="thworders",
                                  dedup=HighWater(mode="monotonic")))

registry = Registry([orders, hw_orders])
