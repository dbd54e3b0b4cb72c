"""A domain that exercises every branch of the batch fold and of its hand-back to the
definition (tests/aggregates/test_native_fold.py): what a handler does is read from the
message's payload, so a drawn payload picks the path.

``Acct`` (a scalar dataclass state, ``Inbox`` with a tiny window so ids leave for the
archive), ``Ledger`` (a dict state, ``HighWater`` monotonic), ``Seq`` (a nested dataclass
state with a datetime and a Decimal, ``HighWater`` contiguous: gaps park), ``Loose`` (a dict
state with BSON-only values, ``NoDedup``), ``Typed`` (a pydantic state, ``Inbox`` with
``lookup="always"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

from aggregates import (
    AggregateType,
    Cancel,
    Emit,
    HighWater,
    Inbox,
    Message,
    NoDedup,
    Registry,
    Schedule,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Acct:
    total: int = 0
    name: str = ""
    ratio: float = 0.0
    flag: bool = False
    note: str | None = None


@dataclass(frozen=True)
class Renamed:
    name: str
    ratio: float


@dataclass(frozen=True)
class Moved:
    account: str
    amount: int
    note: str | None = None


@dataclass(frozen=True)
class Stamp:
    at: datetime
    amount: Decimal = Decimal("0")


@dataclass(frozen=True)
class SeqState:
    count: int = 0
    last: Stamp | None = None
    seen: tuple[str, ...] = field(default_factory=tuple)


class TypedState(BaseModel):
    count: int = 0
    tags: list[str] = []


acct = AggregateType("Acct", state=Acct, collection="nf_accts",
                     dedup=Inbox(window=3, horizon=timedelta(days=36500)))
ledger = AggregateType("Ledger", state=dict, collection="nf_ledgers",
                       dedup=HighWater(mode="monotonic", max_sources=4), max_outbox=6)
seq = AggregateType("Seq", state=SeqState, collection="nf_seqs",
                    dedup=HighWater(mode="contiguous"), topic="seq.topic")
loose = AggregateType("Loose", state=dict, collection="nf_loose", dedup=NoDedup())
typed = AggregateType("Typed", state=TypedState, collection="nf_typed",
                      dedup=Inbox(window=2, horizon=timedelta(days=2), lookup="always"))


def emits_for(p: dict[str, Any], aid: str) -> list[Any]:
    """What ``p["emit"]`` asks for: a list of emit kinds."""
    out: list[Any] = []
    for i, kind in enumerate(p.get("emit", [])):
        if kind == "dict":
            out.append(Emit("Noted", {"i": i, "aid": aid, "n": p.get("n", 0)}))
        elif kind == "to":
            out.append(Emit("Moved", {"i": i, "deep": {"a": [1, 2.5, None, True]}},
                            to=("Acct", f"{aid}-peer")))
        elif kind == "typed":
            out.append(Emit(Moved(aid, int(p.get("n", 0)), None), to=acct.ref("sink")))
        elif kind == "topic":
            out.append(Emit("Topical", {"i": i}, topic="t.custom", key="k-" + aid))
        elif kind == "sv":
            out.append(Emit("Versioned", {"i": i}, schema_version=3))
        elif kind == "sv1":
            out.append(Emit("Versioned", {"i": i}, schema_version=1))
        elif kind == "headers":
            out.append(Emit("WithHeaders", {"i": i}, headers={"h": "v"}))
        elif kind == "tuple":
            out.append(Emit("Tupled", {"t": (1, "x")}))
        elif kind == "nan":
            out.append(Emit("Bad", {"x": float("nan")}))
        elif kind == "big":
            out.append(Emit("Big", {"x": 2**70}))
        elif kind == "dotted":
            out.append(Emit("Bad", {"a.b": 1}))
        elif kind == "datetime":
            out.append(Emit("Dated", {"at": T0}))
        elif kind == "unicode":
            out.append(Emit("Ünï", {"ключ": "значение ✓"}, to=("Acct", "ü/$.x")))
        elif kind == "schedule":
            out.append(Schedule(Emit("Tick", {"i": i}), key="tick", after=timedelta(hours=1)))
        elif kind == "cancel":
            out.append(Cancel("tick"))
    return out


def _act(p: dict[str, Any]) -> str:
    return str(p.get("act", "ok"))


@acct.handles("Op", "Op2")
def acct_op(state: Acct, msg: Message) -> Any:
    p = msg.payload
    act = _act(p)
    if act == "boom":
        raise ValueError(f"boom {p.get('n')}")
    if act == "none":
        return None
    if act == "bad_tuple":
        return state, "not a list"
    if act == "note_big":
        return replace(state, note="x" * 9000), emits_for(p, msg.aggregate_id)
    if act == "unstorable":
        return replace(state, note="\ud800"), []
    if act == "huge_int":
        return replace(state, total=2**64), []
    new = replace(state, total=state.total + int(p.get("n", 0)),
                  ratio=state.ratio + 0.5, flag=not state.flag,
                  note=None if state.note else "n")
    return new, emits_for(p, msg.aggregate_id)


@acct.handles(Renamed)
def acct_rename(state: Acct, r: Renamed, msg: Message) -> Any:
    return replace(state, name=r.name, ratio=r.ratio), emits_for(msg.payload, msg.aggregate_id)


@ledger.handles("Op", "Op2")
def ledger_op(state: dict[str, Any], msg: Message) -> Any:
    p = msg.payload
    if _act(p) == "boom":
        raise RuntimeError("ledger boom")
    new = dict(state)
    new["n"] = int(new.get("n", 0)) + int(p.get("n", 0))
    new.setdefault("log", [])
    new["log"] = [*new["log"], p.get("n", 0)][-4:]
    if _act(p) == "odd_key":
        new["a.b"] = 1
    if _act(p) == "when":
        new["when"] = T0
    return new, emits_for(p, msg.aggregate_id)


@seq.handles("Op", "Op2")
def seq_op(state: SeqState, msg: Message) -> Any:
    p = msg.payload
    stamp = Stamp(msg.occurred_at or T0, Decimal(str(p.get("n", 0))) / 4)
    return (replace(state, count=state.count + 1, last=stamp,
                    seen=(*state.seen, msg.message_id)[-3:]),
            emits_for(p, msg.aggregate_id))


@loose.handles("Op", "Op2")
def loose_op(state: dict[str, Any], msg: Message) -> Any:
    p = msg.payload
    new = {**state, "count": int(state.get("count", 0)) + 1, "at": T0,
           "d": Decimal("1.25"), "nan": float("nan")}
    return new, emits_for(p, msg.aggregate_id)


@typed.handles("Op", "Op2")
def typed_op(state: TypedState, msg: Message) -> Any:
    p = msg.payload
    return (TypedState(count=state.count + 1, tags=[*state.tags, str(p.get("n", 0))][-3:]),
            emits_for(p, msg.aggregate_id))


registry = Registry([acct, ledger, seq, loose, typed])
