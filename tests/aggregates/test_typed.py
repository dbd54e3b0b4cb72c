"""Typed handlers (``@atype.handles(PayloadClass)``), typed emits and aggregate references:
the same in the harness, the store writer (mongomock) and replay, since all go through
:func:`aggregates.fold.fold`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter

from aggregates import (
    AggboxSettings,
    AggregateRef,
    AggregateType,
    ConfigurationError,
    Emit,
    Handled,
    Message,
    Registry,
    StoreWriter,
)
from aggregates.core.jsonvalue import NotJSONValue
from aggregates.core.reasons import Reason
from aggregates.debug.replay import replay_steps
from aggregates.domain.aggregate import TypedHandler, dump_payload_checked
from aggregates.fold import fold
from aggregates.fold.document import Snapshot
from aggregates.testing import AggregateHarness, memory_database, message

NOW = datetime(2026, 1, 2, tzinfo=UTC)


@dataclass(frozen=True)
class Shop:
    stock: int = 0
    reserved: int = 0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reserve:  # a dataclass payload
    order_id: str
    amount: int


class Restock(BaseModel):  # a pydantic payload
    amount: int
    note: str = ""


@dataclass(frozen=True)
class Reserved:
    order_id: str
    amount: int


class Shipped(BaseModel):
    order_id: str
    at: datetime


def make_shop(name: str = "Shop", *, typed_emits: bool = True, **kw: Any) -> AggregateType[Shop]:
    shops = AggregateType(name, state=Shop, collection=name.lower() + "s", **kw)

    @shops.handles(Reserve)
    def reserve(state: Shop, r: Reserve, msg: Message) -> Handled[Shop]:
        assert isinstance(r, Reserve) and isinstance(msg, Message)
        if typed_emits:
            out = Emit(Reserved(r.order_id, r.amount), to=AggregateType_order.ref(r.order_id))
        else:
            out = Emit("Reserved", {"order_id": r.order_id, "amount": r.amount},
                       to=("Order", r.order_id))
        return replace(state, reserved=state.reserved + r.amount), [out]

    @shops.handles(Restock, type="restock")
    def restock(state: Shop, r: Restock, msg: Message) -> Shop:
        return replace(state, stock=state.stock + r.amount, notes=(*state.notes, r.note))

    @shops.handles("Note")  # untyped: (state, msg), the payload a dict
    def note(state: Shop, msg: Message) -> Shop:
        return replace(state, notes=(*state.notes, msg.payload["text"]))

    return shops


AggregateType_order = AggregateType("Order", state=Shop, collection="orders")


def reserve_msg(amount: Any = 3, **kw: Any) -> Message:
    return message("Reserve", {"order_id": "o-1", "amount": amount}, to="Shop", id="s-1", **kw)


# -- registration -------------------------------------------------------------------------

def test_message_type_is_the_class_name_or_type() -> None:
    shops = make_shop()
    assert shops.message_types == ["Note", "Reserve", "restock"]
    assert isinstance(shops.handler_for("Reserve"), TypedHandler)
    assert shops.handler_for("Reserve").__name__ == "reserve"  # type: ignore[attr-defined]


def test_untyped_handlers_are_registered_as_they_are() -> None:
    shops = make_shop()
    fn = shops.handler_for("Note")
    assert not isinstance(fn, TypedHandler)
    assert fn(Shop(), message("Note", {"text": "hi"}, to=shops, id="s-1")) == Shop(notes=("hi",))


def test_registration_errors() -> None:
    shops = AggregateType("Shop", state=Shop)
    with pytest.raises(ConfigurationError, match=r"\(state, payload, msg\)"):
        shops.handles(Reserve)(lambda state, msg: state)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"\(state, msg\)"):
        shops.handles("X")(lambda state, p, msg: state)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="payload class"):
        shops.handles(int)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="payload class"):
        shops.handles(Reserve, "Other")  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="type= goes with a payload class"):
        shops.handles("X", type="Y")  # type: ignore[call-overload]
    shops.handles(Reserve)(lambda state, p, msg: state)
    with pytest.raises(ConfigurationError, match="already has a handler"):
        shops.handles("Reserve")(lambda state, msg: state)


def test_a_payload_class_pydantic_cannot_resolve_is_refused_at_registration() -> None:
    @dataclass(frozen=True)
    class Part:
        n: int

    @dataclass(frozen=True)
    class Local:
        part: Part  # a string annotation (PEP 563) naming a local class

    shops = AggregateType("Shop", state=Shop)
    with pytest.raises(ConfigurationError, match=r"Local .*'Part' is not defined.*module level"):
        shops.handles(Local)(lambda state, p, msg: state)


# -- the harness --------------------------------------------------------------------------

def test_typed_handler_applies_in_the_harness() -> None:
    h = AggregateHarness(make_shop(), aggregate_id="s-1")
    step = h.when(reserve_msg("3"))  # validated in pydantic's lax mode: "3" → 3
    assert step.outcome == "applied", step.detail
    assert h.state.reserved == 3
    assert [(e["type"], e["payload"], e["target"]) for e in step.emitted] == [
        ("Reserved", {"order_id": "o-1", "amount": 3}, {"type": "Order", "id": "o-1"})]
    step = h.when(message("restock", {"amount": 5, "note": "n"}, to="Shop", id="s-1"))
    assert step.outcome == "applied" and h.state.stock == 5 and h.state.notes == ("n",)
    assert h.when(message("Note", {"text": "t"}, to="Shop", id="s-1")).outcome == "applied"
    assert h.state.notes == ("n", "t")


@pytest.mark.parametrize(("payload", "field", "problem"), [
    ({"order_id": "o-1", "amount": "lots"}, "amount", "valid integer"),
    ({"order_id": "o-1"}, "amount", "Field required"),
    ({"order_id": ["x"], "amount": 1}, "order_id", "valid string"),
])
def test_invalid_payload_is_dead_lettered_in_the_harness(payload: dict[str, Any], field: str,
                                                         problem: str) -> None:
    h = AggregateHarness(make_shop(), aggregate_id="s-1")
    step = h.when(message("Reserve", payload, to="Shop", id="s-1"))
    assert (step.outcome, step.reason) == ("dead_lettered", Reason.INVALID_PAYLOAD)
    assert step.detail is not None and "\n" not in step.detail
    assert step.detail.startswith(f"Reserve: {field}: ") and problem in step.detail
    assert h.dead_letters[-1].traceback is None
    assert h.state == Shop() and step.emitted == []


def test_invalid_payload_does_not_block_a_parking_type() -> None:
    h = AggregateHarness(make_shop(on_handler_error="park"), aggregate_id="s-1")
    assert h.when(reserve_msg("lots")).reason == Reason.INVALID_PAYLOAD
    assert h.when(reserve_msg(2)).outcome == "applied"


@dataclass(frozen=True)
class Line:
    sku: str
    qty: int


@dataclass(frozen=True)
class Basket:
    lines: list[Line]


def test_nested_errors_name_the_path_and_are_capped() -> None:
    baskets = AggregateType("Basket", state=Shop)

    @baskets.handles(Basket)
    def put(state: Shop, b: Basket, msg: Message) -> Shop:
        return state

    bad = {"lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": "x"}, {}, {}]}
    h = AggregateHarness(baskets, aggregate_id="b-1")
    step = h.when(message("Basket", bad, to=baskets, id="b-1"))
    assert step.reason == Reason.INVALID_PAYLOAD
    assert step.detail is not None
    assert step.detail.startswith("Basket: lines.1.qty: Input should be a valid integer")
    assert "lines.2.sku: Field required" in step.detail and "and 2 more" in step.detail


# -- typed emits and references ----------------------------------------------------------

def _outbox(atype: AggregateType[Any], msg: Message) -> list[dict[str, Any]]:
    res = fold(atype, Snapshot(aggregate_id="s-1"), [msg], now=NOW)
    assert [o.outcome for o in res.outcomes] == ["applied"], res.outcomes
    return res.changes.outbox


def test_typed_emit_with_a_ref_is_the_tuple_form() -> None:
    msg = reserve_msg(4)
    typed = _outbox(make_shop(typed_emits=True), msg)
    plain = _outbox(make_shop(typed_emits=False), msg)
    assert typed == plain
    assert typed[0]["target"] == {"type": "Order", "id": "o-1"}
    assert AggregateType_order.ref("o-1") == ("Order", "o-1")
    assert AggregateType_order.ref("o-1") == AggregateRef("Order", "o-1")


def test_emit_forms() -> None:
    e = Emit(Reserved("o", 1), to=AggregateType_order.ref("o"), topic="t")
    assert (e.type, e.to, e.topic, e.key, e.headers) == ("Reserved", ("Order", "o"), "t",
                                                        None, {})
    assert Emit(Reserved("o", 1), type="reserved-v2").type == "reserved-v2"
    d = Emit("Reserved", {"order_id": "o"}, to=("Order", "o"))
    assert (d.type, d.payload) == ("Reserved", {"order_id": "o"})
    assert Emit("Reserved", payload={"a": 1}) == Emit(type="Reserved", payload={"a": 1})
    assert dataclasses.replace(e, key="k").key == "k"
    with pytest.raises(TypeError):
        Emit("Reserved")  # type: ignore[call-overload]


def _emitting(*emits: Any) -> AggregateType[Shop]:
    shops = AggregateType("Shop", state=Shop)

    @shops.handles("Go")
    def go(state: Shop, msg: Message) -> Handled[Shop]:
        return state, list(emits)

    return shops


def test_typed_emit_payload_is_dumped_json_safe() -> None:
    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    out = _outbox(_emitting(Emit(Shipped(order_id="o", at=at))),
                  message("Go", {}, to="Shop", id="s-1"))
    assert out[0]["type"] == "Shipped"
    assert out[0]["payload"] == {"order_id": "o", "at": "2026-01-01T12:00:00Z"}
    assert "target" not in out[0]


@dataclass(frozen=True)
class Opaque:
    thing: Any


@dataclass(frozen=True)
class Flat:
    name: str
    n: int
    x: float
    ok: bool
    maybe: int | None = None


@given(st.builds(Flat, name=st.text(), n=st.integers(), x=st.floats(),
                 ok=st.booleans(), maybe=st.none() | st.integers()))
def test_the_fast_payload_dump_is_pydantics(obj: Flat) -> None:
    # A scalar-field dataclass is dumped by reading its fields (the hot path); what it
    # gives must be exactly pydantic's JSON-mode dump. The hot path takes a finite float
    # and an int in 64 bits; anything else is judged by the rule (docs/design.md "JSON
    # values"): refused naming the field, or the same dump.
    plain = all(_plain_scalar(v) for v in dataclasses.asdict(obj).values())
    try:
        out, trusted = dump_payload_checked(obj)
    except NotJSONValue as exc:
        assert not plain and exc.path.startswith("payload.")
        return
    assert out == TypeAdapter(Flat).dump_python(obj, mode="json")
    assert trusted == plain


def _plain_scalar(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return -(2**63) <= v < 2**63
    return True


def test_a_scalar_field_holding_a_structure_takes_the_checked_path() -> None:
    # Dataclasses do not check types: a dict in a str field is dumped by pydantic and its
    # keys are checked like a dict payload's.
    h = AggregateHarness(_emitting(Emit(Flat({"$set": 1}, 1, 1.0, True))),  # type: ignore[arg-type]
                         aggregate_id="s-1")
    step = h.when(message("Go", {}, to="Shop", id="s-1"))
    assert (step.outcome, step.reason) == ("dead_lettered", Reason.INVALID_EMIT)


@pytest.mark.parametrize("to", [("Order", "\ud800"), ("\udfff", "o"), ("Order", ""),
                                AggregateRef("Order", "\ud800"), ("Order", "o", "x")])
def test_an_address_that_cannot_be_stored_is_invalid_emit(to: Any) -> None:
    h = AggregateHarness(_emitting(Emit(Reserved("o", 1), to=to)), aggregate_id="s-1")
    step = h.when(message("Go", {}, to="Shop", id="s-1"))
    assert (step.outcome, step.reason) == ("dead_lettered", Reason.INVALID_EMIT)
    assert step.detail is not None and "to must be" in step.detail


@pytest.mark.parametrize(("emit", "words"), [
    (Emit(object()), "payload must be a dict, a pydantic model or a dataclass"),  # type: ignore[call-overload]
    # A value pydantic cannot write is judged by the rule, naming the field (issue 40).
    (Emit(Opaque(object())), "emit[0].payload.thing: a value of type object is not JSON"),
    (Emit({"a": 1}), "type must be a non-empty string"),  # type: ignore[call-overload]
    (Emit(Reserved("o", 1), to="Order"), "to must be (aggregate_type, aggregate_id)"),  # type: ignore[arg-type]
    (Emit(Reserved("o", 1), to=AggregateRef("Order", "")), "to must be"),
])
def test_bad_emits_are_invalid_emit(emit: Emit, words: str) -> None:
    h = AggregateHarness(_emitting(emit), aggregate_id="s-1")
    step = h.when(message("Go", {}, to="Shop", id="s-1"))
    assert (step.outcome, step.reason) == ("dead_lettered", Reason.INVALID_EMIT)
    assert step.detail is not None and words in step.detail and "\n" not in step.detail


# -- the writer and replay ----------------------------------------------------------------

def test_typed_handler_in_the_writer() -> None:
    db = memory_database("aggbox_test")
    shops = make_shop()
    w = StoreWriter(db, Registry([shops]), settings=AggboxSettings(), sleep=lambda s: None,
                    clock=lambda: NOW)
    w.ensure_indexes()
    good, bad = reserve_msg(5), reserve_msg({"n": 1})
    note = message("Note", {"text": "hi"}, to="Shop", id="s-1")
    out = w.process([good, bad, note])
    assert [(o.outcome, o.reason) for o in out] == [
        ("applied", None), ("dead_lettered", Reason.INVALID_PAYLOAD), ("applied", None)]
    doc = db.shops.find_one({"_id": "s-1"})
    assert doc["state"]["reserved"] == 5 and doc["state"]["notes"] == ["hi"]
    assert [(e["type"], e["payload"], e["target"]) for e in doc["outbox"]] == [
        ("Reserved", {"order_id": "o-1", "amount": 5}, {"type": "Order", "id": "o-1"})]
    dl = db.aggbox_dead_letters.find_one({"message_id": bad.message_id})
    assert dl["reason"] == Reason.INVALID_PAYLOAD
    assert dl["error"] == "Reserve: amount: Input should be a valid integer (got {'n': 1})"


def test_typed_handler_in_replay() -> None:
    shops = make_shop()
    run = replay_steps(shops, [reserve_msg(2), reserve_msg(-1.5), reserve_msg(1)], now=NOW)
    assert [(s.outcome, s.reason) for s in run.steps] == [
        ("applied", None), ("dead_lettered", Reason.INVALID_PAYLOAD), ("applied", None)]
    assert "Reserve: amount:" in (run.steps[1].detail or "")
    assert run.state.reserved == 3
    assert run.dead_letters[0].reason == Reason.INVALID_PAYLOAD
