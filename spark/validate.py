"""Routing and ordering in Spark SQL, with the checks they need: every input record gets a
reason code (``_reason``) or ``NULL``.

Input: a DataFrame with the raw record text ``_raw`` and its position (``_src``, ``_o1``,
``_o2``; see :mod:`spark.sources`). The record is parsed once in the JVM, by a typed
``from_json`` that reads only the routing and ordering fields (as text: a value of another
JSON type reads as its JSON text; the payload is skipped, only its presence as an object is
noted). Spark decides:

========================== ==============================================================
reason                     when
========================== ==============================================================
``invalid_encoding``       the record is not valid UTF-8 (the executor's detail gives the
                           byte offset)
``invalid_json``           the record is empty (no value); a record that is not JSON, or
                           holds ``NaN``/``Infinity`` (not JSON: Jackson's
                           ``allowNonNumericNumbers`` is off), reads as all NULL here
                           (``invalid_envelope``) and the executor names it ``invalid_json``
``payload_too_large``      the record is far larger than ``max_payload_bytes`` (the exact
                           BSON size check happens in the executor, same reason code), or
                           larger than 16 MiB
``invalid_envelope``       a field routing needs (``message_id``, ``type``,
                           ``aggregate_type``, ``aggregate_id``, ``payload`` as an object)
                           did not read: missing, null, or the record is no JSON object at
                           all, or a string spells a lone surrogate escape
``unknown_aggregate_type`` ``aggregate_type`` is not in the registry
``unknown_message_type``   the aggregate type has no handler for ``type``
``invalid_cloudevent``     a binary-mode CloudEvent (Kafka header ``ce_specversion``)
                           without a record value
========================== ==============================================================

Every record but the empty, non-UTF-8 and too large ones is checked again in full by the
executor (:func:`spark.records.check_row`), which parses each row anyway: an
``invalid_envelope`` or routing reason of Spark's is replaced by the executor's exact one
(``invalid_json``, ``payload_too_deep``, ``invalid_envelope`` naming the field and the JSON
type it found, …) when the executor finds the record invalid; a record Spark found valid is
checked by :meth:`aggregates.message.envelope.Message.from_dict` there (unknown fields,
``occurred_at``, ``source``, headers, string rules, payload key names, BSON size, depth).
So Spark's checks are only the ones routing and ordering cannot do without: rows Spark
flags are routed by their raw text and take no part in their source's effective time
(:mod:`spark.order`). The message ids, types and aggregate of every outcome row come from
the executor's parse (exact JSON types), never from Spark's text.

CloudEvents (docs/design.md "CloudEvents"): a record with the Kafka header
``ce_specversion`` (binary content mode: the attributes in headers, :data:`CE_HEADER_COLUMN`,
the payload as the value) or a JSON object with the key ``specversion`` (structured mode)
is read through its attributes: ``id``, ``type``, ``subject``, ``aggregatetype``,
``source``/``sourceseq`` and ``time`` give the routing and ordering columns; the executor
decodes every CloudEvent (:mod:`aggregates.wire.cloudevents`) and names what is wrong.

Every Spark expression here is total: it yields NULL, never an error, for any input
(``from_json`` reads text fields with Jackson's iterative copy and stops at its nesting
limit; a VARIANT parse would recurse and overflow the task's stack on deep records). The
former design parsed a VARIANT and checked ~30 expressions over it: 1.7-1.9 s per 1e5
records against 0.35-0.46 s for this parse (bench/RESULTS.md, Issue 25). Nothing is
filtered out here: invalid rows travel on to the executor, which writes them to the
dead-letter collection and reports their outcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aggregates.core.reasons import Reason
from aggregates.domain.aggregate import Registry
from aggregates.message.envelope import MAX_EPOCH_MILLIS, MIN_EPOCH_MILLIS
from spark.sources import CE_HEADER_COLUMN, TRACE_HEADER_COLUMNS

__all__ = [
    "LONE_SURROGATE_DETAIL",
    "VALIDATED_COLUMNS",
    "RegistryInfo",
    "validate",
]

#: Detail of records Spark does not parse because a JSON escape spells a lone surrogate
#: (Jackson reads it as '?'); the executor replaces it with Message.from_dict's detail naming
#: the field.
LONE_SURROGATE_DETAIL: Final = ("invalid message envelope: a string holds a lone surrogate "
                                "escape (\\ud800-\\udfff without its pair)")

#: Columns :func:`validate` returns.
VALIDATED_COLUMNS: Final = ("_raw", "_reason", "_detail", "_atype", "_aid", "_stype", "_sid",
                            "_seq", "_ts", "_src", "_o1", "_o2")

#: Slack over ``max_payload_bytes`` before Spark rejects a record by its text size (JSON text
#: and BSON sizes differ; the executor checks the payload's BSON size exactly).
_SIZE_SLACK_FACTOR: Final = 2
_SIZE_SLACK_BYTES: Final = 64 * 1024
#: Records larger than this are never parsed (MongoDB could not store such a message).
_MAX_RECORD_BYTES: Final = 16 * 1024 * 1024

#: The fields Spark reads, as text (``from_json``: a value of another JSON type reads as its
#: JSON text, so this never fails for a valid envelope). ``payload STRUCT<>`` is non-NULL
#: exactly when the payload is a JSON object (its content is skipped); ``source`` is NULL for
#: a CloudEvent, whose ``source`` is a string (read apart, for CloudEvents only).
_FIELDS: Final = (
    "message_id STRING, type STRING, aggregate_type STRING, aggregate_id STRING, "
    "payload STRUCT<>, source STRUCT<type: STRING, id: STRING, seq: STRING>, "
    "occurred_at STRING, specversion STRING, id STRING, subject STRING, "
    "aggregatetype STRING, time STRING, sourceseq STRING"
)

#: SQL: ``from_json``'s options. Jackson reads ``NaN``, ``Infinity``, ``-Infinity`` (and
#: ``INF``…) as numbers unless told not to (Spark's default is to allow them): JSON has no
#: such numbers, so such a record does not parse here (its payload reads as NULL: Spark's
#: ``invalid_envelope``), and the executor, whose parse refuses them too, replaces that with
#: ``invalid_json`` naming the field (:func:`aggregates.core.jsonnumbers.loads`).
_JSON_OPTIONS: Final = "map('allowNonNumericNumbers', 'false')"

#: SQL: whether ``_raw`` has a JSON escape of a lone surrogate (escaped backslashes removed
#: first); only searched when ``_raw`` has a ``\u`` escape at all.
_LONE_SURROGATE: Final = (
    r"""instr(_raw, '\\u') > 0 AND replace(_raw, '\\\\', '') RLIKE """
    r"""'\\\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\\\u[dD][c-fC-F][0-9a-fA-F]{2})"""
    r"""|(?<!\\\\u[dD][89abAB][0-9a-fA-F]{2})\\\\u[dD][c-fC-F][0-9a-fA-F]{2}'"""
)


@dataclass(frozen=True, slots=True)
class RegistryInfo:
    """What validation needs from a registry: aggregate type → handled message types."""

    types: Mapping[str, Sequence[str]]

    @classmethod
    def from_registry(cls, registry: Registry) -> RegistryInfo:
        return cls({t.name: tuple(t.message_types) for t in registry})


def _lit(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _required(field: str) -> str:
    """SQL: the detail of a field routing needs that did not read (the executor replaces it
    with the exact one when it finds the record invalid)."""
    return _lit(f"invalid message envelope: field {field!r}: is required (a JSON "
                f"{'object' if field == 'payload' else 'string'})")


class _Checks:
    """An ordered list of (condition, reason, detail) SQL triples; the first match wins."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, str]] = []

    def add(self, cond: str, reason: str, detail_sql: str) -> None:
        self.items.append((cond, reason, detail_sql))

    def index(self) -> str:
        """``CASE`` giving the 1-based number of the first failing check (NULL: valid).
        Each condition is evaluated once per row; reason and detail are looked up by it."""
        whens = " ".join(f"WHEN {cond} THEN {i}" for i, (cond, _, _) in
                         enumerate(self.items, start=1))
        return f"CASE {whens} ELSE NULL END"

    def reason(self, index: str) -> str:
        # Not element_at(array, index): Spark 4.0.1 returns the last element for a NULL
        # index computed by a CASE expression.
        whens = " ".join(f"WHEN {i} THEN {_lit(r)}" for i, (_, r, _) in
                         enumerate(self.items, start=1))
        return f"CASE {index} {whens} ELSE NULL END"

    def detail(self, index: str) -> str:
        whens = " ".join(f"WHEN {i} THEN {d}" for i, (_, _, d) in
                         enumerate(self.items, start=1))
        return f"CASE {index} {whens} ELSE NULL END"


def _size_limit(max_payload_bytes: int) -> int:
    if not max_payload_bytes:
        return _MAX_RECORD_BYTES
    return min(_MAX_RECORD_BYTES, max_payload_bytes * _SIZE_SLACK_FACTOR + _SIZE_SLACK_BYTES)


def _projection_columns(max_payload_bytes: int, extra: Sequence[str], binary: bool
                        ) -> list[list[str]]:
    """The columns the checks use, in five projections (each may use the previous one's);
    ``extra`` input columns are passed through; ``binary``: the input has the binary-mode
    CloudEvent headers column."""
    pre = ["_raw", "_src", "_o1", "_o2", *extra, "octet_length(_raw) AS _size",
           "coalesce(NOT is_valid_utf8(_raw), false) AS _bad_utf8",
           f"coalesce({_LONE_SURROGATE}, false) AS _surrogate",
           f"{CE_HEADER_COLUMN} IS NOT NULL AS _ce_bin" if binary else "false AS _ce_bin",
           *([f"{_ce_header(name)} AS _ceh_{name}" for name in _CE_ATTRIBUTES]
             if binary else [])]
    # Encoding, size and lone surrogates are decided on the raw text; only records that
    # pass are parsed. A binary-mode CloudEvent's value is the data: not parsed here.
    parse = ["*", "CASE WHEN NOT _bad_utf8 AND NOT _surrogate AND NOT _ce_bin AND "
                  f"_size <= {_size_limit(max_payload_bytes)} "
                  f"THEN from_json(_raw, {_lit(_FIELDS)}, {_JSON_OPTIONS}) END AS _j"]
    ce = ["*", "NOT _ce_bin AND _j.specversion IS NOT NULL AS _ce_struct"]
    if binary:
        def attr(header: str, name: str) -> str:
            return f"CASE WHEN _ce_bin THEN _ceh_{header} ELSE _j.{name} END"
    else:
        def attr(header: str, name: str) -> str:
            return f"_j.{name}"
    second = ["*", "_ce_bin OR _ce_struct AS _ce"]
    for name, ce_attr in _CE_FIELDS.items():
        second.append(f"CASE WHEN _ce_struct THEN _j.{ce_attr} ELSE {attr(ce_attr, name)} "
                      f"END AS _s_{name}")
    # The source segments of /aggbox/<type>/<id>, percent-decoded (aggregates.wire.cloudevents).
    ce_src = (f"CASE WHEN _ce_struct THEN get_json_object(_raw, '$.source') "
              f"{'WHEN _ce_bin THEN _ceh_source ' if binary else ''}END")
    segments = (f"CASE WHEN startswith({ce_src}, '/aggbox/') THEN "
                f"split(substr({ce_src}, 9), '/') END")
    ce_seq = ("CASE WHEN _ce_bin THEN try_cast(_ceh_sourceseq AS BIGINT) "
              "ELSE try_cast(_j.sourceseq AS BIGINT) END" if binary
              else "try_cast(_j.sourceseq AS BIGINT)")
    second += [
        f"CASE WHEN _ce THEN try_url_decode(try_element_at({segments}, 1)) "
        "ELSE _j.source.type END AS _source_type",
        f"CASE WHEN _ce THEN try_url_decode(try_element_at({segments}, 2)) "
        "ELSE _j.source.id END AS _source_id",
        f"CASE WHEN _ce THEN {ce_seq} ELSE try_cast(_j.source.seq AS BIGINT) END AS _source_seq",
        f"CASE WHEN _ce THEN {attr('time', 'time')} ELSE _j.occurred_at END AS _s_occurred_at",
    ]
    # occurred_at as a number (Spark reads a JSON number's text), for _ts.
    last = ["*", "try_cast(_s_occurred_at AS DOUBLE) AS _d_occurred_at"]
    return [pre, parse, ce, second, last]


#: Envelope field → the CloudEvent attribute it comes from (aggregates.wire.cloudevents).
_CE_FIELDS: Final = {"message_id": "id", "type": "type", "aggregate_type": "aggregatetype",
                     "aggregate_id": "subject"}
#: The binary-mode headers (``ce_<name>``) Spark reads.
_CE_ATTRIBUTES: Final = ("id", "type", "aggregatetype", "subject", "source", "sourceseq",
                         "time")


def _ce_header(name: str) -> str:
    """SQL: the first binary-mode header ``ce_<name>`` as text, NULL when absent or not
    UTF-8 (the executor names such a header)."""
    value = (f"CAST(try_element_at(filter({CE_HEADER_COLUMN}, "
             f"h -> lower(h.key) = 'ce_{name}'), 1).value AS STRING)")
    return f"CASE WHEN coalesce(is_valid_utf8({value}), false) THEN {value} END"


def _ce_bad(attribute: str, reason: str) -> str:
    """SQL: the detail text of a CloudEventError."""
    return _lit(f"invalid CloudEvent: attribute {attribute!r}: {reason}; fix the producer "
                "(docs/design.md \"CloudEvents\")")


def _checks(info: RegistryInfo, max_payload_bytes: int) -> _Checks:
    """The checks, first match wins: the raw record, the fields routing needs, routing."""
    size_limit = _size_limit(max_payload_bytes)
    c = _Checks()
    c.add("_ce_bin AND _raw IS NULL", Reason.INVALID_CLOUDEVENT,
          _ce_bad("data", "is required: the payload, a JSON object (the Kafka record has no "
                  "value)"))
    c.add("_raw IS NULL", Reason.INVALID_JSON, "'empty record (no value)'")
    c.add("_bad_utf8", Reason.INVALID_ENCODING,
          "'the record is not valid UTF-8; fix the producer\\'s encoding'")
    limit_text = (f"payloads are limited to {max_payload_bytes} bytes (BSON): split the "
                  "message or raise max_payload_bytes" if max_payload_bytes else
                  f"records are limited to {_MAX_RECORD_BYTES} bytes: split the message")
    c.add(f"_size > {size_limit}", Reason.PAYLOAD_TOO_LARGE,
          f"concat('the record is ', _size, ' bytes; {limit_text}')")
    c.add("_surrogate", Reason.INVALID_ENVELOPE, _lit(LONE_SURROGATE_DETAIL))
    # What routing needs; a CloudEvent is checked by the executor (the detail names the
    # attribute), only routed here. Records that are no JSON object read as all NULL.
    c.add("NOT _ce AND _j.payload IS NULL", Reason.INVALID_ENVELOPE, _required("payload"))
    for name in ("message_id", "type", "aggregate_type", "aggregate_id"):
        c.add(f"NOT _ce AND _s_{name} IS NULL", Reason.INVALID_ENVELOPE, _required(name))
    _add_routing_checks(c, info)
    return c


def _add_routing_checks(c: _Checks, info: RegistryInfo) -> None:
    """Routing: the aggregate type must be registered and handle the message type."""
    names = sorted(info.types)
    known_types = ", ".join(_lit(n) for n in names) or "CAST(NULL AS STRING)"
    c.add(f"NOT array_contains(array({known_types}), _s_aggregate_type)",
          Reason.UNKNOWN_AGGREGATE_TYPE, _unknown_aggregate_detail(names))
    pairs = ", ".join(
        f"{_lit(n)}, array({', '.join(_lit(m) for m in info.types[n]) or 'CAST(NULL AS STRING)'})"
        for n in names
    )
    handled = f"element_at(map({pairs}), _s_aggregate_type)" if names else "array()"
    c.add(f"NOT coalesce(array_contains({handled}, _s_type), false)", Reason.UNKNOWN_MESSAGE_TYPE,
          f"concat('aggregate type \\'', _s_aggregate_type, '\\' has no handler for message "
          f"type \\'', _s_type, '\\'; it handles ', "
          f"concat('[', array_join(transform(array_sort({handled}), x -> concat('\\'', x, "
          f"'\\'')), ', '), ']'), '. Add a handler with @<your AggregateType>.handles(\\'', "
          "_s_type, '\\').')")


def _unknown_aggregate_detail(names: list[str]) -> str:
    listed = _lit(repr(names))
    return (f"concat('unknown aggregate type \\'', _s_aggregate_type, '\\'; registered types: ', "
            f"{listed}, '. Register it with Registry.register(...) or pass the module that "
            "defines it (--aggregates).')")


def validate(df: Any, info: RegistryInfo, *, max_payload_bytes: int) -> Any:
    """Add ``_reason``/``_detail`` (NULL for rows Spark finds valid), the routing columns
    ``_atype``, ``_aid`` (text as Spark read it: for routing only) and the ordering columns
    ``_stype``, ``_sid``, ``_seq`` (source type, id, seq) and ``_ts`` (occurred_at). Returns
    exactly :data:`VALIDATED_COLUMNS`, plus the :data:`spark.sources.TRACE_HEADER_COLUMNS`
    and :data:`~spark.sources.CE_HEADER_COLUMN` the input has (Kafka), passed through."""
    binary = CE_HEADER_COLUMN in df.columns
    extra = [c for c in (*TRACE_HEADER_COLUMNS, CE_HEADER_COLUMN) if c in df.columns]
    parsed = df
    for stage in _projection_columns(max_payload_bytes, extra, binary):
        parsed = parsed.selectExpr(*stage)
    checks = _checks(info, max_payload_bytes)
    checked = parsed.selectExpr("*", f"{checks.index()} AS _check")
    return checked.selectExpr(
        "_raw",
        f"{checks.reason('_check')} AS _reason",
        f"{checks.detail('_check')} AS _detail",
        "_s_aggregate_type AS _atype",
        "_s_aggregate_id AS _aid",
        "_source_type AS _stype",
        "_source_id AS _sid",
        "_source_seq AS _seq",
        # occurred_at: epoch milliseconds (a number; Spark reads its JSON text) or ISO-8601
        # text. Numbers outside MIN_EPOCH_MILLIS..MAX_EPOCH_MILLIS (epoch ns, 1e300) and
        # text Spark's timestamp cast does not read are NULL here (a missing time for the
        # order; the executor decides whether the record is valid). Limit: a digits-only
        # string reads as epoch milliseconds (Spark's text cannot tell "20260101" from
        # 20260101), whereas Message.from_dict reads it as an ISO basic date.
        "CASE WHEN _d_occurred_at IS NOT NULL THEN "
        f"CASE WHEN _d_occurred_at BETWEEN {MIN_EPOCH_MILLIS} AND {MAX_EPOCH_MILLIS} THEN "
        "timestamp_millis(CAST(_d_occurred_at AS BIGINT)) END "
        "ELSE try_cast(_s_occurred_at AS TIMESTAMP) END AS _ts",
        "_src", "_o1", "_o2",
        *extra,
    )
