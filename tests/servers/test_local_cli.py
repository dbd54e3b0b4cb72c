"""The README's local loop, as a new user types it: ``aggbox local start`` → ``aggbox run`` →
``aggbox dispatch --once`` → ``aggbox deadletters list`` → ``aggbox local status`` →
``aggbox local stop``, every command a subprocess of ``.venv/bin/aggbox`` with
``AGGBOX_HOME`` in a temporary directory and no ``AGGBOX_MONGODB_URI``; then a command without
a local server warns that its throw-away server loses the results.

Slow (Spark starts in a subprocess, ~1 min): one test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from aggbox.servers.persistent import LOCAL_KIND

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

ROOT = Path(__file__).resolve().parents[2]
THROWAWAY = "results are lost when this command exits"
# the installed console script next to this interpreter (.venv/bin/aggbox), else the module
_SCRIPT = Path(sys.executable).with_name("aggbox")
AGGBOX = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "aggbox.cli"]


def _envelopes() -> list[dict[str, Any]]:
    """Two customers and two orders of aggbox.examples.orders: 4 applied, 2 OrderCreated emitted."""
    def at(s: int) -> str:
        return f"2026-01-01T00:00:{s:02d}Z"

    customers = [{"message_id": f"{c}:registered", "type": "CustomerRegistered",
                  "aggregate_type": "Customer", "aggregate_id": c,
                  "payload": {"name": c, "credit_limit": limit}, "occurred_at": at(i)}
                 for i, (c, limit) in enumerate([("c-1", 100), ("c-2", 50)])]
    orders = [{"message_id": f"{o}:placed", "type": "PlaceOrder", "aggregate_type": "Order",
               "aggregate_id": o, "payload": {"customer_id": c, "amount": amount},
               "occurred_at": at(10 + i), "source": {"type": "Checkout", "id": o, "seq": 1}}
              for i, (o, c, amount) in enumerate([("o-1", "c-1", 30), ("o-2", "c-2", 80)])]
    return customers + orders


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError, IndexError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def test_local_server_loop(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items()
           if k not in ("AGGBOX_MONGODB_URI", "AGGBOX_DATABASE", "AGGBOX_CONFIG")}
    env["AGGBOX_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))

    def aggbox(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*AGGBOX, *argv], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def state() -> dict[str, Any] | None:
        path = home / "local-mongodb.json"
        return json.loads(path.read_text()) if path.exists() else None

    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(e) + "\n" for e in _envelopes()))
    out_dir = tmp_path / "published"
    dispatch = ("dispatch", "--once", "--aggregates", "aggbox.examples.orders",
                "--publisher", "jsonl", "--jsonl-dir", str(out_dir))
    pid: int | None = None
    try:
        started = aggbox("local", "start")
        assert started.returncode == 0, started.stderr
        st = state()
        assert st is not None and st["kind"] == LOCAL_KIND
        pid = int(st["pid"])
        assert st["uri"] in started.stdout and "aggbox local stop" in started.stdout
        assert _alive(pid)

        run = aggbox("run", "--input", str(inp), "--aggregates", "aggbox.examples.orders",
                     "--no-progress", "--json")
        assert run.returncode == 0, run.stdout + run.stderr
        summary = json.loads(run.stdout)  # --json: stdout holds that one line only
        assert summary["applied"] == 4 and summary["dead_lettered"] == 0, summary
        assert THROWAWAY not in run.stderr

        published = aggbox(*dispatch)
        assert published.returncode == 0, published.stderr
        assert THROWAWAY not in published.stderr
        lines = [json.loads(line) for f in sorted(out_dir.glob("*.jsonl"))
                 for line in f.read_text().splitlines() if line]
        assert sorted((m["type"], m["aggregate_id"]) for m in lines) == [
            ("OrderCreated", "c-1"), ("OrderCreated", "c-2")]

        dead = aggbox("deadletters", "list", "--json")
        assert dead.returncode == 0, dead.stderr
        assert json.loads(dead.stdout)["items"] == []

        status = aggbox("local", "status")
        assert status.returncode == 0 and "running" in status.stdout, status
        assert str(pid) in status.stdout and st["uri"] in status.stdout

        stopped = aggbox("local", "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert not _alive(pid) and state() is None
        pid = None
        again = aggbox("local", "stop")
        assert again.returncode == 0 and "no local MongoDB running" in again.stdout
        gone = aggbox("local", "status")
        assert gone.returncode == 3 and "not running" in gone.stdout

        # no local server any more: the command announces its throw-away server, once
        alone = aggbox(*dispatch)
        assert alone.returncode == 0, alone.stderr
        warnings = [line for line in alone.stderr.splitlines() if THROWAWAY in line]
        assert len(warnings) == 1 and "aggbox local start" in warnings[0], alone.stderr
    finally:
        aggbox("local", "stop", timeout=60)
        if pid is not None and _alive(pid):  # the stop command itself failed: no leak
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
