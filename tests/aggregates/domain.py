"""Small aggregate types used by the library tests, and an independent oracle fold."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from aggregates import (
    AggregateType,
    Emit,
    Handled,
    HighWater,
    Inbox,
    Message,
    NoDedup,
    Registry,
    emitted_message_id,
)


@dataclass(frozen=True)
class Counter:
    total: int = 0
    items: tuple[int, ...] = field(default_factory=tuple)


def make_counter(
    name: str = "Counter", *, window: int = 10_000, **kw: Any
) -> AggregateType[Counter]:
    counters = AggregateType(
        name,
        state=Counter,
        collection=name.lower() + "s",
        # A long horizon: the test messages occurred in January 2026 and must stay within
        # it whatever the real clock says (the horizon itself has its own tests).
        dedup=kw.pop("dedup", Inbox(window=window, horizon=timedelta(days=36500))),
        **kw,
    )

    @counters.handles("Add")
    def add(state: Counter, msg: Message) -> Handled[Counter]:
        n = int(msg.payload["n"])
        new = replace(state, total=state.total + n, items=(*state.items, n)[-20:])
        emits = [Emit("Added", {"n": n, "total": new.total})] if n % 3 == 0 else []
        if n % 9 == 0:
            emits.append(Emit("Ninefold", {"n": n}, to=("Counter", "sink")))
        return new, emits

    @counters.handles("Boom")
    def boom(state: Counter, msg: Message) -> Counter:
        raise RuntimeError(f"boom on {msg.payload.get('why', 'purpose')}")

    @counters.handles("Inject")
    def inject(state: Counter, msg: Message) -> Any:
        return replace(state, items=({"$where": "1"},))  # type: ignore[arg-type]

    @counters.handles("Weird")
    def weird(state: Counter, msg: Message) -> Any:
        return replace(state, items=(complex(1, 2),))  # type: ignore[arg-type]

    @counters.handles("WeirdEmit")
    def weird_emit(state: Counter, msg: Message) -> Handled[Counter]:
        return state, [Emit("X", {"value": complex(1, 2)})]

    @counters.handles("BadEmit")
    def bad_emit(state: Counter, msg: Message) -> Handled[Counter]:
        return state, [Emit("X", {"a.b": 1})]

    @counters.handles("Big")
    def big(state: Counter, msg: Message) -> Handled[Counter]:
        return state, [Emit("Blob", {"blob": "x" * int(msg.payload["size"])})]

    return counters


counters = make_counter()
sequenced = make_counter("Seq", dedup=HighWater(mode="contiguous", max_sources=3))
monotonic = make_counter("Mono", dedup=HighWater(mode="monotonic"))
plain = make_counter("Plain", dedup=NoDedup())
registry = Registry([counters, sequenced, monotonic, plain])


def msg(
    mid: str,
    n: int = 1,
    *,
    agg: str = "a1",
    atype: str = "Counter",
    mtype: str = "Add",
    at: str | None = "2026-01-01T00:00:00Z",
    source: tuple[str, str, int] | None = None,
    payload: dict[str, Any] | None = None,
) -> Message:
    raw: dict[str, Any] = {
        "message_id": mid,
        "type": mtype,
        "aggregate_type": atype,
        "aggregate_id": agg,
        "payload": payload if payload is not None else {"n": n},
        "occurred_at": at,
    }
    if source:
        raw["source"] = {"type": source[0], "id": source[1], "seq": source[2]}
    return Message.from_dict(raw)


@dataclass
class Expected:
    total: int = 0
    items: list[int] = field(default_factory=list)
    inbox: list[str] = field(default_factory=list)
    seq: int = 0
    outbox: list[str] = field(default_factory=list)


def oracle(messages: Iterable[Message], *, atype: str = "Counter") -> dict[str, Expected]:
    """Independent of aggregates.fold: dedup by message id (first occurrence wins), then
    apply the Add semantics in order."""
    seen: set[str] = set()
    out: dict[str, Expected] = {}
    for m in messages:
        if m.aggregate_type != atype or m.type != "Add":
            continue
        if m.message_id in seen:
            continue
        seen.add(m.message_id)
        e = out.setdefault(m.aggregate_id, Expected())
        n = int(m.payload["n"])
        e.total += n
        e.items = [*e.items, n][-20:]
        e.inbox.append(m.message_id)
        k = 0
        if n % 3 == 0:
            k += 1
        if n % 9 == 0:
            k += 1
        for i in range(k):
            e.outbox.append(emitted_message_id(atype, m.aggregate_id, m.message_id, i))
        e.seq += k
    return out


def stored(db: Any, collection: str = "counters") -> dict[str, Expected]:
    out: dict[str, Expected] = {}
    for d in db[collection].find():
        out[d["_id"]] = Expected(
            total=d["state"]["total"],
            items=list(d["state"]["items"]),
            inbox=[e[0] for e in d.get("inbox", [])],
            seq=d.get("_seq", 0),
            outbox=[e["id"] for e in d.get("outbox", [])],
        )
    return out


def outcomes_add_up(inputs: Sequence[Message], outcomes: Sequence[Any]) -> bool:
    mine = [o for o in outcomes if not o.from_parked]
    return len(mine) == len(inputs) and all(
        o.outcome in ("applied", "duplicate", "dead_lettered", "parked") for o in mine
    )


class Crash(Exception):
    """A task dies (injected by a test hook); its batch is then redelivered whole."""


def process_redelivered(w: Any, batch: Sequence[Message], *, attempts: int = 12) -> list[Any]:
    """``w.process(batch)``, redelivering the whole batch after each :class:`Crash`, as a
    broker does for an unacknowledged batch. Fails the test after ``attempts`` crashes."""
    import pytest

    for _attempt in range(attempts):
        try:
            out: list[Any] = w.process(batch)
            return out
        except Crash:
            continue
    pytest.fail(f"crashed {attempts} times in a row")
