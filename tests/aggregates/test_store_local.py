"""The store contract on the local server (mongod on PATH or mongo-java-server), and on a
real MongoDB replica set when ``AGGBOX_MONGODB_URI`` is given."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from tests.aggregates.contract import StoreContract


class TestLocalServerStore(StoreContract):
    @pytest.fixture
    def store_db(self, db: Any) -> Iterator[Any]:
        yield db


# Read at collection time, before the session fixture exports the local server's URI.
# The local-server class above always runs; this one needs a real replica set, which this
# machine cannot provide (no mongod can be installed here), so it runs only when given one.
REAL_URI = os.environ.get("AGGBOX_MONGODB_URI")


@pytest.mark.real_mongodb
@pytest.mark.skipif(REAL_URI is None, reason="no real MongoDB: set AGGBOX_MONGODB_URI to a "
                    "replica set (mongod --replSet rs0; rs.initiate()) to run this class")
class TestRealMongoStore(StoreContract):
    @pytest.fixture
    def store_db(self) -> Iterator[Any]:
        assert REAL_URI is not None
        client: MongoClient[dict[str, Any]] = MongoClient(REAL_URI)
        name = f"aggbox_contract_{uuid.uuid4().hex[:8]}"
        yield client[name]
        client.drop_database(name)
        client.close()
