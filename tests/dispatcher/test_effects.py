"""The effect runner in process, against the local MongoDB, with effects written in Python:
the result reaches the aggregate once, the entry leaves the outbox only after it, retries,
timeouts, permanent failures and exhausted attempts end in a failure message plus a dead
letter, an open attempt is settled by the query function, per-aggregate order holds, and
the configuration is checked before anything runs. (Crashes of a real process and the
built-in HTTP/SMTP effects: test_effect_crashes.py, test_effect_builtins.py.)"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from aggregates import AggboxSettings, Message, StoreWriter
from aggregates.core.errors import ConfigurationError
from aggregates.domain.effects import (
    REPLY_SOURCE_TYPE,
    EffectCall,
    Effects,
    PermanentEffectError,
    RetryableEffectError,
    reply_message_id,
)
from aggregates.message.envelope import Source
from aggregates.ops import DeadLetterStore
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from dispatcher.effects.attempts import attempt_key
from tests.dispatcher.effectdomain import registry
from tests.dispatcher.helpers import ListPublisher, quick_settings

pytestmark = [pytest.mark.mongo]

DOMAIN = "tests.dispatcher.effectdomain"


class Resource:
    """A shipping service in memory: counts calls and bookings per key; ``script`` maps a
    call number (per key, from 1) to what happens instead of a booking."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.booked: dict[str, str] = {}
        self.script: dict[int, Callable[[], Any]] = {}
        self.scripted: set[str] | None = None  # the keys the script applies to (None: all)
        self.headers: dict[str, Mapping[str, str]] = {}  # the last call's headers, per key
        self.lock = threading.Lock()

    def book(self, call: EffectCall) -> Mapping[str, Any]:
        with self.lock:
            self.calls[call.idempotency_key] += 1
            n = self.calls[call.idempotency_key]
            self.headers[call.idempotency_key] = call.headers
        action = self.script.get(n)
        if action is not None and (self.scripted is None
                                   or call.idempotency_key in self.scripted):
            return action()  # type: ignore[no-any-return]
        tracking = f"T-{call.payload['order_id']}"
        with self.lock:
            self.booked[call.idempotency_key] = tracking
        return {"tracking": tracking}

    def find(self, call: EffectCall) -> Mapping[str, Any] | None:
        found = self.booked.get(call.idempotency_key)
        return None if found is None else {"tracking": found}


def effects_for(resource: Resource, *, query: bool = False, timeout_s: float = 5.0,
                max_attempts: int = 3) -> Effects:
    effects = Effects()
    effects.effect("BookShipment", on_success="ShipmentBooked", on_failure="ShipmentFailed",
                   timeout_s=timeout_s, max_attempts=max_attempts)(resource.book)
    if query:
        effects.query("BookShipment")(resource.find)
    return effects


def settings(**over: Any) -> DispatcherSettings:
    return quick_settings(DOMAIN, **over)


@pytest.fixture
def ewriter(ddb: Database[Any], store: AggboxSettings) -> StoreWriter:
    w = StoreWriter(ddb, registry, settings=store)
    w.ensure_indexes()
    return w


def place(writer: StoreWriter, ids: list[str], *, atype: str = "Order",
          **payload: Any) -> None:
    outcomes = writer.process([Message(f"place-{i}", "PlaceOrder", atype, i, dict(payload),
                                       source=Source("Client", i, 1)) for i in ids])
    assert [o.outcome for o in outcomes] == ["applied"] * len(ids)


def entry_ids(db: Database[Any], collection: str = "eorders") -> dict[str, list[str]]:
    return {d["_id"]: [e["id"] for e in d.get("outbox", [])]
            for d in db[collection].find({}, {"outbox": 1})}


def state(db: Database[Any], aid: str, collection: str = "eorders") -> dict[str, Any]:
    doc = db[collection].find_one({"_id": aid})
    assert doc is not None
    return dict(doc["state"])


def run_once(store: AggboxSettings, effects: Effects, publisher: ListPublisher | None = None,
             **over: Any) -> Dispatcher:
    d = Dispatcher(settings(**over), store=store, publisher=publisher or ListPublisher(),
                   effects=effects)
    assert asyncio.run(d.run(once=True)) == 0
    return d


def letters(db: Database[Any], store: AggboxSettings) -> list[dict[str, Any]]:
    return list(DeadLetterStore(db, collection=store.dead_letter_collection).list())


@pytest.mark.parametrize(("atype", "collection"), [("Order", "eorders"),
                                                   ("HwOrder", "hworders")])
def test_result_applied_once_then_entry_pulled(
        atype: str, collection: str, ewriter: StoreWriter, ddb: Database[Any],
        store: AggboxSettings) -> None:
    place(ewriter, ["o-1", "o/2.$x"], atype=atype)
    ids = entry_ids(ddb, collection)
    res = Resource()
    d = run_once(store, effects_for(res))
    for aid, (eid,) in ids.items():
        s = state(ddb, aid, collection)
        assert (s["status"], s["results"], s["tracking"]) == ("booked", 1, f"T-{aid}")
        assert res.calls[eid] == 1
        rec = ddb.aggbox_effects.find_one({"_id": attempt_key(collection, eid)})
        assert rec is not None and rec["state"] == "succeeded" and rec["attempts"] == 1
        assert rec["result"] == {"tracking": f"T-{aid}"}
    assert entry_ids(ddb, collection) == {aid: [] for aid in ids}
    assert d.metrics.registry.get_sample_value(
        "aggbox_effect_calls_total", {"type": "BookShipment"}) == 2
    # Executed, not published: the broker counter stays at 0.
    assert d.metrics.registry.get_sample_value(
        "aggbox_dispatcher_published_total", {"collection": collection}) == 0
    # Delivering the reply again (a crash after the write, before the pull) is a duplicate.
    eid = ids["o-1"][0]
    again = ewriter.process([Message(reply_message_id(eid), "ShipmentBooked", atype, "o-1",
                                     {"tracking": "T-o-1"},
                                     source=_reply_source("o-1", 1))])
    assert again[0].outcome == "duplicate"
    assert state(ddb, "o-1", collection)["results"] == 1


def _reply_source(aid: str, seq: int) -> Source:
    return Source(REPLY_SOURCE_TYPE, aid, seq)


def test_retryable_failures_back_off_then_succeed(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    place(ewriter, ["o-1"])
    (eid,) = entry_ids(ddb)["o-1"]
    res = Resource()
    res.script = {1: _raise(RetryableEffectError("HTTP 503")),
                  2: _raise(RetryableEffectError("HTTP 502"))}
    d = run_once(store, effects_for(res, max_attempts=3))
    assert res.calls[eid] == 3 and state(ddb, "o-1")["status"] == "booked"
    assert state(ddb, "o-1")["results"] == 1
    assert d.metrics.registry.get_sample_value(
        "aggbox_effect_retries_total",
        {"type": "BookShipment", "reason": "effect_retryable"}) == 2
    # Without a query function an open attempt is called again, and says so.
    assert d.metrics.registry.get_sample_value(
        "aggbox_effect_recoveries_total",
        {"type": "BookShipment", "decision": "call_again"}) == 2
    assert letters(ddb, store) == []


def test_permanent_failure_sends_failure_message_and_dead_letters(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    place(ewriter, ["o-1"], event_after=True)
    eid, event_id = entry_ids(ddb)["o-1"]
    res = Resource()
    res.script = {1: _raise(PermanentEffectError("effect_rejected", "HTTP 422 bad address"))}
    pub = ListPublisher()
    run_once(store, effects_for(res), pub)
    s = state(ddb, "o-1")
    assert (s["status"], s["failure"], s["results"]) == ("failed", "effect_rejected", 1)
    assert res.calls[eid] == 1
    (dl,) = letters(ddb, store)
    assert dl["message_id"] == eid and dl["reason"] == "effect_rejected"
    assert "HTTP 422" in dl["error"]
    # The ordinary event after the effect is published; nothing is left.
    assert [r.message_id for r in pub.records] == [event_id]
    assert entry_ids(ddb) == {"o-1": []}


def test_attempts_exhausted_and_timeouts(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    place(ewriter, ["o-1"])
    (eid,) = entry_ids(ddb)["o-1"]
    res = Resource()

    def hang() -> Any:
        threading.Event().wait(1.0)
        return {"tracking": "late"}

    res.script = {1: hang, 2: _raise(RetryableEffectError("HTTP 503"))}
    d = run_once(store, effects_for(res, timeout_s=0.2, max_attempts=2))
    s = state(ddb, "o-1")
    assert (s["status"], s["failure"], s["results"]) == ("failed", "effect_attempts_exhausted", 1)
    assert res.calls[eid] == 2
    (dl,) = letters(ddb, store)
    assert dl["reason"] == "effect_attempts_exhausted" and "HTTP 503" in dl["error"]
    assert d.metrics.registry.get_sample_value(
        "aggbox_effect_retries_total",
        {"type": "BookShipment", "reason": "effect_timeout"}) == 1
    rec = ddb.aggbox_effects.find_one({"_id": attempt_key("eorders", eid)})
    assert rec is not None and rec["state"] == "failed" and rec["attempts"] == 2


def test_open_attempt_is_settled_by_the_query_without_calling_again(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    place(ewriter, ["done", "not-done"])
    ids = entry_ids(ddb)
    res = Resource()
    now = datetime.now(UTC)
    for (eid,) in ids.values():  # what a crash between call and result leaves
        ddb.aggbox_effects.insert_one({"_id": attempt_key("eorders", eid), "state": "attempting",
                                       "attempts": 1, "first_at": now, "last_at": now})
    res.booked[ids["done"][0]] = "T-earlier"  # the crashed call did take effect
    d = run_once(store, effects_for(res, query=True))
    assert res.calls[ids["done"][0]] == 0
    assert state(ddb, "done")["tracking"] == "T-earlier"
    assert res.calls[ids["not-done"][0]] == 1
    assert state(ddb, "not-done")["tracking"] == "T-not-done"
    for aid in ids:
        assert state(ddb, aid)["results"] == 1
    get = d.metrics.registry.get_sample_value
    assert get("aggbox_effect_recoveries_total",
               {"type": "BookShipment", "decision": "query_done"}) == 1
    assert get("aggbox_effect_recoveries_total",
               {"type": "BookShipment", "decision": "query_not_done"}) == 1


def test_recorded_result_is_delivered_without_a_call(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    place(ewriter, ["o-1"])
    (eid,) = entry_ids(ddb)["o-1"]
    now = datetime.now(UTC)
    ddb.aggbox_effects.insert_one({"_id": attempt_key("eorders", eid), "state": "succeeded",
                                   "attempts": 1, "result": {"tracking": "T-recorded"},
                                   "finished_at": now})
    res = Resource()
    run_once(store, effects_for(res))
    assert res.calls[eid] == 0
    s = state(ddb, "o-1")
    assert (s["tracking"], s["results"]) == ("T-recorded", 1)


def test_a_retrying_effect_holds_back_later_entries_of_its_aggregate_only(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    place(ewriter, ["slow", "fast"], event_after=True)
    ids = entry_ids(ddb)
    res = Resource()
    pub = ListPublisher()
    published_at_failure: list[str] = []

    def first_fails() -> Any:
        published_at_failure.extend(r.message_id for r in pub.records)
        raise RetryableEffectError("HTTP 503")

    res.script, res.scripted = {1: first_fails}, {ids["slow"][0]}
    run_once(store, effects_for(res), pub)
    # While "slow"'s effect was failing its event was not published; afterwards it was,
    # after the effect's success. "fast" was not held back by it.
    assert ids["slow"][1] not in published_at_failure
    assert res.calls[ids["slow"][0]] == 2 and res.calls[ids["fast"][0]] == 1
    assert sorted(r.message_id for r in pub.records) == sorted([ids["slow"][1],
                                                                ids["fast"][1]])
    assert entry_ids(ddb) == {"slow": [], "fast": []}
    assert state(ddb, "slow")["results"] == 1


def test_a_result_that_cannot_be_a_payload_becomes_a_failure(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    place(ewriter, ["o-1"])
    res = Resource()
    res.script = {1: lambda: {"$set": 1}}
    run_once(store, effects_for(res))
    s = state(ddb, "o-1")
    assert (s["status"], s["failure"]) == ("failed", "effect_error")
    (dl,) = letters(ddb, store)
    assert dl["reason"] == "effect_error" and "$set" in dl["error"]


def test_a_result_of_bson_foreign_values_is_recorded_and_replied_in_its_json_form(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    """A result holding a Decimal, a numpy number and a UUID (docs/design.md "JSON
    values"): recorded and delivered as "1.10", 2.5 and the UUID's text — before, the
    runner recorded the raw values, which BSON cannot store, and the effect never
    completed."""
    import uuid
    from decimal import Decimal

    import numpy as np

    place(ewriter, ["o-1"])
    (eid,) = entry_ids(ddb)["o-1"]
    ref = uuid.UUID("12345678-1234-5678-1234-567812345678")
    res = Resource()
    res.script = {1: lambda: {"tracking": Decimal("1.10"), "weight": np.float64(2.5),
                              "ref": ref}}
    run_once(store, effects_for(res))
    s = state(ddb, "o-1")
    assert (s["status"], s["tracking"], s["results"]) == ("booked", "1.10", 1)
    rec = ddb.aggbox_effects.find_one({"_id": attempt_key("eorders", eid)})
    assert rec is not None and rec["state"] == "succeeded"
    assert rec["result"] == {"tracking": "1.10", "weight": 2.5, "ref": str(ref)}
    assert entry_ids(ddb) == {"o-1": []}


def test_configuration_is_checked_before_anything_runs(store: AggboxSettings) -> None:
    effects = Effects()
    effects.effect("BookShipment", on_success="ShipmentShipped",
                   on_failure="ShipmentFailed")(Resource().book)
    d = Dispatcher(settings(), store=store, publisher=ListPublisher(), effects=effects)
    with pytest.raises(ConfigurationError, match="no aggregate type handles ShipmentShipped"):
        asyncio.run(d.run(once=True))
    with pytest.raises(ConfigurationError, match="on_success and on_failure must differ"):
        Effects().effect("X", on_success="A", on_failure="A")(Resource().book)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        Effects().effect("X", on_success="A", on_failure="B", max_attempts=0)(Resource().book)
    twice = Effects()
    twice.effect("X", on_success="A", on_failure="B")(Resource().book)
    with pytest.raises(ConfigurationError, match="registered twice"):
        twice.effect("X", on_success="A", on_failure="B")(Resource().book)
    with pytest.raises(ConfigurationError, match="no effect registered for message type 'Y'"):
        twice.query("Y")(Resource().find)


def _raise(exc: Exception) -> Callable[[], Any]:
    def action() -> Any:
        raise exc
    return action


def test_the_effect_is_a_client_span_between_the_entry_and_its_result(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        otel_spans: Any) -> None:
    """With a tracer provider: handling → ``aggbox.effect BookShipment`` (CLIENT) → the
    result's handling, one trace; the plain entry next to it gets a producer span, the
    effect entry none."""
    from opentelemetry.trace import SpanKind

    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    ewriter.process([Message("place-t", "PlaceOrder", "Order", "o-t", {"event_after": True},
                             source=Source("Client", "o-t", 1),
                             headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})])
    (eid, placed_id) = entry_ids(ddb)["o-t"]
    res = Resource()
    run_once(store, effects_for(res), ListPublisher())
    assert state(ddb, "o-t")["results"] == 1
    spans = otel_spans.get_finished_spans()
    by_name = {s.name: s for s in spans}
    placing = by_name["aggbox.handle PlaceOrder"]
    effect = by_name["aggbox.effect BookShipment"]
    result = by_name["aggbox.handle ShipmentBooked"]
    assert {s.context.trace_id for s in (placing, effect, result)} == {int(trace_id, 16)}
    assert effect.kind is SpanKind.CLIENT
    assert effect.parent is not None and effect.parent.span_id == placing.context.span_id
    assert result.parent is not None and result.parent.span_id == effect.context.span_id
    assert effect.attributes["aggbox.effect.idempotency_key"] == eid
    assert effect.attributes["aggbox.effect.guarantee"] == "at-least-once"
    # The call sees the effect span's context (the HTTP effect sends it on).
    assert res.headers[eid]["traceparent"] == (
        f"00-{trace_id}-{effect.context.span_id:016x}-01")
    producers = [s for s in spans if s.kind is SpanKind.PRODUCER]
    assert [s.attributes["messaging.message.id"] for s in producers] == [placed_id]


def test_aggbox_effects_list_finds_open_failed_and_stale_attempts(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    import json

    from aggbox.cli import main

    place(ewriter, ["o-1", "o-2"])
    ids = entry_ids(ddb)
    res = Resource()
    res.scripted = {ids["o-1"][0]}
    res.script = {1: _raise(PermanentEffectError("effect_rejected", "HTTP 422 no such street"))}
    run_once(store, effects_for(res))
    # What a crash between a call and its result leaves, two hours ago.
    stale = datetime.now(UTC) - timedelta(hours=2)
    ddb.aggbox_effects.insert_one({
        "_id": attempt_key("eorders", "e-open"), "collection": "eorders",
        "aggregate_type": "Order", "aggregate_id": "o/3.$", "type": "BookShipment",
        "entry_id": "e-open", "state": "attempting", "attempts": 1, "first_at": stale,
        "last_at": stale, "last_reason": "effect_timeout", "last_error": "no answer in 5 s"})
    assert store.mongodb_uri is not None
    monkeypatch.setenv("AGGBOX_MONGODB_URI", store.mongodb_uri)

    def listing(*args: str) -> dict[str, Any]:
        assert main(["effects", "list", "--database", ddb.name, "--json", *args]) == 0
        out: dict[str, Any] = json.loads(capsys.readouterr().out)
        return out

    def entries(out: dict[str, Any]) -> list[tuple[str, str]]:
        return [(e["aggregate_id"], e["state"]) for e in out["items"]]

    assert entries(listing()) == [("o/3.$", "attempting")]
    failed = listing("--state", "failed")["items"]
    assert [(e["aggregate_id"], e["reason"]) for e in failed] == [("o-1", "effect_rejected")]
    assert "HTTP 422" in failed[0]["error"] and failed[0]["entry_id"] == ids["o-1"][0]
    everything = listing("--state", "all", "--type", "BookShipment")
    assert everything["total"] == 3
    assert entries(listing("--state", "all", "--aggregate", "Order/o-2")) == [
        ("o-2", "succeeded")]
    assert entries(listing("--state", "all", "--older-than", "30")) == [("o/3.$", "attempting")]
    assert listing("--state", "all", "--type", "SendConfirmation")["total"] == 0
    # The table names what to do; bad options are one-line errors.
    assert main(["effects", "list", "--database", ddb.name]) == 0
    table = capsys.readouterr().out
    assert "o/3.$" in table and "effect_timeout" in table and "oldest first" in table
    with pytest.raises(SystemExit):
        main(["effects", "list", "--older-than", "soon"])
    assert "is not a number of minutes" in capsys.readouterr().err
    # The collection comes from the dispatcher's effect_collection setting.
    ddb.my_effects.insert_one({"_id": "x", "state": "attempting", "attempts": 1,
                               "last_at": stale, "type": "BookShipment"})
    config = tmp_path / "aggbox.toml"
    config.write_text('[dispatcher]\neffect_collection = "my_effects"\n')
    assert listing("--config", str(config))["total"] == 1
    assert listing("--config", str(config), "--collection", "aggbox_effects")["total"] == 1
    assert listing("--config", str(config), "--collection", "nothing_here")["total"] == 0



def test_an_instance_without_the_effect_holds_its_entries_instead_of_publishing_them(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    """A misconfigured fleet: A executes BookShipment, B has no effects. B's partitions' effect
    entries are not published as records (which would end them unexecuted) but wait, and so
    does what follows them; B says so (metric). When B stops, A takes its partitions over
    and executes them: every order ends booked exactly once."""
    from aggregates.core.partitions import partition_of
    from tests.dispatcher.helpers import run_while, wait_for

    res = Resource()
    pub_a, pub_b = ListPublisher(), ListPublisher()
    over = dict(lease_ttl_s=1.5, takeover_grace_s=0.2, collections=["eorders"])
    a = Dispatcher(settings(instance_id="A", **over), store=store, publisher=pub_a,
                   effects=effects_for(res))
    b = Dispatcher(settings(instance_id="B", **over), store=store, publisher=pub_b,
                   effects=Effects())
    ids = [f"o-{i:03d}" for i in range(40)]

    def held_by(d: Dispatcher) -> frozenset[int]:
        if not d.workers:  # not started yet
            return frozenset()
        w = d.workers[0]
        return w.selection.partitions if w.mode != "standby" else frozenset()

    def missing_on_b() -> float | None:
        return b.metrics.registry.get_sample_value("aggbox_dispatcher_effects_missing",
                                                   {"collection": "eorders"})

    async def body() -> None:
        task_b = asyncio.create_task(b.run())
        try:
            await wait_for(lambda: len(held_by(a)) == len(held_by(b)) == 128, 20,
                           "an even split")
            await wait_for(lambda: missing_on_b() == 1, 10, "B learns A's effects")
            await asyncio.to_thread(place, ewriter, ids, event_after=True)
            on_b = [o for o in ids if partition_of(o) in held_by(b)]
            on_a = [o for o in ids if o not in on_b]
            assert on_a and on_b
            await wait_for(lambda: all(state(ddb, o)["results"] == 1 for o in on_a), 20,
                           "A executes its effects")
            rounds = b.workers[0].balancer.rounds
            await wait_for(lambda: b.workers[0].balancer.rounds >= rounds + 2, 10,
                           "two more rounds of B")
            assert all(state(ddb, o)["status"] == "placed" for o in on_b)
            assert all(len(entry_ids(ddb)[o]) == 2 for o in on_b)  # both entries wait
            assert pub_b.records == []  # neither the effect nor the event after it
            # B did try them: held back by the guard, retried with backoff
            assert "is executed by other instances" in (b.workers[0].last_error or "")
        finally:
            b.request_stop()
            assert await asyncio.wait_for(task_b, 15) == 0
        await wait_for(lambda: all(state(ddb, o)["results"] == 1 for o in ids), 30,
                       "A takes B's partitions and executes the rest")

    asyncio.run(run_while(a, body))
    assert all(state(ddb, o)["status"] == "booked" for o in ids)
    assert set(res.calls.values()) == {1} and len(res.calls) == len(ids)
    assert sorted(r.message_id for r in pub_a.records) == sorted(
        entry for o in ids for entry in _placed_ids(ddb, o))
    assert entry_ids(ddb) == {o: [] for o in ids}


def _placed_ids(db: Database[Any], aid: str) -> list[str]:
    """The ids of the ``Placed`` events an order emitted (from its inbox of causes)."""
    from aggregates.core.ids import emitted_message_id

    return [emitted_message_id("Order", aid, f"place-{aid}", 1)]
