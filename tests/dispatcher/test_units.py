"""Pure pieces of the dispatcher: records, the in-flight set, publishers without a broker,
fault rules, settings, backoff, the command line."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from aggbox.commands.dispatch import _OPTIONS, _overrides, register
from aggregates import ConfigurationError, Message
from dispatcher.core.faults import Faults
from dispatcher.core.settings import DispatcherSettings
from dispatcher.core.timing import Timing
from dispatcher.outbox.inflight import InFlight
from dispatcher.outbox.retries import Retries
from dispatcher.publishers.builder import build_record
from dispatcher.publishers.jsonl import JsonLinesPublisher
from dispatcher.publishers.kafka import classify, valid_topic_name
from dispatcher.publishers.record import (
    HEADER_NAMES,
    InvalidEntry,
    check_template,
    envelope_json,
)
from dispatcher.publishers.stdout import StdoutPublisher

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
    assert (m.causation_id, m.correlation_id) == ("in-1", "corr-1")
    assert m.headers == {"tenant": "t1", "aggbox-kind": "event"}  # not addressed: an event
    # BSON dates become ISO strings, as the one rule gives them (aggregates/core/jsonvalue.py)
    assert env["payload"]["when"] == "2026-03-01T12:00:00.123000Z"
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
    from dispatcher.publishers.record import _fast_envelope, _slow_envelope

    e = entry(2, **over)
    target = e.get("target") or {"type": "Emitter", "id": "agg-1"}
    args = (e, "e-2", target["type"], target["id"], e.get("source"))
    slow = _slow_envelope(*args)
    fast = _fast_envelope(*args)
    assert fast is None or fast == slow
    if not e.get("target"):  # the emitter's own event says so (aggbox-kind: event)
        slow = {**slow, "headers": {**slow.get("headers", {}), "aggbox-kind": "event"}}
    assert json.loads(record(e).value) == json.loads(envelope_json(slow))
    assert record(e).message == Message.from_dict(slow)


def test_untargeted_entries_are_marked_as_events_of_the_emitter() -> None:
    event = record(entry(1))
    m = Message.from_dict(json.loads(event.value))
    # Still a valid envelope naming the emitter (keyed, ordered, deduplicated like the rest)…
    assert (m.aggregate_type, m.aggregate_id) == ("Emitter", "agg-1")
    # … but marked, in the envelope (JSON Lines readers) and the broker headers, as its event.
    assert m.headers == {"tenant": "t1", "aggbox-kind": "event"}
    assert event.headers["aggbox-kind"] == "event"
    addressed = record(entry(2, target={"type": "Order", "id": "o-1"}))
    m2 = Message.from_dict(json.loads(addressed.value))
    assert m2.headers == {"tenant": "t1"}  # input for the target: the envelope is unchanged
    assert addressed.headers["aggbox-kind"] == "input"
    # A handler's own header of that name cannot make an event look like input.
    forged = record(entry(3, headers={"aggbox-kind": "input"}))
    assert forged.headers["aggbox-kind"] == "event"
    assert json.loads(forged.value)["headers"]["aggbox-kind"] == "event"


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
    assert len(f) == 0 and f.claim("d2", [entry(3)]).stale == ["e-3"]  # done: stale


def test_done_cache_is_bounded() -> None:
    f = InFlight(done_capacity=1000)
    for i in range(1500):
        f.claim(i, [entry(i)])
        f.finish(i, [f"e-{i}"], [])
    assert [e["id"] for e in f.claim("x", [entry(0)]).fresh] == ["e-0"]  # forgotten
    assert f.claim("y", [entry(1499)]).stale == ["e-1499"]


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
        with pytest.raises(ConfigurationError, match="fault rules"):
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


def test_retries_schedule_the_backoff_on_the_injected_clock() -> None:
    now = [100.0]
    r = Retries(initial_s=0.2, max_s=1.0, timing=Timing(monotonic=lambda: now[0],
                                                           random=lambda: 0.5))
    assert r.wait_s() == 0
    assert [r.failed() for _ in range(4)] == [0.1, 0.2, 0.4, 0.5]  # full jitter, capped
    assert r.wait_s() == 0.5 and r.count == 4
    now[0] += 0.3
    assert r.wait_s() == pytest.approx(0.2)
    r.succeeded()
    assert r.failed() == 0.1
    r.keep(["b", "a"])
    r.keep(["a", "c"])
    assert r.pending and r.take() == ["b", "a", "c"] and not r.pending


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


def test_jsonl_publisher_removes_only_stale_temp_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    stale = out / ".tmp-aaaa.jsonl"
    stale.write_text('{"message_id": "x"}\n')
    os.utime(stale, (0, 0))
    fresh = out / ".tmp-bbbb.jsonl"
    fresh.write_text('{"message_id": "y"}\n')
    final = out / "20260301T000000000000Z-cccc.jsonl"
    final.write_text('{"message_id": "z"}\n')
    os.utime(final, (0, 0))
    pub = JsonLinesPublisher(out, stale_tmp_s=60)
    asyncio.run(pub.start())
    assert not stale.exists() and fresh.exists() and final.exists()
    assert pub.stale_removed == 1
    assert pub.remove_stale_temp_files() == 0


def test_librdkafka_lines_are_rate_limited_per_distinct_message() -> None:
    from dispatcher.publishers.kafka import RateLimitedLog

    now = [0.0]
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    target = logging.getLogger("test.rdkafka.ratelimit")
    target.setLevel(logging.DEBUG)
    target.propagate = False
    target.addHandler(Keep())
    rl = RateLimitedLog(target, interval_s=30, clock=lambda: now[0])
    for i in range(50):  # what librdkafka logs on every reconnect attempt
        now[0] = i * 0.5
        rl.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1",
               f"127.0.0.1:9092/bootstrap: Connect failed (after {i}ms in state CONNECT)")
    rl.log(logging.WARNING, "%s [%s] %s", "REQTMOUT", "rdkafka#producer-1", "timed out")
    assert [r.getMessage() for r in records] == [
        "librdkafka: FAIL [rdkafka#producer-1] 127.0.0.1:9092/bootstrap: Connect failed "
        "(after 0ms in state CONNECT)",
        "librdkafka: REQTMOUT [rdkafka#producer-1] timed out",
    ]
    now[0] = 40.0
    rl.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1",
           "127.0.0.1:9092/bootstrap: Connect failed (after 1ms in state CONNECT)")
    assert records[-1].getMessage().endswith("(49 more like it in the last 40s)")
    assert records[0].levelno == logging.ERROR


def test_health_needs_recent_server_contact(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from dispatcher.observe import metrics

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    h = metrics.Health(stale_after_s=60, unhealthy_after_s=30)
    h.beat("c", role="standby")
    h.contact("c")
    assert h.report()[0]
    now[0] += 31
    h.beat("c")  # the loop still turns, but every server call fails
    ok, report = h.report()
    assert not ok and report["collections"]["c"]["seconds_since_server_contact"] == 31
    h.contact("c")
    assert h.report()[0]


class _FakeStream:
    """Just enough of AsyncChangeStream for StreamFollower.read."""

    def __init__(self, events: list[dict[str, Any]], *, close_after: bool) -> None:
        self.events = events
        self.close_after = close_after
        self.resume_token: dict[str, Any] = {"_data": "start"}
        self.alive = True

    async def try_next(self) -> dict[str, Any] | None:
        if not self.events:
            if self.close_after:
                self.alive = False
            return None
        event = self.events.pop(0)
        self.resume_token = event["_id"]
        if event["operationType"] == "invalidate":
            self.alive = False
        return event

    async def close(self) -> None:
        self.alive = False


@pytest.mark.parametrize("how", ["invalidate_event", "cursor_closed"])
def test_follower_reports_the_end_of_an_invalidated_stream(how: str) -> None:
    from dispatcher.outbox.stream import StreamFollower

    insert = {"_id": {"_data": "1"}, "operationType": "insert",
              "fullDocument": {"_id": "d1", "outbox": [entry(1)]}}
    events = [insert]
    if how == "invalidate_event":
        events.append({"_id": {"_data": "inv"}, "operationType": "invalidate"})
    follower = StreamFollower(None, batch_size=10, pacing_s=0.001)  # type: ignore[arg-type]
    follower._stream = _FakeStream(events, close_after=how == "cursor_closed")  # type: ignore[assignment]

    async def go() -> tuple[Any, Any]:
        return await follower.read(), await follower.read()

    first, again = asyncio.run(go())
    assert [d["_id"] for d in first.documents] == ["d1"]  # what came before is kept
    assert first.ended
    assert first.end_token == ({"_data": "inv"} if how == "invalidate_event" else {"_data": "1"})
    assert again.ended and again.events == 0 and again.documents == []


def test_invalidate_fault_rule() -> None:
    from dispatcher.core.faults import InjectedInvalidate

    f = Faults.parse("stream_read:invalidate@2")
    f.hit("stream_read")
    with pytest.raises(InjectedInvalidate):
        f.hit("stream_read")
