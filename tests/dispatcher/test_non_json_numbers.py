"""The dispatcher never publishes a value JSON cannot hold: an outbox entry whose payload has a
float NaN or infinity (BSON stores them; the fold refuses such emits, so only a document
written by hand or by an older aggbox holds one) is dead-lettered ``invalid_outbox_entry``
naming the field, and the rest of the outbox is published as strict JSON."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from aggregates import AggboxSettings, StoreWriter
from aggregates.core.jsonnumbers import loads
from aggregates.ops import DeadLetterStore
from dispatcher.core.settings import DispatcherSettings
from dispatcher.daemon import Dispatcher
from dispatcher.publishers.builder import build_record
from dispatcher.publishers.record import InvalidEntry, envelope_json
from tests.dispatcher.helpers import emit, pending_entries

pytestmark = [pytest.mark.mongo]

#: entry id → (payload, the field the dead letter names, the number's name)
BAD: dict[str, tuple[dict[str, Any], str, str]] = {
    "nan-1": ({"credit_limit": 5, "extra": float("nan")}, "payload.extra", "NaN"),
    "inf-1": ({"l": [1, {"y": float("inf")}]}, "payload.l[1].y", "Infinity"),
    "minf-1": ({"z": float("-inf")}, "payload.z", "-Infinity"),
}


def _entry(entry_id: str, payload: dict[str, Any], seq: int) -> dict[str, Any]:
    return {"id": entry_id, "type": "Tick", "payload": payload,
            "source": {"type": "Emitter", "id": "a000", "seq": seq}}


def test_build_record_refuses_nan_and_infinity_naming_the_field() -> None:
    for entry_id, (payload, field, name) in BAD.items():
        with pytest.raises(InvalidEntry) as info:
            build_record(_entry(entry_id, payload, 9), collection="emitters",
                         document_id="a000", source_type="Emitter", topic_template="t")
        assert f"'{field}': {name}" in str(info.value), str(info.value)
    with pytest.raises(ValueError):  # the encoder is the last guard
        envelope_json({"payload": {"x": float("nan")}})


def test_entries_holding_nan_are_dead_lettered_not_published(
        writer: StoreWriter, ddb: Database[Any], store: AggboxSettings, tmp_path: Path) -> None:
    emitted = emit(writer, ["a000"], n=2)["a000"]
    ddb.emitters.update_one({"_id": "a000"}, {"$push": {"outbox": {"$each": [
        _entry(entry_id, payload, 90 + i) for i, (entry_id, (payload, _, _))
        in enumerate(BAD.items())]}}})
    out = tmp_path / "out"
    settings = DispatcherSettings.load(collections=["emitters"], metrics_port=0,
                                       jsonl_dir=str(out), lease_ttl_s=3)
    assert asyncio.run(Dispatcher(settings, store=store).run(once=True)) == 0
    lines = [line for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]
    published = [loads(line)["message_id"] for line in lines]  # strict JSON, every line
    assert published == emitted
    assert all("NaN" not in line and "Infinity" not in line for line in lines)
    assert pending_entries(ddb) == 0
    letters = [dl for dl in DeadLetterStore(ddb, collection=store.dead_letter_collection).list()
               if dl["reason"] == "invalid_outbox_entry"]
    assert len(letters) == len(BAD)
    for entry_id, (_, field, name) in BAD.items():
        letter = next(dl for dl in letters if entry_id in json.dumps(dl["raw"], default=str))
        assert f"'{field}': {name}" in letter["error"], letter["error"]
