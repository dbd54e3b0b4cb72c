"""One Arrow batch's records on the executor: each row's message, or the reason it has none.

The final envelope check happens here: :func:`spark.messages.fast_message` builds the
common valid envelope with cheap checks, anything else goes to :meth:`Message.from_dict`,
which builds the same message or names the failure. A single record never fails the task,
whatever its bytes: invalid UTF-8 (Arrow's strings are not checked) becomes an
``invalid_encoding`` reason with the byte offset, records nested deeper than
:data:`~aggregates.message.envelope.MAX_RECORD_DEPTH` are rejected before ``json.loads``,
and any other error while reading one row is that row's reason.

CloudEvents (docs/design.md "CloudEvents"): a row with binary-mode headers (column
:data:`spark.sources.CE_HEADER_COLUMN`) or a JSON object with ``specversion`` is decoded by
:mod:`aggregates.wire.cloudevents` into an envelope, which ``Message.from_dict`` checks; a
record that is no usable CloudEvent is ``invalid_cloudevent`` naming the attribute, an
envelope rule broken keeps its own reason code and names the attribute too.
"""

from __future__ import annotations

from typing import Any

from aggregates.core.errors import EnvelopeError
from aggregates.core.fastbuild import utf8_encodable
from aggregates.core.jsonnumbers import NonJSONNumber
from aggregates.core.reasons import Reason
from aggregates.message.envelope import (
    KIND_EVENT,
    KIND_HEADER,
    MAX_RECORD_DEPTH,
    Message,
    json_depth,
)
from aggregates.message.fastbatch import fast_messages
from aggregates.wire import cloudevents
from spark.messages import fast_message, json_loads, with_record_trace
from spark.rawtext import decode_record, native_column
from spark.sources import CE_HEADER_COLUMN, TRACE_HEADER_COLUMNS

__all__ = ["Ids", "Rows", "check_row", "check_row_exact"]

class Rows:
    """One Arrow batch's columns as Python lists; the optional columns (Kafka record
    headers, binary-mode CloudEvent headers) read as None when the source has none; any
    other column (Spark's routing text) is not read. With the native parse,
    ``_raw`` is a :class:`spark.rawtext.RawColumn`: a row's text is made only for the rows
    the parse leaves to Python (and when asked for)."""

    def __init__(self, batch: Any) -> None:
        self._column = native_column(batch)
        self.raw: Any
        if self._column is None:
            cols, self._bad = _columns(batch)
            self.raw = cols["_raw"]
        else:
            cols = {name: _column(batch.column(name)) for name in batch.schema.names
                    if name in _READ}
            self.raw = self._column
        self.reason: list[Any] = cols["_reason"]
        self.detail: list[Any] = cols["_detail"]
        self.count = len(self.raw)
        # Kafka record headers (spark.sources.TRACE_HEADER_COLUMNS), when the source has them.
        self._traceparent = cols.get("_h_traceparent")
        self._tracestate = cols.get("_h_tracestate")
        self._binary = cols.get(CE_HEADER_COLUMN)  # binary-mode CloudEvents (Kafka)
        #: Each row's message when the batch's fast path proved it (:meth:`prove`), else
        #: None; for payloads of at most ``proven_for`` bytes.
        self.proven: list[Message | None] = []
        self.proven_for: int | None = None

    @property
    def bad_encoding(self) -> dict[int, str]:
        """The rows whose ``_raw`` is not valid UTF-8 → the ``invalid_encoding`` detail."""
        return self._bad if self._column is None else self._column.bad_encoding

    def prove(self, max_payload: int) -> None:
        """:attr:`proven` for the whole batch at once
        (:func:`aggregates.message.fastbatch.fast_messages`, or the native parse), for the
        rows whose outcome is their record's alone: no reason from Spark, valid UTF-8, no
        record headers that could change the envelope (trace context, binary-mode
        CloudEvent). Such a row's ``check_row`` is its message, exactly as the row's own
        parse builds it."""
        n = self.count
        plain = (self.reason.count(None) == n and self.detail.count(None) == n
                 and (self._traceparent is None or self._traceparent.count(None) == n)
                 and (self._binary is None or self._binary.count(None) == n))
        if self._column is not None:  # the native parse leaves bad UTF-8 to Python itself
            skip = None if plain else [
                self.reason[i] is not None or self.detail[i] is not None
                or self.traceparent(i) is not None or self.binary(i) is not None
                for i in range(n)]
            self.proven = self._column.prove(max_payload, skip)
            self.proven_for = max_payload
            return
        lines: list[Any] = self.raw
        if not (plain and not self.bad_encoding):
            lines = [raw if self.reason[i] is None and self.detail[i] is None
                     and i not in self.bad_encoding and self.traceparent(i) is None
                     and self.binary(i) is None else None for i, raw in enumerate(lines)]
        self.proven = fast_messages(lines, max_payload)
        self.proven_for = max_payload

    def traceparent(self, row: int) -> str | None:
        return self._traceparent[row] if self._traceparent is not None else None

    def tracestate(self, row: int) -> str | None:
        return self._tracestate[row] if self._tracestate is not None else None

    def binary(self, row: int) -> Any:
        return self._binary[row] if self._binary is not None else None


def _is_cloudevent(decoded: Any) -> bool:
    return type(decoded) is dict and "specversion" in decoded


def _decode(raw: str, binary: Any, traceparent: str | None, tracestate: str | None,
            ) -> tuple[Any, tuple[str, str] | None]:
    """The record's JSON value (None for a binary-mode CloudEvent, whose value is the data)
    with the record's trace headers filled in, or why it has none (a record holding NaN or
    Infinity is ``invalid_json`` naming the field; its value, for the ids it names, is
    returned with the failure). The depth is checked before parsing (Spark checks it too):
    never recurse."""
    if binary is not None:
        return None, None
    try:
        depth = json_depth(raw)
        if depth > MAX_RECORD_DEPTH:
            return None, (Reason.PAYLOAD_TOO_DEEP, (
                f"the record nests arrays/objects {depth} levels deep; at most "
                f"{MAX_RECORD_DEPTH} are accepted: flatten the payload"))
        decoded = json_loads(raw)
    except NonJSONNumber as exc:  # NaN/Infinity: Python's json reads them, JSON has none
        return exc.decoded, (Reason.INVALID_JSON, f"not valid JSON: {exc}")
    except (ValueError, RecursionError) as exc:  # JSON the JVM accepted, Python does not
        return None, (Reason.INVALID_JSON, f"not valid JSON: {exc}")
    if traceparent is not None and not _is_cloudevent(decoded):
        decoded = with_record_trace(decoded, traceparent, tracestate)
    return decoded, None


def _envelope_reason(exc: EnvelopeError) -> str:
    """By the error's code, never its text: a depth code counts for the payload only."""
    if exc.code == Reason.PAYLOAD_TOO_LARGE:
        return Reason.PAYLOAD_TOO_LARGE
    if exc.code == Reason.INVALID_JSON:  # NaN or infinity in the payload (e.g. 1e400)
        return Reason.INVALID_JSON
    if exc.code == Reason.PAYLOAD_TOO_DEEP and exc.field.startswith("payload"):
        return Reason.PAYLOAD_TOO_DEEP
    return Reason.INVALID_ENVELOPE


def _cloudevent(decoded: Any, raw: str, ce_headers: Any, traceparent: str | None,
                tracestate: str | None, max_payload: int) -> Message:
    """The message of a CloudEvent row: binary mode when ``ce_headers`` (the record's
    headers, dicts of key and value) is given, else structured mode (``decoded``, a dict
    with ``specversion``). Raises :class:`~aggregates.wire.cloudevents.CloudEventError` or
    :class:`EnvelopeError` (its reason naming the attribute too)."""
    if ce_headers is not None:
        envelope = cloudevents.from_binary(
            [(h["key"], h["value"]) for h in ce_headers], raw)
    else:
        envelope = with_record_trace(cloudevents.from_structured(decoded), traceparent,
                                     tracestate)
    try:
        return Message.from_dict(envelope, max_payload_bytes=max_payload)
    except EnvelopeError as exc:
        attribute = cloudevents.attribute_of(exc.field)
        raise EnvelopeError(exc.field, f"{exc.reason} (CloudEvent attribute "
                            f"{attribute!r})") from None


def _columns(batch: Any) -> tuple[dict[str, list[Any]], dict[int, str]]:
    """The batch as Python lists, and the rows whose ``_raw`` is not valid UTF-8 (row →
    detail). Such text is kept with ``\\xNN`` escapes (distinct bytes stay distinct)."""
    try:
        return batch.to_pydict(), {}
    except UnicodeDecodeError:
        pass  # Spark's strings are bytes; some are not UTF-8: decode column by column
    import pyarrow as pa

    cols: dict[str, list[Any]] = {}
    bad: dict[int, str] = {}
    for name, arr in zip(batch.schema.names, batch.columns, strict=True):
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            cols[name] = arr.to_pylist()
            continue
        binary = pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary()
        values: list[Any] = []
        for i, b in enumerate(arr.cast(binary).to_pylist()):
            if b is None:
                values.append(None)
                continue
            text, detail = decode_record(b)
            values.append(text)
            if detail is not None and name == "_raw":
                bad[i] = detail
        cols[name] = values
    return cols, bad


#: The columns :class:`Rows` reads besides ``_raw`` (the native parse reads that one).
_READ = frozenset({"_reason", "_detail", *TRACE_HEADER_COLUMNS, CE_HEADER_COLUMN})


def _column(arr: Any) -> list[Any]:
    """One column (not ``_raw``) as a list, as :func:`_columns` reads it."""
    n = len(arr)
    if arr.null_count == n:
        return [None] * n
    try:
        values: list[Any] = arr.to_pylist()
    except UnicodeDecodeError:
        import pyarrow as pa

        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            raise
        binary = pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary()
        values = [None if b is None else decode_record(b)[0]
                  for b in arr.cast(binary).to_pylist()]
    return values


#: Ids of an outcome row: (message id, aggregate type, aggregate id, message type).
Ids = tuple[str | None, str | None, str | None, str | None]
_NO_IDS: Ids = (None, None, None, None)
#: Spark's reasons that stand without a parse here (the record is not read again).
_FINAL_REASONS = frozenset({Reason.INVALID_ENCODING, Reason.PAYLOAD_TOO_LARGE})
#: Spark's routing reasons: an aggbox event (header ``aggbox-kind: event``) never keeps one.
_ROUTING_REASONS = frozenset({Reason.UNKNOWN_AGGREGATE_TYPE, Reason.UNKNOWN_MESSAGE_TYPE})
#: Records above this size are never parsed, not even for their ids.
_MAX_PARSED_CHARS = 16 * 1024 * 1024


def check_row(rows: Rows, row: int, max_payload: int,
              ) -> tuple[Message | None, str | None, str | None, Ids]:
    """The row's message (if it has one), the reason against it (None: none) and, when it
    has no message, the ids its record names (strings only, as JSON types them: the
    outcome row's; None where the record has none).

    Spark's reasons for the raw record (not UTF-8, too large, empty) stand; every other
    row is parsed and checked here in full — an invalid record is reported with the exact
    reason even when Spark flagged it (Spark reads fields as text; a lone surrogate is
    '?'); a valid row Spark flagged (misrouted) keeps its message and Spark's reason —
    unless it is an aggbox event (``aggbox-kind: event``, in the envelope's headers or a
    CloudEvent's ``aggboxkind``): the writer reports those ``duplicate`` (``aggbox_event``),
    never a routing dead letter (docs/design.md "Publish in order")."""
    if rows.proven_for != max_payload:
        rows.prove(max_payload)
    msg = rows.proven[row]
    if msg is not None:
        return msg, None, None, _NO_IDS
    return check_row_exact(rows, row, max_payload)


def check_row_exact(rows: Rows, row: int, max_payload: int,
                    ) -> tuple[Message | None, str | None, str | None, Ids]:
    """:func:`check_row` without the batch's fast path: the row's own parse and checks
    (what ``check_row`` returns for every row; tests hold the two equal)."""
    if row in rows.bad_encoding:
        return None, Reason.INVALID_ENCODING, rows.bad_encoding[row], _NO_IDS
    raw, reason, detail = rows.raw[row], rows.reason[row], rows.detail[row]
    binary = rows.binary(row)
    if raw is None:  # a binary-mode CloudEvent's headers may still name it
        return None, reason, detail, _ids(None, binary) if binary is not None else _NO_IDS
    if reason in _FINAL_REASONS:
        if len(raw) > _MAX_PARSED_CHARS:
            return None, reason, detail, _NO_IDS
        decoded, _ = _decode(raw, binary, None, None)  # for the ids only
        return None, reason, detail, _ids(decoded, binary)
    decoded, failure = _decode(raw, binary, rows.traceparent(row), rows.tracestate(row))
    if failure is None:
        msg, failure = _message(rows, row, decoded, binary, max_payload)
        if failure is None:
            if reason in _ROUTING_REASONS and msg is not None and (
                    msg.headers.get(KIND_HEADER) == KIND_EVENT):
                # An aggbox event fed back: nobody's input, whatever handlers (or type) the
                # registry has; the writer reports it duplicate, reason aggbox_event.
                return msg, None, None, _NO_IDS
            return msg, reason, detail, _NO_IDS
    return None, *failure, _ids(decoded, binary)


def _text(value: Any) -> str | None:
    """``value`` when it is a string that can be stored (UTF-8: no lone surrogate)."""
    return value if type(value) is str and utf8_encodable(value) else None


def _ids(decoded: Any, binary: Any) -> Ids:
    """The ids a record names: an envelope's fields, a CloudEvent's attributes (structured,
    or binary-mode headers ``ce_<name>``, the first of each)."""
    names = ("message_id", "aggregate_type", "aggregate_id", "type")
    if binary is not None:
        headers: dict[str, Any] = {}
        for h in binary:
            key = str(h["key"]).lower()
            if key not in headers and isinstance(h["value"], bytes):
                try:
                    headers[key] = h["value"].decode()
                except UnicodeDecodeError:
                    headers[key] = None
        decoded, names = headers, ("ce_id", "ce_aggregatetype", "ce_subject", "ce_type")
    elif _is_cloudevent(decoded):
        names = ("id", "aggregatetype", "subject", "type")
    elif type(decoded) is not dict:
        return _NO_IDS
    mid, atype, aid, mtype = (_text(decoded.get(n)) for n in names)
    return mid, atype, aid, mtype


def _message(rows: Rows, row: int, decoded: Any, binary: Any, max_payload: int,
         ) -> tuple[Message | None, tuple[str, str] | None]:
    """The message of a decoded row, or why there is none. Any error is this row's
    dead letter: one record never fails the whole task."""
    if binary is not None or _is_cloudevent(decoded):
        try:
            return _cloudevent(decoded, rows.raw[row], binary, rows.traceparent(row),
                               rows.tracestate(row), max_payload), None
        except cloudevents.CloudEventError as exc:
            return None, (Reason.INVALID_CLOUDEVENT, str(exc))
        except EnvelopeError as exc:
            return None, (_envelope_reason(exc), str(exc))
        except Exception as exc:
            return None, (Reason.INVALID_CLOUDEVENT,
                          f"invalid CloudEvent: {type(exc).__name__}: {exc}")
    if decoded is None:
        return None, None
    try:
        msg = fast_message(decoded, rows.raw[row], max_payload)
        if msg is None:  # anything uncommon: the complete check decides
            msg = Message.from_dict(decoded, max_payload_bytes=max_payload)
        return msg, None
    except EnvelopeError as exc:
        return None, (_envelope_reason(exc), str(exc))
    except Exception as exc:
        return None, (Reason.INVALID_ENVELOPE,
                      f"invalid message envelope: {type(exc).__name__}: {exc}")
