"""The effect runner killed (``kill -9``) in each of its three crash windows, against a real
local HTTP server and a real local SMTP server, for the three kinds of resource
(docs/side-effects.md): one that can be asked (query endpoint), one that honours the
idempotency key, and one that can do neither (HTTP without either; SMTP).

Each case: three orders each emit a ``BookShipment`` effect; ``aggbox dispatch --once`` runs
as a process that kills itself at the second effect's crash point; a second, unharmed
``aggbox dispatch --once`` finishes. Then every order has applied exactly one result, every
outbox is empty, and the resource did the work exactly once (queryable, idempotent) or at
least once and at most twice (neither) — twice exactly when the kill fell between the call
and its recorded result.

Also through the built-in HTTP effect in process: a timeout and 5xx answers followed by
success, and a permanent 4xx ending in the failure message and a dead letter."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from aggbox.servers import LocalMongo
from aggregates import AggboxSettings, Message, Source, StoreWriter
from aggregates.ops import DeadLetterStore
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from tests.dispatcher.effectdomain import registry
from tests.dispatcher.effectservers import MailServer, ShippingServer
from tests.dispatcher.helpers import spawn

pytestmark = [pytest.mark.mongo]

ORDERS = ["o-1", "o/2", "o.$3"]
POINTS = ["effect_before_call", "effect_after_call", "effect_after_result"]
COMMON: dict[str, Any] = {
    "aggregates": "tests.dispatcher.effectdomain", "metrics_port": 0, "lease_ttl_s": 2.0,
    "takeover_grace_s": 0.0, "backoff_initial_ms": 20.0, "backoff_max_ms": 200.0,
    "once_timeout_s": 60.0, "publisher": "jsonl",
    # One aggregate at a time: the kill at the second effect leaves exactly one effect in
    # the window, so the counts below are exact.
    "effect_concurrency": 1,
}


@pytest.fixture
def ewriter(ddb: Database[Any], store: AggboxSettings) -> StoreWriter:
    w = StoreWriter(ddb, registry, settings=store)
    w.ensure_indexes()
    return w


@pytest.fixture
def shipping_plain() -> Iterator[ShippingServer]:
    with ShippingServer(honour_idempotency=False) as server:
        yield server


def place(writer: StoreWriter, *, email: bool = False) -> dict[str, str]:
    """Place the orders; their effect entry ids by order."""
    payload: dict[str, Any] = {"email": "buyer@example.org", "ship": False} if email else {}
    out = writer.process([Message(f"place-{o}", "PlaceOrder", "Order", o, payload,
                                  source=Source("Client", o, 1)) for o in ORDERS])
    assert {x.outcome for x in out} == {"applied"}
    docs = {d["_id"]: d for d in writer.db.eorders.find()}
    effect = "SendConfirmation" if email else "BookShipment"
    return {o: next(e["id"] for e in docs[o]["outbox"] if e["type"] == effect)
            for o in ORDERS}


def http_effect(server: ShippingServer, case: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": "http", "url": server.url + "/shipments",
                            "on_success": "ShipmentBooked", "on_failure": "ShipmentFailed",
                            "timeout_s": 3.0, "max_attempts": 5}
    if case == "queryable":
        spec["query_url"] = server.url + "/shipments/by-key/{idempotency_key}"
    if case == "idempotent":
        spec["idempotent"] = True
    return {"BookShipment": spec}


def mail_effect(mail: MailServer) -> dict[str, Any]:
    return {"SendConfirmation": {
        "kind": "smtp", "host": mail.host, "port": mail.port, "sender": "shop@example.org",
        "to": "{payload.email}", "subject": "Order {aggregate_id}",
        "body": "Thank you for order {aggregate_id}.", "on_success": "ConfirmationSent",
        "on_failure": "ConfirmationFailed", "timeout_s": 3.0, "max_attempts": 5}}


def write_config(path: Path, out: Path, effects: dict[str, Any]) -> Path:
    lines = ["[dispatcher]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in {**COMMON, "jsonl_dir": str(out)}.items()]
    for etype, spec in effects.items():
        lines.append(f"[dispatcher.effects.{etype}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in spec.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def crash_then_finish(config: Path, point: str, *, dmongo: LocalMongo, db: Database[Any],
                      tmp_path: Path) -> None:
    log = tmp_path / "dispatch.log"
    args = ["--config", str(config), "--once"]
    crashed = spawn(args, mongodb_uri=dmongo.uri, database=db.name, log=log,
                    fault=f"{point}:kill@2")
    assert crashed.wait(120) == -signal.SIGKILL, log.read_text()
    finished = spawn(args, mongodb_uri=dmongo.uri, database=db.name, log=log)
    assert finished.wait(120) == 0, log.read_text()


def assert_one_result_each(db: Database[Any], field: str = "results") -> None:
    for o in ORDERS:
        doc = db.eorders.find_one({"_id": o})
        assert doc is not None
        assert doc["state"][field] == 1, (o, doc["state"])
        assert doc.get("outbox", []) == [], o


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("case", ["queryable", "idempotent", "neither"])
def test_kill_9_in_each_window_for_each_kind_of_resource(
        case: str, point: str, ewriter: StoreWriter, ddb: Database[Any], dmongo: LocalMongo,
        tmp_path: Path) -> None:
    entries = place(ewriter)
    with ShippingServer(honour_idempotency=(case == "idempotent")) as server:
        config = write_config(tmp_path / "aggbox.toml", tmp_path / "out",
                              http_effect(server, case))
        crash_then_finish(config, point, dmongo=dmongo, db=ddb, tmp_path=tmp_path)
        work = {o: server.work_for(k) for o, k in entries.items()}
        calls = {o: server.calls_for(k) for o, k in entries.items()}
    assert_one_result_each(ddb)
    for o in ORDERS:
        state = ddb.eorders.find_one({"_id": o})["state"]  # type: ignore[index]
        assert state["status"] == "booked" and state["tracking"].startswith("T-"), state
    twice = [o for o, n in work.items() if n == 2]
    if case == "neither" and point == "effect_after_call":
        # The call was made, the result lost with the process: called again (at least
        # once, and here exactly twice for the one effect caught in the window).
        assert len(twice) == 1 and all(n >= 1 for n in work.values()), work
    else:
        assert set(work.values()) == {1}, work  # exactly once
    if case == "queryable" and point == "effect_after_call":
        # The query found the booking: no second call at all.
        assert set(calls.values()) == {1}, calls
    if case == "idempotent" and point == "effect_after_call":
        assert sorted(calls.values()) == [1, 1, 2], calls  # called twice, worked once
    if point == "effect_before_call":
        assert set(calls.values()) == {1}, calls  # the killed attempt never called
    records = {r["entry_id"]: r for r in ddb.aggbox_effects.find()}
    assert {records[k]["state"] for k in entries.values()} == {"succeeded"}


@pytest.mark.parametrize("point", ["effect_after_call", "effect_after_result"])
def test_email_is_sent_at_least_once_never_lost(
        point: str, ewriter: StoreWriter, ddb: Database[Any], dmongo: LocalMongo,
        tmp_path: Path) -> None:
    mails = place(ewriter, email=True)
    with MailServer() as mail:
        effects = mail_effect(mail)
        config = write_config(tmp_path / "aggbox.toml", tmp_path / "out", effects)
        crash_then_finish(config, point, dmongo=dmongo, db=ddb, tmp_path=tmp_path)
        copies = {o: mail.count_for_message_id(f"<{k}@aggbox>") for o, k in mails.items()}
    assert_one_result_each(ddb, "mails")
    assert all(1 <= n <= 2 for n in copies.values()), copies
    expected_twice = 1 if point == "effect_after_call" else 0
    assert sum(n == 2 for n in copies.values()) == expected_twice, copies


def settings(server: ShippingServer, **spec: Any) -> DispatcherSettings:
    effects = http_effect(server, "neither")
    effects["BookShipment"].update(spec)
    return DispatcherSettings.load(**{**COMMON, "effects": effects,
                                      "jsonl_dir": "unused-jsonl"})


def test_timeouts_and_5xx_then_success(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        shipping_plain: ShippingServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    monkeypatch.chdir(tmp_path)
    entries = place(ewriter)
    shipping_plain.hang(1, seconds=2.0)
    shipping_plain.fail(2, status=503)
    d = Dispatcher(settings(shipping_plain, timeout_s=0.5), store=store)
    assert asyncio.run(d.run(once=True)) == 0
    assert_one_result_each(ddb)
    assert sum(shipping_plain.work_for(k) for k in entries.values()) == 3
    assert sum(shipping_plain.calls_for(k) for k in entries.values()) == 6
    get = d.metrics.registry.get_sample_value
    assert get("aggbox_effect_retries_total",
               {"type": "BookShipment", "reason": "effect_timeout"}) == 1
    assert get("aggbox_effect_retries_total",
               {"type": "BookShipment", "reason": "effect_retryable"}) == 2
    assert get("aggbox_effect_failures_total",
               {"type": "BookShipment", "reason": "effect_rejected"}) is None


def test_permanent_4xx_fails_the_order_and_dead_letters_the_entry(
        ewriter: StoreWriter, ddb: Database[Any], store: AggboxSettings,
        shipping_plain: ShippingServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    monkeypatch.chdir(tmp_path)
    entries = place(ewriter)
    shipping_plain.reject(1, status=422)
    d = Dispatcher(settings(shipping_plain), store=store)
    assert asyncio.run(d.run(once=True)) == 0
    assert_one_result_each(ddb)
    states = {o: ddb.eorders.find_one({"_id": o})["state"] for o in ORDERS}  # type: ignore[index]
    failed = [o for o, s in states.items() if s["status"] == "failed"]
    assert len(failed) == 1 and states[failed[0]]["failure"] == "effect_rejected"
    (letter,) = DeadLetterStore(ddb, collection=store.dead_letter_collection).list()
    assert letter["message_id"] == entries[failed[0]]
    assert letter["reason"] == "effect_rejected" and "422" in letter["error"]
    # An effect is executed, never published: its dead letter names the effect, no topic.
    assert letter["error"].startswith("effect 'BookShipment' failed for good: ")
    assert "topic" not in letter["error"]
    assert sum(shipping_plain.work_for(k) for k in entries.values()) == 2
    assert d.metrics.registry.get_sample_value(
        "aggbox_effect_failures_total",
        {"type": "BookShipment", "reason": "effect_rejected"}) == 1
