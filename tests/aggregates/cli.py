"""Running ``aggbox`` in-process against one test's database (shared by the admin and
migration command tests)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

Run = Callable[..., tuple[int, str, str]]


def run_cli(db: Any, mongo_uri: str, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> Iterator[Run]:
    """Yield ``run(*argv) -> (exit code, stdout, stderr)``: the store settings point at
    ``db``, no config file is read, rich tables are not wrapped, and the logging set-up
    ``main()`` makes is undone afterwards (pytest's handlers come back)."""
    from aggbox.cli import main

    monkeypatch.setenv("AGGBOX_MONGODB_URI", mongo_uri)
    monkeypatch.setenv("AGGBOX_DATABASE", db.name)
    monkeypatch.delenv("AGGBOX_CONFIG", raising=False)
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps tables at the terminal width
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main(list(argv))
        out = capsys.readouterr()
        return rc, out.out, out.err

    yield run
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(name="cli")
def migrate_cli(db: Any, mongo_uri: str, monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> Iterator[Run]:
    """Fixture ``cli``: ``run(*argv)`` with only the admin and migrate commands (the other
    components' command modules have their own tests). Import it into a test module."""
    import aggbox.cli

    monkeypatch.setattr(aggbox.cli, "SUBCOMMAND_MODULES", ("aggbox.admin", "aggbox.migrate"))
    yield from run_cli(db, mongo_uri, monkeypatch, capsys)
