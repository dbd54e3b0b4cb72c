"""spark.metrics_export: the Prometheus text format of a run's outcome counts (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark.metrics_export import escape_label_value, render_metrics, write_metrics_file

HOSTILE = 'Ac"co\\unt\n/$x}{,=é☃'

BY_TYPE = {
    ("Account", "Deposit", "applied", ""): 7,
    ("Account", "Deposit", "duplicate", "beyond_dedup_horizon"): 2,
    (HOSTILE, 'Dep"\\osit\nx', "dead_lettered", "unknown_aggregate_type"): 3,
    ("", "", "dead_lettered", "invalid_json"): 1,
    ("Ledger", "", "released_applied", ""): 4,
}


def render() -> str:
    return render_metrics(BY_TYPE, input_records=13, run_seconds=1.5, timestamp=1_700_000_000.0)


def test_label_values_are_escaped() -> None:
    assert escape_label_value('a"b\\c\nd/$é') == 'a\\"b\\\\c\\nd/$é'
    text = render()
    assert "\n" not in text.split("aggbox_pipeline_outcomes{aggregate_type=\"Ac")[1].split(
        "} 3")[0]  # the newline in the value is escaped
    for name in ("aggbox_pipeline_outcomes", "aggbox_pipeline_input_records",
                 "aggbox_pipeline_run_seconds", "aggbox_pipeline_last_run_timestamp_seconds"):
        assert f"# HELP {name} " in text and f"# TYPE {name} gauge" in text
    assert "run_id" not in text


def test_the_rendering_parses_back_to_the_counts() -> None:
    families = {f.name: f for f in text_string_to_metric_families(render())}
    got = {(s.labels["aggregate_type"], s.labels["message_type"], s.labels["outcome"],
            s.labels["reason"]): s.value for s in families["aggbox_pipeline_outcomes"].samples}
    assert got == BY_TYPE
    assert families["aggbox_pipeline_input_records"].samples[0].value == 13
    assert families["aggbox_pipeline_run_seconds"].samples[0].value == 1.5
    assert families["aggbox_pipeline_last_run_timestamp_seconds"].samples[0].value == (
        1_700_000_000.0)


def test_no_outcomes_still_renders_the_run_metrics() -> None:
    text = render_metrics({}, input_records=0, run_seconds=0.0, timestamp=0.0)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "aggbox_pipeline_input_records" in names


def test_the_file_is_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.prom"
    path.write_text("old\n")
    write_metrics_file(path, render())
    assert path.read_text(encoding="utf-8") == render()
    assert list(tmp_path.iterdir()) == [path]

    def fail(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("spark.metrics_export.os.replace", fail)
    with pytest.raises(OSError):
        write_metrics_file(path, "new\n")
    assert path.read_text(encoding="utf-8") == render()  # the old file stays whole
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left
