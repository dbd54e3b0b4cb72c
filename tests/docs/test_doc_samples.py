"""The code in README.md and docs/*.md works (conventions: :mod:`tests.docs.markdown`).

- Python blocks run, each file's in order in one namespace, against the session's MongoDB
  server (``AGGBOX_MONGODB_URI``) in a fresh database (``AGGBOX_DATABASE``), in a temporary
  working directory.
- Every ``aggbox`` command line in a shell block parses with the real parser; ``--help``
  lines run. Inline ``aggbox …`` spans (also in the notebook's text) name existing
  sub-commands and options.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import types
from pathlib import Path

import pytest

from aggbox.cli import build_parser, main
from tests.docs.markdown import (
    PYTHON,
    SHELL,
    Block,
    Command,
    aggbox_commands,
    fenced_blocks,
    inline_commands,
    opt_out_reason,
)
from tests.docs.notebook import read_notebook

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Pages that must exist (README links them).
REQUIRED = ("concepts.md", "configuration.md", "debugging.md", "evolving-schemas.md",
            "operations.md", "reasons.md", "side-effects.md", "testing.md")


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def python_blocks(path: Path) -> list[Block]:
    return [b for b in fenced_blocks(path) if b.language in PYTHON]


def shell_commands(path: Path) -> list[Command]:
    return [c for b in fenced_blocks(path) if b.language in SHELL for c in aggbox_commands(b)]


def test_the_documentation_pages_exist() -> None:
    names = {p.name for p in DOCS}
    assert set(REQUIRED) <= names


@pytest.mark.mongo
@pytest.mark.parametrize("path", [p for p in DOCS if python_blocks(p)],
                         ids=_ids([p for p in DOCS if python_blocks(p)]))
def test_python_samples_run(path: Path, doc_database: str, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType(f"doc_sample_{path.stem}")
    module.__file__ = str(path)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for block in python_blocks(path):
        # Pad with blank lines so tracebacks give the line in the Markdown file. Blocks that
        # opt out must compile all the same.
        code = compile("\n" * (block.line - 1) + block.source, str(path), "exec")
        reason = opt_out_reason(block)
        if reason is not None:
            assert reason, f"{block.where}: say why the block is not executed"
            continue
        exec(code, module.__dict__)


def test_readme_exercises_its_aggregate_with_the_harness() -> None:
    blocks = python_blocks(ROOT / "README.md")
    defined = next(i for i, b in enumerate(blocks) if "AggregateType(" in b.source)
    assert any("AggregateHarness(" in b.source and opt_out_reason(b) is None
               for b in blocks[defined + 1:])


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def strict_parser() -> argparse.ArgumentParser:
    """The real parser, without abbreviated options: the docs must spell options in full."""
    root = build_parser()
    todo = [root]
    while todo:
        parser = todo.pop()
        parser.allow_abbrev = False
        todo.extend(_subparsers(parser).values())
    return root


def _parse(argv: tuple[str, ...]) -> tuple[int, str]:
    """Parse with the real parser; ``(exit status, output)`` (0 and no output when it parsed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            strict_parser().parse_args(list(argv))
        except SystemExit as exc:
            return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


SHELL_COMMANDS = [c for p in DOCS for c in shell_commands(p)]


@pytest.mark.parametrize("command", SHELL_COMMANDS, ids=[c.where for c in SHELL_COMMANDS])
def test_command_lines_parse(command: Command) -> None:
    asks_help = "--help" in command.argv or "-h" in command.argv
    status, output = _parse(command.argv)
    assert status == 0, f"{command.where}: `{command.text}` does not parse:\n{output}"
    if asks_help:
        with contextlib.redirect_stdout(io.StringIO()) as out, \
                pytest.raises(SystemExit) as exited:
            main(list(command.argv))
        assert exited.value.code == 0
        assert "usage: aggbox" in out.getvalue()


INLINE_COMMANDS = [c for p in DOCS for c in inline_commands(p)]


@pytest.mark.parametrize("command", INLINE_COMMANDS, ids=[c.where for c in INLINE_COMMANDS])
def test_inline_commands_name_existing_options(command: Command) -> None:
    check_inline(command)


def test_the_notebook_text_names_existing_commands(tmp_path: Path) -> None:
    text = tmp_path / "debugging.ipynb.md"
    text.write_text("\n\n".join(c.source for c in read_notebook().cells
                                 if c.cell_type == "markdown"), encoding="utf-8")
    commands = inline_commands(text)
    assert commands
    for command in commands:
        check_inline(command)


def check_inline(command: Command) -> None:
    """The sub-commands exist and every ``--option`` belongs to the last one."""
    parser = build_parser()
    words = list(command.argv)
    while words and (subs := _subparsers(parser)) and words[0] in subs:
        parser = subs[words.pop(0)]
    assert not _subparsers(parser) or not words or words[0].startswith("-"), (
        f"{command.where}: `{command.text}`: no sub-command {words[0]!r}")
    known = {o for a in parser._actions for o in a.option_strings}
    unknown = [w.split("=", 1)[0] for w in words
               if w.startswith("--") and w.split("=", 1)[0] not in known]
    assert not unknown, f"{command.where}: `{command.text}`: unknown option(s) {unknown}"


def test_the_checks_find_the_samples() -> None:
    """Guard against a parser that silently finds nothing."""
    assert python_blocks(ROOT / "README.md")
    assert shell_commands(ROOT / "docs" / "debugging.md")
    assert shell_commands(ROOT / "docs" / "operations.md")
    assert inline_commands(ROOT / "README.md")
