"""``spark.session.build_session`` downloads nothing: it takes jar paths and Maven
coordinates; ``aggbox.session.build_session`` (the command-line layer) resolves the Kafka
source's jars with Maven, once, to versions that exist (docs/design.md, "Layering"). No Spark
is started here and Maven is not run: both are replaced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import aggbox.session
import spark.session
from aggbox.servers.errors import ServerError
from aggregates.core.errors import ConfigurationError
from spark.session import TOKEN_PROVIDER, kafka_package, kafka_token_provider_fallback
from spark.settings import SparkSettings


def _capture(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    started: list[dict[str, str]] = []
    monkeypatch.setattr(spark.session, "_start", lambda s, values: started.append(values))
    return started


def test_spark_session_takes_jars_and_exclusions_as_parameters(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    started = _capture(monkeypatch)
    settings = SparkSettings.load(conf={"spark.jars": "/opt/a.jar"})
    spark.session.build_session(settings, kafka=True, packages=["g:a:1"],
                                jars=[tmp_path / "b.jar"], excludes=["g:x"],
                                log_file=tmp_path / "aggbox.log", log_config_dir=tmp_path)
    (values,) = started
    assert values["spark.jars"] == f"/opt/a.jar,{tmp_path / 'b.jar'}"
    assert values["spark.jars.excludes"] == "g:x"
    assert values["spark.jars.packages"] == f"g:a:1,{kafka_package(settings)}"
    assert str(tmp_path) in values["spark.driver.extraJavaOptions"]  # log4j config written
    assert len(list(tmp_path.glob("log4j2-*.properties"))) == 1


def _fake_maven(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                available: set[str]) -> list[str]:
    """Maven replaced: it resolves poms whose token-provider version is in ``available``."""
    tried: list[str] = []

    def resolve(name: str, text: str) -> list[Path]:
        token = text.split(f"<artifactId>{TOKEN_PROVIDER.split(':')[1]}</artifactId>")[-1]
        version = token.split("<version>")[1].split("</version>")[0]
        tried.append(version)
        if version not in available:
            raise ServerError(f"{TOKEN_PROVIDER}:{version} not found")
        return [tmp_path / f"org.apache.spark.spark-sql-kafka-0-10_2.13-{version}.jar",
                tmp_path / "org.apache.kafka.kafka-clients-3.9.1.jar",
                tmp_path / "org.slf4j.slf4j-api-1.7.36.jar"]  # Spark brings its own

    monkeypatch.setattr(aggbox.session, "resolve_pom", resolve)
    monkeypatch.setattr(aggbox.session, "cached_pom", lambda name, text: None)
    return tried


def test_command_layer_resolves_the_kafka_jars_with_maven(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import pyspark

    tried = _fake_maven(monkeypatch, tmp_path, {kafka_token_provider_fallback()})
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(aggbox.session, "_build",
                        lambda settings, **kw: calls.append(kw) or "session")
    assert aggbox.session.build_session(SparkSettings.load(), kafka=True) == "session"
    assert tried == list(dict.fromkeys([pyspark.__version__, kafka_token_provider_fallback()]))
    (kw,) = calls
    assert [j.name.split("-")[0] for j in kw["jars"]] == [
        "org.apache.spark.spark", "org.apache.kafka.kafka"]  # not Spark's own slf4j
    assert "packages" not in kw or not kw["packages"]


def test_command_layer_pins_the_token_provider(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    tried = _fake_maven(monkeypatch, tmp_path, {"9.9.9"})
    jars = aggbox.session.kafka_jars(SparkSettings.load(kafka_token_provider_version="9.9.9"))
    assert tried == ["9.9.9"] and len(jars) == 2


def test_command_layer_names_the_versions_it_could_not_resolve(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_maven(monkeypatch, tmp_path, set())
    with pytest.raises(ConfigurationError, match="kafka_token_provider_version"):
        aggbox.session.kafka_jars(SparkSettings.load())


def test_no_kafka_jars_for_a_spark_connect_session(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    tried = _fake_maven(monkeypatch, tmp_path, set())
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(aggbox.session, "_build",
                        lambda settings, **kw: calls.append(kw) or "session")
    aggbox.session.build_session(SparkSettings.load(remote="sc://127.0.0.1:1"), kafka=True)
    assert tried == [] and calls[0]["jars"] == []
