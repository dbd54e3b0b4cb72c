"""Fixtures of the local-server tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aggbox.servers import persistent


@pytest.fixture
def local_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An ``AGGBOX_HOME`` of the test's own, its persistent local server stopped at the end."""
    home = tmp_path / "home"
    monkeypatch.setenv("AGGBOX_HOME", str(home))
    try:
        yield home
    finally:
        persistent.stop_persistent_mongodb()
