"""What the user sees when the store or the broker cannot be reached (issue 22): one short
line per retried error, at most one per minute per cause; ``--once`` against a server never
reached ends within the server selection timeout (MongoDB) or the delivery timeout (Kafka)
with one error line, not after ``once_timeout_s``. Real processes where it matters.

Before: ``aggbox dispatch --once`` against ``mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=
2000`` printed a ~700-character WARNING (pymongo's topology description) every 2.75 s and
gave up after 123 s; against a Kafka broker at a dead port it ran until once_timeout_s."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from pymongo.database import Database
from pymongo.errors import AutoReconnect, OperationFailure, PyMongoError

from aggbox.servers import LocalMongo
from aggregates import AggboxSettings, StoreWriter
from dispatcher.core.errors import (
    TRACE_LOGGER,
    RateLimitedLog,
    describe_store_error,
    is_unreachable,
    never_reached,
)
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher, NeverReached, OnceGaveUp
from dispatcher.publishers import PublishResult
from tests.dispatcher.helpers import (
    ROOT,
    ListPublisher,
    dead_port,
    emit,
    pending_entries,
    run_once,
)

#: the default: what --once waited before giving up on a server it never reached
ONCE_TIMEOUT_S = DispatcherSettings.model_fields["once_timeout_s"].default




def lines(stderr: bytes) -> list[str]:
    return [x for x in stderr.decode().splitlines() if x.strip()]


def warnings(stderr: bytes, what: str) -> list[str]:
    return [x for x in lines(stderr) if " WARNING " in x and what in x]


async def selection_error(timeout_ms: int = 300) -> PyMongoError:
    client: AsyncMongoClient[Any] = AsyncMongoClient(
        f"mongodb://127.0.0.1:{dead_port()}/?serverSelectionTimeoutMS={timeout_ms}")
    try:
        await client.admin.command("ping")
    except PyMongoError as exc:
        return exc
    finally:
        await client.close()
    raise AssertionError("a dead port answered")


# -- one line ---------------------------------------------------------------------------------
def test_server_selection_timeout_is_one_short_line_without_the_topology() -> None:
    exc = asyncio.run(selection_error())
    assert "Topology Description" in str(exc) and len(str(exc)) > 400  # pymongo's text
    text = describe_store_error(exc)
    assert text.startswith("ServerSelectionTimeoutError: 127.0.0.1:"), text
    assert "connection refused" in text and "within 0.3s" in text, text
    assert "Topology" not in text and "configured timeouts" not in text and "\n" not in text
    assert len(text) < 200, text
    assert is_unreachable(exc)


def test_server_errors_are_described_by_code_and_labels() -> None:
    exc = OperationFailure("not primary, full error: {'ok': 0, 'a': 'x' * 1000}", 10107,
                           {"ok": 0, "code": 10107, "codeName": "NotWritablePrimary",
                            "errorLabels": ["RetryableWriteError"]})
    assert describe_store_error(exc) == (
        "OperationFailure (code 10107 NotWritablePrimary; labels RetryableWriteError): "
        "not primary")
    assert not is_unreachable(exc)
    reset = AutoReconnect("db:27017: [Errno 104] Connection reset by peer (configured "
                          "timeouts: socketTimeoutMS: 20000.0ms, connectTimeoutMS: 20000.0ms)")
    assert describe_store_error(reset) == "AutoReconnect: db:27017: connection reset by peer"


def test_the_never_reached_line_names_the_redacted_uri_and_what_to_check() -> None:
    exc = asyncio.run(selection_error())
    line = never_reached("mongodb://app:s3cret@127.0.0.1:1/?serverSelectionTimeoutMS=300",
                         exc, 0.3)
    assert "s3cret" not in line and "127.0.0.1:1" in line
    assert "not reachable within 0.3s" in line and "--mongodb-uri" in line
    assert len(line) < 280, line


# -- at most one line per period --------------------------------------------------------------
def test_rate_limited_log_logs_the_first_then_one_per_period_with_a_count(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    logger = logging.getLogger("aggbox.dispatcher.test_unreachable")
    warn = RateLimitedLog(logger, every_s=60, collection="orders", clock=lambda: now[0])
    exc = asyncio.run(selection_error())
    caplog.set_level(logging.DEBUG)
    logged = []
    for _ in range(30):  # a failure every 2 s for a minute
        logged.append(warn.warning("store", "orders: failed (%s)", describe_store_error(exc),
                                   exc=exc))
        now[0] += 2
    logged.append(warn.warning("store", "orders: failed (%s)", "again", exc=exc))
    assert logged == [True] + [False] * 29 + [True]
    shown = [r for r in caplog.records if r.name == logger.name]
    assert len(shown) == 2 and all(r.levelno == logging.WARNING for r in shown)
    assert shown[0].collection == "orders"  # type: ignore[attr-defined]
    assert shown[1].getMessage() == ("orders: failed (again) (29 more like this in the last "
                                     "60s)")
    traces = [r for r in caplog.records if r.name == TRACE_LOGGER]
    assert len(traces) == 2 and all(r.exc_info and r.levelno == logging.DEBUG for r in traces)
    # another kind is news; so is the same kind after the condition ended
    assert warn.warning("broker", "orders: publishing failed")
    warn.reset("store")
    assert warn.warning("store", "orders: failed (%s)", "back")


# -- MongoDB never reached ---------------------------------------------------------------------
def test_once_against_a_never_reached_mongodb_ends_within_the_selection_timeout(
        tmp_path: Path) -> None:
    """A refused port is an answer: the run ends after the first look (about a second,
    FIRST_LOOK_S), not after the 30 s selection timeout (issue 44: before, the dispatcher's
    ping waited the whole timeout out and said 'within 30s')."""
    log_file = tmp_path / "aggbox.log"
    uri = f"mongodb://app:s3cret@127.0.0.1:{dead_port()}/?serverSelectionTimeoutMS=30000"
    done, took = run_once("--collection", "orders", "--publisher", "stdout",
                          env={"AGGBOX_MONGODB_URI": uri, "AGGBOX_DATABASE": "shop",
                               "AGGBOX_LOG_FILE": str(log_file)},
                          timeout=ONCE_TIMEOUT_S + 60)
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    # A hang guard (before issue 34: 123 s, once_timeout_s); the wait itself is in the line.
    assert took < ONCE_TIMEOUT_S, (took, stderr)
    out = lines(done.stderr)
    assert 1 <= len(out) <= 3 and all(len(x) < 300 for x in out), out
    errors = [x for x in out if "error:" in x]
    assert len(errors) == 1, out
    assert "not reachable within 1s" in errors[0] and "--mongodb-uri" in errors[0], errors
    assert "connection refused" in errors[0], errors
    assert f"127.0.0.1:{uri.rsplit(':', 1)[1].split('/')[0]}" in errors[0]
    assert "Topology" not in stderr and "Traceback" not in stderr and "s3cret" not in stderr
    assert len(warnings(done.stderr, "")) <= 1
    trace = log_file.read_text()
    assert "Traceback" in trace and "ServerSelectionTimeoutError" in trace


# -- Kafka never reached -----------------------------------------------------------------------
@pytest.mark.mongo
def test_once_against_a_never_reached_kafka_ends_within_a_few_delivery_timeouts(
        writer: StoreWriter, ddb: Database[Any], dmongo: LocalMongo) -> None:
    pytest.importorskip("confluent_kafka")
    emit(writer, ["a000", "a001"], n=2)
    done, took = run_once("--collection", "emitters", "--publisher", "kafka",
                          "--bootstrap-servers", f"127.0.0.1:{dead_port()}",
                          "--delivery-timeout", "3",
                          env={"AGGBOX_MONGODB_URI": dmongo.uri, "AGGBOX_DATABASE": ddb.name},
                          timeout=ONCE_TIMEOUT_S + 60)
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    # one delivery timeout (3 s), a metadata request (2 s), start-up; before: 120 s
    assert took < ONCE_TIMEOUT_S / 4, (took, stderr)
    out = lines(done.stderr)
    assert all(len(x) < 300 for x in out), out
    errors = [x for x in out if "error:" in x]
    assert len(errors) == 1 and "no Kafka broker reachable at 127.0.0.1:" in errors[0], out
    assert "--bootstrap-servers" in errors[0]
    assert len(warnings(done.stderr, "publishing failed")) <= 1, stderr
    assert "Traceback" not in stderr
    assert pending_entries(ddb) == 4  # nothing pulled


@pytest.mark.mongo
def test_the_daemon_keeps_retrying_a_dead_broker_with_one_warning_per_minute(
        writer: StoreWriter, ddb: Database[Any], dmongo: LocalMongo, tmp_path: Path) -> None:
    pytest.importorskip("confluent_kafka")
    emit(writer, ["a000"], n=1)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "AGGBOX_MONGODB_URI": dmongo.uri,
           "AGGBOX_DATABASE": ddb.name, "AGGBOX_LOG_FILE": str(tmp_path / "aggbox.log")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aggbox.commands.dispatch", "--collection", "emitters",
         "--publisher", "kafka", "--bootstrap-servers", f"127.0.0.1:{dead_port()}",
         "--delivery-timeout", "1", "--backoff-initial-ms", "50", "--backoff-max-ms", "200",
         "--metrics-port", "0"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(12)  # ~8 failed deliveries (1 s each plus backoff)
        assert proc.poll() is None, "the daemon must keep retrying"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    failed = warnings(err, "publishing failed")
    # before: one per failed attempt (about 8 here)
    assert 1 <= len(failed) <= 2, err.decode()
    assert all(len(x) < 300 for x in failed), failed
    assert pending_entries(ddb) == 1


@pytest.mark.mongo
def test_once_still_gives_up_after_once_timeout_when_reached_servers_make_no_progress(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings) -> None:
    """A broker that answers but takes nothing (no ``unreachable``): the watchdog's case."""
    emit(writer, ["a000"], n=1)
    pub = ListPublisher(fail=lambda r: PublishResult.retryable("broker busy"))
    d = Dispatcher(DispatcherSettings.load(collections=["emitters"], once_timeout_s=2,
                                           backoff_initial_ms=50, backoff_max_ms=200),
                   store=store, publisher=pub)
    started = time.monotonic()
    with pytest.raises(OnceGaveUp) as info:
        asyncio.run(d.run(once=True))
    assert not isinstance(info.value, NeverReached)
    assert "emitters: no progress for 2s in --once mode" in str(info.value)
    assert "broker busy" in str(info.value)
    assert time.monotonic() - started < 30
    assert pending_entries(ddb) == 1
