"""The SparkSession of the ``aggbox`` command (and of the demo, the tests and the benchmarks):
:func:`spark.session.build_session` plus what needs Maven.

``spark.session`` never downloads anything (docs/design.md, "Layering"). Here, when Spark's
Kafka source is wanted, its dependency ``spark-token-provider-kafka-0-10`` is resolved the
way some Maven mirrors require: ``[spark] kafka_token_provider_version`` pins it, else the
session is started with the exact version and, when Ivy fails (patch releases such as 4.0.1
are missing on some mirrors), started again with ``<major>.<minor>.0`` — excluded from Ivy,
fetched with Maven into the aggbox cache, put on the classpath. The JVM's log4j
configuration goes into the aggbox cache too.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aggbox.servers.maven import cache_dir, mvn_executable
from aggregates.errors import ConfigurationError
from spark.session import (
    TOKEN_PROVIDER,
    gateway_failed,
    kafka_package,
    kafka_token_provider_fallback,
)
from spark.session import build_session as _build
from spark.settings import SparkSettings

__all__ = ["build_session", "fetch_jar"]

log = logging.getLogger("aggbox.spark")


def build_session(
    settings: SparkSettings | None = None,
    *,
    kafka: bool = False,
    packages: Iterable[str] = (),
    conf: Mapping[str, str] | None = None,
    show_console_progress: bool = False,
    log_file: Path | str | None = None,
) -> Any:
    """Create (or return the active) SparkSession, as :func:`spark.session.build_session`,
    with the Kafka source's token provider resolved (see the module docstring)."""
    s = settings or SparkSettings.load()
    common: dict[str, Any] = {
        "packages": list(packages), "conf": conf, "log_file": log_file,
        "show_console_progress": show_console_progress,
        "log_config_dir": cache_dir() / "spark",
    }
    if not kafka:
        return _build(s, **common)
    if s.kafka_token_provider_version:
        return _pinned(s, s.kafka_token_provider_version, common)
    try:
        return _build(s, kafka=True, **common)
    except Exception as exc:
        if not gateway_failed(exc):
            raise
        pinned = kafka_token_provider_fallback()
        log.warning(
            "could not start Spark with %s (Ivy could not resolve a dependency, see above); "
            "retrying with %s:%s. Set [spark] kafka_token_provider_version to choose.",
            kafka_package(s), TOKEN_PROVIDER, pinned,
        )
        return _pinned(s, pinned, common)


def _pinned(s: SparkSettings, version: str, common: dict[str, Any]) -> Any:
    # Ivy cannot pin a transitive dependency: exclude it and put the pinned jar on the
    # classpath ourselves.
    jar = fetch_jar(f"{TOKEN_PROVIDER}:{version}")
    return _build(s, kafka=True, jars=[jar], excludes=[TOKEN_PROVIDER], **common)


def fetch_jar(coordinate: str) -> Path:
    """One jar (no dependencies) from Maven Central, cached in the aggbox cache directory."""
    _group, artifact, version = coordinate.split(":")
    target = cache_dir() / "jars" / "spark-extra"
    jar = target / f"{artifact}-{version}.jar"
    if jar.is_file():
        return jar
    target.mkdir(parents=True, exist_ok=True)
    cmd = [mvn_executable(), "-q", "-B", "dependency:copy", f"-Dartifact={coordinate}",
           f"-DoutputDirectory={target}"]
    done = subprocess.run(cmd, cwd=target, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=600, check=False)
    if done.returncode != 0 or not jar.is_file():
        raise ConfigurationError(
            f"cannot fetch {coordinate} from Maven Central (exit {done.returncode}): "
            f"{(done.stdout + done.stderr).strip()[-2000:]}. Set [spark] kafka_package / "
            "kafka_token_provider_version to versions your Maven mirror has."
        )
    return jar
