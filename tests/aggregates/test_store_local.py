"""The store contract on the suite's MongoDB: a real replica set when ``AGGBOX_MONGODB_URI``
is given, else the local server (``mongod`` on PATH or mongo-java-server) the suite starts
(tests/conftest.py, ``mongo_server``). One class: it never skips, whichever server runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.aggregates.contract import StoreContract


class TestLocalServerStore(StoreContract):
    @pytest.fixture
    def store_db(self, db: Any) -> Iterator[Any]:
        yield db
