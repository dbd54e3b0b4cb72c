"""End to end through ``aggbox run`` and ``aggbox dispatch`` with a feedback loop: the
dispatcher's output is the next round's input. Bank transfers on accounts with an inbox
window of 3: every payee receives many credits from many payers, with duplicates, whole
reruns of each round's input and replays of earlier rounds. Money must be conserved and
every transfer debited and credited exactly once (issue: inbox dedup refused credits it
had never applied)."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from aggbox.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

AGG = "tests.spark.bank"
ACCOUNTS = 8
INITIAL = 1000


def _env(mid: str, mtype: str, agg: str, payload: dict[str, Any], at: datetime) -> str:
    return json.dumps({"message_id": mid, "type": mtype, "aggregate_type": "BankAccount",
                       "aggregate_id": agg, "payload": payload,
                       "occurred_at": at.isoformat()})


def _run(db: Any, uri: str, patterns: list[str], capsys: pytest.CaptureFixture[str]
         ) -> dict[str, Any]:
    rc = main(["run", "--input", *patterns, "--aggregates", AGG, "--mongodb-uri", uri,
               "--database", db.name, "--no-progress", "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


def _dispatch(db: Any, uri: str, directory: Path) -> None:
    rc = main(["dispatch", "--once", "--publisher", "jsonl", "--jsonl-dir", str(directory),
               "--collection", "bank_accounts", "--aggregates", AGG, "--mongodb-uri", uri,
               "--database", db.name])
    assert rc == 0


def test_transfers_fed_back_through_the_dispatcher_conserve_money(
        spark_session: Any, db: Any, mongo_uri: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(8)
    now = datetime.now(UTC)
    names = [f"acct/{i}.x$" for i in range(ACCOUNTS)]  # ids with '/', '.' and '$'
    lines = [_env(f"open-{i}", "Opened", n, {"initial": INITIAL}, now - timedelta(hours=2))
             for i, n in enumerate(names)]
    transfers: list[tuple[str, str, int]] = []
    for t in range(160):
        payer, payee = rng.sample(names, 2)
        amount = rng.randint(1, 50)
        transfers.append((payer, payee, amount))
        # Disordered producer clocks: anywhere in the last hour.
        at = now - timedelta(seconds=rng.randint(0, 3600))
        lines.append(_env(f"t-{t}", "TransferRequested", payer,
                          {"amount": amount, "payee": payee}, at))
    lines += rng.sample(lines, 40)  # duplicates inside the input
    rng.shuffle(lines)
    round0 = tmp_path / "round0"
    round0.mkdir()
    (round0 / "in.jsonl").write_text("\n".join(lines) + "\n")

    first = _run(db, mongo_uri, [str(round0 / "*.jsonl")], capsys)
    assert first["applied"] == ACCOUNTS + len(transfers) and first["dead_lettered"] == 0
    again = _run(db, mongo_uri, [str(round0 / "*.jsonl")], capsys)  # a whole rerun
    assert again["applied"] == 0 and again["dead_lettered"] == 0

    out1 = tmp_path / "out1"
    _dispatch(db, mongo_uri, out1)
    credits = [json.loads(x) for f in sorted(out1.glob("*.jsonl"))
               for x in f.read_text().splitlines() if x]
    assert Counter(c["type"] for c in credits) == {"CreditRequested": len(transfers)}
    # Every payee receives several credits from several payers: far beyond its window.
    per_payee = Counter(c["aggregate_id"] for c in credits)
    assert max(per_payee.values()) > 3 * 3

    # Round 1: the credits, then the credits again together with a replay of round 0.
    r1 = _run(db, mongo_uri, [str(out1 / "*.jsonl")], capsys)
    assert r1["applied"] == len(transfers) and r1["dead_lettered"] == 0
    replay = _run(db, mongo_uri, [str(out1 / "*.jsonl"), str(round0 / "*.jsonl")], capsys)
    assert replay["applied"] == 0 and replay["dead_lettered"] == 0
    assert replay["duplicate"] == replay["input"]

    out2 = tmp_path / "out2"
    _dispatch(db, mongo_uri, out2)
    assert not list(out2.glob("*.jsonl"))  # credits emit nothing; nothing pending

    balances = {d["_id"]: d["state"] for d in db.bank_accounts.find()}
    assert sum(s["balance"] for s in balances.values()) == ACCOUNTS * INITIAL
    expected = dict.fromkeys(names, INITIAL)
    for payer, payee, amount in transfers:
        expected[payer] -= amount
        expected[payee] += amount
    assert {k: s["balance"] for k, s in balances.items()} == expected
    assert sum(s["credits"] for s in balances.values()) == len(transfers)
    assert db.aggbox_dead_letters.count_documents({}) == 0
    # The inbox stayed small; the archive remembers the rest.
    assert max(len(d["inbox"]) for d in db.bank_accounts.find()) <= 3 + 200
    assert db.bank_accounts_inbox_archive.count_documents({}) > 0
