"""``aggbox run`` against FerretDB 1.24.2, a MongoDB-wire server without TTL indexes: one line
naming what the server lacks (not "check that the server is reachable": it was reached),
exit status 1, nothing applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from aggbox.cli import main
from aggbox.servers.ferretdb import LocalFerretDB
from tests.spark.helpers import make_records, write_jsonl

pytestmark = [pytest.mark.spark]


def test_run_on_ferretdb_names_the_missing_ttl_indexes(
        spark_session: Any, ferretdb_server: LocalFerretDB, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "in.jsonl", make_records(seed=32, accounts=2, ledgers=1,
                                                    dup_rate=0))
    database = "t_run_ferretdb"
    rc = main(["run", "--input", str(tmp_path / "in.jsonl"), "--aggregates",
               "tests.spark.domain", "--mongodb-uri", ferretdb_server.uri, "--database",
               database, "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 1, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0] == (
        "aggbox: error: the server does not support TTL indexes (expireAfterSeconds; code "
        "238): aggbox needs one on accounts_inbox_archive to forget the ids of Inbox dedup "
        "after the dedup horizon; use MongoDB (types with HighWater dedup need no archive), "
        "and run `aggbox check-store` to see what else this server lacks")
    assert "reachable" not in err
    client: MongoClient[dict[str, Any]] = MongoClient(ferretdb_server.uri)
    try:
        assert client[database]["accounts"].count_documents({}) == 0  # nothing applied
    finally:
        client.drop_database(database)
        client.close()
