"""A handler step that can never succeed is dead-lettered at that step, never parked: a
malformed ``Emit``, more emits than the outbox holds, a state (or a step's own entries) over
the document's size budget. Steps that only need the outbox drained are still parked."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from aggregates import AggregateType, Emit, Message
from aggregates.core.reasons import Reason
from aggregates.fold import FoldResult, fold
from aggregates.fold.document import Snapshot

NOW = datetime(2026, 3, 1, tzinfo=UTC)
BUDGET = 64 * 1024

things: AggregateType[dict[str, Any]] = AggregateType("Thing", state=dict, max_outbox=5)


@things.handles("Do")
def do(state: dict[str, Any], msg: Message) -> Any:
    p = msg.payload
    new = {**state, "n": state.get("n", 0) + 1}
    if "blob" in p:
        new["blob"] = "x" * p["blob"]
    kind = p.get("emit")
    if kind is None:
        return new
    if kind == "count":
        return new, [Emit("E", {"i": i}) for i in range(p["count"])]
    if kind == "big":
        return new, [Emit("E", {"b": "y" * p["size"]}) for _ in range(p["count"])]
    return new, [_BAD_EMITS[kind]]


_BAD_EMITS: dict[str, Any] = {
    "to-one": Emit("E", {}, to=("Bad",)),  # type: ignore[arg-type]
    "to-str": Emit("E", {}, to="Order/1"),  # type: ignore[arg-type]
    "to-int": Emit("E", {}, to=("Order", 1)),  # type: ignore[arg-type]
    "headers-str": Emit("E", {}, headers="abc"),  # type: ignore[arg-type]
    "headers-int": Emit("E", {}, headers={"h": 1}),  # type: ignore[dict-item]
    "headers-key": Emit("E", {}, headers={1: "v"}),  # type: ignore[dict-item]
    "headers-surrogate": Emit("E", {}, headers={"h": "\ud800"}),
    "headers-dollar": Emit("E", {}, headers={"$set": "v"}),
    "topic-int": Emit("E", {}, topic=5),  # type: ignore[arg-type]
    "key-empty": Emit("E", {}, key=""),
    "not-emit": ("E", {}),
    # Not JSON: the dispatcher could not publish them (docs/reasons.md "invalid_emit").
    "nan": Emit("E", {"x": float("nan")}),
    "inf-nested": Emit("E", {"l": [1, {"y": float("inf")}]}),
    "minus-inf": Emit("E", {"z": -float("inf")}),
}


def msg(mid: str, **payload: Any) -> Message:
    return Message.from_dict({"message_id": mid, "type": "Do", "aggregate_type": "Thing",
                              "aggregate_id": "t1", "payload": payload})


def run(*msgs: Message, snap: Snapshot | None = None) -> FoldResult:
    return fold(things, snap or Snapshot("t1"), list(msgs), now=NOW, max_document_bytes=BUDGET)


def outcome(r: FoldResult, mid: str) -> tuple[str, str | None, str]:
    o = next(o for o in r.outcomes if o.message_id == mid)
    return o.outcome, o.reason, o.detail or ""


@pytest.mark.parametrize("kind", sorted(_BAD_EMITS))
def test_a_malformed_emit_is_invalid_emit_and_the_rest_applies(kind: str) -> None:
    r = run(msg("a"), msg("bad", emit=kind), msg("b", emit="count", count=1))
    assert outcome(r, "a")[0] == "applied"
    got, reason, detail = outcome(r, "bad")
    assert (got, reason) == ("dead_lettered", Reason.INVALID_EMIT), detail
    assert outcome(r, "b")[0] == "applied"
    assert r.snapshot.state is not None and r.snapshot.state["n"] == 2
    assert len(r.changes.outbox) == 1
    assert [d.reason for d in r.dead_letters] == [Reason.INVALID_EMIT]


@pytest.mark.parametrize(("kind", "where", "what"), [
    ("nan", "emit[0].payload.x", "NaN"), ("inf-nested", "emit[0].payload.l[1].y", "Infinity"),
    ("minus-inf", "emit[0].payload.z", "-Infinity")])
def test_an_emit_holding_nan_or_infinity_names_the_field(kind: str, where: str,
                                                         what: str) -> None:
    r = run(msg("bad", emit=kind))
    got, reason, detail = outcome(r, "bad")
    assert (got, reason) == ("dead_lettered", Reason.INVALID_EMIT)
    assert f"{where}: {what}" in detail and "is not JSON" in detail, detail
    assert not r.changes.outbox


def test_valid_emit_fields_are_accepted() -> None:
    good = Emit("E", {"k": 1}, to=("Order", "o-1"), topic="t", key="k", headers={"h": ""})
    things_ok: AggregateType[dict[str, Any]] = AggregateType("Ok", state=dict)

    @things_ok.handles("Do")
    def ok(state: dict[str, Any], m: Message) -> Any:
        return state, [good]

    m = Message.from_dict({"message_id": "m", "type": "Do", "aggregate_type": "Ok",
                           "aggregate_id": "o", "payload": {}})
    r = fold(things_ok, Snapshot("o"), [m], now=NOW)
    assert [o.outcome for o in r.outcomes] == ["applied"]
    assert r.changes.outbox[0]["target"] == {"type": "Order", "id": "o-1"}


def test_more_emits_in_one_step_than_the_outbox_holds_is_a_dead_letter() -> None:
    r = run(msg("many", emit="count", count=6), msg("after", emit="count", count=5))
    got, reason, detail = outcome(r, "many")
    assert (got, reason) == ("dead_lettered", Reason.EMITS_EXCEED_OUTBOX_LIMIT)
    assert "6 messages in one step" in detail and "never fit" in detail
    assert "shrinks" not in detail
    assert outcome(r, "after")[0] == "applied"


def test_a_full_outbox_still_parks() -> None:
    r = run(msg("four", emit="count", count=4), msg("two", emit="count", count=2))
    assert outcome(r, "four")[0] == "applied"
    assert outcome(r, "two")[:2] == ("parked", Reason.OUTBOX_FULL)


def test_a_state_alone_over_the_budget_is_a_dead_letter() -> None:
    r = run(msg("a"), msg("huge", blob=BUDGET + 1), msg("b"))
    got, reason, detail = outcome(r, "huge")
    assert (got, reason) == ("dead_lettered", Reason.STATE_TOO_LARGE)
    assert "state alone" in detail and str(BUDGET) in detail and "never" in detail
    assert outcome(r, "b")[0] == "applied"
    assert r.snapshot.state is not None and "blob" not in r.snapshot.state


def test_one_steps_own_emits_over_the_budget_are_a_dead_letter() -> None:
    r = run(msg("big", emit="big", count=3, size=30_000), msg("b"))
    got, reason, detail = outcome(r, "big")
    assert (got, reason) == ("dead_lettered", Reason.EMITS_EXCEED_DOCUMENT_BUDGET), detail
    assert "never" in detail
    assert outcome(r, "b")[0] == "applied"


def test_a_document_full_of_pending_entries_still_parks() -> None:
    # Each step fits alone; together they need the dispatcher to drain the outbox first.
    r = run(msg("one", emit="big", count=1, size=40_000),
            msg("two", emit="big", count=1, size=40_000))
    assert outcome(r, "one")[0] == "applied"
    got, reason, detail = outcome(r, "two")
    assert (got, reason) == ("parked", Reason.DOCUMENT_SIZE_BUDGET)
    assert "drains the outbox" in detail
