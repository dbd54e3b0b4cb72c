"""``aggbox dispatch`` as a process (issue 34, item 6): ``--once`` says what it did in one
line on stdout (per collection too, with what is left: issue 40, item 9) and logs one "once
sweep done" per drained collection (not a second one for the empty sweep that ends it, nor
one for an empty collection); a SIGTERM while the command still starts (importing takes
seconds on a busy machine) is a graceful stop, exit 0, instead of the default signal action
(exit -15). Real processes against the suite's MongoDB."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aggbox.examples.orders import registry
from aggregates import AggboxSettings, Message, Source, StoreWriter

AGGBOX = str(Path(sys.executable).with_name("aggbox"))


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AGGBOX_")}
    env.update(AGGBOX_HOME=str(tmp_path / "home"), AGGBOX_LOG_FILE=str(tmp_path / "trace.log"),
               PYTHONUNBUFFERED="1")
    if "AGGBOX_CACHE_DIR" in os.environ:
        env["AGGBOX_CACHE_DIR"] = os.environ["AGGBOX_CACHE_DIR"]
    return env


def _place(db: Any, *order_ids: str) -> None:
    w = StoreWriter(db, registry, settings=AggboxSettings(database=db.name))
    w.ensure_indexes()
    out = w.process([Message(f"place-{o}", "PlaceOrder", "Order", o,
                             {"customer_id": "c-1", "amount": 10},
                             source=Source("Checkout", o, 1)) for o in order_ids])
    assert {o.outcome for o in out} == {"applied"}


def test_once_prints_a_summary_and_logs_one_sweep_per_collection(
        tmp_path: Path, mongo_uri: str, db: Any) -> None:
    _place(db, "o-1", "o-2")  # two OrderCreated entries, two credit timers
    past = datetime.now(UTC) - timedelta(minutes=1)
    db.orders.update_one({"_id": "o-1"}, {"$set": {"timers.0.due": past}})
    done = subprocess.run(
        [AGGBOX, "dispatch", "--once", "--aggregates", "aggbox.examples.orders",
         "--publisher", "jsonl", "--jsonl-dir", str(tmp_path / "out"),
         "--mongodb-uri", mongo_uri, "--database", db.name, "--metrics-port", "0"],
        env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=600,
        check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("aggbox dispatch --once: published 2, timers fired 1, effects done "
                           "0, dead-lettered 0; customers: published 0, timers fired 0, left 0 "
                           "entries and 0 due timers; orders: published 2, timers fired 1, left "
                           "0 entries and 0 due timers\n"), done
    sweeps = [line for line in done.stderr.splitlines() if "once sweep done" in line]
    assert len(sweeps) == 1 and "orders: once sweep done: 2 entries published" in sweeps[0], \
        done.stderr


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (``SigCgt`` in /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = next(int(line.split()[1], 16) for line in status.splitlines()
                if line.startswith("SigCgt:"))
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def test_sigterm_while_starting_is_a_graceful_stop(
        tmp_path: Path, mongo_uri: str, db: Any) -> None:
    proc = subprocess.Popen(
        [AGGBOX, "dispatch", "--aggregates", "aggbox.examples.orders", "--publisher", "stdout",
         "--mongodb-uri", mongo_uri, "--database", db.name, "--metrics-port", "0"],
        env=_env(tmp_path), cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        # The first moment a supervisor's SIGTERM can be handled at all: the handler is
        # there (polled; a hang guard of 120 s, not a time limit).
        for _ in range(120_000):
            if proc.poll() is not None or _catches_sigterm(proc.pid):
                break
            time.sleep(0.001)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    # Stopped before it started (its own handler would log "dispatcher … started" first).
    assert " started: " not in err and "Traceback" not in err, err
