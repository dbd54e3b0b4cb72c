"""The built wheel installs exactly the four packages (``aggregates``, ``spark``,
``dispatcher``, ``aggbox``) and their ``py.typed`` markers: no top-level ``examples``,
``tests`` or ``bench`` in a user's site-packages (the example domain is
``aggbox.examples``).

The wheel is built from a clean copy of the work tree (setuptools reuses a stale ``build/``
directory, which could hide or add files), without build isolation: a few seconds."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aggregates", "spark", "dispatcher", "aggbox")
_SKIP = {".git", ".venv", "build", "dist", ".mypy_cache", ".ruff_cache", ".hypothesis",
         ".pytest_cache", "__pycache__"}


def _copy_tree(dest: Path) -> None:
    """The work tree without virtualenv, VCS data, caches and earlier build output."""
    ignore = shutil.ignore_patterns(*_SKIP, "*.pyc", "*.egg-info")
    for entry in ROOT.iterdir():
        if entry.name in _SKIP or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, ignore=ignore)
        elif entry.is_file():
            shutil.copy2(entry, dest / entry.name)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    out = tmp_path_factory.mktemp("wheel")
    _copy_tree(src)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (found,) = out.glob("aggbox-*.whl")
    return found


def test_wheel_installs_only_the_four_packages(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert top - dist_info == set(PACKAGES), sorted(top)
    assert not any(n.startswith(("examples/", "tests/", "bench/")) for n in names)


def test_wheel_ships_the_example_domain_and_the_type_markers(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        assert f"{package}/py.typed" in names, package
    assert "aggbox/examples/orders/domain.py" in names
    assert "aggbox/commands/run.py" in names and "aggbox/commands/dispatch.py" in names
    assert "aggbox/servers/poms/kafka.xml" in names  # the local servers' Maven poms
    # the local servers' Java launchers, the H2 one a folder compiled together
    assert "aggbox/servers/java/AggboxMongoServer.java" in names
    assert "aggbox/servers/java/h2server/BoundedOplog.java" in names
