"""Shared pytest fixtures: the real servers every test suite may use.

Servers are started lazily, once per test session, only when a test requests them:

- ``mongo_server`` — ``AGGBOX_MONGODB_URI`` if set, else a local server (``mongod`` on PATH,
  else mongo-java-server; ``AGGBOX_LOCAL_MONGO=mjs`` forces the latter). See
  :mod:`aggbox.servers.mongo`. Its capabilities (``mongo_server.capabilities``) say what the
  stand-in cannot do.
- ``kafka_server`` — a real single-node KRaft broker (:mod:`aggbox.servers.kafka`).
- ``ferretdb_server`` — FerretDB 1.24.2 built from the Go module proxy
  (:mod:`aggbox.servers.ferretdb`).

Add fixtures below; keep each one small and commented.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from aggbox.servers import LocalKafka, LocalMongo, start_local_kafka, start_local_mongodb
from aggbox.servers.ferretdb import LocalFerretDB, start_ferretdb


@pytest.fixture(scope="session")
def mongo_server() -> Iterator[LocalMongo]:
    """The MongoDB of this test session (a handle: ``.uri``, ``.kind``, ``.capabilities``)."""
    with start_local_mongodb() as server:
        # Child processes (Spark workers, a dispatcher run as a subprocess) must use this same
        # server, not start their own in-memory one: hand them the URI through the variable
        # that start_local_mongodb()/mongodb_uri() honour first.
        previous = os.environ.get("AGGBOX_MONGODB_URI")
        os.environ["AGGBOX_MONGODB_URI"] = server.uri
        try:
            yield server
        finally:
            if previous is None:
                os.environ.pop("AGGBOX_MONGODB_URI", None)
            else:
                os.environ["AGGBOX_MONGODB_URI"] = previous


@pytest.fixture(scope="session")
def mongo_uri(mongo_server: LocalMongo) -> str:
    """Connection string of :func:`mongo_server`."""
    return mongo_server.uri


@pytest.fixture(scope="session")
def mongo_client(mongo_uri: str) -> Iterator[MongoClient[dict[str, Any]]]:
    """One pymongo client for the whole session (clients are thread-safe and pooled)."""
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_uri)
    yield client
    client.close()


@pytest.fixture
def db(
    mongo_client: MongoClient[dict[str, Any]], request: pytest.FixtureRequest
) -> Iterator[Database[dict[str, Any]]]:
    """A fresh database for one test, named after it (max. 63 characters), dropped afterwards."""
    test = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:40]
    name = f"t_{test}_{uuid.uuid4().hex[:8]}"
    yield mongo_client[name]
    mongo_client.drop_database(name)


@pytest.fixture(scope="session")
def ferretdb_server() -> Iterator[LocalFerretDB]:
    """FerretDB 1.24.2 (SQLite backend) on a free loopback port: a second MongoDB-wire
    server that is not MongoDB (``.uri``). Built from the Go module proxy on first use and
    cached (:mod:`aggbox.servers.ferretdb`)."""
    with start_ferretdb() as server:
        yield server


@pytest.fixture(scope="session")
def kafka_server() -> Iterator[LocalKafka]:
    """A Kafka broker for the session: ``.bootstrap_servers``; tests may kill/restart it
    (it comes back on the same ports), but must leave it running."""
    with start_local_kafka() as server:
        yield server


# -- Spark ---------------------------------------------------------------------------------
# ONE SparkSession (``local[2, 4]``: two cores, failed tasks retried) for the whole test
# session — it takes ~10 s to start, and Spark keeps one JVM per Python process whose first
# session fixes the packages — with Spark's Kafka source on the classpath. Shared by the
# pipeline tests and the demo tests.
REPO = Path(__file__).resolve().parents[1]

# Commands run in-process write their traces to $AGGBOX_LOG_FILE (default ./aggbox.log):
# keep the test session's out of the work tree.
os.environ.setdefault("AGGBOX_LOG_FILE", os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"aggbox-tests-{os.getpid()}.log"))


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    from aggbox.session import build_session
    from spark.settings import SparkSettings

    # Executors import the test aggregates module (tests.spark.domain): Python workers get
    # PYTHONPATH from the JVM's environment, so set it before the JVM starts.
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    settings = SparkSettings.load(
        master="local[2]",
        shuffle_partitions=3,
        arrow_batch_rows=128,  # small Arrow batches: aggregates span batches (carry-over)
        conf={"spark.ui.enabled": "false", "spark.sql.adaptive.enabled": "false",
              "spark.scheduler.mode": "FAIR"},
    )
    session = build_session(settings, kafka=True)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()




@pytest.fixture
def otel_spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """An OpenTelemetry SDK tracer provider with the in-memory exporter, installed as the
    global provider for one test only (the API lets a process set it once; the test
    replaces the module global and puts it back), so aggbox makes spans. Yields the
    exporter: ``otel_spans.get_finished_spans()``."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield exporter
    provider.shutdown()


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """``aggbox.cli.main()`` run in-process points the root logger at the stderr of that
    moment (pytest's capture, closed after the test); put the handlers back, so later
    records from background threads (servers, clients) do not hit a closed stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
