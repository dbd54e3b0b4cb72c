"""Validation in Spark SQL: every input record gets a reason code (``_reason``) or ``NULL``.

Input: a DataFrame with the raw record text ``_raw`` and its position (``_src``, ``_o1``,
``_o2``; see :mod:`spark.sources`). The record is parsed once into a VARIANT and checked
against the envelope (:data:`aggregates.envelope.ENVELOPE_FIELDS`) and the registry:

========================  ================================================================
reason                    when
========================  ================================================================
``invalid_json``          the record is not JSON (or empty)
``invalid_envelope``      not an object, unknown field, missing or mistyped field, bad
                          ``occurred_at``/``source``; the detail names the field
``payload_too_large``     the record is far larger than ``max_payload_bytes`` (the exact
                          BSON size check happens in the executor, same reason code)
``unknown_aggregate_type`` ``aggregate_type`` is not in the registry
``unknown_message_type``  the aggregate type has no handler for ``type``
========================  ================================================================

Rows that pass still get the full :meth:`aggregates.envelope.Message.from_dict` check in the
executor (string rules, header values, payload key names, BSON size); a failure there is a
dead letter with the same reason codes. Nothing is filtered out here: invalid rows travel on
to the executor, which writes them to the dead-letter collection and reports their outcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aggregates import outcomes as oc
from aggregates.aggregate import Registry
from aggregates.envelope import ENVELOPE_FIELDS, MAX_ID_LENGTH

__all__ = [
    "INVALID_JSON",
    "PAYLOAD_TOO_LARGE",
    "VALIDATED_COLUMNS",
    "RegistryInfo",
    "validate",
]

INVALID_JSON: Final = "invalid_json"
PAYLOAD_TOO_LARGE: Final = "payload_too_large"

#: Columns :func:`validate` returns.
VALIDATED_COLUMNS: Final = ("_raw", "_reason", "_detail", "_mid", "_atype", "_aid", "_seq",
                            "_ts", "_src", "_o1", "_o2")

#: Slack over ``max_payload_bytes`` before Spark rejects a record by its text size (JSON text
#: and BSON sizes differ; the executor checks the payload's BSON size exactly).
_SIZE_SLACK_FACTOR: Final = 2
_SIZE_SLACK_BYTES: Final = 64 * 1024


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

    def string_field(self, name: str, *, required: bool) -> None:
        t, s = f"_t_{name.replace('.', '_')}", f"_s_{name.replace('.', '_')}"
        if required:
            self.add(f"{t} IS NULL OR {t} = 'VOID'", oc.INVALID_ENVELOPE,
                     _bad(name, "'is required'"))
        not_null = f"{t} IS NOT NULL AND {t} <> 'VOID'"
        self.add(f"{not_null} AND {t} <> 'STRING'", oc.INVALID_ENVELOPE,
                 _bad(name, f"concat('must be a string, got ', {_kind(t)})"))
        self.add(f"{t} = 'STRING' AND (length({s}) = 0 OR {s} RLIKE '^\\\\s|\\\\s$')",
                 oc.INVALID_ENVELOPE,
                 _bad(name, "'must be non-empty without surrounding white space'"))
        self.add(f"{t} = 'STRING' AND length({s}) > {MAX_ID_LENGTH}", oc.INVALID_ENVELOPE,
                 _bad(name, f"'longer than {MAX_ID_LENGTH} characters'"))

    def case(self, pick: int) -> str:
        """``CASE`` returning element ``pick`` (1 = reason, 2 = detail) of the first match."""
        whens = " ".join(
            f"WHEN {cond} THEN {_lit(reason) if pick == 1 else detail}"
            for cond, reason, detail in self.items
        )
        return f"CASE {whens} ELSE NULL END"


def _projections(info: RegistryInfo, max_payload_bytes: int
                 ) -> tuple[list[str], list[str], _Checks]:
    cols = [
        "_raw", "_src", "_o1", "_o2",
        "try_parse_json(_raw) AS _v",
        "try(json_object_keys(_raw)) AS _keys",
    ]
    typed = ["message_id", "type", "aggregate_type", "aggregate_id", "correlation_id",
             "causation_id"]
    second = ["*"]
    for name in typed:
        second.append(f"schema_of_variant(variant_get(_v, '$.{name}')) AS _t_{name}")
        second.append(f"try_variant_get(_v, '$.{name}', 'string') AS _s_{name}")
    for name, path in (("payload", "$.payload"), ("occurred_at", "$.occurred_at"),
                       ("headers", "$.headers"), ("source", "$.source"),
                       ("source_type", "$.source.type"), ("source_id", "$.source.id"),
                       ("source_seq", "$.source.seq")):
        second.append(f"schema_of_variant(variant_get(_v, '{path}')) AS _t_{name}")
    second += [
        "try_variant_get(_v, '$.source.type', 'string') AS _s_source_type",
        "try_variant_get(_v, '$.source.id', 'string') AS _s_source_id",
        "try_variant_get(_v, '$.source.seq', 'double') AS _d_source_seq",
        "try_variant_get(_v, '$.occurred_at', 'string') AS _s_occurred_at",
        "try_variant_get(_v, '$.occurred_at', 'double') AS _d_occurred_at",
        "schema_of_variant(_v) AS _t_root",
    ]
    c = _Checks()
    c.add("_raw IS NULL", INVALID_JSON, "'empty record (no value)'")
    c.add("_v IS NULL", INVALID_JSON,
          "'not valid JSON (truncated or malformed record); fix the producer'")
    c.add("_t_root NOT LIKE 'OBJECT%'", oc.INVALID_ENVELOPE,
          _bad("<envelope>", f"concat('expected a JSON object, got ', {_kind('_t_root')})"))
    known = ", ".join(_lit(k) for k in ENVELOPE_FIELDS)
    c.add(f"size(array_except(_keys, array({known}))) > 0", oc.INVALID_ENVELOPE,
          f"concat('invalid message envelope: field ', "
          f"concat('\\'', array_min(array_except(_keys, array({known}))), '\\''), "
          "': unknown envelope field')")
    limit = max_payload_bytes * _SIZE_SLACK_FACTOR + _SIZE_SLACK_BYTES
    if max_payload_bytes:
        c.add(f"octet_length(_raw) > {limit}", PAYLOAD_TOO_LARGE,
              f"concat('the record is ', octet_length(_raw), ' bytes; payloads are limited to "
              f"{max_payload_bytes} bytes (BSON): split the message or raise "
              "max_payload_bytes')")
    c.add("_t_payload IS NULL OR _t_payload = 'VOID'", oc.INVALID_ENVELOPE,
          _bad("payload", "'is required'"))
    c.add("_t_payload NOT LIKE 'OBJECT%'", oc.INVALID_ENVELOPE,
          _bad("payload", f"concat('must be a JSON object, got ', {_kind('_t_payload')})"))
    for name in ("message_id", "type", "aggregate_type", "aggregate_id"):
        c.string_field(name, required=True)
    # occurred_at: optional; ISO-8601 text or epoch milliseconds.
    c.add("_t_occurred_at IS NOT NULL AND _t_occurred_at NOT IN ('VOID', 'STRING') AND "
          "_d_occurred_at IS NULL", oc.INVALID_ENVELOPE,
          _bad("occurred_at",
               f"concat('must be an ISO-8601 string, got ', {_kind('_t_occurred_at')})"))
    c.add("_t_occurred_at = 'STRING' AND try_cast(_s_occurred_at AS TIMESTAMP) IS NULL",
          oc.INVALID_ENVELOPE,
          _bad("occurred_at", "concat('not an ISO-8601 time: \\'', _s_occurred_at, '\\'')"))
    # source: optional {type, id, seq ≥ 1}.
    src_present = "_t_source IS NOT NULL AND _t_source <> 'VOID'"
    c.add(f"{src_present} AND _t_source NOT LIKE 'OBJECT%'", oc.INVALID_ENVELOPE,
          _bad("source", f"concat('must be an object {{type, id, seq}}, got ', "
                         f"{_kind('_t_source')})"))
    c.add(f"{src_present} AND (_d_source_seq IS NULL OR _d_source_seq < 1 OR "
          "_d_source_seq <> floor(_d_source_seq) OR _t_source_seq IN ('BOOLEAN', 'STRING'))",
          oc.INVALID_ENVELOPE,
          _bad("source.seq", "concat('must be an integer ≥ 1, got ', "
                             "coalesce(to_json(variant_get(_v, '$.source.seq')), 'None'))"))
    for sub in ("type", "id"):
        t = f"_t_source_{sub}"
        c.add(f"{src_present} AND ({t} IS NULL OR {t} = 'VOID')", oc.INVALID_ENVELOPE,
              _bad(f"source.{sub}", "'is required'"))
        c.add(f"{src_present} AND {t} <> 'STRING'", oc.INVALID_ENVELOPE,
              _bad(f"source.{sub}", f"concat('must be a string, got ', {_kind(t)})"))
    for name in ("correlation_id", "causation_id"):
        c.string_field(name, required=False)
    c.add("_t_headers IS NOT NULL AND _t_headers <> 'VOID' AND _t_headers NOT LIKE 'OBJECT%'",
          oc.INVALID_ENVELOPE, _bad("headers", "'must be an object of string → string'"))
    # Routing: the aggregate type must be registered and handle the message type.
    names = sorted(info.types)
    known_types = ", ".join(_lit(n) for n in names) or "CAST(NULL AS STRING)"
    c.add(f"NOT array_contains(array({known_types}), _s_aggregate_type)",
          oc.UNKNOWN_AGGREGATE_TYPE, _unknown_aggregate_detail(names))
    pairs = ", ".join(
        f"{_lit(n)}, array({', '.join(_lit(m) for m in info.types[n]) or 'CAST(NULL AS STRING)'})"
        for n in names
    )
    handled = f"element_at(map({pairs}), _s_aggregate_type)" if names else "array()"
    c.add(f"NOT coalesce(array_contains({handled}, _s_type), false)", oc.UNKNOWN_MESSAGE_TYPE,
          f"concat('aggregate type \\'', _s_aggregate_type, '\\' has no handler for message "
          f"type \\'', _s_type, '\\'; it handles ', "
          f"concat('[', array_join(transform(array_sort({handled}), x -> concat('\\'', x, "
          f"'\\'')), ', '), ']'), '. Add a handler with @<your AggregateType>.handles(\\'', "
          "_s_type, '\\').')")
    return cols, second, c


def _unknown_aggregate_detail(names: list[str]) -> str:
    listed = _lit(repr(names))
    return (f"concat('unknown aggregate type \\'', _s_aggregate_type, '\\'; registered types: ', "
            f"{listed}, '. Register it with Registry.register(...) or pass the module that "
            "defines it (--aggregates).')")


def validate(df: Any, info: RegistryInfo, *, max_payload_bytes: int) -> Any:
    """Add ``_reason``/``_detail`` (NULL for valid rows), the routing columns ``_mid``,
    ``_atype``, ``_aid`` and the ordering columns ``_seq`` (source seq) and ``_ts``
    (occurred_at). Returns exactly :data:`VALIDATED_COLUMNS`."""
    first, second, checks = _projections(info, max_payload_bytes)
    parsed = df.selectExpr(*first).selectExpr(*second)
    return parsed.selectExpr(
        "_raw",
        f"{checks.case(1)} AS _reason",
        f"{checks.case(2)} AS _detail",
        "CASE WHEN _t_message_id = 'STRING' THEN _s_message_id END AS _mid",
        "CASE WHEN _t_aggregate_type = 'STRING' THEN _s_aggregate_type END AS _atype",
        "CASE WHEN _t_aggregate_id = 'STRING' THEN _s_aggregate_id END AS _aid",
        "CASE WHEN _d_source_seq IS NOT NULL THEN CAST(_d_source_seq AS BIGINT) END AS _seq",
        "CASE WHEN _t_occurred_at = 'STRING' THEN try_cast(_s_occurred_at AS TIMESTAMP) "
        "WHEN _d_occurred_at IS NOT NULL THEN timestamp_millis(CAST(_d_occurred_at AS BIGINT)) "
        "END AS _ts",
        "_src", "_o1", "_o2",
    )
