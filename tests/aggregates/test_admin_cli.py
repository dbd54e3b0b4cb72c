"""``aggbox deadletters …``, ``aggbox parked …``, ``aggbox indexes`` against the local
MongoDB server, through ``aggbox.cli.main`` (output and exit codes)."""

from __future__ import annotations

import argparse
import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from aggbox.admin import EXIT_UNSETTLED, redact_uri
from aggbox.cli import build_parser, main
from aggbox.examples.orders import customers, orders
from aggbox.examples.orders import registry as orders_registry
from aggregates import AggboxSettings, AggregateType, Emit, Handled, Message, Registry, StoreWriter
from aggregates.core.errors import ConfigurationError
from aggregates.core.reasons import Reason
from aggregates.fold import DeadLetter
from aggregates.fold.document import F_BLOCKED, F_VERSION
from aggregates.store.deadletters import DeadLetterStore
from aggregates.testing import message
from tests.aggregates.cli import Run, run_cli

pytestmark = pytest.mark.mongo

DOMAIN = "aggbox_cli_test_domain"  # module name given to --aggregates



# -- a small aggregate type that blocks on handler errors --------------------------------------
@dataclass(frozen=True)
class Tab:
    total: int = 0


def make_registry(*, broken: bool) -> Registry:
    tabs = AggregateType("Tab", state=Tab, collection="tabs", on_handler_error="park")

    @tabs.handles("Charge")
    def charge(state: Tab, msg: Message) -> Handled[Tab]:
        if broken and msg.payload.get("fail"):
            raise RuntimeError("card reader on fire")
        amount = int(msg.payload["amount"])
        return replace(state, total=state.total + amount), [Emit("Charged", {"n": amount})]

    return Registry([tabs])


def charge(mid: str, amount: int, *, agg: str = "t1", fail: bool = False) -> Message:
    return message("Charge", {"amount": amount, "fail": fail}, to="Tab", id=agg,
                   message_id=mid)


def place(mid: str, order: str, amount: int, seq: int) -> Message:
    return message("PlaceOrder", {"customer_id": "c-1", "amount": amount}, to=orders,
                   id=order, message_id=mid, source=("Shop", "web", seq))


@pytest.fixture(autouse=True)
def only_admin_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Build the ``aggbox`` parser with the admin sub-commands only, so these tests do not
    depend on the other components' command modules (they have their own tests)."""
    import aggbox.cli

    monkeypatch.setattr(aggbox.cli, "SUBCOMMAND_MODULES", ("aggbox.admin",))


@pytest.fixture
def domain(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """An importable module for ``--aggregates``; tests swap its ``registry`` (the fix)."""
    module = types.ModuleType(DOMAIN)
    module.registry = make_registry(broken=True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, DOMAIN, module)
    return module


@pytest.fixture
def cli(db: Any, mongo_uri: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Run]:
    """``run(*argv) -> (exit code, stdout, stderr)`` against this test's database."""
    # Admin commands must never start a server of their own.
    import aggbox.servers.mongo as servers

    def no_server(**_: Any) -> Any:
        raise AssertionError("an admin command tried to start a local MongoDB")

    monkeypatch.setattr(servers, "start_local_mongodb", no_server)
    yield from run_cli(db, mongo_uri, monkeypatch, capsys)


def store_writer(db: Any, reg: Registry) -> StoreWriter:
    w = StoreWriter(db, reg, settings=AggboxSettings(database=db.name), sleep=lambda s: None)
    w.ensure_indexes()
    return w


# -- help and configuration --------------------------------------------------------------------
def _leaf_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield sub
                yield from _leaf_parsers(sub)


def test_help_explains_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    ours = [p for p in _leaf_parsers(parser)
            if p.prog.split()[1] in ("deadletters", "parked", "indexes")]
    assert {p.prog for p in ours} >= {
        "aggbox deadletters list", "aggbox deadletters show", "aggbox deadletters replay",
        "aggbox deadletters dismiss", "aggbox parked list", "aggbox parked release",
        "aggbox indexes"}
    for p in ours:
        assert p.description, p.prog
        for action in p._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{p.prog} {action.option_strings or action.dest}"
    with pytest.raises(SystemExit) as exc:
        main(["deadletters", "replay", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for option in ("--id", "--reason", "--type", "--all", "--aggregates", "--config",
                   "--dry-run", "AGGBOX_MONGODB_URI", "Exit codes"):
        assert option in out
    assert main(["parked"]) == 2  # a group without an action prints its help
    assert "release" in capsys.readouterr().out


def test_no_uri_configured_is_a_clear_error(cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGGBOX_MONGODB_URI")
    rc, out, err = cli("deadletters", "list")
    assert rc == 1 and out == ""
    assert "set AGGBOX_MONGODB_URI" in err and "never start a local server" in err


def test_unreachable_server_is_a_clear_error(cli: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGBOX_MONGODB_URI",
                       "mongodb://ops:s3cret@127.0.0.1:9/?directConnection=true")
    rc, _, err = cli("parked", "list", "--timeout", "0.3")
    assert rc == 1 and ("MongoDB at mongodb://ops:***@127.0.0.1:9/?directConnection=true not "
                        "reachable within 0.3s") in err
    assert "Topology" not in err and "AGGBOX_MONGODB_URI names its host and port" in err
    assert "s3cret" not in err
    assert redact_uri("mongodb://a:b@h/x") == "mongodb://a:***@h/x"


def test_config_file_supplies_uri_and_database(cli: Run, db: Any, mongo_uri: str,
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGGBOX_MONGODB_URI")
    monkeypatch.delenv("AGGBOX_DATABASE")
    store_writer(db, orders_registry).process([place("p1", "o-1", -1, 1)])
    config = tmp_path / "aggbox.toml"
    config.write_text(f'[aggbox]\nmongodb_uri = "{mongo_uri}"\ndatabase = "{db.name}"\n')
    rc, out, _ = cli("deadletters", "list", "--json", "--config", str(config))
    assert rc == 0
    assert [d["id"] for d in json.loads(out)["items"]] == ["Order/o-1/p1"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[aggbox]\nno_such_setting = 1\n")
    rc, _, err = cli("deadletters", "list", "--config", str(bad))
    assert rc == 1 and "no_such_setting" in err


def test_unknown_aggregates_module(cli: Run) -> None:
    rc, _, err = cli("indexes", "--aggregates", "no.such.module")
    assert rc == 1 and "cannot import aggregates module 'no.such.module'" in err


# -- dead letters ------------------------------------------------------------------------------
def test_deadletters_list_show_and_replay(cli: Run, db: Any) -> None:
    # Orders not deployed yet: their messages are dead-lettered; one order is invalid.
    store_writer(db, Registry([customers])).process(
        [place("p1", "o-1", 30, 1), place("p2", "o-2", 40, 2)])
    store_writer(db, orders_registry).process([place("p3", "o-3", -5, 3)])

    rc, out, _ = cli("deadletters", "list")
    assert rc == 0
    for text in ("Order/o-1/p1", "Order/o-2/p2", "Order/o-3/p3", Reason.UNKNOWN_AGGREGATE_TYPE,
                 Reason.HANDLER_ERROR, "PlaceOrder", "order amount must be positive",
                 "open by reason: handler_error: 1, unknown_aggregate_type: 2"):
        assert text in out
    rc, out, _ = cli("deadletters", "list", "--reason", Reason.HANDLER_ERROR, "--json")
    listed = json.loads(out)
    [letter] = listed["items"]
    assert listed["total"] == 1
    assert letter["id"] == "Order/o-3/p3" and "ValueError" in letter["traceback"]
    assert letter["message"]["payload"] == {"customer_id": "c-1", "amount": -5}
    assert json.loads(cli("deadletters", "list", "--type", "Customer", "--json")[1]) == {
        "items": [], "total": 0}
    limited = json.loads(cli("deadletters", "list", "--limit", "1", "--json")[1])
    assert len(limited["items"]) == 1 and limited["total"] == 3

    rc, out, _ = cli("deadletters", "show", "p3")
    assert rc == 0 and "Order/o-3/p3" in out and "Traceback" in out and '"amount": -5' in out
    rc, out, _ = cli("deadletters", "show", "Order/o-3/p3", "nope")
    assert rc == EXIT_UNSETTLED and "no dead letter with id or message id 'nope'" in out

    rc, _, err = cli("deadletters", "replay", "--aggregates", "aggbox.examples.orders")
    assert rc == 1 and "say which dead letters to replay" in err

    rc, out, _ = cli("deadletters", "replay", "--reason", Reason.UNKNOWN_AGGREGATE_TYPE,
                     "--aggregates", "aggbox.examples.orders", "--dry-run")
    assert rc == 0 and "Would replay 2" in out
    assert db.orders.count_documents({}) == 0  # a dry run changes nothing

    rc, out, _ = cli("deadletters", "replay", "--reason", Reason.UNKNOWN_AGGREGATE_TYPE,
                     "--aggregates", "aggbox.examples.orders")
    assert rc == 0, out
    assert "Replayed 2 dead letter(s)" in out and "replayed" in out
    assert {d["_id"]: d["state"]["status"] for d in db.orders.find()} == {
        "o-1": "pending", "o-2": "pending"}
    replayed = json.loads(cli("deadletters", "list", "--status", "replayed", "--json")[1])
    assert sorted(d["id"] for d in replayed["items"]) == ["Order/o-1/p1", "Order/o-2/p2"]

    # Replaying again is safe (dedup): duplicate, still replayed, exit 0.
    rc, out, _ = cli("deadletters", "replay", "--id", "p1", "--aggregates",
                     "aggbox.examples.orders", "--json")
    result = json.loads(out)
    assert rc == 0 and result["ok"] is True
    assert [o["outcome"] for o in result["outcomes"]] == ["duplicate"]
    assert db.orders.find_one({"_id": "o-1"})[F_VERSION] == 1

    # The invalid order fails again: it stays open, the exit code says so.
    rc, out, _ = cli("deadletters", "replay", "--id", "Order/o-3/p3", "--id", "ghost",
                     "--aggregates", "aggbox.examples.orders")
    assert rc == EXIT_UNSETTLED
    assert "dead_lettered" in out and "not found" in out and "ghost" in out
    doc = db.aggbox_dead_letters.find_one({"_id": "Order/o-3/p3"})
    assert doc["status"] == "open" and doc["attempts"] == 2


HORIZON = "beyond_dedup_horizon"


def seed_dead_letters(db: Any) -> DeadLetterStore:
    """Dead letters written straight into the store, last seen in January/February 2024:
    Account/a1/m1 and Account/a2/m2 beyond the horizon, Order/o1/m3 too, Account/a3/m4 a
    handler error."""
    store = DeadLetterStore(db)
    store.ensure_indexes()
    for mid, atype, agg, reason, day in (("m1", "Account", "a1", HORIZON, (1, 10)),
                                         ("m2", "Account", "a2", HORIZON, (2, 10)),
                                         ("m3", "Order", "o1", HORIZON, (2, 11)),
                                         ("m4", "Account", "a3", Reason.HANDLER_ERROR, (2, 12))):
        msg = message("Deposit", {"amount": 1}, to=atype, id=agg, message_id=mid)
        store.write([DeadLetter(msg, None, reason, "cannot prove it is new", None, atype, agg)],
                    now=datetime(2024, *day, tzinfo=UTC))
    return store


def statuses(db: Any) -> dict[str, str]:
    return {d["_id"]: d["status"] for d in db.aggbox_dead_letters.find()}


def test_deadletters_list_filters(cli: Run, db: Any) -> None:
    seed_dead_letters(db)

    def ids(*argv: str) -> list[str]:
        rc, out, err = cli("deadletters", "list", "--json", *argv)
        assert rc == 0, err
        return [d["id"] for d in json.loads(out)["items"]]

    assert ids() == ["Account/a3/m4", "Order/o1/m3", "Account/a2/m2", "Account/a1/m1"]
    assert ids("--reason", HORIZON) == ["Order/o1/m3", "Account/a2/m2", "Account/a1/m1"]
    assert ids("--aggregate-type", "Account", "--reason", HORIZON) == [
        "Account/a2/m2", "Account/a1/m1"]
    assert ids("--type", "Order") == ["Order/o1/m3"]
    assert ids("--before", "2024-02-01") == ["Account/a1/m1"]
    assert ids("--since", "2024-02-11T00:00:00Z") == ["Account/a3/m4", "Order/o1/m3"]
    assert ids("--since", "2024-02-01", "--before", "2024-02-11T01:00:00+01:00") == [
        "Account/a2/m2"]  # 01:00+01:00 is midnight UTC: m3 (Feb 11, 00:00 UTC) is not before
    assert ids("--status", "dismissed") == []

    rc, out, _ = cli("deadletters", "list", "--reason", HORIZON, "--limit", "1")
    assert rc == 0
    for text in ("1 shown of 3", "open by reason: beyond_dedup_horizon: 3, handler_error: 1",
                 "Matching (open) by reason: beyond_dedup_horizon: 3"):
        assert text in out

    rc, _, err = cli("deadletters", "list", "--since", "2024-03-01", "--before", "2024-02-01")
    assert rc == 2 and "--since" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exc:
        main(["deadletters", "list", "--before", "last tuesday"])
    assert exc.value.code == 2


def test_deadletters_dismiss_in_bulk(cli: Run, db: Any) -> None:
    store = seed_dead_letters(db)
    before = statuses(db)

    argv = ("deadletters", "dismiss", "--reason", HORIZON, "--aggregate-type", "Account")
    rc, out, _ = cli(*argv, "--dry-run")
    assert rc == 0 and "Would dismiss 2 open dead letter(s)" in out and "dry run" in out
    assert "by reason: beyond_dedup_horizon: 2" in out
    assert statuses(db) == before  # a dry run changes nothing

    rc, out, _ = cli(*argv, "--note", "old duplicates, applied before (audit log)")
    assert rc == 0 and "Dismissed 2 open dead letter(s)" in out
    assert statuses(db) == {"Account/a1/m1": "dismissed", "Account/a2/m2": "dismissed",
                            "Order/o1/m3": "open", "Account/a3/m4": "open"}
    doc = db.aggbox_dead_letters.find_one({"_id": "Account/a1/m1"})
    assert isinstance(doc["dismissed_at"], datetime)
    assert doc["dismiss_note"] == "old duplicates, applied before (audit log)"
    assert doc["attempts"] == 1 and doc["message"]["message_id"] == "m1"  # nothing else lost

    rc, out, _ = cli(*argv, "--json")  # idempotent: nothing more to dismiss
    assert rc == 0 and json.loads(out)["dismissed"] == 0
    assert statuses(db)["Order/o1/m3"] == "open"

    # Dismissed ones leave the default list and filtered replays; --status shows them.
    listed = json.loads(cli("deadletters", "list", "--json")[1])
    assert [d["id"] for d in listed["items"]] == ["Account/a3/m4", "Order/o1/m3"]
    dismissed = json.loads(cli("deadletters", "list", "--status", "dismissed", "--json")[1])
    assert sorted(d["id"] for d in dismissed["items"]) == ["Account/a1/m1", "Account/a2/m2"]
    assert dismissed["items"][0]["dismiss_note"].startswith("old duplicates")
    rc, out, _ = cli("deadletters", "replay", "--reason", HORIZON, "--aggregates",
                     "aggbox.examples.orders", "--dry-run", "--json")
    dry = json.loads(out)
    assert rc == 0 and dry["dry_run"] is True and [d["id"] for d in dry["items"]] == [
        "Order/o1/m3"]
    rc, out, _ = cli("deadletters", "show", "m2")
    assert rc == 0 and "status: dismissed" in out and "dismiss_note: old duplicates" in out

    # By id (or message id), with a time filter; unknown ids are reported (exit 3).
    rc, out, _ = cli("deadletters", "dismiss", "--id", "m4", "--id", "Account/a1/m1",
                     "--id", "ghost", "--json")
    result = json.loads(out)
    assert rc == EXIT_UNSETTLED and result["dismissed"] == 1
    assert result["missing"] == ["ghost"] and result["not_open"] == {
        "Account/a1/m1": "dismissed"}
    rc, out, _ = cli("deadletters", "dismiss", "--before", "2024-02-11")
    assert rc == 0 and "Dismissed 0 open dead letter(s)" in out  # m3 was seen on Feb 11
    assert statuses(db)["Order/o1/m3"] == "open"

    # Dead-lettered again, a dismissed message is open again.
    msg = message("Deposit", {"amount": 1}, to="Account", id="a1", message_id="m1")
    store.write([DeadLetter(msg, None, HORIZON, "again", None, "Account", "a1")],
                now=datetime(2024, 3, 1, tzinfo=UTC))
    assert statuses(db)["Account/a1/m1"] == "open"


def test_deadletters_dismiss_needs_a_filter(cli: Run, db: Any) -> None:
    store = seed_dead_letters(db)
    before = statuses(db)
    for argv in ((), ("--note", "x"), ("--dry-run",)):
        rc, out, err = cli("deadletters", "dismiss", *argv)
        assert rc == 2 and out == ""
        assert err.count("\n") == 1 and "say which dead letters to dismiss" in err
        assert "--reason" in err and "--id" in err
    rc, _, err = cli("deadletters", "dismiss", "--since", "2024-03-01", "--before", "2024-01-01")
    assert rc == 2 and "--since" in err and "--before" in err
    assert statuses(db) == before

    with pytest.raises(ConfigurationError, match="say which dead letters to dismiss"):
        store.dismiss()
    with pytest.raises(ConfigurationError, match="--id ID"):
        store.dismiss(ids="m1")
    with pytest.raises(ConfigurationError, match="--since must be earlier than --before"):
        store.dismiss(reason=HORIZON, since=datetime(2024, 3, 1),
                      before=datetime(2024, 1, 1, tzinfo=UTC))
    assert store.dismiss(ids=["m1", "m3"], reason=HORIZON, dry_run=True) == 2
    assert store.dismiss(ids=["m1", "m3"], aggregate_type="Order") == 1
    assert statuses(db) == {**before, "Order/o1/m3": "dismissed"}


# -- parked ------------------------------------------------------------------------------------
def test_parked_list_and_release(cli: Run, db: Any, domain: types.ModuleType) -> None:
    w = store_writer(db, domain.registry)
    out = w.process([charge("k1", 5), charge("k2", 1, fail=True), charge("k3", 2),
                     charge("k4", 3), charge("j1", 1, agg="t2", fail=True),
                     charge("j2", 4, agg="t2")])
    assert [o.outcome for o in out].count("parked") == 3

    rc, text, _ = cli("parked", "list")
    assert rc == 0 and "Parked messages: 3 shown of 3" in text
    assert "Tab/t1" in text and "k3" in text and Reason.AGGREGATE_BLOCKED in text
    rc, text, _ = cli("parked", "list", "--aggregates", DOMAIN, "--aggregate", "Tab/t1")
    assert rc == 0 and "Blocked aggregates: 1" in text and "card reader on fire" in text
    assert "j2" not in text
    listed = json.loads(cli("parked", "list", "--json", "--type", "Tab")[1])
    assert sorted(p["message_id"] for p in listed["items"]) == ["j2", "k3", "k4"]
    assert listed["blocked"] == []  # blocked aggregates are looked up with --aggregates only
    assert json.loads(cli("parked", "list", "--json", "--reason", "sequence_gap")[1]) == {
        "items": [], "total": 3, "blocked": []}
    listed = json.loads(cli("parked", "list", "--json", "--aggregates", DOMAIN)[1])
    assert sorted(listed) == ["blocked", "items", "total"] and len(listed["items"]) == 3
    assert sorted(b["aggregate_id"] for b in listed["blocked"]) == ["t1", "t2"]

    # Without --aggregates: the block is cleared (+1 on _v), the messages keep waiting.
    v1 = db.tabs.find_one({"_id": "t1"})[F_VERSION]
    rc, text, _ = cli("parked", "release", "--aggregate", "Tab/t1")
    assert rc == EXIT_UNSETTLED
    assert "Tab/t1: block cleared (failed message 'k2'" in text and "not retried" in text
    assert "still parked: 2" in text
    doc = db.tabs.find_one({"_id": "t1"})
    assert F_BLOCKED not in doc and doc[F_VERSION] == v1 + 1

    # With the fixed module: t2 is unblocked and its parked message applied; t1's retried.
    domain.registry = make_registry(broken=False)  # type: ignore[attr-defined]
    v2 = db.tabs.find_one({"_id": "t2"})[F_VERSION]
    rc, text, _ = cli("parked", "release", "--aggregate", "Tab/t2", "--aggregate", "Tab/t1",
                      "--aggregates", DOMAIN)
    assert rc == 0, text
    assert "Tab/t2: block cleared" in text and "Tab/t1: was not blocked" in text
    assert "deadletters replay --id Tab/t2/j1" in text
    assert "applied" in text and "j2" in text and "k3" in text and "k4" in text
    assert db.aggbox_parked.count_documents({}) == 0
    t2 = db.tabs.find_one({"_id": "t2"})
    assert F_BLOCKED not in t2 and t2[F_VERSION] == v2 + 2 and t2["state"]["total"] == 4
    assert db.tabs.find_one({"_id": "t1"})["state"]["total"] == 10

    rc, out, _ = cli("deadletters", "replay", "--id", "Tab/t2/j1", "--aggregates", DOMAIN)
    assert rc == 0 and db.tabs.find_one({"_id": "t2"})["state"]["total"] == 5


def test_release_argument_errors(cli: Run, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["parked", "release", "--aggregate", "Tab"])
    assert exc.value.code == 2 and "is not TYPE/ID" in capsys.readouterr().err
    rc, _, err = cli("parked", "release", "--aggregate", "Tab/none")
    assert rc == 1 and "pass --aggregates MODULE" in err and "--collection" in err
    rc, text, _ = cli("parked", "release", "--aggregate", "Tab/none", "--collection", "tabs",
                      "--json")
    assert rc == 0 and json.loads(text)["items"][0]["cleared"] is None


# -- indexes -----------------------------------------------------------------------------------
def test_indexes(cli: Run, db: Any) -> None:
    rc, out, _ = cli("indexes", "--aggregates", "aggbox.examples.orders")
    assert rc == 0 and "customers" in out and "orders" in out
    for coll in ("orders", "customers"):
        assert "aggbox_id_v" in db[coll].index_information()
    assert len(db.aggbox_dead_letters.index_information()) > 1
    assert cli("indexes", "--aggregates", "aggbox.examples.orders")[0] == 0  # idempotent


def test_parked_ids_name_the_collection_and_dead_letter_ids_the_type(
        cli: Run, db: Any, domain: types.ModuleType) -> None:
    """As docs/debugging.md says (and why): parked ``<collection>/<id>/<message>``, dead
    letters ``<type>/<id>/<message>``; both list the aggregate as type and id."""
    w = store_writer(db, domain.registry)
    w.process([charge("k1", 5), charge("k2", 1, fail=True), charge("k3", 2)])
    parked = json.loads(cli("parked", "list", "--json")[1])["items"]
    assert [(p["id"], p["aggregate_type"], p["aggregate_id"]) for p in parked] == [
        ("tabs/t1/k3", "Tab", "t1")]
    letters = json.loads(cli("deadletters", "list", "--json")[1])["items"]
    assert [(d["id"], d["aggregate_type"]) for d in letters] == [("Tab/t1/k2", "Tab")]
    rc, text, _ = cli("parked", "list")
    assert rc == 0 and "Tab/t1" in text
