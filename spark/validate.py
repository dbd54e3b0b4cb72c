"""Validation in Spark SQL: every input record gets a reason code (``_reason``) or ``NULL``.

Input: a DataFrame with the raw record text ``_raw`` and its position (``_src``, ``_o1``,
``_o2``; see :mod:`spark.sources`). The record is parsed once into a VARIANT; Spark checks
what routing and ordering need, before the shuffle:

========================== ==============================================================
reason                     when
========================== ==============================================================
``invalid_json``           the record is not JSON (or empty)
``invalid_envelope``       not a JSON object; ``message_id``, ``type``, ``aggregate_type``,
                           ``aggregate_id`` or ``payload`` missing or mistyped (the detail
                           names the field)
``payload_too_large``      the record is far larger than ``max_payload_bytes`` (the exact
                           BSON size check happens in the executor, same reason code)
``unknown_aggregate_type`` ``aggregate_type`` is not in the registry
``unknown_message_type``   the aggregate type has no handler for ``type``
========================== ==============================================================

Rows that pass get the full :meth:`aggregates.envelope.Message.from_dict` check in the
executor (the same code every other entry point uses: unknown fields, ``occurred_at``,
``source``, headers, string rules, payload key names, BSON size); a failure there is a dead
letter with the same reason codes and the same detail texts. Checking everything twice would
cost more than it saves (measured: ~30 variant expressions per row doubled the Spark time of
the job). Nothing is filtered out here: invalid rows travel on to the executor, which writes
them to the dead-letter collection and reports their outcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aggregates import outcomes as oc
from aggregates.aggregate import Registry

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
VALIDATED_COLUMNS: Final = ("_raw", "_reason", "_detail", "_mid", "_atype", "_aid", "_stype",
                            "_sid", "_seq", "_ts", "_src", "_o1", "_o2")

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


def _projections(info: RegistryInfo, max_payload_bytes: int
                 ) -> tuple[list[str], list[str], _Checks]:
    first = ["_raw", "_src", "_o1", "_o2", "try_parse_json(_raw) AS _v"]
    second = ["*", "substr(ltrim(_raw), 1, 1) = '{' AS _is_object"]
    for name in ("message_id", "type", "aggregate_type", "aggregate_id"):
        second.append(f"schema_of_variant(variant_get(_v, '$.{name}')) AS _t_{name}")
        second.append(f"try_variant_get(_v, '$.{name}', 'string') AS _s_{name}")
    second += [
        "schema_of_variant(variant_get(_v, '$.payload')) AS _t_payload",
        "try_variant_get(_v, '$.source.type', 'string') AS _source_type",
        "try_variant_get(_v, '$.source.id', 'string') AS _source_id",
        "try_variant_get(_v, '$.source.seq', 'bigint') AS _source_seq",
        "try_variant_get(_v, '$.occurred_at', 'string') AS _s_occurred_at",
        "try_variant_get(_v, '$.occurred_at', 'double') AS _d_occurred_at",
    ]
    c = _Checks()
    c.add("_raw IS NULL", INVALID_JSON, "'empty record (no value)'")
    c.add("_v IS NULL", INVALID_JSON,
          "'not valid JSON (truncated or malformed record); fix the producer'")
    c.add("NOT _is_object", oc.INVALID_ENVELOPE,
          _bad("<envelope>", "concat('expected a JSON object, got ', "
                             f"{_kind('schema_of_variant(_v)')})"))
    if max_payload_bytes:
        limit = max_payload_bytes * _SIZE_SLACK_FACTOR + _SIZE_SLACK_BYTES
        c.add(f"octet_length(_raw) > {limit}", PAYLOAD_TOO_LARGE,
              f"concat('the record is ', octet_length(_raw), ' bytes; payloads are limited to "
              f"{max_payload_bytes} bytes (BSON): split the message or raise "
              "max_payload_bytes')")
    c.add("_t_payload IS NULL OR _t_payload = 'VOID'", oc.INVALID_ENVELOPE,
          _bad("payload", "'is required'"))
    c.add("_t_payload NOT LIKE 'OBJECT%'", oc.INVALID_ENVELOPE,
          _bad("payload", f"concat('must be a JSON object, got ', {_kind('_t_payload')})"))
    for name in ("message_id", "type", "aggregate_type", "aggregate_id"):
        t = f"_t_{name}"
        c.add(f"{t} IS NULL OR {t} = 'VOID'", oc.INVALID_ENVELOPE, _bad(name, "'is required'"))
        c.add(f"{t} <> 'STRING'", oc.INVALID_ENVELOPE,
              _bad(name, f"concat('must be a string, got ', {_kind(t)})"))
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
    return first, second, c


def _unknown_aggregate_detail(names: list[str]) -> str:
    listed = _lit(repr(names))
    return (f"concat('unknown aggregate type \\'', _s_aggregate_type, '\\'; registered types: ', "
            f"{listed}, '. Register it with Registry.register(...) or pass the module that "
            "defines it (--aggregates).')")


def validate(df: Any, info: RegistryInfo, *, max_payload_bytes: int) -> Any:
    """Add ``_reason``/``_detail`` (NULL for valid rows), the routing columns ``_mid``,
    ``_atype``, ``_aid`` and the ordering columns ``_stype``, ``_sid``, ``_seq`` (source type,
    id, seq) and ``_ts`` (occurred_at). Returns exactly :data:`VALIDATED_COLUMNS`."""
    first, second, checks = _projections(info, max_payload_bytes)
    parsed = df.selectExpr(*first).selectExpr(*second)
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
        "CASE WHEN _d_occurred_at IS NOT NULL AND NOT startswith(to_json(variant_get(_v, "
        "'$.occurred_at')), '\"') THEN timestamp_millis(CAST(_d_occurred_at AS BIGINT)) "
        "ELSE try_cast(_s_occurred_at AS TIMESTAMP) END AS _ts",
        "_src", "_o1", "_o2",
    )
