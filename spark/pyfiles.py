"""``py_files`` (``--py-files``): shipping the aggregates module to where Python runs.

- :func:`add_py_files` ships them to the executors: ``SparkContext.addPyFile``, or on Spark
  Connect ``addArtifacts(pyfile=True)``. Neither puts a ``.whl`` on the executors'
  ``sys.path`` (addPyFile ships it as a plain file, addArtifacts refuses it), so a wheel
  goes as a copy named ``<wheel>.zip`` (zipimport reads pure-Python wheels). The copy lives
  in an ``aggbox-pyfiles-*`` folder of the temporary directory: removed right after the
  upload on Connect, at exit otherwise (the driver's file server serves it to executors
  for as long as the application runs).
- A Spark Connect stream's ``foreachBatch`` function runs in a Python process of the
  server, which the artifacts do not reach (PySpark 4.0's ``foreach_batch_worker`` adds
  nothing to ``sys.path``): the pipeline carries the files' bytes in its pickle
  (:func:`read_py_files`) and, unpickled there, writes them once per content into the
  server's temporary directory (``aggbox-shipped-<sha256>``, reused by later streams) and
  puts them first on ``sys.path`` before it imports the aggregates module
  (:func:`install_py_files`).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from spark.connect import is_connect

__all__ = ["add_py_files", "install_py_files", "read_py_files"]

_URL = re.compile(r"^[A-Za-z][\w+.-]+:")
#: ``aggbox-pyfiles-*`` folders of this process, removed at exit.
_TEMP_DIRS: list[Path] = []


def _remove_temp_dirs() -> None:
    while _TEMP_DIRS:
        shutil.rmtree(_TEMP_DIRS.pop(), ignore_errors=True)


atexit.register(_remove_temp_dirs)


def add_py_files(spark: Any, paths: Iterable[str]) -> None:
    """Ship ``.py``/``.zip``/``.egg``/``.whl`` files to the executors (and put them on this
    process's ``sys.path``); see the module docstring."""
    connect = is_connect(spark)
    for path in paths:
        local, temp = path, None
        if path.endswith(".whl") and not _URL.match(path):
            temp = Path(tempfile.mkdtemp(prefix="aggbox-pyfiles-"))
            local = str(temp / (Path(path).name + ".zip"))
            shutil.copyfile(Path(path).expanduser(), local)
        try:
            if connect:
                spark.addArtifacts(os.path.expanduser(local), pyfile=True)
            else:
                spark.sparkContext.addPyFile(local)
        finally:
            if temp is not None:
                if connect:  # uploaded: the server keeps its own copy
                    shutil.rmtree(temp, ignore_errors=True)
                else:
                    _TEMP_DIRS.append(temp)


def read_py_files(paths: Sequence[str]) -> list[tuple[str, bytes]]:
    """``(file name, content)`` of the local ``paths`` (URLs are left to Spark)."""
    return [(Path(p).name, Path(p).expanduser().read_bytes()) for p in paths
            if not _URL.match(p)]


def install_py_files(files: Sequence[tuple[str, bytes]]) -> None:
    """Write ``files`` (from :func:`read_py_files`) into the temporary directory, one folder
    per content (``aggbox-shipped-<sha256>``, written once), and put them first on
    ``sys.path``: a ``.py`` by its folder, an archive (``.zip``, ``.egg``, ``.whl``) itself."""
    for name, content in files:
        digest = hashlib.sha256(content).hexdigest()[:24]
        folder = Path(tempfile.gettempdir()) / f"aggbox-shipped-{digest}"
        target = folder / name
        if not target.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / f".{name}.{os.getpid()}.tmp"
            partial.write_bytes(content)
            partial.replace(target)
        entry = str(folder if name.endswith(".py") else target)
        if entry not in sys.path:
            sys.path.insert(0, entry)
