"""The persistent local server (``aggbox local start``: mongo-java-server + H2) under an aging
store (issue 22): its oplog is bounded, a change stream resumed past the bound is told that
history was lost (code 286) instead of silently skipping, and a small soak — the dispatcher in
stream mode through writes and server restarts — keeps every document and every outbox entry,
with no storage error in the server's log. Each test has its own ``AGGBOX_HOME``.

About 1 min in all (JVM starts, the dispatcher subprocess).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from aggbox.servers import persistent

pytestmark = [pytest.mark.mongo]

ROOT = Path(__file__).resolve().parents[2]
Doc = dict[str, Any]


def _load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("aggbox_bench_soak", ROOT / "bench" / "soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _oplog_stats(client: MongoClient[Doc]) -> Doc:
    stats: Doc = client.admin.command("aggboxOplogStats")
    return stats


def _wait_trimmed(client: MongoClient[Doc], at_most: int, timeout: float = 20.0) -> Doc:
    deadline = time.monotonic() + timeout
    while True:
        stats = _oplog_stats(client)
        if stats["entries"] <= at_most or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def test_oplog_is_bounded_and_a_trimmed_resume_is_history_lost(
        local_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(persistent.OPLOG_MAX_ENTRIES_ENV, "40")
    monkeypatch.setenv(persistent.OPLOG_TRIM_INTERVAL_ENV, "1")
    state, started = persistent.start_persistent_mongodb()
    assert started
    client: MongoClient[Doc] = MongoClient(state.uri)
    try:
        coll = client.t.items
        local_time = client.admin.command("isMaster")["localTime"]
        start = Timestamp(int(local_time.timestamp()), 0)
        coll.insert_one({"_id": 0, "n": 0})
        coll.update_one({"_id": 0}, {"$set": {"n": 1, "outbox": [{"id": "e1"}]}})
        with coll.watch(full_document="updateLookup", start_at_operation_time=start) as stream:
            first = stream.try_next()
            second = stream.try_next()
        assert first is not None and first["operationType"] == "insert"
        assert second is not None and second["operationType"] == "update"
        # the update's full document is looked up (through the _id index)
        assert second["fullDocument"] == {"_id": 0, "n": 1, "outbox": [{"id": "e1"}]}
        token = first["_id"]

        # within the window: resuming returns what followed the token
        with coll.watch(full_document="updateLookup", resume_after=token) as stream:
            again = stream.try_next()
        assert again is not None and again["_id"] == second["_id"]

        # an open stream that falls behind the bound: its next read is history-lost
        lagging = coll.watch(resume_after=second["_id"])
        coll.insert_many([{"_id": i} for i in range(1, 101)])
        stats = _wait_trimmed(client, 40)
        assert stats["entries"] <= 40
        assert stats["trimmedThrough"] > second["clusterTime"]
        with pytest.raises(OperationFailure) as lost_read:
            lagging.try_next()
        assert lost_read.value.code == 286
        lagging.close()

        # resuming from before the kept window: history-lost, not a silent gap
        with pytest.raises(OperationFailure) as lost, coll.watch(resume_after=token) as stream:
            stream.try_next()
        assert lost.value.code == 286
        with (pytest.raises(OperationFailure) as lost_start,
              coll.watch(start_at_operation_time=start) as stream):
            stream.try_next()
        assert lost_start.value.code == 286

        # a stream that starts right after the trimmed point is not history-lost
        trimmed = _oplog_stats(client)["trimmedThrough"]
        after_trim = Timestamp(trimmed.time, trimmed.inc + 1)
        with coll.watch(start_at_operation_time=after_trim) as stream:
            coll.insert_one({"_id": "new"})
            event = None
            for _ in range(50):
                event = stream.try_next()
                if event is not None and event["documentKey"] == {"_id": "new"}:
                    break
        assert event is not None and event["documentKey"] == {"_id": "new"}
        trimmed_through = trimmed
        assert _oplog_stats(client)["storageErrors"] == 0
    finally:
        client.close()

    # the bound and the data survive a restart
    persistent.stop_persistent_mongodb()
    state, started = persistent.start_persistent_mongodb()
    assert started
    client = MongoClient(state.uri)
    try:
        assert client.t.items.count_documents({}) == 102
        stats = _wait_trimmed(client, 40)  # one insert came after the last trim
        assert stats["trimmedThrough"] >= trimmed_through
        assert 0 < stats["entries"] <= 40
        with (pytest.raises(OperationFailure) as lost_after_restart,
              client.t.items.watch(resume_after=token) as stream):
            stream.try_next()
        assert lost_after_restart.value.code == 286
    finally:
        client.close()


def test_soak_keeps_every_document_and_entry_through_restarts(local_home: Path) -> None:
    soak = _load_soak()
    result = soak.run_soak(local_home, writes=3000, cycles=2, docs=300, batch=250,
                           probe_rate=100.0, probe_seconds=2.0, drain_timeout=120.0,
                           echo=True)
    assert result.restarts == 2
    assert [c["at"] for c in result.checks] == ["restart 1", "restart 2", "end"]
    for check in result.checks:
        assert check["intact"], check
        assert check["entries_missing"] == 0 and check["documents_wrong"] == 0, check
    assert result.checks[-1]["entries_expected"] == result.writes
    assert result.checks[-1]["entries_pending"] == 0
    assert result.intact
    assert result.storage_errors == 0
