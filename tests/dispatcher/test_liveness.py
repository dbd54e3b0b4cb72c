"""The dispatcher never reports itself healthy when it is not, and always ends when asked
to: MongoDB unreachable (/healthz turns 503, ``--once`` gives up), the broker unreachable
(``--once`` gives up, librdkafka's lines are rate-limited), a change stream invalidated by a
dropped collection (new stream and a sweep at once), temp files of a killed JSON Lines
writer (removed at start-up)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from aggbox.servers import LocalMongo
from aggregates import AggboxSettings, StoreWriter
from dispatcher.core.faults import Faults
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from tests.dispatcher.helpers import (
    ListPublisher,
    check_delivery,
    dead_port,
    emit,
    healthz,
    jsonl_envelopes,
    pending_entries,
    run_once,
    run_while,
    wait_for,
)

pytestmark = [pytest.mark.mongo]


def settings(**over: Any) -> DispatcherSettings:
    base: dict[str, Any] = dict(
        collections=["emitters"], metrics_port=0, pacing_ms=10, poll_interval_ms=50,
        lease_ttl_s=3, backoff_initial_ms=50, backoff_max_ms=400, sweep_interval_s=60,
        batch_size=50, max_batch_records=40,
    )
    base.update(over)
    return DispatcherSettings.load(**base)





def error_lines(stderr: bytes) -> list[str]:
    return [x for x in stderr.decode().splitlines() if x.startswith("aggbox dispatch: error:")]


# -- MongoDB unreachable --------------------------------------------------------------------
def test_healthz_turns_unhealthy_without_a_mongodb_round_trip(tmp_path: Path) -> None:
    store = AggboxSettings.load(
        mongodb_uri=f"mongodb://127.0.0.1:{dead_port()}/?directConnection=true",
        database="unreachable")
    d = Dispatcher(settings(metrics_port=dead_port(), unhealthy_after_s=2,
                            jsonl_dir=str(tmp_path / "out")), store=store)
    assert d.server_selection_timeout_s == 1.0  # min(lease_ttl_s, unhealthy_after_s / 2)

    async def body() -> dict[str, Any]:
        # No wall-clock bound on how soon (a loaded machine may be slow): every healthy
        # answer must agree with its own report — no contact for longer than
        # unhealthy_after_s is never healthy. Before, /healthz stayed 200 for a minute or
        # more while every call failed (the loop kept beating). The deadline is a hang
        # guard only.
        deadline = time.monotonic() + 180
        status, report = await asyncio.to_thread(healthz, d.metrics_port)
        while status == 200:
            worker = report.get("collections", {}).get("emitters")
            assert worker is None or worker["seconds_since_server_contact"] <= 2, report
            assert time.monotonic() < deadline, report
            await asyncio.sleep(0.2)
            status, report = await asyncio.to_thread(healthz, d.metrics_port)
        assert status == 503
        return report

    report = asyncio.run(run_while(d, body))
    worker = report["collections"]["emitters"]
    assert report["status"] == "unhealthy" and worker["healthy"] is False
    assert worker["seconds_since_server_contact"] > 2


def test_healthz_stays_healthy_while_mongodb_answers(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    d = Dispatcher(settings(metrics_port=dead_port(), unhealthy_after_s=3), store=store,
                   publisher=ListPublisher())

    async def body() -> None:
        await wait_for(lambda: d.workers[0].mode == "stream", 10, "stream mode")
        for _ in range(12):  # idle stream: reads and lease renewals are the round trips
            status, report = await asyncio.to_thread(healthz, d.metrics_port)
            assert status == 200, report
            assert report["collections"]["emitters"]["seconds_since_server_contact"] < 3
            await asyncio.sleep(0.25)

    asyncio.run(run_while(d, body))


def test_once_gives_up_with_one_error_line_when_mongodb_is_unreachable(
        tmp_path: Path) -> None:
    # Never reached since start: the start-up ping ends it within the server selection
    # timeout (min(lease_ttl_s, unhealthy_after_s / 2) = 2 s; on a refused port after its
    # first look, 1 s), not after --once-timeout
    # (tests/dispatcher/test_unreachable.py; the watchdog's own give-up is tested there too).
    uri = f"mongodb://127.0.0.1:{dead_port()}/?directConnection=true"
    done, took = run_once("--collection", "emitters", "--publisher", "jsonl", "--jsonl-dir",
                          str(tmp_path / "out"), "--lease-ttl", "2", "--once-timeout", "4",
                          env={"AGGBOX_MONGODB_URI": uri, "AGGBOX_DATABASE": "unreachable"},
                          timeout=60)  # before: never ended
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert took < 30, took
    lines = error_lines(done.stderr)
    assert len(lines) == 1, stderr
    # A refused port is an answer: the first look (FIRST_LOOK_S) ends it, not the timeout.
    assert "not reachable within 1s" in lines[0] and "127.0.0.1:" in lines[0]
    assert "ServerSelectionTimeoutError" in lines[0] and "Topology" not in lines[0]
    assert "Traceback" not in stderr


# -- broker unreachable ---------------------------------------------------------------------
def test_once_gives_up_when_the_broker_is_down_and_librdkafka_lines_are_rate_limited(
        writer: StoreWriter, ddb: Database[Any], dmongo: LocalMongo) -> None:
    pytest.importorskip("confluent_kafka")
    emit(writer, ["a000", "a001"], n=2)
    done, took = run_once("--collection", "emitters", "--publisher", "kafka",
                          "--bootstrap-servers", f"127.0.0.1:{dead_port()}",
                          "--delivery-timeout", "1", "--once-timeout", "5",
                          "--backoff-initial-ms", "50", "--backoff-max-ms", "200",
                          env={"AGGBOX_MONGODB_URI": dmongo.uri, "AGGBOX_DATABASE": ddb.name},
                          timeout=90)  # before: never ended
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert took < 45, took
    lines = error_lines(done.stderr)
    # never reached since start: ends after the first failed delivery, not --once-timeout
    assert len(lines) == 1 and "no Kafka broker reachable" in lines[0], stderr
    assert pending_entries(ddb) == 4  # nothing pulled
    # librdkafka retries the connection every few hundred ms; before, each attempt printed a
    # raw "%3|…|FAIL|…" line on stderr. Now: through logging, one line per distinct message.
    assert "%3|" not in stderr, stderr
    refused = [x for x in stderr.splitlines() if "librdkafka" in x and "Connect to" in x]
    assert 1 <= len(refused) <= 2, refused


# -- invalidated change stream --------------------------------------------------------------
def test_a_dropped_collection_invalidates_the_stream_and_a_new_one_follows_at_once(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings, dmongo: LocalMongo,
        caplog: pytest.LogCaptureFixture) -> None:
    pub = ListPublisher()
    faults = Faults()
    d = Dispatcher(settings(sweep_interval_s=60), store=store, publisher=pub, faults=faults)
    later: dict[str, list[str]] = {}

    async def body() -> float:
        w = d.workers[0]
        await wait_for(lambda: w.mode == "stream", 10, "stream mode")
        first = await asyncio.to_thread(emit, writer, ["a000", "a001"], n=2)
        await wait_for(lambda: len(pub.records) == 4, 20, "first entries")
        check_delivery(pub.delivered(), first)
        await asyncio.to_thread(ddb.emitters.drop)
        if not dmongo.capabilities.change_streams_complete:
            # mongo-java-server's streams survive a drop; MongoDB ends them with an
            # invalidate event: make the stand-in do what MongoDB does.
            faults.add("stream_read", "invalidate")
        await asyncio.to_thread(writer.ensure_indexes)
        pub.records.clear()
        started = time.monotonic()
        later.update(await asyncio.to_thread(emit, writer, ["b000", "b001"], n=3))
        # Before: the dead stream was kept and only the 60 s safety sweep found these.
        await wait_for(lambda: len(pub.records) >= 6 and pending_entries(ddb) == 0, 8,
                       "entries written after the drop")
        return time.monotonic() - started

    with caplog.at_level(logging.INFO, logger="aggbox.dispatcher"):
        took = asyncio.run(run_while(d, body))
    assert took < 8
    check_delivery(pub.delivered(), later)
    assert d.workers[0].stats.stream_invalidations == 1
    assert d.metrics.registry.get_sample_value(
        "aggbox_dispatcher_stream_invalidations_total", {"collection": "emitters"}) == 1
    assert d.metrics.registry.get_sample_value(
        "aggbox_dispatcher_sweeps_total", {"collection": "emitters", "reason": "invalidated"}
    ) == 1
    assert any("change stream invalidated" in r.getMessage() for r in caplog.records)


# -- temp files of a killed JSON Lines writer -----------------------------------------------
def test_stale_jsonl_temp_files_are_removed_at_start_up(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # What a writer killed between write and rename leaves: complete lines, hidden name.
    left = out / ".tmp-0123456789abcdef.jsonl"
    left.write_text('{"message_id": "x-1"}\n{"message_id": "x-2"}\n')
    old = time.time() - 3600
    os.utime(left, (old, old))
    busy = out / ".tmp-fedcba9876543210.jsonl"  # another writer's, being written right now
    busy.write_text('{"message_id": "y-1"}\n')
    emitted = emit(writer, ["a000"], n=2)
    d = Dispatcher(settings(jsonl_dir=str(out)), store=store)
    with caplog.at_level(logging.INFO, logger="aggbox.dispatcher"):
        assert asyncio.run(d.run(once=True)) == 0
    assert not left.exists()  # before: left there forever
    assert busy.exists()
    check_delivery([(e["source"]["id"], e["message_id"], e["source"]["seq"])
                    for e in jsonl_envelopes(out)], emitted)
    assert any("removed 1 stale temp file" in r.getMessage() for r in caplog.records)
