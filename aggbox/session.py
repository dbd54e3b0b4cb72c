"""The SparkSession of the ``aggbox`` command (and of the demo, the tests and the benchmarks):
:func:`spark.session.build_session` plus what needs Maven.

``spark.session`` downloads nothing itself, though with ``kafka=True`` it names the Kafka
package in ``spark.jars.packages`` and Spark's Ivy fetches it at session start
(docs/design.md, "Layering"). Here, when Spark's Kafka source is wanted, it is not asked
for that way: its jars are resolved **once** with Maven into the aggbox cache
(:func:`kafka_jars`) and put on the classpath with ``spark.jars`` — no Ivy at session start.
The Kafka source's dependency ``spark-token-provider-kafka-0-10`` is missing on Maven Central
for some patch releases (4.0.1): ``[spark] kafka_token_provider_version`` pins it, else the
exact version is tried and then ``<major>.<minor>.0``; whichever resolved first is cached and
used from then on without calling Maven. A Spark Connect session (``--remote``,
``$SPARK_REMOTE``) gets nothing: the Kafka source must be on the server's classpath (start it
with ``--jars`` of :func:`kafka_jars`, or ``--packages``). The JVM's log4j configuration goes
into the aggbox cache too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aggbox.servers.errors import ServerError
from aggbox.servers.maven import cache_dir, cached_pom, resolve_pom
from aggregates.core.errors import ConfigurationError
from spark.session import (
    TOKEN_PROVIDER,
    kafka_package,
    kafka_token_provider_fallback,
    remote_url,
)
from spark.session import build_session as _build
from spark.settings import SparkSettings

__all__ = ["build_session", "kafka_jars"]

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
    with Spark's Kafka source from :func:`kafka_jars` (see the module docstring)."""
    s = settings or SparkSettings.load()
    jars = kafka_jars(s) if kafka and not remote_url(s) else []
    return _build(s, packages=list(packages), jars=jars, conf=conf, log_file=log_file,
                  show_console_progress=show_console_progress,
                  log_config_dir=cache_dir() / "spark")


# Spark's parent pom names a Maven Central mirror on a host that may not resolve
# (gcs-maven-central-mirror); the same id pointing at Maven Central overrides it, so Maven
# never waits on it. Mirrors configured in ~/.m2/settings.xml still apply.
_KAFKA_POM = """\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Spark's Kafka source for aggbox (aggbox/session.py), written and resolved by aggbox. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>aggbox.spark</groupId>
  <artifactId>spark-kafka-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <repositories>
    <repository>
      <id>gcs-maven-central-mirror</id>
      <url>https://repo.maven.apache.org/maven2</url>
    </repository>
  </repositories>
  <dependencies>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
      <exclusions>
        <exclusion>
          <groupId>org.apache.spark</groupId>
          <artifactId>{token_artifact}</artifactId>
        </exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>{token_artifact}</artifactId>
      <version>{token_version}</version>
    </dependency>
  </dependencies>
</project>
"""


def _kafka_pom(coordinate: str, token_version: str) -> str:
    group, artifact, version = coordinate.split(":")
    return _KAFKA_POM.format(group=group, artifact=artifact, version=version,
                             token_artifact=TOKEN_PROVIDER.split(":")[1],
                             token_version=token_version)


def _spark_artifacts() -> set[str]:
    """Artifact names (without version) of the jars the installed PySpark brings."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    return {j.name.rsplit("-", 1)[0] for j in jars.glob("*.jar")}


def _not_in_spark(jars: list[Path]) -> list[Path]:
    """``jars`` without those Spark has already (Hadoop client, Scala, slf4j, …): resolved
    names are ``<groupId>.<artifactId>-<version>.jar``."""
    have = _spark_artifacts()
    out = []
    for jar in jars:
        stem = jar.name.rsplit("-", 1)[0]
        if not any(stem == a or stem.endswith("." + a) for a in have):
            out.append(jar)
    return out


def kafka_jars(settings: SparkSettings | None = None) -> list[Path]:
    """The jars of Spark's Kafka source (``[spark] kafka_package``, default: the installed
    PySpark's version) and of its dependencies that Spark does not bring itself, resolved
    with Maven once into the aggbox cache (see the module docstring)."""
    s = settings or SparkSettings.load()
    coordinate = kafka_package(s)
    version = coordinate.split(":")[2]
    if s.kafka_token_provider_version:
        candidates = [s.kafka_token_provider_version]
    else:
        candidates = list(dict.fromkeys([version, kafka_token_provider_fallback()]))
    poms = [(v, _kafka_pom(coordinate, v)) for v in candidates]
    for _v, text in poms:  # resolved before: no Maven at all
        cached = cached_pom("spark-kafka", text)
        if cached is not None:
            return _not_in_spark(cached)
    failures: list[str] = []
    for v, text in poms:
        try:
            jars = resolve_pom("spark-kafka", text)
        except ServerError as exc:
            failures.append(f"{TOKEN_PROVIDER}:{v}: {str(exc).splitlines()[0]}")
            continue
        if v != version:
            log.info("Spark's Kafka source %s with %s:%s (%s is not on Maven Central)",
                     coordinate, TOKEN_PROVIDER, v, version)
        return _not_in_spark(jars)
    raise ConfigurationError(
        f"cannot resolve Spark's Kafka source {coordinate} with Maven: "
        + "; ".join(failures)
        + ". Set [spark] kafka_package / kafka_token_provider_version to versions your Maven "
        "mirror has."
    )

