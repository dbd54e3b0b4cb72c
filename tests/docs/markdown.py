"""Code samples in Markdown files: fenced blocks, and the ``aggbox …`` command lines in them.

Conventions checked by ``test_doc_samples.py``:

- ```` ```python ```` blocks run, each file's blocks in order in one namespace. A block that
  truly cannot run here (e.g. a driver for ``spark-submit`` on a cluster) starts with
  ``# not executed: <reason>``; it must still compile.
- ```` ```bash ```` (``sh``, ``shell``, ``console``) blocks: every command line whose program is
  ``aggbox`` must parse with the real parser (``aggbox.cli.build_parser()``); ``--help``
  lines are run.
- Inline code spans that start with ``aggbox `` name existing sub-commands and options.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "Command", "aggbox_commands", "fenced_blocks", "inline_commands",
           "opt_out_reason"]

PYTHON = frozenset({"python", "py", "python3"})
SHELL = frozenset({"bash", "sh", "shell", "console"})
OPT_OUT = re.compile(r"^#\s*not executed:\s*(?P<reason>.*\S)?\s*$")

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_INLINE = re.compile(r"(?<!`)`(?P<code>aggbox[ \n][^`]+)`(?!`)")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_OPERATORS = frozenset({"|", "||", "&", "&&", ";", ">", ">>", "<", "2>", "(", ")"})


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced code block. ``line`` is the 1-based line of its first code line."""

    path: Path
    language: str
    line: int
    source: str

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


@dataclass(frozen=True, slots=True)
class Command:
    """An ``aggbox`` command line: its arguments after ``aggbox`` and where it was found."""

    argv: tuple[str, ...]
    where: str
    text: str


def fenced_blocks(path: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        language = (m["info"].split() or [""])[0].lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = lines[j].strip()
            if closing.startswith(fence[0] * len(fence)) and not closing.strip(fence[0]):
                break
            body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
            j += 1
        else:
            raise ValueError(f"{path.name}:{i + 1}: code fence is never closed")
        blocks.append(Block(path, language, i + 2, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def opt_out_reason(block: Block) -> str | None:
    """The reason of a ``# not executed: <reason>`` first line ("" when it gives none)."""
    first = block.source.lstrip("\n").split("\n", 1)[0]
    m = OPT_OUT.match(first.strip())
    if not m:
        return None
    return m["reason"] or ""


def _split(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def _argv(words: list[str]) -> tuple[str, ...] | None:
    """The arguments of an ``aggbox`` invocation (None when the program is something else)."""
    while words and _ASSIGNMENT.match(words[0]):
        words = words[1:]  # NAME=value prefixes set the environment
    if not words or not (words[0] == "aggbox" or words[0].endswith("/aggbox")):
        return None
    args: list[str] = []
    for w in words[1:]:
        if w in _OPERATORS:
            break
        args.append(w)
    return tuple(args)


def aggbox_commands(block: Block) -> list[Command]:
    """Command lines of a shell block (``\\`` continuations joined, ``$ `` prompts and
    comments dropped) that run ``aggbox``."""
    commands: list[Command] = []
    pending = ""
    start = block.line
    for offset, raw in enumerate(block.source.splitlines()):
        line = raw.rstrip()
        if not pending:
            start = block.line + offset
            line = line.lstrip()
            if line.startswith("$ "):
                line = line[2:]
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        if not text or text.startswith("#"):
            continue
        argv = _argv(_split(text))
        if argv is not None:
            commands.append(Command(argv, f"{block.path.name}:{start}", text))
    if pending.strip():
        raise ValueError(f"{block.path.name}:{start}: a line continuation never ends")
    return commands


def inline_commands(path: Path) -> list[Command]:
    """``aggbox …`` in inline code spans outside fenced blocks; a span may wrap onto the next
    line (``…`` in a span means "and so on")."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for b in fenced_blocks(path):  # blank out fenced blocks, keeping line numbers
        for n in range(b.line - 2, b.line + b.source.count("\n")):
            lines[n] = ""
    text = "\n".join(lines)
    out: list[Command] = []
    for span in _INLINE.finditer(text):
        code = " ".join(span["code"].split())
        try:
            words = _split(code)
        except ValueError:
            words = code.split()
        argv = _argv([w for w in words if w != "…"])
        if argv is not None:
            line = text.count("\n", 0, span.start()) + 1
            out.append(Command(argv, f"{path.name}:{line}", code))
    return out
