"""The executor's helpers for input records: :func:`json_loads` (``json.loads``, faster on
a whole record, refusing ``NaN``/``Infinity``) and :func:`with_record_trace` (a Kafka
record's trace headers into the envelope). The envelope check itself is
:mod:`aggregates.message.fastpath`, the one shared by every reader of envelopes:
:func:`fast_message` is re-exported from there (the executor builds the common valid
envelope with it and leaves everything else to ``Message.from_dict``).
"""

from __future__ import annotations

import json
import json.scanner
from typing import Any

from aggregates.core.jsonnumbers import NonJSONNumber, located, refuse_constant
from aggregates.core.tracecontext import TRACEPARENT, TRACESTATE, trace_headers
from aggregates.message.fastpath import fast_message

__all__ = ["fast_message", "json_loads", "with_record_trace"]


_make_scanner: Any = json.scanner.make_scanner  # typeshed types it as the class it is
# As json.loads's decoder scans; NaN, Infinity and -Infinity raise (not JSON).
_scan_once: Any = _make_scanner(json.JSONDecoder(parse_constant=refuse_constant))


def json_loads(raw: str) -> Any:
    """``json.loads(raw)``: the same value or the same exception — but a record holding
    ``NaN``, ``Infinity`` or ``-Infinity`` raises
    :class:`~aggregates.core.jsonnumbers.NonJSONNumber` naming the field. A record that is
    one JSON value from its first to its last character is scanned directly, without
    ``loads``'s wrapper (type and BOM checks, two white-space matches: as much CPU as the
    scan of a small record); anything else goes through ``json.loads``."""
    try:
        if type(raw) is str:
            try:
                value, end = _scan_once(raw, 0)
            except NonJSONNumber:
                raise
            except Exception:  # not JSON at 0 (white space, BOM, junk): loads raises its error
                return json.loads(raw, parse_constant=refuse_constant)
            if end == len(raw):
                return value
        return json.loads(raw, parse_constant=refuse_constant)
    except NonJSONNumber:
        raise located(raw) from None


def with_record_trace(decoded: Any, traceparent: str | None, tracestate: str | None) -> Any:
    """``decoded`` with a Kafka record's ``traceparent``/``tracestate`` headers filled into
    its ``headers`` (a new dict; ``decoded`` is not changed), or ``decoded`` itself.

    The envelope is the authoritative message: a header it has wins, and an envelope with
    its own ``traceparent`` keeps its trace context whole (a record's ``tracestate`` belongs
    to the record's ``traceparent``). The record's headers are only used when its
    ``traceparent`` is well-formed (:func:`aggregates.core.tracecontext.trace_headers`, which
    also drops an empty or too long ``tracestate``). A record that is not a JSON object, or
    whose ``headers`` is not an object, is returned as it is: its checks report it."""
    if traceparent is None or type(decoded) is not dict:
        return decoded
    headers = decoded.get("headers")
    if headers is None:
        headers = {}
    elif type(headers) is not dict or TRACEPARENT in headers:
        return decoded
    record = {TRACEPARENT: traceparent}
    if tracestate is not None:
        record[TRACESTATE] = tracestate
    carried = trace_headers(record)
    if carried is None:
        return decoded
    out = dict(decoded)
    out["headers"] = {**carried, **headers}
    return out
