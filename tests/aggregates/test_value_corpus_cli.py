"""Issue 40 item 1 where a user meets it, through ``aggbox`` processes: a handler whose emit
holds ``numpy.float64('nan')`` (a float subclass: the old check tested ``type(x) is
float``) was applied, its state change committed, and the dispatcher then dead-lettered the
entry ``invalid_outbox_entry`` — the emit lost after its state change. Now the fold refuses
it where the handler returns it: the message is dead-lettered ``invalid_emit`` naming the
field, nothing is stored, nothing is left for the dispatcher."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aggregates import AggboxSettings, AggregateType, Registry, StoreWriter
from aggregates.core.reasons import Reason
from aggregates.testing import message

pytestmark = pytest.mark.mongo

AGGBOX = str(Path(sys.executable).with_name("aggbox"))
ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "tests.aggregates.corpusdomain"


def _aggbox(tmp_path: Path, mongo_uri: str, db: Any,
            *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AGGBOX_")}
    env.update(AGGBOX_HOME=str(tmp_path / "home"), AGGBOX_LOG_FILE=str(tmp_path / "trace.log"),
               AGGBOX_MONGODB_URI=mongo_uri, AGGBOX_DATABASE=db.name, PYTHONPATH=str(ROOT),
               COLUMNS="250")
    if "AGGBOX_CACHE_DIR" in os.environ:
        env["AGGBOX_CACHE_DIR"] = os.environ["AGGBOX_CACHE_DIR"]
    return subprocess.run([AGGBOX, *argv], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, check=False)


def test_a_numpy_nan_emit_is_refused_where_it_enters_not_lost_later(
        tmp_path: Path, mongo_uri: str, db: Any) -> None:
    # The message waits as a dead letter (its handler was not deployed yet) …
    blank = AggregateType("Probe", state=dict, collection="probes")
    w = StoreWriter(db, Registry([blank]), settings=AggboxSettings(database=db.name))
    w.ensure_indexes()
    (o,) = w.process([message("DictEmit", {"name": "numpy.float64 nan"}, to="Probe",
                              id="p-1", message_id="m-1")])
    assert o.reason == Reason.UNKNOWN_MESSAGE_TYPE
    # … and is replayed with the handler, which emits numpy.float64('nan').
    replay = _aggbox(tmp_path, mongo_uri, db, "deadletters", "replay", "--all",
                     "--aggregates", DOMAIN)
    assert "invalid_emit" in replay.stdout + replay.stderr, replay
    letters = list(db.aggbox_dead_letters.find({"reason": Reason.INVALID_EMIT}))
    assert len(letters) == 1 and "emit[0].payload.v: NaN is not JSON" in letters[0]["error"]
    doc = db.probes.find_one({"_id": "p-1"})
    assert doc is None or (not doc.get("outbox") and not doc.get("state")), doc
    # Nothing is left for the dispatcher to lose.
    done = _aggbox(tmp_path, mongo_uri, db, "dispatch", "--once", "--aggregates", DOMAIN,
                   "--publisher", "stdout", "--metrics-port", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", done  # stdout carries the records: none
    assert "published 0, timers fired 0, effects done 0, dead-lettered 0" in done.stderr
    assert db.aggbox_dead_letters.count_documents(
        {"reason": Reason.INVALID_OUTBOX_ENTRY}) == 0
