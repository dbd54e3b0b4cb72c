"""Validation in Spark SQL: every input record gets a reason code (``_reason``) or ``NULL``.

Input: a DataFrame with the raw record text ``_raw`` and its position (``_src``, ``_o1``,
``_o2``; see :mod:`spark.sources`). The record is parsed once into a VARIANT; Spark checks
what routing and ordering need, before the shuffle:

========================== ==============================================================
reason                     when
========================== ==============================================================
``invalid_json``           the record is not JSON (or empty)
``invalid_encoding``       the record is not valid UTF-8 (the executor's detail gives the
                           byte offset)
``payload_too_deep``       the record nests arrays/objects deeper than
                           ``MAX_RECORD_DEPTH`` (found by scanning the raw text: nothing
                           recursive ever sees such a record)
``invalid_envelope``       not a JSON object; ``message_id``, ``type``, ``aggregate_type``,
                           ``aggregate_id`` or ``payload`` missing or mistyped (the detail
                           names the field)
``payload_too_large``      the record is far larger than ``max_payload_bytes`` (the exact
                           BSON size check happens in the executor, same reason code), or
                           larger than 16 MiB (never parsed)
``unknown_aggregate_type`` ``aggregate_type`` is not in the registry
``unknown_message_type``   the aggregate type has no handler for ``type``
``invalid_cloudevent``     a binary-mode CloudEvent (Kafka header ``ce_specversion``)
                           without a record value or whose value is not JSON
========================== ==============================================================

CloudEvents (docs/design.md "CloudEvents"): a record with the Kafka header
``ce_specversion`` (binary content mode: the attributes in headers, :data:`CE_HEADER_COLUMN`,
the payload as the value) or a JSON object with the key ``specversion`` (structured mode)
is read through its attributes: ``id``, ``type``, ``subject``, ``aggregatetype``,
``source``/``sourceseq`` and ``time`` give the routing and ordering columns. The raw record
checks apply to it as to an envelope; the envelope checks do not — the executor decodes
every CloudEvent (:mod:`aggregates.wire.cloudevents`) and names what is wrong
(``invalid_cloudevent``, or the envelope's own codes).

Rows that pass get the full :meth:`aggregates.message.envelope.Message.from_dict` check in the
executor (the same code every other entry point uses: unknown fields, ``occurred_at``,
``source``, headers, string rules, payload key names, BSON size; common valid envelopes are
proven to pass it by :func:`spark.messages.fast_message`, built identically, without running
it); a failure there is a dead letter with the same reason codes and the same detail texts
(e.g. a numeric ``occurred_at`` outside :data:`~aggregates.message.envelope.MIN_EPOCH_MILLIS` …
:data:`~aggregates.message.envelope.MAX_EPOCH_MILLIS`, a lone surrogate escape in a string field).
Every Spark expression here is total: it yields NULL, never an error, for any input, and
recursive ones (parsing, ``schema_of_variant``, ``to_json``) only see records that passed
the size and depth checks. Checking everything twice would
cost more than it saves (measured: ~30 variant expressions per row doubled the Spark time of
the job). Nothing is filtered out here: invalid rows travel on to the executor, which writes
them to the dead-letter collection and reports their outcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aggregates.core.reasons import Reason
from aggregates.domain.aggregate import Registry
from aggregates.message.envelope import MAX_EPOCH_MILLIS, MAX_RECORD_DEPTH, MIN_EPOCH_MILLIS
from spark.sources import CE_HEADER_COLUMN, CE_HEADER_TYPE, TRACE_HEADER_COLUMNS

__all__ = [
    "LONE_SURROGATE_DETAIL",
    "VALIDATED_COLUMNS",
    "RegistryInfo",
    "validate",
]

#: Detail of records Spark does not parse because a JSON escape spells a lone surrogate (the
#: VARIANT builder turns it into '?', and two keys that differ only there make it raise); the
#: executor replaces it with Message.from_dict's detail naming the field.
LONE_SURROGATE_DETAIL: Final = ("invalid message envelope: a string holds a lone surrogate "
                                "escape (\\ud800-\\udfff without its pair)")

#: Columns :func:`validate` returns.
VALIDATED_COLUMNS: Final = ("_raw", "_reason", "_detail", "_mid", "_atype", "_aid", "_stype",
                            "_sid", "_seq", "_ts", "_src", "_o1", "_o2", "_mtype")

#: Slack over ``max_payload_bytes`` before Spark rejects a record by its text size (JSON text
#: and BSON sizes differ; the executor checks the payload's BSON size exactly).
_SIZE_SLACK_FACTOR: Final = 2
_SIZE_SLACK_BYTES: Final = 64 * 1024
#: Records larger than this are never parsed: Spark's VARIANT holds at most 16 MiB, and
#: MongoDB could not store such a message anyway.
_MAX_RECORD_BYTES: Final = 16 * 1024 * 1024

#: SQL: whether ``_raw`` has a JSON escape of a lone surrogate (escaped backslashes removed
#: first); only searched when ``_raw`` has a ``\u`` escape at all.
_LONE_SURROGATE: Final = (
    r"""instr(_raw, '\\u') > 0 AND replace(_raw, '\\\\', '') RLIKE """
    r"""'\\\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\\\u[dD][c-fC-F][0-9a-fA-F]{2})"""
    r"""|(?<!\\\\u[dD][89abAB][0-9a-fA-F]{2})\\\\u[dD][c-fC-F][0-9a-fA-F]{2}'"""
)

#: SQL: the nesting depth of ``_raw`` counted on brackets outside strings, without recursion
#: (escaped backslashes and quotes removed, then strings, then everything but brackets; a
#: fold over the brackets left). Only computed when ``_raw`` has more opening brackets than
#: the limit (else the count bounds the depth).
_DEPTH_SCAN: Final = (
    r"""aggregate(split(regexp_replace(regexp_replace(replace(replace(_raw, '\\\\', ''), """
    r"""'\\"', ''), '"[^"]*"', ''), '[^\\[\\]{}]', ''), ''), """
    "named_struct('d', 0, 'm', 0), (acc, c) -> named_struct("
    "'d', acc.d + CASE WHEN c IN ('[', '{') THEN 1 WHEN c = '' THEN 0 ELSE -1 END, "
    "'m', greatest(acc.m, acc.d + CASE WHEN c IN ('[', '{') THEN 1 ELSE 0 END)), "
    "acc -> acc.m)"
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


def _kind(t: str) -> str:
    """SQL: the Python type name (as in EnvelopeError details) of a variant type string."""
    return (
        f"CASE WHEN {t} = 'VOID' THEN 'null' WHEN {t} = 'STRING' THEN 'str' "
        f"WHEN {t} = 'BOOLEAN' THEN 'bool' "
        f"WHEN {t} IN ('BIGINT', 'INT', 'SMALLINT', 'TINYINT') THEN 'int' "
        f"WHEN {t} LIKE 'DECIMAL%' OR {t} IN ('DOUBLE', 'FLOAT') THEN 'float' "
        f"WHEN {t} LIKE 'OBJECT%' THEN 'dict' WHEN {t} LIKE 'ARRAY%' THEN 'list' "
        f"ELSE lower({t}) END"
    )


def _bad(field: str, reason_sql: str) -> str:
    """SQL: the detail text of an EnvelopeError for ``field``."""
    return f"concat('invalid message envelope: field ', {_lit(repr(field))}, ': ', {reason_sql})"


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


def _projections(info: RegistryInfo, max_payload_bytes: int, extra: Sequence[str] = ()
                 ) -> tuple[list[list[str]], _Checks]:
    """The projections to apply in turn (each may use the previous one's columns) and the
    checks."""
    return _projection_columns(extra), _checks(info, max_payload_bytes)


def _projection_columns(extra: Sequence[str] = ()) -> list[list[str]]:
    """The columns the checks use, in four projections (each may use the previous one's);
    ``extra`` input columns are passed through."""
    # Encoding, size and depth are decided on the raw text; only records that pass are
    # parsed (a deep record would overflow the recursive VARIANT code, one over 16 MiB its
    # limit). Too large records under 16 MiB are parsed for their ids (outcome rows).
    pre = ["_raw", "_src", "_o1", "_o2", *extra, "octet_length(_raw) AS _size",
           "coalesce(NOT is_valid_utf8(_raw), false) AS _bad_utf8",
           f"coalesce({_LONE_SURROGATE}, false) AS _surrogate",
           f"{CE_HEADER_COLUMN} IS NOT NULL AS _ce_bin",
           *[f"{_ce_header(name)} AS _ceh_{name}" for name in _CE_ATTRIBUTES]]
    first = ["*",
             f"CASE WHEN _bad_utf8 OR _size > {_MAX_RECORD_BYTES} THEN 0 "
             f"WHEN length(_raw) - length(translate(_raw, '[{{', '')) <= {MAX_RECORD_DEPTH} "
             f"THEN 0 ELSE {_DEPTH_SCAN} END AS _depth"]
    parse = ["*", "CASE WHEN NOT _bad_utf8 AND NOT _surrogate AND "
                   f"_size <= {_MAX_RECORD_BYTES} AND _depth <= {MAX_RECORD_DEPTH} "
                   "THEN try_parse_json(_raw) END AS _v"]
    is_object = "substr(trim(LEADING ' \\t\\r\\n' FROM _raw), 1, 1) = '{'"
    # CloudEvents: binary mode (_ce_bin) or structured mode (_ce_struct); _ce_src is the
    # 'source' attribute and _ce_seq 'sourceseq'.
    ce = ["*", f"{is_object} AS _is_object",
          f"NOT _ce_bin AND {is_object} AND "
          "schema_of_variant(variant_get(_v, '$.specversion')) IS NOT NULL AS _ce_struct"]
    ce2 = ["*", "_ce_bin OR _ce_struct AS _ce",
           "CASE WHEN _ce_bin THEN _ceh_source WHEN _ce_struct THEN "
           "try_variant_get(_v, '$.source', 'string') END AS _ce_src",
           "CASE WHEN _ce_bin THEN try_cast(_ceh_sourceseq AS BIGINT) WHEN _ce_struct THEN "
           "try_variant_get(_v, '$.sourceseq', 'bigint') END AS _ce_seq"]
    second = ["*"]
    for name, attr in _CE_FIELDS.items():
        second.append(
            f"CASE WHEN _ce_bin THEN CASE WHEN _ceh_{attr} IS NOT NULL THEN 'STRING' END "
            f"WHEN _ce_struct THEN schema_of_variant(variant_get(_v, '$.{attr}')) "
            f"ELSE schema_of_variant(variant_get(_v, '$.{name}')) END AS _t_{name}")
        second.append(
            f"CASE WHEN _ce_bin THEN _ceh_{attr} "
            f"WHEN _ce_struct THEN try_variant_get(_v, '$.{attr}', 'string') "
            f"ELSE try_variant_get(_v, '$.{name}', 'string') END AS _s_{name}")
    # The source segments of /aggbox/<type>/<id>, percent-decoded (aggregates.wire.cloudevents).
    segments = ("CASE WHEN startswith(_ce_src, '/aggbox/') THEN "
                "split(substr(_ce_src, 9), '/') END")
    second += [
        "schema_of_variant(variant_get(_v, '$.payload')) AS _t_payload",
        f"CASE WHEN _ce THEN try_url_decode(try_element_at({segments}, 1)) "
        "ELSE try_variant_get(_v, '$.source.type', 'string') END AS _source_type",
        f"CASE WHEN _ce THEN try_url_decode(try_element_at({segments}, 2)) "
        "ELSE try_variant_get(_v, '$.source.id', 'string') END AS _source_id",
        "CASE WHEN _ce THEN _ce_seq "
        "ELSE try_variant_get(_v, '$.source.seq', 'bigint') END AS _source_seq",
        "CASE WHEN _ce_bin THEN _ceh_time WHEN _ce_struct THEN "
        "try_variant_get(_v, '$.time', 'string') "
        "ELSE try_variant_get(_v, '$.occurred_at', 'string') END AS _s_occurred_at",
        "CASE WHEN NOT _ce THEN try_variant_get(_v, '$.occurred_at', 'double') "
        "END AS _d_occurred_at",
    ]
    return [pre, first, parse, ce, ce2, second]


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
    """The checks, first match wins: the raw record, the envelope, then routing."""
    size_limit = _MAX_RECORD_BYTES
    if max_payload_bytes:
        size_limit = min(size_limit, max_payload_bytes * _SIZE_SLACK_FACTOR + _SIZE_SLACK_BYTES)
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
    c.add(f"_depth > {MAX_RECORD_DEPTH}", Reason.PAYLOAD_TOO_DEEP,
          f"concat('the record nests arrays/objects ', _depth, ' levels deep; at most "
          f"{MAX_RECORD_DEPTH} are accepted (the envelope, the payload and "
          f"{MAX_RECORD_DEPTH - 2} levels in it): flatten the payload')")
    c.add("_surrogate", Reason.INVALID_ENVELOPE, _lit(LONE_SURROGATE_DETAIL))
    c.add("_ce_bin AND _v IS NULL", Reason.INVALID_CLOUDEVENT,
          _ce_bad("data", "the record value is not valid JSON"))
    c.add("_v IS NULL", Reason.INVALID_JSON,
          "'not valid JSON (truncated or malformed record); fix the producer'")
    # The envelope checks; a CloudEvent is checked by the executor (the detail names the
    # attribute), only routed here.
    c.add("NOT _ce AND NOT _is_object", Reason.INVALID_ENVELOPE,
          _bad("<envelope>", "concat('expected a JSON object, got ', "
                             f"{_kind('schema_of_variant(_v)')})"))
    c.add("NOT _ce AND (_t_payload IS NULL OR _t_payload = 'VOID')", Reason.INVALID_ENVELOPE,
          _bad("payload", "'is required'"))
    c.add("NOT _ce AND _t_payload NOT LIKE 'OBJECT%'", Reason.INVALID_ENVELOPE,
          _bad("payload", f"concat('must be a JSON object, got ', {_kind('_t_payload')})"))
    for name in ("message_id", "type", "aggregate_type", "aggregate_id"):
        t = f"_t_{name}"
        c.add(f"NOT _ce AND ({t} IS NULL OR {t} = 'VOID')", Reason.INVALID_ENVELOPE,
              _bad(name, "'is required'"))
        c.add(f"NOT _ce AND {t} <> 'STRING'", Reason.INVALID_ENVELOPE,
              _bad(name, f"concat('must be a string, got ', {_kind(t)})"))
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
    """Add ``_reason``/``_detail`` (NULL for valid rows), the routing columns ``_mid``,
    ``_atype``, ``_aid``, the message type ``_mtype`` (for the outcome rows) and the ordering
    columns ``_stype``, ``_sid``, ``_seq`` (source type,
    id, seq) and ``_ts`` (occurred_at). Returns exactly :data:`VALIDATED_COLUMNS`, plus
    the :data:`spark.sources.TRACE_HEADER_COLUMNS` and :data:`~spark.sources.CE_HEADER_COLUMN` the
    input has (Kafka), passed through."""
    extra = [c for c in (*TRACE_HEADER_COLUMNS, CE_HEADER_COLUMN) if c in df.columns]
    if CE_HEADER_COLUMN not in df.columns:  # files: no record headers
        df = df.selectExpr("*", f"CAST(NULL AS {CE_HEADER_TYPE}) AS {CE_HEADER_COLUMN}")
    stages, checks = _projections(info, max_payload_bytes, extra)
    parsed = df
    for stage in stages:
        parsed = parsed.selectExpr(*stage)
    checked = parsed.selectExpr("*", f"{checks.index()} AS _check")
    return checked.selectExpr(
        "_raw",
        f"{checks.reason('_check')} AS _reason",
        f"{checks.detail('_check')} AS _detail",
        "CASE WHEN _t_message_id = 'STRING' THEN _s_message_id END AS _mid",
        "CASE WHEN _t_aggregate_type = 'STRING' THEN _s_aggregate_type END AS _atype",
        "CASE WHEN _t_aggregate_id = 'STRING' THEN _s_aggregate_id END AS _aid",
        "_source_type AS _stype",
        "_source_id AS _sid",
        "_source_seq AS _seq",
        # occurred_at: epoch milliseconds (a number) or ISO-8601 text; unparsable: NULL here,
        # a dead letter in the executor.
        # Numbers outside MIN_EPOCH_MILLIS..MAX_EPOCH_MILLIS (epoch ns, 1e300) are NULL here
        # (CAST would overflow and fail the job) and a dead letter in the executor.
        "CASE WHEN _d_occurred_at IS NOT NULL AND NOT startswith(to_json(variant_get(_v, "
        "'$.occurred_at')), '\"') THEN CASE WHEN _d_occurred_at BETWEEN "
        f"{MIN_EPOCH_MILLIS} AND {MAX_EPOCH_MILLIS} THEN "
        "timestamp_millis(CAST(_d_occurred_at AS BIGINT)) END "
        "ELSE try_cast(_s_occurred_at AS TIMESTAMP) END AS _ts",
        "_src", "_o1", "_o2",
        "CASE WHEN _t_type = 'STRING' THEN _s_type END AS _mtype",
        *extra,
    )
