"""``aggbox --help`` and ``aggbox --version`` start without importing a command module, the
library, pydantic or pymongo (issue 44, item 5: ``--version`` took 3.8 s on a loaded machine;
bench/cli_start.py measures the start, no test here is timed), and a command imports only its
own module. The table of :mod:`aggbox.subcommands` that makes that possible says what the
modules register: the lazy ``--help`` is the full parser's, word for word.

Before: ``aggbox --version`` imported every command module and with them ``aggregates``
(its ``__init__`` imports the store writer, pydantic-settings, pymongo)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from aggbox.cli import build_parser
from aggbox.subcommands import COMMANDS, SUBCOMMAND_MODULES

HEAVY = ("aggregates", "pydantic", "pymongo", "rich", "aggbox.commands.run", "aggbox.admin",
         "spark", "dispatcher")


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub


def test_the_table_says_what_the_modules_register() -> None:
    sub = _subparsers(build_parser())
    registered = [(a.dest, a.help) for a in sub._choices_actions]
    table = [row for module in SUBCOMMAND_MODULES for row in COMMANDS[module]]
    assert registered == table
    assert list(COMMANDS) == list(SUBCOMMAND_MODULES)


def test_the_lazy_help_is_the_full_help() -> None:
    assert build_parser("nothing", lazy=True).format_help() == build_parser().format_help()
    for module, commands in COMMANDS.items():
        for name, _ in commands:
            lazy = _subparsers(build_parser(name, lazy=True)).choices[name]
            full = _subparsers(build_parser()).choices[name]
            assert lazy.format_help() == full.format_help(), (module, name)


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_help_and_version_import_no_command_module(argv: list[str]) -> None:
    code = ("import sys\nfrom aggbox.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "print('imported:', heavy, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.stderr.splitlines()[-1] == "imported: []", done.stderr
    assert "aggbox" in done.stdout


def test_a_command_imports_only_its_own_module() -> None:
    code = ("import sys\nfrom aggbox.cli import main\n"
            "try:\n    main(['local', 'status', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('aggbox.')), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    loaded = done.stderr.splitlines()[-1]
    assert "aggbox.local" in loaded, done.stderr
    for other in ("aggbox.commands.run", "aggbox.admin", "aggbox.demo",
                  "aggbox.commands.dispatch'"):
        assert other not in loaded, (other, loaded)
