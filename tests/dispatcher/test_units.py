"""Pure pieces of the dispatcher: records, the in-flight set, publishers without a broker,
fault rules, settings, backoff, the command line."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from aggregates import ConfigurationError, Message
from dispatcher.cli import _OPTIONS, _overrides, register
from dispatcher.faults import Faults
from dispatcher.inflight import InFlight
from dispatcher.publishers.jsonl import JsonLinesPublisher
from dispatcher.publishers.kafka import classify, valid_topic_name
from dispatcher.publishers.stdout import StdoutPublisher
from dispatcher.record import (
    HEADER_NAMES,
    InvalidEntry,
    build_record,
    check_template,
    envelope_json,
)
from dispatcher.settings import DispatcherSettings
from dispatcher.worker import Backoff

NOW = datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)


def entry(i: int = 1, **over: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "id": f"e-{i}", "type": "Tick", "topic": None, "key": "agg-1",
        "payload": {"i": i, "when": NOW}, "headers": {"tenant": "t1"},
        "causation_id": "in-1", "correlation_id": "corr-1",
        "source": {"type": "Emitter", "id": "agg-1", "seq": i}, "created_at": NOW,
    }
    e.update(over)
    return e


def record(e: dict[str, Any], template: str = "{aggregate_type}.events") -> Any:
    return build_record(e, collection="emitters", document_id="agg-1", source_type="Emitter",
                        topic_template=template)


def test_record_is_a_valid_input_envelope_with_headers_key_and_topic() -> None:
    r = record(entry(3))
    env = json.loads(r.value)
    m = Message.from_dict(env)
    assert (m.message_id, m.type, m.aggregate_type, m.aggregate_id) == (
        "e-3", "Tick", "Emitter", "agg-1")
    assert m.occurred_at == NOW and m.source is not None and m.source.seq == 3
    assert (m.causation_id, m.correlation_id, m.headers) == ("in-1", "corr-1", {"tenant": "t1"})
    assert env["payload"]["when"] == NOW.isoformat()  # BSON dates become ISO strings
    assert r.topic == "Emitter.events" and r.key == "agg-1"
    assert set(HEADER_NAMES) <= set(r.headers)
    assert r.headers["source_seq"] == "3" and r.headers["message_id"] == "e-3"
    assert r.headers["tenant"] == "t1"


def test_record_addressed_to_another_aggregate_uses_the_target() -> None:
    r = record(entry(1, target={"type": "Order", "id": "o-9"}, topic="explicit"),
               template="{target_type}.in")
    m = Message.from_dict(json.loads(r.value))
    assert (m.aggregate_type, m.aggregate_id) == ("Order", "o-9")
    assert m.source is not None and (m.source.type, m.source.id) == ("Emitter", "agg-1")
    assert r.topic == "explicit"  # the entry's own topic wins over the template
    r2 = record(entry(1, target={"type": "Order", "id": "o-9"}), template="{target_type}.in")
    assert r2.topic == "Order.in" and r2.key == "agg-1"  # keyed by the emitting aggregate


@pytest.mark.parametrize("over", [
    {},
    {"target": {"type": "Order", "id": "o-1"}, "headers": {}},
    {"correlation_id": None, "causation_id": None, "headers": None},
    {"created_at": datetime(2026, 3, 1, 12, 0, 0, 123456)},  # naive = UTC, µs → ms
    {"source": {"type": "Emitter", "id": "agg-1", "seq": 7.0}},  # unusual: validated path
])
def test_fast_envelope_equals_the_validated_one(over: dict[str, Any]) -> None:
    from dispatcher.record import _fast_envelope, _slow_envelope

    e = entry(2, **over)
    target = e.get("target") or {"type": "Emitter", "id": "agg-1"}
    args = (e, "e-2", target["type"], target["id"], e.get("source"))
    slow = _slow_envelope(*args)
    fast = _fast_envelope(*args)
    assert fast is None or fast == slow
    assert json.loads(record(e).value) == json.loads(envelope_json(slow))
    assert record(e).message == Message.from_dict(slow)


def test_invalid_entries_and_templates_are_named() -> None:
    with pytest.raises(InvalidEntry, match=r"e-1.*type"):
        record(entry(1, type=None))
    with pytest.raises(InvalidEntry, match="no id"):
        record(entry(1, id=None))
    check_template("{aggregate_type}.{type}.{collection}.{target_type}")
    with pytest.raises(ConfigurationError, match=r"unknown placeholder \{agg\}"):
        check_template("{agg}.events")


def test_inflight_claims_once_remembers_done_and_serialises_documents() -> None:
    f = InFlight(done_capacity=1000)
    c = f.claim("d1", [entry(1), entry(2)])
    assert [e["id"] for e in c.fresh] == ["e-1", "e-2"]
    # Seen again while in flight (sweep + stream): nothing, and the document is dirty.
    assert f.claim("d1", [entry(1), entry(2), entry(3)]).fresh == []
    assert f.take_dirty() == []  # still busy
    f.finish("d1", ["e-1"], ["e-2"])
    assert f.take_dirty() == ["d1"]
    c = f.claim("d1", [entry(1), entry(2), entry(3), {"no": "id"}])
    assert [e["id"] for e in c.fresh] == ["e-2", "e-3"]
    assert c.stale == ["e-1"] and c.malformed == 1
    f.finish("d1", ["e-2", "e-3"], [])
    assert len(f) == 0 and f.is_done("e-3")


def test_done_cache_is_bounded() -> None:
    f = InFlight(done_capacity=1000)
    for i in range(1500):
        f.claim(i, [entry(i)])
        f.finish(i, [f"e-{i}"], [])
    assert not f.is_done("e-0") and f.is_done("e-1499")


def test_kafka_error_classification_and_topic_names() -> None:
    assert classify(10, "too large").status == "permanent"
    assert classify(10, "too large").reason == "message_too_large"
    assert classify(17, "bad topic").reason == "invalid_topic"
    assert classify(-192, "timed out").status == "retryable"
    assert classify(-195, "transport").status == "retryable"
    assert valid_topic_name("Emitter.events") and valid_topic_name("a_b-c.1")
    for bad in ("", ".", "..", "has space", "x" * 250, "ümlaut"):
        assert not valid_topic_name(bad)


def test_jsonl_publisher_writes_whole_files_atomically(tmp_path: Path) -> None:
    out = tmp_path / "out"
    pub = JsonLinesPublisher(out)
    records = [record(entry(i)) for i in range(1, 4)]

    async def go() -> None:
        await pub.start()
        assert [r.status for r in await pub.publish(records)] == ["ok"] * 3
        assert await pub.publish([]) == []
        await pub.close()

    asyncio.run(go())
    files = list(out.iterdir())
    assert len(files) == 1 and files[0].suffix == ".jsonl"
    assert not files[0].name.startswith(".")  # temp files are hidden, finals are not
    lines = files[0].read_text().splitlines()
    assert [Message.from_dict(json.loads(x)).message_id for x in lines] == ["e-1", "e-2", "e-3"]


def test_jsonl_io_errors_are_retryable(tmp_path: Path) -> None:
    target = tmp_path / "ro"
    pub = JsonLinesPublisher(target)

    async def go() -> list[str]:
        await pub.start()
        os.chmod(target, 0o500)
        try:
            return [r.status for r in await pub.publish([record(entry(1))])]
        finally:
            os.chmod(target, 0o700)

    if os.geteuid() == 0:  # root ignores permissions: use a path that is a file instead
        pub.directory = tmp_path / "file"
        pub.directory.write_text("")

        async def go_root() -> list[str]:
            return [r.status for r in await pub.publish([record(entry(1))])]

        assert asyncio.run(go_root()) == ["retryable"]
    else:
        assert asyncio.run(go()) == ["retryable"]
    assert not list(tmp_path.glob("**/.tmp-*"))


def test_stdout_publisher_prints_topic_key_headers_and_envelope() -> None:
    buf = io.StringIO()
    res = asyncio.run(StdoutPublisher(buf).publish([record(entry(1))]))
    assert res[0].status == "ok"
    line = json.loads(buf.getvalue())
    assert line["topic"] == "Emitter.events" and line["key"] == "agg-1"
    assert line["value"]["message_id"] == "e-1" and line["headers"]["type"] == "Tick"


def test_fault_rules() -> None:
    f = Faults.parse("after_publish:exit@3, stream_open:history_lost")
    with pytest.raises(OperationFailure) as info:
        f.hit("stream_open")
    assert info.value.code == 286
    f.hit("stream_open")  # only the first time
    f.hit("after_publish")
    f.hit("after_publish")  # the 3rd would exit the process
    f.add("stream_read", "invalid_token")
    with pytest.raises(OperationFailure):
        f.hit("stream_read")
    for bad in ("nowhere:kill", "after_pull:explode", "after_pull:kill@x"):
        with pytest.raises(ConfigurationError, match="AGGBOX_DISPATCHER_FAULT"):
            Faults.parse(bad)


def test_settings_validation_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGBOX_DISPATCHER_COLLECTIONS", '["a", "b"]')
    monkeypatch.setenv("AGGBOX_DISPATCHER_LEASE_TTL_S", "4")
    s = DispatcherSettings.load()
    assert s.collections == ["a", "b"] and s.renew_interval_s == pytest.approx(4 / 3)
    with pytest.raises(ConfigurationError, match="backoff_max_ms"):
        DispatcherSettings.load(backoff_initial_ms=100, backoff_max_ms=10)
    with pytest.raises(ConfigurationError, match="lease_renew_s"):
        DispatcherSettings.load(lease_ttl_s=2, lease_renew_s=5)


def test_backoff_grows_with_jitter_and_never_spins() -> None:
    b = Backoff(0.2, 5.0)
    delays = [b.next() for _ in range(10)]
    assert all(d >= 0.1 for d in delays)  # never (near) zero
    assert delays[6] > delays[0] and max(delays) <= 5.0
    b.reset()
    assert b.next() <= 0.2


def test_cli_help_explains_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="aggbox")
    register(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit):
        parser.parse_args(["dispatch", "--help"])
    text = capsys.readouterr().out
    for flag, *_ in _OPTIONS:
        assert flag in text
    assert "--once" in text and "AGGBOX_DISPATCHER_PUBLISHER" in text and "/healthz" in text
    args = parser.parse_args(["dispatch", "--collection", "a", "--collection", "b",
                              "--publisher", "stdout", "--kafka-option", "linger.ms=1"])
    assert _overrides(args, "dispatcher") == {
        "collections": ["a", "b"], "publisher": "stdout", "kafka_config": {"linger.ms": "1"}}
