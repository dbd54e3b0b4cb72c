"""The envelope ↔ CloudEvent mapping (aggregates/wire/cloudevents.py): exact round trips in both
content modes for hostile ids, interop with the CloudEvents SDK both ways, and malformed
events refused with the attribute named."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.core.errors import EnvelopeError
from aggregates.message.envelope import MAX_SEQ, Message
from aggregates.wire import cloudevents as ce
from dispatcher.publishers.builder import build_record
from dispatcher.publishers.formats import json_line, kafka_record
from tests.hypo import examples

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
HOSTILE = ["a/b", "$x", ".", "..", "...", "a.b", "100%", "%2F", "a b", "ü/😀", "+=&?#",
           "/aggbox/x/y", "~_-"]

# Strings without lone surrogates, non-empty, no surrounding white space, no NUL.
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                min_size=1, max_size=40).filter(lambda s: s.strip() == s)


def _envelope(**over: Any) -> dict[str, Any]:
    env: dict[str, Any] = {
        "message_id": "m-1", "type": "Deposited", "aggregate_type": "Account",
        "aggregate_id": "acc/1", "payload": {"amount": 5, "nested": {"k": [1, "ü"]}},
        "occurred_at": "2024-05-01T12:00:00.123000+00:00",
        "source": {"type": "Ledger", "id": "l$1", "seq": 7},
        "causation_id": "c-1", "correlation_id": "r-1",
        "headers": {"traceparent": TRACE, "tracestate": "a=1", "x-tenant": "t"},
        "schema_version": 2,
    }
    env.update(over)
    return {k: v for k, v in env.items() if v is not None}


def _norm(env: dict[str, Any]) -> dict[str, Any]:
    return Message.from_dict(env).to_dict()


def _binary(env: dict[str, Any]) -> dict[str, Any]:
    headers = [(k, v.encode()) for k, v in ce.to_binary(env)]
    return ce.from_binary(headers, json.dumps(env["payload"]).encode())


def _structured(env: dict[str, Any]) -> dict[str, Any]:
    return ce.from_structured(json.loads(json.dumps(ce.to_structured(env))))


@pytest.mark.parametrize("name", HOSTILE)
def test_source_encoding_is_unambiguous_and_exact(name: str) -> None:
    source = ce.encode_source(name, name + "/" + name)
    assert source.count("/") == 3 and " " not in source and "+" not in source
    assert ce.decode_source(source) == (name, name + "/" + name)
    assert "/./" not in source + "/" and "/../" not in source + "/"


@pytest.mark.parametrize("decode", [_binary, _structured])
@pytest.mark.parametrize("name", HOSTILE)
def test_round_trip_with_hostile_ids(decode: Any, name: str) -> None:
    env = _norm(_envelope(aggregate_id=name, aggregate_type=name, message_id=name,
                          source={"type": name, "id": name, "seq": MAX_SEQ}))
    assert decode(env) == env


@pytest.mark.parametrize("decode", [_binary, _structured])
@pytest.mark.parametrize("headers", [
    None,
    {"aggbox-kind": "event"},
    {"aggbox-kind": "input"},           # explicit, kept in aggboxheaders
    {"aggbox-kind": "odd", "ce_id": "x", "content-type": "text/plain"},
    {"traceparent": "00-bad"},          # not carried as a trace header: kept exactly
    {"traceparent": TRACE, "tracestate": ""},
    {"traceparent": TRACE, "tracestate": "ü=1"},
    {"tracestate": "only=1"},
])
def test_headers_round_trip_exactly(decode: Any, headers: dict[str, str] | None) -> None:
    env = _norm(_envelope(headers=headers, source=None, schema_version=None,
                          occurred_at=None, causation_id=None, correlation_id=None))
    assert decode(env) == env


@settings(max_examples=examples(60), deadline=None)
@given(mid=_text, atype=_text, aid=_text, mtype=_text, stype=_text, sid=_text,
       seq=st.integers(1, MAX_SEQ), version=st.integers(1, 2**31 - 1),
       headers=st.dictionaries(_text.filter(lambda k: not k.startswith("$")), _text,
                               max_size=3),
       payload=st.dictionaries(_text.filter(lambda k: "." not in k and k[0] != "$"),
                               st.integers(-(2**63), 2**63 - 1) | _text, max_size=3),
       binary=st.booleans())
def test_round_trip_property(mid: str, atype: str, aid: str, mtype: str, stype: str, sid: str,
                             seq: int, version: int, headers: dict[str, str],
                             payload: dict[str, Any], binary: bool) -> None:
    env = _norm(_envelope(message_id=mid, aggregate_type=atype, aggregate_id=aid, type=mtype,
                          source={"type": stype, "id": sid, "seq": seq},
                          schema_version=version, headers=headers, payload=payload))
    assert (_binary if binary else _structured)(env) == env


def test_attributes_are_the_spec_ones() -> None:
    out = ce.to_structured(_norm(_envelope(headers={"aggbox-kind": "event", "x": "1",
                                                    "traceparent": TRACE})))
    assert out == {
        "specversion": "1.0", "id": "m-1", "source": "/aggbox/Ledger/l%241", "type": "Deposited",
        "subject": "acc/1", "time": "2024-05-01T12:00:00.123Z",
        "datacontenttype": "application/json", "aggregatetype": "Account", "sourceseq": "7",
        "causationid": "c-1", "correlationid": "r-1", "schemaversion": 2,
        "aggboxkind": "event", "traceparent": TRACE, "aggboxheaders": '{"x":"1"}',
        "data": {"amount": 5, "nested": {"k": [1, "ü"]}},
    }
    for name in out:
        assert name in ("data", "specversion", "id", "source", "type", "subject", "time",
                        "datacontenttype") or (name.isalnum() and name.islower())
    # Without a source: the emitter names the source (no sourceseq).
    plain = ce.attributes(_norm(_envelope(source=None)), emitter=("Emitter", "e/1"))
    assert plain["source"] == "/aggbox/Emitter/e%2F1" and "sourceseq" not in plain
    assert ce.from_structured({**plain, "data": {}})["aggregate_id"] == "acc/1"


def test_binary_headers_keep_trace_context_plain() -> None:
    headers = dict(ce.to_binary(_norm(_envelope())))
    assert headers["traceparent"] == TRACE and headers["tracestate"] == "a=1"
    assert headers["content-type"] == "application/json" and "ce_datacontenttype" not in headers
    assert "ce_traceparent" not in headers and headers["ce_aggboxheaders"] == '{"x-tenant":"t"}'


def test_sdk_reads_what_we_write() -> None:
    from cloudevents.core.bindings import kafka
    from cloudevents.core.formats.json import JSONFormat

    env = _norm(_envelope(aggregate_id="ü/😀 $.%"))
    value = json.dumps(env["payload"]).encode()
    msg = kafka.KafkaMessage(headers={k: v.encode() for k, v in ce.to_binary(env)}, key=None,
                             value=value)
    event = kafka.from_binary(msg, JSONFormat())
    assert event.get_id() == "m-1" and event.get_subject() == "ü/😀 $.%"
    assert event.get_data() == env["payload"]
    assert event.get_extension("aggregatetype") == "Account"
    structured = kafka.from_structured(
        kafka.KafkaMessage(headers={}, key=None,
                           value=json.dumps(ce.to_structured(env)).encode()), JSONFormat())
    assert structured.get_source() == ce.encode_source("Ledger", "l$1")
    assert structured.get_extension("schemaversion") == 2
    assert structured.get_time() is not None and structured.get_time().tzinfo is not None


def test_we_read_what_the_sdk_writes() -> None:
    from datetime import UTC, datetime

    from cloudevents.core.bindings import kafka
    from cloudevents.core.formats.json import JSONFormat
    from cloudevents.core.v1.event import CloudEvent

    attrs = {"id": "sdk-1", "source": ce.encode_source("Ledger", "l/1"), "type": "Deposited",
             "subject": "acc 1", "time": datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC),
             "datacontenttype": "application/json", "aggregatetype": "Account",
             "sourceseq": "3", "correlationid": "r", "schemaversion": 4,
             "traceparent": TRACE}
    event = CloudEvent(dict(attrs), {"amount": 1})
    expected = {"message_id": "sdk-1", "type": "Deposited", "aggregate_type": "Account",
                "aggregate_id": "acc 1", "payload": {"amount": 1},
                "occurred_at": "2024-05-01T12:00:00.123000+00:00",
                "source": {"type": "Ledger", "id": "l/1", "seq": 3}, "correlation_id": "r",
                "schema_version": 4, "headers": {"traceparent": TRACE}}
    binary = kafka.to_binary(event, JSONFormat())
    # binary mode: the SDK writes traceparent as ce_traceparent (the distributed-tracing
    # extension); without a plain traceparent header, aggbox reads it from there
    got = ce.from_binary(binary.headers.items(), binary.value)
    assert _norm(got) == _norm(expected)
    # a plain traceparent header wins over the extension
    plain = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    got = ce.from_binary([*binary.headers.items(), ("traceparent", plain.encode())],
                         binary.value)
    assert got["headers"] == {"traceparent": plain}
    structured = kafka.to_structured(event, JSONFormat())
    assert _norm(ce.from_structured(json.loads(structured.value))) == _norm(expected)


@pytest.mark.parametrize(("change", "attribute", "text"), [
    ({"specversion": "0.3"}, "specversion", "must be '1.0'"),
    ({"specversion": None}, "specversion", "must be '1.0'"),
    ({"id": None}, "id", "is required"),
    ({"id": ""}, "id", "must not be empty"),
    ({"id": 5}, "id", "must be a string"),
    ({"subject": None}, "subject", "is required"),
    ({"aggregatetype": None}, "aggregatetype", "is required"),
    ({"source": "/aggbox/a/b/c"}, "source", "exactly two segments"),
    ({"source": "/aggbox/a/b%ZZ"}, "source", "percent-encoded"),
    ({"source": "/aggbox/a/%FF"}, "source", "UTF-8"),
    ({"source": "/aggbox/a b/x"}, "source", "percent-encoded"),
    ({"source": "urn:other"}, "source", "/aggbox/"),
    ({"sourceseq": "0"}, "sourceseq", "decimal integer"),
    ({"sourceseq": "-1"}, "sourceseq", "decimal integer"),
    ({"sourceseq": "9223372036854775808"}, "sourceseq", "between 1 and"),
    ({"sourceseq": "1e3"}, "sourceseq", "decimal integer"),
    ({"sourceseq": 1.5}, "sourceseq", "decimal integer"),
    ({"schemaversion": 2**31}, "schemaversion", "between 1 and"),
    ({"schemaversion": True}, "schemaversion", "decimal integer"),
    ({"time": "2024-05-01 12:00:00"}, "time", "RFC 3339"),
    ({"time": "0000-01-01T00:00:00Z"}, "time", ""),
    ({"time": "2024-13-01T00:00:00Z"}, "time", ""),
    ({"datacontenttype": "text/plain"}, "datacontenttype", "not JSON"),
    ({"aggboxkind": "other"}, "aggboxkind", "must be"),
    ({"aggboxheaders": "[1]"}, "aggboxheaders", "JSON object"),
    ({"aggboxheaders": '{"a": {"b": "c"}}'}, "aggboxheaders", "JSON object"),
    ({"aggboxheaders": "{"}, "aggboxheaders", "not valid JSON"),
    ({"data": None}, "data", "is required"),
    ({"data": [1]}, "data", "JSON object"),
    ({"data_base64": "e30="}, "data_base64", "not accepted"),
])
def test_malformed_structured_events_name_the_attribute(change: dict[str, Any], attribute: str,
                                                        text: str) -> None:
    event = {**ce.to_structured(_norm(_envelope())), **change}
    with pytest.raises(ce.CloudEventError) as info:
        ce.from_structured({k: v for k, v in event.items()
                            if v is not None or k == "specversion"})
    assert info.value.attribute == attribute and text in info.value.reason
    assert f"attribute {attribute!r}" in str(info.value) and "fix the producer" in str(info.value)


@pytest.mark.parametrize(("headers", "value", "attribute"), [
    ([("ce_id", b"\xff")], b"{}", "ce_id"),
    ([("ce_id", b"x"), ("CE_ID", b"y")], b"{}", "CE_ID"),
    ([("ce_subject", b"x" * (ce.MAX_ATTRIBUTE_BYTES + 1))], b"{}", "ce_subject"),
    ([("ce_id", None)], b"{}", "ce_id"),
    ([("ce_data", b"{}")], b"{}", "ce_data"),
    ([("content-type", b"application/xml")], b"{}", "content-type"),
    ([("ce_specversion", b"1.1")], b"{}", "ce_specversion"),
    ([], b"not json", "data"),
    ([], b"\xff{}", "data"),
    ([], None, "data"),
    ([], b"[" * 100 + b"]" * 100, "data"),
])
def test_malformed_binary_records_name_the_header(headers: list[tuple[str, Any]], value: Any,
                                                  attribute: str) -> None:
    base = dict(ce.to_binary(_norm(_envelope())))
    names = {k.lower() for k, _ in headers}
    record = [(k, v.encode()) for k, v in base.items() if k.lower() not in names] + headers
    with pytest.raises(ce.CloudEventError) as info:
        ce.from_binary(record, value)
    assert info.value.attribute == attribute


def test_envelope_rules_still_apply_after_mapping() -> None:
    event = ce.to_structured(_norm(_envelope()))
    with pytest.raises(EnvelopeError, match="longer than 512"):
        Message.from_dict(ce.from_structured({**event, "id": "x" * 600}))
    assert ce.attribute_of("message_id") == "id" and ce.attribute_of("payload.a[0]") == "data"
    assert ce.attribute_of("source.seq") == "sourceseq"


def test_binary_record_trace_headers_follow_the_pipeline_rule() -> None:
    env = _norm(_envelope(headers=None))
    base = [(k, v.encode()) for k, v in ce.to_binary(env)]
    payload = json.dumps(env["payload"])
    assert "headers" not in ce.from_binary(base, payload)
    carried = ce.from_binary([*base, ("traceparent", TRACE.encode())], payload)
    assert carried["headers"] == {"traceparent": TRACE}
    for odd in ([("traceparent", TRACE.encode())] * 2, [("traceparent", b"00-bad")],
                [("traceparent", b"\xff" + TRACE.encode()[1:])]):
        assert "headers" not in ce.from_binary(base + odd, payload)


def test_dispatcher_formats() -> None:
    entry = {"id": "e-1", "type": "Tick", "payload": {"i": 1}, "headers": {
        "traceparent": TRACE, "x": "1", "ce_id": "clash", "content-type": "text/plain"},
        "source": {"type": "Emitter", "id": "em/1", "seq": 1}}
    record = build_record(entry, collection="emitters", document_id="em/1",
                          source_type="Emitter", topic_template="{aggregate_type}.events")
    assert kafka_record(record, "aggbox") == (record.value, [
        (k, v.encode()) for k, v in record.headers.items()])
    value, headers = kafka_record(record, "cloudevents")
    assert json.loads(value) == {"i": 1}
    names = [k for k, _ in headers]
    assert len(names) == len(set(names)) and "message_id" not in names
    assert ("x", b"1") in headers and ("ce_id", b"e-1") in headers
    assert ("traceparent", TRACE.encode()) in headers
    assert Message.from_dict(ce.from_binary(headers, value)) == record.message
    line = json.loads(json_line(record, "cloudevents"))
    assert Message.from_dict(ce.from_structured(line)) == record.message
    assert line["aggboxkind"] == "event" and line["source"] == "/aggbox/Emitter/em%2F1"
    assert json_line(record, "aggbox") == record.value
