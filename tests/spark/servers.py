"""Spark servers for the tests, started from the installed PySpark on loopback: a Spark
Connect server (``SparkConnectServer`` through ``spark-submit``) and a standalone cluster
(one master, two workers with one core each, through ``spark-class``). Each runs in its own
process group, logs into a file, and is stopped by its process id.

The commands are the ones docs/operations.md gives ("Starting Spark from pip's PySpark"):
:func:`master_command`, :func:`worker_command` and :func:`connect_command` build them, the
fixtures add test settings (memory, ports, work directories) after them, and
tests/docs/test_spark_server_commands.py checks that the page shows exactly these. Python
processes of the servers are ``PYSPARK_PYTHON`` (this interpreter, which has aggbox
installed) with an empty PYTHONPATH: nothing of the repository beyond the installed
packages, so a test's aggregates module reaches them only through ``--py-files``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
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


def master_command(spark_home: str, port: int, webui_port: int) -> list[str]:
    """A standalone master on loopback (docs/operations.md)."""
    return [f"{spark_home}/bin/spark-class", "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui_port)]


def worker_command(spark_home: str, master: str, cores: int, memory: str,
                   webui_port: int) -> list[str]:
    """A standalone worker of ``master`` on loopback (docs/operations.md)."""
    return [f"{spark_home}/bin/spark-class", "org.apache.spark.deploy.worker.Worker", master,
            "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
            "--webui-port", str(webui_port)]


def connect_command(spark_home: str, master: str, port: int, jars: str) -> list[str]:
    """A Spark Connect server on loopback, speculation off, with ``jars`` (the Kafka
    source's, comma-separated) (docs/operations.md)."""
    return [f"{spark_home}/bin/spark-submit",
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master", master,
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.speculation=false",
            "--jars", jars]


def spark_env(extra: Mapping[str, str] | None = None,
              pythonpath: Sequence[str] | None = None) -> dict[str, str]:
    """The environment of a Spark server process: loopback, this interpreter for Python
    workers (``PYSPARK_PYTHON``), ``pythonpath`` (default: the repository, for
    ``tests.spark.domain``)."""
    env = dict(os.environ)
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_SUBMIT_ARGS"):
        env.pop(key, None)
    env.update({
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_HOSTNAME": "localhost",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(REPO)] if pythonpath is None else pythonpath),
    })
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
    port = free_port()
    cmd = connect_command(str(spark_home()), "local[2, 4]", port,
                          ",".join(str(j) for j in jars))
    if not jars:
        cmd = cmd[:-2]
    cmd += ["--name", "aggbox-tests-connect", "--driver-memory", "768m",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.adaptive.enabled=false"]
    for key, value in (conf or {}).items():
        cmd += ["--conf", f"{key}={value}"]
    server = _start("connect-server", cmd, spark_env(pythonpath=[]), workdir)
    try:
        _wait_port(port, server.proc, server.log, timeout, "the Spark Connect server")
        yield f"sc://127.0.0.1:{port}"
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
    port = free_port()
    cluster = Cluster(f"spark://127.0.0.1:{port}", workdir)
    env = spark_env(pythonpath=pythonpath, extra={
        "SPARK_WORKER_DIR": str(workdir / "work"),
        "SPARK_DAEMON_MEMORY": "256m",
    })
    try:
        master = _start("master", master_command(str(spark_home()), port, 0), env, workdir)
        cluster.processes.append(master)
        _wait_port(port, master.proc, master.log, timeout, "the Spark master")
        for i in range(workers):
            worker = _start(f"worker-{i}", [
                *worker_command(str(spark_home()), cluster.master, 1, worker_memory, 0),
                "--work-dir", str(workdir / "work" / f"w{i}")], env, workdir)
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
