"""W3C trace context carried from an input message to the entries it causes (pure).

An input's ``traceparent`` (and its ``tracestate``) header is copied into the headers of
every outbox entry its handling emits, so the records the dispatcher publishes continue the
trace even when no tracer runs in aggbox's process (docs/design.md "Outbox ids" — trace
context). Only a well-formed ``traceparent`` (W3C Trace Context, level 1) is carried; a
header the handler sets on its ``Emit`` wins."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any, Final

__all__ = ["TRACEPARENT", "TRACESTATE", "emit_trace", "trace_headers", "valid_tracestate"]

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"

#: Set by the writer while a chunk runs with OpenTelemetry spans (:mod:`aggregates.store.tracing`):
#: the trace headers for the entries a message emits — its handling span's — instead of the
#: input's own. Unset (the default): the input's headers are carried as they are.
emit_trace: ContextVar[Callable[[Any], Mapping[str, str]] | None] = ContextVar(
    "aggbox_emit_trace", default=None)

#: version-traceid-parentid-flags, lower-case hex; a future version may append fields.
_TRACEPARENT: Final = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?\Z")
_ZERO_TRACE: Final = "0" * 32
_ZERO_PARENT: Final = "0" * 16
#: The spec lets a carrier truncate tracestate beyond 512 characters; we drop it instead.
_MAX_TRACESTATE: Final = 512


#: W3C Trace Context ``tracestate`` list member: a key (``lcalpha 0*255(lcalpha / DIGIT /
#: "_" / "-" / "*" / "/")``, or ``tenant@system``) ``=`` a value of 1-256 printable ASCII
#: characters except ``,`` and ``=``, not ending in a space.
_TS_MEMBER: Final = re.compile(
    r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]\Z")
_TS_MAX_MEMBERS: Final = 32


def valid_tracestate(value: str) -> bool:
    """Whether ``value`` is a well-formed ``tracestate`` (W3C Trace Context level 1: at most
    32 list members, each ``key=value``, keys unique; empty members and optional spaces
    around commas allowed). Checked before a tracer parses it, so hostile input does not
    make the tracing library log a warning per message."""
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if len(members) > _TS_MAX_MEMBERS:
        return False
    keys = set()
    for m in members:
        if _TS_MEMBER.match(m) is None:
            return False
        key = m.split("=", 1)[0]
        if key in keys:
            return False
        keys.add(key)
    return True


def trace_headers(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The trace-context headers of an input message worth carrying, or ``None``."""
    parent = headers.get(TRACEPARENT)
    if not isinstance(parent, str):
        return None
    m = _TRACEPARENT.match(parent)
    if (m is None or m.group(1) == "ff" or (m.group(1) == "00" and m.group(5))
            or m.group(2) == _ZERO_TRACE or m.group(3) == _ZERO_PARENT):
        return None
    out = {TRACEPARENT: parent}
    state = headers.get(TRACESTATE)
    if isinstance(state, str) and state and len(state) <= _MAX_TRACESTATE:
        out[TRACESTATE] = state
    return out
