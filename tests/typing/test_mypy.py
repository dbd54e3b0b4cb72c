"""The typed domain API is checked by mypy: ``mypy --strict`` passes on tests/typing/good.py
and aggbox/examples/ (the example domains), and reports exactly the errors marked in
tests/typing/bad.py (the line after each ``# error: <text>`` comment gets an error containing
<text>; no other line gets any)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GOOD, BAD, EXAMPLES = HERE / "good.py", HERE / "bad.py", ROOT / "aggbox" / "examples"

_LINE = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+): (?P<kind>error|note): (?P<text>.*)$")


@pytest.fixture(scope="module")
def errors() -> dict[tuple[Path, int], list[str]]:
    """One ``mypy --strict`` run over aggbox/examples/, good.py and bad.py: error texts by
    (file, line)."""
    out, err, status = mypy_api.run([
        "--strict", "--config-file", str(ROOT / "pyproject.toml"),
        "--cache-dir", str(ROOT / ".mypy_cache"), "--no-error-summary",
        "--show-absolute-path", "--hide-error-context",
        str(EXAMPLES), str(GOOD), str(BAD),
    ])
    assert status in (0, 1), f"mypy failed to run:\n{out}\n{err}"
    found: dict[tuple[Path, int], list[str]] = {}
    for line in out.splitlines():
        m = _LINE.match(line)
        assert m is not None, f"unexpected mypy output: {line}\n{out}"
        if m["kind"] == "error":
            found.setdefault((Path(m["file"]).resolve(), int(m["line"])), []).append(m["text"])
    return found


def expected_errors() -> dict[int, str]:
    """bad.py's markers: line number of the marked line → the text its error contains."""
    lines = BAD.read_text().splitlines()
    want: dict[int, str] = {}
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("# error: "):
            target = next(j for j in range(i + 1, len(lines))
                          if not lines[j].strip().startswith("#"))
            want[target + 1] = stripped.removeprefix("# error: ")
    return want


def test_good_and_examples_pass_mypy_strict(errors: dict[tuple[Path, int], list[str]]) -> None:
    clean = {k: v for k, v in errors.items() if k[0] != BAD}
    assert clean == {}


def test_bad_gets_exactly_the_marked_errors(errors: dict[tuple[Path, int], list[str]]) -> None:
    want = expected_errors()
    assert len(want) >= 8
    got = {line: texts for (path, line), texts in errors.items() if path == BAD}
    for line, text in want.items():
        assert any(text in t for t in got.get(line, [])), \
            f"bad.py:{line}: expected an error containing {text!r}, got {got.get(line)}"
    assert set(got) == set(want), f"errors on unmarked lines: {set(got) - set(want)}"
