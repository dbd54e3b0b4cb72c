"""``spark.session.build_session`` downloads nothing: it takes jar paths and Maven
coordinates; ``aggbox.session.build_session`` (the command-line layer) resolves the Kafka
source's token provider with Maven when Ivy cannot (docs/design.md, "Layering"). No Spark is
started here: the session start itself is replaced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import aggbox.session
import spark.session
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


def test_command_layer_retries_with_the_pinned_token_provider(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    jar = tmp_path / "token.jar"

    def build(settings: Any, **kw: Any) -> Any:
        calls.append(kw)
        if not kw.get("jars"):
            raise RuntimeError("[JAVA_GATEWAY_EXITED] Java gateway process exited")
        return "session"

    fetched: list[str] = []
    monkeypatch.setattr(aggbox.session, "_build", build)
    monkeypatch.setattr(aggbox.session, "fetch_jar", lambda c: fetched.append(c) or jar)
    assert aggbox.session.build_session(SparkSettings.load(), kafka=True) == "session"
    assert fetched == [f"{TOKEN_PROVIDER}:{kafka_token_provider_fallback()}"]
    assert calls[1]["jars"] == [jar] and calls[1]["excludes"] == [TOKEN_PROVIDER]


def test_command_layer_does_not_retry_other_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    def build(settings: Any, **kw: Any) -> Any:
        raise ValueError("something else")

    monkeypatch.setattr(aggbox.session, "_build", build)
    with pytest.raises(ValueError, match="something else"):
        aggbox.session.build_session(SparkSettings.load(), kafka=True)
