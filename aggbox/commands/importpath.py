"""The current folder on the import path, for every command (issue 44, items 2 and 6).

A team runs ``aggbox`` from its project folder and names its domain module there
(``--aggregates fleet``). The console script's ``sys.path`` starts at its own ``bin/``, not
at the current folder, so :func:`use_current_folder` puts the current folder first — as
``python -m``, pytest and uvicorn do — for every command, once, in :func:`aggbox.cli.main`.

A folder there with the name of one of aggbox's top-level packages (``spark/`` holding the
team's Spark jobs, say) would then hide aggbox's own: :func:`use_current_folder` imports
aggbox's packages first (a package imported once stays, whatever the path says later) and
:func:`shadowing` finds such folders, for one line each naming the folder and what to do.
Spark's local workers are other processes, started with the current folder on their
``PYTHONPATH`` (:func:`aggbox.commands.preflight.check_aggregates`): for them the folder
*would* win, so ``aggbox run``/``stream`` stop before Spark with the same line as an error.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["OWN_PACKAGES", "Shadow", "project_folder", "shadowing", "use_current_folder"]

#: aggbox's top-level packages (pyproject.toml [tool.setuptools.packages.find]).
OWN_PACKAGES = ("aggregates", "spark", "dispatcher", "aggbox")


class Shadow(NamedTuple):
    """A folder (or module file) ``path`` in the current folder that ``import name`` would
    find before aggbox's own package ``name``, installed at ``installed``."""

    name: str
    path: Path
    installed: Path

    def line(self) -> str:
        """The one line a command prints: the folder, the package, what to do."""
        return (f"folder ./{self.path.name} ({self.path}) has the name of aggbox's package "
                f"{self.name!r} ({self.installed}) and hides it from Python started in this "
                "folder (your aggregates module's imports, Spark's local workers): rename the "
                "folder, or run aggbox from another folder with your module on PYTHONPATH")


def _installed_root() -> Path:
    """The folder holding aggbox's packages side by side: site-packages, or the checkout of
    an editable install."""
    return Path(__file__).resolve().parents[2]


def shadowing(cwd: Path | None = None) -> list[Shadow]:
    """The folders of ``cwd`` (default: the current folder) that ``import <package>`` of one
    of :data:`OWN_PACKAGES` would resolve to, were ``cwd`` first on the path (as it is for
    Spark's local workers): a package folder, a module file, or — when aggbox's packages are
    found by a finder of their own (an editable install) — a plain folder."""
    here = (cwd or Path.cwd()).resolve()
    root = _installed_root()
    if here == root:  # aggbox's own checkout: its packages are the installed ones
        return []
    rest = [p for p in sys.path if p and Path(p).resolve() != here]
    found = []
    for name in OWN_PACKAGES:
        spec = PathFinder.find_spec(name, [str(here), *rest])
        if spec is None:
            continue
        where = (list(spec.submodule_search_locations or [])
                 or ([str(Path(spec.origin).parent)] if spec.origin else []))
        if where and Path(where[0]).resolve().parent == here:
            path = here / name if (here / name).is_dir() else here / f"{name}.py"
            found.append(Shadow(name, path, root / name))
    return found


def use_current_folder() -> list[Shadow]:
    """aggbox's own packages imported (kept whatever comes first on the path later), then
    the current folder first on ``sys.path`` (unless it is there already); the folders that
    shadow one of aggbox's packages (:func:`shadowing`)."""
    for name in OWN_PACKAGES:
        importlib.import_module(name)  # each __init__ is light (spark's names are lazy)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return shadowing(Path(cwd))


def project_folder(args: Any) -> None:
    """For every command, before it runs (:func:`aggbox.cli.main`): :func:`use_current_folder`
    and, for a command that takes ``--aggregates``, one warning line per folder that shadows
    one of aggbox's packages (``aggbox run`` and ``stream`` decide in their pre-flight: their
    local Spark workers would import it)."""
    shadows = use_current_folder()
    takes_module = any(k == "aggregates" or k.endswith("_aggregates") for k in vars(args))
    if takes_module and args.command not in ("run", "stream"):
        for shadow in shadows:
            print(f"aggbox: warning: {shadow.line()}", file=sys.stderr)
