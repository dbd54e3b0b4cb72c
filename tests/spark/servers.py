"""Spark servers for the tests, started from the installed PySpark on loopback: a Spark
Connect server (``SparkConnectServer`` through ``spark-submit``) and a standalone cluster
(one master, two workers with one core each, through ``spark-class``). Each runs in its own
process group, logs into a file, and is stopped by its process id.

The commands and their environment are those docs/operations.md shows ("Starting Spark from
pip's PySpark"), built by one class, :class:`SparkServers`: the page shows
:data:`DOCUMENTED` (its settings as the page's shell variables — no port written into a
command, the worker's directory outside the virtualenv), the fixtures run the same methods
with free ports, temporary directories and less memory, and
tests/docs/test_spark_server_commands.py checks that the page shows exactly what the methods
build. Beyond the page, the fixtures only clean the environment the servers inherit from the
test process: an empty ``PYTHONPATH`` (nothing of the repository beyond the installed
packages, so a test's aggregates module reaches them only through ``--py-files``) and no
``SPARK_REMOTE``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float,
               what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
        with socket.socket() as s, contextlib.suppress(OSError):
            s.settimeout(0.5)
            s.connect(("127.0.0.1", port))
            return
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f} s:\n"
                       f"{_tail(log)}")


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass(frozen=True)
class SparkServers:
    """The settings of the Spark servers and the commands that start them: one master, a
    worker that joins it, a Spark Connect server. Values are strings as they go on the
    command line (docs/operations.md shows :data:`DOCUMENTED`, shell variables)."""

    spark_home: str
    python: str
    host: str = "127.0.0.1"
    hostname: str = "localhost"
    master_port: str = "7077"
    master_ui_port: str = "8080"
    worker_ui_port: str = "8081"
    #: the worker's applications' directories (jars, stderr of executors); Spark's default,
    #: ``$SPARK_HOME/work``, is inside the virtualenv that installed PySpark
    worker_dir: str = "work"
    worker_cores: str = "2"
    worker_memory: str = "2g"
    connect_port: str = "15002"
    connect_master: str = "local[*, 4]"
    connect_memory: str = "2g"
    #: the Kafka source's jars, comma-separated ("": no --jars)
    jars: str = ""

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"

    def env(self) -> dict[str, str]:
        """The servers' environment: where Spark is, the Python of their Python processes
        (``PYSPARK_PYTHON``: the one with aggbox), the address they listen on and the
        worker's directory."""
        return {"SPARK_HOME": self.spark_home, "PYSPARK_PYTHON": self.python,
                "SPARK_LOCAL_IP": self.host, "SPARK_LOCAL_HOSTNAME": self.hostname,
                "SPARK_WORKER_DIR": self.worker_dir}

    def master(self) -> list[str]:
        """A standalone master."""
        return [f"{self.spark_home}/bin/spark-class", "org.apache.spark.deploy.master.Master",
                "--host", self.host, "--port", self.master_port,
                "--webui-port", self.master_ui_port]

    def worker(self) -> list[str]:
        """A standalone worker that joins :meth:`master`."""
        return [f"{self.spark_home}/bin/spark-class", "org.apache.spark.deploy.worker.Worker",
                self.master_url, "--host", self.host, "--cores", self.worker_cores,
                "--memory", self.worker_memory, "--webui-port", self.worker_ui_port,
                "--work-dir", self.worker_dir]

    def connect(self, conf: Mapping[str, str] | None = None) -> list[str]:
        """A Spark Connect server, speculation off, with the Kafka source's jars (if any)
        and ``conf``."""
        cmd = [f"{self.spark_home}/bin/spark-submit",
               "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
               "--master", self.connect_master, "--driver-memory", self.connect_memory,
               "--conf", f"spark.connect.grpc.binding.address={self.host}",
               "--conf", f"spark.connect.grpc.binding.port={self.connect_port}",
               "--conf", "spark.speculation=false"]
        for key, value in (conf or {}).items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd + (["--jars", self.jars] if self.jars else [])


#: What docs/operations.md shows: the settings as the page's shell variables.
DOCUMENTED = SparkServers(
    spark_home="$SPARK_HOME", python="$PYSPARK_PYTHON", host="$SPARK_LOCAL_IP",
    hostname="$SPARK_LOCAL_HOSTNAME", master_port="$MASTER_PORT",
    master_ui_port="$MASTER_UI_PORT", worker_ui_port="$WORKER_UI_PORT",
    worker_dir="$SPARK_WORKER_DIR", connect_port="$CONNECT_PORT", jars="$KAFKA_JARS")


def suite_servers(**settings: str) -> SparkServers:
    """The suite's servers: this installed PySpark and this interpreter, loopback, the
    web UIs on ports the system picks (``0``); ``settings`` for the rest."""
    base: dict[str, str] = {"spark_home": str(spark_home()), "python": sys.executable,
                            "master_ui_port": "0", "worker_ui_port": "0"}
    return SparkServers(**{**base, **settings})


def spark_env(extra: Mapping[str, str] | None = None,
              pythonpath: Sequence[str] | None = None,
              servers: SparkServers | None = None) -> dict[str, str]:
    """The environment of a Spark server process (or a client of one): the test process's,
    without ``SPARK_REMOTE`` and the like, with :meth:`SparkServers.env` and ``pythonpath``
    (default: the repository, for ``tests.spark.domain``)."""
    env = dict(os.environ)
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_SUBMIT_ARGS"):
        env.pop(key, None)
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    env.update((servers or suite_servers()).env())
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] if pythonpath is None else pythonpath)
    env.update(extra or {})
    return env


@dataclass
class ServerProcess:
    """A JVM started in its own process group; :meth:`stop` ends the group (its Python
    workers too)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def _start(name: str, cmd: list[str], env: Mapping[str, str], workdir: Path) -> ServerProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(env), cwd=workdir,
                                start_new_session=True)
    return ServerProcess(name, proc, log)


@contextlib.contextmanager
def connect_server(workdir: Path, *, jars: Sequence[Path] = (),
                   conf: Mapping[str, str] | None = None,
                   timeout: float = 180) -> Iterator[str]:
    """A Spark Connect server (``local[2, 4]``, 768 MB) on loopback, started by the command
    docs/operations.md gives; yields its ``sc://127.0.0.1:<port>`` URL. Its Python processes
    (executors' workers, a stream's foreachBatch) are ``PYSPARK_PYTHON`` with an empty
    PYTHONPATH: aggbox (installed) but not the repository."""
    servers = suite_servers(connect_port=str(free_port()), connect_master="local[2, 4]",
                           connect_memory="768m", jars=",".join(str(j) for j in jars),
                           worker_dir=str(workdir / "work"))
    cmd = servers.connect({"spark.app.name": "aggbox-tests-connect",
                           "spark.ui.enabled": "false", "spark.sql.adaptive.enabled": "false",
                           **(conf or {})})
    server = _start("connect-server", cmd, spark_env(pythonpath=[], servers=servers), workdir)
    try:
        _wait_port(int(servers.connect_port), server.proc, server.log, timeout,
                   "the Spark Connect server")
        yield f"sc://127.0.0.1:{servers.connect_port}"
    finally:
        server.stop()


@dataclass
class Cluster:
    """A standalone cluster: ``master`` is ``spark://127.0.0.1:<port>``."""

    master: str
    workdir: Path
    processes: list[ServerProcess] = field(default_factory=list)

    def executor_pids(self) -> list[int]:
        """Process ids of this cluster's executor JVMs running now (found in /proc by
        their main class and their working directory, under the workers' directory)."""
        return [pid for pid, cmd in _processes()
                if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd
                and _cwd(pid).startswith(str(self.workdir))]

    def python_workers(self, executor: int) -> list[int]:
        """Forked Python workers (``pyspark.daemon`` children) of an executor JVM: they run
        the writer (``mapInArrow``), the pipeline's only Python stage."""
        daemons = [pid for pid, cmd in _processes()
                   if "pyspark.daemon" in cmd and _ppid(pid) == executor]
        return [pid for pid, cmd in _processes()
                if "pyspark.daemon" in cmd and _ppid(pid) in daemons]

    def stop(self) -> None:
        for p in reversed(self.processes):
            p.stop()


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _processes() -> Iterator[tuple[int, str]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        yield int(entry.name), raw.replace(b"\0", b" ").decode(errors="replace")


@contextlib.contextmanager
def standalone_cluster(workdir: Path, *, workers: int = 2, worker_memory: str = "700m",
                       pythonpath: Sequence[str] = (),
                       timeout: float = 120) -> Iterator[Cluster]:
    """A master and ``workers`` workers (1 core, ``worker_memory`` each) on loopback. The
    workers' environment has ``pythonpath`` only (not the repository): what the executors'
    Python imports beyond the installed packages must be shipped (``--py-files``)."""
    servers = suite_servers(master_port=str(free_port()), worker_cores="1",
                           worker_memory=worker_memory, worker_dir=str(workdir / "work"))
    cluster = Cluster(servers.master_url, workdir)
    try:
        daemons = {"SPARK_DAEMON_MEMORY": "256m"}  # the master's and workers' own JVMs
        master = _start("master", servers.master(),
                        spark_env(daemons, pythonpath=pythonpath, servers=servers), workdir)
        cluster.processes.append(master)
        _wait_port(int(servers.master_port), master.proc, master.log, timeout,
                   "the Spark master")
        for i in range(workers):  # each its own directory under the cluster's
            mine = replace(servers, worker_dir=str(workdir / "work" / f"w{i}"))
            worker = _start(f"worker-{i}", mine.worker(),
                            spark_env(daemons, pythonpath=pythonpath, servers=mine), workdir)
            cluster.processes.append(worker)
        _wait_workers(cluster, workers, timeout)
        yield cluster
    finally:
        cluster.stop()


def _wait_workers(cluster: Cluster, count: int, timeout: float) -> None:
    master_log = cluster.processes[0].log
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = master_log.read_text(errors="replace")
        if text.count("Registering worker") >= count:
            return
        for p in cluster.processes:
            if p.proc.poll() is not None:
                raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{_tail(p.log)}")
        time.sleep(0.5)
    raise RuntimeError(f"{count} workers did not register within {timeout:.0f} s:\n"
                       f"{_tail(master_log)}")
