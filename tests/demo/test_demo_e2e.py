"""``aggbox demo`` end to end through the command line: Spark (the test session's), the local
MongoDB, the dispatcher — small sizes. Exit code 0 and a PASS per check; exit code 1 when a
check fails (here: too few rounds for the cascade to settle)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from pymongo import MongoClient

from aggbox.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.mongo]

SMALL = ["--customers", "6", "--orders", "40", "--seed", "5", "--files", "3"]


def _rows(out: str, verdict: str) -> list[str]:
    return [line for line in out.splitlines() if re.search(rf"│\s+{verdict}\s+│", line)]


def test_the_demo_passes(spark_session: Any, mongo_client: MongoClient[dict[str, Any]],
                         capsys: pytest.CaptureFixture[str]) -> None:
    database = f"t_demo_e2e_{uuid.uuid4().hex[:8]}"
    rc = main(["demo", *SMALL, "--database", database])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PASS: all 13 checks passed" in out
    assert len(_rows(out, "PASS")) == 13 and not _rows(out, "FAIL"), out
    for name in ("Every order status = oracle", "Every customer's reserved credit = oracle",
                 "Invariant 1", "Invariant 2", "Invariant 3", "Invariant 4", "Invariant 5",
                 "Invariant 6", "Dead letters = oracle", "Pending timers = oracle",
                 "Nothing pending"):
        assert name in out
    # 6 registrations + 40 orders, 20% copies, 4 bad rows; then 40 OrderCreated, 40 replies.
    round_1 = r"│\s+1 │ generated, 3 files\s+│\s+59 │\s+46 │\s+9 │\s+4 │\s+0 │\s+40 │"
    assert re.search(round_1, out), out
    assert database not in mongo_client.list_database_names()  # dropped at the end


def test_a_failing_check_exits_1(spark_session: Any, capsys: pytest.CaptureFixture[str]
                                 ) -> None:
    rc = main(["demo", *SMALL, "--max-rounds", "1"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "FAIL:" in out
    failed = "\n".join(_rows(out, "FAIL"))
    assert "Nothing pending" in failed and "Every order status" in failed
