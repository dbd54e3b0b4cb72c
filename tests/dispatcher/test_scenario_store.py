"""A scenario's routing is the dispatcher's (issue 26): the message a scenario delivers for
an outbox entry is the one the dispatcher publishes (both use
``aggregates.wire.outbound.entry_envelope``), and a flow run with ``Scenario(with_store=db)``
ends in the same documents' states and exchanges the same message ids as the store writer
fed by the real dispatcher (``--once``, JSON Lines), on the local server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from aggbox.examples.orders import customers, orders, registry
from aggregates import AggboxSettings, Message, StoreWriter
from aggregates.testing import AggregateHarness, Scenario, message
from aggregates.wire.outbound import entry_message
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from dispatcher.publishers.builder import build_record
from tests.aggregates.scenario_domain import shipments


def test_an_entry_becomes_the_message_the_dispatcher_publishes() -> None:
    h = AggregateHarness(shipments, aggregate_id="s-1")
    h.when(message("PlaceOrder", {"address": "x"}, to=shipments, id="s-1", schema_version=2,
                   headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}))
    entries = h.dispatch()
    assert [e["type"] for e in entries] == ["BookShipment", "Placed"]
    for e in entries:
        published = build_record(e, collection="shipments", document_id="s-1",
                                 source_type="Shipment", topic_template="{aggregate_type}")
        assert entry_message(e, document_id="s-1", source_type="Shipment") == published.message


def credit_inputs() -> list[Message]:
    return [
        message("CustomerRegistered", {"name": "Ada", "credit_limit": 100}, to=customers,
                id="c-1", message_id="reg-c-1"),
        message("PlaceOrder", {"customer_id": "c-1", "amount": 30}, to=orders, id="o-1",
                message_id="place-o-1", source=("Checkout", "o-1", 1)),
        message("PlaceOrder", {"customer_id": "c-1", "amount": 80}, to=orders, id="o-2",
                message_id="place-o-2", source=("Checkout", "o-2", 1)),
    ]


def states(db: Database[Any]) -> dict[tuple[str, str], Any]:
    return {(t.name, d["_id"]): t.load_state(d["state"], d.get("_sv", 1))
            for t in registry for d in db[t.collection].find()}


@pytest.mark.mongo
def test_with_store_ends_where_the_real_dispatcher_ends(
        db: Database[Any], mongo_client: Any, mongo_uri: str, tmp_path: Path) -> None:
    sc = Scenario(registry, with_store=db)
    sc.given(credit_inputs()[0])
    sc.when(*credit_inputs()[1:])
    in_scenario = {e.message_id for e in sc.timeline if e.kind in ("input", "message")}

    other = mongo_client[db.name + "_d"]
    try:
        settings = AggboxSettings.load(mongodb_uri=mongo_uri, database=other.name,
                                       pipeline_depth=1)
        writer = StoreWriter(other, registry, settings=settings)
        writer.ensure_indexes()
        writer.process(credit_inputs())
        seen = {m.message_id for m in credit_inputs()}
        out = tmp_path / "out"
        for _ in range(5):  # deliver until nothing is published any more
            asyncio.run(Dispatcher(DispatcherSettings.load(
                aggregates="aggbox.examples.orders", publisher="jsonl", jsonl_dir=str(out),
                metrics_port=0), store=settings).run(once=True))
            published = [Message.from_dict(json.loads(line)) for f in sorted(out.glob("*.jsonl"))
                         for line in f.read_text().splitlines()]
            for f in out.glob("*.jsonl"):
                f.unlink()
            if not published:
                break
            seen |= {m.message_id for m in published}
            writer.process(published)
        assert states(other) == states(db) == sc.states()
        assert seen == in_scenario
    finally:
        mongo_client.drop_database(other.name)
