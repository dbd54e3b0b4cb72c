"""A tiny aggregate for dispatcher tests: ``Emit {n, size?, topic?}`` makes the aggregate
emit ``n`` ``Tick`` events (numbered per aggregate), so a test controls how many outbox
entries each document gets. Written through the real StoreWriter, so the document layout
is the production one."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from aggregates import AggregateType, Emit, Handled, Message, Registry


@dataclass(frozen=True)
class Ticker:
    emitted: int = 0


emitters: AggregateType[Ticker] = AggregateType(
    "Emitter", state=Ticker, collection="emitters", max_outbox=100_000)


@emitters.handles("Emit")
def emit(state: Ticker, msg: Message) -> Handled[Ticker]:
    n = int(msg.payload.get("n", 1))
    pad = "x" * int(msg.payload.get("size", 0))
    topic: Any = msg.payload.get("topic")
    to = ("Target", f"t-{msg.aggregate_id}") if msg.payload.get("to") else None
    events = [Emit("Tick", {"i": state.emitted + i + 1, "pad": pad}, topic=topic, to=to)
              for i in range(n)]
    return replace(state, emitted=state.emitted + n), events


registry = Registry([emitters])
