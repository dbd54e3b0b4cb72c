"""``--once`` ends only when the due timers are done, as it does for outbox entries (issue 40,
item 9): a retryable publish failure is tried again until the timers go or the watchdog
ends the run with status 1 and one line naming the collection and the last error; a
partition nobody publishes yet — a killed instance still counted toward the quotas until
its heartbeat expires, or one of ours in its takeover grace — is waited for, not left
behind; the summary says per collection what was fired and what is left.

Before: the firer counted a retryable result and moved on, a round that fired nothing ended
``--once`` with exit status 0, and a run holding a share of the partitions drained that
share and ended — the other aggregate type's timers, or the killed instance's partitions'
(the flaky end of tests/spark/test_timers_kafka.py: ``published 0, timers fired 4``, 2 of 6
due timers left), unfired.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from aggbox.servers import LocalKafka, create_topic
from aggregates import AggboxSettings, Message, Source, StoreWriter
from aggregates.core.keys import join_parts
from aggregates.core.partitions import PARTITIONS, partition_of
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher, OnceGaveUp
from dispatcher.publishers.base import PublishResult
from dispatcher.publishers.record import OutboundRecord
from tests.dispatcher.helpers import ROOT, ListPublisher, quick_settings
from tests.dispatcher.kafkatimerdomain import registry as kafka_registry
from tests.dispatcher.timerdomain import registry

pytestmark = [pytest.mark.mongo]

DOMAIN = "tests.dispatcher.timerdomain"
AGGBOX = str(Path(sys.executable).with_name("aggbox"))


def _place(writer: StoreWriter, atype: str, ids: Sequence[str], ms: int = 0) -> None:
    msgs = [Message(f"place-{atype}-{i}", "Place", atype, i, {"ms": ms},
                    source=Source("Client", f"{atype}/{i}", 1)) for i in ids]
    assert [o.outcome for o in writer.process(msgs)] == ["applied"] * len(ids)


def _timers(db: Database[Any], collection: str) -> set[str]:
    return {t["id"] for d in db[collection].find() for t in d.get("timers") or []}


@pytest.fixture
def twriter(ddb: Database[Any], store: AggboxSettings) -> StoreWriter:
    w = StoreWriter(ddb, registry, settings=store)
    w.ensure_indexes()
    return w


class _Flaky(ListPublisher):
    """Refuses the records of ``HwOrder`` retryably the first ``failures`` times (for ever
    with ``None``), like a topic the broker does not have yet."""

    def __init__(self, failures: int | None) -> None:
        super().__init__(self._fail)
        self.failures = failures
        self.refused = 0

    def _fail(self, r: OutboundRecord) -> PublishResult | None:
        if r.envelope["aggregate_type"] != "HwOrder":
            return None
        if self.failures is not None and self.refused >= self.failures:
            return None
        self.refused += 1
        return PublishResult.retryable("Broker: Unknown topic or partition")


def test_once_fires_again_after_a_retryable_failure_until_every_due_timer_went(
        twriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    _place(twriter, "Order", [f"o-{i}" for i in range(5)])
    _place(twriter, "HwOrder", [f"h-{i}" for i in range(5)])
    _place(twriter, "HwOrder", ["later"], ms=3_600_000)
    later = {t["id"] for t in ddb.thworders.find_one({"_id": "later"})["timers"]}
    pub = _Flaky(failures=12)
    dispatcher = Dispatcher(quick_settings(DOMAIN, once_timeout_s=60), store=store,
                            publisher=pub)
    assert asyncio.run(dispatcher.run(once=True)) == 0
    assert pub.refused == 12  # refused, tried again, published
    assert _timers(ddb, "torders") == set() and _timers(ddb, "thworders") == later
    assert sorted(r.document_id for r in pub.records) == sorted(
        [f"o-{i}" for i in range(5)] + [f"h-{i}" for i in range(5)])
    assert dispatcher.once_left == {"torders": (0, 0), "thworders": (0, 0)}


def test_once_gives_up_with_status_1_naming_the_collection_and_the_error(
        twriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    _place(twriter, "Order", [f"o-{i}" for i in range(5)])
    _place(twriter, "HwOrder", [f"h-{i}" for i in range(5)])
    stuck = _timers(ddb, "thworders")
    pub = _Flaky(failures=None)
    with pytest.raises(OnceGaveUp) as info:
        asyncio.run(Dispatcher(quick_settings(DOMAIN, once_timeout_s=4), store=store,
                               publisher=pub).run(once=True))
    assert str(info.value) == (
        "thworders: no progress for 4s in --once mode (last error: publishing 5 due timer(s) "
        "of thworders failed: Broker: Unknown topic or partition); giving up with due timers "
        "still pending (once_timeout_s)")
    assert _timers(ddb, "torders") == set() and _timers(ddb, "thworders") == stuck


# -- partitions nobody publishes yet -----------------------------------------------------
def _ghost(db: Database[Any], collection: str, *, expires_in: float,
           partitions: Sequence[int] = ()) -> None:
    """What a killed instance leaves: its heartbeat (live for ``expires_in`` seconds more,
    or expired when negative) and its leases on ``partitions``."""
    s = DispatcherSettings.load()
    now = datetime.now(UTC)
    scope = f"{db.name}.{collection}"
    db[s.member_collection].insert_one({
        "_id": join_parts(db.name, collection, "ghost"), "scope": scope, "instance": "ghost",
        "member": "ghost", "heartbeat_at": now, "started_at": now,
        "expires_at": now + timedelta(seconds=expires_in), "partitions": list(partitions)})
    if partitions:
        db[s.partition_collection].insert_many([
            {"_id": join_parts(db.name, collection, str(p)), "scope": scope, "partition": p,
             "owner": "ghost", "epoch": 1} for p in partitions])


def _spread(n: int) -> list[str]:
    """Aggregate ids of both even and odd partitions."""
    ids = [f"o-{i}" for i in range(n)]
    assert {partition_of(i) % 2 for i in ids} == {0, 1}
    return ids


def test_once_waits_for_the_partitions_a_killed_instance_never_claimed(
        twriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    """The killed instance's heartbeat still counts toward the quotas: this run's share is
    half the partitions; the other half, held by nobody, is claimed once the heartbeat
    expired (before: half the due timers left, exit status 0)."""
    ids = _spread(40)
    _place(twriter, "Order", ids)
    _ghost(ddb, "torders", expires_in=5)
    pub = ListPublisher()
    dispatcher = Dispatcher(quick_settings(DOMAIN, collections=["torders"], once_timeout_s=30),
                            store=store, publisher=pub)
    assert asyncio.run(dispatcher.run(once=True)) == 0
    assert sorted(r.document_id for r in pub.records) == sorted(ids)
    assert _timers(ddb, "torders") == set()
    assert dispatcher.once_left == {"torders": (0, 0)}


def test_once_waits_for_partitions_in_their_takeover_grace(
        twriter: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    """The odd partitions were held by an instance whose heartbeat expired: taken over, they
    are published only after the takeover grace, the even ones at once. Before, the run
    drained the even ones and ended inside the grace."""
    ids = _spread(40)
    _place(twriter, "Order", ids)
    _ghost(ddb, "torders", expires_in=-1, partitions=range(1, PARTITIONS, 2))
    pub = ListPublisher()
    dispatcher = Dispatcher(quick_settings(DOMAIN, collections=["torders"], once_timeout_s=30,
                                           takeover_grace_s=4), store=store, publisher=pub)
    assert asyncio.run(dispatcher.run(once=True)) == 0
    assert sorted(r.document_id for r in pub.records) == sorted(ids)
    assert _timers(ddb, "torders") == set()


# -- through the command line, with Kafka ------------------------------------------------
@pytest.mark.kafka
def test_dispatch_once_with_a_missing_topic_ends_1_with_the_other_types_timers_fired(
        kafka_server: LocalKafka, ddb: Database[Any], store: AggboxSettings, dmongo: Any,
        tmp_path: Path) -> None:
    """The issue's case: two aggregate types with due timers, Kafka creating no topic, one
    type's topic missing. Before: ``published 0, timers fired 4 …``, exit status 0, nothing
    on stderr, the other type's timers still pending."""
    writer = StoreWriter(ddb, kafka_registry, settings=store)
    writer.ensure_indexes()
    _place(writer, "TimedOrder", [f"o-{i}" for i in range(4)])
    _place(writer, "TimedProbe", ["p-0", "p/1"])
    probes = _timers(ddb, "ktprobes")
    prefix = "once" + uuid.uuid4().hex[:10]
    create_topic(kafka_server.bootstrap_servers, f"{prefix}-TimedOrder", partitions=1)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AGGBOX_")}
    env.update(AGGBOX_HOME=str(tmp_path / "home"), AGGBOX_LOG_FILE=str(tmp_path / "trace.log"),
               PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    done = subprocess.run(
        [AGGBOX, "dispatch", "--once", "--aggregates", "tests.dispatcher.kafkatimerdomain",
         "--publisher", "kafka", "--bootstrap-servers", kafka_server.bootstrap_servers,
         "--topic-template", prefix + "-{aggregate_type}",
         # a broker without auto-create, as the producer sees it: the topic never appears
         "--kafka-option", "allow.auto.create.topics=false", "--delivery-timeout", "3",
         "--once-timeout", "12", "--lease-ttl", "3", "--metrics-port", "0",
         "--mongodb-uri", dmongo.uri, "--database", ddb.name],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("aggbox")]
    assert len(errors) == 1 and errors[0].startswith(
        "aggbox dispatch: error: ktprobes: no progress for 12s in --once mode (last error: "
        "publishing 2 due timer(s) of ktprobes failed: "), done.stderr
    assert errors[0].endswith("giving up with due timers still pending (once_timeout_s)")
    assert _timers(ddb, "ktorders") == set()  # fired to the topic that exists
    assert _timers(ddb, "ktprobes") == probes
