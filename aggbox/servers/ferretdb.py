"""FerretDB 1.24.2 (SQLite backend), a second MongoDB-wire server for the test suite.

Users try aggbox on servers that speak MongoDB's wire protocol without being MongoDB;
``aggbox check-store`` must judge them and ``aggbox run`` must say what they lack. FerretDB
is such a server that runs without any other service (its SQLite backend). Nothing of it
is shipped with aggbox: :func:`ferretdb_binary` builds it from the Go module proxy once and
caches the binary, as :mod:`aggbox.servers.maven` does with jars from Maven Central.

The recipe (FerretDB's own build generates ``build/version/version.txt``; without it the
binary panics at start)::

    go mod download -json github.com/FerretDB/FerretDB@v1.24.2   # → the module's Dir
    cp -r <Dir> src && chmod -R u+w src                            # the cache is read-only
    echo v1.24.2 > src/build/version/version.txt
    cd src && go build -o ferretdb ./cmd/ferretdb

Cache layout (``$AGGBOX_CACHE_DIR``, default ``~/.cache/aggbox``)::

    ferretdb-1.24.2/ferretdb     the binary (written last, by a rename)
    go/mod/                      the Go module cache of the build (``-modcacherw``)

Needs ``go`` on PATH (Go 1.24 or later) and the Go module proxy (``GOPROXY``) for the first
build only. :func:`start_ferretdb` runs it on a free loopback port with its data in a
temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Final

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from aggbox.servers import _process
from aggbox.servers.errors import ServerError
from aggbox.servers.maven import _file_lock, cache_dir

__all__ = ["FERRETDB_MODULE", "FERRETDB_VERSION", "LocalFerretDB", "ferretdb_binary",
           "start_ferretdb"]

FERRETDB_VERSION: Final = "1.24.2"
FERRETDB_MODULE: Final = "github.com/FerretDB/FerretDB"
_GO_TIMEOUT_S: Final = 1800.0
_PORT_ATTEMPTS: Final = 5


def _go() -> str:
    found = shutil.which("go")
    if found is None:
        raise ServerError(
            f"`go` not found on PATH; it is needed once to build FerretDB {FERRETDB_VERSION} "
            f"from the Go module proxy into {cache_dir()}. Install Go 1.24 or later "
            "(https://go.dev/dl/).")
    return found


def _run_go(argv: list[str], cwd: Path, env: dict[str, str], what: str
            ) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=_GO_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise ServerError(f"{what} did not finish within {_GO_TIMEOUT_S:.0f} s (is the Go "
                          "module proxy reachable?)") from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-4000:]
        raise ServerError(f"{what} failed (exit {done.returncode}): {' '.join(argv)}; check "
                          f"that the Go module proxy (GOPROXY) is reachable.\n{output}")
    return done


def ferretdb_binary() -> Path:
    """The FerretDB binary, built once into the cache (see the module docstring); later
    calls, also from other processes, only look at the file. Concurrent first calls are
    serialised with a file lock."""
    target = cache_dir() / f"ferretdb-{FERRETDB_VERSION}" / "ferretdb"
    if target.is_file():
        return target
    with _file_lock(f"ferretdb-{FERRETDB_VERSION}"):
        if target.is_file():  # another process built it meanwhile
            return target
        go = _go()
        env = {**os.environ, "GOMODCACHE": str(cache_dir() / "go" / "mod"),
               "GOFLAGS": "-mod=mod -modcacherw", "GOTOOLCHAIN": "local"}
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".ferretdb-", dir=target.parent) as tmp:
            work = Path(tmp)
            fetched = _run_go([go, "mod", "download", "-json",
                               f"{FERRETDB_MODULE}@v{FERRETDB_VERSION}"],
                              work, env, f"downloading {FERRETDB_MODULE}")
            module = Path(json.loads(fetched.stdout)["Dir"])
            src = work / "src"
            shutil.copytree(module, src)
            for path in (src, *src.rglob("*")):  # the module cache's copy may be read-only
                path.chmod(path.stat().st_mode | 0o200)
            (src / "build" / "version" / "version.txt").write_text(
                f"v{FERRETDB_VERSION}\n", encoding="utf-8")
            built = work / "ferretdb"
            _run_go([go, "build", "-o", str(built), "./cmd/ferretdb"], src, env,
                    f"building FerretDB {FERRETDB_VERSION}")
            built.rename(target)
    return target


class LocalFerretDB:
    """A FerretDB started by :func:`start_ferretdb`: ``uri``; :meth:`stop` (idempotent)
    stops it and deletes its data."""

    def __init__(self, uri: str, process: _process.ServerProcess, work_dir: Path) -> None:
        self.uri = uri
        self._process = process
        self.work_dir: Path | None = work_dir
        _process.register_for_exit(self)

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    def stop(self) -> None:
        self._process.stop()
        _process.unregister_for_exit(self)
        if self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None

    def __enter__(self) -> LocalFerretDB:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalFerretDB(uri={self.uri!r})"


def _ping(uri: str) -> bool:
    client: MongoClient[dict[str, object]] = MongoClient(
        uri, serverSelectionTimeoutMS=500, connectTimeoutMS=500)
    try:
        client.admin.command("ping")
        return True
    except PyMongoError:
        return False
    finally:
        client.close()


def start_ferretdb(*, timeout: float = 60.0) -> LocalFerretDB:
    """FerretDB on a free loopback port, SQLite files in a temporary directory, no
    telemetry, no debug listener (builds the binary first if needed)."""
    binary = ferretdb_binary()
    work_dir = Path(tempfile.mkdtemp(prefix="aggbox-ferretdb-"))
    data = work_dir / "data"
    data.mkdir()
    log_path = work_dir / "ferretdb.log"
    for _attempt in range(_PORT_ATTEMPTS):
        port = _process.free_port()
        argv = [str(binary), "--handler=sqlite", f"--sqlite-url=file:{data}/",
                f"--listen-addr={_process.LOOPBACK}:{port}", "--debug-addr=-",
                "--telemetry=disable", f"--state-dir={work_dir}", "--log-level=warn"]
        proc = _process.ServerProcess("FerretDB", argv, log_path, watch_stdin=False,
                                      cwd=work_dir)
        proc.start()
        uri = f"mongodb://{_process.LOOPBACK}:{port}/"
        try:
            proc.wait_ready(partial(_ping, uri), timeout, what="(FerretDB)")
        except ServerError:
            started = _process.log_tail(log_path).rpartition("=== aggbox: starting")[2]
            if "address already in use" in started:
                continue  # the port was taken between choosing and binding: try another
            shutil.rmtree(work_dir, ignore_errors=True)
            raise
        return LocalFerretDB(uri, proc, work_dir)
    shutil.rmtree(work_dir, ignore_errors=True)
    raise ServerError(f"FerretDB could not bind a free loopback port in {_PORT_ATTEMPTS} "
                      "attempts")
