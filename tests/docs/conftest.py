"""Fixtures of the documentation tests (servers come from ``tests/conftest.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import MongoClient


@pytest.fixture
def doc_database(mongo_client: MongoClient[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[str]:
    """A fresh database named in ``AGGBOX_DATABASE`` (what ``AggboxSettings.load()`` and the
    command line use), dropped afterwards. ``AGGBOX_MONGODB_URI`` is set by ``mongo_server``."""
    name = f"t_docs_{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("AGGBOX_DATABASE", name)
    yield name
    mongo_client.drop_database(name)
