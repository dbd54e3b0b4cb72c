"""The issue "days" reproduction, as a benchmark: does the dispatcher keep up on a local
server that has aged?

1. ``aggbox local start`` in a temporary ``AGGBOX_HOME`` (mongo-java-server with H2);
2. age it: 256 documents and ``--rounds`` (700) ``update_many({}, {$inc: {n: 1}})``
   rounds — about 30 minutes of the lease renewals of the former lease scheme (one update
   per partition held per round) — 179,200 oplog entries written;
3. apply ``--orders`` (50) ``PlaceOrder`` messages of the example domain
   (``aggbox.examples.orders``) with the StoreWriter: each leaves one outbox entry;
4. start ``aggbox dispatch`` (stream mode, JSON Lines publisher, a subprocess) and time how
   long until every entry is published and pulled (``--timeout``, 120 s);
5. leave it idle ``--idle`` (40) seconds and count the oplog entries it adds.

Printed: oplog size after aging and at dispatch start, seconds to publish all entries, oplog
entries an idle dispatcher adds (and per renewal round), and the dispatcher's WARNING/ERROR
lines. Before the issue: 0 of 50 published in 60 s; an idle dispatcher added 3,853 oplog
entries in 40 s. Nothing is asserted: figures go to bench/RESULTS.md.

Usage: python bench/aging.py [--rounds 700] [--orders 50] [--idle 40] [--timeout 120]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pymongo import MongoClient
from pymongo.errors import OperationFailure

ROOT = Path(__file__).resolve().parents[1]


def aggbox(*args: str, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run([sys.executable, "-m", "aggbox.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=True)
    return done.stdout


def oplog_entries(client: MongoClient[Any]) -> int:
    """The local server's oplog size: its launcher's ``aggboxOplogStats`` command (the H2
    backend does not expose ``local.oplog.rs`` to queries), else the collection."""
    try:
        return int(client.admin.command("aggboxOplogStats")["entries"])
    except OperationFailure:
        return int(client.local["oplog.rs"].count_documents({}))


def pending(db: Any) -> int:
    return sum(len(d.get("outbox") or []) for coll in ("orders", "customers")
               for d in db[coll].find({"outbox.0": {"$exists": True}}, {"outbox": 1}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=700)
    ap.add_argument("--orders", type=int, default=50)
    ap.add_argument("--idle", type=float, default=40.0)
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args()

    from aggbox.examples.orders import registry
    from aggregates import AggboxSettings, Message, StoreWriter
    from aggregates.message.envelope import Source

    home = Path(tempfile.mkdtemp(prefix="aggbox-aging-"))
    env = {**os.environ, "AGGBOX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("AGGBOX_MONGODB_URI", None)
    aggbox("local", "start", env=env)
    figures: dict[str, Any] = {"rounds": args.rounds, "orders": args.orders}
    dispatcher: subprocess.Popen[bytes] | None = None
    try:
        state = json.loads((home / "local-mongodb.json").read_text())
        uri = state["uri"]
        client: MongoClient[Any] = MongoClient(uri, tz_aware=True)
        db = client["aging"]
        db.scratch.insert_many([{"_id": i, "n": 0} for i in range(256)])
        started = time.monotonic()
        for _ in range(args.rounds):
            db.scratch.update_many({}, {"$inc": {"n": 1}})
        figures["aging_s"] = round(time.monotonic() - started, 1)
        figures["oplog_after_aging"] = oplog_entries(client)

        settings = AggboxSettings.load(mongodb_uri=uri, database="aging")
        writer = StoreWriter(db, registry, settings=settings)
        writer.ensure_indexes()
        msgs = [Message(message_id=f"place-{i}", type="PlaceOrder", aggregate_type="Order",
                        aggregate_id=f"o-{i}",
                        payload={"customer_id": f"c-{i % 5}", "amount": 10},
                        # the checkout numbers its messages per order (high-water dedup)
                        source=Source(type="Checkout", id=f"o-{i}", seq=1))
                for i in range(args.orders)]
        outcomes = writer.process(msgs)
        figures["applied"] = sum(o.outcome == "applied" for o in outcomes)
        figures["pending_before"] = pending(db)
        figures["oplog_at_dispatch_start"] = oplog_entries(client)

        out = home / "published"
        log = home / "dispatcher.log"
        denv = {**env, "AGGBOX_MONGODB_URI": uri, "AGGBOX_DATABASE": "aging"}
        dispatcher = subprocess.Popen(
            [sys.executable, "-m", "aggbox.commands.dispatch", "--aggregates",
             "aggbox.examples.orders", "--publisher", "jsonl", "--jsonl-dir", str(out),
             "--mode", "stream", "--metrics-port", "0"],
            cwd=ROOT, env=denv, stdout=log.open("wb"),
            stderr=subprocess.STDOUT)
        started = time.monotonic()
        left = figures["pending_before"]
        while left and time.monotonic() - started < args.timeout:
            time.sleep(0.25)
            left = pending(db)
        figures["publish_all_s"] = (round(time.monotonic() - started, 2) if not left
                                    else None)
        figures["left_unpublished"] = left
        time.sleep(2.0)  # the last pulls and checkpoints
        before = oplog_entries(client)
        time.sleep(args.idle)
        grown = oplog_entries(client) - before
        figures["idle_s"] = args.idle
        figures["idle_oplog_entries"] = grown
        # two collections, one heartbeat each per round of lease_ttl_s / 3 = 10/3 s
        rounds = 2 * args.idle / (10 / 3)
        figures["idle_oplog_per_round"] = round(grown / rounds, 2)
        dispatcher.send_signal(signal.SIGTERM)
        dispatcher.wait(60)
        figures["dispatcher_exit"] = dispatcher.returncode
        dispatcher = None
        lines = [x for x in log.read_text(errors="replace").splitlines()
                 if " WARNING " in x or " ERROR " in x]
        figures["warnings_and_errors"] = len(lines)
        for line in lines[:10]:
            print("  " + line[:200])
        client.close()
    finally:
        if dispatcher is not None:
            dispatcher.kill()
        aggbox("local", "stop", "--delete-data", env=env)
    for k, v in figures.items():
        print(f"{k:>26}: {v}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
