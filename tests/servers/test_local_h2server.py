"""The persistent local server's Java launcher (aggbox/servers/java/h2server/, docs/design.md
"The local server"): its folder compiles as one unit, and its stats command reports the
bounds it was started with, the oplog's extent, the data file and the storage errors.

The oplog window itself (bounded, history-lost 286, across a restart) is held by
tests/servers/test_local_soak.py; the chunk registration by bench/h2_chunks.py (minutes of
load: too long for the suite) and the soak's zero storage errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bson import Timestamp
from pymongo import MongoClient

from aggbox.servers import maven, persistent

pytestmark = [pytest.mark.mongo]

Doc = dict[str, Any]

#: The launcher's sources, one concern each.
SOURCES = ["AggboxH2Database.java", "AggboxMongoH2Server.java", "BoundedOplog.java",
           "ChangeEvents.java", "ServerStats.java", "StorageErrors.java",
           "VersionGuardedH2Backend.java"]


def test_the_launcher_folder_compiles_as_one_unit() -> None:
    assert list(maven.java_sources(persistent._SOURCES)) == SOURCES
    classes = maven.compile_java(persistent._SOURCES, maven.resolve_classpath(persistent._POM))
    assert {p.stem for p in classes.glob("*.class")} >= {s.removesuffix(".java")
                                                          for s in SOURCES}


def test_stats_report_the_bounds_the_oplog_and_the_file(
        local_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(persistent.OPLOG_MAX_ENTRIES_ENV, "1000")
    monkeypatch.setenv(persistent.OPLOG_MAX_HOURS_ENV, "2")
    state, started = persistent.start_persistent_mongodb()
    assert started
    client: MongoClient[Doc] = MongoClient(state.uri)
    try:
        client.t.items.insert_many([{"_id": i} for i in range(10)])
        stats: Doc = client.some_db.command("aggboxOplogStats")  # any database answers
    finally:
        client.close()
    assert (stats["maxEntries"], stats["maxAgeSeconds"]) == (1000, 7200)
    assert stats["entries"] >= 10 and stats["trimmedSinceStart"] == 0
    assert isinstance(stats["firstTs"], Timestamp) and stats["firstTs"] < stats["lastTs"]
    assert stats["trimmedThrough"] == Timestamp(0, 0)
    assert stats["fileBytes"] > 0 and 0 <= stats["fillRate"] <= 100
    assert stats["storageErrors"] == 0 and stats["ok"] == 1.0
