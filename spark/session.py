"""The SparkSession aggbox creates when it runs the pipeline itself.

Under ``spark-submit`` (or in a notebook) pass your own session to the pipeline functions;
:func:`check_session` tells what it needs. What is set here and why:

- ``spark.speculation=false`` — a speculative copy of a writer task writes the same
  aggregates concurrently with the original: the two attempts collide on every aggregate
  (version conflicts, doubled load on MongoDB, hot aggregates may exhaust their conflict
  retries and get parked), and whichever attempt loses has its outcome rows discarded.
  Retries after a *failure* are fine and stay on (``spark.task.maxFailures``): the retry
  counts what the failed attempt applied as ``applied`` once (run stamps,
  :mod:`aggregates.dedup.runs`).
- ``local[N]`` → ``local[N, F]``: plain ``local`` masters never retry a failed task.
- ``PYSPARK_PYTHON`` = this interpreter: executors need the same packages (pymongo,
  aggregates, your aggregates module).
- Spark's Kafka source ``org.apache.spark:spark-sql-kafka-0-10_2.13:<pyspark version>``
  through ``spark.jars.packages``, only when a Kafka stream is wanted (Ivy downloads it from
  Maven Central into ``~/.ivy2.5.2``). Its dependency ``spark-token-provider-kafka-0-10`` is
  missing on Maven Central for some patch releases (4.0.1 here): ``jars`` and ``excludes``
  let the caller put resolved jars on the classpath instead. This module never downloads
  anything itself; the ``aggbox`` command resolves the Kafka source's jars with Maven once
  and passes them as ``jars`` (:func:`aggbox.session.build_session`, docs/design.md
  "Layering").
- ``spark.sql.session.timeZone=UTC``: ``occurred_at`` is compared and ordered in UTC.
- ``remote`` (``[spark] remote``, ``--remote``, else ``$SPARK_REMOTE``): a **Spark Connect**
  session (``sc://host:port``) instead of a JVM in this process. Only session-scoped SQL
  settings can be set from a Connect client (shuffle partitions, Arrow batch size, time zone,
  ``conf``); speculation, task retries, packages and jars are the server's
  (:func:`check_session` reads what it runs with through ``spark.conf``). ``py_files`` go
  with ``addArtifacts(pyfile=True)``, and to a stream's ``foreachBatch`` process inside the
  pipeline's pickle (:mod:`spark.pyfiles`). On that path aggbox never touches ``sparkContext``,
  RDDs or accumulators (:func:`is_connect`).
- ``log_file`` (the ``aggbox`` command passes its log file): the JVM's log4j output —
  start-up chatter and the stack traces of failed tasks, hundreds of lines — goes to that
  file (errors only) instead of stderr, unless you configured log4j yourself
  (``-Dlog4j2.configurationFile`` in ``spark.driver.extraJavaOptions``, or a
  ``log4j2.properties`` in ``$SPARK_CONF_DIR``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aggregates.core.errors import ConfigurationError
from spark.connect import is_connect
from spark.pyfiles import add_py_files
from spark.settings import SparkSettings

__all__ = [
    "TOKEN_PROVIDER",
    "add_py_files",
    "build_session",
    "check_session",
    "gateway_failed",
    "is_connect",
    "kafka_package",
    "kafka_token_provider_fallback",
    "local_master",
    "quiet_logs",
    "remote_url",
]

log = logging.getLogger("aggbox.spark")

_LOCAL = re.compile(r"^local\[(\d+|\*)\]$")

#: Maven coordinate (without version) of the Kafka source's token-provider dependency.
TOKEN_PROVIDER = "org.apache.spark:spark-token-provider-kafka-0-10_2.13"


def kafka_package(settings: SparkSettings | None = None) -> str:
    """The Maven coordinate of Spark's Kafka source matching the installed PySpark."""
    if settings is not None and settings.kafka_package:
        return settings.kafka_package
    import pyspark

    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def kafka_token_provider_fallback() -> str:
    """``<major>.<minor>.0`` of the installed PySpark: the token-provider version tried when
    the exact one cannot be resolved (some Maven mirrors lack patch releases of it)."""
    import pyspark

    major, minor = pyspark.__version__.split(".")[:2]
    return f"{major}.{minor}.0"


def remote_url(settings: SparkSettings | None = None) -> str | None:
    """The Spark Connect URL to use: ``[spark] remote`` (``--remote``), else
    ``$SPARK_REMOTE``; None for a session with its own JVM."""
    if settings is not None and settings.remote:
        return settings.remote
    return os.environ.get("SPARK_REMOTE") or None


def local_master(master: str, max_failures: int) -> str:
    """``local[N]`` → ``local[N, max_failures]`` (other masters unchanged)."""
    m = _LOCAL.match(master.replace(" ", ""))
    if m and max_failures > 1:
        return f"local[{m.group(1)}, {max_failures}]"
    return master


def build_session(
    settings: SparkSettings | None = None,
    *,
    kafka: bool = False,
    packages: Iterable[str] = (),
    jars: Iterable[Path | str] = (),
    excludes: Iterable[str] = (),
    conf: Mapping[str, str] | None = None,
    show_console_progress: bool = False,
    log_file: Path | str | None = None,
    log_config_dir: Path | None = None,
) -> Any:
    """Create (or return the active) SparkSession configured for the pipeline.

    ``kafka=True`` adds Spark's Kafka source; ``packages`` adds other Maven coordinates (Ivy
    resolves them), ``excludes`` keeps coordinates out of that resolution and ``jars`` adds
    local jar files; ``conf`` overrides everything else; ``log_file`` sends the JVM's log
    there instead of stderr (its log4j configuration is written into ``log_config_dir``,
    default: a directory under the system's temporary directory). Static settings (packages,
    jars, master, log file) only apply when no session is running yet in this process."""
    s = settings or SparkSettings.load()
    remote = remote_url(s)
    if remote:
        return _start_remote(s, remote, conf)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    values: dict[str, str] = {
        "spark.app.name": s.app_name,
        "spark.speculation": "false",
        "spark.task.maxFailures": str(s.task_max_failures),
        "spark.sql.shuffle.partitions": str(s.shuffle_partitions),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(s.arrow_batch_rows),
        "spark.sql.session.timeZone": "UTC",
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
        "spark.ui.showConsoleProgress": "true" if show_console_progress else "false",
    }
    values.update(s.conf)
    values.update(conf or {})
    if log_file is not None:
        config_dir = log_config_dir or Path(tempfile.gettempdir()) / "aggbox-spark"
        _log_to_file(values, Path(log_file), config_dir)
    pkgs = [*packages, kafka_package(s)] if kafka else list(packages)
    _append(values, "spark.jars.excludes", [str(e) for e in excludes])
    _append(values, "spark.jars", [str(j) for j in jars])
    if pkgs:
        values["spark.jars.packages"] = ",".join(dict.fromkeys(pkgs))
    return _start(s, values)


def _append(values: dict[str, str], key: str, items: list[str]) -> None:
    if items:
        values[key] = ",".join(filter(None, [values.get(key), *items]))


_LOG4J2 = """\
# Written by aggbox (spark/session.py): the JVM's errors go to the aggbox log file.
# root at warn, Spark's default shell level: no "Setting default log level" banner on stderr
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
rootLogger.appenderRef.file.level = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.append = true
appender.file.createOnDemand = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yyyy-MM-dd HH:mm:ss,SSS}} %p %c (Spark JVM): %m%n%ex
"""


def _log_to_file(values: dict[str, str], log_file: Path, config_dir: Path) -> None:
    """Point the driver JVM's log4j at ``log_file`` (errors only) instead of stderr, unless
    log4j is configured already."""
    options = values.get("spark.driver.extraJavaOptions", "")
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if "log4j" in options or (conf_dir and (Path(conf_dir) / "log4j2.properties").exists()):
        return
    path = log_file.absolute()
    text = _LOG4J2.format(path=str(path).replace("\\", "/"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    config = config_dir / f"log4j2-{digest}.properties"
    if not config.is_file():
        config.parent.mkdir(parents=True, exist_ok=True)
        tmp = config.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(config)
    values["spark.driver.extraJavaOptions"] = " ".join(
        filter(None, [options, f"-Dlog4j2.configurationFile={config.as_uri()}"]))


def gateway_failed(exc: BaseException) -> bool:
    """Whether starting the session failed because the JVM exited (e.g. Ivy could not
    resolve a package)."""
    from pyspark.errors import PySparkException

    return isinstance(exc, PySparkException) and exc.getCondition() == "JAVA_GATEWAY_EXITED"


def _start(s: SparkSettings, values: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(local_master(s.master, s.task_max_failures))
    for key, value in values.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    add_py_files(spark, s.py_files)
    return spark


def _start_remote(s: SparkSettings, url: str, conf: Mapping[str, str] | None) -> Any:
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    values = {
        "spark.sql.shuffle.partitions": str(s.shuffle_partitions),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(s.arrow_batch_rows),
        "spark.sql.session.timeZone": "UTC",
        **s.conf, **(conf or {}),
    }
    for key, value in values.items():
        # A Connect client can only change session-scoped SQL settings; the others are the
        # server's (its spark-submit / spark-defaults.conf).
        if not key.startswith("spark.sql."):
            log.info("Spark Connect: %s is a setting of the server, not set from here", key)
            continue
        try:
            spark.conf.set(key, value)
        except PySparkException as exc:  # a static SQL setting (AnalysisException)
            log.warning("Spark Connect: cannot set %s from the client (%s)", key,
                        str(exc).splitlines()[0])
    add_py_files(spark, s.py_files)
    return spark


def quiet_logs(spark: Any, level: str = "ERROR") -> None:
    """``sparkContext.setLogLevel(level)`` for a session with its own JVM; a Connect
    server's log is the server's business (nothing to do)."""
    if not is_connect(spark):
        spark.sparkContext.setLogLevel(level)


def check_session(spark: Any) -> None:
    """Raise :class:`ConfigurationError` when the session would make the pipeline unsafe or
    misleading (see the module docstring). Reads ``spark.conf`` (a Spark Connect session
    has no ``sparkContext``): a session's configuration includes the application's."""
    speculation = str(spark.conf.get("spark.speculation", "false"))
    if speculation.strip().lower() == "true":
        raise ConfigurationError(
            "spark.speculation is on: speculative copies of writer tasks write the same "
            "aggregates concurrently (conflicts, doubled load) and their outcome rows are "
            "misleading. Set spark.speculation=false for the aggbox job."
        )
