"""Readers: every input becomes rows of raw record text ``_raw`` and its position.

Position columns, the last tie-breaker when an aggregate's messages are ordered
(docs/design.md "Order"):

- files: ``_src`` = file path, ``_o1`` = byte offset of the split (JSON Lines) or row index
  (Parquet), ``_o2`` = line order within the split — i.e. files in path order, records in
  file order;
- Kafka: ``_src`` = topic, ``_o1`` = partition, ``_o2`` = offset.

A Kafka stream also has the nullable columns :data:`TRACE_HEADER_COLUMNS`: the record's
``traceparent`` and ``tracestate`` *Kafka record headers* (only these two), which the executor
adds to the envelope's ``headers`` unless the envelope has its own trace context
(:func:`spark.messages.with_record_trace`). A Kafka stream also has
:data:`CE_HEADER_COLUMN`: for a CloudEvent in binary content mode (a record with the header
``ce_specversion``) its ``ce_*``, ``content-type``, ``traceparent`` and ``tracestate`` headers
as they are (key, bytes), NULL for any other record (docs/design.md "CloudEvents").

Blank lines in JSON Lines files are not records (Spark's JSON reader skips them too); every
other line is one record, valid or not, whatever its bytes. A byte-order mark (U+FEFF) at the
start of any line (or Kafka record) is dropped: Hadoop's reader drops one at the start of a
file, so the same rule holds for concatenated files. A line holding only a BOM is blank.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from aggregates.core.errors import ConfigurationError
from spark.settings import InputFormat

__all__ = [
    "CE_HEADER_COLUMN",
    "TRACE_HEADER_COLUMNS",
    "DirectorySource",
    "KafkaSource",
    "StreamSource",
    "add_line_order",
    "detect_format",
    "read_batch",
    "read_stream",
]


#: The Kafka record headers carried (``traceparent``, ``tracestate``), as nullable string
#: columns next to ``_raw``; only Kafka streams have them.
TRACE_HEADER_COLUMNS: Final = ("_h_traceparent", "_h_tracestate")
#: The longest record-header value carried, in bytes (tracecontext's tracestate limit).
_MAX_TRACE_HEADER_BYTES: Final = 512
#: The headers of a binary-mode CloudEvent (``array<struct<key: string, value: binary>>``),
#: NULL for other records; only Kafka streams have it.
CE_HEADER_COLUMN: Final = "_h_ce"
#: SQL: :data:`CE_HEADER_COLUMN` of a Kafka source row.
_CE_HEADERS: Final = (
    "CASE WHEN exists(headers, h -> lower(h.key) = 'ce_specversion') THEN "
    "filter(headers, h -> startswith(lower(h.key), 'ce_') OR "
    "lower(h.key) IN ('content-type', 'traceparent', 'tracestate')) END")
#: Its type, for sources without headers.
CE_HEADER_TYPE: Final = "array<struct<key: string, value: binary>>"


def _record_header(name: str) -> Any:
    """The Kafka record header ``name`` as text, or NULL: absent, repeated (the W3C spec
    makes a repeated traceparent invalid), longer than 512 bytes, not valid UTF-8, or not
    printable ASCII (all that traceparent and tracestate may hold). Its shape is checked
    in the executor by :func:`aggregates.core.tracecontext.trace_headers`."""
    from pyspark.sql import functions as F

    # try_element_at: under ANSI mode Spark may evaluate every operand of AND (no
    # short-circuit), and element_at of an empty array would fail the query.
    found = f"filter(headers, h -> h.key = '{name}')"
    value = f"try_element_at({found}, 1).value"
    text = f"CAST({value} AS STRING)"
    return F.expr(
        f"CASE WHEN coalesce(size({found}), 0) = 1 "
        f"AND coalesce(octet_length({value}) <= {_MAX_TRACE_HEADER_BYTES}, false) "
        f"AND coalesce(is_valid_utf8({text}), false) "
        f"THEN CASE WHEN {text} RLIKE '^[ -~]*$' THEN {text} END END")


def detect_format(path: str) -> str:
    """``parquet`` for ``*.parquet`` paths/globs and directories holding Parquet files,
    ``json`` (JSON Lines) otherwise."""
    p = path.rstrip("/")
    if p.endswith(".parquet") or p.endswith(".parq"):
        return "parquet"
    local = p[7:] if p.startswith("file://") else p
    if ("://" not in local and os.path.isdir(local)
            and (glob.glob(os.path.join(local, "*.parquet"))
                 or glob.glob(os.path.join(local, "*", "*.parquet")))):
        return "parquet"
    return "json"


def _without_bom(col: str) -> Any:
    """``col`` without a leading byte-order mark (U+FEFF)."""
    from pyspark.sql import functions as F

    c = F.col(col)
    return F.when(c.startswith("\ufeff"), F.expr(f"substr({col}, 2)")).otherwise(c)


def _json_lines(spark: Any, paths: Sequence[str]) -> Any:
    from pyspark.sql import functions as F

    df = spark.read.text(list(paths))
    return (
        df.where(F.trim(_without_bom("value")) != "")
        .select(
            _without_bom("value").alias("_raw"),
            F.col("_metadata.file_path").alias("_src"),
            F.col("_metadata.file_block_start").alias("_o1"),
            F.monotonically_increasing_id().alias("_o2"),
        )
    )


def _parquet(spark: Any, paths: Sequence[str]) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    df = spark.read.parquet(*paths)
    cols = []
    for f in df.schema.fields:
        col = F.col(f"`{f.name}`")
        if f.name == "payload" and isinstance(f.dataType, StringType):
            # Payload stored as JSON text (aggbox's own envelope schema): embed it as JSON.
            col = F.expr("try_parse_json(payload)")
        cols.append(col.alias(f.name))
    return df.select(
        F.to_json(F.struct(*cols)).alias("_raw"),
        F.col("_metadata.file_path").alias("_src"),
        F.col("_metadata.row_index").alias("_o1"),
        F.lit(0).cast("long").alias("_o2"),
    )


def read_batch(spark: Any, inputs: Sequence[str], *, input_format: InputFormat = "auto") -> Any:
    """Read files (paths, directories, globs) into ``_raw, _src, _o1, _o2``."""
    if not inputs:
        raise ConfigurationError("no input given; pass --input PATH (files, directories, globs)")
    groups: dict[str, list[str]] = {}
    for path in inputs:
        fmt = detect_format(path) if input_format == "auto" else input_format
        groups.setdefault(fmt, []).append(path)
    frames = [(_parquet if fmt == "parquet" else _json_lines)(spark, paths)
              for fmt, paths in sorted(groups.items())]
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


@dataclass(frozen=True, slots=True)
class KafkaSource:
    """A Kafka topic (or comma-separated topics) read with Spark's Kafka source."""

    bootstrap_servers: str
    topic: str
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DirectorySource:
    """A directory that receives JSON Lines files (new files are picked up once each)."""

    path: str
    max_files_per_trigger: int | None = None
    options: Mapping[str, str] = field(default_factory=dict)


StreamSource = KafkaSource | DirectorySource


def read_stream(spark: Any, source: StreamSource) -> Any:
    """A streaming DataFrame of ``_raw, _src, _o1`` (plus ``_o2`` and
    :data:`TRACE_HEADER_COLUMNS` for Kafka); for a directory :func:`add_line_order` adds
    ``_o2`` inside each micro-batch.

    Kafka record headers: the trace context travels as two extra columns to the executor,
    which merges it into the *decoded* envelope (:func:`spark.messages.with_record_trace`).
    ``_raw`` is never rewritten in SQL: a JSON round trip would change the bytes kept for
    dead letters (number spelling, duplicate keys, escapes) and could turn an invalid record
    into a valid one or the reverse; with separate columns every record keeps exactly its
    bytes and its one outcome."""
    from pyspark.sql import functions as F

    if isinstance(source, KafkaSource):
        reader = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", source.bootstrap_servers)
            .option("subscribe", source.topic)
            .option("startingOffsets", source.starting_offsets)
            .option("includeHeaders", "true")  # headers: array<struct<key, value: binary>>
        )
        if source.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(source.max_offsets_per_trigger))
        for k, v in source.options.items():
            reader = reader.option(k, v)
        df = reader.load()
        with_headers = "headers" in df.columns  # unless the options turned includeHeaders off
        return df.withColumn("value", F.col("value").cast("string")).select(
            _without_bom("value").alias("_raw"),
            F.col("topic").alias("_src"),
            F.col("partition").cast("long").alias("_o1"),
            F.col("offset").alias("_o2"),
            *[(_record_header(name) if with_headers else F.lit(None).cast("string")).alias(col)
              for name, col in zip(("traceparent", "tracestate"), TRACE_HEADER_COLUMNS,
                                   strict=True)],
            (F.expr(_CE_HEADERS) if with_headers else F.lit(None).cast(CE_HEADER_TYPE)
             ).alias(CE_HEADER_COLUMN),
        )
    reader = spark.readStream.format("text")
    if source.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(source.max_files_per_trigger))
    for k, v in source.options.items():
        reader = reader.option(k, v)
    df = reader.load(source.path)
    return df.where(F.trim(_without_bom("value")) != "").select(
        _without_bom("value").alias("_raw"),
        F.col("_metadata.file_path").alias("_src"),
        F.col("_metadata.file_block_start").alias("_o1"),
    )


def add_line_order(df: Any) -> Any:
    """Add ``_o2`` (record order within a file split) to a micro-batch that lacks it."""
    from pyspark.sql import functions as F

    if "_o2" in df.columns:
        return df
    return df.withColumn("_o2", F.monotonically_increasing_id())
