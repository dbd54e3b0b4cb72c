"""``aggbox dispatch-status`` (:mod:`dispatcher.status.report`): lease, member and aggregate
documents written directly in the stored layout, then read back — owned partitions,
unowned ones, lag per partition, the last hand-over, the fairness flag — and the command's
text and JSON output. The range compression and the text form are also tested pure."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo.database import Database

from aggbox.servers import LocalMongo
from aggregates.core.keys import join_parts
from dispatcher.status.report import (
    DispatchStatus,
    Handover,
    InstanceStatus,
    PartitionLag,
    compress_ranges,
    format_age,
    format_status,
    read_status,
)
from tests.aggregates.cli import Run, run_cli

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
COLL = "emitters"  # the collection of tests.dispatcher.domain
PARTS = "aggbox_dispatcher_partitions"
MEMBERS = "aggbox_dispatcher_members"


def ago(seconds: float, now: datetime = NOW) -> datetime:
    return now - timedelta(seconds=seconds)


# -- writing the stored layout ----------------------------------------------------------------
def put_leases(db: Database[Any], partitions: Iterable[int], owner: str | None, *,
               expires_at: datetime, handover: str = "new", previous: str | None = None,
               handed_at: datetime | None = None, epoch: int = 1) -> None:
    scope = f"{db.name}.{COLL}"
    handed = handed_at or ago(600, expires_at)
    db[PARTS].insert_many([{
        "_id": join_parts(db.name, COLL, str(p)), "scope": scope, "partition": p,
        "owner": owner, "expires_at": expires_at, "epoch": epoch, "since": handed,
        "previous": previous, "handover": handover, "handed_at": handed,
    } for p in partitions])


def put_member(db: Database[Any], instance: str, *, expires_at: datetime,
               heartbeat_at: datetime, partitions: Iterable[int] = (),
               effects: Iterable[str] = ()) -> None:
    db[MEMBERS].insert_one({
        "_id": join_parts(db.name, COLL, instance), "scope": f"{db.name}.{COLL}",
        "instance": instance, "host": f"host-{instance}", "pid": 4242,
        "started_at": ago(3600, heartbeat_at), "heartbeat_at": heartbeat_at,
        "expires_at": expires_at, "partitions": list(partitions), "published": 17,
        "effects": list(effects)})


def put_doc(db: Database[Any], aggregate_id: str, partition: int | None,
            created: Iterable[datetime]) -> None:
    doc: dict[str, Any] = {
        "_id": aggregate_id, "_type": "Emitter",
        "outbox": [{"id": f"{aggregate_id}-{i}", "type": "Tick", "created_at": at}
                   for i, at in enumerate(created)]}
    if partition is not None:
        doc["_p"] = partition
    db[COLL].insert_one(doc)


def scenario(db: Database[Any], now: datetime) -> None:
    """a (live) holds 0-41 and 128-171, b (live) 42-127, c (dead) held 172-254 and its
    leases expired, 255 is released; b took 50 after c's lease expired, and 60 from a
    gracefully."""
    live, dead = now + timedelta(seconds=8), now - timedelta(seconds=5)
    a_parts = [*range(0, 42), *range(128, 172)]
    put_leases(db, a_parts, "a", expires_at=live)
    put_leases(db, [p for p in range(42, 128) if p not in (50, 60)], "b", expires_at=live)
    put_leases(db, [50], "b", expires_at=live, handover="expired", previous="c",
               handed_at=ago(30, now), epoch=4)
    put_leases(db, [60], "b", expires_at=live, handover="released", previous="a",
               handed_at=ago(60, now), epoch=3)
    put_leases(db, range(172, 255), "c", expires_at=dead)
    # c took 255 from a, then released it when stopping: no current owner, not a hand-over
    put_leases(db, [255], None, expires_at=datetime(1970, 1, 1, tzinfo=UTC),
               handover="expired", previous="a", handed_at=ago(10, now))
    put_member(db, "a", expires_at=live, heartbeat_at=ago(1.5, now), partitions=a_parts)
    put_member(db, "b", expires_at=live, heartbeat_at=ago(2, now), partitions=range(42, 100))
    put_member(db, "c", expires_at=dead, heartbeat_at=ago(40, now), partitions=range(172, 256))
    # pending outboxes: partition 5 (a), a document without _p (partition 0, a), 200 (nobody)
    put_doc(db, "d1", 5, [ago(10, now), ago(5, now)])
    put_doc(db, "d2", 5, [ago(3, now)])
    put_doc(db, "d3", None, [ago(7, now)])
    put_doc(db, "d4", 200, [ago(20, now)])
    put_doc(db, "d5", 90, [ago(4, now)])
    put_doc(db, "done", 6, [])  # nothing pending
    db[COLL].insert_one({"_id": "fresh", "_type": "Emitter", "_p": 7})  # no outbox at all


@pytest.mark.mongo
def test_status_names_instances_that_lack_effects_others_execute(ddb: Database[Any]) -> None:
    now = datetime.now(UTC)
    live, dead = now + timedelta(seconds=8), now - timedelta(seconds=5)
    put_member(ddb, "a", expires_at=live, heartbeat_at=ago(1, now),
               effects=["BookShipment", "SendMail"])
    put_member(ddb, "b", expires_at=live, heartbeat_at=ago(1, now), effects=["SendMail"])
    put_member(ddb, "old", expires_at=dead, heartbeat_at=ago(60, now), effects=["ChargeCard"])
    status = read_status(ddb, COLL, now=now)
    assert status.effects_disagree == {"b": ["BookShipment"]}  # the dead one does not count
    assert status.as_dict()["effects_missing"] == {"b": ["BookShipment"]}
    assert [i["effects"] for i in status.as_dict()["instances"]] == [
        ["BookShipment", "SendMail"], ["SendMail"], ["ChargeCard"]]
    text = format_status(status)
    assert "effects: BookShipment, SendMail" in text
    assert "EFFECTS MISSING on b: BookShipment" in text


# -- read_status --------------------------------------------------------------------------------
@pytest.mark.mongo
def test_read_status_reports_owners_lag_and_the_last_handover(ddb: Database[Any]) -> None:
    scenario(ddb, NOW)
    status = read_status(ddb, COLL, now=NOW)

    by_name = {i.instance: i for i in status.instances}
    assert list(by_name) == ["a", "b", "c"]
    a, b, c = by_name["a"], by_name["b"], by_name["c"]
    assert (a.live, b.live, c.live) == (True, True, False)
    assert a.partitions == [*range(0, 42), *range(128, 172)] and len(a.partitions) == 86
    assert b.partitions == list(range(42, 128))
    assert c.partitions == []  # its leases expired: it owns nothing any more
    assert c.reported == list(range(172, 256))
    assert b.reported == list(range(42, 100))
    assert (a.host, a.pid, a.published) == ("host-a", 4242, 17)
    assert a.heartbeat_age_s == pytest.approx(1.5)
    assert status.unowned == list(range(172, 256))

    lag = {p.partition: p for p in status.lag}
    assert set(lag) == {0, 5, 90, 200}
    assert (lag[5].entries, lag[5].documents, lag[5].owner) == (3, 2, "a")
    assert lag[5].oldest_age_s == pytest.approx(10.0)
    assert (lag[0].entries, lag[0].documents, lag[0].owner) == (1, 1, "a")  # no _p
    assert lag[0].oldest_age_s == pytest.approx(7.0)
    assert lag[200].owner is None and lag[200].oldest_age_s == pytest.approx(20.0)
    assert [p.partition for p in status.lag] == [200, 5, 0, 90]  # oldest first
    assert (a.pending_entries, a.pending_documents) == (4, 3)
    assert a.oldest_age_s == pytest.approx(10.0)
    assert b.pending_entries == 1 and b.oldest_age_s == pytest.approx(4.0)
    assert (status.pending_entries, status.pending_documents) == (6, 5)

    h = status.last_handover
    assert h is not None
    assert (h.partition, h.previous, h.owner, h.kind, h.epoch) == (50, "c", "b", "expired", 4)
    assert h.at == ago(30)
    assert status.fair is False  # partitions 172-255 unowned


@pytest.mark.mongo
def test_fair_when_every_partition_is_held_and_counts_differ_by_one(
        ddb: Database[Any]) -> None:
    live = NOW + timedelta(seconds=8)
    for name, parts in (("a", range(0, 86)), ("b", range(86, 171)), ("c", range(171, 256))):
        put_leases(ddb, parts, name, expires_at=live)
        put_member(ddb, name, expires_at=live, heartbeat_at=ago(1), partitions=parts)
    status = read_status(ddb, COLL, now=NOW)
    assert [len(i.partitions) for i in status.instances] == [86, 85, 85]
    assert status.unowned == [] and status.fair is True
    assert status.lag == [] and status.last_handover is None


@pytest.mark.mongo
def test_not_fair_when_live_instances_differ_by_more_than_one(ddb: Database[Any]) -> None:
    live = NOW + timedelta(seconds=8)
    put_leases(ddb, range(0, 130), "a", expires_at=live)
    put_leases(ddb, range(130, 256), "b", expires_at=live)
    for name in ("a", "b"):
        put_member(ddb, name, expires_at=live, heartbeat_at=ago(1))
    put_member(ddb, "idle", expires_at=live, heartbeat_at=ago(1))  # live, owns nothing
    status = read_status(ddb, COLL, now=NOW)
    assert status.unowned == []
    assert [(i.instance, len(i.partitions)) for i in status.instances] == [
        ("a", 130), ("b", 126), ("idle", 0)]
    assert status.fair is False


@pytest.mark.mongo
def test_the_leases_of_an_owner_without_member_document_are_free(
        ddb: Database[Any]) -> None:
    # A lease is live while its owner's heartbeat is: no heartbeat document, no owner.
    put_leases(ddb, range(256), "ghost", expires_at=NOW + timedelta(seconds=3))
    status = read_status(ddb, COLL, now=NOW)
    assert status.instances == [] and status.unowned == list(range(256))
    assert status.fair is False  # no live instance
    assert "unowned: 256 (0-255)" in format_status(status)


@pytest.mark.mongo
def test_other_collections_are_not_counted(ddb: Database[Any]) -> None:
    scenario(ddb, NOW)
    status = read_status(ddb, "customers", now=NOW)
    assert status.instances == [] and len(status.unowned) == 256
    assert status.lag == [] and status.last_handover is None and not status.fair


# -- pure --------------------------------------------------------------------------------------
def test_compress_ranges() -> None:
    assert compress_ranges([]) == ""
    assert compress_ranges([7]) == "7"
    assert compress_ranges([3, 1, 2, 2, 0, 9, 10, 12]) == "0-3, 9-10, 12"
    assert compress_ranges([*range(0, 42), *range(128, 172)]) == "0-41, 128-171"
    assert compress_ranges(range(256)) == "0-255"
    assert compress_ranges([5, 7, 9]) == "5, 7, 9"


def test_format_age() -> None:
    assert format_age(None) == "-"
    assert format_age(3.24) == "3.2s"
    assert format_age(245) == "4m05s"
    assert format_age(2 * 3600 + 7 * 60 + 5) == "2h07m"
    assert format_age(3 * 86400 + 4 * 3600) == "3d04h"


def test_format_status_text() -> None:
    status = DispatchStatus(
        database="shop", collection="orders", now=NOW, partitions=256,
        instances=[
            InstanceStatus("dispatch-a", host="h1", pid=10, live=True, heartbeat_age_s=1.2,
                           partitions=[*range(0, 42), *range(128, 172)],
                           reported=[*range(0, 42), *range(128, 172)], pending_entries=12,
                           pending_documents=4, oldest_age_s=3.21),
            InstanceStatus("dispatch-b", host="h2", pid=11, live=False,
                           heartbeat_age_s=95.0, reported=[1, 2]),
        ],
        unowned=list(range(42, 128)) + list(range(172, 256)),
        lag=[PartitionLag(p, entries=p, documents=1, oldest_age_s=100.0 - p, owner=None)
             for p in range(1, 13)],
        last_handover=Handover(partition=17, previous="dispatch-b", owner="dispatch-a",
                               kind="expired", at=ago(12), epoch=5),
        fair=False)
    text = format_status(status)
    lines = text.splitlines()
    assert lines[0].startswith("shop.orders: 256 partitions, 1 live instance, NOT fair")
    assert "pending: 78 entries in 12 docs" in lines[0]
    a_line = next(line for line in lines if "dispatch-a" in line and "live" in line)
    assert "partitions: 86 (0-41, 128-171)" in a_line
    assert "pending: 12 entries in 4 docs" in a_line and "oldest: 3.2s" in a_line
    assert "heartbeat: 1.2s ago" in a_line and "h1:10" in a_line
    b_line = next(line for line in lines if line.strip().startswith("dispatch-b"))
    assert "DEAD" in b_line and "partitions: 0 [reported 2]" in b_line
    assert "unowned: 170 (42-127, 172-255)" in lines
    assert sum(line.strip().startswith("partition ") for line in lines) == 10  # top 10
    assert "lagging partitions (10 of 12" in text
    assert lines[-1] == ("last hand-over: partition 17, dispatch-b → dispatch-a (expired) at "
                         "2026-11-23 09:59:48Z (12.0s ago)")
    doc = json.loads(json.dumps(status.as_dict()))
    assert doc["instances"][0]["ranges"] == "0-41, 128-171"
    assert doc["last_handover"]["at"] == ago(12).isoformat()


# -- the command ------------------------------------------------------------------------------
@pytest.fixture
def cli(ddb: Database[Any], dmongo: LocalMongo, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Run]:
    import aggbox.servers.mongo as servers

    def no_server(**_: Any) -> Any:
        raise AssertionError("dispatch-status tried to start a local MongoDB")

    monkeypatch.setattr(servers, "start_local_mongodb", no_server)
    yield from run_cli(ddb, dmongo.uri, monkeypatch, capsys)


@pytest.mark.mongo
def test_the_command_prints_instances_ranges_and_json(ddb: Database[Any], cli: Run) -> None:
    scenario(ddb, datetime.now(UTC))
    rc, out, err = cli("dispatch-status", "--collection", COLL)
    assert rc == 0, err
    assert out.startswith(f"{ddb.name}.{COLL}: 256 partitions, 2 live instances, NOT fair")
    assert "partitions: 86 (0-41, 128-171)" in out
    assert "partitions: 86 (42-127)" in out
    assert "unowned: 84 (172-255)" in out
    assert "last hand-over: partition 50, c → b (expired)" in out

    rc, out, err = cli("dispatch-status", "--aggregates", "tests.dispatcher.domain", "--json")
    assert rc == 0, err
    (doc,) = json.loads(out)["items"]
    assert doc["collection"] == COLL and doc["fair"] is False
    assert {i["instance"]: i["owned"] for i in doc["instances"]} == {"a": 86, "b": 86, "c": 0}
    assert doc["lag"][0]["partition"] == 200 and doc["lag"][0]["owner"] is None
    assert doc["last_handover"]["kind"] == "expired"
