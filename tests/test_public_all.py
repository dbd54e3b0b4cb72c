"""Every name a package exports can be imported from it (issue 40, item 5): ``from pkg import
name`` for each name of ``__all__`` of ``aggregates``, ``spark``, ``dispatcher``, ``aggbox``
and of every package under them that defines ``__all__`` (``aggregates.testing``,
``aggregates.debug``, ``dispatcher.publishers``, …), each package in a fresh interpreter, so
that a lazy-import map (PEP 562 ``__getattr__``) pointing at a module a name has left fails
here — not in a user's first import, nor in a benchmark that backs a figure.

The packages are found by reading the source (``ast``): a package added later is checked
without editing this file."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("aggregates", "spark", "dispatcher", "aggbox")


def _declares_all(init: Path) -> bool:
    tree = ast.parse(init.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.Assign | ast.AnnAssign) and any(
        isinstance(t, ast.Name) and t.id == "__all__"
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
        for node in tree.body)


def _packages() -> list[str]:
    """The public packages (no part of the dotted name starts with ``_``) that define
    ``__all__`` in their ``__init__.py``."""
    found = []
    for top in TOP:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            parts = init.parent.relative_to(ROOT).parts
            if any(p.startswith("_") for p in parts) or not _declares_all(init):
                continue
            found.append(".".join(parts))
    return found


PACKAGES = _packages()

#: Run in a fresh interpreter: ``from <package> import <name>`` for every exported name;
#: prints the failures as JSON (name → the error's line).
_PROBE = """
import importlib, json, sys
package = sys.argv[1]
names = list(importlib.import_module(package).__all__)
failed = {}
for name in names:
    try:
        exec(f"from {package} import {name}", {})
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"names": len(names), "failed": failed}))
"""


def test_the_packages_are_found() -> None:
    # the four packages the issue names, and their subpackages that export names
    assert {"aggregates", "spark", "dispatcher", "aggregates.testing", "aggregates.debug",
            "aggregates.ops", "dispatcher.publishers"} <= set(PACKAGES), PACKAGES


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_imports(package: str) -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE, package], capture_output=True,
                          text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["names"] > 0
    assert result["failed"] == {}, f"from {package} import …: {result['failed']}"
