"""Running the ``aggbox`` command as a team would, from its own folder: an environment
without the suite's ``AGGBOX_*`` settings and ``PYTHONPATH`` (the command must find the
team's modules from the folder it runs in), a home and a log file of the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["AGGBOX", "run_aggbox", "team_env"]

AGGBOX = str(Path(sys.executable).with_name("aggbox"))


def team_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without ``AGGBOX_*`` and ``PYTHONPATH``, with
    ``AGGBOX_HOME`` and ``AGGBOX_LOG_FILE`` under ``tmp_path``, then ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.upper().startswith("AGGBOX_") and k != "PYTHONPATH"}
    env.update(AGGBOX_HOME=str(tmp_path / "home"), AGGBOX_LOG_FILE=str(tmp_path / "trace.log"),
               **extra)
    return env


def run_aggbox(cwd: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """``aggbox ARGV`` in ``cwd``; text output captured, never raises on its exit status."""
    return subprocess.run([AGGBOX, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # a hang guard, not a time limit
