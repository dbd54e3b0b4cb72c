"""The batch fold against the definition (docs/design.md "The batch fold"): the same input
through ``StoreWriter(native=True)`` and ``StoreWriter(native=False)`` on the local server
gives the same outcomes and, after every batch, byte-identical collections — aggregate
documents, inbox archives, dead letters, parked messages.

The input is drawn over tests/aggregates/native_domain.py, whose handlers take every path
of the native fold and of its hand-back to the definition (errors, invalid results and
emits, timers, unknown types, events, duplicates with other payloads, gaps, the horizon,
size budgets), in several batches with and without run stamps (a retried attempt of the same
run, another run), small slices and chunks (an aggregate's slices alternate between the two
folds), and ids with ``/``, ``$``, ``.`` and non-ASCII characters.
"""

from __future__ import annotations

import dataclasses
import itertools
from datetime import timedelta
from typing import Any

import pytest
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient

from aggregates import AggboxSettings, Message, StoreWriter
from aggregates.dedup.runs import RunStamp
from aggregates.store.nativefold import NATIVE
from tests.aggregates.native_domain import T0, registry
from tests.hypo import examples

pytestmark = pytest.mark.mongo

CLOCK = T0 + timedelta(days=1)
RAW: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
EMITS = ("dict", "to", "typed", "topic", "sv", "sv1", "headers", "tuple", "nan", "big",
         "dotted", "datetime", "unicode", "schedule", "cancel")
ACTS = ("ok", "ok", "ok", "ok", "boom", "none", "bad_tuple", "note_big", "unstorable",
        "huge_int", "odd_key", "when")
TYPES = ("Acct", "Acct", "Ledger", "Seq", "Loose", "Typed", "Nope")


def _settings(**kw: Any) -> AggboxSettings:
    base = AggboxSettings().model_dump()
    base.update({"pipeline_depth": 1, "chunk_aggregates": 3, "chunk_messages": 8,
                 "slice_messages": 2, "max_document_bytes": 12_000, **kw})
    return AggboxSettings.model_construct(**base)


@st.composite
def deliveries(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 28))
    out = []
    for _ in range(n):
        atype = draw(st.sampled_from(TYPES))
        mtype = draw(st.sampled_from(("Op", "Op", "Op", "Op2", "Renamed", "Unknown")))
        payload: dict[str, Any]
        if mtype == "Renamed":
            payload = draw(st.sampled_from((
                {"name": "x", "ratio": 1.5}, {"name": "y", "ratio": 2},
                {"name": 3}, {"name": "z", "ratio": 0.25, "emit": ["typed"]})))
        else:
            payload = {"n": draw(st.integers(-3, 9)),
                       "act": draw(st.sampled_from(ACTS)),
                       "emit": draw(st.lists(st.sampled_from(EMITS), max_size=3))}
        env: dict[str, Any] = {
            "message_id": f"m{draw(st.integers(0, 11))}",
            "type": mtype,
            "aggregate_type": atype if atype != "Nope" else "Nope",
            "aggregate_id": draw(st.sampled_from(("a", "b", "c/d", "$x.y", "ü"))),
            "payload": payload,
        }
        when = draw(st.sampled_from(("none", "t", "t", "old")))
        if when == "t":
            env["occurred_at"] = (T0 + timedelta(minutes=draw(st.integers(0, 30)))).isoformat()
        elif when == "old":
            env["occurred_at"] = (T0 - timedelta(days=10)).isoformat()
        if atype in ("Ledger", "Seq") or draw(st.booleans()):
            env["source"] = {"type": "Src", "id": draw(st.sampled_from(("s1", "s/2", "s.3"))),
                             "seq": draw(st.integers(1, 6))}
        headers = draw(st.sampled_from(("none", "none", "trace", "event")))
        if headers == "trace":
            env["headers"] = {"traceparent": TRACEPARENT}
        elif headers == "event":
            env["headers"] = {"aggbox-kind": "event"}
        if draw(st.booleans()):
            env["correlation_id"] = "corr-1"
        out.append(env)
    return out


def _dump(db: Any) -> dict[str, list[bytes]]:
    """Every collection's documents as stored (BSON bytes, by _id)."""
    out: dict[str, list[bytes]] = {}
    for name in sorted(db.list_collection_names()):
        coll = db.get_collection(name, codec_options=RAW)
        out[name] = [d.raw for d in coll.find({}, sort=[("_id", 1)])]
    return out


STAMPS = (None, RunStamp("r1", "task 0.0"), RunStamp("r1", "task 0.1"),
          RunStamp("r2", "task 0.0"))


def _run(db: Any, batches: list[list[Message]], stamps: list[int], native: bool,
         **kw: Any) -> tuple[list[Any], list[dict[str, list[bytes]]], list[tuple[int, int]]]:
    outcomes, dumps, counts = [], [], []
    for batch, stamp in zip(batches, stamps, strict=True):
        # Odd stamps: a store whose clock is not the writer's (the archive's expiry moves).
        writer = StoreWriter(db, registry, settings=_settings(**kw), clock=lambda: CLOCK,
                             native=native, run=STAMPS[stamp],
                             store_clock=(lambda: CLOCK + timedelta(hours=5, microseconds=7))
                             if stamp % 2 else None)
        writer.ensure_indexes()
        outcomes.append(writer.process(batch))
        dumps.append(_dump(db))
        counts.append((writer.stats.native_slices, writer.stats.definition_slices))
    return outcomes, dumps, counts


TOTALS = {"native": 0, "definition": 0}


@pytest.mark.skipif(NATIVE is None, reason="without the native core there is one fold "
                    "(tests/test_native_core.py fails when cargo is present and it is not)")
@settings(max_examples=examples(80), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(envs=deliveries(), cuts=st.lists(st.integers(0, 28), max_size=2),
       stamps=st.lists(st.integers(0, 3), min_size=3, max_size=3),
       replay=st.booleans())
def test_native_fold_writes_what_the_definition_writes(
        mongo_client: MongoClient[dict[str, Any]], envs: list[dict[str, Any]],
        cuts: list[int], stamps: list[int], replay: bool) -> None:
    messages = [Message.from_dict(e) for e in envs]
    edges = sorted({0, len(messages), *[min(c, len(messages)) for c in cuts]})
    batches = [messages[a:b] for a, b in itertools.pairwise(edges)]
    if replay:  # the whole input again: duplicates, claims of an earlier attempt
        batches.append(messages)
    stamps = (stamps * 2)[:len(batches)]
    results = []
    for native in (False, True):
        name = f"nf_{'n' if native else 'd'}_{id(envs) % 10**9}"
        mongo_client.drop_database(name)
        try:
            results.append(_run(mongo_client[name], batches, stamps, native))
        finally:
            mongo_client.drop_database(name)
    (out_d, dump_d, counts_d), (out_n, dump_n, counts_n) = results
    assert all(n == 0 for n, _ in counts_d)
    for i, (a, b) in enumerate(zip(out_d, out_n, strict=True)):
        assert b == a, f"batch {i}: outcomes differ"
    for i, (a, b) in enumerate(zip(dump_d, dump_n, strict=True)):
        assert b.keys() == a.keys(), f"batch {i}: collections differ"
        for coll in a:
            assert b[coll] == a[coll], f"batch {i}: {coll} differs"
    TOTALS["native"] += sum(n for n, _ in counts_n)
    TOTALS["definition"] += sum(d for _, d in counts_n)


@pytest.mark.skipif(NATIVE is None, reason="without the native core there is one fold")
def test_the_drawn_runs_took_both_folds() -> None:
    """The property above is only worth something if the native fold took slices and
    handed others back (run after it, in file order)."""
    if TOTALS["native"] == 0 and TOTALS["definition"] == 0:
        pytest.skip("run with the property test above")
    assert TOTALS["native"] > 0
    assert TOTALS["definition"] > 0


@pytest.mark.skipif(NATIVE is None, reason="without the native core there is one fold")
def test_a_slice_handed_back_after_a_native_write_reads_the_document_again(
        mongo_client: MongoClient[dict[str, Any]]) -> None:
    """Slices of 2: the first two messages are folded natively and written, the third
    raises in its handler — the definition must fold that slice on the document as written,
    not as first read."""
    envs = [{"message_id": f"k{i}", "type": "Op", "aggregate_type": "Acct",
             "aggregate_id": "a", "payload": {"n": i, "act": act, "emit": ["dict"]},
             "occurred_at": (T0 + timedelta(minutes=i)).isoformat()}
            for i, act in enumerate(("ok", "ok", "boom", "ok", "ok"))]
    messages = [Message.from_dict(e) for e in envs]
    results = []
    for native in (False, True):
        name = f"nf_reread_{int(native)}"
        mongo_client.drop_database(name)
        try:
            results.append(_run(mongo_client[name], [messages], [1], native))
        finally:
            mongo_client.drop_database(name)
    (out_d, dump_d, _), (out_n, dump_n, counts_n) = results
    assert out_n == out_d
    assert dump_n == dump_d
    native, definition = counts_n[0]
    assert native >= 1 and definition >= 1
    assert [o.outcome for o in out_n[0]] == ["applied", "applied", "dead_lettered",
                                              "applied", "applied"]


@pytest.mark.skipif(NATIVE is None, reason="without the native core there is one fold")
@pytest.mark.parametrize("store_clock", [False, True])
def test_ids_leaving_the_inbox_are_archived_as_the_definition_archives_them(
        mongo_client: MongoClient[dict[str, Any]], store_clock: bool) -> None:
    """A hot aggregate (window 3, slices of 2) over three batches — undated messages, dated
    ones, a run stamp, redeliveries — leaves the same documents, archive documents (their
    expiry with and without a store clock of its own) and outcomes both ways."""
    def env(i: int, dated: bool) -> dict[str, Any]:
        e: dict[str, Any] = {"message_id": f"h{i}", "type": "Op", "aggregate_type": "Acct",
                             "aggregate_id": "hot/1", "payload": {"n": i, "emit": ["dict"]}}
        if dated:
            e["occurred_at"] = (T0 + timedelta(seconds=i, microseconds=1000)).isoformat()
        return e

    first = [Message.from_dict(env(i, i % 3 != 0)) for i in range(9)]
    second = [Message.from_dict(env(i, i % 3 != 0)) for i in range(5, 16)]
    third = first[:4] + second[-3:]
    results = []
    for native in (False, True):
        name = f"nf_archive_{int(native)}_{int(store_clock)}"
        mongo_client.drop_database(name)
        try:
            results.append(_run(mongo_client[name], [first, second, third],
                                [1 if store_clock else 2] * 3, native))
        finally:
            mongo_client.drop_database(name)
    (out_d, dump_d, _), (out_n, dump_n, counts_n) = results
    assert out_n == out_d
    assert dump_n == dump_d
    assert len(dump_n[-1]["nf_accts_inbox_archive"]) >= 10
    assert sum(n for n, _ in counts_n) >= 6


@dataclasses.dataclass(frozen=True)
class _Frozen:
    a: str
    b: int
    c: float
    d: bool = False
    e: int | None = None
    f: str | int = "x"


@dataclasses.dataclass
class _Plain:
    a: float | None
    b: str = "b"


class _Str(str):
    pass


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False),
                    st.text(max_size=3), st.just(_Str("s")), st.just([1]), st.just({"k": 1}))


@pytest.mark.skipif(NATIVE is None, reason="without the native core there is one fold")
@settings(max_examples=examples(400), deadline=None)
@given(cls=st.sampled_from([_Frozen, _Plain]),
       payload=st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e", "f", "zz"]), _VALUES))
def test_a_payload_object_built_directly_is_the_one_pydantic_validates(
        cls: type[Any], payload: dict[str, Any]) -> None:
    """Typed payloads of plain scalar dataclasses are built by the core without pydantic
    when every value is of exactly a type its field takes as it is: the object must be
    pydantic's (its type, its fields, each value's type); any other payload — an int for a
    float field, a bool for an int, a str subclass, a missing field, a key the class has
    not — is left to pydantic (None)."""
    from pydantic import TypeAdapter, ValidationError

    from aggregates.store.nativefold import _direct_payload

    direct = _direct_payload(cls)
    assert direct is not None
    built = direct.make(payload)
    try:
        expected = TypeAdapter(cls).validator.validate_python(payload)
    except ValidationError:
        assert built is None
        return
    if built is not None:
        assert type(built) is cls
        assert list(vars(built)) == list(vars(expected))
        assert vars(built) == vars(expected)
        assert [type(v) for v in vars(built).values()] == [
            type(v) for v in vars(expected).values()]
    else:  # pydantic converted or dropped something: the core must have declined
        assert (any(type(payload[k]) is not type(getattr(expected, k)) for k in payload
                    if hasattr(expected, k)) or set(payload) - set(vars(expected))
                or any(isinstance(v, _Str) for v in payload.values()))


def test_only_plain_scalar_dataclasses_are_built_directly() -> None:
    from pydantic import BaseModel

    from aggregates.store.nativefold import _direct_payload

    @dataclasses.dataclass
    class WithPostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass
    class WithFactory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(slots=True)
    class Slotted:
        a: int

    class Model(BaseModel):
        a: int

    for cls in (WithPostInit, WithFactory, Slotted, Model):
        assert _direct_payload(cls) is None, cls
