"""``--json``: one JSON object on stdout whatever happens (issue 40, item 7).

A command given ``--json`` prints its result as JSON on stdout. When it fails before it has
one — a usage error, a configuration error, a server it cannot reach or cannot run on, a
Spark job that failed, an interrupt — it says why in one line on stderr as every command
does, and :func:`one_json_object` then prints ``{"error": <that line>, "exit_status": N}``
on stdout, so that ``aggbox … --json | jq`` always reads exactly one object. A command that
printed its own object (``check-store``'s report or error, ``run``'s summary with exit
status 3) is left as it is.

How: stdout and stderr are passed through a tap while the command runs; the tap notes
whether anything reached stdout and keeps the last ``aggbox …: error: …`` line of stderr.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any, TextIO

__all__ = ["EXTRA_FIELDS", "one_json_object"]

#: Fields a command's own error object has besides ``error`` and ``exit_status``
#: (``check-store --json``: docs/operations.md "Checking your MongoDB").
EXTRA_FIELDS: Mapping[str, Mapping[str, Any]] = {
    "check-store": {"uri": None, "checks": [], "usable": False},
}

_ERROR_LINE = re.compile(r"^aggbox(?: [\w-]+)*: error: (.+)$")


class _Tap:
    """A text stream passing everything to ``stream``, noting what went through."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.written = False
        self.error: str | None = None
        self._partial = ""

    def write(self, text: str) -> int:
        if text:
            self.written = True
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()[-2000:]
            for line in lines:
                m = _ERROR_LINE.match(line.strip())
                if m:
                    self.error = m.group(1)
        return self.stream.write(text)

    def last_error(self) -> str | None:
        m = _ERROR_LINE.match(self._partial.strip())
        return m.group(1) if m else self.error

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, …
        return getattr(self.stream, name)


def one_json_object(command: str | None, body: Callable[[], int]) -> int:
    """Run ``body`` (the command; its exit status), then, if it failed without printing
    anything on stdout, print the error object there. ``SystemExit`` (argparse's usage
    errors) and ``KeyboardInterrupt`` are exit statuses here (2, 130)."""
    out, err = _Tap(sys.stdout), _Tap(sys.stderr)
    sys.stdout, sys.stderr = out, err
    try:
        try:
            rc = body()
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except KeyboardInterrupt:
            print(f"aggbox {command or ''}: error: interrupted".replace("  ", " "),
                  file=sys.stderr)
            rc = 130
    finally:
        sys.stdout, sys.stderr = out.stream, err.stream
    if rc != 0 and not out.written:
        obj = {**EXTRA_FIELDS.get(command or "", {}),
               "error": err.last_error() or f"the command ended with exit status {rc}",
               "exit_status": rc}
        print(json.dumps(obj, ensure_ascii=False), flush=True)
    return rc
