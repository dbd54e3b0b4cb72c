"""Configuration: the committed reference matches the settings models; precedence is
defaults < file < environment < explicit arguments; mistakes are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggbox.configref import DOC_PATH, TOML_PATH, render_markdown, render_toml, section_models
from aggregates import AggboxSettings, ConfigurationError


def test_committed_reference_is_generated_from_the_models() -> None:
    assert TOML_PATH.read_text() == render_toml(), "run `aggbox config --write`"
    assert DOC_PATH.read_text() == render_markdown(), "run `aggbox config --write`"


def test_reference_file_loads_to_the_defaults() -> None:
    for model in section_models():
        assert model.load(config_file=TOML_PATH) == model(), model.section


def test_precedence_file_then_env_then_arguments(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "a.toml"
    cfg.write_text('[aggbox]\ndatabase = "from_file"\nchunk_aggregates = 7\n')
    s = AggboxSettings.load(config_file=cfg)
    assert (s.database, s.chunk_aggregates) == ("from_file", 7)
    monkeypatch.setenv("AGGBOX_DATABASE", "from_env")
    s = AggboxSettings.load(config_file=cfg)
    assert (s.database, s.chunk_aggregates) == ("from_env", 7)
    assert AggboxSettings.load(config_file=cfg, database="explicit").database == "explicit"
    monkeypatch.setenv("AGGBOX_CONFIG", str(cfg))
    monkeypatch.delenv("AGGBOX_DATABASE")
    assert AggboxSettings.load().chunk_aggregates == 7


def test_config_mistakes_are_named(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[aggbox]\nchunk_agregates = 7\n")
    with pytest.raises(ConfigurationError, match=r"unknown setting.*chunk_agregates"):
        AggboxSettings.load(config_file=cfg)
    cfg.write_text("[aggbox\n")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        AggboxSettings.load(config_file=cfg)
    with pytest.raises(ConfigurationError, match="does not exist"):
        AggboxSettings.load(config_file=tmp_path / "missing.toml")
    cfg.write_text("[aggbox]\nchunk_aggregates = 0\n")
    with pytest.raises(ConfigurationError, match=r"chunk_aggregates: .*greater than or equal"):
        AggboxSettings.load(config_file=cfg)
