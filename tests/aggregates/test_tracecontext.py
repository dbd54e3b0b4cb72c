"""W3C trace context travels from an input message to the entries it causes and the records
published from them, with no tracer configured (aggregates/core/tracecontext.py)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, replace

import pytest

from aggregates import AggregateType, Emit, Handled, Message
from aggregates.core.tracecontext import trace_headers
from aggregates.testing import AggregateHarness, message
from dispatcher.publishers.builder import build_record

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclass(frozen=True)
class Box:
    n: int = 0


boxes = AggregateType("Box", state=Box)


@boxes.handles("Go")
def go(state: Box, msg: Message) -> Handled[Box]:
    own = msg.payload.get("own")
    emits = [Emit("Went", {"n": state.n}, to=boxes.ref("other")),
             Emit("Noted", {"n": 1}, headers={"traceparent": own} if own else {"x": "1"})]
    return replace(state, n=state.n + 1), emits


def _with_headers(msg: Message, headers: dict[str, str]) -> Message:
    return dataclasses.replace(msg, headers=headers)


def test_the_input_trace_context_reaches_every_entry_and_the_published_record() -> None:
    h = AggregateHarness(boxes, aggregate_id="b-1")
    msg = _with_headers(message("Go", {}, to=boxes, id="b-1"),
                        {"traceparent": PARENT, "tracestate": "congo=t61rcWkgMzE"})
    step = h.when(msg)
    assert step.outcome == "applied"
    went, noted = step.emitted
    assert went["headers"] == {"traceparent": PARENT, "tracestate": "congo=t61rcWkgMzE"}
    assert noted["headers"] == {"traceparent": PARENT, "tracestate": "congo=t61rcWkgMzE",
                                "x": "1"}
    rec = build_record(went, collection="boxs", document_id="b-1",
                       source_type="Box", topic_template="{aggregate_type}")
    assert rec.headers["traceparent"] == PARENT
    assert json.loads(rec.value)["headers"]["traceparent"] == PARENT


def test_a_handler_set_traceparent_wins_and_no_context_adds_nothing() -> None:
    mine = "00-11111111111111111111111111111111-2222222222222222-00"
    h = AggregateHarness(boxes, aggregate_id="b-2")
    step = h.when(_with_headers(message("Go", {"own": mine}, to=boxes, id="b-2"),
                                {"traceparent": PARENT}))
    assert step.emitted[1]["headers"] == {"traceparent": mine}
    plain = h.when(message("Go", {}, to=boxes, id="b-2"))
    assert plain.emitted[0]["headers"] == {} and plain.emitted[1]["headers"] == {"x": "1"}


@pytest.mark.parametrize(("headers", "expected"), [
    ({"traceparent": PARENT}, {"traceparent": PARENT}),
    ({"traceparent": PARENT, "tracestate": ""}, {"traceparent": PARENT}),
    ({"traceparent": PARENT, "tracestate": "a=" + "b" * 600}, {"traceparent": PARENT}),
    ({"traceparent": "01-" + PARENT[3:] + "-future"}, {"traceparent": "01-" + PARENT[3:]
                                                       + "-future"}),
    ({"tracestate": "a=b"}, None),
    ({"traceparent": PARENT.upper()}, None),
    ({"traceparent": "ff" + PARENT[2:]}, None),
    ({"traceparent": PARENT + "-extra"}, None),  # version 00 has exactly four fields
    ({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}, None),
    ({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01"}, None),
    ({"traceparent": "00-4bf92f35-00f067aa0ba902b7-01"}, None),
    ({"traceparent": PARENT + "\n"}, None),
])
def test_only_a_well_formed_traceparent_is_carried(headers: dict[str, str],
                                                    expected: dict[str, str] | None) -> None:
    assert trace_headers(headers) == expected


@pytest.mark.parametrize(("value", "valid"), [
    ("congo=t61rcWkgMzE", True),
    ("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", True),
    ("a=1 , b=2\t,c=3", True),  # optional white space around commas
    ("a=b,,c=d", True),  # empty list members are allowed
    ("tenant1@sys=x", True),
    ("a" + "b" * 255 + "=v", True),
    (",".join(f"k{i}=v" for i in range(32)), True),
    (",".join(f"k{i}=v" for i in range(33)), False),  # at most 32 members
    ("a=b,a=c", False),  # duplicate key
    ("A=1", False), ("é=1", False), ("1a=1", False),
    ("a=b c", True),  # a space inside a value
    ("a=", False), ("a= ", False), ("a", False), ("a=b=c", False), ("a=\x7f", False),
    ("a" + "b" * 256 + "=v", False),
    ("a=\udc80", False),
])
def test_valid_tracestate_follows_the_w3c_grammar(value: str, valid: bool) -> None:
    from aggregates.core.tracecontext import valid_tracestate

    assert valid_tracestate(value) is valid
