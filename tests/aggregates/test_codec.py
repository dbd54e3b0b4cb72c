"""The state codec (aggregates/codec/__init__.py): typed state round-trips through the store."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from enum import Enum, StrEnum
from typing import Any

import bson
import pytest
from bson.codec_options import CodecOptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pymongo import MongoClient
from typing_extensions import TypedDict

from aggregates import (
    AggboxSettings,
    AggregateType,
    ConfigurationError,
    HandlerError,
    Message,
    Registry,
    StateCodec,
    StateCodecError,
    StoreWriter,
)
from aggregates.testing import AggregateHarness, memory_database, message
from tests.hypo import examples

NOW = datetime(2026, 1, 2, tzinfo=UTC)


# -- the example of the issue ---------------------------------------------------------------
@dataclass(frozen=True)
class Address:
    city: str = ""


@dataclass(frozen=True)
class Customer:
    address: Address = Address()
    tags: tuple[str, ...] = ()


customers = AggregateType("Customer", state=Customer, collection="customers")
seen_cities: list[str] = []


@customers.handles("Moved")
def moved(state: Customer, msg: Message) -> Customer:
    seen_cities.append(state.address.city)  # AttributeError if address came back a dict
    return replace(state, address=Address(msg.payload["city"]),
                   tags=(*state.tags, msg.payload["city"]))


def _moves(agg_id: str) -> list[Message]:
    return [message("Moved", {"city": c}, to=customers, id=agg_id, message_id=f"{agg_id}-{c}")
            for c in ("Oslo", "Bergen", "Tromsø")]


def test_nested_state_three_messages_in_the_harness() -> None:
    seen_cities.clear()
    h = AggregateHarness(customers, aggregate_id="c-1")
    for m in _moves("c-1"):
        assert h.when(m).outcome == "applied"
    assert h.state == Customer(Address("Tromsø"), ("Oslo", "Bergen", "Tromsø"))
    assert set(seen_cities) == {"", "Oslo", "Bergen"}  # each handler read address.city


def _through_writer(db: Any) -> None:
    w = StoreWriter(db, Registry([customers]), settings=AggboxSettings(slice_messages=1),
                    sleep=lambda s: None, clock=lambda: NOW)
    w.ensure_indexes()
    seen_cities.clear()
    outcomes = []
    for m in _moves("c-2"):  # one write per message: each one reads the stored state
        outcomes += w.process([m])
    assert [o.outcome for o in outcomes] == ["applied"] * 3, outcomes
    assert seen_cities == ["", "Oslo", "Bergen"]
    doc = db["customers"].find_one({"_id": "c-2"})
    assert doc["state"] == {"address": {"city": "Tromsø"}, "tags": ["Oslo", "Bergen", "Tromsø"]}
    assert customers.codec.load(doc["state"]) == Customer(Address("Tromsø"),
                                                          ("Oslo", "Bergen", "Tromsø"))


def test_nested_state_three_messages_through_the_writer_on_mongomock() -> None:
    _through_writer(memory_database("codec"))


@pytest.mark.mongo
def test_nested_state_three_messages_through_the_writer_on_the_server(db: Any) -> None:
    _through_writer(db)


# -- the supported field types --------------------------------------------------------------
class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


class Level(Enum):
    LOW = 1
    HIGH = 2


class Geo(BaseModel):
    lat: float = 0.0
    lon: float = 0.0


class Line(TypedDict):
    sku: str
    qty: int


@dataclass
class Everything:  # not frozen: dataclasses of any kind are fine
    at: datetime | None = None
    day: date = date(2020, 1, 1)
    amount: Decimal = Decimal("0.00")
    color: Color = Color.RED
    level: Level = Level.LOW
    ref: uuid.UUID | None = None
    tags: frozenset[str] = frozenset()
    pair: tuple[int, str] = (0, "")
    lines: list[Line] = field(default_factory=list)
    by_color: dict[Color, int] = field(default_factory=dict)
    geo: Geo = field(default_factory=Geo)
    nested: dict[str, list[Address]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def _everything() -> Everything:
    return Everything(
        at=datetime(2026, 3, 1, 12, 30, 5, 123000, tzinfo=timezone(timedelta(hours=2))),
        day=date(2026, 2, 28), amount=Decimal("12.50"), color=Color.BLUE, level=Level.HIGH,
        ref=uuid.UUID("12345678-1234-5678-1234-567812345678"), tags=frozenset({"b", "a"}),
        pair=(1, "x"), lines=[{"sku": "s", "qty": 2}], by_color={Color.RED: 1},
        geo=Geo(lat=1.5, lon=-2.0), nested={"home": [Address("Oslo")]},
        extra={"n": 1, "when": datetime(2020, 1, 1, tzinfo=UTC), "d": Decimal("1.1")})


def _bson_round_trip(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = bson.decode(bson.encode(doc),
                                      codec_options=CodecOptions(tz_aware=True))
    return out


def test_every_supported_type_round_trips_and_is_stored_as_plain_bson() -> None:
    codec = StateCodec(Everything)
    x = _everything()
    doc = codec.dump(x)
    assert doc["amount"] == bson.decimal128.Decimal128("12.50")
    assert doc["day"] == datetime(2026, 2, 28, tzinfo=UTC)  # date: midnight UTC
    assert doc["at"] == datetime(2026, 3, 1, 10, 30, 5, 123000, tzinfo=UTC)
    assert doc["ref"] == bson.Binary.from_uuid(x.ref)  # type: ignore[arg-type]  # subtype 4
    assert doc["tags"] == ["a", "b"] and doc["color"] == "blue" and doc["level"] == 2
    assert doc["by_color"] == {"red": 1}
    assert codec.load(doc) == x
    back = codec.load(_bson_round_trip(doc))
    assert back == x and type(back.ref) is uuid.UUID and type(back.day) is date
    assert codec.dump(back) == doc


def test_naive_stored_datetimes_load_as_utc() -> None:
    codec = StateCodec(Everything)
    doc = codec.dump(_everything())
    naive = bson.decode(bson.encode(doc))  # a client without tz_aware=True
    assert codec.load(naive) == _everything()


def test_sub_millisecond_and_naive_datetimes_are_refused_at_dump() -> None:
    codec = StateCodec(Everything)
    with pytest.raises(StateCodecError, match=r"Everything\.at: .*sub-millisecond"):
        codec.dump(Everything(at=datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC)))
    with pytest.raises(StateCodecError, match=r"Everything\.at: .*naive"):
        codec.dump(Everything(at=datetime(2026, 1, 1)))
    with pytest.raises(StateCodecError, match="Decimal128"):
        codec.dump(Everything(amount=Decimal("1" * 40)))


def test_pydantic_model_and_typeddict_and_dict_states() -> None:
    class Acc(BaseModel):
        geo: Geo = Geo()
        when: datetime | None = None

    codec = StateCodec(Acc)
    x = Acc(geo=Geo(lat=3.0), when=datetime(2026, 1, 1, tzinfo=UTC))
    assert codec.load(_bson_round_trip(codec.dump(x))) == x
    td = StateCodec(Line)
    assert td.load(_bson_round_trip(td.dump({"sku": "a", "qty": 1}))) == {"sku": "a", "qty": 1}
    plain = StateCodec(dict)
    assert plain.load(plain.dump({"n": 1, "d": Decimal("2.5")})) == {"n": 1, "d": Decimal("2.5")}


def test_handler_returning_wrong_state_type_is_an_invalid_result() -> None:
    codec = StateCodec(Customer)
    with pytest.raises(HandlerError, match="expected Customer"):
        codec.dump(Address("x"))  # type: ignore[arg-type]


# -- refused at definition ------------------------------------------------------------------
@dataclass
class HasComplex:
    lat: complex = 0j


@dataclass
class GeoBox:
    geo: HasComplex = field(default_factory=HasComplex)


@dataclass
class Nested:
    address: GeoBox = field(default_factory=GeoBox)


class Opaque:
    pass


@dataclass
class BytesKeys:
    m: dict[bytes, int] = field(default_factory=dict)


@dataclass
class UnhashableSet:
    s: frozenset[list[int]] = frozenset()  # type: ignore[type-var]


@dataclass
class OpaqueField:
    o: Opaque = field(default_factory=Opaque)


@dataclass
class Ambiguous:
    when: date | datetime = date(2020, 1, 1)


@dataclass
class AmbiguousEnum:
    c: Color | str = ""


@pytest.mark.parametrize(("state", "match"), [
    (Nested, r"Customer\.address\.geo\.lat: type complex cannot be stored in MongoDB"),
    (BytesKeys, r"Customer\.m: type dict\[bytes, int\] .*dict keys of type bytes"),
    (UnhashableSet, r"Customer\.s: .*must be hashable"),
    (OpaqueField, r"Customer\.o: type Opaque cannot be stored"),
    (Ambiguous, r"Customer\.when: .*could not be told apart"),
    (AmbiguousEnum, r"Customer\.c: .*could not be told apart"),
    (Opaque, r"Customer: type Opaque cannot be stored"),
])
def test_unstorable_state_types_are_refused_when_the_type_is_defined(state: Any,
                                                                      match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        AggregateType("Customer", state=state)


def test_unknown_state_fields_policy_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="unknown_state_fields"):
        AggregateType("Customer", state=Customer, unknown_state_fields="drop")  # type: ignore[arg-type]


# -- unknown stored fields ------------------------------------------------------------------
_OLD_DOC = {"address": {"city": "Oslo", "zip": "0150"}, "tags": ["a"], "vip": True}


def test_unknown_fields_are_kept_by_default() -> None:
    codec = customers.codec
    state = codec.load(_OLD_DOC)
    assert state == Customer(Address("Oslo"), ("a",))
    doc = codec.dump(replace(state, tags=("a", "b")))
    assert doc == {"address": {"city": "Oslo", "zip": "0150"}, "tags": ["a", "b"], "vip": True}
    # a new aggregate (no stored state) has none
    codec.load(None)
    assert codec.dump(Customer()) == {"address": {"city": ""}, "tags": []}


def _write_old_doc_then_move(db: Any, atype: AggregateType[Customer]) -> Any:
    db[atype.collection].insert_one({"_id": "c-9", "_v": 1, "_type": "Customer",
                                     "state": _OLD_DOC, "_seq": 0, "outbox": []})
    w = StoreWriter(db, Registry([atype]), sleep=lambda s: None, clock=lambda: NOW)
    (out,) = w.process([message("Moved", {"city": "Bergen"}, to=atype, id="c-9")])
    return out, db[atype.collection].find_one({"_id": "c-9"})


def test_unknown_fields_keep_carries_them_through_a_write() -> None:
    out, doc = _write_old_doc_then_move(memory_database("keep"), customers)
    assert out.outcome == "applied"
    # carried unchanged, wherever their parent document still is
    assert doc["state"] == {"address": {"city": "Bergen", "zip": "0150"},
                            "tags": ["a", "Bergen"], "vip": True}


def test_unknown_fields_refuse_dead_letters_invalid_state() -> None:
    strict = AggregateType("Customer", state=Customer, collection="strict_customers",
                           unknown_state_fields="refuse")
    strict.handles("Moved")(moved)
    out, doc = _write_old_doc_then_move(memory_database("refuse"), strict)
    assert (out.outcome, out.reason) == ("dead_lettered", "invalid_state")
    assert "Customer.address.zip" in out.detail or "Customer.vip" in out.detail
    assert doc["state"] == _OLD_DOC


# -- the harness's round-trip check ---------------------------------------------------------
@dataclass(frozen=True)
class Lossy:
    n: int = 0
    note: Any = None  # Any: stored as plain BSON, a tuple comes back a list


lossy = AggregateType("Lossy", state=Lossy)


@lossy.handles("Bump")
def bump(state: Lossy, msg: Message) -> Lossy:
    return replace(state, n=state.n + 1, note=("x",))


@dataclass(eq=False)
class NoEq:
    n: int = 0


noeq = AggregateType("NoEq", state=NoEq)


@noeq.handles("Bump")
def bump_noeq(state: NoEq, msg: Message) -> NoEq:
    return NoEq(state.n + 1)


def test_harness_catches_a_state_that_does_not_survive_the_store() -> None:
    h = AggregateHarness(lossy, aggregate_id="l-1")
    with pytest.raises(HandlerError, match=r"Lossy: .*round trip: state\.note: tuple"):
        h.when(message("Bump", to=lossy, id="l-1"))
    h2 = AggregateHarness(noeq, aggregate_id="n-1", check_determinism=False)
    with pytest.raises(HandlerError, match="NoEq: the state does not survive"):
        h2.when(message("Bump", to=noeq, id="n-1"))


# -- generated state types (hypothesis) -----------------------------------------------------
_counter = iter(range(10**9))

_ms_datetimes = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                             timezones=st.just(UTC)).map(
    lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000))
_decimals = st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
    lambda d: len(d.as_tuple().digits) <= 34 and -6176 <= d.as_tuple().exponent <= 6111)

#: leaf types with a strategy for their values
LEAVES: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (str, st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=8)),
    (int, st.integers(-(2**63), 2**63 - 1)),
    (float, st.floats(allow_nan=False)),
    (bool, st.booleans()),
    (datetime, _ms_datetimes),
    (date, st.dates()),
    (Decimal, _decimals),
    (Color, st.sampled_from(Color)),
    (Level, st.sampled_from(Level)),
    (uuid.UUID, st.uuids()),
]

TypeAndValues = tuple[Any, st.SearchStrategy[Any]]


def _extend(inner: st.SearchStrategy[TypeAndValues]) -> st.SearchStrategy[TypeAndValues]:
    def lst(tv: TypeAndValues) -> TypeAndValues:
        return list[tv[0]], st.lists(tv[1], max_size=3)  # type: ignore[name-defined]

    def tup(tv: TypeAndValues) -> TypeAndValues:
        return tuple[tv[0], ...], st.lists(tv[1], max_size=3).map(tuple)  # type: ignore[name-defined]

    def dct(tv: TypeAndValues) -> TypeAndValues:
        keys = st.text(alphabet="abcxyz_", min_size=1, max_size=4)
        return dict[str, tv[0]], st.dictionaries(keys, tv[1], max_size=3)  # type: ignore[name-defined]

    def opt(tv: TypeAndValues) -> TypeAndValues:
        return tv[0] | None, st.none() | tv[1]

    def struct(fields: list[TypeAndValues]) -> TypeAndValues:
        n = next(_counter)
        names = [f"f{i}" for i in range(len(fields))]
        cls = dataclasses.make_dataclass(f"Gen{n}", [(nm, tv[0]) for nm, tv in
                                                      zip(names, fields, strict=True)],
                                         frozen=bool(n % 2))
        globals()[cls.__name__] = cls  # so annotations resolve and repr is readable
        cls.__module__ = __name__
        return cls, st.builds(cls, **{nm: tv[1] for nm, tv in
                                       zip(names, fields, strict=True)})

    hashable = inner.filter(lambda tv: _is_hashable_leaf(tv[0]))
    return st.one_of(
        inner.map(lst), inner.map(tup), inner.map(dct), inner.map(opt),
        hashable.map(lambda tv: (frozenset[tv[0]],  # type: ignore[name-defined]
                                 st.frozensets(tv[1], max_size=3))),
        st.lists(inner, min_size=1, max_size=4).map(struct),
    )


def _is_hashable_leaf(tp: Any) -> bool:
    return any(tp is leaf for leaf, _ in LEAVES)


_field_types = st.recursive(st.sampled_from(LEAVES), _extend, max_leaves=6)


@st.composite
def state_types_and_values(draw: st.DrawFn) -> tuple[Any, Any]:
    fields = draw(st.lists(_field_types, min_size=1, max_size=4))
    n = next(_counter)
    names = [f"g{i}" for i in range(len(fields))]
    cls = dataclasses.make_dataclass(f"State{n}", [(nm, tv[0]) for nm, tv in
                                                   zip(names, fields, strict=True)])
    cls.__module__ = __name__
    globals()[cls.__name__] = cls
    value = draw(st.builds(cls, **{nm: tv[1] for nm, tv in zip(names, fields, strict=True)}))
    return cls, value


_codecs: dict[Any, StateCodec[Any]] = {}


def _codec(cls: Any) -> StateCodec[Any]:
    if cls not in _codecs:
        _codecs[cls] = StateCodec(cls)
    return _codecs[cls]


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(state_types_and_values())
def test_generated_state_types_round_trip(tv: tuple[Any, Any]) -> None:
    cls, x = tv
    codec = _codec(cls)
    doc = codec.dump(x)
    assert codec.load(doc) == x
    assert codec.dump(codec.load(doc)) == doc
    stored = _bson_round_trip(doc)
    assert codec.load(stored) == x
    assert codec.dump(codec.load(stored)) == doc


@pytest.fixture(scope="module")
def server_collection(mongo_uri: str) -> Iterator[Any]:
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri, tz_aware=True)
    name = f"t_codec_{uuid.uuid4().hex[:8]}"
    yield client[name]["states"]
    client.drop_database(name)
    client.close()


@pytest.mark.mongo
@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(tv=state_types_and_values())
def test_generated_state_types_round_trip_through_the_server(server_collection: Any,
                                                              tv: tuple[Any, Any]) -> None:
    cls, x = tv
    codec = _codec(cls)
    doc = codec.dump(x)
    _id = uuid.uuid4().hex
    server_collection.insert_one({"_id": _id, "state": doc})
    stored = server_collection.find_one({"_id": _id})["state"]
    assert codec.load(stored) == x
    assert codec.dump(codec.load(stored)) == doc


def test_a_stored_state_that_does_not_fit_dead_letters_its_messages_not_the_batch() -> None:
    from aggregates import AggboxSettings, Registry, StoreWriter
    from aggregates.testing import memory_database
    from tests.aggregates.domain import make_counter, msg

    counters = make_counter("Counter")
    db = memory_database("misfit")
    db.counters.insert_one({"_id": "bad", "_v": 1, "state": {"total": "abc", "items": []}})
    w = StoreWriter(db, Registry([counters]), settings=AggboxSettings())
    out = w.process([msg("m1", 1, agg="bad"), msg("m2", 2, agg="good")])
    assert [(o.aggregate_id, o.outcome, o.reason) for o in out] == [
        ("bad", "dead_lettered", "invalid_state"), ("good", "applied", None)]
    assert "total" in (out[0].detail or "")
    assert db.counters.find_one({"_id": "good"})["state"]["total"] == 2
