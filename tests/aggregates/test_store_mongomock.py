"""The store contract on mongomock: pure logic, no server, fast."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mongomock
import pytest

from tests.aggregates.contract import StoreContract


class TestMongomockStore(StoreContract):
    @pytest.fixture
    def store_db(self) -> Iterator[Any]:
        yield mongomock.MongoClient(tz_aware=True)["aggbox_test"]
