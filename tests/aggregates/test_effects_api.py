"""The effects domain API without a server: registration rules, the result message (pure)
and the harness delivering results the way the effect runner does."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

import pytest

from aggregates import (
    AggregateType,
    EffectCall,
    Effects,
    Emit,
    EnvelopeError,
    Handled,
    HighWater,
    Message,
    PermanentEffectError,
    RetryableEffectError,
)
from aggregates.core.errors import AggboxError
from aggregates.domain.effects import REPLY_SOURCE_TYPE, reply_message, reply_message_id
from aggregates.testing import AggregateHarness, message

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@dataclass(frozen=True)
class Order:
    status: str = "new"
    tracking: str = ""
    results: int = 0


orders: AggregateType[Order] = AggregateType("Order", state=Order,
                                             dedup=HighWater(mode="monotonic"))


@orders.handles("PlaceOrder")
def place(state: Order, msg: Message) -> Handled[Order]:
    return replace(state, status="placed"), [Emit("BookShipment", {"n": 1}),
                                             Emit("Placed", {})]


@orders.handles("ShipmentBooked")
def booked(state: Order, msg: Message) -> Order:
    return replace(state, status="booked", tracking=msg.payload["tracking"],
                   results=state.results + 1)


@orders.handles("ShipmentFailed")
def failed(state: Order, msg: Message) -> Order:
    return replace(state, status=f"failed:{msg.payload['reason']}", results=state.results + 1)


effects = Effects()


@effects.effect("BookShipment", on_success="ShipmentBooked", on_failure="ShipmentFailed",
                timeout_s=2, max_attempts=3)
async def book(call: EffectCall) -> dict[str, Any]:
    return {"tracking": f"T-{call.aggregate_id}-{call.attempt}"}


BOOK = effects.get("BookShipment")


def placed() -> AggregateHarness[Order]:
    h = AggregateHarness(orders, aggregate_id="o/1.$")
    h.given(message("PlaceOrder", {}, to=orders, id="o/1.$", source=("Client", "c", 1),
                    headers={"traceparent": TRACE}))
    return h


def test_harness_delivers_a_success_once() -> None:
    h = placed()
    step = h.effect_result(BOOK, result={"tracking": "T-9"})
    assert step.outcome == "applied"
    assert (h.state.status, h.state.tracking, h.state.results) == ("booked", "T-9", 1)
    assert [e["type"] for e in h.outbox] == ["Placed"]  # the effect entry left the outbox
    with pytest.raises(AggboxError, match="no pending 'BookShipment' entry"):
        h.effect_result(BOOK, result={"tracking": "T-9"})


def test_a_redelivered_result_is_a_duplicate_even_if_it_differs() -> None:
    h = placed()
    entry = h.outbox[0]
    h.effect_result(BOOK, failure=("effect_rejected", "HTTP 422"), attempts=2)
    assert (h.state.status, h.state.results) == ("failed:effect_rejected", 1)
    again = reply_message(BOOK, entry, aggregate_type="Order", aggregate_id="o/1.$",
                          result={"tracking": "T-late"})
    assert h.when(again).outcome == "duplicate"  # one result per effect, the first wins
    assert h.state.results == 1


def test_reply_message_fields() -> None:
    h = placed()
    entry = h.outbox[0]
    ok = reply_message(BOOK, entry, aggregate_type="Order", aggregate_id="o/1.$",
                       result={"tracking": "T"})
    bad = reply_message(BOOK, entry, aggregate_type="Order", aggregate_id="o/1.$",
                        failure=("effect_attempts_exhausted", "3 attempts"), attempts=3)
    assert ok.message_id == bad.message_id == reply_message_id(entry["id"])
    assert ok.message_id == "effect-result:" + entry["id"]
    assert (ok.type, bad.type) == ("ShipmentBooked", "ShipmentFailed")
    assert bad.payload == {"reason": "effect_attempts_exhausted", "error": "3 attempts",
                           "attempts": 3}
    assert ok.causation_id == entry["id"]
    assert ok.source is not None and ok.source.type == REPLY_SOURCE_TYPE
    assert (ok.source.id, ok.source.seq) == ("o/1.$", entry["source"]["seq"])
    assert ok.headers["traceparent"].split("-")[1] == TRACE.split("-")[1]
    with pytest.raises(EnvelopeError, match="payload"):
        reply_message(BOOK, entry, aggregate_type="Order", aggregate_id="o/1.$",
                      result={"$set": 1})


def test_effect_functions_and_guarantees() -> None:
    call = EffectCall("k", "BookShipment", {}, "Order", "o-1", attempt=2)
    assert asyncio.run(book(call)) == {"tracking": "T-o-1-2"}  # type: ignore[arg-type]
    assert BOOK.guarantee == "at-least-once" and BOOK.is_async
    effects.query("BookShipment")(lambda c: None)
    assert effects.get("BookShipment").guarantee == "once"
    assert RetryableEffectError("x").reason == "effect_retryable"
    assert PermanentEffectError(detail="HTTP 400").reason == "effect_rejected"
    assert "effect_rejected: HTTP 400" in str(PermanentEffectError(detail="HTTP 400"))
