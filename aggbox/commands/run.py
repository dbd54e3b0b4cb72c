"""``aggbox run`` (batch) and ``aggbox stream`` (Structured Streaming).

Settings come from, highest first: command-line options, ``AGGBOX_*`` /
``AGGBOX_SPARK_*`` environment variables, the config file (``--config`` or
``$AGGBOX_CONFIG``; sections ``[aggbox]`` and ``[spark]``, see ``config/aggbox.toml``), the
documented defaults (flags from :mod:`aggbox.commands.options`). pyspark is imported only
when a command runs.

No MongoDB URI given (no ``--mongodb-uri``, ``AGGBOX_MONGODB_URI`` or config file setting):
the server of ``aggbox local start``, else a throw-away local server, resolved here once
(:func:`aggbox.servers.mongodb_uri`) and handed to the pipeline, which never starts one
itself (docs/design.md, "Layering").
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aggbox.commands.options import (
    SettingOption,
    add_setting_options,
    comma_list,
    key_values,
    overrides,
)
from aggbox.commands.run_summary import by_type_rows, count_arg, deployment_line, write_metrics
from aggbox.commands.run_summary import finish as _finish
from aggregates.core.errors import AggboxError, ConfigurationError
from aggregates.core.settings import AggboxSettings
from spark.settings import SparkSettings

__all__ = ["register", "run_command", "stream_command"]

_RUN_DESCRIPTION = """\
Apply message files to the aggregates in MongoDB, once, with Spark.

Input: JSON Lines (one envelope per line) and Parquet files, as paths, directories or globs.
Every record ends in exactly one outcome — applied, duplicate, dead_lettered (with a reason
code; the record is in the dead-letter collection) or parked — and the summary table shows
them. Running the same input again, even concurrently, is harmless: everything comes back as
duplicate (for inbox dedup: while it is younger than the dedup horizon, 7 days by default).

The aggregates module must be importable here and in every Spark executor: install it in the
cluster's Python environment, or ship it with --py-files (a .py, .zip or wheel), e.g.
  aggbox run --input 's3a://bucket/in/*.jsonl' --aggregates myteam.aggregates \\
             --py-files dist/myteam-1.0-py3-none-any.whl --master yarn
On a Spark Connect server (Databricks, or start-connect-server.sh) pass --remote
sc://HOST:PORT (or set SPARK_REMOTE) instead of --master.
"""

_STREAM_DESCRIPTION = """\
Apply a stream of messages with Structured Streaming (foreachBatch, same code path as
`aggbox run`): a Kafka topic (--kafka-bootstrap-servers + --topic) or a directory that
receives JSON Lines files (--directory).

A checkpoint directory (--checkpoint) is required: it records the Kafka offsets / files
already consumed, so a restart resumes where it stopped. Keep one checkpoint per stream;
deleting it replays the source, which is harmless (duplicates) but slow.

Triggers: availableNow (default: consume what is there in one or more micro-batches, then
exit) or an interval such as "10 seconds" (runs until Ctrl-C or --timeout).
"""

_EXIT_CODES = """\
exit status: 0 ok: every record applied, duplicate or parked (and no more dead-lettered than
--max-dead-letters allows); 1 the job failed (one line above, e.g. a handler that cannot
import a module: nothing was dead-lettered); 2 bad usage; 3 records were dead-lettered (or,
with --fail-on-dead-letters, parked): the summary lists them by reason. --json's "ok" is true
exactly when the status is 0.
"""

_A, _S = AggboxSettings, SparkSettings

_COMMON: list[SettingOption] = [
    SettingOption("--aggregates", _S, "aggregates", {"metavar": "MODULE"}),
    SettingOption("--mongodb-uri", _A, "mongodb_uri", {"metavar": "URI"}),
    SettingOption("--database", _A, "database", {"metavar": "NAME"}),
    SettingOption("--outcomes", _S, "outcomes_path", {"metavar": "DIR"}),
    SettingOption("--master", _S, "master", {"metavar": "MASTER"}),
    SettingOption("--remote", _S, "remote", {"metavar": "sc://HOST:PORT"}),
    SettingOption("--shuffle-partitions", _S, "shuffle_partitions",
                  {"type": int, "metavar": "N"}),
    SettingOption("--py-files", _S, "py_files", {"metavar": "FILE", "action": "append"},
                  comma_list),
    SettingOption("--conf", _S, "conf", {"metavar": "KEY=VALUE", "action": "append", "help":
                  "extra Spark configuration applied when aggbox creates the session, one "
                  "KEY=VALUE per option, e.g. --conf spark.executor.memory=4g (config file: "
                  "[spark] conf = {\"spark.executor.memory\" = \"4g\"})"}, key_values),
    SettingOption("--max-payload-bytes", _A, "max_payload_bytes",
                  {"type": int, "metavar": "BYTES"}),
]
_RUN: list[SettingOption] = [
    SettingOption("--format", _S, "input_format", {"choices": ["auto", "json", "parquet"]}),
]
_STREAM: list[SettingOption] = [
    SettingOption("--checkpoint", _S, "checkpoint_location", {"metavar": "DIR"}),
    SettingOption("--trigger", _S, "trigger", {"metavar": "TRIGGER"}),
    SettingOption("--max-offsets-per-trigger", _S, "max_offsets_per_trigger",
                  {"type": int, "metavar": "N"}),
    SettingOption("--max-files-per-trigger", _S, "max_files_per_trigger",
                  {"type": int, "metavar": "N"}),
    SettingOption("--starting-offsets", _S, "starting_offsets", {"metavar": "OFFSETS"}),
]
_ALL = [*_COMMON, *_RUN, *_STREAM]


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="TOML config file (sections [aggbox] and [spark]); default: "
                             "$AGGBOX_CONFIG")
    add_setting_options(parser, _COMMON)
    parser.add_argument("--no-progress", action="store_true",
                        help="no live progress display (it is also off when stderr is not a "
                             "terminal)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="show the running Spark stages under the messages bar")
    parser.add_argument("--json", action="store_true",
                        help="one JSON line on stdout, nothing else (the tables go to stderr)")
    tolerance = parser.add_mutually_exclusive_group()
    tolerance.add_argument("--max-dead-letters", type=count_arg, default=0, metavar="N",
                           help="the run is still ok (exit status 0) with up to N dead-lettered "
                                "records (default 0: any dead letter gives exit status 3)")
    tolerance.add_argument("--allow-dead-letters", action="store_true",
                           help="the run is ok however many records were dead-lettered")
    tolerance.add_argument("--fail-on-dead-letters", action="store_true",
                           help="exit with status 3 also when a record was parked")
    parser.add_argument("--metrics-file", metavar="PATH",
                        help="write outcome counts by aggregate type, message type, outcome "
                             "and reason to PATH in the Prometheus text format (atomically; "
                             "a stream rewrites it after each micro-batch with the totals so "
                             "far); push it with: curl --data-binary @PATH "
                             "http://pushgateway:9091/metrics/job/aggbox")


def register(subparsers: Any) -> None:
    """Add ``aggbox run`` and ``aggbox stream`` to the ``aggbox`` command."""
    run = subparsers.add_parser(
        "run", help="apply message files to the aggregates with Spark (batch)",
        description=_RUN_DESCRIPTION, epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--input", "-i", metavar="PATH", action="extend", nargs="+",
                     required=True,
                     help="input files, directories or globs (repeat or list several); "
                          "JSON Lines, or Parquet for *.parquet / directories of Parquet")
    add_setting_options(run, _RUN)
    _add_common(run)
    run.set_defaults(func=run_command)

    stream = subparsers.add_parser(
        "stream", help="apply a Kafka topic or a directory stream with Structured Streaming",
        description=_STREAM_DESCRIPTION, epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    src = stream.add_argument_group("source (Kafka or directory)")
    src.add_argument("--kafka-bootstrap-servers", metavar="HOST:PORT",
                     help="Kafka bootstrap servers (with --topic)")
    src.add_argument("--topic", metavar="TOPIC",
                     help="Kafka topic(s) to subscribe to, comma-separated")
    src.add_argument("--kafka-option", metavar="KEY=VALUE", action="append",
                     help="extra option of Spark's Kafka source, e.g. "
                          "kafka.security.protocol=SSL (repeatable)")
    src.add_argument("--directory", metavar="DIR",
                     help="directory receiving JSON Lines files (instead of Kafka)")
    add_setting_options(stream, _STREAM)
    stream.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="stop the stream after this long (default: availableNow runs "
                             "until the backlog is consumed, an interval trigger until Ctrl-C)")
    _add_common(stream)
    stream.set_defaults(func=stream_command)


# -- running ---------------------------------------------------------------------------------


class _Context:
    """Settings, console and session of one command."""

    def __init__(self, args: argparse.Namespace, *, kafka: bool) -> None:
        from rich.console import Console

        self.args = args
        self.settings = AggboxSettings.load(config_file=args.config,
                                            **overrides(args, AggboxSettings, _ALL))
        self.spark_settings = SparkSettings.load(config_file=args.config,
                                                 **overrides(args, SparkSettings, _ALL))
        if not self.spark_settings.aggregates:
            raise ConfigurationError(
                "no aggregates module: pass --aggregates MODULE (or set [spark] aggregates / "
                "AGGBOX_SPARK_AGGREGATES)"
            )
        if self.settings.mongodb_uri:
            from aggbox.admin import check_mongodb_uri, mongodb_uri_source

            check_mongodb_uri(self.settings.mongodb_uri, mongodb_uri_source(
                "--mongodb-uri" if args.opt_aggbox_mongodb_uri else None))
        self.console = Console(stderr=True)
        self.out = Console(stderr=args.json)  # --json: stdout holds the JSON line only
        self.kafka = kafka
        self.spark: Any = None
        self.owns_session = False

    def start(self) -> Any:
        from aggbox.commands import preflight
        from aggbox.logs import current_log_file
        from aggbox.session import build_session
        from spark.progress import jvm_stderr_to
        from spark.session import quiet_logs, remote_url

        remote = remote_url(self.spark_settings)
        exists = preflight.spark_session_running()  # pyspark is imported after the checks
        preflight.check_before_spark(self.spark_settings, self.args, remote=remote,
                                     session_exists=exists)
        if self.settings.mongodb_uri:  # before Spark: unreachable, or no TTL: one line
            preflight.reach_store(self.settings.mongodb_uri, appname="aggbox-run", source=
                                  preflight.run_uri_source(bool(
                                      self.args.opt_aggbox_mongodb_uri)),
                                  database=self.settings.database,
                                  aggregates=self.spark_settings.aggregates)
        preflight.check_spark_start(self.spark_settings, remote=remote, session_exists=exists)
        self.owns_session = remote is not None or not exists
        with self.console.status(f"connecting to {remote}…" if remote else "starting Spark…"), \
                jvm_stderr_to(None if remote or not self.owns_session else current_log_file()):
            self.spark = build_session(self.spark_settings, kafka=self.kafka,
                                       log_file=current_log_file())
        if self.owns_session:
            quiet_logs(self.spark)
        return self.spark

    def pipeline(self) -> Any:
        from aggbox.servers import mongodb_uri
        from spark.pipeline import Pipeline

        # The one place where "no URI given" becomes the embedded local server.
        uri = self.settings.mongodb_uri or mongodb_uri()
        # The command reads only the counts (the audit log is --outcomes): no outcome
        # DataFrame is kept, so no checkpoint of the outcomes.
        return Pipeline(self.spark, aggregates=self.spark_settings.aggregates,
                        settings=self.settings, spark_settings=self.spark_settings,
                        mongodb_uri=uri, keep_outcomes=False)

    @property
    def show_progress(self) -> bool:
        return not self.args.no_progress and self.console.is_terminal

    def stop(self) -> None:
        if self.spark is not None and self.owns_session:
            self.spark.stop()


_EXC_LINE = re.compile(
    r"^\s*(?::\s*|Caused by:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Failure)):\s*(.+)$")


def _job_error(exc: BaseException) -> str | None:
    """A one-line message for errors raised by Spark or MongoDB (None: anything else)."""
    module = type(exc).__module__
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if module.startswith("pymongo"):
        return (f"MongoDB: {type(exc).__name__}: {' '.join(lines[:3])}. Check --mongodb-uri / "
                "AGGBOX_MONGODB_URI and that the server is reachable.")
    if module.startswith("pyspark") or module.startswith("py4j"):
        causes = [f"{m.group(1)}: {m.group(2).strip()}" for m in map(_EXC_LINE.match, lines)
                  if m]
        if line := deployment_line(lines, causes[-1] if causes else None):
            return line
        if causes:  # the Python exception raised in the executor (last in the trace)
            return f"the Spark job failed: {causes[-1]}"
        return "the Spark job failed: " + (lines[0] if lines else type(exc).__name__)
    return None


def _guarded(ctx: _Context, command: str, job: Callable[[], int]) -> int:
    """Run a Spark job: Spark and MongoDB failures become one clear line on stderr (the full
    trace goes to the log file) and exit code 1; the session is stopped in every case."""
    from aggbox.logs import write_trace

    try:
        ctx.start()
        return job()
    except Exception as exc:
        if isinstance(exc, AggboxError):  # e.g. StreamFailed around the query's exception
            message = (deployment_line(str(exc.__cause__).splitlines(), None)
                       if exc.__cause__ is not None else None)
        else:
            message = _job_error(exc)
        if message is None:
            raise
        path = write_trace(f"aggbox {command}: {message}", exc)
        where = f" (full trace in {path})" if path else ""
        print(f"aggbox {command}: error: {message}{where}", file=sys.stderr)
        return 1
    finally:
        ctx.stop()


def run_command(args: argparse.Namespace) -> int:
    """``aggbox run``."""
    ctx = _Context(args, kafka=False)

    def job() -> int:
        from spark.live import live_counts
        from spark.pipeline import AccountingError, new_run_id
        from spark.progress import rate, spark_progress

        pipeline, run_id = ctx.pipeline(), new_run_id()
        since = datetime.now(UTC).replace(microsecond=0)
        with live_counts(pipeline, run_id, args.input, enabled=ctx.show_progress) as live, \
                spark_progress(ctx.spark, ctx.console, enabled=ctx.show_progress,
                               stages=args.verbose, live=live):
            try:
                result = pipeline.run_batch(args.input, run_id=run_id)
            except AccountingError as exc:
                ctx.console.print(f"[red]aggbox run: {exc}")
                return 1
        summary = result.summary()
        summary.update(seconds=round(result.seconds, 3), msgs_per_s=round(
                           result.input_count / result.seconds if result.seconds else 0, 1),
                       outcomes_path=result.outcomes_path,
                       reasons={f"{o}/{r}": n for (o, r), n in result.reasons.items()},
                       by_type=by_type_rows(result.by_type))
        write_metrics(args.metrics_file, result.by_type, result.input_count, result.seconds)
        title = f"aggbox run {result.run_id}"
        if result.outcomes_path:
            title += f" — outcomes: {result.outcomes_path}"
        return _finish(ctx.out, args, title, summary, result, since,
                       rate_line=rate(result.input_count, result.seconds))

    return _guarded(ctx, "run", job)


def _stream_source(args: argparse.Namespace, ctx: _Context) -> Any:
    from spark.sources import DirectorySource, KafkaSource

    s = ctx.spark_settings
    kafka = args.kafka_bootstrap_servers or args.topic
    if kafka and args.directory:
        raise ConfigurationError("give either --kafka-bootstrap-servers/--topic or --directory")
    if kafka:
        if not (args.kafka_bootstrap_servers and args.topic):
            raise ConfigurationError("a Kafka stream needs --kafka-bootstrap-servers and --topic")
        return KafkaSource(args.kafka_bootstrap_servers, args.topic,
                           starting_offsets=s.starting_offsets,
                           max_offsets_per_trigger=s.max_offsets_per_trigger,
                           options=key_values(args.kafka_option, "--kafka-option"))
    if args.directory:
        return DirectorySource(args.directory, max_files_per_trigger=s.max_files_per_trigger)
    raise ConfigurationError("no stream source: pass --kafka-bootstrap-servers and --topic, "
                             "or --directory DIR")


def stream_command(args: argparse.Namespace) -> int:
    """``aggbox stream``."""
    is_kafka = bool(args.kafka_bootstrap_servers or args.topic)
    ctx = _Context(args, kafka=is_kafka)
    source = _stream_source(args, ctx)
    if not ctx.spark_settings.checkpoint_location:
        raise ConfigurationError(
            "a stream needs --checkpoint DIR (or [spark] checkpoint_location): it records what "
            "was consumed so that a restart resumes instead of replaying the source"
        )
    def job() -> int:
        from spark.pipeline import RunResult, StreamResult
        from spark.progress import spark_progress

        totals = StreamResult()  # the micro-batches so far, for --metrics-file

        def on_batch(b: RunResult) -> None:
            if args.metrics_file:
                totals.batches.append(RunResult(
                    run_id=b.run_id, input_count=b.input_count, counts=b.counts,
                    reasons=b.reasons, by_type=b.by_type, batch_id=b.batch_id,
                    seconds=b.seconds))
                write_metrics(args.metrics_file, totals.by_type, totals.input_count,
                              totals.seconds)
            c = b.counts
            ctx.console.print(
                f"micro-batch {b.batch_id}: input {b.input_count:,}, applied {c['applied']:,}, "
                f"duplicate {c['duplicate']:,}, dead_lettered {c['dead_lettered']:,}, "
                f"parked {c['parked']:,} ({b.seconds:.1f} s)")

        pipeline = ctx.pipeline()
        since = datetime.now(UTC).replace(microsecond=0)
        with spark_progress(ctx.spark, ctx.console, enabled=ctx.show_progress and args.verbose):
            try:
                result = pipeline.run_stream(source, on_batch=on_batch, timeout=args.timeout)
            except KeyboardInterrupt:
                ctx.console.print("stopped")
                return 130
        summary: dict[str, Any] = {"query_id": result.query_id, "batches": len(result.batches),
                                   "input": result.input_count, **result.counts}
        summary["reasons"] = {f"{o}/{r}": n for (o, r), n in result.reasons.items()}
        summary["by_type"] = by_type_rows(result.by_type)
        title = f"aggbox stream {result.query_id}: {len(result.batches)} micro-batch(es)"
        return _finish(ctx.out, args, title, summary, result, since)

    return _guarded(ctx, "stream", job)
