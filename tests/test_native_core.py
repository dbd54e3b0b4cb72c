"""The suite's core on both hot paths (docs/design.md "The hot path"): the golden ids and
golden file, the oracles (in memory and on the local server: the batch fold), the
dedup/harness tests and the executor's parse (the native parse of Arrow batches against
Python's) run once with the native core and once with ``AGGBOX_PURE=1``, each in a process
of its own (the choice is made when ``aggregates.core.ids`` and
``aggregates.store.nativefold`` are imported). Both must pass: the native core changes no
byte.

The native core is built by ``make install`` when cargo is on PATH; without a Rust toolchain
aggbox runs the pure path only, and the native half cannot run (the one skip here, which
names why). With cargo present, a missing native core is a failure, not a skip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The tests whose results would move if an id, a hash or a write moved: pure logic, and
#: the writer's oracles on the local server, where the batch fold (native) or the
#: definition (pure) folds (docs/design.md "The batch fold").
CORE_TESTS = [
    "tests/aggregates/test_golden_ids.py",
    "tests/aggregates/test_dedup_and_harness.py",
    "tests/aggregates/test_ids_fastpath.py",
    "tests/aggregates/test_update_insert.py",
    "tests/aggregates/test_envelope_native.py",
    "tests/spark/test_records_fastpath.py",
    "tests/aggregates/test_oracle.py::test_random_streams_match_oracle_mongomock",
    "tests/aggregates/test_oracle_wide.py::"
    "test_everything_the_writer_decides_matches_the_oracle_mongomock",
    "tests/aggregates/test_oracle.py::test_random_streams_match_oracle_local_server",
    "tests/aggregates/test_oracle_wide.py::"
    "test_everything_the_writer_decides_matches_the_oracle_local_server",
    "tests/aggregates/test_inbox_horizon.py::"
    "test_inbox_never_refuses_a_new_message_within_the_horizon_local_server",
    "tests/aggregates/test_store_local.py",
]


def _run(pure: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AGGBOX_PURE"}
    if pure:
        env["AGGBOX_PURE"] = "1"
    probe = ("import aggregates.core.ids as i, aggregates.store.nativefold as f, sys; "
             "n = sys.argv[1] == 'native'; "
             "sys.exit(0 if i.NATIVE is n and (f.NATIVE is not None) is n else 3)")
    which = "pure" if pure else "native"
    done = subprocess.run([sys.executable, "-c", probe, which], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"aggregates.core.ids did not take the {which} path: {done}"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *CORE_TESTS], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)


def test_core_tests_pass_on_the_pure_path() -> None:
    done = _run(pure=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_core_tests_pass_on_the_native_path() -> None:
    if importlib.util.find_spec("_aggbox_native") is None:
        assert shutil.which("cargo") is None, (
            "cargo is on PATH but the native core is not installed: run `make native` "
            "(pip install ./native)")
        pytest.skip("no Rust toolchain here: the native core is not built (pure path only)")
    done = _run(pure=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
