"""Stream mode finds new entries in the change events themselves (docs/design.md "How
stream mode finds new entries"): no full-document lookup per event, no read of a document
whose event showed its outbox; and on a server whose update events name no document
(mongo-java-server's own oplog), it falls back to looking them up — publishing everything,
in order, either way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient, monitoring
from pymongo.database import Database

from aggbox.servers import LocalMongo
from aggbox.servers.mongo import _start_mjs
from aggregates import AggboxSettings, StoreWriter
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from tests.dispatcher.domain import registry
from tests.dispatcher.helpers import (
    ListPublisher,
    check_delivery,
    emit,
    merge,
    pending_entries,
    run_while,
    wait_for,
)

pytestmark = [pytest.mark.mongo]


class Commands(monitoring.CommandListener):
    """The commands the dispatcher's client sends."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.seen.append((event.command_name, dict(event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def settings(**over: Any) -> DispatcherSettings:
    return DispatcherSettings.load(**{
        "collections": ["emitters"], "metrics_port": 0, "mode": "stream", "pacing_ms": 10,
        "lease_ttl_s": 3, "backoff_initial_ms": 50, "backoff_max_ms": 400,
        "sweep_interval_s": 600, **over})


def stream_opens(commands: Commands) -> list[dict[str, Any]]:
    """The $changeStream stages of the streams the dispatcher opened."""
    return [cmd["pipeline"][0]["$changeStream"] for name, cmd in commands.seen
            if name == "aggregate" and cmd.get("pipeline")
            and "$changeStream" in cmd["pipeline"][0]]


def reads_by_id(commands: Commands) -> int:
    return sum(1 for name, cmd in commands.seen if name == "find"
               and cmd.get("find") == "emitters" and "_id" in (cmd.get("filter") or {}))


def rounds_while_running(writer: StoreWriter, db: Database[Any], docs: list[str],
                         rounds: int, pub: ListPublisher, d: Dispatcher) -> Any:
    """``rounds`` writes of one entry to each document, each round once the previous one is
    published and pulled (and the dispatcher knows it: nothing in flight); returns the
    coroutine that does it and the emitted ids."""
    emitted: list[dict[str, list[str]]] = []

    async def body() -> None:
        await wait_for(lambda: d.workers[0].mode == "stream", what="stream mode")
        for _ in range(rounds):
            emitted.append(await asyncio.to_thread(emit, writer, docs))
            await wait_for(lambda: pending_entries(db) == 0 and not len(d.workers[0].inflight),
                           what="the round published")
        await wait_for(lambda: len(pub.records) >= sum(len(v) for e in emitted
                                                       for v in e.values()),
                       what="all published")

    return body, emitted


def test_updates_are_published_from_their_events_without_lookups_or_reads(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        dmongo: LocalMongo) -> None:
    """Half of the documents have entries pending at the start (the start-up sweep reads
    them), the other half are created while the dispatcher runs (their insert events show
    them); every later write appends to an outbox the dispatcher emptied, and its event
    shows the new entries: nothing is read by _id, and no event asks the server for the
    whole document (before issue 42 every event was looked up)."""
    swept = emit(writer, [f"s{i:02d}" for i in range(6)], n=2)
    commands = Commands()
    pub = ListPublisher()
    client: AsyncMongoClient[Any] = AsyncMongoClient(dmongo.uri, tz_aware=True,
                                                     event_listeners=[commands])
    d = Dispatcher(settings(), store=store, publisher=pub, client=client)
    docs = [f"s{i:02d}" for i in range(12)]
    body, emitted = rounds_while_running(writer, ddb, docs, 5, pub, d)
    asyncio.run(run_while(d, body))
    counts = check_delivery(pub.delivered(), merge(swept, *emitted))
    assert counts["duplicates"] == 0 and counts["distinct"] == 12 + 60
    opens = stream_opens(commands)
    assert opens and all("fullDocument" not in stage for stage in opens), opens
    assert reads_by_id(commands) == 0
    assert d.workers[0].follower.lookup is False


@pytest.fixture(scope="module")
def stock_mongo() -> Iterator[LocalMongo]:
    """mongo-java-server with its own oplog and change events (aggbox's launcher keeps
    them with this JVM option)."""
    server = _start_mjs(60.0, ["-Daggbox.mjs.stockChangeEvents=true"])
    with server:
        yield server


def test_a_server_whose_update_events_name_no_document_is_read_with_lookup(
        stock_mongo: LocalMongo) -> None:
    client: MongoClient[dict[str, Any]] = MongoClient(stock_mongo.uri, tz_aware=True)
    db = client["stock_events"]
    try:
        store = AggboxSettings.load(mongodb_uri=stock_mongo.uri, database=db.name)
        writer = StoreWriter(db, registry, settings=store)
        writer.ensure_indexes()
        before = emit(writer, [f"p{i}" for i in range(4)], n=2)  # pending at start
        commands = Commands()
        pub = ListPublisher()
        aclient: AsyncMongoClient[Any] = AsyncMongoClient(
            stock_mongo.uri, tz_aware=True, event_listeners=[commands])
        d = Dispatcher(settings(), store=store, publisher=pub, client=aclient)
        docs = [f"p{i}" for i in range(4)] + [f"q{i}" for i in range(4)]
        body, emitted = rounds_while_running(writer, db, docs, 4, pub, d)

        async def all_of_it() -> None:
            await body()
            await wait_for(lambda: len(pub.records) >= 8 + 32, what="everything published")

        asyncio.run(run_while(d, all_of_it))
        counts = check_delivery(pub.delivered(), merge(before, *emitted))
        assert counts["duplicates"] == 0 and counts["distinct"] == 8 + 32
        assert d.workers[0].follower.lookup is True
        assert any(stage.get("fullDocument") == "updateLookup"
                   for stage in stream_opens(commands))
    finally:
        client.drop_database(db.name)
        client.close()
