"""The store contract on mongomock: pure logic, no server, fast."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from aggregates.testing import memory_database
from tests.aggregates.contract import StoreContract


class TestMongomockStore(StoreContract):
    @pytest.fixture
    def store_db(self) -> Iterator[Any]:
        yield memory_database("aggbox_test")
