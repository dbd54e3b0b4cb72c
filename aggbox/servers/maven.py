"""Maven artifacts and the JVM for the local servers.

Classpaths are described by small pom files shipped in this package
(``aggbox/servers/poms/<name>.xml``). :func:`resolve_classpath` runs
``mvn -q dependency:copy-dependencies`` on such a pom once, into the cache directory, and
afterwards returns the cached jars without calling Maven (so ``mvn`` is needed only for the
first resolution, ``java`` always).

Cache layout (``$AGGBOX_CACHE_DIR``, default ``~/.cache/aggbox``)::

    jars/<pom name>-<hash of the pom>/*.jar      resolved classpath
    jars/<pom name>-<hash of the pom>/.resolved  marker written after success
    classes/<source name>-<hash>/                Java sources compiled by compile_java()
    locks/*.lock                                 fcntl locks between concurrent processes

Editing a pom or a Java source changes its hash, so a new copy is resolved or compiled; old
entries can be deleted at any time.

Environment variables:

``AGGBOX_CACHE_DIR``
    cache directory (default ``~/.cache/aggbox``).
``JAVA_HOME``
    when set, ``$JAVA_HOME/bin/java`` and ``javac`` are used instead of the ones on PATH.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path

from aggbox.servers.errors import ServerError

__all__ = [
    "INSTALL_HINT",
    "available_poms",
    "cache_dir",
    "cached_pom",
    "classpath_string",
    "compile_java",
    "java_executable",
    "java_source",
    "java_sources",
    "javac_executable",
    "mvn_executable",
    "resolve_classpath",
    "resolve_pom",
]

#: What to install when the JVM or Maven is missing (Debian/Ubuntu).
INSTALL_HINT = "apt-get install openjdk-17-jdk-headless maven"

_MARKER = ".resolved"
_COMPILED_MARKER = ".compiled"
_MVN_TIMEOUT_S = 900.0
_JAVAC_TIMEOUT_S = 300.0


def cache_dir() -> Path:
    """The aggbox cache directory (``$AGGBOX_CACHE_DIR`` or ``~/.cache/aggbox``), created."""
    configured = os.environ.get("AGGBOX_CACHE_DIR")
    path = Path(configured).expanduser() if configured else Path.home() / ".cache" / "aggbox"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _jdk_tool(name: str, purpose: str) -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        if java_home:
            where = f" (neither in $JAVA_HOME/bin nor on PATH; JAVA_HOME={java_home!r})"
        else:
            where = " (not on PATH and JAVA_HOME is not set)"
        raise ServerError(
            f"`{name}` not found{where}; it is needed {purpose}. Install a Java 17 JDK, "
            f"e.g. `{INSTALL_HINT}`, or set JAVA_HOME to a JDK 17+."
        )
    return found


def java_executable() -> str:
    """Path of ``java`` (``$JAVA_HOME/bin/java`` or PATH); :class:`ServerError` if missing."""
    return _jdk_tool("java", "to run the local MongoDB stand-in and the Kafka broker")


def javac_executable() -> str:
    """Path of ``javac``; :class:`ServerError` if missing (a JRE without JDK is not enough)."""
    return _jdk_tool("javac", "to compile aggbox's small Java launchers (once)")


def mvn_executable() -> str:
    """Path of ``mvn`` on PATH; :class:`ServerError` if missing."""
    found = shutil.which("mvn")
    if found is None:
        raise ServerError(
            "`mvn` (Apache Maven) not found on PATH; it is needed once to download the jars "
            f"of the local servers from Maven Central into {cache_dir()}. Install it, e.g. "
            f"`{INSTALL_HINT}`."
        )
    return found


def available_poms() -> list[str]:
    """Names accepted by :func:`resolve_classpath` (the pom files shipped in the package)."""
    poms = resources.files("aggbox.servers").joinpath("poms")
    return sorted(
        entry.name.removesuffix(".xml") for entry in poms.iterdir() if entry.name.endswith(".xml")
    )


def _pom_text(name: str) -> str:
    pom = resources.files("aggbox.servers").joinpath("poms").joinpath(f"{name}.xml")
    if not pom.is_file():
        raise ServerError(f"no pom named {name!r} in aggbox.servers; known: {available_poms()}")
    return pom.read_text(encoding="utf-8")


def java_source(name: str) -> str:
    """Text of a Java source shipped in ``aggbox/servers/java/`` (e.g. ``AggboxMongoServer``)."""
    source = resources.files("aggbox.servers").joinpath("java").joinpath(f"{name}.java")
    if not source.is_file():
        raise ServerError(f"no Java source {name}.java in aggbox.servers/java")
    return source.read_text(encoding="utf-8")


def java_sources(name: str) -> dict[str, str]:
    """File name → text of the Java sources ``name`` stands for:
    ``aggbox/servers/java/<name>.java`` alone, or every ``.java`` file of the folder
    ``aggbox/servers/java/<name>/`` (a launcher split by concern, e.g. ``h2server``: compiled
    together)."""
    base = resources.files("aggbox.servers").joinpath("java")
    if base.joinpath(f"{name}.java").is_file():
        return {f"{name}.java": java_source(name)}
    folder = base.joinpath(name)
    found = sorted(e.name for e in folder.iterdir() if e.name.endswith(".java")) \
        if folder.is_dir() else []
    if not found:
        raise ServerError(f"no Java source {name}.java or folder {name}/ in aggbox.servers/java")
    return {f: folder.joinpath(f).read_text(encoding="utf-8") for f in found}


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _file_lock(name: str) -> Iterator[None]:
    """An exclusive ``fcntl`` lock on ``<cache>/locks/<name>.lock`` (blocks until free)."""
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _read_marker(directory: Path, marker: str) -> list[Path] | None:
    path = directory / marker
    if not path.is_file():
        return None
    names = [line for line in path.read_text(encoding="utf-8").splitlines() if line]
    files = [directory / n for n in names]
    if not all(f.is_file() for f in files):
        return None  # partially deleted cache entry: resolve again
    return files


def _copy_dependencies(mvn: str, pom: str, text: str, work: Path) -> Path:
    """Run Maven on the pom ``text`` in ``work``; the directory holding the resolved jars."""
    (work / "pom.xml").write_text(text, encoding="utf-8")
    lib = work / "lib"
    cmd = [mvn, "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
           f"-DoutputDirectory={lib}", "-DincludeScope=runtime", "-Dmdep.prependGroupId=true"]
    try:
        done = subprocess.run(cmd, cwd=work, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=_MVN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ServerError(
            f"Maven did not resolve {pom} within {_MVN_TIMEOUT_S:.0f} s "
            "(is Maven Central reachable?)"
        ) from exc
    jars = sorted(lib.glob("*.jar")) if lib.is_dir() else []
    if done.returncode != 0 or not jars:
        output = (done.stdout + done.stderr).strip()[-4000:]
        raise ServerError(
            f"Maven could not resolve the jars for {pom!r} (exit {done.returncode}). "
            f"Command: {' '.join(cmd)}\n"
            "Check that Maven Central is reachable (or a mirror in ~/.m2/settings.xml)."
            f"\n--- mvn output ---\n{output}"
        )
    return lib


def resolve_classpath(pom: str) -> list[Path]:
    """Jars (artifact plus runtime dependencies) of the shipped pom ``pom``, sorted by name.

    The first call (per pom content and cache directory) runs Maven and stores the jars;
    later calls, also from other processes, only read the marker file. Concurrent first calls
    are serialised with a file lock, so Maven runs once.
    """
    return resolve_pom(pom, _pom_text(pom))


def cached_pom(name: str, text: str) -> list[Path] | None:
    """The jars of :func:`resolve_pom` for this pom if they are in the cache (no Maven)."""
    return _read_marker(cache_dir() / "jars" / f"{name}-{_digest(text)}", _MARKER)


def resolve_pom(pom: str, text: str) -> list[Path]:
    """As :func:`resolve_classpath`, for the pom ``text`` (cached as ``jars/<name>-<hash>``)."""
    key = f"{pom}-{_digest(text)}"
    target = cache_dir() / "jars" / key
    cached = _read_marker(target, _MARKER)
    if cached is not None:
        return cached
    with _file_lock(f"jars-{key}"):
        cached = _read_marker(target, _MARKER)  # another process may have finished meanwhile
        if cached is not None:
            return cached
        mvn = mvn_executable()
        java_executable()  # Maven needs a JVM; fail with the JDK hint, not Maven's own message
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{key}-", dir=target.parent) as tmp:
            lib = _copy_dependencies(mvn, pom, text, Path(tmp))
            jars = sorted(lib.glob("*.jar"))
            if target.exists():
                shutil.rmtree(target)
            (lib / _MARKER).write_text("".join(f"{j.name}\n" for j in jars), encoding="utf-8")
            lib.rename(target)
    resolved = _read_marker(target, _MARKER)
    if resolved is None:  # pragma: no cover - only if someone deletes files concurrently
        raise ServerError(f"resolved jars vanished from {target}")
    return resolved


def classpath_string(entries: Sequence[Path | str]) -> str:
    """``entries`` joined with the platform's path separator (for ``java -cp``)."""
    return os.pathsep.join(str(e) for e in entries)


def compile_java(name: str, classpath: Sequence[Path]) -> Path:
    """Compile ``aggbox/servers/java/<name>.java`` (or the folder ``<name>/``, all its files
    together: :func:`java_sources`) once; return the directory of its classes.

    Cached by the hash of the sources and of the classpath's jar names; concurrent processes
    are serialised with a file lock. Put the returned directory on the classpath and run the
    class ``name`` (for a folder, its main class).
    """
    sources = java_sources(name)
    key = f"{name}-{_digest(*sources.values(), *(Path(c).name for c in classpath))}"
    target = cache_dir() / "classes" / key
    if (target / _COMPILED_MARKER).is_file():
        return target
    with _file_lock(f"classes-{key}"):
        if (target / _COMPILED_MARKER).is_file():
            return target
        javac = javac_executable()
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{key}-", dir=target.parent) as tmp:
            work = Path(tmp)
            files = []
            for file_name, text in sources.items():
                files.append(str(work / file_name))
                (work / file_name).write_text(text, encoding="utf-8")
            out = work / "classes"
            cmd = [javac, "-nowarn", "-d", str(out), *files]
            if classpath:
                cmd[1:1] = ["-cp", classpath_string(classpath)]
            try:
                done = subprocess.run(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=_JAVAC_TIMEOUT_S,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise ServerError(f"javac did not finish compiling {name}.java") from exc
            if done.returncode != 0:
                raise ServerError(
                    f"javac failed on {name}.java (exit {done.returncode}); a JDK 17+ is "
                    f"required (`{INSTALL_HINT}`).\n{(done.stdout + done.stderr).strip()}"
                )
            (out / _COMPILED_MARKER).write_text(name + "\n", encoding="utf-8")
            if target.exists():
                shutil.rmtree(target)
            out.rename(target)
    return target
