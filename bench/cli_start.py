"""How long the ``aggbox`` command takes to start (issue 44, item 5): wall-clock seconds of
``aggbox --version`` and ``aggbox --help`` (the goal: at most 0.5 s on a quiet machine), and
of an admin command against a MongoDB port nobody listens on, from start to its one line
(the goal: about 2 s; the pre-flight's ping looks after 1 s: aggbox/commands/preflight.py).

Each command runs ``--repeat`` times (default 10) as a new process of the ``aggbox`` of this
interpreter (its ``bin/``), in a temporary folder, with no ``AGGBOX_*`` variable of the
caller's; each figure is the median and the least of its runs. The machine's load average
(1 min) before and after is printed with the figures: a figure taken under load says little
about a quiet machine. No figure is a test (tests/test_bench_smoke.py only runs
``--smoke``: one run each).

Printed: one line per command; the last line the figures as JSON.

Usage: python bench/cli_start.py [--repeat 10] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AGGBOX = str(Path(sys.executable).with_name("aggbox"))


def dead_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(argv: list[str], env: dict[str, str], cwd: str, repeat: int) -> list[float]:
    """Wall-clock seconds of ``repeat`` runs of ``aggbox ARGV``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([AGGBOX, *argv], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False, timeout=300)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="one run of each (shows it works)")
    args = ap.parse_args()
    repeat = 1 if args.smoke else args.repeat
    with tempfile.TemporaryDirectory() as work:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AGGBOX_")}
        env.update(AGGBOX_HOME=str(Path(work) / "home"),
                   AGGBOX_LOG_FILE=str(Path(work) / "aggbox.log"))
        unreachable = f"mongodb://127.0.0.1:{dead_port()}/"
        commands = {
            "version": ["--version"],
            "help": ["--help"],
            "unreachable": ["deadletters", "list", "--timeout", "5"],
        }
        load_before = os.getloadavg()[0]
        figures: dict[str, float] = {}
        for name, argv in commands.items():
            run_env = {**env, "AGGBOX_MONGODB_URI": unreachable} if name == "unreachable" \
                else env
            times = timed(argv, run_env, work, repeat)
            figures[f"{name}_s"] = round(statistics.median(times), 3)
            figures[f"{name}_min_s"] = round(min(times), 3)
            print(f"aggbox {' '.join(argv)}: median {statistics.median(times):.3f} s, "
                  f"least {min(times):.3f} s ({repeat} run(s))")
        figures["load_before"] = round(load_before, 2)
        figures["load_after"] = round(os.getloadavg()[0], 2)
        print(f"load average (1 min): {load_before:.2f} before, {figures['load_after']:.2f} "
              f"after, on {os.cpu_count()} cores")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
