"""``aggbox dispatch-status`` around a real ``aggbox dispatch`` process (issue 34, item 6):
paused past its lease (SIGSTOP), the process rejoins as ``d1#2`` and logs that it did not
run — not that the store was slow — and the status shows ``d1`` as its earlier incarnation
(``now d1#2``), not as DEAD; after a graceful stop (SIGTERM) the last hand-over is still
shown (released, nobody yet). A DEAD row is not padded to the width of a live instance's
partition list."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aggregates.core.keys import join_parts

AGGBOX = str(Path(sys.executable).with_name("aggbox"))
MEMBERS = "aggbox_dispatcher_members"
TTL = 6.0  # a busy machine starves a 2 s lease: rejoins without any pause


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AGGBOX_")}
    env.update(AGGBOX_HOME=str(tmp_path / "home"), AGGBOX_LOG_FILE=str(tmp_path / "trace.log"),
               PYTHONUNBUFFERED="1")
    return env


def _status(tmp_path: Path, mongo_uri: str, db: Any, *extra: str) -> str:
    done = subprocess.run(
        [AGGBOX, "dispatch-status", "--collection", "orders", *extra],
        env={**_env(tmp_path), "AGGBOX_MONGODB_URI": mongo_uri, "AGGBOX_DATABASE": db.name},
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _wait_for_member(db: Any, name: str) -> None:
    """Until the member document ``name`` is there (a hang guard, not a time limit)."""
    for _ in range(6000):
        if db[MEMBERS].find_one({"instance": name}) or db[MEMBERS].find_one({"member": name}):
            return
        time.sleep(0.05)
    raise AssertionError(f"no member {name}: {list(db[MEMBERS].find())}")


def test_a_paused_dispatcher_rejoins_and_the_status_says_so(
        tmp_path: Path, mongo_uri: str, db: Any) -> None:
    proc = subprocess.Popen(
        [AGGBOX, "dispatch", "--collection", "orders", "--publisher", "stdout",
         "--instance-id", "d1", "--lease-ttl", str(TTL), "--metrics-port", "0",
         "--mongodb-uri", mongo_uri, "--database", db.name],
        env=_env(tmp_path), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_member(db, "d1")
        proc.send_signal(signal.SIGSTOP)
        time.sleep(3 * TTL)  # paused well past its heartbeat
        proc.send_signal(signal.SIGCONT)
        _wait_for_member(db, "d1#2")
        doc = json.loads(_status(tmp_path, mongo_uri, db, "--json"))["items"][0]
        (current,) = [i["instance"] for i in doc["instances"] if i["live"]]
        assert current.startswith("d1#")
        earlier = {i["instance"]: i["replaced_by"] for i in doc["instances"]
                   if i["instance"] != current}  # a busy machine may stall it once more
        assert "d1" in earlier and set(earlier.values()) == {current}, doc
        out = _status(tmp_path, mongo_uri, db)
        rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  d1")}
        assert f" now {current} " in rows["d1"] and "DEAD" not in rows["d1"], out
        assert " live " in rows[current], out
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    lapsed = [line for line in err.splitlines() if "heartbeat lapsed" in line]
    assert lapsed and "this process did not run" in lapsed[0], err
    assert "relieve the store" not in lapsed[0]
    out = _status(tmp_path, mongo_uri, db)
    assert f"{current} → nobody yet (released)" in out.splitlines()[-1], out


def test_a_dead_row_is_not_padded_to_a_live_partition_list(
        tmp_path: Path, mongo_uri: str, db: Any) -> None:
    now = datetime.now(UTC)
    scope = f"{db.name}.orders"
    live, dead = now + timedelta(minutes=5), now - timedelta(minutes=5)
    evens = list(range(0, 256, 2))  # 128 ranges: a ~600-character partition list
    db.aggbox_dispatcher_partitions.insert_many([{
        "_id": join_parts(db.name, "orders", str(p)), "scope": scope, "partition": p,
        "owner": "a", "expires_at": live, "epoch": 1, "since": now, "handover": "new",
        "handed_at": now} for p in evens])
    for name, pid, expires in (("a", 1, live), ("b", 2, dead)):
        db[MEMBERS].insert_one({
            "_id": join_parts(db.name, "orders", name), "scope": scope, "instance": name,
            "host": "h", "pid": pid, "started_at": now, "heartbeat_at": now,
            "expires_at": expires, "partitions": evens if name == "a" else []})
    out = _status(tmp_path, mongo_uri, db)
    b_row = next(line for line in out.splitlines() if line.startswith("  b "))
    assert "DEAD" in b_row and len(b_row) < 150, out


def _once(tmp_path: Path, mongo_uri: str, db: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [AGGBOX, "dispatch", "--once", "--aggregates", "aggbox.examples.orders",
         "--publisher", "jsonl", "--jsonl-dir", str(tmp_path / "out"),
         "--mongodb-uri", mongo_uri, "--database", db.name, "--metrics-port", "0"],
        env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=600,
        check=False)
    assert done.returncode == 0, done.stderr
    return done


def test_once_on_an_idle_store_takes_no_lease_and_the_status_reads_as_normal(
        tmp_path: Path, mongo_uri: str, db: Any) -> None:
    """Issue 44, item 4: ``aggbox dispatch --once`` on an idle, empty store — a cron job's
    usual run — logged ``ERROR … heartbeat lapsed … 256 partition(s) dropped`` on a busy
    machine, and ``dispatch-status`` then said ``NOT fair … unowned: 256``. With nothing to
    publish it claims nothing (no lease round, no heartbeat to lapse), and the status says
    that no dispatcher runs and when the last --once ran; after a --once that had work,
    the same, with what it published."""
    done = _once(tmp_path, mongo_uri, db)
    assert " ERROR " not in done.stderr and "lapsed" not in done.stderr, done.stderr
    assert db.aggbox_dispatcher_partitions.count_documents({}) == 0  # nothing claimed
    out = _status(tmp_path, mongo_uri, db)
    header = out.splitlines()[0]
    assert "no dispatcher running; last --once at " in header, out
    assert "NOT fair" not in out, out
    from aggbox.examples.orders import registry
    from aggregates import AggboxSettings, Message, Source, StoreWriter

    w = StoreWriter(db, registry, settings=AggboxSettings(database=db.name))
    w.ensure_indexes()
    w.process([Message("place-o1", "PlaceOrder", "Order", "o-1",
                       {"customer_id": "c-1", "amount": 10}, source=Source("Checkout", "o-1", 1))])
    _once(tmp_path, mongo_uri, db)
    status = json.loads(_status(tmp_path, mongo_uri, db, "--json"))
    orders = status["items"][0]
    assert orders["running"] is False and orders["last_once"]["published"] == 1, status
    assert "NOT fair" not in _status(tmp_path, mongo_uri, db)
