"""What a careful command line gets right (issue 34, items 1 and 6), through ``aggbox.cli.main``:
``--version``; help as plain text; an unknown option reported with the sub-command's own
usage and the closest option; misspelt config keys and sections are errors with "did you
mean"; a command whose extra is not installed says which in one line; the trace of an
unexpected error goes to ``$AGGBOX_HOME/logs/aggbox.log``, never into the working directory.
(A fresh virtualenv without extras: tests/test_wheel.py.)"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aggbox.admin
from aggbox.cli import main
from aggbox.logs import configure


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No AGGBOX_* variable from the outside (not even the suite's AGGBOX_LOG_FILE); the
    state directory in the test's directory; run from another one."""
    for name in list(os.environ):
        if name.upper().startswith("AGGBOX_") and name.upper() not in (
                "AGGBOX_CACHE_DIR", "AGGBOX_LOCAL_MONGO"):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    monkeypatch.setenv("AGGBOX_HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    yield home
    configure(log_file=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse: --version, --help, usage errors
        rc = int(exc.code or 0)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    rc, out, _ = run(capsys, "--version")
    assert rc == 0
    assert out.startswith(f"aggbox {version('aggbox')} (Python "), out
    # Which hot path the ids and hashes take (docs/design.md "The hot path").
    import aggregates.core.ids as ids

    assert ("native core)" in out) is ids.NATIVE, out


def test_version_says_when_the_pure_path_is_forced(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGBOX_PURE", "1")
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.rstrip().endswith(", pure Python: AGGBOX_PURE=1)"), out


@pytest.mark.parametrize("argv", [("local", "--help"), ("local", "start", "--help"),
                                  ("dispatch", "--help"), ("deadletters", "--help")])
def test_help_is_plain_text(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, *argv)
    assert rc == 0 and "usage: aggbox" in out
    assert "``" not in out and ":mod:" not in out and ":func:" not in out, out


def test_unknown_option_gets_the_sub_commands_usage_and_the_closest_option(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "run", "--input", "in.jsonl", "--aggrgates", "my_domain")
    assert rc == 2
    assert err.startswith("usage: aggbox run "), err
    assert err.strip().endswith("aggbox run: error: unrecognized arguments: --aggrgates "
                                "my_domain; did you mean --aggregates?"), err
    rc, _, err = run(capsys, "deadletters", "list", "--limt", "3")
    assert rc == 2 and err.startswith("usage: aggbox deadletters list "), err
    assert "did you mean --limit?" in err


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "aggbox.toml"
    path.write_text(text)
    return str(path)


def test_misspelt_setting_names_the_closest_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, '[aggbox]\ndatabse = "x"\nmongodb_uri = "mongodb://h:1"\n')
    rc, _, err = run(capsys, "deadletters", "list", "--config", config)
    assert rc == 1
    assert err.strip() == ("aggbox deadletters: error: config section [aggbox]: unknown setting "
                           "'databse' (did you mean 'database'?)"), err
    # nothing close: the known ones are listed
    config = _config(tmp_path, '[aggbox]\nzzz = "x"\n')
    rc, _, err = run(capsys, "deadletters", "list", "--config", config)
    assert rc == 1 and "unknown setting 'zzz'; known: " in err and "database" in err


def test_misspelt_section_is_an_error_with_the_closest_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, '[sprak]\nmaster = "local[1]"\n')
    rc, _, err = run(capsys, "deadletters", "list", "--config", config)
    assert rc == 1
    assert err.strip() == (f"aggbox deadletters: error: config file {config}: unknown section "
                           "[sprak]; did you mean [spark]? (sections: [aggbox], [spark], "
                           "[dispatcher])"), err


@pytest.mark.parametrize(("command", "module", "line"), [
    (("run", "--input", "in.jsonl"), "pyspark",
     "aggbox run needs the spark extra: pip install 'aggbox[spark]'"),
    (("stream", "--directory", "in"), "pyarrow",
     "aggbox stream needs the spark extra: pip install 'aggbox[spark]'"),
    (("dispatch", "--once"), "aiohttp",
     "aggbox dispatch needs the dispatcher extra: pip install 'aggbox[dispatcher]'"),
])
def test_a_command_without_its_extra_says_which_in_one_line(
        command: tuple[str, ...], module: str, line: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], clean_env: Path) -> None:
    # None in sys.modules is how the import system marks a module as not importable: this
    # process has the extras, a fresh virtualenv without them is tests/test_wheel.py's.
    monkeypatch.setitem(sys.modules, module, None)
    rc, out, err = run(capsys, *command)
    assert rc == 1 and out == ""
    assert err == f"aggbox: error: {line}\n"
    assert not clean_env.exists()  # no trace written anywhere


def test_trace_goes_to_the_state_directory_not_the_working_directory(
        clean_env: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def broken(module: str) -> Any:
        raise RuntimeError("registry exploded")

    monkeypatch.setattr(aggbox.admin, "_registry", broken)
    rc, _, err = run(capsys, "indexes", "--aggregates", "aggbox.examples.orders")
    log_file = clean_env / "logs" / "aggbox.log"
    assert rc == 1 and err.strip().endswith(f"(full trace in {log_file})"), err
    assert "Traceback (most recent call last)" in log_file.read_text()
    assert list(Path.cwd().iterdir()) == []
