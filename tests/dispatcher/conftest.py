"""Fixtures of the dispatcher tests.

- ``dmongo``: a MongoDB for this package. With ``AGGBOX_MONGODB_URI`` (a real replica set)
  that server; otherwise a dedicated local server (mongo-java-server's oplog is never
  trimmed and every getMore scans it, so the dispatcher tests do not share the session
  server with the heavy suites).
- ``ddb``: a fresh database on it per test (dropped afterwards), with the test aggregate's
  indexes; ``store``: the matching :class:`AggboxSettings`; ``writer``: a StoreWriter.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.database import Database

from aggbox.servers import LocalMongo, start_local_mongodb
from aggregates import AggboxSettings, StoreWriter
from tests.dispatcher.domain import registry

# Read at import, before the session fixture exports its own server's URI in this variable.
_USER_URI = os.environ.get("AGGBOX_MONGODB_URI", "").strip()


@pytest.fixture(scope="package")
def dmongo() -> Iterator[LocalMongo]:
    if _USER_URI:
        yield start_local_mongodb()
        return
    saved = os.environ.pop("AGGBOX_MONGODB_URI", None)
    try:
        server = start_local_mongodb()
    finally:
        if saved is not None:
            os.environ["AGGBOX_MONGODB_URI"] = saved
    with server:
        yield server


@pytest.fixture(scope="package")
def dclient(dmongo: LocalMongo) -> Iterator[MongoClient[dict[str, Any]]]:
    client: MongoClient[dict[str, Any]] = MongoClient(dmongo.uri, tz_aware=True)
    yield client
    client.close()


@pytest.fixture
def ddb(dclient: MongoClient[dict[str, Any]], request: pytest.FixtureRequest
        ) -> Iterator[Database[dict[str, Any]]]:
    name = "d_" + re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:40] + uuid.uuid4().hex[:6]
    yield dclient[name]
    dclient.drop_database(name)


@pytest.fixture
def store(dmongo: LocalMongo, ddb: Database[dict[str, Any]]) -> AggboxSettings:
    return AggboxSettings.load(mongodb_uri=dmongo.uri, database=ddb.name)


@pytest.fixture
def writer(ddb: Database[dict[str, Any]], store: AggboxSettings) -> StoreWriter:
    w = StoreWriter(ddb, registry, settings=store)
    w.ensure_indexes()
    return w
